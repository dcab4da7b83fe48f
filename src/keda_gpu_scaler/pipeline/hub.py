"""SnapshotHub: holds the newest snapshot and wakes whoever waits for a newer one.

Readers also tell the producer, through the hub's :class:`HistoryDemand`, how much of each
device's past the snapshots must carry for their windows.
"""

from __future__ import annotations

import logging

import anyio

from keda_gpu_scaler.domain.catalog import MetricType
from keda_gpu_scaler.domain.history import MAX_HISTORY_READINGS, HistoryPlan
from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT, Snapshot
from keda_gpu_scaler.domain.windows import MAX_WINDOW_S

log = logging.getLogger(__name__)


class HistoryDemand:
    """How much history the aggregator keeps: the longest window any trigger asked for,
    with a column for each metric a window reads.

    The decider raises it as KEDA sends triggers; the aggregator reads :attr:`plan` on
    every fold. It never shrinks (a trigger KEDA stops sending leaves its history in place),
    and it is bounded: at most ``MAX_WINDOW_S`` seconds and ``max_readings`` per device.
    A window longer than the history kept so far is unavailable until it fills.
    """

    def __init__(self, *, max_readings: int = MAX_HISTORY_READINGS) -> None:
        if max_readings < 1:
            raise ValueError("max_readings must be at least 1")
        self._plan = HistoryPlan(max_readings=max_readings)

    @property
    def plan(self) -> HistoryPlan:
        return self._plan

    def require(self, metric: MetricType, seconds: float) -> None:
        """Keep at least ``seconds`` (at most ``MAX_WINDOW_S``) of ``metric``'s values."""
        plan = self._plan
        seconds = min(seconds, MAX_WINDOW_S)
        if seconds <= 0 or (metric in plan.metrics and seconds <= plan.seconds):
            return
        self._plan = HistoryPlan(
            seconds=max(plan.seconds, seconds),
            metrics=plan.metrics | {metric},
            max_readings=plan.max_readings,
        )
        log.info(
            "history kept for windows",
            extra={
                "seconds": self._plan.seconds,
                "metrics": ",".join(sorted(self._plan.metrics)),
                "max_readings": self._plan.max_readings,
            },
        )


class SnapshotHub:
    def __init__(self, *, history: HistoryDemand | None = None) -> None:
        self._snapshot = EMPTY_SNAPSHOT
        self._changed = anyio.Event()
        self.history = history or HistoryDemand()
        """What readers' windows need kept; the aggregator folds with its plan."""

    @property
    def current(self) -> Snapshot:
        return self._snapshot

    def publish(self, snapshot: Snapshot) -> None:
        if snapshot.version <= self._snapshot.version:
            raise ValueError("snapshot versions must increase")
        self._snapshot = snapshot
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def wait_newer(self, version: int) -> Snapshot:
        """The first snapshot whose version is above ``version`` (at once if it exists)."""
        while self._snapshot.version <= version:
            await self._changed.wait()
        return self._snapshot
