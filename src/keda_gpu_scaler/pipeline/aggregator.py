"""The aggregator actor: the single owner of state, folding samples into snapshots."""

from __future__ import annotations

import logging
import math
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
        min_interval_s: float = 0.0,
    ) -> None:
        """``min_interval_s``: fold at most this often. A cluster scaler hears a thousand
        agents' updates a second; folding what came in the last 10 ms at once makes a
        hundred snapshots a second instead of a thousand (and wakes the streams a hundred
        times), for at most that much more latency. 0: fold as soon as a sample comes."""
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s must be 0 or more, not {min_interval_s}")
        self._receive = receive
        self._hub = hub
        self._observers = tuple(observers)
        self._min_interval_s = min_interval_s

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._receive:
            task_status.started()
            folded_at = -math.inf
            async for first in self._receive:
                wait = folded_at + self._min_interval_s - anyio.current_time()
                if wait > 0:
                    await anyio.sleep(wait)
                batch = [first, *self._drain()]
                now = folded_at = anyio.current_time()
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
