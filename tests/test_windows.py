"""Rolling windows (``windowSeconds``, ``windowAggregation``): pure measurements on folded
snapshots, the history's sharing and bounds, and the pipeline in virtual time."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec
import pytest
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from hypothesis import given, settings
from hypothesis import strategies as st
from trio.testing import MockClock

from keda_gpu_scaler.app.scaler.compose import open_pipeline
from keda_gpu_scaler.domain.catalog import MetricType
from keda_gpu_scaler.domain.decision import TriggerKey, decide, measure
from keda_gpu_scaler.domain.engines import EngineKind, EngineSample, VllmReading
from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData
from keda_gpu_scaler.domain.history import (
    EMPTY_HISTORY,
    MAX_HISTORY_READINGS,
    NO_HISTORY,
    History,
    HistoryPlan,
)
from keda_gpu_scaler.domain.samples import (
    DeviceKey,
    GpuReading,
    Sample,
    SourceFault,
    SourceStopped,
)
from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT, Snapshot
from keda_gpu_scaler.domain.trigger import TriggerSpec, parse_trigger
from keda_gpu_scaler.domain.windows import MAX_WINDOW_S, WindowAggregation
from keda_gpu_scaler.pipeline.hub import HistoryDemand, SnapshotHub
from keda_gpu_scaler.pipeline.state import fold
from keda_gpu_scaler.serving._proto.externalscaler import GetMetricsRequest, ScaledObjectRef
from keda_gpu_scaler.serving.decider import Decider
from keda_gpu_scaler.sources.cadence import every
from keda_gpu_scaler.sources.fake import FakeGpuSource
from keda_gpu_scaler.testing import CountingMeasure, open_test_pipeline, open_test_service

UTIL = MetricType.GPU_UTILIZATION
SM = MetricType.SM_ACTIVE
QUEUE = MetricType.VLLM_QUEUE_DEPTH
PLAN = HistoryPlan(seconds=60, metrics=frozenset({UTIL, SM}))
GPU0 = DeviceKey("GPU-0")


def _reading(t: float, index: int = 0, **fields: Any) -> GpuReading:
    base = GpuReading(
        source="t",
        key=DeviceKey(f"GPU-{index}"),
        index=index,
        uuid=f"GPU-{index}",
        name="test",
        taken_at=t,
        period_s=1.0,
    )
    return msgspec.structs.replace(base, **fields)


def _fold_each(
    cycles: Iterable[tuple[float, list[Sample]]],
    plan: HistoryPlan = PLAN,
    snapshot: Snapshot = EMPTY_SNAPSHOT,
) -> Snapshot:
    for t, samples in cycles:
        snapshot = fold(snapshot, samples, t, plan=plan)
    return snapshot


def _utilization(values: Mapping[float, float | None], **extra: Any) -> Snapshot:
    """One GPU read once a second at the given times, with these utilizations."""
    return _fold_each((t, [_reading(t, gpu_utilization=v, **extra)]) for t, v in values.items())


def _spec(window_s: int, how: str = "avg", **metadata: str) -> TriggerSpec:
    return parse_trigger(
        {"windowSeconds": str(window_s), "windowAggregation": how, "cooldownSeconds": "0"}
        | metadata
    )


BURST = {float(t): (100.0 if 30 <= t < 40 else 0.0) for t in range(70)}
"""0 % for a minute, but 100 % from t=30 to t=39: a 10 s burst."""


# -- values ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("how", "expected"),
    [("avg", 100 * 10 / 60), ("max", 100.0), ("min", 0.0), ("p95", 100.0), ("last", 0.0)],
)
def test_a_burst_shorter_than_the_window_by_each_window_aggregation(
    how: str, expected: float
) -> None:
    snapshot = _utilization(BURST)
    measured = measure(_spec(60, how), snapshot, 69.5)  # the window (9.5, 69.5]: 60 readings
    assert measured.value == pytest.approx(expected)
    assert measured.readings == (60,)
    assert measure(parse_trigger({}), snapshot, 69.5).value == 0.0  # no window: the newest


def test_p95_of_a_window_is_its_nearest_rank() -> None:
    # The 57th of 60 readings (ceil(0.95 * 60)): 4 busy readings reach it, 3 do not.
    for busy, expected in ((4, 100.0), (3, 0.0)):
        snapshot = _utilization({float(t): 100.0 if t < busy else 0.0 for t in range(60)})
        assert measure(_spec(60, "p95"), snapshot, 59.5).value == expected


def test_each_gpu_is_windowed_before_the_aggregation_across_gpus() -> None:
    def cycle(t: float) -> list[Sample]:
        return [
            _reading(t, 0, gpu_utilization=100.0 if t == 5 else 0.0),
            _reading(t, 1, gpu_utilization=40.0),
        ]

    snapshot = _fold_each((float(t), cycle(float(t))) for t in range(10))
    spec = _spec(10, "max", aggregation="avg")
    assert measure(spec, snapshot, 9.5).value == 70.0  # avg of (max 100, max 40)
    spec = _spec(10, "avg", aggregation="max")
    assert measure(spec, snapshot, 9.5).value == 40.0  # max of (avg 10, avg 40)
    decision = decide(spec, snapshot, None, 9.5)
    assert decision.explanation.startswith(
        "gpu_utilization max of [GPU 0=avg 10 over 10 s (10 readings), "
        "GPU 1=avg 40 over 10 s (10 readings)] = 40; "
    )


# -- coverage ----------------------------------------------------------------------------


def test_a_window_longer_than_the_history_so_far_is_unavailable_until_it_fills() -> None:
    snapshot = _utilization({float(t): 50.0 for t in range(58)})
    with pytest.raises(NoData) as raised:
        measure(_spec(60), snapshot, 20.5)
    assert str(raised.value) == (
        "GPU 0: gpu_utilization history covers only 20.5 s of the 60 s window "
        "(kept since a trigger first asked for it; it fills as readings arrive)"
    )
    # Covered once the oldest reading is within one stale limit (3 s) of the window's start.
    with pytest.raises(NoData, match=r"covers only 56\.9 s"):
        measure(_spec(60), snapshot, 56.9)
    assert measure(_spec(60), snapshot, 57.0).readings == (58,)


def test_no_history_at_all_says_so() -> None:
    snapshot = _fold_each([(0.0, [_reading(0.0, gpu_utilization=5.0)])], plan=NO_HISTORY)
    assert len(snapshot.devices[GPU0].history) == 0
    with pytest.raises(NoData, match="history covers 0 s of the 30 s window yet"):
        measure(_spec(30), snapshot, 0.5)


def test_a_stale_stretch_inside_the_window_is_unavailable_until_it_leaves() -> None:
    # Read every second, except nothing from t=30 to t=36: longer than the 3 s stale limit.
    times = [t for t in range(61) if not 30 < t < 36]
    snapshot = _utilization({float(t): 10.0 for t in times})
    with pytest.raises(NoData) as raised:
        measure(_spec(20), snapshot, 40.0)
    assert str(raised.value) == (
        "GPU 0: no gpu_utilization reading for 6.0 s inside the 20 s window "
        "(from 10.0 to 4.0 s ago; limit 3 s: 3 sample periods, 1 s at least)"
    )
    with pytest.raises(NoData, match=r"for 6\.0 s inside"):  # t=30 has left, t=36 is still late
        measure(_spec(20), snapshot, 52.9)
    assert measure(_spec(20), snapshot, 53.0).value == 10.0


def test_a_stretch_no_longer_than_the_stale_limit_is_bridged() -> None:
    times = [t for t in range(41) if not 30 < t < 33]  # 30, then 33: 3 s, the limit
    snapshot = _utilization({float(t): 10.0 for t in times})
    assert measure(_spec(20), snapshot, 40.0).readings == (18,)


def test_readings_without_the_metric_are_holes_not_zeros() -> None:
    def sm(t: int) -> float | None:
        if 20 <= t < 22:
            return None  # two periods without a value: bridged, not counted
        if 40 <= t < 45:
            return None  # five: a stale stretch
        return 50.0

    snapshot = _fold_each((float(t), [_reading(float(t), sm_active=sm(t))]) for t in range(60))
    spec = _spec(30, metricType="sm_active")
    measured = measure(spec, snapshot, 35.0)
    assert (measured.value, measured.readings) == (50.0, (28,))
    with pytest.raises(NoData, match=r"no sm_active reading for 6.0 s inside the 30 s window"):
        measure(spec, snapshot, 59.0)


def test_a_newest_reading_without_the_metric_is_unsupported_as_without_a_window() -> None:
    snapshot = _fold_each(
        (float(t), [_reading(float(t), sm_active=None if t == 9 else 5.0)]) for t in range(10)
    )
    for spec in (_spec(5, metricType="sm_active"), parse_trigger({"metricType": "sm_active"})):
        with pytest.raises(NoData, match="sm_active is not supported on GPU 0"):
            measure(spec, snapshot, 9.5)


def test_a_window_shorter_than_the_sample_period_holds_no_reading() -> None:
    snapshot = _fold_each(
        (t, [msgspec.structs.replace(_reading(t, gpu_utilization=1.0), period_s=5.0)])
        for t in (0.0, 5.0, 10.0)
    )
    with pytest.raises(NoData, match=r"no gpu_utilization reading in the last 2 s \(the newest"):
        measure(_spec(2), snapshot, 12.5)


def test_lost_and_stale_devices_stay_unavailable() -> None:
    snapshot = _utilization({float(t): 10.0 for t in range(40)})
    with pytest.raises(NoData, match="stale"):
        measure(_spec(30), snapshot, 43.5)
    lost = fold(
        snapshot,
        [SourceFault(source="t", key=GPU0, at=40.0, reason="fell off the bus", lost=True)],
        40.0,
        plan=PLAN,
    )
    with pytest.raises(NoData, match="is lost: fell off the bus"):
        measure(_spec(30), lost, 40.0)


def test_the_measurement_holds_until_the_oldest_reading_leaves_the_window() -> None:
    snapshot = _utilization({float(t): float(t) for t in range(11)})
    measured = measure(_spec(5), snapshot, 10.0)  # (5, 10]: 6..10
    assert measured.value == 8.0
    assert measured.fresh_until == math.nextafter(11.0, -math.inf)
    assert measure(_spec(5), snapshot, 11.0).value == 8.5  # 6 has left: 7..10
    assert measure(_spec(5), snapshot, 10.9).fresh_until == math.nextafter(11.0, -math.inf)


# -- the history -------------------------------------------------------------------------


def test_no_window_keeps_no_history() -> None:
    snapshot = _fold_each(
        ((float(t), [_reading(float(t), gpu_utilization=1.0)]) for t in range(100)),
        plan=NO_HISTORY,
    )
    assert snapshot.devices[GPU0].history is EMPTY_HISTORY


def test_the_history_keeps_the_planned_seconds_and_the_planned_metrics_only() -> None:
    plan = HistoryPlan(seconds=10, metrics=frozenset({UTIL}))
    snapshot = _fold_each(
        (
            (float(t), [_reading(float(t), gpu_utilization=float(t), sm_active=1.0)])
            for t in range(30)
        ),
        plan=plan,
    )
    history = snapshot.devices[GPU0].history
    assert history.times() == tuple(float(t) for t in range(20, 30))  # (19, 29]
    assert history.values(UTIL) == tuple(float(t) for t in range(20, 30))
    assert history.metrics == {UTIL}
    assert history.values(SM) == (None,) * 10


def test_a_metric_asked_for_later_fills_from_then_on() -> None:
    early = HistoryPlan(seconds=10, metrics=frozenset({UTIL}))
    snapshot = _fold_each(
        ((float(t), [_reading(float(t), gpu_utilization=1.0, sm_active=2.0)]) for t in range(5)),
        plan=early,
    )
    snapshot = _fold_each(
        ((float(t), [_reading(float(t), gpu_utilization=1.0, sm_active=2.0)]) for t in (5, 6)),
        plan=HistoryPlan(seconds=10, metrics=frozenset({UTIL, SM})),
        snapshot=snapshot,
    )
    history = snapshot.devices[GPU0].history
    assert history.values(UTIL) == (1.0,) * 7
    assert history.values(SM) == (None,) * 5 + (2.0, 2.0)
    with pytest.raises(NoData, match=r"sm_active history covers only 1\.5 s of the 5 s window"):
        measure(_spec(5, metricType="sm_active"), snapshot, 6.5)


def test_a_capped_history_says_so() -> None:
    plan = HistoryPlan(seconds=60, metrics=frozenset({UTIL}), max_readings=10)
    snapshot = _fold_each(
        ((float(t), [_reading(float(t), gpu_utilization=1.0)]) for t in range(100)), plan=plan
    )
    assert len(snapshot.devices[GPU0].history) == 10
    with pytest.raises(NoData) as raised:
        measure(_spec(60), snapshot, 99.0)
    assert str(raised.value) == (
        "GPU 0: gpu_utilization history covers only 9.0 s of the 60 s window (the history "
        "keeps 10 readings at most: shorten the window or sample less often)"
    )
    assert measure(_spec(10), snapshot, 99.0).readings == (10,)


def test_the_real_cap_bounds_a_long_window_at_ten_hertz() -> None:
    plan = HistoryPlan(seconds=MAX_WINDOW_S, metrics=frozenset({UTIL}))
    history = EMPTY_HISTORY
    for n in range(MAX_HISTORY_READINGS + 500):
        history = history.extended(n / 10, 1.0, {UTIL: 1.0}, plan, now=n / 10)
    assert len(history) == MAX_HISTORY_READINGS
    assert history.times()[0] == 500 / 10


def test_windows_stay_right_after_dropped_readings_are_let_go() -> None:
    # 100 minutes at 1 Hz under a 60 s plan: the columns are rebuilt every 256 readings or so.
    values = {float(t): float(t % 97) for t in range(6_000)}
    snapshot = _utilization(values)
    assert len(snapshot.devices[GPU0].history) == 60
    last_minute = [values[float(t)] for t in range(5_940, 6_000)]  # (5939.5, 5999.5]
    for how, expected in (
        ("avg", math.fsum(last_minute) / 60),
        ("max", max(last_minute)),
        ("min", min(last_minute)),
    ):
        assert measure(_spec(60, how), snapshot, 5_999.5).value == pytest.approx(expected)


def test_two_folds_from_one_snapshot_never_see_each_others_readings() -> None:
    base = _utilization({float(t): 1.0 for t in range(10)})
    left = fold(base, [_reading(10.0, gpu_utilization=2.0)], 10.0, plan=PLAN)
    right = fold(base, [_reading(10.0, gpu_utilization=3.0)], 10.0, plan=PLAN)
    left = fold(left, [_reading(11.0, gpu_utilization=4.0)], 11.0, plan=PLAN)
    assert base.devices[GPU0].history.values(UTIL) == (1.0,) * 10
    assert left.devices[GPU0].history.values(UTIL) == (1.0,) * 10 + (2.0, 4.0)
    assert right.devices[GPU0].history.values(UTIL) == (1.0,) * 10 + (3.0,)


def test_an_older_reading_is_not_kept_out_of_order() -> None:
    snapshot = _utilization({5.0: 1.0, 6.0: 2.0})
    snapshot = fold(snapshot, [_reading(4.0, gpu_utilization=9.0)], 7.0, plan=PLAN)
    assert snapshot.devices[GPU0].history.times() == (5.0, 6.0)


@dataclass(frozen=True)
class _Row:
    t: float
    limit: float
    value: float | None


def _model_extend(rows: tuple[_Row, ...], row: _Row, plan: HistoryPlan) -> tuple[_Row, ...]:
    if rows and row.t < rows[-1].t:
        return rows
    kept = (*(r for r in rows if r.t > row.t - plan.seconds), row)
    return kept[-plan.max_readings :]


_steps = st.tuples(
    st.sampled_from([0.0, 0.5, 1.0, 1.0, 1.0, 2.5, 4.0, -1.0]),
    st.one_of(st.none(), st.floats(0, 100, allow_nan=False)),
    st.sampled_from([1.0, 3.0]),
    st.integers(0, 3),  # extend the newest view, or one this many steps older
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_steps, min_size=1, max_size=60),
    st.sampled_from([3.0, 8.0, 1000.0]),
    st.sampled_from([4, 300]),
    st.lists(st.tuples(st.floats(-5, 150), st.floats(0.1, 40)), min_size=1, max_size=4),
)
def test_every_view_answers_as_a_plain_list_of_its_rows_would(
    steps: list[tuple[float, float | None, float, int]],
    seconds: float,
    max_readings: int,
    windows: list[tuple[float, float]],
) -> None:
    plan = HistoryPlan(seconds=seconds, metrics=frozenset({UTIL}), max_readings=max_readings)
    views: list[tuple[History, tuple[_Row, ...]]] = [(EMPTY_HISTORY, ())]
    t = 0.0
    for dt, value, limit, back in steps:
        t += dt
        history, rows = views[max(0, len(views) - 1 - back)]
        row = _Row(t, limit, value)
        extended = history.extended(
            t, limit, {UTIL: math.nan if value is None else value}, plan, now=t
        )
        views.append((extended, _model_extend(rows, row, plan)))
    for history, rows in views:  # every view, after everything was appended
        assert history.times() == tuple(r.t for r in rows)
        for upto, width in windows:
            _check_span(history, rows, upto - width, upto)


def _check_span(history: History, rows: tuple[_Row, ...], after: float, upto: float) -> None:
    span = history.span(UTIL, after, upto)
    inside = [r for r in rows if after < r.t <= upto]
    present = [r for r in inside if r.value is not None]
    assert span.rows == len(inside)
    assert list(span.values()) == [r.value for r in present]
    assert span.count == len(present)
    assert span.total == pytest.approx(math.fsum(r.value or 0.0 for r in present), abs=1e-9)
    assert span.first == (None if not present else (present[0].t, present[0].limit))
    assert span.last == (None if not present else (present[-1].t, present[-1].limit))
    before = [r for r in rows if r.t <= after and r.value is not None]
    assert span.earlier_at == (before[-1].t if before else None)
    gaps = [(q.t - p.t - p.limit, (p.t, q.t, p.limit)) for p, q in itertools.pairwise(present)]
    worst = max((g for g, _ in gaps), default=0.0)
    expected = next((where for g, where in gaps if g == worst), None) if worst > 0 else None
    assert span.worst_gap == expected


# -- engines -----------------------------------------------------------------------------

VLLM = "vllm:static:http://vllm:8000/metrics"
VLLM_TRIGGER = {"metricType": "vllm_queue_depth", "vllmEndpoint": "http://vllm:8000/metrics"}


def _scrape(t: float, queue: float | None, *, failed: bool = False) -> EngineSample:
    reading = None if failed else VllmReading(taken_at=t, queue_depth=queue)
    return EngineSample(
        source=VLLM,
        kind=EngineKind.VLLM,
        endpoint="http://vllm:8000/metrics",
        taken_at=t,
        period_s=5.0,
        reading=reading,
        error="connection refused" if failed else None,
    )


def test_engine_windows_run_over_the_scrapes() -> None:
    plan = HistoryPlan(seconds=60, metrics=frozenset({QUEUE}))
    queues = {float(t): float(t // 5) for t in range(0, 65, 5)}  # 0, 1, ..., 12
    snapshot = _fold_each(((t, [_scrape(t, q)]) for t, q in queues.items()), plan=plan)
    assert snapshot.devices == {}
    spec = parse_trigger({**VLLM_TRIGGER, "windowSeconds": "60", "windowAggregation": "max"})
    measured = measure(spec, snapshot, 61.0)
    assert (measured.value, measured.readings) == (12.0, (12,))  # (1, 61]: 5..60
    assert measure(parse_trigger(VLLM_TRIGGER | {"windowSeconds": "30"}), snapshot, 61.0).value == (
        sum(range(7, 13)) / 6
    )
    decision = decide(spec, snapshot, None, 61.0)
    assert "[http://vllm:8000/metrics=max 12 over 60 s (12 readings)] = 12" in decision.explanation


def test_failed_scrapes_inside_an_engine_window_are_holes() -> None:
    plan = HistoryPlan(seconds=60, metrics=frozenset({QUEUE}))
    spec = parse_trigger({**VLLM_TRIGGER, "windowSeconds": "60"})
    one_failed = [_scrape(float(t), 4.0, failed=t == 30) for t in range(0, 65, 5)]
    snapshot = _fold_each(((s.taken_at, [s]) for s in one_failed), plan=plan)
    assert measure(spec, snapshot, 61.0).readings == (11,)  # 10 s without: bridged (15 s)
    three_failed = [_scrape(float(t), 4.0, failed=20 <= t <= 30) for t in range(0, 65, 5)]
    snapshot = _fold_each(((s.taken_at, [s]) for s in three_failed), plan=plan)
    with pytest.raises(
        NoData, match=r"http://vllm:8000/metrics: no vllm_queue_depth reading for 20.0 s"
    ):
        measure(spec, snapshot, 61.0)


def test_a_stopped_engine_forgets_its_history() -> None:
    plan = HistoryPlan(seconds=60, metrics=frozenset({QUEUE}))
    snapshot = _fold_each([(0.0, [_scrape(0.0, 1.0)])], plan=plan)
    assert len(snapshot.engine_history[VLLM]) == 1
    snapshot = fold(snapshot, [SourceStopped(source=VLLM)], 1.0, plan=plan)
    assert VLLM not in snapshot.engine_history


# -- trigger keys ------------------------------------------------------------------------


def test_window_keys_parse() -> None:
    spec = parse_trigger({"windowSeconds": "120", "windowAggregation": "p95"})
    assert (spec.window_s, spec.window_aggregation) == (120, WindowAggregation.P95)
    assert (parse_trigger({}).window_s, parse_trigger({}).window_aggregation) == (0, "avg")
    assert parse_trigger({"windowSeconds": str(MAX_WINDOW_S)}).window_s == MAX_WINDOW_S
    assert parse_trigger({"windowSecondsFromEnv": "30"}).window_s == 30


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"windowSeconds": "3601"}, 'invalid windowSeconds "3601": must be at most 3600 seconds'),
        ({"windowSeconds": "-1"}, 'invalid windowSeconds "-1": must be 0 (off) or a positive'),
        ({"windowSeconds": "1.5"}, 'invalid windowSeconds "1.5": not an integer'),
        ({"windowSeconds": "1m"}, 'invalid windowSeconds "1m": not an integer'),
        ({"windowAggregation": "sum"}, 'invalid windowAggregation "sum": must be one of avg, max'),
        ({"windowAggregation": ""}, 'invalid windowAggregation "": must be one of'),
    ],
)
def test_bad_window_keys_name_the_key_and_the_value(metadata: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidTrigger) as raised:
        parse_trigger(metadata)
    assert str(raised.value).startswith(message)
    assert raised.value.key == next(iter(metadata))


def test_window_aggregation_without_a_window_is_ignored_with_a_warning() -> None:
    for metadata in (
        {"windowAggregation": "max"},
        {"windowAggregation": "max", "windowSeconds": "0"},
    ):
        spec = parse_trigger(metadata)
        assert spec.warnings == (
            'windowAggregation "max" is ignored without windowSeconds (the newest reading is used)',
        )
        assert spec == msgspec.structs.replace(parse_trigger({}), warnings=spec.warnings)
    assert parse_trigger({"windowSeconds": "30", "windowAggregation": "max"}).warnings == ()


def test_the_demand_grows_to_the_longest_window_and_never_shrinks() -> None:
    demand = HistoryDemand()
    assert not demand.plan.keeps_any()
    demand.require(UTIL, 30)
    demand.require(SM, 10)
    assert (demand.plan.seconds, demand.plan.metrics) == (30.0, frozenset({UTIL, SM}))
    demand.require(UTIL, 5)
    assert demand.plan.seconds == 30
    demand.require(UTIL, 10 * MAX_WINDOW_S)
    assert demand.plan.seconds == MAX_WINDOW_S
    assert demand.plan.max_readings == MAX_HISTORY_READINGS
    with pytest.raises(ValueError, match="max_readings"):
        HistoryDemand(max_readings=0)


def test_the_decider_asks_for_a_window_when_it_first_parses_it() -> None:
    hub = SnapshotHub()
    decider = Decider(hub)
    decider.parse({"windowSeconds": "0"}, "ns", "a")
    assert not hub.history.plan.keeps_any()
    decider.parse({"windowSeconds": "45", "metricType": "power_draw"}, "ns", "a")
    assert hub.history.plan == HistoryPlan(seconds=45, metrics=frozenset({MetricType.POWER_DRAW}))


# -- in virtual time ---------------------------------------------------------------------


def _value_or_error(decider: Decider, hub: SnapshotHub, spec: TriggerSpec) -> float | str:
    try:
        return decider.measurement(spec, hub.current, anyio.current_time()).value
    except NoData as exc:
        return str(exc)


@pytest.mark.trio
async def test_a_burst_in_virtual_time_avg_versus_max(autojump_clock: MockClock) -> None:
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, gpu_utilization=0.0)
    async with open_test_pipeline(source) as pipeline:
        start = anyio.current_time()
        hub = pipeline.hub
        decider = Decider(hub)
        avg = decider.parse({"windowSeconds": "30", "cooldownSeconds": "0"}, "ns", "a")
        peak = decider.parse(
            {"windowSeconds": "30", "windowAggregation": "max", "cooldownSeconds": "0"}, "ns", "b"
        )
        await anyio.sleep_until(start + 10.5)
        assert "s of the 30 s window" in str(_value_or_error(decider, hub, avg))
        await anyio.sleep_until(start + 40.5)  # readings at 0, 1, ..., 40
        source.set(0, gpu_utilization=90.0)
        await anyio.sleep_until(start + 45.5)  # 41..45 busy: a 5 s burst
        source.set(0, gpu_utilization=0.0)
        await anyio.sleep_until(start + 60.5)  # the window (30.5, 60.5]: 31..60
        assert _value_or_error(decider, hub, avg) == pytest.approx(90 * 5 / 30)
        assert _value_or_error(decider, hub, peak) == 90.0
        await anyio.sleep_until(start + 75.5)  # the burst has left the window
        assert _value_or_error(decider, hub, peak) == 0.0


@pytest.mark.trio
async def test_a_paused_source_leaves_a_stale_stretch_until_it_leaves_the_window(
    autojump_clock: MockClock,
) -> None:
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, gpu_utilization=20.0)
    async with open_test_pipeline(source) as pipeline:
        start = anyio.current_time()
        hub = pipeline.hub
        decider = Decider(hub)
        spec = decider.parse({"windowSeconds": "20", "cooldownSeconds": "0"}, "ns", "a")
        await anyio.sleep_until(start + 25.5)
        assert _value_or_error(decider, hub, spec) == 20.0
        source.pause()  # no reading at 26..30
        await anyio.sleep_until(start + 30.5)
        source.resume()
        await anyio.sleep_until(start + 34.5)
        assert "no gpu_utilization reading for 6.0 s inside the 20 s window" in str(
            _value_or_error(decider, hub, spec)
        )
        # 25 leaves at 45; 31, the first after it, is within 3 s of the start from 48 on.
        await anyio.sleep_until(start + 47.5)
        assert isinstance(_value_or_error(decider, hub, spec), str)
        await anyio.sleep_until(start + 48.5)
        assert _value_or_error(decider, hub, spec) == 20.0


@pytest.mark.trio
async def test_a_longer_window_grows_the_history_and_fills(autojump_clock: MockClock) -> None:
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, gpu_utilization=30.0)
    async with open_test_pipeline(source) as pipeline:
        start = anyio.current_time()
        hub = pipeline.hub
        decider = Decider(hub)
        short = decider.parse({"windowSeconds": "10"}, "ns", "a")
        await anyio.sleep_until(start + 100.5)
        assert len(pipeline.hub.current.devices[DeviceKey("GPU-fake-0000")].history) == 10
        assert _value_or_error(decider, hub, short) == 30.0
        long = decider.parse({"windowSeconds": "60"}, "ns", "b")  # raised now: 10 s kept
        await anyio.sleep_until(start + 101.5)
        assert "covers only 10.5 s of the 60 s window" in str(_value_or_error(decider, hub, long))
        await anyio.sleep_until(start + 147.5)  # 91..147: within 3 s of the start at 87.5
        assert isinstance(_value_or_error(decider, hub, long), str)
        await anyio.sleep_until(start + 148.5)
        assert _value_or_error(decider, hub, long) == 30.0
        await anyio.sleep_until(start + 300.5)
        assert len(pipeline.hub.current.devices[DeviceKey("GPU-fake-0000")].history) == 60


@pytest.mark.trio
async def test_the_history_is_bounded_by_its_reading_cap(autojump_clock: MockClock) -> None:
    source = FakeGpuSource(2, period_s=0.5)
    source.set(0, gpu_utilization=30.0)
    source.set(1, gpu_utilization=10.0)
    hub = SnapshotHub(history=HistoryDemand(max_readings=40))
    async with open_pipeline(source, hub=hub):
        start = anyio.current_time()
        decider = Decider(hub)
        spec = decider.parse({"windowSeconds": "60"}, "ns", "a")
        await anyio.sleep_until(start + 120.25)
        assert {len(d.history) for d in hub.current.devices.values()} == {40}
        assert "the history keeps 40 readings at most" in str(_value_or_error(decider, hub, spec))
        fits = decider.parse({"windowSeconds": "15", "windowAggregation": "min"}, "ns", "b")
        assert _value_or_error(decider, hub, fits) == 30.0


class _FakeVllm:
    """Publishes one vLLM scrape per period: the queue depth it is set to (None: failed)."""

    name = VLLM

    def __init__(self, period_s: float = 5.0) -> None:
        self.period_s = period_s
        self.queue: float | None = 0.0

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            task_status.started()
            async for now in every(self.period_s):
                await send.send(_scrape(now, self.queue, failed=self.queue is None))


@pytest.mark.trio
async def test_engine_windows_in_virtual_time(autojump_clock: MockClock) -> None:
    engine = _FakeVllm()
    source = FakeGpuSource(1, period_s=1.0)
    async with open_pipeline(source, samplers=[engine]) as pipeline:
        start = anyio.current_time()
        hub = pipeline.hub
        decider = Decider(hub)
        spec = decider.parse({**VLLM_TRIGGER, "windowSeconds": "60"}, "ns", "a")
        await anyio.sleep_until(start + 60.5)
        engine.queue = 12.0
        await anyio.sleep_until(start + 90.5)  # 65..90 at 12, 35..60 at 0
        assert _value_or_error(decider, hub, spec) == 6.0
        engine.queue = None  # the endpoint fails at 95, 100, 105, 110
        await anyio.sleep_until(start + 112.5)
        assert _value_or_error(decider, hub, spec) == "http://vllm:8000/metrics: connection refused"
        engine.queue = 12.0
        await anyio.sleep_until(start + 116)
        assert "no vllm_queue_depth reading for 25.0 s" in str(_value_or_error(decider, hub, spec))


@pytest.mark.trio
async def test_a_shared_measurement_is_recomputed_when_its_oldest_reading_leaves(
    autojump_clock: MockClock,
) -> None:
    hub = SnapshotHub()
    hub.history.require(UTIL, 5)
    t0 = anyio.current_time()
    for t in range(11):
        reading = _reading(t0 + t, gpu_utilization=float(t))
        hub.publish(fold(hub.current, [reading], t0 + t, plan=hub.history.plan))
    counting = CountingMeasure()
    decider = Decider(hub, measure=counting)
    spec = decider.parse({"windowSeconds": "5", "cooldownSeconds": "0"}, "ns", "a")
    key = TriggerKey("ns", "a", spec)
    await anyio.sleep_until(t0 + 10.0)
    assert decider.decide(key, hub.current, "GetMetrics").value == 8.0  # 6..10
    await anyio.sleep_until(t0 + 10.9)
    assert decider.decide(key, hub.current, "GetMetrics").value == 8.0
    assert len(counting.calls) == 1
    await anyio.sleep_until(t0 + 11.0)  # 6 leaves, no new snapshot
    assert decider.decide(key, hub.current, "GetMetrics").value == 8.5
    assert len(counting.calls) == 2


@pytest.mark.trio
async def test_get_metrics_of_a_window_is_unavailable_until_covered(
    autojump_clock: MockClock,
) -> None:
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, gpu_utilization=64.0)
    metadata = {"windowSeconds": "20", "windowAggregation": "max", "cooldownSeconds": "0"}
    ref = ScaledObjectRef(name="so", namespace="ns", scaler_metadata=metadata)
    async with open_test_service(source) as served:
        start = anyio.current_time()
        await served.service.get_metric_spec(ref)  # KEDA asks this first: the window fills
        request = GetMetricsRequest(scaled_object_ref=ref, metric_name="m")
        await anyio.sleep_until(start + 5.5)
        with pytest.raises(GRPCError) as raised:
            await served.service.get_metrics(request)
        assert raised.value.status is Status.UNAVAILABLE
        assert "covers only" in (raised.value.message or "")
        await anyio.sleep_until(start + 20.5)
        answer = await served.service.get_metrics(request)
        assert answer.metric_values[0].metric_value_float == 64.0
