"""Decisions: ``(trigger spec, snapshot, cooldown entry, now) -> value, activity, explanation``.

A decision has two halves. :func:`measure` depends on the trigger spec and the snapshot only,
so one measurement serves every caller with that spec until what it read changes
(:class:`Basis`), a reading it used goes stale or, with ``windowSeconds``, the oldest reading
of a window leaves it (``fresh_until``); given the spec's previous measurement it redoes only
the nodes whose views changed (:class:`NodePart`), with the same result. :func:`judge` then
applies one ScaledObject's cooldown entry and the activation threshold: cheap, and per
caller.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import NamedTuple

from keda_gpu_scaler.domain.aggregation import aggregate
from keda_gpu_scaler.domain.attribution import (
    device_key,
    pods_unavailable_reason,
    unavailable_reason,
)
from keda_gpu_scaler.domain.attribution import (
    fresh_until as attribution_fresh_until,
)
from keda_gpu_scaler.domain.catalog import CATALOG, MetricInfo
from keda_gpu_scaler.domain.cooldown import CooldownEntry, CooldownOutcome, apply_cooldown
from keda_gpu_scaler.domain.coverage import Coverage, check_cluster_trigger, refusal
from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData
from keda_gpu_scaler.domain.history import EMPTY_HISTORY, History
from keda_gpu_scaler.domain.samples import DeviceHolder, DeviceKey, PodsReading
from keda_gpu_scaler.domain.snapshot import (
    STALE_AFTER_PERIODS,
    DeviceState,
    NodeView,
    PodIndex,
    PodKey,
    Snapshot,
    by_index,
    node_of,
    stale_limit_s,
)
from keda_gpu_scaler.domain.trigger import TriggerSpec
from keda_gpu_scaler.domain.windows import Windowed, window_value


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
class Basis:
    """What a measurement read, so that a later snapshot can tell it still holds: the node
    views (the same objects while a node sends nothing new), and for ``podSelector`` the pod
    index and the index of pods by node."""

    views: tuple[tuple[str, NodeView | None], ...]
    node_count: int | None = None
    """Set when every node was read: a node that joins changes the answer."""
    pod_index: PodIndex | None = None
    pod_nodes: Mapping[PodKey, frozenset[str]] | None = None
    pods: PodsReading | None = None
    """The pod watch's reading it read (how fresh the labels are, which namespaces)."""
    attributed_until: float | None = None
    """On a cluster scaler, the snapshot's: pod attribution is usable while one node's is
    fresh, and an earlier end (nodes gone) may make it unusable."""

    def holds(self, snapshot: Snapshot) -> bool:
        if self.node_count is not None and len(snapshot.nodes) != self.node_count:
            return False
        if self.attributed_until is not None and snapshot.attributed_until < self.attributed_until:
            return False
        if self.pods is not None and snapshot.pods is not self.pods:
            return False
        if self.pod_index is not None and snapshot.pod_index is not self.pod_index:
            return False
        if self.pod_nodes is not None and snapshot.pod_nodes is not self.pod_nodes:
            return False
        nodes = snapshot.nodes
        return all(nodes.get(name) is view for name, view in self.views)


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
    pods: _PodScope | None = field(default=None, repr=False)
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


def _is_instance(device: DeviceState) -> bool:
    return device.reading is not None and device.reading.is_mig_instance()


def _is_mig_parent(device: DeviceState) -> bool:
    return device.reading is not None and device.reading.mig_enabled


def _label(device: DeviceState) -> str:
    return device.label


def _gpu_label(device: DeviceState) -> str:
    """The physical GPU of a device (a MIG instance's parent), with its node on a cluster."""
    node = device.reading.node if device.reading is not None else ""
    return f"{node} GPU {device.index}" if node else f"GPU {device.index}"


def _select(
    spec: TriggerSpec, snapshot: Snapshot, known: Mapping[str, NodePart]
) -> tuple[tuple[Group, ...], Basis]:
    """gpuIndex -1: every GPU, a MIG-enabled GPU by its instances; N: physical GPU N; on a
    cluster scaler, node by node, and with ``nodeName`` of that node only (its view, not the
    whole cluster). A node whose view is that of its ``known`` part keeps that selection."""
    if not snapshot.device_count:
        raise NoData("no GPU readings yet")
    if snapshot.on_cluster():
        check_cluster_trigger(spec)
    if spec.node_name is None:
        basis = Basis(tuple(snapshot.nodes.items()), node_count=len(snapshot.nodes))
        views = sorted(snapshot.nodes.items())
    else:
        view = snapshot.nodes.get(spec.node_name)
        basis = Basis(((spec.node_name, view),))
        if view is None or not view.devices:
            nodes = sorted(n for n, v in snapshot.nodes.items() if n and v.devices)
            raise NoData(
                f"no GPU of node {spec.node_name} reported (nodes: {', '.join(nodes) or 'none'})"
            )
        views = [(spec.node_name, view)]
    groups = []
    for name, one in views:
        part = known.get(name)
        if part is not None and part.view is one:
            groups.append((name, part.keys))
            continue
        chosen = _chosen(spec, sorted(one.devices.values(), key=by_index))
        if chosen:
            groups.append((name, tuple(d.key for d in chosen)))
    if not groups:
        devices = [d for _, v in views for d in v.devices.values()]
        raise NoData(_nothing_selected(spec, sorted(devices, key=by_index)))
    return tuple(groups), basis


def _chosen(spec: TriggerSpec, devices: list[DeviceState]) -> list[DeviceState]:
    """The devices of one node the trigger selects, by NVML index."""
    if spec.mig_instance is not None:
        return [
            d for d in devices if d.reading is not None and spec.mig_instance.matches(d.reading)
        ]
    if spec.gpu_index < 0:
        return [d for d in devices if not _is_mig_parent(d)]
    return [d for d in devices if d.index == spec.gpu_index and not _is_instance(d)]


def _nothing_selected(spec: TriggerSpec, devices: list[DeviceState]) -> str:
    """Why no device of ``devices`` (every node's read, by index) is selected."""
    if spec.mig_instance is not None:
        known = ", ".join(f"{_label(d)} ({d.key})" for d in devices if _is_instance(d))
        return (
            f"no MIG instance {spec.mig_instance} on this node (MIG instances: {known or 'none'})"
        )
    if spec.gpu_index < 0:
        return "MIG is enabled on every GPU of this node and no MIG instance exists"
    known = ", ".join(sorted({str(d.index) for d in devices}, key=int))
    return f"no GPU with gpuIndex {spec.gpu_index} on this node (GPUs: {known})"


def _why_missing(device: DeviceState, now: float) -> str | None:
    """Why a device has no usable reading now, or None when it has one."""
    if device.lost_reason is not None:
        return f"{_label(device)} ({device.key}) is lost: {device.lost_reason}"
    reading = device.reading
    if reading is None:
        return f"{_label(device)} ({device.key}) has no reading yet"
    if device.is_stale(now):
        limit = stale_limit_s(reading.period_s)
        return (
            f"{_label(device)} reading is stale: {now - reading.taken_at:.1f} s old "
            f"(limit {limit:g} s: {STALE_AFTER_PERIODS} sample periods, 1 s at least)"
        )
    return None


def _attribution_fresh(view: NodeView | None, now: float) -> bool:
    a = None if view is None else view.attribution
    return a is not None and now - a.taken_at <= stale_limit_s(a.period_s)


def _counted_once(per_parent: bool, devices: list[DeviceState]) -> list[DeviceState]:
    """Instances carry copies of whole-GPU readings: keep one instance per GPU for those
    (``devices`` are of one node: GPU 0 of two nodes are two GPUs)."""
    if not per_parent:
        return devices
    seen: set[int] = set()
    kept = []
    for device in devices:
        if _is_instance(device):
            if device.index in seen:
                continue
            seen.add(device.index)
        kept.append(device)
    return kept


Group = tuple[str, tuple[DeviceKey, ...]]
"""A node and the keys of its selected devices, by NVML index."""


@dataclass(frozen=True, slots=True)
class NodePart:
    """What one node's selected devices contributed to a measurement: kept for the next
    one while the node's view is the same object (a node that sent nothing new) and its
    readings are fresh, so a measurement over many nodes redoes only the nodes that
    changed."""

    view: NodeView
    keys: tuple[DeviceKey, ...]
    attributed: bool
    """Its attribution was fresh (or not needed): a stale one makes its devices missing."""
    parts: tuple[tuple[int, float], ...]
    labels: tuple[str, ...]
    unsupported: tuple[DeviceState, ...]
    missing: tuple[str, ...]
    counts: tuple[int, ...]
    until: float
    """When this part must be redone at the latest (a reading goes stale, a window moves)."""


class _Rescope(Exception):
    """A device the cached pod scope names is gone from its node: select afresh."""


def _node_part(
    spec: TriggerSpec,
    info: MetricInfo,
    view: NodeView,
    keys: tuple[DeviceKey, ...],
    attributed: bool,
    holders: Mapping[DeviceKey, str] | None,
    now: float,
) -> NodePart:
    devices = view.devices
    fresh: list[DeviceState] = []
    missing: list[str] = []
    aging = False
    for key in keys:
        device = devices.get(key)
        if device is None:
            raise _Rescope(key)
        why = _why_missing(device, now)
        if why is None and not attributed:
            why = f"{_label(device)}: the attribution of node {view.name} is stale"
        if why is None:
            fresh.append(device)
        else:
            missing.append(why)
            aging = aging or (not device.is_lost() and device.reading is not None)
    until = min((_fresh_until(d) for d in fresh), default=math.inf)
    if aging:
        until = now  # "stale: 4.0 s old" is true now only: redone on the next call
    parts: list[tuple[int, float]] = []
    labels: list[str] = []
    unsupported: list[DeviceState] = []
    counts: list[int] = []
    for device in _counted_once(info.per_parent, fresh):
        assert device.reading is not None
        assert info.read is not None
        value = info.read(device.reading)
        if value is None:
            unsupported.append(device)
            continue
        # A whole-GPU reading seen through an instance belongs to the GPU.
        label = _gpu_label(device) if info.per_parent else _label(device)
        if spec.window_s:
            window = _window(spec, device.history, now, label)
            value, until = window.value, min(until, window.fresh_until)
            counts.append(window.readings)
        parts.append((device.index, value))
        labels.append(label if holders is None else f"{label} ({holders[device.key]})")
    return NodePart(
        view,
        keys,
        attributed,
        tuple(parts),
        tuple(labels),
        tuple(unsupported),
        tuple(missing),
        tuple(counts),
        until,
    )


def _groups(devices: list[DeviceState]) -> tuple[Group, ...]:
    """Selected devices by node (in node order), each node's by NVML index."""
    by_node: dict[str, list[DeviceKey]] = {}
    for device in sorted(devices, key=by_index):
        # By its key, not its reading: a device lost before it was read has none.
        by_node.setdefault(node_of(device.key), []).append(device.key)
    return tuple((node, tuple(keys)) for node, keys in sorted(by_node.items()))


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
    except _Rescope:
        return _measure_devices(spec, info, snapshot, now, None)


def _measure_devices(
    spec: TriggerSpec,
    info: MetricInfo,
    snapshot: Snapshot,
    now: float,
    previous: Measurement | None,
) -> Measurement:
    pods: _PodScope | None = None
    until = math.inf
    known = MappingProxyType({}) if previous is None else previous.node_parts
    if spec.pod_selector is not None:
        pods = _select_pods(spec, snapshot, now, None if previous is None else previous.pods)
        until = _scope_until(snapshot, pods, now)
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
    else:
        groups, basis = _select(spec, snapshot, known)
    cluster = snapshot.on_cluster()
    node_parts: dict[str, NodePart] = {}
    for name, keys in groups:
        view = snapshot.nodes[name]
        attributed = pods is None or not cluster or _attribution_fresh(view, now)
        part = known.get(name)
        if (
            part is None
            or part.view is not view
            or part.keys != keys
            or part.attributed != attributed
            or now > part.until
        ):
            holders = None if pods is None else pods.holders
            part = _node_part(spec, info, view, keys, attributed, holders, now)
        node_parts[name] = part
    coverage = _coverage(spec, cluster, node_parts.values())
    parts = [p for n in node_parts.values() for p in n.parts]
    unsupported = [d for n in node_parts.values() for d in n.unsupported]
    if not parts:
        raise NoData(_unsupported_message(spec, info.needs, unsupported))
    value = aggregate(spec.aggregation, [v for _, v in parts])
    return Measurement(
        value,
        tuple(parts),
        tuple(d.index for d in unsupported),
        labels=tuple(label for n in node_parts.values() for label in n.labels),
        unsupported_labels=tuple(_label(d) for d in unsupported),
        fresh_until=min(until, *(n.until for n in node_parts.values())),
        scope="" if pods is None else pods.text,
        readings=tuple(c for n in node_parts.values() for c in n.counts),
        coverage="" if coverage is None else coverage.describe(),
        basis=basis,
        node_parts=MappingProxyType(node_parts),
        pods=pods,
    )


def _coverage(spec: TriggerSpec, cluster: bool, parts: Iterable[NodePart]) -> Coverage | None:
    """On a node agent every selected device must be fresh; on a cluster scaler a partial
    view is answered where the coverage rule allows it (None: nothing is missing)."""
    parts = list(parts)
    missing = tuple(m for p in parts for m in p.missing)
    if not missing:
        return None
    if not cluster:
        raise NoData(missing[0])
    coverage = Coverage(sum(len(p.keys) for p in parts), missing)
    reason = refusal(spec.aggregation, coverage, spec.min_coverage)
    if reason is not None:
        raise NoData(reason)
    return coverage


def _window(spec: TriggerSpec, history: History, now: float, who: str) -> Windowed:
    return window_value(
        history, spec.metric_type, spec.window_aggregation, spec.window_s, now, who=who
    )


@dataclass(frozen=True, slots=True)
class _PodScope:
    """Which devices of which nodes a ``podSelector`` selects, and who holds each."""

    groups: tuple[Group, ...]
    holders: Mapping[DeviceKey, str]
    """Who holds each device, in words: ``vllm-0``, ``vllm-0, vllm-1; shared``."""
    text: str
    basis: Basis
    indexes: tuple[tuple[str, object], ...]
    """Each node's index of holders by pod it was read from: while these, the pod index
    and the index of pods by node are the same objects, so is the scope."""

    def holds(self, snapshot: Snapshot) -> bool:
        if snapshot.pod_index is not self.basis.pod_index:
            return False
        if snapshot.pod_nodes is not self.basis.pod_nodes:
            return False
        nodes = snapshot.nodes
        for name, by_pod in self.indexes:
            view = nodes.get(name)
            if view is None or view.by_pod is not by_pod:
                return False
        return True


def _scope_until(snapshot: Snapshot, pods: _PodScope, now: float) -> float:
    """When the pod labels, the attribution of a node in scope, or (on a cluster scaler)
    the freshest attribution of any node, go stale."""
    until = attribution_fresh_until(snapshot)
    if snapshot.attribution is None and snapshot.on_cluster():
        until = min(until, snapshot.attributed_until)
    for name, _ in pods.groups:
        view = snapshot.nodes[name]
        a = view.attribution
        if name and a is not None and _attribution_fresh(view, now):
            until = min(until, a.taken_at + stale_limit_s(a.period_s))
    return until


def _select_pods(
    spec: TriggerSpec, snapshot: Snapshot, now: float, previous: _PodScope | None
) -> _PodScope:
    """The devices held by the pods ``podSelector`` matches in ``podNamespace``, each once.

    Reads the pods of that namespace and, through the index of pods by node, the views of
    the nodes they hold devices on: nothing else of the cluster; and not even that while
    ``previous`` still holds. Raises :class:`NoData` when attribution or pod labels are
    unavailable (never 0), or when a matching pod holds a device ID that names no GPU NVML
    reports (never guessed)."""
    selector, namespace = spec.pod_selector, spec.pod_namespace
    assert selector is not None  # parse_trigger sets both
    assert namespace is not None
    reason = unavailable_reason(snapshot, now) or pods_unavailable_reason(snapshot, now, namespace)
    if reason is not None:
        raise NoData(reason)
    if previous is not None and previous.holds(snapshot):
        # The same devices of the same nodes: only what the basis names is newer.
        current = tuple((name, snapshot.nodes[name]) for name, _ in previous.basis.views)
        basis = replace(
            previous.basis,
            views=current,
            pods=snapshot.pods,
            attributed_until=snapshot.attributed_until,
        )
        return replace(previous, basis=basis)
    index = snapshot.pod_index
    matching = sorted(
        (p.namespace, p.name)
        for p in index.by_namespace.get(namespace, ())
        if not p.terminated() and selector.matches(p.labels)
    )
    chosen: dict[DeviceKey, tuple[DeviceState, NodeView]] = {}
    unmatched: list[DeviceHolder] = []
    views: dict[str, NodeView] = {}
    for pod in matching:
        for name in sorted(snapshot.pod_nodes.get(pod, ())):
            view = views[name] = snapshot.nodes[name]
            prefix = f"{name}/" if name else ""
            for holder in view.by_pod[pod]:
                key = DeviceKey(prefix + device_key(holder.device_id))
                device = view.devices.get(key)
                if device is None:
                    unmatched.append(holder)
                else:
                    chosen[key] = (device, view)
    basis = Basis(
        tuple(views.items()),
        pod_index=index,
        pod_nodes=snapshot.pod_nodes,
        pods=snapshot.pods,
        attributed_until=snapshot.attributed_until,
    )
    indexes = tuple((name, view.by_pod) for name, view in views.items())
    if unmatched:
        held = ", ".join(f"{h.pod} holds {h.resource} {h.device_id}" for h in unmatched)
        raise NoData(f"{held}: no GPU that NVML reports on this node has that ID (not guessed)")
    whose = f"pods {selector} in {namespace}"
    if not chosen:
        if matching:
            names = ", ".join(name for _, name in matching)
            text = f"{whose} ({names}) hold no GPU on this node"
        else:
            text = f"no pod {selector} in {namespace} holds a GPU on this node"
        text += " (a workload with no pods uses no GPU)"
        return _PodScope((), MappingProxyType({}), text, basis, indexes)
    selected = set(matching)
    holders: dict[DeviceKey, str] = {}
    for key, (_, view) in chosen.items():
        pods_on = list(
            dict.fromkeys(
                (h.namespace, h.pod)
                for h in view.by_device.get(key, ())
                if (h.namespace, h.pod) not in index.ended
            )
        )
        text = ", ".join(name for ns, name in pods_on if (ns, name) in selected)
        others = [f"{ns}/{name}" for ns, name in pods_on if (ns, name) not in selected]
        if len(pods_on) > 1:
            text += "; shared" + (f" with {', '.join(others)}" if others else "")
        holders[key] = text
    groups = _groups([d for d, _ in chosen.values()])
    return _PodScope(groups, MappingProxyType(holders), f"the GPUs of {whose}", basis, indexes)


def _fresh_until(device: DeviceState) -> float:
    reading = device.reading
    assert reading is not None  # checked fresh
    return reading.taken_at + stale_limit_s(reading.period_s)


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
        key = f"{target.kind.value}Endpoint"
        raise InvalidTrigger(key, target.url, sample.error or "refused")
    age = now - sample.taken_at
    if age > stale_limit_s(sample.period_s):
        raise NoData(f"{target.url}: the newest scrape is stale ({age:.1f} s old)")
    if sample.reading is None:
        raise NoData(f"{target.url}: {sample.error}")
    value = sample.reading.value(info.engine_field)
    if value is None:
        why = sample.reading.why_absent(info.engine_field) or "not in the payload"
        raise NoData(f"{spec.metric_type} from {target.url}: {why} (no value, not 0)")
    value *= info.scale
    fresh_until = sample.taken_at + stale_limit_s(sample.period_s)
    if not spec.window_s:
        return Measurement(value, ((-1, value),), labels=(target.url,), fresh_until=fresh_until)
    history = snapshot.engine_history.get(target.source, EMPTY_HISTORY)
    window = _window(spec, history, now, target.url)
    return Measurement(
        window.value,
        ((-1, window.value),),
        labels=(target.url,),
        fresh_until=min(fresh_until, window.fresh_until),
        readings=(window.readings,),
    )


def _unsupported_message(spec: TriggerSpec, needs: str | None, devices: list[DeviceState]) -> str:
    gpus = [str(d.index) for d in devices if not _is_instance(d)]
    instances = [_label(d).removeprefix("MIG ") for d in devices if _is_instance(d)]
    groups = [f"GPU {', '.join(gpus)}"] if gpus else []
    groups += [f"MIG {', '.join(instances)}"] if instances else []
    text = f"{spec.metric_type} is not supported on {' and '.join(groups)} (no reading, not 0)"
    return text if needs is None else f"{text}: it needs {needs}"


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
