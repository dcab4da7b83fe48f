"""Rolling windows over each device's readings: ``windowSeconds`` and ``windowAggregation``.

For one device (or one engine endpoint) and one metric, the window holds the readings taken
in ``(now - windowSeconds, now]``; ``windowAggregation`` combines their values (``avg``, the
mean of the readings; ``max``; ``min``; ``p95``, nearest rank; ``last``, the newest), and only
then does the trigger's ``aggregation`` combine the devices.

A window is answered only when it is **covered**, never from part of it: its oldest value was
taken within one stale limit of the window's start (three sample periods, 1 s at least, as
for a single reading), each value follows the one before within that one's stale limit, and
the newest is fresh now. A reading without a value of the metric (unsupported this cycle,
NaN from GPM, a failed scrape) is a hole, not a 0; holes no longer than the stale limit are
bridged, as a single reading is trusted that long. Otherwise the window is :class:`NoData`
(UNAVAILABLE) with the reason: the history does not reach back far enough yet (it is kept
only once a trigger asks for it, and at most ``MAX_HISTORY_READINGS`` readings), or a stale
stretch lies inside the window (it stays unavailable until that stretch has left it).
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from keda_gpu_scaler.domain.aggregation import nearest_rank
from keda_gpu_scaler.domain.catalog import CATALOG, MetricType
from keda_gpu_scaler.domain.engines import EngineKind, EngineSample
from keda_gpu_scaler.domain.errors import NoData
from keda_gpu_scaler.domain.history import (
    EMPTY_HISTORY,
    History,
    HistoryPlan,
    Span,
)
from keda_gpu_scaler.domain.samples import GpuReading
from keda_gpu_scaler.domain.snapshot import STALE_AFTER_PERIODS, stale_limit_s

MAX_WINDOW_S = 3600
"""The longest ``windowSeconds`` a trigger may ask for: the history is bounded."""


_Read = Callable[[GpuReading], float | None]


class WindowAggregation(enum.StrEnum):
    """``windowAggregation``: how one device's readings in the window combine."""

    AVG = "avg"
    MAX = "max"
    MIN = "min"
    P95 = "p95"
    LAST = "last"


@dataclass(frozen=True, slots=True)
class Windowed:
    value: float
    readings: int
    """Values in the window."""
    fresh_until: float
    """The last instant the value holds without a new reading: before the oldest reading
    leaves the window, and while the newest is fresh."""


def window_value(
    history: History,
    metric: MetricType,
    how: WindowAggregation,
    window_s: float,
    now: float,
    *,
    who: str,
) -> Windowed:
    """``metric`` over ``history``'s last ``window_s`` seconds, combined by ``how``.

    Raises :class:`NoData` naming ``who`` (``GPU 0``, an endpoint) when the window is not
    covered."""
    span = history.span(metric, now - window_s, now)
    reason = _uncovered(span, history, metric, window_s, now)
    if reason is not None:
        raise NoData(f"{who}: {reason}")
    assert span.last is not None  # covered
    assert span.oldest_at is not None
    until = min(
        math.nextafter(span.oldest_at + window_s, -math.inf),
        span.last[0] + span.last[1],
        math.inf if span.next_at is None else math.nextafter(span.next_at, -math.inf),
    )
    return Windowed(_combine(how, span), span.count, until)


def _combine(how: WindowAggregation, span: Span) -> float:
    match how:
        case WindowAggregation.AVG:
            return span.total / span.count
        case WindowAggregation.MAX:
            return max(span.values())
        case WindowAggregation.MIN:
            return min(span.values())
        case WindowAggregation.P95:
            return nearest_rank(span.values(), 0.95)
        case WindowAggregation.LAST:
            return span.values()[-1]


def _uncovered(
    span: Span, history: History, metric: MetricType, window_s: float, now: float
) -> str | None:
    if span.first is None or span.last is None:
        if span.earlier_at is None and not span.rows:
            return f"{metric} history covers 0 s of the {window_s:g} s window yet{_why(span)}"
        newest = (
            "" if span.earlier_at is None else f" (the newest is {now - span.earlier_at:.1f} s old)"
        )
        return f"no {metric} reading in the last {window_s:g} s{newest}"
    first_at, first_limit = span.first
    if first_at - (now - window_s) > first_limit:
        if span.earlier_at is None:
            return (
                f"{metric} history covers only {now - first_at:.1f} s of the {window_s:g} s "
                f"window{_why(span, len(history))}"
            )
        return _gap(metric, span.earlier_at, first_at, first_limit, now, window_s)
    if span.worst_gap is not None:
        begin, end, limit = span.worst_gap
        return _gap(metric, begin, end, limit, now, window_s)
    last_at, last_limit = span.last
    if now - last_at > last_limit:
        return _gap(metric, last_at, now, last_limit, now, window_s)
    return None


def _why(span: Span, kept: int = 0) -> str:
    if span.capped:
        return (
            f" (the history keeps {kept} readings at most: shorten the window or sample less often)"
        )
    return " (kept since a trigger first asked for it; it fills as readings arrive)"


def _gap(
    metric: MetricType, begin: float, end: float, limit: float, now: float, window_s: float
) -> str:
    return (
        f"no {metric} reading for {end - begin:.1f} s inside the {window_s:g} s window "
        f"(from {now - begin:.1f} to {now - end:.1f} s ago; limit {limit:g} s: "
        f"{STALE_AFTER_PERIODS} sample periods, 1 s at least)"
    )


# -- what the aggregator keeps ----------------------------------------------------------


def extend_device(history: History, reading: GpuReading, plan: HistoryPlan, now: float) -> History:
    """A device's history with ``reading``: the values of the plan's GPU metrics."""
    if not plan.keeps_any():
        return EMPTY_HISTORY
    gpu_plan, readers = _gpu_readers(plan)
    values: dict[MetricType, float] = {}
    for metric, read in readers:
        value = read(reading)
        values[metric] = math.nan if value is None else value
    limit = stale_limit_s(reading.period_s)
    return history.extended(reading.taken_at, limit, values, gpu_plan, now=now)


def extend_engine(history: History, sample: EngineSample, plan: HistoryPlan, now: float) -> History:
    """An engine's history with ``sample``: the values of the plan's metrics of its kind
    (none for a failed or refused scrape)."""
    if not plan.keeps_any():
        return EMPTY_HISTORY
    kind_plan, fields = _engine_fields(plan, sample.kind)
    values: dict[MetricType, float] = {}
    for metric, name, scale in fields:
        value = None if sample.reading is None else sample.reading.value(name)
        values[metric] = math.nan if value is None else value * scale
    limit = stale_limit_s(sample.period_s)
    return history.extended(sample.taken_at, limit, values, kind_plan, now=now)


@functools.lru_cache(maxsize=32)
def _gpu_readers(plan: HistoryPlan) -> tuple[HistoryPlan, tuple[tuple[MetricType, _Read], ...]]:
    readers = tuple(
        (m, read) for m in sorted(plan.metrics) if (read := CATALOG[m].read) is not None
    )
    return replace(plan, metrics=frozenset(m for m, _ in readers)), readers


@functools.lru_cache(maxsize=32)
def _engine_fields(
    plan: HistoryPlan, kind: EngineKind
) -> tuple[HistoryPlan, tuple[tuple[MetricType, str, float], ...]]:
    fields = tuple(
        (m, info.engine_field, info.scale)
        for m in sorted(plan.metrics)
        if (info := CATALOG[m]).origin.engine is kind and info.engine_field is not None
    )
    return replace(plan, metrics=frozenset(m for m, _, _ in fields)), fields
