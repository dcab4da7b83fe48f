"""NvmlSampler: the actor that reads every GPU and MIG instance of this node through NVML.

Every NVML call runs in a worker thread (``call_in_thread``; tests pass an in-process call
so a fake clock can drive them), and the thread only reports: one hop per cycle returns
what it met at each GPU, values or the NVML error (:func:`.readings.read_devices`). What
that means is decided back on the event loop by :func:`.cycle.fold_cycle`, which alone
changes the sampler's state. PCIe throughput, whose call blocks about 20 ms per direction
and GPU, is read on its own slower cadence in a second hop after a cycle's batch is sent,
a few GPUs at a time; its last value is carried into readings while it is fresh. The
processes on each device (``process_interval_s``, :mod:`.processes`) are read in a cycle's
own hop when due, mapped to pods through the host's ``/proc`` (``process_owners``; None
publishes that per-process readings are off). So is each GPU's MIG layout
(``mig_layout_interval_s``), and at once when NVML refuses an instance's handle: instances
made since are read from then on, and those destroyed are published as
:class:`~keda_gpu_scaler.domain.samples.DeviceGone`, so that they are forgotten.

Errors: a reading a device cannot give is absent; a lost device (GpuIsLost, Unknown)
is published as ``SourceFault(lost=True)`` for it and its instances and rediscovered with
exponential backoff while the other devices go on; a failure of NVML itself ends ``run()``
with :class:`SourceFailure` for the supervisor to restart it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.errors import SourceFailure
from keda_gpu_scaler.domain.samples import Batch, DeviceGone, Sample
from keda_gpu_scaler.sources.cadence import every
from keda_gpu_scaler.sources.nvml.backend import NvmlBackend
from keda_gpu_scaler.sources.nvml.cycle import (
    Slot,
    fold_cycle,
    is_due,
    pcie_due,
    with_pcie,
    work_for,
)
from keda_gpu_scaler.sources.nvml.errors import NvmlError
from keda_gpu_scaler.sources.nvml.readings import (
    Cycle,
    ProcessPlan,
    read_devices,
    read_pcie_of,
    release_all,
)
from keda_gpu_scaler.sources.procfs import ProcessOwners

_T = TypeVar("_T")
log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 1.0
DEFAULT_PCIE_INTERVAL_S = 5.0
DEFAULT_PROCESS_INTERVAL_S = 5.0
DEFAULT_MIG_LAYOUT_INTERVAL_S = 5.0


class CallInThread(Protocol):
    def __call__(self, func: Callable[[], _T], /) -> Awaitable[_T]: ...


async def run_in_worker_thread(func: Callable[[], _T]) -> _T:
    """The production ``call_in_thread``: keeps NVML off the event loop."""
    return await anyio.to_thread.run_sync(func)


class NvmlSampler:
    def __init__(
        self,
        backend: NvmlBackend,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        pcie_interval_s: float | None = DEFAULT_PCIE_INTERVAL_S,
        process_interval_s: float | None = DEFAULT_PROCESS_INTERVAL_S,
        process_owners: ProcessOwners | None = None,
        mig_layout_interval_s: float | None = DEFAULT_MIG_LAYOUT_INTERVAL_S,
        max_retry_s: float = 60.0,
        name: str = "nvml",
        call_in_thread: CallInThread = run_in_worker_thread,
    ) -> None:
        """``pcie_interval_s=None`` never reads PCIe (its readings stay absent);
        ``process_interval_s=None`` publishes no per-process readings at all (a recording),
        and without ``process_owners`` they say that they are off;
        ``mig_layout_interval_s=None`` reads a GPU's MIG layout again only when NVML
        refuses one of its instance handles (or a change of MIG mode is pending)."""
        self.name = name
        self._backend = backend
        self._interval_s = interval_s
        self._pcie_interval_s = pcie_interval_s
        self._process_interval_s = process_interval_s
        self._process_plan = (
            None
            if process_interval_s is None
            else ProcessPlan(process_owners, max(process_interval_s, interval_s))
        )
        self._processes_at: float | None = None
        self._layout_interval_s = mig_layout_interval_s
        self._layout_at: float | None = None
        # A lost GPU is retried after one period, then twice as long each time.
        self._backoff = Backoff(initial_s=interval_s, factor=2.0, maximum_s=max_retry_s)
        self._call = call_in_thread
        self._slots: tuple[Slot, ...] = ()

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            count = await self._in_thread(self._backend.device_count)
            self._slots = tuple(Slot(i) for i in range(count))
            try:
                task_status.started()
                async for now in every(self._interval_s):
                    await self._cycle(send, Cycle(self.name, now, self._interval_s))
                    await self._read_pcie()
            finally:
                gpus = [s.gpu for s in self._slots if s.gpu is not None]
                with anyio.CancelScope(shield=True):
                    await self._call(functools.partial(release_all, gpus))

    async def _in_thread(self, func: Callable[[], _T]) -> _T:
        try:
            return await self._call(func)
        except NvmlError as exc:
            # Device errors come back as results; what gets here is NVML itself.
            raise SourceFailure(f"NVML failed: {exc}") from exc

    async def _cycle(self, send: MemoryObjectSendStream[Sample], cycle: Cycle) -> None:
        now = cycle.taken_at
        due = is_due(self._processes_at, now, self._process_interval_s, cycle_s=self._interval_s)
        layout = is_due(self._layout_at, now, self._layout_interval_s, cycle_s=self._interval_s)
        work = work_for(self._slots, now, self._pcie_interval_s, processes=due, layout=layout)
        read = functools.partial(read_devices, self._backend, work, cycle, self._process_plan)
        # Shielded: the devices this hop discovers must reach the slots, to be freed later.
        with anyio.CancelScope(shield=True):
            results = await self._in_thread(read)
            took = anyio.current_time() - cycle.taken_at
            before = self._slots
            self._slots, samples, lost = fold_cycle(before, results, cycle, self._backoff)
            _log_layout(before, self._slots, samples)
            if due:
                self._processes_at = now
            if layout:
                self._layout_at = now
            if lost:
                await self._in_thread(functools.partial(release_all, lost))
        # One Batch per cycle: the aggregator makes one snapshot of the whole node.
        await send.send(Batch(source=self.name, samples=tuple(samples), cycle_s=took))

    async def _read_pcie(self) -> None:
        if self._pcie_interval_s is None:
            return
        now = anyio.current_time()
        due = pcie_due(
            self._slots, now, interval_s=self._interval_s, pcie_interval_s=self._pcie_interval_s
        )
        if due:
            values = await self._in_thread(functools.partial(read_pcie_of, self._backend, due))
            self._slots = with_pcie(self._slots, values, anyio.current_time())


def _log_layout(before: Sequence[Slot], after: Sequence[Slot], samples: Sequence[Sample]) -> None:
    """One line per MIG instance that appeared on a GPU already known, or is gone."""
    for old, new in zip(before, after, strict=True):
        if old.keys and new.gpu is not None:
            for key in new.keys[1:]:
                if key not in old.keys:
                    log.info("MIG instance appeared", extra={"gpu": new.index, "uuid": key})
    for sample in samples:
        if isinstance(sample, DeviceGone):
            log.info(
                "device gone",
                extra={"gpu": sample.index, "uuid": sample.key, "reason": sample.reason},
            )
