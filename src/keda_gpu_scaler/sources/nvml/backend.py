"""The NVML seam: the few NVML calls the sampler makes, typed, with translated errors.

Every method is synchronous and may block (``pcie_throughput_kbs`` about 20 ms on an H200),
so the sampler calls them from a worker thread. Every method raises only
:class:`~keda_gpu_scaler.sources.nvml.errors.NvmlError` subclasses. Handles are opaque: the
sampler passes them back to the backend that made them and never looks inside.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

Handle = object
"""A device or MIG device handle, opaque to everything but its backend."""

GpmSample = object
"""A GPM sample buffer, opaque to everything but its backend."""

# NVML field ids (nvml.h). NVLink throughput counters are cumulative KiB of ONE link, the one
# named by the request's scope id; the scope SCOPE_ALL_LINKS asks for the sum over all links.
FI_NVLINK_LINK_COUNT = 91
FI_NVLINK_THROUGHPUT_DATA_TX = 138
FI_NVLINK_THROUGHPUT_DATA_RX = 139
SCOPE_ALL_LINKS = 0xFFFFFFFF
"""``UINT_MAX`` as a scope id: NVLink throughput summed over every link (nvml.h)."""


class FieldRequest(NamedTuple):
    """One ``nvmlFieldValue_t`` to fill: the field and its scope (the NVLink link for
    per-link fields). A scope of 0 is link 0, not "the GPU"."""

    field_id: int
    scope_id: int = 0


class GpmMetric(enum.IntEnum):
    """NVML GPM metric ids (``NVML_GPM_METRIC_*`` in nvidia-ml-py 13.615)."""

    SM_UTIL = 2
    SM_OCCUPANCY = 3
    ANY_TENSOR_UTIL = 5
    DRAM_BW_UTIL = 10


class PcieDirection(enum.IntEnum):
    """``nvmlPcieUtilCounter_t``: TX is what the GPU sends, RX what it receives."""

    TX = 0
    RX = 1


@dataclass(frozen=True, slots=True)
class Utilization:
    gpu: int
    memory: int


@dataclass(frozen=True, slots=True)
class MemoryV1:
    """``nvmlMemory_t``: ``used`` includes memory the driver reserves."""

    total: int
    free: int
    used: int


@dataclass(frozen=True, slots=True)
class MemoryV2:
    """``nvmlMemory_v2_t``: ``used`` excludes ``reserved`` (driver and firmware)."""

    total: int
    reserved: int
    free: int
    used: int


@dataclass(frozen=True, slots=True)
class FieldValue:
    """One ``nvmlFieldValue_t``: a successful call can still carry a failed field."""

    field_id: int
    return_code: int
    value: int
    timestamp_us: int
    scope_id: int = 0


@dataclass(frozen=True, slots=True)
class GpuInstanceInfo:
    """``nvmlGpuInstanceInfo_t``: a GPU instance's profile and where it sits on its GPU.

    The placement (first memory slice and slice count) identifies the instance on its GPU:
    instances never overlap, and a DRA driver names a MIG device by it."""

    profile_id: int
    placement_start: int
    placement_size: int


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """``nvmlProcessInfo_t`` (v2 and v3 alike): one process with a context on the device."""

    pid: int
    """In the host's PID namespace (the driver does not translate it for every call)."""
    used_memory: int | None
    """Bytes of device memory the process uses; None where NVML says it is not available."""
    gpu_instance_id: int | None = None
    """On a MIG-enabled GPU: the GPU instance the process runs in."""
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process's utilization (percent) over the driver's samples newer than the
    ``lastSeenTimeStamp`` asked with, and the CPU timestamp (µs) of the newest of them.

    NVML returns one per process that had some non-zero utilization in that time: a
    running process without one was idle."""

    pid: int
    timestamp_us: int
    sm: int
    memory: int
    encoder: int
    decoder: int


@dataclass(frozen=True, slots=True)
class GpmMetricValue:
    """One metric of ``nvmlGpmMetricsGet``: its own return code, and maybe NaN."""

    metric_id: int
    return_code: int
    value: float


class NvmlBackend(Protocol):
    """What the sampler needs from NVML; :mod:`.pynvml_backend` and :mod:`.fake_backend`."""

    def device_count(self) -> int: ...
    def device_handle(self, index: int) -> Handle: ...
    def uuid(self, handle: Handle) -> str: ...
    def name(self, handle: Handle) -> str: ...
    def utilization(self, handle: Handle) -> Utilization: ...
    def memory_v1(self, handle: Handle) -> MemoryV1: ...
    def memory_v2(self, handle: Handle) -> MemoryV2: ...
    def temperature_c(self, handle: Handle) -> int: ...
    def power_usage_mw(self, handle: Handle) -> int: ...
    def power_limit_mw(self, handle: Handle) -> int: ...
    def sm_clock_mhz(self, handle: Handle) -> int: ...
    def fan_speed_percent(self, handle: Handle) -> int: ...
    def pcie_throughput_kbs(self, handle: Handle, direction: PcieDirection) -> int: ...
    def field_values(self, handle: Handle, fields: Sequence[FieldRequest]) -> list[FieldValue]:
        """One value per request, in order; each carries its own return code."""
        ...

    def mig_mode(self, handle: Handle) -> tuple[int, int]:
        """(current, pending); 1 is enabled."""
        ...

    def max_mig_device_count(self, handle: Handle) -> int: ...
    def mig_device_handle(self, handle: Handle, index: int) -> Handle:
        """Raises :class:`NvmlAbsent` (NotFound) for a slot without an instance."""
        ...

    def gpu_instance_id(self, mig_handle: Handle) -> int: ...
    def compute_instance_id(self, mig_handle: Handle) -> int: ...
    def gpu_instance_info(self, handle: Handle, gpu_instance_id: int) -> GpuInstanceInfo:
        """GPU instance ``gpu_instance_id`` of the MIG-enabled GPU ``handle``
        (``nvmlDeviceGetGpuInstanceById``, then ``nvmlGpuInstanceGetInfo``)."""
        ...

    def compute_processes_v3(self, handle: Handle) -> list[ProcessInfo]:
        """``nvmlDeviceGetComputeRunningProcesses_v3``; on a MIG device handle, the
        processes of that instance."""
        ...

    def compute_processes_v2(self, handle: Handle) -> list[ProcessInfo]: ...
    def mps_compute_processes_v3(self, handle: Handle) -> list[ProcessInfo]:
        """``nvmlDeviceGetMPSComputeRunningProcesses_v3``: the MPS clients on the device."""
        ...

    def mps_compute_processes_v2(self, handle: Handle) -> list[ProcessInfo]: ...
    def processes_utilization_info(self, handle: Handle, last_seen_us: int) -> list[ProcessSample]:
        """``nvmlDeviceGetProcessesUtilizationInfo``: samples newer than ``last_seen_us``
        (0: every sample the driver keeps). Raises :class:`NvmlAbsent` (NotFound) when
        there is none."""
        ...

    def process_utilization(self, handle: Handle, last_seen_us: int) -> list[ProcessSample]:
        """``nvmlDeviceGetProcessUtilization``, the older call: the same, without the JPEG
        and optical flow engines."""
        ...

    def gpm_supported(self, handle: Handle) -> bool: ...
    def gpm_sample_alloc(self) -> GpmSample: ...
    def gpm_sample_free(self, sample: GpmSample) -> None: ...
    def gpm_sample_get(self, handle: Handle, sample: GpmSample) -> None: ...
    def gpm_mig_sample_get(self, handle: Handle, gpu_instance_id: int, sample: GpmSample) -> None:
        """Sample one GPU instance of the MIG-enabled GPU ``handle``."""
        ...

    def gpm_metrics(
        self, first: GpmSample, second: GpmSample, metric_ids: Sequence[int]
    ) -> list[GpmMetricValue]: ...
    def close(self) -> None: ...
