"""StreamIsActive: a pure pacer per stream, and a registry that owns every open stream.

KEDA opens one stream per trigger of each ScaledObject, hundreds on one connection, most of
them with one of a few metadata maps. The registry groups open streams by trigger spec and
runs one driver task for all of them:

- on every new snapshot it measures each spec once (shared with unary calls through the
  :class:`~keda_gpu_scaler.serving.decider.Decider`) and compares the spec's raw activity
  (value above the activation threshold, or no usable reading) with the last one;
- only when that changed are the spec's streams judged one by one (their ScaledObject's
  cooldown entry may hold a higher value), and only a stream whose message is due wakes;
- otherwise a stream wakes only when its heartbeat is due, or when its cooldown hold ends;
  each stream beats a little early, by its own amount, so that heartbeats do not come due
  together (:func:`heartbeat_spread`).

Why this is enough: while the raw value stays above the threshold, the served value (never
below the raw one) does too; while it stays at or under it, the activity can only change when
a cooldown hold ends, and the hold says when that is.

Opening a stream costs one judgement against the shared measurement. The driver judges at
most ``JUDGE_AT_ONCE`` streams per turn of the event loop (new ones, due ones, those whose
spec changed), so a burst of opens, or a thousand heartbeats falling due together, never
starves the loop. On shutdown every stream ends with status OK.

StreamMetricSpec streams are held here too (:meth:`StreamRegistry.hold`): their one message
(a trigger's metric spec depends on its metadata alone, so it never changes while the stream
is open) is sent by the handler at once, and the stream then stays open, counted, until KEDA
cancels it or the server shuts down, when it ends with OK like every StreamIsActive stream.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus

from keda_gpu_scaler.domain.decision import TriggerKey
from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData
from keda_gpu_scaler.domain.snapshot import Snapshot
from keda_gpu_scaler.domain.trigger import TriggerSpec
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.serving.decider import Decider

log = logging.getLogger(__name__)

RPC = "StreamIsActive"
JUDGE_AT_ONCE = 64
"""Streams judged per turn of the event loop: a burst of a thousand opens, heartbeats that
fall due together or a change that flips every stream of a spec is spread over turns, with
every other task (a unary call, a sampler) getting its own in between."""
_CLOSED = -math.inf
_STALE_MARGIN_S = 1e-3
"""Look again this long after a measurement's readings go stale, clear of float rounding."""
_WAKE_TOLERANCE_S = 1e-3
"""A heartbeat is due this long before its time: a timer may fire a hair early."""


@dataclass(frozen=True, slots=True)
class Step:
    send: bool
    wake_at: float
    """When this stream must be judged again at the latest (a heartbeat, or a retry)."""


@dataclass(slots=True)
class StreamPacer:
    """When a stream sends: at once, on every change of activity, and every ``interval_s``.

    The heartbeat comes ``early_s`` before the interval is up (never later), so that streams
    opened or changed together do not all beat together. A failed judgement (``active``
    None) is never sent; the stream retries a heartbeat later (or sooner, on a change). Pure:
    the caller owns the clock.
    """

    interval_s: float
    early_s: float = 0.0
    last: bool | None = None
    sent_at: float = -math.inf

    def __post_init__(self) -> None:
        if not 0.0 <= self.early_s < self.interval_s:
            raise ValueError(
                f"early_s must be at least 0 and under interval_s ({self.interval_s:g} s), "
                f"not {self.early_s:g}"
            )

    def step(self, active: bool | None, now: float, *, hold_ends_at: float = math.inf) -> Step:
        beat_s = self.interval_s - self.early_s
        if active is None:
            return Step(False, now + beat_s)
        # Due from the very time it asked to be woken at (``now - sent_at`` can round below
        # ``beat_s`` then, and a loop may wake a timer a hair early): else it never beats.
        send = active != self.last or now >= self.sent_at + beat_s - _WAKE_TOLERANCE_S
        if send:
            self.last, self.sent_at = active, now
        return Step(send, min(self.sent_at + beat_s, hold_ends_at))


_SPREAD_SHARE, _SPREAD_MAX_S = 0.2, 2.0
"""Heartbeats are spread over a fifth of the interval, 2 s at most."""
_GOLDEN = (math.sqrt(5) - 1) / 2


def heartbeat_spread(interval_s: float, n: int) -> float:
    """How early the ``n``-th stream opened beats: spread evenly over the first fifth of the
    interval (2 s at most) however many streams there are, by the golden ratio's sequence.

    A thousand streams that open together (or whose spec changes at once) would otherwise
    send their heartbeats in the same turns of the event loop, every interval: a thousand
    writes in a row, which every unary call arriving then waits behind."""
    return (n * _GOLDEN) % 1.0 * min(_SPREAD_SHARE * interval_s, _SPREAD_MAX_S)


_Raw = bool | None | Exception
"""A spec's raw activity: above the threshold, not, no usable reading (None), or a bad
trigger (the :class:`InvalidTrigger` to end its streams with)."""


class _Closed(Exception):
    """The registry is shutting down: the stream ends with status OK."""


@dataclass(eq=False, slots=True)
class _Stream:
    key: TriggerKey
    pacer: StreamPacer
    wake_at: float = math.inf
    pending: bool | None = None
    error: Exception | None = None
    admitted: bool = False
    """In its spec's group: judged once at least."""
    queued: bool = False
    ready: anyio.Event | None = None
    """Made only while the handler waits: most messages are taken without one."""

    def deliver(self, active: bool) -> None:
        self.pending = active  # a reader that lags gets the newest activity, not a backlog
        if self.ready is not None:
            self.ready.set()

    def fail(self, error: Exception) -> None:
        self.error = error
        if self.ready is not None:
            self.ready.set()

    async def next(self) -> bool:
        while self.pending is None and self.error is None:
            self.ready = anyio.Event()
            try:
                await self.ready.wait()
            finally:
                self.ready = None
        if self.error is not None:
            raise self.error
        active, self.pending = self.pending, None
        assert active is not None
        return active


@dataclass(eq=False, slots=True)
class _Group:
    spec: TriggerSpec
    streams: set[_Stream] = field(default_factory=set)
    raw: _Raw = None
    raw_version: int = -1
    failure: str | None = None
    fresh_until: float = math.inf


class StreamRegistry:
    """Every open StreamIsActive stream, grouped by spec and driven by one task (:meth:`run`)."""

    def __init__(self, hub: SnapshotHub, decider: Decider) -> None:
        self._hub = hub
        self._decider = decider
        self._groups: dict[TriggerSpec, _Group] = {}
        self._timers: list[tuple[float, int, _Stream]] = []
        self._queue: deque[_Stream] = deque()
        """Streams to judge (new ones, due ones, those whose spec changed), in order;
        ``JUDGE_AT_ONCE`` per turn of the event loop."""
        self._sequence = itertools.count()
        self._opened = itertools.count()
        self._sleep: anyio.CancelScope | None = None
        self._running = False
        self._closing = False
        self._open = 0
        self._held = 0
        self._ended = anyio.Event()
        self._shutdown = anyio.Event()

    @property
    def open_streams(self) -> int:
        """Open StreamIsActive streams."""
        return self._open

    @property
    def held_streams(self) -> int:
        """Open streams that wait for shutdown (StreamMetricSpec)."""
        return self._held

    async def hold(self) -> None:
        """Wait until shutdown begins: a stream with nothing more to send stays open, counted,
        until the server stops (then it ends with OK) or the client cancels it."""
        if not self._running:
            raise RuntimeError("StreamRegistry.run() has not started")
        if self._closing:
            return
        self._held += 1
        try:
            await self._shutdown.wait()
        finally:
            self._held -= 1
            self._note_ended()

    # -- the streams ------------------------------------------------------------------

    async def stream(self, key: TriggerKey) -> AsyncIterator[bool]:
        """The activity of ``key``: at once, on every change, and as a heartbeat."""
        if not self._running:
            raise RuntimeError("StreamRegistry.run() has not started")
        if self._closing:
            return
        interval_s = key.spec.poll_interval_s
        early_s = heartbeat_spread(interval_s, next(self._opened))
        stream = _Stream(key, StreamPacer(interval_s, early_s))
        self._open += 1
        self._enqueue(stream)
        self._wake_driver()
        try:
            while True:
                try:
                    active = await stream.next()
                except _Closed:
                    return
                yield active
        finally:
            self._close_stream(stream)

    def _enqueue(self, stream: _Stream) -> None:
        if not stream.queued:
            stream.queued = True
            self._queue.append(stream)

    def _judge_some(self, snapshot: Snapshot, now: float) -> None:
        """Judge up to ``JUDGE_AT_ONCE`` queued streams; the rest wait for the next turn."""
        for _ in range(min(JUDGE_AT_ONCE, len(self._queue))):
            stream = self._queue.popleft()
            stream.queued = False
            if stream.wake_at == _CLOSED:
                continue  # gone since it was queued
            if not stream.admitted:
                self._admit(stream, snapshot, now)
            self._judge(stream, snapshot, now)

    def _admit(self, stream: _Stream, snapshot: Snapshot, now: float) -> None:
        group = self._groups.get(stream.key.spec)
        if group is None:
            group = self._groups[stream.key.spec] = _Group(stream.key.spec)
            self._refresh(group, snapshot, now)
        group.streams.add(stream)
        stream.admitted = True

    def _close_stream(self, stream: _Stream) -> None:
        self._open -= 1
        group = self._groups.get(stream.key.spec)
        if group is not None:
            group.streams.discard(stream)
            if not group.streams:
                del self._groups[stream.key.spec]
        stream.wake_at = _CLOSED  # its timer, if any, is dropped when it comes up
        self._note_ended()

    def _note_ended(self) -> None:
        if self._closing and not self._open and not self._held:
            self._ended.set()

    # -- the driver -------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Judge streams as snapshots and deadlines come, until cancelled."""
        self._running = True
        task_status.started()
        version = self._hub.current.version
        try:
            while not self._closing:
                if self._queue:
                    # Let every other task (a unary call, a sampler) have its turn.
                    await anyio.lowlevel.checkpoint()
                else:
                    with anyio.CancelScope(deadline=self._next_deadline()) as self._sleep:
                        if self._groups:
                            await self._hub.wait_newer(version)
                        else:  # no stream: nothing to judge until one opens
                            await anyio.sleep_forever()
                    self._sleep = None
                snapshot = self._hub.current
                version = snapshot.version
                now = anyio.current_time()
                for group in list(self._groups.values()):
                    if group.raw_version != version or now > group.fresh_until:
                        self._refresh(group, snapshot, now)
                self._fire_timers(now)
                self._judge_some(snapshot, now)
        finally:
            self._running = False

    def _next_deadline(self) -> float:
        while self._timers and self._timers[0][2].wake_at != self._timers[0][0]:
            heapq.heappop(self._timers)  # rescheduled or closed since
        timer = self._timers[0][0] if self._timers else math.inf
        fresh = min((g.fresh_until for g in self._groups.values()), default=math.inf)
        return min(timer, fresh + _STALE_MARGIN_S)

    def _refresh(self, group: _Group, snapshot: Snapshot, now: float) -> None:
        """Measure the group's spec; queue its streams if the raw activity changed."""
        self._decider.keep_alive(group.spec)
        spec = group.spec
        raw: _Raw
        try:
            measured = self._decider.measurement(spec, snapshot, now)
        except NoData as exc:
            raw, fresh_until = None, math.inf
            self._log_failure(group, str(exc))
        except InvalidTrigger as exc:
            raw, fresh_until = exc, math.inf
        else:
            raw, fresh_until = measured.value > spec.activation, measured.fresh_until
            self._log_recovery(group)
        group.raw_version, group.fresh_until = snapshot.version, fresh_until
        changed = raw is not group.raw
        group.raw = raw
        if changed:
            for stream in group.streams:
                self._enqueue(stream)

    def _fire_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            at, _, stream = heapq.heappop(self._timers)
            if stream.wake_at == at:
                self._enqueue(stream)

    def _judge(self, stream: _Stream, snapshot: Snapshot, now: float) -> None:
        hold_ends_at = math.inf
        try:
            decision = self._decider.decide(stream.key, snapshot, RPC)
        except NoData:
            step = stream.pacer.step(None, now)
        except InvalidTrigger as exc:
            stream.fail(exc)
            return
        else:
            if decision.cooldown.held:
                hold_ends_at = now + decision.cooldown.remaining_s
            step = stream.pacer.step(decision.active, now, hold_ends_at=hold_ends_at)
            if step.send:
                stream.deliver(decision.active)
        self._schedule(stream, step.wake_at)

    def _schedule(self, stream: _Stream, at: float) -> None:
        if stream.wake_at == at:
            return
        stream.wake_at = at
        heapq.heappush(self._timers, (at, next(self._sequence), stream))
        if self._sleep is not None and at < self._sleep.deadline:
            self._sleep.deadline = at  # the driver sleeps until a later deadline: sooner

    def _wake_driver(self) -> None:
        if self._sleep is not None:
            self._sleep.cancel()

    def _log_failure(self, group: _Group, reason: str) -> None:
        if group.failure is None and group.streams:
            log.warning(
                "streams skip ticks: no usable reading",
                extra={
                    "metric": group.spec.metric_name,
                    "streams": len(group.streams),
                    "reason": reason,
                },
            )
        group.failure = reason

    def _log_recovery(self, group: _Group) -> None:
        if group.failure is not None and group.streams:
            log.info(
                "streams resume",
                extra={"metric": group.spec.metric_name, "streams": len(group.streams)},
            )
        group.failure = None

    # -- shutdown ---------------------------------------------------------------------

    def begin_shutdown(self) -> None:
        """End every open stream with status OK (KEDA reconnects within 2 s)."""
        self._closing = True
        self._shutdown.set()
        self._note_ended()
        for group in self._groups.values():
            for stream in group.streams:
                stream.fail(_Closed())
        for stream in self._queue:
            stream.fail(_Closed())
        self._queue.clear()
        self._wake_driver()

    async def wait_streams_ended(self) -> None:
        """After :meth:`begin_shutdown`, until every stream handler (held ones included) has
        returned."""
        if self._closing:
            await self._ended.wait()
