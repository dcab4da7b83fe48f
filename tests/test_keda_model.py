"""KEDA's scale loop as modelled: activation, cooldownPeriod, polling, fallback, several
triggers (kedacore/keda pkg/scaling/executor/scale_scaledobjects.go, pkg/fallback)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from keda_gpu_scaler.models.hpa import TargetType
from keda_gpu_scaler.models.kedaloop import (
    HPA,
    KEDA,
    Action,
    Answer,
    Counted,
    Fallback,
    FallbackBehavior,
    KedaSpec,
    KedaState,
    MetricTarget,
    PollOutcome,
    count,
    fallback_milli,
    poll,
    schedule,
    to_milli,
)

ACTIVE = Answer(50.0, active=True)
IDLE = Answer(0.0, active=False)
FAILED = Answer(None, error="no data")
AV_80 = MetricTarget(80_000, TargetType.AVERAGE_VALUE)
VALUE_80 = MetricTarget(80_000, TargetType.VALUE)


def check(
    spec: KedaSpec, state: KedaState, current: int, *answers: Answer, now: float
) -> PollOutcome:
    """One poll of triggers that answered ``answers``, failures counted as KEDA does."""
    counted = []
    for i, answer in enumerate(answers):
        state, c = count(spec, state, i, answer, AV_80, current)
        counted.append(c)
    return poll(spec, state, current, counted, now)


def timeline(
    spec: KedaSpec, current: int, answers: Sequence[tuple[float, Answer]]
) -> list[PollOutcome]:
    state, out = KedaState(), []
    for now, answer in answers:
        outcome = check(spec, state, current, answer, now=now)
        state, current = outcome.state, outcome.replicas
        out.append(outcome)
    return out


# -- activation --------------------------------------------------------------------------


def test_an_active_trigger_at_zero_replicas_activates_to_one() -> None:
    outcome = check(KedaSpec(min_replicas=0), KedaState(), 0, ACTIVE, now=30.0)
    assert (outcome.action, outcome.replicas, outcome.desired) == (Action.ACTIVATE, 1, 1)
    assert outcome.state.last_active_at == 30.0
    assert outcome.explain(KedaSpec()) == "active: activation 0 -> 1"


def test_activation_goes_to_min_replica_count_when_it_is_above_zero() -> None:
    outcome = check(KedaSpec(min_replicas=3), KedaState(), 0, ACTIVE, now=0.0)
    assert outcome.replicas == 3


def test_an_inactive_trigger_at_zero_replicas_changes_nothing() -> None:
    outcome = check(KedaSpec(), KedaState(), 0, IDLE, now=0.0)
    assert (outcome.action, outcome.replicas, outcome.active) == (Action.NONE, 0, False)


def test_an_active_trigger_with_replicas_leaves_them_to_the_hpa_and_refreshes_last_active() -> None:
    outcome = check(KedaSpec(), KedaState(last_active_at=0.0), 4, ACTIVE, now=60.0)
    assert (outcome.action, outcome.replicas) == (Action.ACTIVE, 4)
    assert outcome.state.last_active_at == 60.0


# -- cooldownPeriod ------------------------------------------------------------------------


def test_cooldown_period_holds_one_replica_until_it_has_passed() -> None:
    spec = KedaSpec(min_replicas=0, cooldown_s=60)
    steps = timeline(spec, 0, [(0.0, ACTIVE), (30.0, IDLE), (60.0, IDLE), (90.0, IDLE)])
    # Active at 0 (0 -> 1); inactive from 30: lastActiveTime 0 + 60 is not before 60 (KEDA's
    # strict Before), so the scale to 0 happens at 90.
    assert [s.action for s in steps] == [
        Action.ACTIVATE,
        Action.COOLING_DOWN,
        Action.COOLING_DOWN,
        Action.DEACTIVATE,
    ]
    assert [s.replicas for s in steps] == [1, 1, 1, 0]
    # While cooling down KEDA asks for 0 and holds 1.
    assert (steps[1].desired, steps[1].scale_in_at) == (0, 60.0)
    assert steps[1].explain(spec) == "inactive: cooldownPeriod holds 1 until after t=60"


def test_activity_while_cooling_down_starts_the_cooldown_again() -> None:
    spec = KedaSpec(min_replicas=0, cooldown_s=60)
    steps = timeline(
        spec,
        0,
        [(0.0, ACTIVE), (30.0, IDLE), (60.0, ACTIVE), (90.0, IDLE), (120.0, IDLE), (150.0, IDLE)],
    )
    assert [s.replicas for s in steps] == [1, 1, 1, 1, 1, 0]


def test_no_scale_to_zero_when_min_replica_count_is_above_zero() -> None:
    outcome = check(KedaSpec(min_replicas=2), KedaState(last_active_at=0.0), 5, IDLE, now=900.0)
    assert (outcome.action, outcome.replicas) == (Action.NONE, 5)


def test_initial_cooldown_period_counts_from_creation_before_any_activity() -> None:
    # Never active: with initialCooldownPeriod 0 the first check already scales in.
    assert check(KedaSpec(), KedaState(), 1, IDLE, now=0.0).replicas == 0
    spec = KedaSpec(initial_cooldown_s=120)
    assert check(spec, KedaState(), 1, IDLE, now=90.0).action is Action.COOLING_DOWN
    assert check(spec, KedaState(), 1, IDLE, now=120.0).replicas == 0


def test_inactive_below_min_replica_count_goes_up_to_it() -> None:
    outcome = check(KedaSpec(min_replicas=2), KedaState(), 1, IDLE, now=0.0)
    assert (outcome.action, outcome.replicas) == (Action.TO_MIN, 2)


def test_idle_replica_count_is_where_an_inactive_object_goes_and_activation_starts() -> None:
    spec = KedaSpec(min_replicas=2, idle_replicas=0, cooldown_s=30)
    steps = timeline(spec, 2, [(0.0, ACTIVE), (30.0, IDLE), (60.0, IDLE), (90.0, ACTIVE)])
    assert [s.replicas for s in steps] == [2, 2, 0, 2]


# -- polling -------------------------------------------------------------------------------


def test_keda_polls_from_zero_every_polling_interval_and_acts_before_the_hpa() -> None:
    assert schedule(61, 20) == [
        (0, KEDA),
        (0, HPA),
        (15, HPA),
        (20, KEDA),
        (30, HPA),
        (40, KEDA),
        (45, HPA),
        (60, KEDA),
        (60, HPA),
    ]
    # Only instants before the end: a 60 s run ends after t=59.
    assert schedule(60, 30)[-1] == (45, HPA)


# -- errors and fallback -------------------------------------------------------------------


def test_an_error_never_scales_to_zero_without_a_fallback() -> None:
    spec = KedaSpec(min_replicas=0, cooldown_s=0)
    outcome = check(spec, KedaState(last_active_at=0.0), 3, FAILED, now=600.0)
    assert (outcome.action, outcome.replicas, outcome.error) == (Action.ERROR, 3, True)
    # And no failure is counted: health is tracked only with a fallback.
    assert outcome.state.failures == ()


def test_failures_count_on_every_call_and_a_success_resets_them() -> None:
    spec = KedaSpec(fallback=Fallback(failure_threshold=2, replicas=5))
    state = KedaState()
    seen = []
    # The same counter whichever path calls: poll, sync, sync, poll ...
    for answer in (FAILED, FAILED, FAILED, ACTIVE, FAILED):
        state, c = count(spec, state, 0, answer, AV_80, 3)
        seen.append((c.failures, c.falling_back))
    # Above failureThreshold 2, i.e. from the third failure on, KEDA falls back.
    assert seen == [(1, False), (2, False), (3, True), (0, False), (1, False)]


def test_falling_back_serves_target_times_replicas_and_counts_active() -> None:
    spec = KedaSpec(fallback=Fallback(failure_threshold=0, replicas=5))
    state, c = count(spec, KedaState(), 0, FAILED, AV_80, 2)
    # AverageValue: 80 × 5 = 400, which the HPA divides by the target: 5 replicas.
    assert (c.fallback_milli, c.fallback_replicas) == (400_000, 5)
    assert (c.active, c.error) == (True, False)
    # Counted active, the object activates from 0.
    outcome = poll(spec, state, 0, [c], 0.0)
    assert (outcome.action, outcome.replicas) == (Action.ACTIVATE, 1)


def test_a_value_fallback_divides_by_the_ready_replicas_and_needs_one() -> None:
    fallback = Fallback(failure_threshold=0, replicas=6)
    # Value: 80 × 6 / 4 = 120, which the HPA multiplies back: 120 / 80 × 4 = 6.
    assert fallback_milli(fallback, VALUE_80, 4) == 120_000
    # At 0 replicas KEDA cannot make it: the error stays an error.
    spec = KedaSpec(fallback=fallback)
    _, c = count(spec, KedaState(), 0, FAILED, VALUE_80, 0)
    assert (c.fallback_milli, c.error, c.active) == (None, True, False)


@pytest.mark.parametrize(
    ("behavior", "current", "expected"),
    [
        (FallbackBehavior.STATIC, 7, 3),
        (FallbackBehavior.CURRENT, 7, 7),
        (FallbackBehavior.IF_HIGHER, 7, 7),
        (FallbackBehavior.IF_HIGHER, 1, 3),
        (FallbackBehavior.IF_LOWER, 7, 3),
        (FallbackBehavior.IF_LOWER, 1, 1),
    ],
)
def test_fallback_behavior_chooses_the_replicas(
    behavior: FallbackBehavior, current: int, expected: int
) -> None:
    assert Fallback(0, 3, behavior).replicas_for(current) == expected


def test_inactive_with_an_error_below_the_threshold_waits_for_the_fallback() -> None:
    spec = KedaSpec(
        min_replicas=0, cooldown_s=0, fallback=Fallback(failure_threshold=3, replicas=2)
    )
    outcome = check(spec, KedaState(last_active_at=0.0), 4, FAILED, now=600.0)
    assert (outcome.action, outcome.replicas) == (Action.ERROR_FALLBACK, 4)


def test_fallback_replicas_zero_lets_an_error_fall_through_to_scale_to_zero() -> None:
    spec = KedaSpec(
        min_replicas=0, cooldown_s=0, fallback=Fallback(failure_threshold=3, replicas=0)
    )
    outcome = check(spec, KedaState(last_active_at=0.0), 4, FAILED, now=600.0)
    assert (outcome.action, outcome.replicas) == (Action.DEACTIVATE, 0)


def test_to_milli_rounds_to_three_decimals() -> None:
    assert [to_milli(v) for v in (0.0, 1.0, 0.0004, 0.0005, 79.9996)] == [0, 1000, 0, 1, 80000]


# -- several triggers ----------------------------------------------------------------------


def test_the_object_is_active_when_any_trigger_is() -> None:
    outcome = check(KedaSpec(), KedaState(), 0, IDLE, ACTIVE, IDLE, now=0.0)
    assert (outcome.active, outcome.replicas) == (True, 1)
    quiet = check(KedaSpec(), KedaState(), 0, IDLE, IDLE, now=0.0)
    assert quiet.active is False


def test_active_with_another_trigger_in_error_keeps_last_active_time() -> None:
    outcome = check(KedaSpec(), KedaState(last_active_at=10.0), 3, ACTIVE, FAILED, now=60.0)
    assert (outcome.action, outcome.active, outcome.error) == (Action.PARTIAL_ERROR, True, True)
    assert outcome.state.last_active_at == 10.0
    # But at zero replicas an active trigger still activates.
    assert check(KedaSpec(), KedaState(), 0, ACTIVE, FAILED, now=60.0).replicas == 1


def test_an_error_on_one_trigger_and_inactivity_on_the_other_is_an_error() -> None:
    counted = [Counted(IDLE, 0), Counted(FAILED, 0)]
    outcome = poll(KedaSpec(), KedaState(last_active_at=0.0), 2, counted, 900.0)
    assert (outcome.action, outcome.replicas) == (Action.ERROR, 2)
