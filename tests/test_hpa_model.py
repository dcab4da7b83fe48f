"""The HPA model on hand-computed cases, one per rule of the controller.

Each expected count is worked out by hand in the comment beside it, from the rules of
kubernetes/kubernetes pkg/controller/podautoscaler (replica_calculator.go, horizontal.go).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from keda_gpu_scaler.models.hpa import (
    SCALE_DOWN_DEFAULTS,
    SCALE_UP_DEFAULTS,
    Behavior,
    ExternalMetric,
    HpaSpec,
    HpaState,
    Limit,
    PolicyType,
    Rule,
    RulesSpec,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
    SyncOutcome,
    TargetType,
    Tolerances,
    propose,
    sync,
)

AV, VALUE = TargetType.AVERAGE_VALUE, TargetType.VALUE


def metric(
    usage: float | None, target: float, kind: TargetType = AV, name: str = "s0"
) -> ExternalMetric:
    milli = None if usage is None else round(usage * 1000)
    return ExternalMetric(name, kind, round(target * 1000), milli, "" if milli else "no data")


def pods(value: int, period_s: int = 15) -> ScalingPolicy:
    return ScalingPolicy(PolicyType.PODS, value, period_s)


def percent(value: int, period_s: int = 15) -> ScalingPolicy:
    return ScalingPolicy(PolicyType.PERCENT, value, period_s)


def rules(
    *policies: ScalingPolicy, window: int = 0, select: SelectPolicy = SelectPolicy.MAX
) -> ScalingRules:
    return ScalingRules(window, select, policies)


def run(
    spec: HpaSpec, current: int, ask: Sequence[ExternalMetric], times: Sequence[float]
) -> list[SyncOutcome]:
    """Syncs at ``times`` with the same metrics, the count following each outcome."""
    state, out = HpaState(), []
    for t in times:
        outcome = sync(spec, state, current, ask, t)
        state, current = outcome.state, outcome.replicas
        out.append(outcome)
    return out


EVERY_15_S = [15.0 * i for i in range(30)]


# -- the replica calculation ---------------------------------------------------------------


def test_tolerance_keeps_the_count_within_ten_percent_both_ways() -> None:
    tol = Tolerances()
    # AverageValue: 105 / (10 × 10) = 1.05, within [0.9, 1.1]: 10.
    assert propose(metric(105, 10), 10, tol).replicas == 10
    assert propose(metric(105, 10), 10, tol).held
    # Exactly 1.1 is still within (the bound is inclusive).
    assert propose(metric(110, 10), 10, tol).replicas == 10
    # 111 / 100 = 1.11: ceil(111 / 10) = 12.
    assert propose(metric(111, 10), 10, tol).replicas == 12
    # 89 / 100 = 0.89: ceil(89 / 10) = 9.
    assert propose(metric(89, 10), 10, tol).replicas == 9
    # Value: 95 / 100 = 0.95 within: 3; 60 / 100 = 0.6: ceil(0.6 × 3) = 2.
    assert propose(metric(95, 100, VALUE), 3, tol).replicas == 3
    assert propose(metric(60, 100, VALUE), 3, tol).replicas == 2


def test_value_multiplies_the_ratio_by_the_replicas_average_value_divides_the_total() -> None:
    tol = Tolerances()
    # The same reading 300 against target 100 at 2 replicas:
    # AverageValue: ratio 300 / (100 × 2) = 1.5, desired ceil(300 / 100) = 3 whatever the count.
    assert propose(metric(300, 100, AV), 2, tol).replicas == 3
    assert propose(metric(300, 100, AV), 7, tol).replicas == 3
    # Value: ratio 3.0, desired ceil(3.0 × 2) = 6, growing with the count.
    assert propose(metric(300, 100, VALUE), 2, tol).replicas == 6
    assert propose(metric(300, 100, VALUE), 7, tol).replicas == 21


def test_the_calculation_is_on_milli_units() -> None:
    # 0.0015 rounds to 2 milli; target 0.001 is 1 milli: ceil(2 / 1) = 2 (not 1.5 → 2 by luck).
    m = ExternalMetric("s0", AV, 1, 2)
    assert propose(m, 1, Tolerances()).replicas == 2


def test_behavior_tolerances_apply_per_direction() -> None:
    up_5 = Behavior.given(RulesSpec(tolerance=0.05), None)
    spec = HpaSpec(1, 100, up_5)
    assert spec.tolerances == Tolerances(down=0.1, up=0.05)
    # 108 / 100 = 1.08 is above 1.05: ceil(108 / 10) = 11; below, 0.92 is within 0.9.
    assert propose(metric(108, 10), 10, spec.tolerances).replicas == 11
    assert propose(metric(92, 10), 10, spec.tolerances).replicas == 10


# -- min, max, and what bypasses the metrics ------------------------------------------------


def test_zero_replicas_disables_scaling() -> None:
    outcome = sync(HpaSpec(1, 10), HpaState(), 0, [metric(500, 10)], 0.0)
    assert (outcome.rule, outcome.replicas, outcome.desired) == (Rule.DISABLED, 0, 0)
    # The first sync still records the current count as a recommendation.
    assert outcome.state.recommendations == ((0.0, 0),)


def test_a_count_out_of_range_goes_to_the_bound_at_once() -> None:
    above = sync(HpaSpec(1, 4), HpaState(), 9, [metric(500, 10)], 0.0)
    assert (above.rule, above.replicas) == (Rule.ABOVE_MAX, 4)
    below = sync(HpaSpec(3, 10), HpaState(), 1, [metric(0, 10)], 0.0)
    assert (below.rule, below.replicas) == (Rule.BELOW_MIN, 3)


def test_max_replicas_caps_the_recommendation() -> None:
    # 500 / 10 → 50 wanted at 5 replicas; the older limit max(2 × 5, 4) = 10 is above max 8.
    (outcome,) = run(HpaSpec(1, 8), 5, [metric(500, 10)], [0.0])
    assert (outcome.desired, outcome.replicas, outcome.limit) == (50, 8, Limit.TOO_MANY)


def test_min_replicas_floors_the_recommendation_once_the_window_passed() -> None:
    old = HpaState(recommendations=((0.0, 5),))
    # At t=400 the recommendation of t=0 is outside the 300 s window: 0 wanted, min 2.
    outcome = sync(HpaSpec(2, 10), old, 5, [metric(0, 10)], 400.0)
    assert (outcome.desired, outcome.stabilized, outcome.replicas) == (0, 0, 2)
    assert outcome.limit is Limit.TOO_FEW


# -- without behavior: KEDA's default --------------------------------------------------------


@pytest.mark.parametrize(("current", "expected"), [(1, 4), (2, 4), (3, 6), (5, 10)])
def test_the_older_rule_limits_scale_up_to_max_of_twice_and_four(
    current: int, expected: int
) -> None:
    # 1000 / 10 asks for 100; max(2 × current, 4) is the most one sync may go to.
    (outcome,) = run(HpaSpec(1, 100), current, [metric(1000, 10)], [0.0])
    assert (outcome.desired, outcome.replicas) == (100, expected)
    assert outcome.limit is Limit.SCALE_UP_LIMIT


def test_the_older_rule_grows_by_that_limit_every_sync() -> None:
    steps = run(HpaSpec(1, 100), 1, [metric(1000, 10)], EVERY_15_S[:5])
    # 1 → 4 → 8 → 16 → 32 → 64.
    assert [s.replicas for s in steps] == [4, 8, 16, 32, 64]


def test_the_older_rule_holds_the_highest_recommendation_of_300_s() -> None:
    # 6 replicas, the metric now asks for 2 (20 / 10). The first sync records 6 at t=0 as the
    # initial recommendation: the highest of the window stays 6 through t=285 and drops out at
    # t=300, which is a little more than 300 s later in a cluster (see the next test).
    steps = run(HpaSpec(1, 10), 6, [metric(20, 10)], EVERY_15_S[:23])
    by_time = {s_t: s.replicas for s_t, s in zip(EVERY_15_S, steps, strict=False)}
    assert by_time[285.0] == 6
    assert by_time[300.0] == 2
    assert steps[0].stabilized == 6
    assert steps[0].desired == 2
    # There is no rate limit on the way down: 6 → 2 in one sync.
    assert [s.replicas for s in steps] == [6] * 20 + [2] * 3


def test_a_record_exactly_one_window_or_period_old_is_out_of_it() -> None:
    """kubernetes v1.37.2 pkg/controller/podautoscaler/horizontal.go: processNextWorkItem
    queues an HPA again 15 s after its sync finished (AddRateLimited, and so do the status
    update and the informer's resync it causes), so its syncs are a little more than 15 s
    apart, and a record made n syncs ago is a little older than n × 15 s:
    getReplicasChangePerPeriod (``rec.timestamp.Add(period).After(now)``) and
    stabilizeRecommendation(WithBehaviors) (``After(cutoff)``) leave it out. On the simulated
    grid the two instants are equal, and as sums of floats (a grid started at 2.26 s) either
    one may come out ahead: the end-to-end suite found a ``Pods: 1 per 15 s`` policy held at 7
    for one sync where the real controller went to 8."""
    spec = HpaSpec(1, 8, Behavior(scale_up=ScalingRules(0, SelectPolicy.MAX, (pods(1),))))
    times = [round(2.26 + 15 * k, 6) for k in range(10)]
    # Saturated replicas ask for double; the policy lets one more through each sync.
    steps = run(spec, 1, [metric(100, 50, VALUE)], times)
    assert [s.replicas for s in steps] == [2, 3, 4, 5, 6, 7, 8, 8, 8, 8]


# -- with behavior ---------------------------------------------------------------------------


def test_behavior_defaults_fill_what_is_not_given() -> None:
    given = Behavior.given(None, RulesSpec(stabilization_s=60))
    assert given.scale_up == SCALE_UP_DEFAULTS
    assert given.scale_up == ScalingRules(0, SelectPolicy.MAX, (pods(4), percent(100)))
    assert given.scale_down == ScalingRules(60, SelectPolicy.MAX, (percent(100),))
    assert Behavior.given(None, None).scale_down == SCALE_DOWN_DEFAULTS
    assert SCALE_DOWN_DEFAULTS.stabilization_s == 300


def test_default_behavior_scales_up_by_max_of_four_pods_and_doubling_per_15_s() -> None:
    spec = HpaSpec(1, 100, Behavior())
    # From 1: max(1 + 4, 2) = 5; from 5: max(9, 10) = 10; from 10: max(14, 20) = 20.
    steps = run(spec, 1, [metric(1000, 10)], EVERY_15_S[:3])
    assert [s.replicas for s in steps] == [5, 10, 20]


def test_the_scale_up_window_takes_the_lowest_recommendation() -> None:
    spec = HpaSpec(1, 100, Behavior.given(RulesSpec(stabilization_s=60), None))
    # At 2 replicas the metric asks for 6. The initial recommendation (t=0: 2) is in the
    # window (t > now - 60) until t=60, where only the 6s of t=15..45 remain: 2 → 6.
    steps = run(spec, 2, [metric(60, 10)], EVERY_15_S[:6])
    assert [s.replicas for s in steps] == [2, 2, 2, 2, 6, 6]
    assert steps[0].stabilized == 2
    assert steps[0].explain(spec).startswith("s0 60 / (10 × 2) = 3.00: ceil(60 / 10) = 6")
    assert "the 60 s scale-up window holds 2 (the lowest recommendation)" in steps[0].explain(spec)


def test_the_scale_down_window_takes_the_highest_recommendation() -> None:
    spec = HpaSpec(1, 100, Behavior.given(None, RulesSpec(stabilization_s=30)))
    # At 6 replicas the metric asks for 2; the 6 of t=0 counts while t > now - 30: until
    # t=15. At t=30 the default scale-down policy (100 % per 15 s) lets 6 → 2.
    steps = run(spec, 6, [metric(20, 10)], EVERY_15_S[:4])
    assert [s.replicas for s in steps] == [6, 6, 2, 2]


def test_a_pods_policy_counts_the_changes_of_its_period() -> None:
    spec = HpaSpec(1, 100, Behavior.given(RulesSpec(policies=(pods(2, 60),)), None))
    # From 1 toward 10: +2 at t=0 (1 → 3); the +2 counts for the next 60 s (an event exactly
    # 60 s old no longer does), so the period starts at 1 until t=60: 3 + 2 = 5 at t=60.
    steps = run(spec, 1, [metric(100, 10)], EVERY_15_S[:9])
    assert [s.replicas for s in steps] == [3, 3, 3, 3, 5, 5, 5, 5, 7]
    assert steps[1].limit is Limit.SCALE_UP_LIMIT
    assert steps[0].state.scale_ups == ((0.0, 2),)


def test_a_percent_policy_scales_down_by_its_share_of_the_period_start() -> None:
    down = RulesSpec(stabilization_s=0, policies=(percent(50, 30),))
    spec = HpaSpec(1, 100, Behavior.given(None, down))
    # From 8 toward 1: int(8 × 0.5) = 4 at t=0; at t=15 the period started at 4 + 4 = 8: still
    # 4; at t=30: int(4 × 0.5) = 2; at t=45 still 2; at t=60: int(2 × 0.5) = 1.
    steps = run(spec, 8, [metric(1, 10)], EVERY_15_S[:5])
    assert [s.replicas for s in steps] == [4, 4, 2, 2, 1]
    assert steps[0].limit is Limit.SCALE_DOWN_LIMIT
    # From 5 the allowed count is truncated: int(5 × 0.5) = 2, not 3.
    (odd,) = run(spec, 5, [metric(1, 10)], [0.0])
    assert odd.replicas == 2


def test_a_percent_policy_rounds_scale_up_up() -> None:
    spec = HpaSpec(1, 100, Behavior.given(RulesSpec(policies=(percent(50),)), None))
    # From 3: ceil(3 × 1.5) = 5 (4.5 rounded up, or a small deployment could not grow).
    (outcome,) = run(spec, 3, [metric(1000, 10)], [0.0])
    assert outcome.replicas == 5


@pytest.mark.parametrize(
    ("select", "up", "down"),
    [
        # Up from 4 with [+1 pod, +100 %]: Max max(5, 8) = 8, Min min(5, 8) = 5.
        # Down from 8 with [-1 pod, -50 %]: Max min(7, 4) = 4, Min max(7, 4) = 7.
        (SelectPolicy.MAX, 8, 4),
        (SelectPolicy.MIN, 5, 7),
        # Disabled: no change in that direction.
        (SelectPolicy.DISABLED, 4, 8),
    ],
)
def test_select_policy_picks_the_largest_or_smallest_change_or_none(
    select: SelectPolicy, up: int, down: int
) -> None:
    policies = (pods(1), percent(100))
    scale_up = RulesSpec(select=select, policies=policies)
    scale_down = RulesSpec(stabilization_s=0, select=select, policies=(pods(1), percent(50)))
    spec = HpaSpec(1, 100, Behavior.given(scale_up, scale_down))
    (grow,) = run(spec, 4, [metric(200, 10)], [0.0])
    assert grow.replicas == up
    (shrink,) = run(spec, 8, [metric(1, 10)], [0.0])
    assert shrink.replicas == down


def test_scale_down_events_lower_the_scale_up_period_start() -> None:
    up = RulesSpec(policies=(pods(1, 60),))
    spec = HpaSpec(1, 100, Behavior.given(up, RulesSpec(stabilization_s=0)))
    # A scale-down of 3 at t=0 (5 → 2), then a scale-up: the period started at 2 + 3 = 5,
    # so 5 + 1 = 6 is allowed at once, not 2 + 1.
    state = sync(spec, HpaState(), 5, [metric(20, 10)], 0.0).state
    outcome = sync(spec, state, 2, [metric(100, 10)], 15.0)
    assert outcome.replicas == 6


# -- several metrics -------------------------------------------------------------------------


def test_the_highest_proposal_wins() -> None:
    ask = [metric(30, 10, name="s0"), metric(250, 50, VALUE, name="s1")]
    # s0: ceil(30 / 10) = 3; s1: 250 / 50 = 5 × 1 → 5; the highest is 5.
    (outcome,) = run(HpaSpec(1, 10), 1, ask, [0.0])
    assert [p.replicas for p in outcome.proposals] == [3, 5]
    assert outcome.desired == 5
    assert outcome.replicas == 4  # the older rule: max(2 × 1, 4)


def test_a_failed_metric_blocks_only_a_scale_down() -> None:
    spec = HpaSpec(1, 10)
    failed = metric(None, 10, name="s1")
    # The other metric asks for more: the HPA scales on it.
    up = sync(spec, HpaState(), 2, [metric(50, 10), failed], 0.0)
    assert (up.rule, up.replicas) == (Rule.METRICS, 4)
    # It asks for fewer: no change, and no recommendation recorded.
    down = sync(spec, HpaState(), 4, [metric(10, 10), failed], 0.0)
    assert (down.rule, down.replicas) == (Rule.METRICS_FAILED, 4)
    assert down.state.recommendations == ((0.0, 4),)
    # Every metric failed: no change.
    none = sync(spec, HpaState(), 3, [failed], 0.0)
    assert (none.rule, none.replicas, none.desired) == (Rule.METRICS_FAILED, 3, 3)
    assert "s1 failed (no data)" in none.explain(spec)


def test_explanations_name_the_rule_that_limited() -> None:
    spec = HpaSpec(1, 100)
    (outcome,) = run(spec, 1, [metric(1000, 10)], [0.0])
    assert outcome.explain(spec) == (
        "s0 1000 / (10 × 1) = 100.00: ceil(1000 / 10) = 100; "
        "scale-up limited to max(2 × 1, 4) = 4; 1 -> 4"
    )
