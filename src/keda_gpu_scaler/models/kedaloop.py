"""KEDA's side of a ScaledObject as a pure model: the scale loop, activation and fallback.

Follows kedacore/keda:

- ``pkg/scaling/scale_handler.go``: the scale loop checks at once, then every
  ``pollingInterval``; the object is active when any trigger is, in error when any failed
  (``getScaledObjectState``). For an external trigger a check is ``GetMetrics``, then
  ``IsActive``; the HPA path (``GetScaledObjectMetrics``) asks ``GetMetrics`` (and an unused
  ``IsActive``) of each trigger at every HPA sync while replicas >= 1.
- ``pkg/scaling/executor/scale_scaledobjects.go``: ``RequestScale``. Active at 0 replicas
  (or below minReplicaCount with ``idleReplicaCount``): scale to minReplicaCount, 1 at least,
  and set ``lastActiveTime``; active with an error: nothing (``PartialTriggerError``, no
  ``lastActiveTime``); active: ``lastActiveTime`` = now. Inactive with an error: nothing when
  a fallback with replicas other than 0 is set or no fallback is; inactive with replicas and
  minReplicaCount 0 (or above ``idleReplicaCount``): to 0 (or the idle count) once
  ``lastActiveTime + cooldownPeriod`` is past (``scaleToZeroOrIdle``; before any activity,
  ``initialCooldownPeriod`` after creation); inactive below minReplicaCount: to
  minReplicaCount.
- ``pkg/fallback/fallback.go``: each metric counts its consecutive failures
  (``status.health``, tracked only with a valid ``fallback``) on both paths (the scale loop
  too since kedacore/keda#7244), a success resets the count; above ``failureThreshold`` the
  metric is served as target × replicas (``AverageValue``) or target × replicas / ready
  replicas (``Value``, which needs a ready replica), replicas per ``fallback.behavior``,
  and the trigger counts as active.
- KEDA 2.21 (``apis/keda/v1alpha1/scaledobject_types.go`` ``UsesHPAObservations``;
  ``pkg/scaling/scale_handler.go`` ``getScalerState``, ``hpaObservedRecord``,
  ``hpaActivelyQuerying``): when the scale loop cannot move the workload outside the HPA's
  range (minReplicaCount above 0, no ``idleReplicaCount``, no ``useCachedMetrics``), a poll
  reuses what the HPA path last observed of each metric (its value, activity and fallback)
  instead of asking the scaler, as long as the HPA's ``ScalingActive`` condition is true;
  failures are then counted on the HPA path only.
- ``pkg/scaling/scale_handler.go`` ``startPushScalers``: a ``true`` from StreamIsActive is
  ``RequestScale`` with the object active and no error: activation from 0, or
  ``lastActiveTime`` = now. ``false`` is ignored.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from keda_gpu_scaler.models.hpa import SYNC_PERIOD_S, TargetType

DEFAULT_POLLING_S = 30
DEFAULT_COOLDOWN_S = 300
DEFAULT_MAX_REPLICAS = 100
KEDA = "KEDA"
"""A poll of KEDA's scale loop."""
HPA = "HPA"
"""A sync of the HPA controller."""


def schedule(duration: float, polling_s: int, *, start: float = 0.0) -> list[tuple[float, str]]:
    """Every KEDA poll (from ``start`` every ``polling_s``) and HPA sync (``start``, then every
    15 s) before ``duration``, KEDA first at the same instant: the scale loop and the HPA both
    start when the ScaledObject is created, at ``start``."""
    events = []
    for k in range(math.ceil(max(0.0, duration - start))):
        t = round(start + k, 6)
        if t >= duration:
            break
        if k % polling_s == 0:
            events.append((t, KEDA))
        if k % SYNC_PERIOD_S == 0:
            events.append((t, HPA))
    return events


class FallbackBehavior(enum.StrEnum):
    STATIC = "static"
    CURRENT = "currentReplicas"
    IF_HIGHER = "currentReplicasIfHigher"
    IF_LOWER = "currentReplicasIfLower"


@dataclass(frozen=True, slots=True)
class Fallback:
    failure_threshold: int
    replicas: int
    behavior: FallbackBehavior = FallbackBehavior.STATIC

    def is_valid(self) -> bool:
        """``HasValidFallback``: KEDA tracks health only then."""
        return self.failure_threshold >= 0 and self.replicas >= 0

    def replicas_for(self, current: int) -> int:
        match self.behavior:
            case FallbackBehavior.STATIC:
                return self.replicas
            case FallbackBehavior.CURRENT:
                return current
            case FallbackBehavior.IF_HIGHER:
                return max(current, self.replicas)
            case FallbackBehavior.IF_LOWER:
                return min(current, self.replicas)


@dataclass(frozen=True, slots=True)
class KedaSpec:
    """The ScaledObject fields KEDA's scale loop reads, with KEDA's defaults."""

    min_replicas: int = 0
    max_replicas: int = DEFAULT_MAX_REPLICAS
    polling_s: int = DEFAULT_POLLING_S
    cooldown_s: int = DEFAULT_COOLDOWN_S
    initial_cooldown_s: int = 0
    idle_replicas: int | None = None
    fallback: Fallback | None = None
    uses_cached_metrics: bool = False
    """A trigger sets ``useCachedMetrics``."""

    @property
    def hpa_min_replicas(self) -> int:
        """The HPA's minReplicas: minReplicaCount, or 1 when that is 0."""
        return self.min_replicas if self.min_replicas > 0 else 1

    @property
    def activation_replicas(self) -> int:
        """What activation scales to (``scaleFromZeroOrIdle``)."""
        return self.min_replicas if self.min_replicas > 0 else 1

    @property
    def tracks_health(self) -> bool:
        return self.fallback is not None and self.fallback.is_valid()

    @property
    def uses_hpa_observations(self) -> bool:
        """KEDA 2.21's ``UsesHPAObservations``: the scale loop cannot move the workload
        outside the HPA's range (``IsPollingIntervalRelevant`` is false), so its polls reuse
        what the HPA path observed."""
        relevant = self.min_replicas == 0 or self.idle_replicas is not None
        return not (relevant or self.uses_cached_metrics)


@dataclass(frozen=True, slots=True)
class Answer:
    """One trigger's answer to one KEDA call: the value and ``IsActive``, or the error."""

    value: float | None
    active: bool = False
    error: str = ""


@dataclass(frozen=True, slots=True)
class MetricTarget:
    target_milli: int
    target_type: TargetType


@dataclass(frozen=True, slots=True)
class Counted:
    """One answer as KEDA counts it, after fallback."""

    answer: Answer
    failures: int
    """Consecutive failures of the metric after this call (``numberOfFailures``)."""
    fallback_milli: int | None = None
    """The value served instead of the error, when falling back."""
    fallback_replicas: int | None = None

    @property
    def active(self) -> bool:
        return self.answer.active if self.answer.value is not None else self.falling_back

    @property
    def error(self) -> bool:
        return self.answer.value is None and not self.falling_back

    @property
    def falling_back(self) -> bool:
        return self.fallback_milli is not None


@dataclass(frozen=True, slots=True)
class KedaState:
    last_active_at: float | None = None
    failures: tuple[int, ...] = ()
    """Per trigger: consecutive failures (``status.health``)."""


def to_milli(value: float) -> int:
    """KEDA's value as a quantity: milli-units, rounded."""
    return math.floor(value * 1000 + 0.5)


def fallback_milli(fallback: Fallback, metric: MetricTarget, current: int) -> int | None:
    """``doFallback``: the value that drives the HPA to the fallback count; None when it
    cannot be made (``Value`` with no ready replica)."""
    replicas: float = fallback.replicas_for(current)
    if metric.target_type is TargetType.VALUE:
        if current == 0:
            return None
        replicas /= current
    return int(metric.target_milli / 1000 * 1000 * replicas)


def count(
    spec: KedaSpec,
    state: KedaState,
    index: int,
    answer: Answer,
    metric: MetricTarget,
    current: int,
) -> tuple[KedaState, Counted]:
    """``GetMetricsWithFallback`` for trigger ``index``'s answer, on either path."""
    if spec.fallback is None or not spec.tracks_health:
        return state, Counted(answer, 0)
    failures = list(state.failures) + [0] * (index + 1 - len(state.failures))
    failures[index] = 0 if answer.value is not None else failures[index] + 1
    state = replace(state, failures=tuple(failures))
    n = failures[index]
    if answer.value is not None or n <= spec.fallback.failure_threshold:
        return state, Counted(answer, n)
    value = fallback_milli(spec.fallback, metric, current)
    return state, Counted(answer, n, value, spec.fallback.replicas_for(current))


class Action(enum.StrEnum):
    ACTIVATE = "activate"
    ACTIVE = "active"
    PARTIAL_ERROR = "partial error"
    ERROR = "error"
    ERROR_FALLBACK = "error, fallback set"
    DEACTIVATE = "deactivate"
    COOLING_DOWN = "cooling down"
    TO_MIN = "to min"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class PollOutcome:
    state: KedaState
    current: int
    replicas: int
    """The count after the poll."""
    desired: int
    """The count KEDA's rule asks for, before ``cooldownPeriod`` holds it."""
    active: bool
    error: bool
    action: Action
    scale_in_at: float | None = None
    """While cooling down: the first instant after which KEDA scales in."""

    def explain(self, spec: KedaSpec) -> str:
        what = "active" if self.active else "inactive"
        if self.error:
            what += " with a trigger in error"
        match self.action:
            case Action.ACTIVATE:
                return f"{what}: activation {self.current} -> {self.replicas}"
            case Action.ACTIVE:
                return f"{what}: {self.current} replica(s) left to the HPA"
            case Action.PARTIAL_ERROR:
                return f"{what}: no change, lastActiveTime kept"
            case Action.ERROR:
                return f"{what}, no fallback: KEDA keeps {self.current}"
            case Action.ERROR_FALLBACK:
                return f"{what}: KEDA keeps {self.current} until the fallback"
            case Action.DEACTIVATE:
                return (
                    f"{what} for cooldownPeriod {spec.cooldown_s} s: "
                    f"{self.current} -> {self.replicas}"
                )
            case Action.COOLING_DOWN:
                return (
                    f"{what}: cooldownPeriod holds {self.current} until after "
                    f"t={_t(self.scale_in_at)}"
                )
            case Action.TO_MIN:
                return f"{what}: up to minReplicaCount {self.current} -> {self.replicas}"
            case _:
                return f"{what}: no change"


def poll(
    spec: KedaSpec, state: KedaState, current: int, counted: Sequence[Counted], now: float
) -> PollOutcome:
    """``RequestScale`` after one check of every trigger (``counted``, in trigger order)."""
    active = any(c.active for c in counted)
    error = any(c.error for c in counted)
    return request_scale(spec, state, current, now, active=active, error=error)


def push(spec: KedaSpec, state: KedaState, current: int, now: float) -> PollOutcome:
    """A ``true`` from StreamIsActive: ``RequestScale`` with the object active and no error
    (``startPushScalers``)."""
    return request_scale(spec, state, current, now, active=True, error=False)


def request_scale(
    spec: KedaSpec, state: KedaState, current: int, now: float, *, active: bool, error: bool
) -> PollOutcome:
    """``RequestScale`` (``pkg/scaling/executor/scale_scaledobjects.go``)."""

    def outcome(action: Action, replicas: int = current, desired: int | None = None) -> PollOutcome:
        seen = now if action in (Action.ACTIVATE, Action.ACTIVE) else state.last_active_at
        new = replace(state, last_active_at=seen)
        want = replicas if desired is None else desired
        return PollOutcome(new, current, replicas, want, active, error, action)

    if active:
        if current == 0 or (spec.idle_replicas is not None and current < spec.min_replicas):
            return outcome(Action.ACTIVATE, spec.activation_replicas)
        return outcome(Action.PARTIAL_ERROR if error else Action.ACTIVE)
    if error and spec.fallback is not None and spec.fallback.replicas != 0:
        return outcome(Action.ERROR_FALLBACK)
    if error and spec.fallback is None:
        return outcome(Action.ERROR)
    idle = spec.idle_replicas
    if (idle is not None and current > idle) or (current > 0 and spec.min_replicas == 0):
        target = spec.min_replicas if idle is None else idle
        scale_in_at = _scale_in_at(spec, state)
        if now > scale_in_at:
            return outcome(Action.DEACTIVATE, target)
        cooling = outcome(Action.COOLING_DOWN, current, target)
        return replace(cooling, scale_in_at=scale_in_at)
    if current < spec.min_replicas and idle is None:
        return outcome(Action.TO_MIN, spec.min_replicas)
    return outcome(Action.NONE)


def _scale_in_at(spec: KedaSpec, state: KedaState) -> float:
    """After this instant an inactive object scales in: ``lastActiveTime + cooldownPeriod``,
    or before any activity ``initialCooldownPeriod`` after creation, which is taken to be
    just before the first check."""
    if state.last_active_at is None:
        return spec.initial_cooldown_s - 1e-9
    return state.last_active_at + spec.cooldown_s


def _t(value: float | None) -> str:
    if value is None:
        return "?"
    return str(round(value)) if abs(value - round(value)) < 1e-6 else f"{value:.1f}"
