"""The simulation: KEDA's scale loop and the HPA over a feed, in virtual time, each asking
the scaler's real decision code.

Timing: the ScaledObject is created at ``start`` (0 unless told); the HPA syncs then and
every 15 s, KEDA polls then and every ``pollingInterval``; at the same instant KEDA acts
first. Before each of them, every sample taken so far is folded (with the replica count in
effect when it was taken). A call to the scaler is what the servicer does: ``measure`` the
trigger on the snapshot, then ``judge`` it with that trigger's cooldown entry (shared by both
paths and the streams, as the decider keys it); KEDA's ``GetMetrics`` and ``IsActive`` of one
check read the same snapshot at the same instant, so one judgement answers both. An
``external-push`` trigger's StreamIsActive is judged on every reading (:mod:`.push`), and a
``true`` it sends is acted on at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence, Set
from dataclasses import dataclass, field

from keda_gpu_scaler.app.simulate.feeds import Feed
from keda_gpu_scaler.app.simulate.push import Judgement, PushStream
from keda_gpu_scaler.app.simulate.scaledobject import Plan, Trigger
from keda_gpu_scaler.app.simulate.text import num
from keda_gpu_scaler.domain.cooldown import CooldownEntry
from keda_gpu_scaler.domain.decision import judge, measure
from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData
from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT, Snapshot
from keda_gpu_scaler.domain.trigger import TriggerSpec
from keda_gpu_scaler.models.hpa import (
    ExternalMetric,
    HpaState,
    TargetType,
    sync,
)
from keda_gpu_scaler.models.kedaloop import (
    HPA,
    KEDA,
    Answer,
    Counted,
    KedaState,
    MetricTarget,
    count,
    poll,
    push,
    schedule,
    to_milli,
)
from keda_gpu_scaler.models.reach import unreachable_max

PUSH = "push"
"""A ``true`` of StreamIsActive that KEDA acted on."""
__all__ = ["HPA", "KEDA", "PUSH", "Step", "TriggerStep", "schedule", "simulate", "warnings"]


@dataclass(frozen=True, slots=True)
class TriggerStep:
    metric_name: str
    """The HPA's name of the metric, ``s<index>-<metricName>``."""
    value: float | None
    """What the scaler served (None: it answered an error)."""
    target: float
    active: bool
    """As KEDA counts the trigger: the scaler's ``IsActive``, or true while falling back."""
    fallback: bool = False
    """KEDA served its fallback value instead of the error (``value`` is None)."""


@dataclass(frozen=True, slots=True)
class Step:
    t: float
    by: str
    """``KEDA`` (a poll of the scale loop), ``HPA`` (a sync of the controller) or ``PUSH``
    (KEDA acting on a ``true`` of StreamIsActive)."""
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


def simulate(plan: Plan, feed: Feed, initial_replicas: int, *, start: float = 0.0) -> list[Step]:
    """Every step from the ScaledObject's creation at ``start`` to the feed's end."""
    run = _Run(plan, feed, initial_replicas)
    steps: list[Step] = []
    for t, by in schedule(feed.duration, plan.keda.polling_s, start=start):
        steps += run.streams_until(t)
        steps.append(run.poll(t) if by == KEDA else run.sync(t))
    return steps


@dataclass
class _Scaler:
    """The scaler's answers: ``measure`` then ``judge``, a cooldown entry per trigger spec
    (the decider keys them by ScaledObject and the whole trigger: two identical triggers of
    one object share one)."""

    snapshot: Snapshot = EMPTY_SNAPSHOT
    entries: dict[TriggerSpec, CooldownEntry] = field(default_factory=dict)

    def ask(self, trigger: Trigger, now: float, *, keep: bool = True) -> Answer:
        return self._judge(trigger, now, keep=keep)[0]

    def stream(self, trigger: Trigger, now: float) -> Judgement:
        """What StreamIsActive serves now (the same judgement, the same cooldown entry)."""
        answer, hold_ends_at = self._judge(trigger, now, keep=True)
        return Judgement(answer.active if answer.value is not None else None, hold_ends_at)

    def raw_activity(self, trigger: Trigger, now: float) -> bool | None:
        """The spec's raw activity, as the stream registry compares it on a new reading."""
        try:
            measured = measure(trigger.spec, self.snapshot, now)
        except (NoData, InvalidTrigger):
            return None
        return measured.value > trigger.spec.activation

    def _judge(self, trigger: Trigger, now: float, *, keep: bool) -> tuple[Answer, float]:
        try:
            measured = measure(trigger.spec, self.snapshot, now)
        except (NoData, InvalidTrigger) as exc:
            return Answer(None, error=str(exc)), math.inf
        decision = judge(trigger.spec, measured, self.entries.get(trigger.spec), now)
        if keep:
            self.entries[trigger.spec] = decision.cooldown.entry
        if not math.isfinite(decision.value) or decision.value < 0:
            return Answer(None, error=f"refusing to serve {decision.value!r}"), math.inf
        hold = now + decision.cooldown.remaining_s if decision.cooldown.held else math.inf
        return Answer(decision.value, decision.active), hold


class _Run:
    def __init__(self, plan: Plan, feed: Feed, replicas: int) -> None:
        self._plan = plan
        self._feed = feed
        self._replicas = replicas
        self._scaler = _Scaler()
        self._keda = KedaState(failures=(0,) * len(plan.triggers))
        self._hpa = HpaState()
        self._cached: dict[int, Counted] = {}
        """The scale loop's last record of each ``useCachedMetrics`` trigger, fallback applied."""
        self._observed: dict[int, tuple[float, Counted]] = {}
        """What the HPA path last observed of each metric (KEDA 2.21's state records)."""
        pushed = [tr for tr in plan.triggers if tr.push]
        self._pushes = [PushStream.open(tr, n) for n, tr in enumerate(pushed)]
        self._streams_open = False

    # -- StreamIsActive -----------------------------------------------------------------

    def streams_until(self, t: float) -> list[Step]:
        """The push triggers' streams up to ``t``: opened at the first step, judged on each
        reading, heartbeat and end of a hold; a ``true`` that scales is a step."""
        steps: list[Step] = []
        if not self._pushes:
            return steps
        if not self._streams_open:
            self._streams_open = True
            self._scaler.snapshot = self._feed.advance(t, self._replicas)
            for stream in self._pushes:
                stream.raw = self._scaler.raw_activity(stream.trigger, t)
                steps += self._judge_stream(stream, t)
        while True:
            sample = self._feed.next_sample_at()
            wake = min(stream.wake_at for stream in self._pushes)
            at = wake if sample is None else min(sample, wake)
            if at > t:
                return steps
            self._scaler.snapshot = self._feed.advance(at, self._replicas)
            for stream in self._pushes:
                raw = self._scaler.raw_activity(stream.trigger, at)
                if stream.needs_judging(raw, at):
                    steps += self._judge_stream(stream, at)

    def _judge_stream(self, stream: PushStream, t: float) -> list[Step]:
        if not stream.send(self._scaler.stream(stream.trigger, t), t):
            return []
        outcome = push(self._plan.keda, self._keda, self._replicas, t)
        self._keda = outcome.state
        if outcome.replicas == self._replicas:
            return []  # lastActiveTime refreshed: nothing to show
        peeked = [self._scaler.ask(tr, t, keep=False) for tr in self._plan.triggers]
        counted = [Counted(a, 0) for a in peeked]
        why = [f"{stream.trigger.hpa_name} StreamIsActive true", outcome.explain(self._plan.keda)]
        return [self._step(t, PUSH, outcome.replicas, outcome.desired, counted, why)]

    # -- KEDA's scale loop and the HPA ---------------------------------------------------

    def poll(self, t: float) -> Step:
        self._scaler.snapshot = self._feed.advance(t, self._replicas)
        observed = self._plan.keda.uses_hpa_observations and self._hpa.scaling_active is True
        counted, notes, reused = [], [], set()
        for i, trigger in enumerate(self._plan.triggers):
            seen = self._observed.get(i) if observed else None
            if seen is not None:
                # KEDA 2.21: the HPA's record of the metric, fallback applied, uncounted.
                counted.append(seen[1])
                reused.add(i)
                notes.append(_reused(trigger, *seen))
            else:
                counted.append(self._count_one(i, self._scaler.ask(trigger, t)))
        self._cached = {i: c for i, c in enumerate(counted) if self._plan.triggers[i].use_cached}
        outcome = poll(self._plan.keda, self._keda, self._replicas, counted, t)
        self._keda = outcome.state
        why = [*notes, *self._notes(counted, skip=reused), outcome.explain(self._plan.keda)]
        return self._step(t, KEDA, outcome.replicas, outcome.desired, counted, why)

    def sync(self, t: float) -> Step:
        self._scaler.snapshot = self._feed.advance(t, self._replicas)
        if self._replicas == 0:
            # The HPA asks nothing at 0 replicas: show what the scaler would answer.
            peeked = [self._scaler.ask(trigger, t, keep=False) for trigger in self._plan.triggers]
            counted = [Counted(a, 0) for a in peeked]
            outcome = sync(self._plan.hpa, self._hpa, 0, (), t)
            notes = []
        else:
            counted = [
                self._count_one(i, self._cached_answer(i) or self._scaler.ask(trigger, t))
                for i, trigger in enumerate(self._plan.triggers)
            ]
            if self._plan.keda.uses_hpa_observations:
                self._observed = {i: (t, c) for i, c in enumerate(counted)}
            metrics = [
                self._metric(tr, c) for tr, c in zip(self._plan.triggers, counted, strict=True)
            ]
            outcome = sync(self._plan.hpa, self._hpa, self._replicas, metrics, t)
            notes = self._notes(counted, hpa=True)
        self._hpa = outcome.state
        why = [*notes, outcome.explain(self._plan.hpa)]
        return self._step(t, HPA, outcome.replicas, outcome.desired, counted, why)

    def _cached_answer(self, index: int) -> Answer | None:
        """A ``useCachedMetrics`` record as the HPA path reads it: the scale loop stored it
        with fallback applied, so a fallback value reads as a success (and resets the failure
        count), an error as an error (``GetScaledObjectMetrics``, ``observeMetric``)."""
        record = self._cached.get(index)
        if record is None:
            return None
        if record.fallback_milli is not None:
            return Answer(record.fallback_milli / 1000, record.answer.active)
        return record.answer

    def _count_one(self, index: int, answer: Answer) -> Counted:
        trigger = self._plan.triggers[index]
        target = MetricTarget(to_milli(trigger.spec.target), trigger.target_type)
        self._keda, counted = count(
            self._plan.keda, self._keda, trigger.index, answer, target, self._replicas
        )
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

    def _notes(
        self, counted: Sequence[Counted], *, hpa: bool = False, skip: Set[int] = frozenset()
    ) -> list[str]:
        """Errors and fallback; on the HPA path a failed proposal names the error itself."""
        notes = []
        fallback = self._plan.keda.fallback
        tracked = fallback is not None and self._plan.keda.tracks_health
        for i, (trigger, c) in enumerate(zip(self._plan.triggers, counted, strict=True)):
            if c.answer.value is not None or i in skip:
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
        t: float,
        by: str,
        replicas: int,
        desired: int,
        counted: Sequence[Counted],
        why: list[str],
    ) -> Step:
        self._replicas = replicas
        triggers = tuple(
            TriggerStep(tr.hpa_name, c.answer.value, tr.spec.target, c.active, c.falling_back)
            for tr, c in zip(self._plan.triggers, counted, strict=True)
        )
        active = any(s.active for s in triggers)
        return Step(t, by, replicas, desired, active, triggers, "; ".join(why))


def _reused(trigger: Trigger, at: float, record: Counted) -> str:
    said = f"{trigger.hpa_name} as the HPA read it at t={num(at)}"
    if record.fallback_milli is not None:
        return f"{said} (the fallback's {num(record.fallback_milli / 1000)})"
    if record.answer.value is None:
        return f"{said} (an error)"
    return said
