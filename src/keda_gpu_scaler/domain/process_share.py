"""A workload's own share of a device it shares with another workload, from the processes
on it (``sharedDevices: processes``, the default for a ``podSelector`` trigger).

NVML reads a device, not a pod: on a GPU time-sliced or shared through MPS (replicas
``<uuid>::<n>``), or one DRA claim shared by several pods, every pod sees the whole
device's numbers. Where a pod the trigger does not select holds the device too, the
trigger measures the processes of its own pods instead (the node agent maps each process to
its pod through its cgroup):

    metricType                          the workload's share
    gpu_utilization, sm_active          sum of its processes' SM utilization (percent)
    memory_utilization                  sum of its processes' memory-controller utilization
    memory_used_mib                     sum of its processes' used memory, in whole MiB
    memory_used_percent                 that, as a share of the device's memory
    anything else (power, temperature,  none: NVML measures it for the whole device only
    PCIe, NVLink, GPM occupancy, ...)

No share is made up: a device without per-process readings, with readings too old, where
NVML cannot tell the processes apart (MIG, older GPUs, an MPS server running its clients'
work), or where one of the workload's processes cannot be read has none, and the trigger is
UNAVAILABLE naming the device and why; ``sharedDevices: whole`` measures the whole device
instead, as a trigger over an exclusive device always does.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from keda_gpu_scaler.domain.catalog import MetricType
from keda_gpu_scaler.domain.samples import DeviceKey, ProcessUse
from keda_gpu_scaler.domain.snapshot import DeviceState, stale_limit_s

_MIB = 1 << 20


class SharedDevices(enum.StrEnum):
    """``sharedDevices``: how a ``podSelector`` trigger measures a device that pods it does
    not select hold too."""

    PROCESSES = "processes"
    """Its own pods' processes (the default)."""
    WHOLE = "whole"
    """The whole device, neighbours included."""


@dataclass(frozen=True, slots=True)
class Shares:
    """The devices of a ``podSelector``'s scope that other pods hold too, and who the
    selected pods are (by UID, as the processes' cgroups name them)."""

    others: Mapping[DeviceKey, str] = field(default_factory=lambda: MappingProxyType({}))
    """Each shared device and who else holds it, in words (``ml/train-0``)."""
    uids: frozenset[str] = frozenset()
    without_uid: tuple[str, ...] = ()
    """Selected pods (``namespace/name``) the pod watch gave no UID for."""


NO_SHARES = Shares()


@dataclass(frozen=True, slots=True)
class Share:
    value: float
    processes: int
    """How many of the workload's processes it sums."""
    fresh_until: float


_Field = Callable[[ProcessUse], float | int | None]
_UTILIZATION: dict[MetricType, _Field] = {
    MetricType.GPU_UTILIZATION: lambda p: p.sm,
    MetricType.SM_ACTIVE: lambda p: p.sm,
    MetricType.MEMORY_UTILIZATION: lambda p: p.memory,
}
_MEMORY: dict[MetricType, _Field] = {
    MetricType.MEMORY_USED_MIB: lambda p: p.used_memory_bytes,
    MetricType.MEMORY_USED_PERCENT: lambda p: p.used_memory_bytes,
}
PER_PROCESS_METRICS = (*_UTILIZATION, *_MEMORY)
"""The metric types a workload's share of a shared device can be measured in."""


def process_share(
    metric: MetricType, device: DeviceState, shares: Shares, now: float
) -> Share | str:
    """The workload's share of ``device`` in ``metric``, or why there is none."""
    read = _UTILIZATION.get(metric) or _MEMORY.get(metric)
    if read is None:
        return f"{metric} has no per-process reading (NVML measures it for the whole device)"
    if shares.without_uid:
        return f"the pod watch gives no UID for {', '.join(shares.without_uid)}"
    reading = device.processes
    if reading is None:
        return "it has no per-process reading yet"
    limit = stale_limit_s(reading.period_s)
    if now - reading.taken_at > limit:
        age = now - reading.taken_at
        return f"its per-process reading is stale: {age:.1f} s old (limit {limit:g} s)"
    unsupported = (
        reading.utilization_unsupported if metric in _UTILIZATION else reading.memory_unsupported
    )
    if unsupported is not None:
        return unsupported
    own = [p for p in reading.processes if p.pod_uid in shares.uids and not p.mps_server]
    values: list[float | int] = []
    for process in own:
        value = read(process)
        if value is None:
            return _unknown(process, metric in _UTILIZATION)
        values.append(value)
    until = reading.taken_at + limit
    if metric in _UTILIZATION:
        return Share(float(sum(values)), len(own), until)
    mib = int(sum(values)) // _MIB
    if metric is MetricType.MEMORY_USED_MIB:
        return Share(float(mib), len(own), until)
    total = device.reading.memory_total_bytes if device.reading is not None else None
    if not total or total // _MIB == 0:
        return "its memory total is not known"
    return Share(mib / (total // _MIB) * 100.0, len(own), until)


def _unknown(process: ProcessUse, utilization: bool) -> str:
    if utilization and process.pid_reused:
        return (
            f"PID {process.pid} of its pods belonged to another container at the previous "
            "reading, and NVML's samples under it cannot be split (known again at the next "
            "reading)"
        )
    what = "utilization" if utilization else "memory"
    return f"NVML gives no {what} for PID {process.pid} of its pods"
