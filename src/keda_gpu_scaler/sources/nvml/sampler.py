"""NvmlSampler: the actor that reads every GPU and MIG instance of this node through NVML.

Every NVML call runs in a worker thread (``call_in_thread``; tests pass an in-process
call so a fake clock can drive them): one thread hop per cycle for the fast readings, and
PCIe throughput, whose call blocks about 20 ms per direction and GPU, on its own slower
cadence in a second task; its last value is carried into readings while it is fresh.

Errors: a reading a device cannot give is absent; a lost device (GpuIsLost, Unknown)
is published as ``SourceFault(lost=True)`` for it and its instances and rediscovered with
exponential backoff while the other devices go on; a failure of NVML itself ends ``run()``
with :class:`SourceFailure` for the supervisor to restart it.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.errors import SourceFailure
from keda_gpu_scaler.domain.samples import Batch, DeviceKey, GpuReading, Sample, SourceFault
from keda_gpu_scaler.sources.nvml.backend import NvmlBackend
from keda_gpu_scaler.sources.nvml.devices import GpuDevice, discover_gpu, read_pcie
from keda_gpu_scaler.sources.nvml.errors import NvmlAbsent, NvmlDeviceLost, NvmlError
from keda_gpu_scaler.sources.nvml.readings import Cycle, PcieValue, lost_faults, read_gpu

_T = TypeVar("_T")

DEFAULT_INTERVAL_S = 1.0
DEFAULT_PCIE_INTERVAL_S = 5.0
PCIE_FRESH_PERIODS = 3
"""A carried PCIe value older than this many PCIe periods is dropped, not repeated."""


class CallInThread(Protocol):
    def __call__(self, func: Callable[[], _T], /) -> Awaitable[_T]: ...


async def run_in_worker_thread(func: Callable[[], _T]) -> _T:
    """The production ``call_in_thread``: keeps NVML off the event loop."""
    return await anyio.to_thread.run_sync(func)


@dataclass
class _Slot:
    """One NVML index: the device found there, or why it is lost and when to retry."""

    index: int
    gpu: GpuDevice | None = None
    lost_reason: str | None = None
    failures: int = 0
    retry_at: float = 0.0
    keys: list[str] = field(default_factory=list)


class NvmlSampler:
    def __init__(
        self,
        backend: NvmlBackend,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        pcie_interval_s: float | None = DEFAULT_PCIE_INTERVAL_S,
        max_retry_s: float = 60.0,
        name: str = "nvml",
        call_in_thread: CallInThread = run_in_worker_thread,
    ) -> None:
        """``pcie_interval_s=None`` never reads PCIe (its readings stay absent)."""
        self.name = name
        self._backend = backend
        self._interval_s = interval_s
        self._pcie_interval_s = pcie_interval_s
        self._max_retry_s = max_retry_s
        self._call = call_in_thread
        self._slots: list[_Slot] = []
        self._pcie: dict[str, tuple[PcieValue, float]] = {}

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            first = self._cycle_at(anyio.current_time())
            faults = await self._in_thread(functools.partial(self._discover, first))
            try:
                task_status.started()
                if faults:
                    await send.send(Batch(source=self.name, samples=tuple(faults)))
                await self._loops(send)
            finally:
                with anyio.CancelScope(shield=True):
                    await self._call(self._release)

    async def _loops(self, send: MemoryObjectSendStream[Sample]) -> None:
        try:
            async with anyio.create_task_group() as tg:
                if self._pcie_interval_s is not None:
                    tg.start_soon(self._pcie_loop, self._pcie_interval_s)
                await self._sample_loop(send)
        except* SourceFailure as group:
            # The supervisor should log why NVML failed, not "a group of 1 exception".
            raise group.exceptions[0]  # noqa: B904 - it keeps its own cause

    async def _in_thread(self, func: Callable[[], _T]) -> _T:
        try:
            return await self._call(func)
        except NvmlError as exc:
            # Device errors are handled per device inside; what gets here is NVML itself.
            raise SourceFailure(f"NVML failed: {exc}") from exc

    def _cycle_at(self, now: float) -> Cycle:
        return Cycle(source=self.name, taken_at=now, period_s=self._interval_s)

    async def _sample_loop(self, send: MemoryObjectSendStream[Sample]) -> None:
        next_at = anyio.current_time()
        while True:
            cycle = self._cycle_at(anyio.current_time())
            samples = await self._in_thread(functools.partial(self._sample_all, cycle))
            took = anyio.current_time() - cycle.taken_at
            # One Batch per cycle: the aggregator makes one snapshot of the whole node.
            await send.send(Batch(source=self.name, samples=tuple(samples), cycle_s=took))
            now = anyio.current_time()
            # After an overrun the schedule restarts from now instead of bursting.
            next_at = max(next_at + self._interval_s, now)
            await anyio.sleep_until(next_at)

    async def _pcie_loop(self, interval_s: float) -> None:
        next_at = anyio.current_time()
        while True:
            targets = [s.gpu for s in self._slots if s.gpu is not None]
            values = await self._in_thread(functools.partial(self._read_pcie, targets))
            now = anyio.current_time()
            self._pcie.update({uuid: (value, now) for uuid, value in values.items()})
            next_at = max(next_at + interval_s, now)
            await anyio.sleep_until(next_at)

    # Worker-thread side: plain synchronous code, no event loop, no clock reads.

    def _discover(self, cycle: Cycle) -> list[SourceFault]:
        self._slots = [_Slot(i) for i in range(self._backend.device_count())]
        faults: list[SourceFault] = []
        for slot in self._slots:
            faults.extend(self._try_discover(slot, cycle))
        return faults

    def _try_discover(self, slot: _Slot, cycle: Cycle) -> list[SourceFault]:
        try:
            slot.gpu = discover_gpu(self._backend, slot.index)
        except (NvmlDeviceLost, NvmlAbsent) as exc:
            return self._lose(slot, cycle, exc)
        slot.keys = [slot.gpu.uuid, *(i.uuid for i in slot.gpu.instances)]
        slot.lost_reason, slot.failures = None, 0
        return []

    def _sample_all(self, cycle: Cycle) -> list[GpuReading | SourceFault]:
        samples: list[GpuReading | SourceFault] = []
        for slot in self._slots:
            if slot.gpu is None:
                if cycle.taken_at < slot.retry_at:
                    continue
                samples.extend(self._try_discover(slot, cycle))
            if slot.gpu is not None:
                samples.extend(self._read(slot, slot.gpu, cycle))
        return samples

    def _read(
        self, slot: _Slot, gpu: GpuDevice, cycle: Cycle
    ) -> list[GpuReading] | list[SourceFault]:
        try:
            return read_gpu(self._backend, gpu, cycle, self._carried_pcie(gpu, cycle))
        except NvmlDeviceLost as exc:
            return self._lose(slot, cycle, exc)

    def _carried_pcie(self, gpu: GpuDevice, cycle: Cycle) -> PcieValue:
        entry = self._pcie.get(gpu.uuid)
        if entry is None or self._pcie_interval_s is None:
            return None, None
        value, at = entry
        if cycle.taken_at - at > PCIE_FRESH_PERIODS * self._pcie_interval_s:
            return None, None
        return value

    def _lose(self, slot: _Slot, cycle: Cycle, exc: NvmlError) -> list[SourceFault]:
        slot.failures += 1
        slot.retry_at = cycle.taken_at + min(
            self._max_retry_s, self._interval_s * 2 ** (slot.failures - 1)
        )
        slot.lost_reason = str(exc)
        gpu, slot.gpu = slot.gpu, None
        if gpu is not None:
            gpu.release()
            return lost_faults(gpu, cycle, slot.lost_reason)
        if not slot.keys:
            # Never seen: no identity to mark lost (a made-up key would stay lost for ever
            # in the snapshot); report it as a source fault and keep retrying.
            reason = f"GPU {slot.index} cannot be read: {slot.lost_reason}"
            return [SourceFault(source=cycle.source, key=None, at=cycle.taken_at, reason=reason)]
        return [
            SourceFault(
                source=cycle.source,
                key=DeviceKey(key),
                at=cycle.taken_at,
                reason=slot.lost_reason,
                index=slot.index,
                lost=True,
            )
            for key in slot.keys
        ]

    def _read_pcie(self, gpus: list[GpuDevice]) -> dict[str, PcieValue]:
        return {gpu.uuid: read_pcie(self._backend, gpu.handle) for gpu in gpus}

    def _release(self) -> None:
        for slot in self._slots:
            if slot.gpu is not None:
                slot.gpu.release()
