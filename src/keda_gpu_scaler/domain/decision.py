"""Decisions: ``(trigger spec, snapshot, cooldown entry, now) -> value, activity, explanation``.

A decision has two halves. :func:`measure` depends on the trigger spec and the snapshot only,
so one measurement serves every caller with that spec until what it read changes
(``Basis``), a reading it used goes stale or, with ``windowSeconds``, the oldest reading
of a window leaves it (``fresh_until``); given the spec's previous measurement it redoes only
the nodes whose views changed (``NodePart``), with the same result. :func:`judge` then
applies one ScaledObject's cooldown entry and the activation threshold: cheap, and per
caller.

Which devices a measurement reads is ``domain.device_selection`` (by index, MIG instance and
node) or ``domain.pod_scope`` (by ``podSelector``); what each node's devices contribute, and
whether a partial view may be answered, is ``domain.node_parts``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from keda_gpu_scaler.domain.aggregation import aggregate
from keda_gpu_scaler.domain.catalog import CATALOG, MetricInfo
from keda_gpu_scaler.domain.cooldown import CooldownEntry, CooldownOutcome, apply_cooldown
from keda_gpu_scaler.domain.device_selection import Basis, select_devices
from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData
from keda_gpu_scaler.domain.history import EMPTY_HISTORY
from keda_gpu_scaler.domain.node_parts import (
    NodePart,
    Rescope,
    coverage_of,
    node_part,
    read_window,
    unsupported_message,
)
from keda_gpu_scaler.domain.pod_scope import (
    PodScope,
    attribution_fresh,
    scope_until,
    select_pods,
)
from keda_gpu_scaler.domain.process_share import SharedDevices
from keda_gpu_scaler.domain.snapshot import Snapshot, stale_limit_s
from keda_gpu_scaler.domain.trigger import TriggerSpec


class TriggerKey(NamedTuple):
    """One trigger of one ScaledObject: whose cooldown entry a decision reads and writes.

    The whole spec is part of it, so two triggers of one object that differ in anything
    (target, activation, cooldown, the metric) never share an entry.
    """

    namespace: str
    name: str
    spec: TriggerSpec

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Measurement:
    value: float
    parts: tuple[tuple[int, float], ...]
    """(GPU index, value) of every device that contributed; a MIG instance has its GPU's."""
    unsupported: tuple[int, ...] = ()
    labels: tuple[str, ...] = ()
    """Who each part came from: ``GPU 0``, or ``MIG 0:7`` (GPU 0, GPU instance 7)."""
    unsupported_labels: tuple[str, ...] = ()
    """Who could not read the metric, labelled like ``labels``."""
    fresh_until: float = math.inf
    """When the oldest reading used goes stale, or (with a window) the oldest reading in a
    window leaves it: the measurement holds until then."""
    readings: tuple[int, ...] = ()
    """With ``windowSeconds``: how many readings each part's window combined."""
    coverage: str = ""
    """Set when a cluster scaler answered from a partial view: who is missing."""
    scope: str = ""
    """Whose GPUs were measured, for a trigger with ``podSelector`` (pods ``app=x`` in ``ns``);
    with no ``parts`` it says why the value is 0 (no matching pod holds a GPU)."""
    basis: Basis | None = None
    """What it read: while that holds (and until ``fresh_until``) it is the measurement of
    later snapshots too. None: of its own snapshot only."""
    node_parts: Mapping[str, NodePart] = field(default_factory=lambda: MappingProxyType({}))
    """Each node's part, lent to the next measurement of the spec (``measure(previous=)``)."""
    pods: PodScope | None = field(default=None, repr=False)
    """A ``podSelector``'s scope, lent likewise while no holder or pod changed."""


@dataclass(frozen=True, slots=True)
class Decision:
    spec: TriggerSpec
    measurement: Measurement
    cooldown: CooldownOutcome
    active: bool

    @property
    def value(self) -> float:
        """The value to serve: the measurement after scale-down suppression."""
        return self.cooldown.value

    @property
    def raw_value(self) -> float:
        return self.measurement.value

    @property
    def explanation(self) -> str:
        """Why, in words; built only when asked (logs, the debug tap), not on every call."""
        return _explain(self.spec, self.measurement, self.cooldown, self.active)


def measure(
    spec: TriggerSpec, snapshot: Snapshot, now: float, previous: Measurement | None = None
) -> Measurement:
    """The aggregated value of the trigger's metric; raises :class:`NoData` if there is none.

    ``previous``, an earlier measurement of the same spec, lends the parts of nodes whose
    views did not change since (and its pod scope, while no holder or pod changed)."""
    info = CATALOG[spec.metric_type]
    if info.read is None:
        return _measure_engine(spec, info, snapshot, now)
    try:
        return _measure_devices(spec, info, snapshot, now, previous)
    except Rescope:
        return _measure_devices(spec, info, snapshot, now, None)


def _measure_devices(
    spec: TriggerSpec,
    info: MetricInfo,
    snapshot: Snapshot,
    now: float,
    previous: Measurement | None,
) -> Measurement:
    pods: PodScope | None = None
    shares = None
    until = math.inf
    known = MappingProxyType({}) if previous is None else previous.node_parts
    if spec.pod_selector is not None:
        pods = select_pods(spec, snapshot, now, None if previous is None else previous.pods)
        until = scope_until(snapshot, pods, now)
        if not pods.groups:
            return Measurement(
                0.0, (), scope=pods.text, fresh_until=until, basis=pods.basis, pods=pods
            )
        groups = pods.groups
        if spec.node_name is not None:
            groups = tuple(g for g in groups if g[0] == spec.node_name)
            if not groups:
                nodes = ", ".join(g[0] for g in pods.groups)
                raise NoData(f"no GPU of node {spec.node_name} reported (nodes: {nodes})")
        basis = pods.basis
        if spec.shared_devices is SharedDevices.PROCESSES:
            shares = pods.shares
    else:
        groups, basis = select_devices(spec, snapshot, known)
    cluster = snapshot.on_cluster()
    node_parts: dict[str, NodePart] = {}
    for name, keys in groups:
        view = snapshot.nodes[name]
        attributed = pods is None or not cluster or attribution_fresh(view, now)
        part = known.get(name)
        if (
            part is None
            or part.view is not view
            or part.keys != keys
            or part.attributed != attributed
            or part.shares is not shares
            or now > part.until
        ):
            holders = None if pods is None else pods.holders
            part = node_part(spec, info, view, keys, attributed, holders, now, shares)
        node_parts[name] = part
    coverage = coverage_of(spec, cluster, node_parts.values())
    parts = [p for n in node_parts.values() for p in n.parts]
    unsupported = [d for n in node_parts.values() for d in n.unsupported]
    if not parts:
        raise NoData(unsupported_message(spec, info.needs, unsupported))
    value = aggregate(spec.aggregation, [v for _, v in parts])
    return Measurement(
        value,
        tuple(parts),
        tuple(d.index for d in unsupported),
        labels=tuple(label for n in node_parts.values() for label in n.labels),
        unsupported_labels=tuple(d.label for d in unsupported),
        fresh_until=min(until, *(n.until for n in node_parts.values())),
        scope="" if pods is None else pods.text,
        readings=tuple(c for n in node_parts.values() for c in n.counts),
        coverage="" if coverage is None else coverage.describe(),
        basis=basis,
        node_parts=MappingProxyType(node_parts),
        pods=pods,
    )


def _measure_engine(
    spec: TriggerSpec, info: MetricInfo, snapshot: Snapshot, now: float
) -> Measurement:
    """The value of an engine metric from its sampler's newest scrape."""
    target = spec.engine_target
    # parse_trigger guarantees both for an engine metric type.
    assert target is not None
    assert info.engine_field is not None
    sample = snapshot.engines.get(target.source)
    if sample is None:
        raise NoData(f"no scrape of {target.url} yet")
    if sample.refused:
        raise InvalidTrigger(target.kind.endpoint_key, target.url, sample.error or "refused")
    age = now - sample.taken_at
    if age > stale_limit_s(sample.period_s):
        raise NoData(f"{target.url}: the newest scrape is stale ({age:.1f} s old)")
    if sample.reading is None:
        # A scrape's error names the URL (and the address it reached) itself.
        error = sample.error or "no reading"
        raise NoData(error if error.startswith(target.url) else f"{target.url}: {error}")
    value = sample.reading.value(info.engine_field)
    if value is None:
        why = sample.reading.why_absent(info.engine_field) or "not in the payload"
        raise NoData(f"{spec.metric_type} from {target.url}: {why} (no value, not 0)")
    value *= info.scale
    fresh_until = sample.taken_at + stale_limit_s(sample.period_s)
    if not spec.window_s:
        return Measurement(value, ((-1, value),), labels=(target.url,), fresh_until=fresh_until)
    history = snapshot.engine_history.get(target.source, EMPTY_HISTORY)
    window = read_window(spec, history, now, target.url)
    return Measurement(
        window.value,
        ((-1, window.value),),
        labels=(target.url,),
        fresh_until=min(fresh_until, window.fresh_until),
        readings=(window.readings,),
    )


def judge(
    spec: TriggerSpec, measured: Measurement, entry: CooldownEntry | None, now: float
) -> Decision:
    """Apply scale-down suppression to a measurement, and judge activity (value > activation)."""
    outcome = apply_cooldown(entry, measured.value, cooldown_s=spec.cooldown_s, now=now)
    return Decision(spec, measured, outcome, active=outcome.value > spec.activation)


def decide(
    spec: TriggerSpec, snapshot: Snapshot, entry: CooldownEntry | None, now: float
) -> Decision:
    """Measure, apply scale-down suppression, and judge activity (value > activation)."""
    return judge(spec, measure(spec, snapshot, now), entry, now)


def _explain(
    spec: TriggerSpec, measured: Measurement, outcome: CooldownOutcome, active: bool
) -> str:
    labels = measured.labels or tuple(f"GPU {i}" for i, _ in measured.parts)
    values = [f"{v:g}" for _, v in measured.parts]
    if measured.readings:
        values = [
            f"{spec.window_aggregation} {v} over {spec.window_s} s ({n} readings)"
            for v, n in zip(values, measured.readings, strict=True)
        ]
    parts = ", ".join(f"{label}={v}" for label, v in zip(labels, values, strict=True))
    if not measured.parts:
        text = f"{spec.metric_type}: {measured.scope}: {measured.value:g}"
    elif measured.scope:
        text = (
            f"{spec.metric_type} {spec.aggregation} over {measured.scope} "
            f"of [{parts}] = {measured.value:g}"
        )
    else:
        text = f"{spec.metric_type} {spec.aggregation} of [{parts}] = {measured.value:g}"
    if measured.unsupported_labels:
        text += f" (not supported on {', '.join(measured.unsupported_labels)})"
    if measured.coverage:
        text += f" (partial view: {measured.coverage})"
    if outcome.held:
        text += f"; cooldown holds {outcome.value:g} for {outcome.remaining_s:.0f} s more"
    verdict = "active" if active else "inactive"
    relation = ">" if active else "<="
    text += f"; {outcome.value:g} {relation} activation {spec.activation:g}: {verdict}"
    return text + f"; target {spec.target:g}"
