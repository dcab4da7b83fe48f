"""One cycle's readings of the GPUs and their MIG instances (worker-thread code).

:func:`read_devices` is the whole worker-thread side of a cycle: it reads (or first
discovers) the devices it is given and returns what it met at each NVML index, values or the
:class:`NvmlError`; it decides nothing. The sampler folds the results on the event loop.

On the per-process cadence (``DeviceWork.processes``) it also reads the processes on each
GPU, or on each MIG instance of a MIG-enabled GPU (:mod:`.processes`), as
:class:`DeviceProcesses` beside the readings. On the MIG layout's cadence
(``DeviceWork.layout``), and whenever NVML refuses an instance's handle or says it names
another instance now, it reads a GPU's MIG mode and instances again before the readings
(:func:`.devices.read_layout`): dynamic MIG makes and destroys instances at any time.

A MIG instance gets its own utilization (absent: NVML has none per instance), memory and
GPM, plus copies of its GPU's whole-GPU readings (temperature, power, clocks, PCIe,
NVLink) marked through ``parent_index``, so the decision layer counts those once per GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec

from keda_gpu_scaler.domain.samples import DeviceKey, DeviceProcesses, GpuReading, SourceFault
from keda_gpu_scaler.sources.nvml.backend import (
    GpuInstanceInfo,
    Handle,
    NvmlBackend,
    Utilization,
)
from keda_gpu_scaler.sources.nvml.convert import GpmReadings, Memory
from keda_gpu_scaler.sources.nvml.devices import (
    GpuDevice,
    MigDevice,
    discover_gpu,
    instances_moved,
    maybe,
    read_layout,
    read_memory,
    read_nvlink,
    read_pcie,
)
from keda_gpu_scaler.sources.nvml.errors import NvmlAbsent, NvmlDeviceLost, NvmlError
from keda_gpu_scaler.sources.nvml.processes import ProcessTarget, read_processes
from keda_gpu_scaler.sources.procfs import ProcessOwners

PcieValue = tuple[int | None, int | None]


@dataclass(frozen=True, slots=True)
class Cycle:
    source: str
    taken_at: float
    period_s: float


@dataclass(frozen=True, slots=True)
class DeviceWork:
    """Read the GPU at ``index``: ``gpu`` as known, or discover it first when None."""

    index: int
    gpu: GpuDevice | None
    pcie: PcieValue = (None, None)
    """The PCIe value to carry into the readings (read on its own cadence)."""
    processes: bool = False
    """Read the processes on the device too (their own cadence)."""
    layout: bool = False
    """Read the MIG mode and instances again first (their own cadence)."""


@dataclass(frozen=True, slots=True)
class ProcessPlan:
    """How processes are read: mapped to pods through ``owners`` (None: per-process
    readings are off, which each device's :class:`DeviceProcesses` says), every
    ``period_s``."""

    owners: ProcessOwners | None
    period_s: float


@dataclass(frozen=True, slots=True)
class DeviceResult:
    """What the worker met at one NVML index: readings, or the error that stopped it."""

    index: int
    gpu: GpuDevice | None
    """The device read, or discovered before the error; None if discovery failed."""
    readings: tuple[GpuReading | DeviceProcesses, ...] = ()
    error: NvmlError | None = None


def read_devices(
    backend: NvmlBackend,
    work: Sequence[DeviceWork],
    cycle: Cycle,
    plan: ProcessPlan | None = None,
) -> list[DeviceResult]:
    """One cycle of NVML calls. :class:`NvmlLibraryError` propagates: nothing can be read."""
    return [_read_device(backend, item, cycle, plan) for item in work]


def _read_device(
    backend: NvmlBackend, work: DeviceWork, cycle: Cycle, plan: ProcessPlan | None
) -> DeviceResult:
    gpu = work.gpu
    if gpu is None:
        try:
            gpu = discover_gpu(backend, work.index)
        except (NvmlDeviceLost, NvmlAbsent) as exc:
            return DeviceResult(work.index, None, error=exc)
    try:
        if work.gpu is not None and (work.layout or instances_moved(backend, gpu)):
            read_layout(backend, gpu)
        found: list[GpuReading | DeviceProcesses] = [*read_gpu(backend, gpu, cycle, work.pcie)]
        if work.processes and plan is not None:
            found.extend(_processes(backend, gpu, cycle, plan))
        return DeviceResult(work.index, gpu, tuple(found))
    except NvmlDeviceLost as exc:
        return DeviceResult(work.index, gpu, error=exc)
    except NvmlError:
        if work.gpu is None:
            gpu.release()  # found in this very call: nobody else knows it to free it
        raise


def _processes(
    backend: NvmlBackend, gpu: GpuDevice, cycle: Cycle, plan: ProcessPlan
) -> list[DeviceProcesses]:
    """The GPU's processes; a MIG-enabled GPU's, instance by instance (its instances are
    what pods hold)."""
    if gpu.mig_enabled:
        targets = [ProcessTarget(i.uuid, gpu.index, i.handle, i.processes) for i in gpu.instances]
    else:
        targets = [ProcessTarget(gpu.uuid, gpu.index, gpu.handle, gpu.processes)]
    return [
        read_processes(
            backend,
            plan.owners,
            target,
            source=cycle.source,
            taken_at=cycle.taken_at,
            period_s=plan.period_s,
        )
        for target in targets
    ]


def read_pcie_of(backend: NvmlBackend, gpus: Sequence[GpuDevice]) -> dict[int, PcieValue]:
    """(TX, RX) of each GPU by NVML index; about 40 ms per GPU."""
    return {gpu.index: read_pcie(backend, gpu.handle) for gpu in gpus}


def release_all(gpus: Sequence[GpuDevice]) -> None:
    for gpu in gpus:
        gpu.release()


@dataclass(frozen=True, slots=True)
class _WholeGpu:
    temperature_c: int | None
    power_mw: int | None
    power_limit_mw: int | None
    sm_clock_mhz: int | None
    pcie: PcieValue
    nvlink: tuple[float | None, float | None]


@dataclass(frozen=True, slots=True)
class _Own:
    utilization: Utilization | None
    memory: Memory
    gpm: GpmReadings


def read_gpu(
    backend: NvmlBackend, gpu: GpuDevice, cycle: Cycle, pcie: PcieValue
) -> list[GpuReading]:
    """The GPU's reading, then one per MIG instance; raises NvmlDeviceLost for the lot."""
    whole = _WholeGpu(
        temperature_c=maybe(backend.temperature_c, gpu.handle),
        power_mw=maybe(backend.power_usage_mw, gpu.handle),
        power_limit_mw=maybe(backend.power_limit_mw, gpu.handle),
        sm_clock_mhz=maybe(backend.sm_clock_mhz, gpu.handle),
        pcie=pcie,
        nvlink=read_nvlink(backend, gpu, cycle.taken_at),
    )
    readings = [_reading(cycle, gpu, whole, _own(backend, gpu.handle, gpu))]
    for instance in gpu.instances:
        own = _own(backend, instance.handle, instance)
        readings.append(_instance_reading(cycle, gpu, instance, whole, own))
    return readings


def _own(backend: NvmlBackend, handle: Handle, device: GpuDevice | MigDevice) -> _Own:
    return _Own(
        utilization=maybe(backend.utilization, handle),
        memory=read_memory(backend, handle, device),
        gpm=GpmReadings() if device.gpm is None else device.gpm.read(),
    )


def _reading(cycle: Cycle, gpu: GpuDevice, whole: _WholeGpu, own: _Own) -> GpuReading:
    util, memory, gpm = own.utilization, own.memory, own.gpm
    return GpuReading(
        source=cycle.source,
        key=DeviceKey(gpu.uuid),
        index=gpu.index,
        uuid=gpu.uuid,
        name=gpu.name,
        taken_at=cycle.taken_at,
        period_s=cycle.period_s,
        gpu_utilization=None if util is None else float(util.gpu),
        memory_utilization=None if util is None else float(util.memory),
        memory_used_bytes=memory.used_bytes,
        memory_total_bytes=memory.total_bytes,
        memory_reserved_bytes=memory.reserved_bytes,
        temperature_c=_float(whole.temperature_c),
        power_mw=_float(whole.power_mw),
        power_limit_mw=_float(whole.power_limit_mw),
        sm_clock_mhz=_float(whole.sm_clock_mhz),
        pcie_tx_kbps=_float(whole.pcie[0]),
        pcie_rx_kbps=_float(whole.pcie[1]),
        nvlink_tx_mbps=whole.nvlink[0],
        nvlink_rx_mbps=whole.nvlink[1],
        sm_active=gpm.sm_active,
        sm_occupancy=gpm.sm_occupancy,
        tensor_active=gpm.tensor_active,
        dram_bw_util=gpm.dram_bw_util,
        mig_enabled=gpu.mig_enabled,
    )


def _instance_reading(
    cycle: Cycle, gpu: GpuDevice, instance: MigDevice, whole: _WholeGpu, own: _Own
) -> GpuReading:
    return msgspec.structs.replace(
        _reading(cycle, gpu, whole, own),
        key=DeviceKey(instance.uuid),
        uuid=instance.uuid,
        name=instance.name,
        mig_enabled=False,
        parent_index=gpu.index,
        parent_uuid=gpu.uuid,
        gpu_instance_id=instance.gpu_instance_id,
        compute_instance_id=instance.compute_instance_id,
        **_placement(instance.gpu_instance),
    )


def _placement(info: GpuInstanceInfo | None) -> dict[str, int]:
    if info is None:
        return {}
    return {
        "gpu_instance_profile_id": info.profile_id,
        "placement_start": info.placement_start,
        "placement_size": info.placement_size,
    }


def lost_faults(index: int, keys: Iterable[str], cycle: Cycle, reason: str) -> list[SourceFault]:
    """A GPU (``index``) and every instance on it (``keys``: their UUIDs) lost together."""
    return [
        SourceFault(
            source=cycle.source,
            key=DeviceKey(key),
            at=cycle.taken_at,
            reason=reason,
            index=index,
            lost=True,
        )
        for key in keys
    ]


def _float(value: int | None) -> float | None:
    return None if value is None else float(value)
