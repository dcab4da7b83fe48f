"""What the HPA controller does with a recommendation: ``behavior``, stabilization, rate
policies, and the older rule without ``behavior`` (kubernetes/kubernetes
``pkg/controller/podautoscaler/horizontal.go``; defaults from
``pkg/apis/autoscaling/v2/defaults.go``). :mod:`keda_gpu_scaler.models.hpa` runs them.

- Without ``behavior``: ``stabilizeRecommendation`` (the highest recommendation of the last
  300 s) and ``convertDesiredReplicasWithRules`` (min, max, at most max(2 × current, 4)).
- With ``behavior``: ``stabilizeRecommendationWithBehaviors`` (the current count brought
  within [lowest recommendation of the scale-up window, highest of the scale-down window]),
  then ``convertDesiredReplicasWithBehaviorRate``: each policy allows its change from the
  count at the start of its ``periodSeconds`` (``calculateScaleUpLimitWithScalingRules``,
  ``calculateScaleDownLimitWithBehaviors``), over the events ``storeScaleEvent`` keeps.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

DEFAULT_TOLERANCE = 0.1
"""``--horizontal-pod-autoscaler-tolerance``."""
DOWNSCALE_STABILIZATION_S = 300
"""``--horizontal-pod-autoscaler-downscale-stabilization``, default 5 minutes."""

TimedCount = tuple[float, int]
"""(when, replicas): a recommendation, or the size of a scale event."""


class PolicyType(enum.StrEnum):
    PODS = "Pods"
    PERCENT = "Percent"


class SelectPolicy(enum.StrEnum):
    MAX = "Max"
    MIN = "Min"
    DISABLED = "Disabled"


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    type: PolicyType
    value: int
    period_s: int


@dataclass(frozen=True, slots=True)
class ScalingRules:
    """One direction of a ``behavior``, every field filled."""

    stabilization_s: int
    select: SelectPolicy
    policies: tuple[ScalingPolicy, ...]
    tolerance: float = DEFAULT_TOLERANCE


SCALE_UP_DEFAULTS = ScalingRules(
    0,
    SelectPolicy.MAX,
    (ScalingPolicy(PolicyType.PODS, 4, 15), ScalingPolicy(PolicyType.PERCENT, 100, 15)),
)
SCALE_DOWN_DEFAULTS = ScalingRules(
    DOWNSCALE_STABILIZATION_S, SelectPolicy.MAX, (ScalingPolicy(PolicyType.PERCENT, 100, 15),)
)


@dataclass(frozen=True, slots=True)
class RulesSpec:
    """One direction of a ``behavior`` as a ScaledObject writes it: None is "not given"."""

    stabilization_s: int | None = None
    select: SelectPolicy | None = None
    policies: tuple[ScalingPolicy, ...] | None = None
    tolerance: float | None = None

    def filled(self, defaults: ScalingRules) -> ScalingRules:
        """The API server's defaulting (``copyHPAScalingRules``): each unset field from
        ``defaults``."""
        return ScalingRules(
            defaults.stabilization_s if self.stabilization_s is None else self.stabilization_s,
            defaults.select if self.select is None else self.select,
            defaults.policies if self.policies is None else self.policies,
            defaults.tolerance if self.tolerance is None else self.tolerance,
        )


@dataclass(frozen=True, slots=True)
class Behavior:
    scale_up: ScalingRules = SCALE_UP_DEFAULTS
    scale_down: ScalingRules = SCALE_DOWN_DEFAULTS

    @classmethod
    def given(cls, scale_up: RulesSpec | None, scale_down: RulesSpec | None) -> Behavior:
        """A ``behavior`` with what it leaves unset filled from ``autoscaling/v2``'s defaults."""
        return cls(
            (scale_up or RulesSpec()).filled(SCALE_UP_DEFAULTS),
            (scale_down or RulesSpec()).filled(SCALE_DOWN_DEFAULTS),
        )


@dataclass(frozen=True, slots=True)
class HpaState:
    """What the controller remembers of one HPA between syncs."""

    recommendations: tuple[TimedCount, ...] | None = None
    """Unstabilized recommendations; None before the first sync."""
    scale_ups: tuple[TimedCount, ...] = ()
    """Replicas added by each rescale (only kept with ``behavior``)."""
    scale_downs: tuple[TimedCount, ...] = ()
    scaling_active: bool | None = None
    """The ``ScalingActive`` condition: true once a sync computed a count from its metrics,
    false when they failed or scaling is disabled; None before any (KEDA 2.21's scale loop
    reuses the HPA's observations only while it is true)."""


class Limit(enum.StrEnum):
    """The ``ScalingLimited`` reason of a sync over metrics."""

    WITHIN_RANGE = "DesiredWithinRange"
    SCALE_UP_LIMIT = "ScaleUpLimit"
    TOO_MANY = "TooManyReplicas"
    TOO_FEW = "TooFewReplicas"
    SCALE_DOWN_LIMIT = "ScaleDownLimit"


def _replace_oldest(
    items: tuple[TimedCount, ...], old: Sequence[bool], new: TimedCount
) -> tuple[TimedCount, ...]:
    """The controller's bookkeeping: the last entry marked old is replaced, else one is added."""
    for i in reversed(range(len(items))):
        if old[i]:
            return (*items[:i], new, *items[i + 1 :])
    return (*items, new)


_SAME_INSTANT_S = 1e-6
"""Two instants closer than this are one (the grid's sums of floats are not exact)."""


def _within(t: float, window_s: float, now: float) -> bool:
    """Whether what happened at ``t`` is younger than ``window_s`` at ``now``.

    The controller compares nanosecond timestamps (``rec.timestamp.After(cutoff)``,
    ``rec.timestamp.Add(period).After(now)``), and its syncs of an HPA are never exactly 15 s
    apart: each comes 15 s after the previous one finished. A sync that falls, on the
    simulated grid, exactly a window after a record is therefore a little later than that in
    a cluster, and the record is out of the window."""
    return now - t < window_s - _SAME_INSTANT_S


def stabilize_legacy(state: HpaState, desired: int, now: float) -> tuple[HpaState, int]:
    """``stabilizeRecommendation``: the highest recommendation of the last 300 s."""
    recs = state.recommendations or ()
    old = [not _within(t, DOWNSCALE_STABILIZATION_S, now) for t, _ in recs]
    best = max([desired, *(n for (t, n), o in zip(recs, old, strict=True) if not o)])
    return replace(state, recommendations=_replace_oldest(recs, old, (now, desired))), best


def limit_legacy(current: int, desired: int, low: int, high: int) -> tuple[int, Limit]:
    """``convertDesiredReplicasWithRules``: min, max, and the older scale-up limit."""
    up_limit = int(max(2.0 * current, 4.0))
    if high > up_limit:
        allowed, limit = up_limit, Limit.SCALE_UP_LIMIT
    else:
        allowed, limit = high, Limit.TOO_MANY
    if desired < low:
        return low, Limit.TOO_FEW
    if desired > allowed:
        return allowed, limit
    return desired, Limit.WITHIN_RANGE


def stabilize(
    behavior: Behavior, state: HpaState, current: int, desired: int, now: float
) -> tuple[HpaState, int]:
    """``stabilizeRecommendationWithBehaviors``: the current count brought within [lowest
    recommendation of the scale-up window, highest of the scale-down window]."""
    recs = state.recommendations or ()
    up_s, down_s = behavior.scale_up.stabilization_s, behavior.scale_down.stabilization_s
    up = min([desired, *(n for t, n in recs if _within(t, up_s, now))])
    down = max([desired, *(n for t, n in recs if _within(t, down_s, now))])
    recommendation = min(max(current, up), down)
    old = [not _within(t, up_s, now) and not _within(t, down_s, now) for t, _ in recs]
    return replace(
        state, recommendations=_replace_oldest(recs, old, (now, desired))
    ), recommendation


def rate_limit(
    behavior: Behavior,
    state: HpaState,
    current: int,
    desired: int,
    now: float,
    *,
    low: int,
    high: int,
) -> tuple[int, Limit]:
    """``convertDesiredReplicasWithBehaviorRate``."""
    if desired > current:
        up_limit = max(_scale_up_limit(behavior.scale_up, state, current, now), current)
        if high > up_limit:
            allowed, limit = up_limit, Limit.SCALE_UP_LIMIT
        else:
            allowed, limit = high, Limit.TOO_MANY
        if desired > allowed:
            return allowed, limit
    elif desired < current:
        down_limit = min(_scale_down_limit(behavior.scale_down, state, current, now), current)
        if low < down_limit:
            allowed, limit = down_limit, Limit.SCALE_DOWN_LIMIT
        else:
            allowed, limit = low, Limit.TOO_FEW
        if desired < allowed:
            return allowed, limit
    return desired, Limit.WITHIN_RANGE


def _changed(events: tuple[TimedCount, ...], period_s: int, now: float) -> int:
    """``getReplicasChangePerPeriod``: replicas changed by events within the period."""
    return sum(n for t, n in events if _within(t, period_s, now))


def _period_start(state: HpaState, current: int, period_s: int, now: float) -> int:
    return (
        current
        - _changed(state.scale_ups, period_s, now)
        + _changed(state.scale_downs, period_s, now)
    )


def _scale_up_limit(rules: ScalingRules, state: HpaState, current: int, now: float) -> int:
    if rules.select is SelectPolicy.DISABLED or not rules.policies:
        return current
    proposed = []
    for policy in rules.policies:
        start = _period_start(state, current, policy.period_s, now)
        if policy.type is PolicyType.PODS:
            proposed.append(start + policy.value)
        else:
            # Rounded up, or a small deployment could never grow.
            proposed.append(math.ceil(start * (1 + policy.value / 100)))
    return min(proposed) if rules.select is SelectPolicy.MIN else max(proposed)


def _scale_down_limit(rules: ScalingRules, state: HpaState, current: int, now: float) -> int:
    if rules.select is SelectPolicy.DISABLED or not rules.policies:
        return current
    proposed = []
    for policy in rules.policies:
        start = _period_start(state, current, policy.period_s, now)
        if policy.type is PolicyType.PODS:
            proposed.append(start - policy.value)
        else:
            proposed.append(int(start * (1 - policy.value / 100)))
    # The largest change (Max) is the lowest count; Min is the highest.
    return max(proposed) if rules.select is SelectPolicy.MIN else min(proposed)


def store_event(
    behavior: Behavior | None, state: HpaState, current: int, replicas: int, now: float
) -> HpaState:
    """``storeScaleEvent``: kept only with ``behavior``; an event older than the direction's
    longest policy period is marked old and the last old one is reused."""
    if behavior is None:
        return state
    up = replicas > current
    rules = behavior.scale_up if up else behavior.scale_down
    longest = max((p.period_s for p in rules.policies), default=0)
    events = state.scale_ups if up else state.scale_downs
    old = [not _within(t, longest, now) for t, _ in events]
    events = _replace_oldest(events, old, (now, abs(replicas - current)))
    return replace(state, scale_ups=events) if up else replace(state, scale_downs=events)
