"""Typed, timestamped samples that sources publish to the aggregator.

Every reading field is optional: ``None`` means "no reading" (unsupported, failed, NaN),
never zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import NewType

import msgspec

from keda_gpu_scaler.domain.engines import EngineSample

DeviceKey = NewType("DeviceKey", str)
"""Stable identity of a GPU or MIG instance on this node (its NVML UUID, ``MIG-...`` for
an instance, which is unique where the instance's ordinal is not)."""


class GpuReading(msgspec.Struct, frozen=True, tag="gpu", omit_defaults=True):
    """One reading of one GPU at one instant (``taken_at``, anyio clock seconds)."""

    source: str
    key: DeviceKey
    index: int
    uuid: str
    name: str
    taken_at: float
    period_s: float
    gpu_utilization: float | None = None
    """Percent of time a kernel ran (nvmlDeviceGetUtilizationRates.gpu)."""
    memory_utilization: float | None = None
    """Percent of time the memory controller was busy (not VRAM use)."""
    memory_used_bytes: int | None = None
    """VRAM in use as NVML memory info v1 reports it: v2 ``used`` plus ``reserved``."""
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    temperature_c: float | None = None
    power_mw: float | None = None
    power_limit_mw: float | None = None
    sm_clock_mhz: float | None = None
    pcie_tx_kbps: float | None = None
    pcie_rx_kbps: float | None = None
    nvlink_tx_mbps: float | None = None
    nvlink_rx_mbps: float | None = None
    sm_active: float | None = None
    """GPM: percent of SMs busy over the last sampling window (Hopper and newer)."""
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_bw_util: float | None = None
    mig_enabled: bool = False
    """A MIG-enabled physical GPU: under ``gpuIndex: -1`` its instances stand for it."""
    parent_index: int | None = None
    """Set on a MIG instance only: the NVML index of its GPU (``index`` equals it)."""
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    gpu_instance_profile_id: int | None = None
    """On a MIG instance: its GPU instance's profile (``nvmlGpuInstanceInfo_t.profileId``)."""
    placement_start: int | None = None
    """On a MIG instance: the first memory slice of its GPU instance, which with its GPU
    identifies it (a DRA driver names a MIG device by it); None where NVML does not say."""
    placement_size: int | None = None
    """On a MIG instance: how many memory slices its GPU instance takes."""
    node: str = ""
    """The node it was read on, on a cluster scaler (its ``key`` is then ``<node>/<uuid>``);
    empty on a node agent, which reads its own node."""

    def is_mig_instance(self) -> bool:
        return self.parent_index is not None


OPTIONAL_READINGS: tuple[str, ...] = tuple(
    f.name for f in msgspec.structs.fields(GpuReading) if f.default is None
)
"""The :class:`GpuReading` fields that may be absent (``None``: no reading), in order: what
a node agent's stream carries as proto3 ``optional`` fields."""
FLOAT_READINGS: tuple[str, ...] = tuple(
    f.name
    for f in msgspec.structs.fields(GpuReading)
    if f.default is None and f.type == (float | None)
)
"""Of those, the floating-point readings (a NaN or an infinity among them is no reading)."""


class ProcessUse(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """One process on a device, as NVML and the host's ``/proc`` see it.

    A utilization is the process's share of the device since the sampler's last read
    (percent, NVML's per-process samples); None where it is not known for this process
    (``pid_reused``) or not at all on this device
    (:attr:`DeviceProcesses.utilization_unsupported`)."""

    pid: int
    """In the host's PID namespace."""
    pod_uid: str = ""
    """The pod it runs in (``metadata.uid``, from its cgroup); empty: outside any pod."""
    container_id: str = ""
    used_memory_bytes: int | None = None
    """Device memory it uses; None where NVML says not available."""
    sm: float | None = None
    """Percent of time its kernels ran on the device's SMs."""
    memory: float | None = None
    """Percent of time the memory controller served it."""
    encoder: float | None = None
    decoder: float | None = None
    mps_server: bool = False
    """An MPS server: it runs its clients' work, and is no workload's own."""
    pid_reused: bool = False
    """Its PID belonged to another container at the last reading: NVML's samples under the
    PID cannot be split between the two, so its utilization is not known this period."""


class DeviceProcesses(
    msgspec.Struct, frozen=True, kw_only=True, tag="processes", gc=False, omit_defaults=True
):
    """The processes on one device (a GPU or a MIG instance) at one instant, read on the
    NVML sampler's per-process cadence (``period_s``): what a ``podSelector`` trigger over a
    device shared with another workload measures its own pods by.

    What NVML cannot say on this device is said here, never read as 0: no per-process
    utilization (MIG, older GPUs, MPS attributing its clients' work to its server), no
    per-process memory, or no per-process readings at all (``--host-proc`` off, ``/proc``
    unreadable): the reason in words, with ``processes`` left empty or their values None."""

    source: str
    key: DeviceKey
    index: int
    taken_at: float
    period_s: float
    processes: tuple[ProcessUse, ...] = ()
    memory_unsupported: str | None = None
    """Why no process's memory can be told apart on this device, if it cannot."""
    utilization_unsupported: str | None = None
    """Why no process's utilization can be told apart on this device, if it cannot."""
    node: str = ""
    """The node it was read on, on a cluster scaler (``key`` is then ``<node>/<uuid>``)."""


class SourceFault(msgspec.Struct, frozen=True, kw_only=True, tag="fault"):
    """A source could not read a device (``key``) or anything at all (``key`` is None)."""

    source: str
    key: DeviceKey | None
    at: float
    reason: str
    index: int = -1
    lost: bool = False
    """True when the device fell off the bus or answers unknown errors."""


class DeviceGone(msgspec.Struct, frozen=True, kw_only=True, tag="gone"):
    """A device that no longer exists (a MIG instance destroyed, its GPU's MIG mode turned
    off): the aggregator forgets it (reading, history, processes) at once, rather than
    keep its last reading until it goes stale."""

    source: str
    key: DeviceKey
    at: float
    reason: str
    index: int = -1
    """Its GPU's NVML index."""


class NodeDevices(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="node-devices"):
    """Every device a node agent has now, as its stream lists them (readings and lost
    devices): a cluster scaler forgets the node's other devices, such as a MIG instance
    destroyed while no stream of the agent was open."""

    source: str
    node: str
    at: float
    keys: frozenset[DeviceKey]
    """Node-qualified, as the cluster scaler keys them (``<node>/<uuid>``)."""


class Batch(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="batch"):
    """Everything one sampler cycle read; the aggregator folds it into one snapshot."""

    source: str
    samples: tuple[GpuReading | DeviceProcesses | SourceFault | DeviceGone | NodeDevices, ...]
    cycle_s: float | None = None
    """How long the cycle took to read, when the sampler measured it."""


class SourceStopped(msgspec.Struct, frozen=True, kw_only=True, tag="stopped"):
    """A source was stopped on purpose (an engine nobody reads): forget its readings."""

    source: str


POD_RESOURCES_SOURCE = "pod-resources"
RESOURCE_SLICES_SOURCE = "resource-slices"
"""Source name of the watch of this node's ResourceSlices (the DRA join)."""
"""Source name of the kubelet PodResources sampler (which pod holds which device)."""
PODS_SOURCE = "pods"
"""Source name of the pod watch (labels and phase of this node's pods)."""


class DeviceHolder(msgspec.Struct, frozen=True, kw_only=True):
    """One device allocated to one container, as the kubelet PodResources API lists it."""

    namespace: str
    pod: str
    container: str
    resource: str
    """The extended resource name: ``nvidia.com/gpu``, ``nvidia.com/mig-1g.10gb``, ..."""
    device_id: str
    """As the device plugin named it: ``GPU-<uuid>``, ``MIG-<uuid>``, a time-slicing or MPS
    replica ``<uuid>::<n>``, or anything else a plugin chose (reported, never guessed)."""


class DraDevice(msgspec.Struct, frozen=True, kw_only=True):
    """One device of a DRA claim allocated to a container (``dynamic_resources``), and,
    once joined (``domain.dra``), the NVML device it is or why that is not known.

    Several pods referencing one claim (time-slicing or MPS set in its config) each list
    the device: they are all its holders, as with time-sliced device-plugin replicas."""

    namespace: str
    pod: str
    container: str
    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str
    share_id: str | None = None
    """The allocation's share (a device allocated in parts, Kubernetes 1.35+)."""
    gpu: bool = False
    """Its driver is one of ``--dra-drivers``: the device is a GPU."""
    key: str | None = None
    """The NVML device it is (its UUID), once joined."""
    outcome: str = ""
    """How it was joined (``uuid``, ``placement``) or why not (``domain.dra.Outcome``);
    empty before the join."""
    detail: str = ""
    """The outcome in words."""

    @property
    def claim(self) -> str:
        return f"{self.claim_namespace}/{self.claim_name}"

    @property
    def name(self) -> str:
        """``<driver>/<pool>/<device>``, as the kubelet names it."""
        return f"{self.driver}/{self.pool}/{self.device}"


class PodResourcesReading(
    msgspec.Struct, frozen=True, kw_only=True, tag="pod-resources", omit_defaults=True, gc=False
):
    """One good ``List`` of the kubelet PodResources API: every GPU device held, by whom.

    Only devices of the configured GPU resource names are kept (``holders``); ``taken_at``
    is when the kubelet answered, ``period_s`` the polling interval (stale after three)."""

    source: str
    taken_at: float
    period_s: float
    holders: tuple[DeviceHolder, ...] = ()
    dra: tuple[DraDevice, ...] = ()
    node: str = ""
    """The node whose kubelet answered, on a cluster scaler; empty on a node agent."""


class SliceDevice(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """One device of a ResourceSlice, as much of it as the DRA join reads: its name and
    the attributes of its driver's domain that identify it."""

    name: str
    uuid: str | None = None
    """``uuid``: a GPU's ``GPU-...``, a MIG device's ``MIG-...``."""
    parent_uuid: str | None = None
    """``parentUUID``: a MIG device's GPU."""
    type: str | None = None
    """``type``: ``gpu``, ``mig``, ``vfio``, ..."""
    profile: str | None = None
    """``profile``: a MIG device's, such as ``1g.10gb``."""


class ResourceSliceInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One ResourceSlice (``resource.k8s.io/v1``): which pool, which generation of it, and
    its devices."""

    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    """``spec.pool.resourceSliceCount``: how many slices the pool's generation has."""
    node: str = ""
    devices: tuple[SliceDevice, ...] = ()


class DraPool(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """A pool of one driver: the devices of its latest generation, and why it cannot be
    used (incomplete, invalid), if it cannot."""

    driver: str
    name: str
    generation: int
    slices: int
    """Slices of the latest generation seen."""
    slice_count: int
    """How many that generation says it has."""
    devices: tuple[SliceDevice, ...] = ()
    problem: str | None = None


class ResourceSlicesReading(
    msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="resource-slices", omit_defaults=True
):
    """This node's ResourceSlices, as pools, as of the last answer of the Kubernetes API
    (``taken_at``; unavailable after three ``period_s`` without one)."""

    source: str
    taken_at: float
    period_s: float
    node: str
    pools: tuple[DraPool, ...] = ()


class PodInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """A pod (of this node, or of the cluster) as the Kubernetes API last showed it."""

    namespace: str
    name: str
    uid: str = ""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    phase: str = ""
    """``Pending``, ``Running``, ``Succeeded``, ``Failed`` or ``Unknown``; a pod that has
    terminated (``Succeeded``, ``Failed``) holds no GPU, whatever the kubelet still lists."""
    node: str = ""
    """The node it is scheduled on (``spec.nodeName``); empty while it is not scheduled."""

    def terminated(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


class PodsReading(
    msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="pods", omit_defaults=True
):
    """The whole set of this node's pods (on a cluster scaler, every node's pods of
    ``namespaces``), as of the last answer of the Kubernetes API.

    ``taken_at`` is the last time the API answered (a list, a watch event or bookmark, a
    watch that opened or ended cleanly); ``period_s`` is a third of how long the set may go
    without an answer before it is unavailable (30 s)."""

    source: str
    taken_at: float
    period_s: float
    node: str
    pods: tuple[PodInfo, ...] = ()
    namespaces: tuple[str, ...] | None = None
    """The namespaces whose pods the set holds, sorted; None: every namespace (a node
    agent's watch of its node, a cluster scaler's of all namespaces). A namespace not
    listed has pods unknown, not none."""
    on_demand: bool = False
    """With ``namespaces``: more join as triggers name them (``--pod-namespaces triggers``);
    else the namespaces listed are all that is watched."""


class AgentTarget(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A node agent a cluster scaler may link to, as discovery found it."""

    host: str
    port: int
    pod: str = ""
    node: str = ""
    """Empty when discovery cannot tell (DNS, static): the agent's stream names its node."""
    ready: bool = True
    """Not-ready endpoints are listed (tap, /metrics), never linked."""

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class AgentsReading(
    msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="agents", omit_defaults=True
):
    """The whole set of node agents discovery sees now (``--agents``), as discovery tells
    the links (on a channel of their own); the links pass each on to the aggregator, so the
    snapshot, the tap and ``/metrics`` show every agent, ready or not."""

    source: str
    taken_at: float
    period_s: float
    targets: tuple[AgentTarget, ...] = ()
    error: str | None = None
    """Why discovery is failing (the API or DNS does not answer, the port is on no
    EndpointSlice), until it works again; ``targets`` and ``taken_at`` are then the last
    set it found and when it last confirmed it."""


AGENTS_SOURCE = "agents"
"""Source name of agent discovery on a cluster scaler."""


Sample = (
    GpuReading
    | DeviceProcesses
    | SourceFault
    | DeviceGone
    | NodeDevices
    | Batch
    | EngineSample
    | SourceStopped
    | PodResourcesReading
    | PodsReading
    | ResourceSlicesReading
    | AgentsReading
)


def finite_or_none(value: float | None) -> float | None:
    """A NaN or infinite reading is no reading."""
    if value is None or not math.isfinite(value):
        return None
    return value


def unbatch(
    samples: Iterable[Sample],
) -> Iterator[
    GpuReading
    | DeviceProcesses
    | SourceFault
    | DeviceGone
    | NodeDevices
    | EngineSample
    | SourceStopped
    | PodResourcesReading
    | PodsReading
    | ResourceSlicesReading
    | AgentsReading
]:
    """Every sample, with each :class:`Batch` opened in place."""
    for sample in samples:
        if isinstance(sample, Batch):
            yield from sample.samples
        else:
            yield sample
