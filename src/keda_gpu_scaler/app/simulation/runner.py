"""The simulation: KEDA's scale loop and the HPA over a feed, in virtual time, each asking
the scaler's real decision code.

Timing: the HPA syncs at t = 0, 15, 30 ... s and KEDA polls from t = 0 every
``pollingInterval``; at the same instant KEDA acts first. Before each of them, every sample
taken so far is folded (with the replica count in effect when it was taken). A call to the
scaler is what the servicer does: ``measure`` the trigger on the snapshot, then ``judge`` it
with that trigger's cooldown entry (shared by both paths, as the decider keys it); KEDA's
``GetMetrics`` and ``IsActive`` of one check read the same snapshot at the same instant, so
one judgement answers both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from keda_gpu_scaler.app.simulation.feeds import Feed
from keda_gpu_scaler.app.simulation.scaledobject import Plan, Trigger
from keda_gpu_scaler.app.simulation.text import num
from keda_gpu_scaler.domain.cooldown import CooldownEntry
from keda_gpu_scaler.domain.decision import judge, measure
from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData
from keda_gpu_scaler.domain.hpa import (
    ExternalMetric,
    HpaState,
    TargetType,
    sync,
)
from keda_gpu_scaler.domain.kedaloop import (
    HPA,
    KEDA,
    Answer,
    Counted,
    KedaState,
    MetricTarget,
    count,
    poll,
    schedule,
    to_milli,
)

__all__ = ["HPA", "KEDA", "Step", "TriggerStep", "schedule", "simulate", "warnings"]
from keda_gpu_scaler.domain.reach import unreachable_max
from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT, Snapshot
from keda_gpu_scaler.domain.trigger import TriggerSpec


@dataclass(frozen=True, slots=True)
class TriggerStep:
    metric_name: str
    """The HPA's name of the metric, ``s<index>-<metricName>``."""
    value: float | None
    """What the scaler served (None: it answered an error)."""
    target: float
    active: bool
    """As KEDA counts the trigger: the scaler's ``IsActive``, or true while falling back."""


@dataclass(frozen=True, slots=True)
class Step:
    t: int
    by: str
    """``KEDA`` (a poll of the scale loop) or ``HPA`` (a sync of the controller)."""
    replicas: int
    """The count after this step's action."""
    desired: int
    active: bool
    triggers: tuple[TriggerStep, ...]
    why: str


def warnings(plan: Plan, gpus: int | None) -> tuple[str, ...]:
    """The plan's notes, and each ``AverageValue`` trigger that cannot reach maxReplicaCount."""
    found = list(plan.notes)
    for trigger in plan.triggers:
        if trigger.target_type is not TargetType.AVERAGE_VALUE:
            continue
        spec = trigger.spec
        one = spec.gpu_index >= 0 or spec.mig_instance is not None
        text = unreachable_max(
            spec.metric_type,
            spec.aggregation,
            spec.target,
            1 if one else gpus,
            plan.keda.max_replicas,
        )
        if text is not None:
            found.append(f"{trigger.hpa_name}: {text}")
    return tuple(found)


def simulate(plan: Plan, feed: Feed, initial_replicas: int) -> list[Step]:
    run = _Run(plan, feed, initial_replicas)
    return [
        run.poll(t) if by == KEDA else run.sync(t)
        for t, by in schedule(feed.duration, plan.keda.polling_s)
    ]


@dataclass
class _Scaler:
    """The scaler's answers: ``measure`` then ``judge``, a cooldown entry per trigger spec
    (the decider keys them by ScaledObject and the whole trigger: two identical triggers of
    one object share one)."""

    snapshot: Snapshot = EMPTY_SNAPSHOT
    entries: dict[TriggerSpec, CooldownEntry] = field(default_factory=dict)

    def ask(self, trigger: Trigger, now: float, *, keep: bool = True) -> Answer:
        try:
            measured = measure(trigger.spec, self.snapshot, now)
        except (NoData, InvalidTrigger) as exc:
            return Answer(None, error=str(exc))
        decision = judge(trigger.spec, measured, self.entries.get(trigger.spec), now)
        if keep:
            self.entries[trigger.spec] = decision.cooldown.entry
        if not math.isfinite(decision.value) or decision.value < 0:
            return Answer(None, error=f"refusing to serve {decision.value!r}")
        return Answer(decision.value, decision.active)


class _Run:
    def __init__(self, plan: Plan, feed: Feed, replicas: int) -> None:
        self._plan = plan
        self._feed = feed
        self._replicas = replicas
        self._scaler = _Scaler()
        self._keda = KedaState(failures=(0,) * len(plan.triggers))
        self._hpa = HpaState()
        self._cached: dict[int, Answer] = {}

    def poll(self, t: int) -> Step:
        self._scaler.snapshot = self._feed.advance(t, self._replicas)
        answers = [self._scaler.ask(trigger, t) for trigger in self._plan.triggers]
        self._cached = {i: a for i, a in enumerate(answers) if self._plan.triggers[i].use_cached}
        counted = self._count(answers)
        outcome = poll(self._plan.keda, self._keda, self._replicas, counted, t)
        self._keda = outcome.state
        why = [*self._notes(counted), outcome.explain(self._plan.keda)]
        return self._step(t, KEDA, outcome.replicas, outcome.desired, counted, why)

    def sync(self, t: int) -> Step:
        self._scaler.snapshot = self._feed.advance(t, self._replicas)
        if self._replicas == 0:
            # The HPA asks nothing at 0 replicas: show what the scaler would answer.
            peeked = [self._scaler.ask(trigger, t, keep=False) for trigger in self._plan.triggers]
            counted = [Counted(a, 0) for a in peeked]
            outcome = sync(self._plan.hpa, self._hpa, 0, (), t)
            notes = []
        else:
            answers = [
                self._cached.get(i) or self._scaler.ask(trigger, t)
                for i, trigger in enumerate(self._plan.triggers)
            ]
            counted = self._count(answers)
            metrics = [
                self._metric(tr, c) for tr, c in zip(self._plan.triggers, counted, strict=True)
            ]
            outcome = sync(self._plan.hpa, self._hpa, self._replicas, metrics, t)
            notes = self._notes(counted, hpa=True)
        self._hpa = outcome.state
        why = [*notes, outcome.explain(self._plan.hpa)]
        return self._step(t, HPA, outcome.replicas, outcome.desired, counted, why)

    def _count(self, answers: Sequence[Answer]) -> list[Counted]:
        counted = []
        for trigger, answer in zip(self._plan.triggers, answers, strict=True):
            target = MetricTarget(to_milli(trigger.spec.target), trigger.target_type)
            self._keda, c = count(
                self._plan.keda, self._keda, trigger.index, answer, target, self._replicas
            )
            counted.append(c)
        return counted

    def _metric(self, trigger: Trigger, counted: Counted) -> ExternalMetric:
        value = counted.answer.value
        usage = to_milli(value) if value is not None else counted.fallback_milli
        return ExternalMetric(
            trigger.hpa_name,
            trigger.target_type,
            to_milli(trigger.spec.target),
            usage,
            counted.answer.error,
        )

    def _notes(self, counted: Sequence[Counted], *, hpa: bool = False) -> list[str]:
        """Errors and fallback; on the HPA path a failed proposal names the error itself."""
        notes = []
        fallback = self._plan.keda.fallback
        tracked = fallback is not None and self._plan.keda.tracks_health
        for trigger, c in zip(self._plan.triggers, counted, strict=True):
            if c.answer.value is not None:
                continue
            said = hpa and not c.falling_back
            failures = ""
            if fallback is not None and tracked:
                failures = f"failure {c.failures}, fallback after {fallback.failure_threshold}"
            if said:
                if failures:
                    notes.append(f"{trigger.hpa_name} {failures}")
                continue
            note = f"{trigger.hpa_name} error: {c.answer.error}"
            note += f" ({failures})" if failures else ""
            if c.fallback_milli is not None:
                note += f"; fallback serves {num(c.fallback_milli / 1000)}"
                note += f" for {c.fallback_replicas} replicas"
            notes.append(note)
        return notes

    def _step(
        self,
        t: int,
        by: str,
        replicas: int,
        desired: int,
        counted: Sequence[Counted],
        why: list[str],
    ) -> Step:
        self._replicas = replicas
        triggers = tuple(
            TriggerStep(tr.hpa_name, c.answer.value, tr.spec.target, c.active)
            for tr, c in zip(self._plan.triggers, counted, strict=True)
        )
        active = any(s.active for s in triggers)
        return Step(t, by, replicas, desired, active, triggers, "; ".join(why))
