"""The aggregator actor: the single owner of state, folding samples into snapshots."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream

from keda_gpu_scaler.domain.samples import Sample, SourceFault, unbatch
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.state import fold

log = logging.getLogger(__name__)

MAX_BATCH = 256
"""Channel items folded into one snapshot at most. A sampler sends each cycle as one
:class:`Batch`, so a cycle of many GPUs makes one snapshot version, not one per GPU."""


@dataclass(frozen=True, slots=True)
class AggregatorStatistics:
    samples: int
    faults: int
    snapshots: int
    queued: int
    last_sample_at: float | None


SampleObserver = Callable[[list[Sample]], None]
"""Told of every batch of samples as it is folded (the debug tap, self-metrics); must not
block."""


class Aggregator:
    def __init__(
        self,
        receive: MemoryObjectReceiveStream[Sample],
        hub: SnapshotHub,
        *,
        observers: Sequence[SampleObserver] = (),
    ) -> None:
        self._receive = receive
        self._hub = hub
        self._observers = tuple(observers)
        self._samples = 0
        self._faults = 0
        self._last_sample_at: float | None = None

    def statistics(self) -> AggregatorStatistics:
        return AggregatorStatistics(
            samples=self._samples,
            faults=self._faults,
            snapshots=self._hub.current.version,
            queued=self._receive.statistics().current_buffer_used,
            last_sample_at=self._last_sample_at,
        )

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._receive:
            task_status.started()
            async for first in self._receive:
                batch = [first, *self._drain()]
                now = anyio.current_time()
                self._count(batch, now)
                self._hub.publish(fold(self._hub.current, batch, now))
                for observe in self._observers:
                    observe(batch)

    def _drain(self) -> list[Sample]:
        """Whatever else is already queued, so one sampler cycle makes one snapshot."""
        batch: list[Sample] = []
        while len(batch) < MAX_BATCH - 1:
            try:
                batch.append(self._receive.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        return batch

    def _count(self, batch: list[Sample], now: float) -> None:
        for sample in unbatch(batch):
            if isinstance(sample, SourceFault):
                self._faults += 1
            else:
                self._samples += 1
        self._last_sample_at = now
