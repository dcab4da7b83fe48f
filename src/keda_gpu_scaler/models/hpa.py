"""The Kubernetes HPA controller as it runs for a KEDA ScaledObject: a pure model.

KEDA gives the HPA one ``External`` metric per trigger (``s<index>-<metricName>``), with a
``Value`` or an ``AverageValue`` target. :func:`sync` is one sync of the controller over
those metrics, following kubernetes/kubernetes ``pkg/controller/podautoscaler``:

- ``replica_calculator.go``: ``GetExternalMetricReplicas`` (``Value``: ratio = usage /
  target; within the tolerance the current count, else ceil(ratio × ready pods)) and
  ``GetExternalPerPodMetricReplicas`` (``AverageValue``: ratio = usage / (target × current);
  within the tolerance the current count, else ceil(usage / target)). Usage and target are
  milli-units, as the controller reads quantities. ``Tolerances.isWithin``: 1 - down <= ratio
  <= 1 + up, 0.1 both ways unless ``behavior`` sets ``tolerance``.
- ``horizontal.go`` ``reconcileAutoscaler``: the first sync records the current count as a
  recommendation (``recordInitialRecommendation``); 0 replicas with minReplicas >= 1 is
  "scaling disabled"; a count above max or below min is set to the bound at once;
  otherwise the proposals of every metric (``computeReplicasForMetrics``: the highest valid
  one; no change when every metric failed, or when one failed and the others ask for fewer
  replicas) are normalized by the rules of :mod:`keda_gpu_scaler.models.hpa_rules`: the older
  rule without ``behavior`` (what KEDA creates unless the ScaledObject sets one), or the
  ``behavior``'s stabilization windows and rate policies.

What it does not model: pods that are not ready yet (every replica counts as ready at once)
and the CPU initialization period, which concern resource metrics only; see docs/simulate.md.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from keda_gpu_scaler.models.hpa_rules import (
    DEFAULT_TOLERANCE,
    DOWNSCALE_STABILIZATION_S,
    SCALE_DOWN_DEFAULTS,
    SCALE_UP_DEFAULTS,
    Behavior,
    HpaState,
    Limit,
    PolicyType,
    RulesSpec,
    ScalingPolicy,
    ScalingRules,
    SelectPolicy,
    limit_legacy,
    rate_limit,
    stabilize,
    stabilize_legacy,
    store_event,
)

__all__ = [
    "DEFAULT_TOLERANCE",
    "DOWNSCALE_STABILIZATION_S",
    "SCALE_DOWN_DEFAULTS",
    "SCALE_UP_DEFAULTS",
    "SYNC_PERIOD_S",
    "Behavior",
    "ExternalMetric",
    "HpaSpec",
    "HpaState",
    "Limit",
    "PolicyType",
    "Proposal",
    "Rule",
    "RulesSpec",
    "ScalingPolicy",
    "ScalingRules",
    "SelectPolicy",
    "SyncOutcome",
    "TargetType",
    "Tolerances",
    "propose",
    "sync",
]

SYNC_PERIOD_S = 15
"""``--horizontal-pod-autoscaler-sync-period``, default 15 s."""
_INT32_MAX = 2**31 - 1


class TargetType(enum.StrEnum):
    VALUE = "Value"
    AVERAGE_VALUE = "AverageValue"


@dataclass(frozen=True, slots=True)
class Tolerances:
    down: float = DEFAULT_TOLERANCE
    up: float = DEFAULT_TOLERANCE

    def within(self, ratio: float) -> bool:
        return 1.0 - self.down <= ratio <= 1.0 + self.up


@dataclass(frozen=True, slots=True)
class HpaSpec:
    min_replicas: int
    max_replicas: int
    behavior: Behavior | None = None
    """None: the controller's older rule (what KEDA creates without ``behavior``)."""

    @property
    def tolerances(self) -> Tolerances:
        if self.behavior is None:
            return Tolerances()
        return Tolerances(self.behavior.scale_down.tolerance, self.behavior.scale_up.tolerance)


@dataclass(frozen=True, slots=True)
class ExternalMetric:
    """What one sync read for one external metric: KEDA's value in milli-units, or why not."""

    name: str
    target_type: TargetType
    target_milli: int
    usage_milli: int | None
    error: str = ""


@dataclass(frozen=True, slots=True)
class Proposal:
    """One metric's replica count, or the error that made it invalid (``replicas`` None)."""

    metric: ExternalMetric
    replicas: int | None
    ratio: float = math.nan
    held: bool = False
    """Within the tolerance: the current count."""

    def explain(self, current: int) -> str:
        m = self.metric
        if self.replicas is None:
            return f"{m.name} failed ({m.error})"
        assert m.usage_milli is not None
        usage, target = _num(m.usage_milli / 1000), _num(m.target_milli / 1000)
        if m.target_type is TargetType.AVERAGE_VALUE:
            text = f"{m.name} {usage} / ({target} × {current}) = {self.ratio:.2f}"
            rule = f"ceil({usage} / {target}) = {self.replicas}"
        else:
            text = f"{m.name} {usage} / {target} = {self.ratio:.2f}"
            rule = f"ceil({self.ratio:.2f} × {current}) = {self.replicas}"
        if self.held:
            return f"{text}, within tolerance: {self.replicas}"
        return f"{text}: {rule}"


def propose(metric: ExternalMetric, current: int, tolerances: Tolerances) -> Proposal:
    """The replica count one external metric asks for at ``current`` replicas (all ready)."""
    usage, target = metric.usage_milli, metric.target_milli
    if usage is None:
        return Proposal(metric, None)
    if metric.target_type is TargetType.AVERAGE_VALUE:
        ratio = usage / (float(target) * current)
        if tolerances.within(ratio):
            return Proposal(metric, current, ratio, held=True)
        return Proposal(metric, _int32(math.ceil(usage / target)), ratio)
    ratio = usage / target
    if current == 0:  # only reached outside KEDA (minReplicas 0)
        return Proposal(metric, _int32(math.ceil(ratio)), ratio)
    if tolerances.within(ratio):
        return Proposal(metric, current, ratio, held=True)
    return Proposal(metric, _int32(math.ceil(ratio * current)), ratio)


def _int32(value: float) -> int:
    return _INT32_MAX if value > _INT32_MAX else int(value)


class Rule(enum.StrEnum):
    """Which branch of ``reconcileAutoscaler`` a sync took."""

    DISABLED = "disabled"
    ABOVE_MAX = "above max"
    BELOW_MIN = "below min"
    METRICS_FAILED = "metrics failed"
    METRICS = "metrics"


@dataclass(frozen=True, slots=True)
class SyncOutcome:
    state: HpaState
    current: int
    replicas: int
    """The count after the sync."""
    desired: int
    """What the branch asks for before stabilization and limits: the metrics'
    recommendation (the highest proposal), the bound for a count out of range, the current
    count when the metrics failed, 0 when scaling is disabled."""
    rule: Rule
    proposals: tuple[Proposal, ...] = ()
    stabilized: int | None = None
    limit: Limit = Limit.WITHIN_RANGE
    behavior: bool = False

    def explain(self, spec: HpaSpec) -> str:
        """Why, in words."""
        change = self._change()
        match self.rule:
            case Rule.DISABLED:
                return "0 replicas: scaling is disabled (only KEDA scales from 0)"
            case Rule.ABOVE_MAX:
                return f"above maxReplicaCount {spec.max_replicas}: {change}"
            case Rule.BELOW_MIN:
                return f"below minReplicas {spec.min_replicas}: {change}"
        parts = [p.explain(self.current) for p in self.proposals]
        if self.rule is Rule.METRICS_FAILED:
            return "; ".join([*parts, f"no usable recommendation: {change}"])
        if len(self.proposals) > 1:
            parts.append(f"highest {self.desired}")
        parts += self._normalization(spec)
        return "; ".join([*parts, change])

    def _change(self) -> str:
        if self.replicas == self.current:
            return f"keep {self.current}"
        return f"{self.current} -> {self.replicas}"

    def _normalization(self, spec: HpaSpec) -> list[str]:
        parts = []
        if self.stabilized is not None and self.stabilized != self.desired:
            window = self._window(spec, up=self.desired >= self.current)
            bound = "lowest" if self.desired >= self.current else "highest"
            parts.append(f"{window} holds {self.stabilized} (the {bound} recommendation)")
        target = self.stabilized if self.stabilized is not None else self.desired
        if self.replicas != target:
            parts.append(self._limited(spec))
        return parts

    def _window(self, spec: HpaSpec, *, up: bool) -> str:
        if spec.behavior is None:
            return f"the {DOWNSCALE_STABILIZATION_S} s scale-down window"
        rules = spec.behavior.scale_up if up else spec.behavior.scale_down
        return f"the {rules.stabilization_s} s scale-{'up' if up else 'down'} window"

    def _limited(self, spec: HpaSpec) -> str:
        match self.limit:
            case Limit.TOO_MANY:
                return f"limited to maxReplicaCount {spec.max_replicas}"
            case Limit.TOO_FEW:
                return f"limited to minReplicas {spec.min_replicas}"
            case Limit.SCALE_UP_LIMIT if spec.behavior is None:
                return f"scale-up limited to max(2 × {self.current}, 4) = {self.replicas}"
            case Limit.SCALE_UP_LIMIT:
                return f"scale-up policies allow {self.replicas}"
            case _:
                return f"scale-down policies allow {self.replicas}"


def sync(
    spec: HpaSpec, state: HpaState, current: int, metrics: Sequence[ExternalMetric], now: float
) -> SyncOutcome:
    """One sync of the controller at ``now`` with ``current`` replicas (all ready)."""
    if state.recommendations is None:
        state = replace(state, recommendations=((now, current),))
    if current == 0 and spec.min_replicas != 0:
        state = replace(state, scaling_active=False)
        return SyncOutcome(state, current, current, 0, Rule.DISABLED)
    if current > spec.max_replicas:
        return _set(spec, state, current, spec.max_replicas, now, Rule.ABOVE_MAX)
    if current < spec.min_replicas:
        return _set(spec, state, current, spec.min_replicas, now, Rule.BELOW_MIN)
    proposals = tuple(propose(m, current, spec.tolerances) for m in metrics)
    valid = [p.replicas for p in proposals if p.replicas is not None]
    desired = max(valid, default=0)
    invalid = len(proposals) - len(valid)
    if invalid >= len(proposals) or (invalid > 0 and desired < current):
        # computeReplicasForMetrics sets ScalingActive false (FailedGetExternalMetric).
        state = replace(state, scaling_active=False)
        return SyncOutcome(state, current, current, current, Rule.METRICS_FAILED, proposals)
    state = replace(state, scaling_active=True)  # "ValidMetricFound"
    low, high = spec.min_replicas, spec.max_replicas
    if spec.behavior is None:
        state, stabilized = stabilize_legacy(state, desired, now)
        replicas, limit = limit_legacy(current, stabilized, low, high)
    else:
        state, stabilized = stabilize(spec.behavior, state, current, desired, now)
        replicas, limit = rate_limit(
            spec.behavior, state, current, stabilized, now, low=low, high=high
        )
    if replicas != current:
        state = store_event(spec.behavior, state, current, replicas, now)
    behaves = spec.behavior is not None
    return SyncOutcome(
        state, current, replicas, desired, Rule.METRICS, proposals, stabilized, limit, behaves
    )


def _set(
    spec: HpaSpec, state: HpaState, current: int, replicas: int, now: float, rule: Rule
) -> SyncOutcome:
    state = store_event(spec.behavior, state, current, replicas, now)
    return SyncOutcome(state, current, replicas, replicas, rule)


def _num(value: float) -> str:
    """A number as a person writes it: 80, 2.5, 0.33."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text
