"""Discovering and reading devices; synchronous code that runs in a worker thread.

Nothing here touches the event loop or its clock: times come in as arguments. A reading
that raises :class:`NvmlAbsent` is left out; :class:`NvmlDeviceLost` and
:class:`NvmlLibraryError` propagate to the sampler, which decides what they mean.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from keda_gpu_scaler.sources.nvml.backend import (
    GpmSample,
    GpuInstanceInfo,
    Handle,
    NvmlBackend,
    PcieDirection,
)
from keda_gpu_scaler.sources.nvml.convert import (
    GPM_METRICS,
    NVLINK_ALL_LINKS,
    NVLINK_LINK_COUNT,
    GpmReadings,
    Memory,
    NvlinkCounters,
    all_succeeded,
    gpm_readings,
    link_count,
    memory_from_v1,
    memory_from_v2,
    nvlink_counters,
    nvlink_per_link,
    nvlink_rates,
)
from keda_gpu_scaler.sources.nvml.errors import NvmlAbsent, NvmlCode, NvmlError
from keda_gpu_scaler.sources.nvml.processes import ProcessState

_T = TypeVar("_T")
_P = ParamSpec("_P")


def maybe(read: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T | None:
    """``read(*args)``, or None when this device cannot give it."""
    try:
        return read(*args, **kwargs)
    except NvmlAbsent:
        return None


class GpmPair:
    """Two GPM sample buffers; metrics come from the previous sample and the newest."""

    def __init__(self, backend: NvmlBackend, take: Callable[[GpmSample], None]) -> None:
        self._backend = backend
        self._take = take
        self._samples = [backend.gpm_sample_alloc(), backend.gpm_sample_alloc()]
        self._primed = False

    def read(self) -> GpmReadings:
        """Metrics since the last call; absent on the first call and after a failed sample."""
        try:
            self._take(self._samples[1])
        except NvmlAbsent:
            self._primed = False
            return GpmReadings()
        if not self._primed:
            self._primed = True
            self._samples.reverse()
            return GpmReadings()
        older, newer = self._samples
        metrics = maybe(self._backend.gpm_metrics, older, newer, GPM_METRICS)
        self._samples.reverse()
        return GpmReadings() if metrics is None else gpm_readings(metrics)

    def free(self) -> None:
        for sample in self._samples:
            # Freeing after the GPU was lost may fail too; the buffer is gone either way.
            with contextlib.suppress(NvmlError):
                self._backend.gpm_sample_free(sample)


@dataclass
class MigDevice:
    uuid: str
    name: str
    handle: Handle
    gpu_instance_id: int
    compute_instance_id: int
    gpu_instance: GpuInstanceInfo | None = None
    """Its GPU instance's profile and placement; None where NVML does not say."""
    gpm: GpmPair | None = None
    memory_v2: bool | None = None
    processes: ProcessState = field(default_factory=ProcessState)


@dataclass
class GpuDevice:
    """A physical GPU and what the sampler remembers about it between cycles."""

    index: int
    uuid: str
    name: str
    handle: Handle
    mig_capable: bool | None = None
    """Whether NVML has a MIG mode for it (None: not known yet; False: NotSupported, the
    layout is never read again)."""
    mig_enabled: bool = False
    """The current MIG mode: its instances are what pods hold."""
    mig_pending: bool = False
    """The MIG mode it takes at its next activation (a GPU reset)."""
    instances: list[MigDevice] = field(default_factory=list)
    gpm_supported: bool = False
    gpm: GpmPair | None = None
    memory_v2: bool | None = None
    """Whether memory info v2 works here (None: not tried yet); v1 is the fallback."""
    nvlink: NvlinkCounters | None = None
    nvlink_links: int | None = None
    """Set once the driver refused the all-links scope: NVLink is then summed link by link."""
    processes: ProcessState = field(default_factory=ProcessState)

    def release(self) -> None:
        for gpm in [self.gpm, *(i.gpm for i in self.instances)]:
            if gpm is not None:
                gpm.free()


def discover_gpu(backend: NvmlBackend, index: int) -> GpuDevice:
    handle = backend.device_handle(index)
    gpu = GpuDevice(
        index=index,
        uuid=backend.uuid(handle),
        name=maybe(backend.name, handle) or "NVIDIA GPU",
        handle=handle,
    )
    gpu.gpm_supported = bool(maybe(backend.gpm_supported, handle))
    if gpu.gpm_supported:
        gpu.gpm = maybe(GpmPair, backend, lambda s: backend.gpm_sample_get(handle, s))
    read_layout(backend, gpu)
    return gpu


def read_layout(backend: NvmlBackend, gpu: GpuDevice) -> None:
    """Read ``gpu``'s MIG mode and instances (again), in place.

    An instance still there (by UUID) keeps what the sampler remembers of it (GPM buffers,
    the memory call that works, its processes); a new one is discovered; one gone is freed.
    A GPU whose mode NVML cannot read this time keeps the layout it had; one without MIG
    is not asked again."""
    if gpu.mig_capable is False:
        return
    try:
        current, pending = backend.mig_mode(gpu.handle)
    except NvmlAbsent as exc:
        if exc.code in _NO_MIG:
            gpu.mig_capable = False
        return
    gpu.mig_capable, gpu.mig_enabled, gpu.mig_pending = True, current == 1, pending == 1
    known = {i.uuid: i for i in gpu.instances}
    found = _instances(backend, gpu, known) if gpu.mig_enabled else []
    for instance in gpu.instances:
        if all(f is not instance for f in found) and instance.gpm is not None:
            instance.gpm.free()
    gpu.instances = found


_NO_MIG = frozenset({NvmlCode.NOT_SUPPORTED, NvmlCode.FUNCTION_NOT_FOUND})
"""What ``nvmlDeviceGetMigMode`` answers on a GPU without MIG (before Ampere)."""


def instances_moved(backend: NvmlBackend, gpu: GpuDevice) -> bool:
    """Whether NVML says an instance handle is no longer valid (InvalidArgument or
    NotFound: the instance was destroyed), or that it names another instance now (NVML
    may reuse a handle)."""
    for instance in gpu.instances:
        uuid = maybe(backend.uuid, instance.handle)
        if uuid != instance.uuid:
            return True
    return False


def _instances(
    backend: NvmlBackend, gpu: GpuDevice, known: dict[str, MigDevice]
) -> list[MigDevice]:
    found: list[MigDevice] = []
    try:
        for slot in range(maybe(backend.max_mig_device_count, gpu.handle) or 0):
            # An empty slot answers NotFound (the H200 with MIG off does the same for slot 0).
            handle = maybe(backend.mig_device_handle, gpu.handle, slot)
            uuid = None if handle is None else maybe(backend.uuid, handle)
            if handle is None or uuid is None:
                continue  # none there, or destroyed while being listed
            instance = known.get(uuid) or maybe(_discover_instance, backend, gpu, handle, uuid)
            if instance is not None:
                instance.handle = handle
                found.append(instance)
    except NvmlError:
        for instance in found:  # the new ones are nobody else's to free
            if instance.uuid not in known and instance.gpm is not None:
                instance.gpm.free()
        raise
    return found


def _discover_instance(
    backend: NvmlBackend, gpu: GpuDevice, handle: Handle, uuid: str
) -> MigDevice:
    gi = backend.gpu_instance_id(handle)
    instance = MigDevice(
        uuid=uuid,
        name=maybe(backend.name, handle) or "MIG device",
        handle=handle,
        gpu_instance_id=gi,
        compute_instance_id=backend.compute_instance_id(handle),
        # A DRA driver names a MIG device by its placement: the join needs it.
        gpu_instance=maybe(backend.gpu_instance_info, gpu.handle, gi),
    )
    if gpu.gpm_supported:  # last: nothing after it may fail and leave its buffers behind
        instance.gpm = maybe(_mig_gpm, backend, gpu.handle, gi)
    return instance


def _mig_gpm(backend: NvmlBackend, parent: Handle, gpu_instance_id: int) -> GpmPair:
    return GpmPair(backend, lambda s: backend.gpm_mig_sample_get(parent, gpu_instance_id, s))


def read_memory(backend: NvmlBackend, handle: Handle, device: GpuDevice | MigDevice) -> Memory:
    """v2 where the driver has it (it separates reserved memory), else v1."""
    if device.memory_v2 is not False:
        try:
            memory = memory_from_v2(backend.memory_v2(handle))
        except NvmlAbsent:
            if device.memory_v2 is None:
                device.memory_v2 = False
        else:
            device.memory_v2 = True
            return memory
    return memory_from_v1(maybe(backend.memory_v1, handle))


def read_pcie(backend: NvmlBackend, handle: Handle) -> tuple[int | None, int | None]:
    """(TX, RX) KB/s. Each call blocks about 20 ms while NVML samples the link."""
    try:
        tx = maybe(backend.pcie_throughput_kbs, handle, PcieDirection.TX)
        rx = maybe(backend.pcie_throughput_kbs, handle, PcieDirection.RX)
    except NvmlError:
        # A lost device or a broken library is the fast cycle's to report.
        return None, None
    return tx, rx


def read_nvlink(
    backend: NvmlBackend, gpu: GpuDevice, now: float
) -> tuple[float | None, float | None]:
    """(TX, RX) MB/s of the whole GPU: every link, never link 0 alone."""
    counters = _nvlink_counters(backend, gpu, now)
    if counters is None:
        return None, None
    rates = nvlink_rates(gpu.nvlink, counters)
    gpu.nvlink = counters
    return rates


def _nvlink_counters(backend: NvmlBackend, gpu: GpuDevice, now: float) -> NvlinkCounters | None:
    if gpu.nvlink_links is None:
        values = maybe(backend.field_values, gpu.handle, NVLINK_ALL_LINKS)
        if values is not None and all_succeeded(values):
            return nvlink_counters(values, now)
        # Refused, whatever the error: sum the links, if the driver says how many there are
        # (the H200 without NVLink says NotSupported; it is asked again next cycle).
        links = link_count(maybe(backend.field_values, gpu.handle, NVLINK_LINK_COUNT))
        if links == 0:
            return None
        gpu.nvlink_links = links
    values = maybe(backend.field_values, gpu.handle, nvlink_per_link(gpu.nvlink_links))
    return None if values is None else nvlink_counters(values, now)
