"""Bounded, immutable histories of recent readings, for rolling windows (``windowSeconds``).

A :class:`History` keeps, per device or engine source, only what windows read: when each
reading was taken, how long it counts (its stale limit), and the value of each metric a
window asks for (NaN: no reading, never 0). Rows live in columns (``array('d')``) that only
grow at the end, and a history is a view ``[start, stop)`` over them:

- extending the newest view appends in place and returns a new view, O(1) amortised, so a
  fold per sampler cycle at 10 Hz costs a few appends per device, not a copy of the window;
- every older view still sees exactly its own rows, since rows below its ``stop`` never
  change: a snapshot never moves under its reader;
- extending a view that is not the newest one (a second fold from an old snapshot) copies
  its rows into new columns first, so ``fold`` stays a pure function whatever it is given;
- rows older than the plan's ``seconds`` or beyond its ``max_readings`` leave the view at
  once; they leave the columns when they are the larger half (one C-level slice copy of the
  live rows, so each row is copied about once more on average, never a stall).

Per metric a column also keeps running counts and sums of the values and the (rare) rows
where a value came later than the previous one's stale limit, so a window finds its first
and last value, its count, its sum and its stale stretches by bisection, however long it is;
only ``max``, ``min`` and ``p95`` read every value (a C-level slice, then ``max`` or a sort).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from keda_gpu_scaler.domain.catalog import MetricType

MAX_HISTORY_READINGS = 7200
"""Readings kept per device or engine at most, whatever the window: 3600 s at two readings a
second, 720 s at ten. A row costs 16 bytes (time, stale limit) and 24 per metric a window
reads (value, running count and sum), so 8 GPUs with two windowed metrics hold under 4 MiB
at the cap, or twice that just before dropped rows are let go."""
_COMPACT_AFTER = 256
"""Dead rows tolerated before the columns are rebuilt (and only once they outnumber the live
ones)."""
_NAN = math.nan


@dataclass(frozen=True, slots=True)
class HistoryPlan:
    """What the aggregator keeps: ``seconds`` of readings, with a column per metric in
    ``metrics``. The empty plan (the default) keeps nothing and costs nothing."""

    seconds: float = 0.0
    metrics: frozenset[MetricType] = field(default_factory=frozenset)
    max_readings: int = MAX_HISTORY_READINGS

    def keeps_any(self) -> bool:
        return self.seconds > 0 and bool(self.metrics)


NO_HISTORY = HistoryPlan()


class _Column:
    """One metric's values (NaN: none), with running counts and sums of the values and the
    rows where a value came later than the previous one's stale limit."""

    __slots__ = ("gaps", "last", "overruns", "present", "sums", "values")

    def __init__(
        self,
        values: array[float],
        present: array[int],
        sums: array[float],
        gaps: array[int],
        overruns: array[float],
    ) -> None:
        self.values = values
        self.present = present
        """Values in rows ``[0, i]``, counted from wherever the column began (only
        differences are read)."""
        self.sums = sums
        """Sum of the values in rows ``[0, i]``; rebased when the column is copied, so it
        never grows past about twice the kept rows' total."""
        self.gaps = gaps
        """Rows, ascending, whose value came later than the stale limit of the value before."""
        self.overruns = overruns
        """By how many seconds, for each row of ``gaps``."""
        self.last = -1
        """Index of the newest row with a value, -1 if none."""

    @classmethod
    def empty(cls, rows: int) -> _Column:
        nothing = array("d", [_NAN]) * rows
        return cls(
            nothing, array("q", [0]) * rows, array("d", [0.0]) * rows, array("q"), array("d")
        )

    def append(self, value: float, at: float, times: array[float], limits: array[float]) -> None:
        row = len(self.values)
        count = self.present[-1] if row else 0
        total = self.sums[-1] if row else 0.0
        if math.isnan(value):
            self.values.append(_NAN)
            self.present.append(count)
            self.sums.append(total)
            return
        last = self.last
        if last >= 0 and (overrun := at - times[last] - limits[last]) > 0:
            self.gaps.append(row)
            self.overruns.append(overrun)
        self.values.append(value)
        self.present.append(count + 1)
        self.sums.append(total + value)
        self.last = row

    def copy(self, start: int, stop: int) -> _Column:
        base = self.sums[start - 1] if start > 0 else 0.0
        sums = self.sums[start:stop]
        if base:
            sums = array("d", [s - base for s in sums])
        lo, hi = bisect_left(self.gaps, start), bisect_left(self.gaps, stop)
        gaps = array("q", [g - start for g in self.gaps[lo:hi]])
        column = _Column(
            self.values[start:stop], self.present[start:stop], sums, gaps, self.overruns[lo:hi]
        )
        column.last = _last_value(column, 0, stop - start)
        return column


class _Store:
    __slots__ = ("columns", "limits", "times")

    def __init__(
        self, times: array[float], limits: array[float], columns: dict[MetricType, _Column]
    ) -> None:
        self.times = times
        self.limits = limits
        self.columns = columns


@dataclass(frozen=True, slots=True)
class Span:
    """One metric's rows in a window ``(after, upto]``: what a window is judged on."""

    rows: int
    """Readings in the window, with or without a value of the metric."""
    oldest_at: float | None
    """When the oldest of them was taken: it leaves the window first."""
    next_at: float | None
    """The first reading after ``upto``, if the history has one (only in hand-made cases)."""
    first: tuple[float, float] | None
    """(taken at, stale limit) of the oldest value in the window."""
    last: tuple[float, float] | None
    """(taken at, stale limit) of the newest value in the window."""
    earlier_at: float | None
    """The newest value before the window, if the history still has one."""
    worst_gap: tuple[float, float, float] | None
    """(from, to, limit) of the longest stretch between two values in the window that
    overran the stale limit of the value it started from."""
    capped: bool
    """The history dropped readings to stay within ``max_readings``."""
    count: int = 0
    """Values in the window."""
    total: float = 0.0
    """Their sum."""
    _column: _Column | None = None
    _rows: tuple[int, int] = (0, 0)

    def values(self) -> Sequence[float]:
        """The metric's values in the window, oldest first (a copy at C speed when the window
        has no hole)."""
        if self._column is None:
            return ()
        first, stop = self._rows
        values = self._column.values[first:stop]
        if self.count == len(values):
            return values
        return [v for v in values if v == v]  # NaN is the only value unequal to itself


class History:
    """An immutable view of one device's (or engine's) recent readings, oldest first."""

    __slots__ = ("_capped", "_start", "_stop", "_store")

    def __init__(self, store: _Store | None, start: int, stop: int, *, capped: bool) -> None:
        self._store = store
        self._start = start
        self._stop = stop
        self._capped = capped

    def __len__(self) -> int:
        return self._stop - self._start

    def __repr__(self) -> str:
        if self._store is None or not len(self):
            return "History(empty)"
        times = self._store.times
        return f"History({len(self)} readings, {times[self._start]:g} to {times[self._stop - 1]:g})"

    @property
    def metrics(self) -> frozenset[MetricType]:
        return frozenset(self._store.columns) if self._store is not None else frozenset()

    def times(self) -> tuple[float, ...]:
        """When each kept reading was taken, oldest first."""
        return () if self._store is None else tuple(self._store.times[self._start : self._stop])

    def values(self, metric: MetricType) -> tuple[float | None, ...]:
        """The kept values of ``metric``, oldest first (None: no reading)."""
        column = None if self._store is None else self._store.columns.get(metric)
        if column is None:
            return (None,) * len(self)
        return tuple(None if math.isnan(v) else v for v in column.values[self._start : self._stop])

    def extended(
        self,
        taken_at: float,
        stale_limit: float,
        values: Mapping[MetricType, float],
        plan: HistoryPlan,
        *,
        now: float,
    ) -> History:
        """This history with one more reading (``values``: NaN for none), trimmed to the
        plan's ``seconds`` before ``now`` and its ``max_readings``; the empty history when
        the plan keeps nothing. A reading older than the newest kept is ignored."""
        if not plan.keeps_any():
            return EMPTY_HISTORY
        store, start, stop = self._store, self._start, self._stop
        if store is not None and stop > start and taken_at < store.times[stop - 1]:
            return self
        if (
            store is None
            or stop != len(store.times)
            or store.columns.keys() != plan.metrics
            or (start >= _COMPACT_AFTER and start > stop - start)
        ):
            store, start, stop = self._copy(plan.metrics), 0, len(self)
        for metric, column in store.columns.items():
            column.append(values.get(metric, _NAN), taken_at, store.times, store.limits)
        store.times.append(taken_at)
        store.limits.append(stale_limit)
        stop += 1
        start = bisect_right(store.times, now - plan.seconds, start, stop - 1)
        capped = self._capped
        if stop - start > plan.max_readings:
            start, capped = stop - plan.max_readings, True
        return History(store, start, stop, capped=capped)

    def _copy(self, metrics: frozenset[MetricType]) -> _Store:
        """New columns holding this view's rows: copied for kept metrics, none for new ones."""
        old, start, stop = self._store, self._start, self._stop
        if old is None:
            return _Store(array("d"), array("d"), {m: _Column.empty(0) for m in metrics})
        columns = {
            m: old.columns[m].copy(start, stop) if m in old.columns else _Column.empty(stop - start)
            for m in metrics
        }
        return _Store(old.times[start:stop], old.limits[start:stop], columns)

    def span(self, metric: MetricType, after: float, upto: float) -> Span:
        """The rows of ``metric`` taken in ``(after, upto]``."""
        store = self._store
        if store is None:
            return _EMPTY_SPAN
        times = store.times
        lo = bisect_right(times, after, self._start, self._stop)
        hi = bisect_right(times, upto, lo, self._stop)
        oldest = times[lo] if lo < hi else None
        after_upto = times[hi] if hi < self._stop else None
        column = store.columns.get(metric)
        if column is None:
            return Span(hi - lo, oldest, after_upto, None, None, None, None, self._capped)
        earlier = _newest_before(column, times, self._start, lo)
        first = hi if lo == hi else bisect_right(column.present, _count_before(column, lo), lo, hi)
        if first == hi:  # no value in the window
            return Span(hi - lo, oldest, after_upto, None, None, earlier, None, self._capped)
        last = bisect_left(column.present, column.present[hi - 1], first, hi)
        before = 0.0 if first == 0 else column.sums[first - 1]
        return Span(
            rows=hi - lo,
            oldest_at=oldest,
            next_at=after_upto,
            first=(times[first], store.limits[first]),
            last=(times[last], store.limits[last]),
            earlier_at=earlier,
            worst_gap=_worst_gap(column, store, first, last),
            capped=self._capped,
            count=column.present[last] - _count_before(column, first),
            total=column.sums[last] - before,
            _column=column,
            _rows=(first, last + 1),
        )


EMPTY_HISTORY = History(None, 0, 0, capped=False)
_EMPTY_SPAN = Span(0, None, None, None, None, None, None, False)


def _count_before(column: _Column, index: int) -> int:
    """The running count just before row ``index`` (in the column's own offset)."""
    return column.present[index] - (not math.isnan(column.values[index]))


def _last_value(column: _Column, start: int, stop: int) -> int:
    """Index of the newest row with a value in ``[start, stop)``, -1 if none."""
    if stop <= start:
        return -1
    if column.present[stop - 1] == _count_before(column, start):
        return -1
    return bisect_left(column.present, column.present[stop - 1], start, stop)


def _newest_before(column: _Column, times: array[float], start: int, stop: int) -> float | None:
    index = _last_value(column, start, stop)
    return None if index < 0 else times[index]


def _worst_gap(
    column: _Column, store: _Store, first: int, last: int
) -> tuple[float, float, float] | None:
    """The stale stretch with the largest overrun ending in ``(first, last]``."""
    lo, hi = bisect_right(column.gaps, first), bisect_right(column.gaps, last)
    if lo == hi:
        return None
    worst = max(range(lo, hi), key=column.overruns.__getitem__)  # the first, on a tie
    end = column.gaps[worst]
    begin = _last_value(column, first, end)
    return store.times[begin], store.times[end], store.limits[begin]
