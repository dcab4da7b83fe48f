"""The aggregator actor: the single owner of state, folding samples into snapshots."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream

from keda_gpu_scaler.domain.samples import Sample
from keda_gpu_scaler.domain.snapshot import Snapshot
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.state import fold

log = logging.getLogger(__name__)

MAX_BATCH = 256
"""Channel items folded into one snapshot at most. A sampler sends each cycle as one
:class:`Batch`, so a cycle of many GPUs makes one snapshot version, not one per GPU."""


class FoldObserver(Protocol):
    def folded(self, batch: list[Sample], snapshot: Snapshot) -> None:
        """Told of every batch of samples as it is folded, with the snapshot it made (the
        debug tap, self-metrics); must not block."""


class Aggregator:
    def __init__(
        self,
        receive: MemoryObjectReceiveStream[Sample],
        hub: SnapshotHub,
        *,
        observers: Sequence[FoldObserver] = (),
    ) -> None:
        self._receive = receive
        self._hub = hub
        self._observers = tuple(observers)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._receive:
            task_status.started()
            async for first in self._receive:
                batch = [first, *self._drain()]
                now = anyio.current_time()
                snapshot = fold(self._hub.current, batch, now, plan=self._hub.history.plan)
                self._hub.publish(snapshot)
                for observer in self._observers:
                    observer.folded(batch, snapshot)

    def _drain(self) -> list[Sample]:
        """Whatever else is already queued, so one sampler cycle makes one snapshot."""
        batch: list[Sample] = []
        while len(batch) < MAX_BATCH - 1:
            try:
                batch.append(self._receive.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        return batch
