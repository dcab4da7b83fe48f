"""Immutable, versioned views of everything the sources reported.

The aggregator builds a new :class:`Snapshot` per change; readers never see it move.

The structs here (and the samples they hold) are immutable and never refer back to what
holds them, so they cannot form reference cycles: ``gc=False`` keeps them out of the cyclic
garbage collector, which otherwise walks a cluster scaler's thousands of device states on
every collection (reference counting frees them as always).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from types import MappingProxyType

import msgspec

from keda_gpu_scaler.domain.engines import EngineSample
from keda_gpu_scaler.domain.history import EMPTY_HISTORY, History
from keda_gpu_scaler.domain.samples import (
    AgentsReading,
    DeviceHolder,
    DeviceKey,
    DeviceProcesses,
    DraDevice,
    GpuReading,
    PodInfo,
    PodResourcesReading,
    PodsReading,
    ResourceSlicesReading,
)

STALE_AFTER_PERIODS = 3
"""A reading older than this many sample periods of its source is stale..."""
MIN_STALE_AFTER_S = 1.0
"""...and never sooner than this: at 10 Hz three periods are 0.3 s, which a garbage
collection or a burst of new streams can take from this process without anything being
wrong with the source."""


def stale_limit_s(period_s: float) -> float:
    """How old a reading of a source sampling every ``period_s`` may be and still count."""
    return max(STALE_AFTER_PERIODS * period_s, MIN_STALE_AFTER_S)


class DeviceState(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The last word on one device: its newest reading, whether it is lost, the recent
    values windows read (empty unless a trigger asks for a window), and the processes on
    it (read on their own cadence)."""

    key: DeviceKey
    index: int
    reading: GpuReading | None = None
    lost_reason: str | None = None
    lost_since: float | None = None
    history: History = EMPTY_HISTORY
    processes: DeviceProcesses | None = None
    """The newest per-process reading; None before the first."""

    def is_lost(self) -> bool:
        return self.lost_reason is not None

    @property
    def label(self) -> str:
        """``GPU 0``, or ``MIG 0:7`` for GPU 0's GPU instance 7: how explanations name it."""
        r = self.reading
        node = node_of(self.key)  # from the key: a device lost before it was read has no reading
        node = f"{node} " if node else ""
        if r is None or not r.is_mig_instance():
            return f"{node}GPU {self.index}"
        return f"{node}MIG {r.parent_index}:{r.gpu_instance_id}"

    def age(self, now: float) -> float | None:
        return None if self.reading is None else now - self.reading.taken_at

    def is_stale(self, now: float) -> bool:
        if self.reading is None:
            return True
        return now - self.reading.taken_at > stale_limit_s(self.reading.period_s)


class SourceState(msgspec.Struct, frozen=True, kw_only=True):
    """Health of one source as the aggregator last heard it.

    ``fault`` is the last whole-source failure, cleared by the next reading; device faults
    live on their :class:`DeviceState` and only count in ``faults``.
    """

    name: str
    last_sample_at: float | None = None
    fault: str | None = None
    fault_at: float | None = None
    cycles: int = 0
    """Sampler cycles folded: a batch, or a reading sent alone."""
    samples: int = 0
    faults: int = 0


PodKey = tuple[str, str]
"""(namespace, name) of a pod."""

LOCAL_NODE = ""
"""The name under which a node agent keeps its own node's devices and attribution."""


def node_of(key: DeviceKey) -> str:
    """The node of a device key: ``<node>`` of a cluster scaler's ``<node>/<uuid>``, and
    :data:`LOCAL_NODE` for a node agent's own keys (NVML UUIDs have no ``/``)."""
    node, separator, _ = key.partition("/")
    return node if separator else LOCAL_NODE


class NodeView(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Everything one node reported: its devices, who holds them, and the indexes of that.

    The aggregator keeps one view per node and rebuilds only the views a batch touches, so
    one node's update costs work in proportion to that node; an untouched view is the same
    object in the next snapshot, which is how a measurement knows it still holds."""

    name: str
    """The node's name on a cluster scaler; :data:`LOCAL_NODE` on a node agent."""
    devices: Mapping[DeviceKey, DeviceState] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    attribution: PodResourcesReading | None = None
    """The kubelet's newest good ``List`` on this node: who holds which device."""
    by_pod: Mapping[PodKey, tuple[DeviceHolder, ...]] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    """Each pod's holders in ``attribution`` (every container, every device ID)."""
    by_device: Mapping[DeviceKey, tuple[DeviceHolder, ...]] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    """The holders of each key the device IDs name (a key not in ``devices`` is unmatched)."""
    dra: tuple[DraDevice, ...] = ()
    """``attribution``'s DRA devices, joined to NVML (``domain.dra``); a cluster scaler
    gets them joined from the node agent."""
    unidentified: Mapping[PodKey, tuple[DraDevice, ...]] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    """Each pod's DRA devices the join could not identify: a trigger over the pod has no
    value. Rebuilt with ``by_pod``, so a scope that holds ``by_pod`` holds these too."""
    last_heard_at: float | None = None
    """When this node last sent anything (this process's clock); None: never."""


class DeviceTable(Mapping[DeviceKey, DeviceState]):
    """Every device of every node, read through the node views without copying them."""

    __slots__ = ("_length", "_nodes")

    def __init__(self, nodes: Mapping[str, NodeView], length: int) -> None:
        self._nodes = nodes
        self._length = length

    def __getitem__(self, key: DeviceKey) -> DeviceState:
        view = self._nodes.get(node_of(key))
        if view is None:
            raise KeyError(key)
        return view.devices[key]

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        view = self._nodes.get(node_of(DeviceKey(key)))
        return view is not None and key in view.devices

    def __iter__(self) -> Iterator[DeviceKey]:
        for view in self._nodes.values():
            yield from view.devices

    def __len__(self) -> int:
        return self._length


class PodIndex(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The pod watch's newest set, by namespace, and the pods in it that have terminated."""

    by_namespace: Mapping[str, tuple[PodInfo, ...]] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    ended: frozenset[PodKey] = frozenset()


def index_pods(pods: tuple[PodInfo, ...]) -> PodIndex:
    by_namespace: dict[str, list[PodInfo]] = {}
    for pod in pods:
        by_namespace.setdefault(pod.namespace, []).append(pod)
    return PodIndex(
        by_namespace=MappingProxyType({ns: tuple(p) for ns, p in by_namespace.items()}),
        ended=frozenset((p.namespace, p.name) for p in pods if p.terminated()),
    )


EMPTY_POD_INDEX = PodIndex()


class Snapshot(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    version: int
    published_at: float
    nodes: Mapping[str, NodeView] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    """Each node's view: the node agent's own (:data:`LOCAL_NODE`), or on a cluster scaler
    one per node agent heard."""
    device_count: int = 0
    """How many devices the views hold together."""
    sources: Mapping[str, SourceState] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    engines: Mapping[str, EngineSample] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    """Newest sample of each engine sampler, by its source name (``EngineTarget.source``)."""
    engine_history: Mapping[str, History] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    """Recent values of each engine sampler that windows read, by source name."""
    pods: PodsReading | None = None
    """This node's pods (labels, phase) as the Kubernetes API last showed them; the
    cluster's on a cluster scaler."""
    pod_index: PodIndex = EMPTY_POD_INDEX
    """``pods`` by namespace; the same object while the set of pods does not change."""
    pod_nodes: Mapping[PodKey, frozenset[str]] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    """The nodes whose attribution names each pod; the same object while no node's holders
    change."""
    attributed_until: float = -math.inf
    """On a cluster scaler: when the freshest node attribution goes stale."""
    resource_slices: ResourceSlicesReading | None = None
    """On a node agent: its node's ResourceSlices, which the DRA join reads."""
    agents: AgentsReading | None = None
    """On a cluster scaler: the node agents discovery sees (ready or not), as last told."""

    @property
    def devices(self) -> Mapping[DeviceKey, DeviceState]:
        """Every device of every node, by key."""
        return DeviceTable(self.nodes, self.device_count)

    @property
    def attribution(self) -> PodResourcesReading | None:
        """A node agent's newest good ``List`` of its kubelet: who holds which device."""
        local = self.nodes.get(LOCAL_NODE)
        return None if local is None else local.attribution

    @property
    def node_attributions(self) -> Mapping[str, PodResourcesReading]:
        """On a cluster scaler: each node agent's newest attribution, by node name."""
        return {
            name: view.attribution
            for name, view in self.nodes.items()
            if name != LOCAL_NODE and view.attribution is not None
        }

    def on_cluster(self) -> bool:
        """A cluster scaler's snapshot: its devices were read by node agents, on their
        nodes."""
        return any(name != LOCAL_NODE for name in self.nodes)

    def all_devices(self) -> Iterator[DeviceState]:
        """Every device, node by node."""
        for view in self.nodes.values():
            yield from view.devices.values()

    def ordered_devices(self) -> list[DeviceState]:
        """Devices by NVML index, the order nvidia-smi shows."""
        return sorted(self.all_devices(), key=by_index)

    def readiness(self, now: float) -> tuple[bool, str]:
        """Ready while at least one device has a fresh reading; the reason says why not."""
        if self.version == 0:
            return False, "no snapshot yet"
        devices = self.ordered_devices()
        fresh = [d for d in devices if not d.is_lost() and not d.is_stale(now)]
        if fresh:
            return True, f"{len(fresh)} of {len(devices)} device(s) fresh"
        faults = [f"{s.name}: {s.fault}" for s in self.sources.values() if s.fault]
        if faults:
            return False, "source failing: " + "; ".join(faults)
        if not devices:
            return False, "no device reported yet"
        return False, f"no fresh reading: {len(devices)} device(s) lost or stale"

    def has_fresh_reading(self, now: float) -> bool:
        return any(not d.is_lost() and not d.is_stale(now) for d in self.all_devices())


def by_index(device: DeviceState) -> tuple[int, str]:
    """The order of devices nvidia-smi shows: by NVML index (then key)."""
    return device.index, device.key


EMPTY_SNAPSHOT = Snapshot(version=0, published_at=0.0)
