"""The NVML sampler's decisions, as pure functions run on the event loop.

The worker thread reports what it met at each NVML index (:class:`DeviceResult`);
:func:`fold_cycle` decides what that means: a device read is healthy again, a device that
failed is lost and retried with :class:`Backoff`, and the samples to publish. PCIe, read on
its own slower cadence, is a value each slot carries (:func:`pcie_due`, :func:`with_pcie`),
handed to the worker with the device, so no state is shared with a thread. The processes on
each device, and the MIG layout of each GPU, are read on cadences of their own too, in the
cycle's hop when :func:`is_due`; a GPU whose MIG mode is pending a change has its layout read
every cycle until the change is made. A device that NVML no longer lists at its GPU (a MIG
instance destroyed, or gone with its GPU's MIG mode) is published as :class:`DeviceGone`,
so that it is forgotten rather than left to go stale.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.samples import (
    DeviceGone,
    DeviceKey,
    DeviceProcesses,
    GpuReading,
    SourceFault,
)
from keda_gpu_scaler.sources.nvml.devices import GpuDevice
from keda_gpu_scaler.sources.nvml.readings import (
    Cycle,
    DeviceResult,
    DeviceWork,
    PcieValue,
    lost_faults,
)

PCIE_FRESH_PERIODS = 3
"""A carried PCIe value older than this many PCIe periods is dropped, not repeated."""
_NO_PCIE: PcieValue = (None, None)


@dataclass(frozen=True, slots=True)
class Slot:
    """One NVML index: the device found there, or why it is lost and when to retry."""

    index: int
    gpu: GpuDevice | None = None
    lost_reason: str | None = None
    failures: int = 0
    retry_at: float = 0.0
    keys: tuple[str, ...] = ()
    """The UUIDs last seen here (the GPU's, then its instances'), to mark them lost."""
    pcie: PcieValue = _NO_PCIE
    pcie_at: float | None = None


CycleSample = GpuReading | DeviceProcesses | SourceFault | DeviceGone
CycleOutcome = tuple[tuple[Slot, ...], list[CycleSample], list[GpuDevice]]
"""The next slots, the samples to publish, and lost devices whose buffers must be freed."""


def work_for(
    slots: Sequence[Slot],
    now: float,
    pcie_interval_s: float | None,
    *,
    processes: bool = False,
    layout: bool = False,
) -> list[DeviceWork]:
    """What the worker should read now: every device, and each lost one whose retry is due;
    with ``processes``, their processes too; with ``layout``, each GPU's MIG layout (and
    that of a GPU whose MIG mode is pending a change, always)."""
    return [
        DeviceWork(
            s.index,
            s.gpu,
            _carried_pcie(s, now, pcie_interval_s),
            processes,
            layout or (s.gpu is not None and s.gpu.mig_pending != s.gpu.mig_enabled),
        )
        for s in slots
        if s.gpu is not None or now >= s.retry_at
    ]


def is_due(last_at: float | None, now: float, interval_s: float | None, *, cycle_s: float) -> bool:
    """Whether this cycle does what is done every ``interval_s`` (None: never): on the first
    cycle, then on the first cycle (every ``cycle_s``) at which ``interval_s`` has passed.
    Cycles wake a little after their tick on a real clock: half a cycle's slack keeps every
    interval's read on its tick rather than one cycle late."""
    if interval_s is None:
        return False
    return last_at is None or now - last_at >= interval_s - cycle_s / 2


def fold_cycle(
    slots: Sequence[Slot], results: Sequence[DeviceResult], cycle: Cycle, backoff: Backoff
) -> CycleOutcome:
    by_index = {r.index: r for r in results}
    next_slots: list[Slot] = []
    samples: list[CycleSample] = []
    released: list[GpuDevice] = []
    for slot in slots:
        result = by_index.get(slot.index)
        if result is None:
            next_slots.append(slot)
        elif result.error is None and result.gpu is not None:
            gpu = result.gpu
            keys = (gpu.uuid, *(i.uuid for i in gpu.instances))
            next_slots.append(replace(slot, gpu=gpu, lost_reason=None, failures=0, keys=keys))
            samples.extend(result.readings)
        else:
            lost, faults = _lose(slot, result, cycle, backoff)
            next_slots.append(lost)
            samples.extend(faults)
            if result.gpu is not None:
                released.append(result.gpu)
    # First, so that a device found at another index in this very cycle is not forgotten.
    return tuple(next_slots), [*_gone(slots, next_slots, cycle), *samples], released


def _gone(before: Sequence[Slot], after: Sequence[Slot], cycle: Cycle) -> list[DeviceGone]:
    """The devices no slot knows any more: NVML no longer lists them (a lost GPU keeps its
    keys, to mark them lost)."""
    known = {key for slot in after for key in slot.keys}
    gpus = {slot.keys[0]: slot for slot in after if slot.keys}
    gone: list[DeviceGone] = []
    for old in before:
        if not old.keys:
            continue
        gpu, *instances = old.keys  # the GPU's own key first, then its instances'
        for key in instances:
            if key not in known:
                gone.append(_instance_gone(key, old.index, gpus.get(gpu), cycle))
        if gpu not in known:
            reason = f"NVML no longer lists {gpu} at GPU index {old.index}"
            gone.append(_gone_sample(gpu, old.index, cycle, reason))
    return gone


def _instance_gone(key: str, index: int, parent: Slot | None, cycle: Cycle) -> DeviceGone:
    if parent is not None and parent.gpu is not None and not parent.gpu.mig_enabled:
        index = parent.index
        reason = f"MIG mode is off on GPU {index}: MIG instance {key} no longer exists"
    else:
        reason = (
            f"NVML no longer lists MIG instance {key} on GPU {index}: it was destroyed "
            "(the GPU's MIG layout changed)"
        )
    return _gone_sample(key, index, cycle, reason)


def _gone_sample(key: str, index: int, cycle: Cycle, reason: str) -> DeviceGone:
    return DeviceGone(
        source=cycle.source, key=DeviceKey(key), at=cycle.taken_at, reason=reason, index=index
    )


def _lose(
    slot: Slot, result: DeviceResult, cycle: Cycle, backoff: Backoff
) -> tuple[Slot, list[SourceFault]]:
    failures = slot.failures + 1
    reason = str(result.error)
    lost = replace(
        slot,
        gpu=None,
        lost_reason=reason,
        failures=failures,
        retry_at=cycle.taken_at + backoff.delay(failures),
    )
    if result.gpu is not None:
        gpu = result.gpu
        return lost, lost_faults(
            gpu.index, [gpu.uuid, *(i.uuid for i in gpu.instances)], cycle, reason
        )
    if not slot.keys:
        # Never seen: no identity to mark lost (a made-up key would stay lost for ever in
        # the snapshot); report it as a source fault and keep retrying.
        fault = SourceFault(
            source=cycle.source,
            key=None,
            at=cycle.taken_at,
            reason=f"GPU {slot.index} cannot be read: {reason}",
        )
        return lost, [fault]
    return lost, lost_faults(slot.index, slot.keys, cycle, reason)


def pcie_due(
    slots: Sequence[Slot], now: float, *, interval_s: float, pcie_interval_s: float
) -> list[GpuDevice]:
    """The GPUs whose PCIe to read after this cycle: oldest first, and only as many as keep
    every GPU within its PCIe period, so one cycle's extra wait stays short (~40 ms a GPU)."""
    due = [
        s
        for s in slots
        if s.gpu is not None and (s.pcie_at is None or now - s.pcie_at >= pcie_interval_s)
    ]
    due.sort(key=lambda s: -math.inf if s.pcie_at is None else s.pcie_at)
    per_cycle = max(1, math.ceil(len(slots) * interval_s / pcie_interval_s))
    return [s.gpu for s in due[:per_cycle] if s.gpu is not None]


def with_pcie(
    slots: Sequence[Slot], values: Mapping[int, PcieValue], at: float
) -> tuple[Slot, ...]:
    return tuple(
        replace(s, pcie=values[s.index], pcie_at=at) if s.index in values else s for s in slots
    )


def _carried_pcie(slot: Slot, now: float, pcie_interval_s: float | None) -> PcieValue:
    if pcie_interval_s is None or slot.pcie_at is None:
        return _NO_PCIE
    if now - slot.pcie_at > PCIE_FRESH_PERIODS * pcie_interval_s:
        return _NO_PCIE
    return slot.pcie
