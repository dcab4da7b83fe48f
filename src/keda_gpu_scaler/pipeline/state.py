"""Pure state transitions of the aggregator: samples in, the next snapshot out."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TypeVar

import msgspec

from keda_gpu_scaler.domain.attribution import index_holders, slices_unavailable_reason
from keda_gpu_scaler.domain.dra import Slices, join_devices
from keda_gpu_scaler.domain.engines import EngineSample
from keda_gpu_scaler.domain.history import EMPTY_HISTORY, NO_HISTORY, History, HistoryPlan
from keda_gpu_scaler.domain.samples import (
    RESOURCE_SLICES_SOURCE,
    AgentsReading,
    Batch,
    DeviceGone,
    DeviceHolder,
    DeviceKey,
    DeviceProcesses,
    DraDevice,
    GpuReading,
    NodeDevices,
    PodResourcesReading,
    PodsReading,
    ResourceSlicesReading,
    Sample,
    SourceFault,
    SourceStopped,
    unbatch,
)
from keda_gpu_scaler.domain.snapshot import (
    EMPTY_POD_INDEX,
    LOCAL_NODE,
    DeviceState,
    NodeView,
    PodKey,
    Snapshot,
    SourceState,
    index_pods,
    node_of,
    stale_limit_s,
)
from keda_gpu_scaler.domain.windows import extend_device, extend_engine


def fold(
    snapshot: Snapshot, samples: Iterable[Sample], now: float, *, plan: HistoryPlan = NO_HISTORY
) -> Snapshot:
    """The snapshot after ``samples``, one version later; ``plan`` says what history of
    each device and engine to keep for windows (none by default).

    Work is in proportion to the nodes the samples touch: only their views are rebuilt, and
    the indexes by pod only when a node's holders change."""
    nodes = NodeBuilder(snapshot)
    sources: dict[str, SourceState] = _thaw(snapshot.sources)
    engines: dict[str, EngineSample] = _thaw(snapshot.engines)
    engine_history: dict[str, History] = _thaw(snapshot.engine_history)
    pods, pod_index = snapshot.pods, snapshot.pod_index
    agents = snapshot.agents
    resource_slices = snapshot.resource_slices
    samples = tuple(samples)
    for item in samples:
        if isinstance(item, _CYCLES):
            _count_cycle(sources, item.source)
    for sample in unbatch(samples):
        if isinstance(sample, SourceStopped):
            # A node agent's link takes its node's own series (agent/<node>/pods, ...) along.
            for name in [n for n in sources if _under(n, sample)]:
                del sources[name]
            engines.pop(sample.source, None)
            engine_history.pop(sample.source, None)
            if pods is not None and pods.source == sample.source:
                pods, pod_index = None, EMPTY_POD_INDEX
            if resource_slices is not None and resource_slices.source == sample.source:
                resource_slices = None
            nodes.stopped(sample)
            continue
        source = sources.get(sample.source) or SourceState(name=sample.source)
        if isinstance(sample, GpuReading):
            node = nodes.touch(sample.node or LOCAL_NODE, now)
            node.devices[sample.key] = _read(node.devices.get(sample.key), sample, plan, now)
            sources[sample.source] = _heard(source, sample.taken_at)
        elif isinstance(sample, DeviceProcesses):
            node = nodes.touch(sample.node or LOCAL_NODE, now)
            node.devices[sample.key] = _processes(node.devices.get(sample.key), sample)
            sources[sample.source] = _heard(source, sample.taken_at)
        elif isinstance(sample, DeviceGone | NodeDevices):
            _forget(nodes, sample)
        elif isinstance(sample, EngineSample):
            engines[sample.source] = sample
            if plan.keeps_any():
                history = engine_history.get(sample.source, EMPTY_HISTORY)
                engine_history[sample.source] = extend_engine(history, sample, plan, now)
            else:
                engine_history.pop(sample.source, None)
            sources[sample.source] = _heard(source, sample.taken_at, fault=sample.error)
        elif isinstance(sample, PodResourcesReading):
            nodes.touch(sample.node or LOCAL_NODE, now).attribute(sample)
            sources[sample.source] = _heard(source, sample.taken_at)
        elif isinstance(sample, AgentsReading):
            agents = sample
            sources[sample.source] = _heard(source, sample.taken_at, fault=sample.error)
        elif isinstance(sample, PodsReading):
            if pods is None or sample.pods != pods.pods:
                pod_index = index_pods(sample.pods)
            pods = sample
            sources[sample.source] = _heard(source, sample.taken_at)
        elif isinstance(sample, ResourceSlicesReading):
            resource_slices = sample
            sources[sample.source] = _heard(source, sample.taken_at)
            nodes.touch(LOCAL_NODE, None)  # its DRA devices are joined again
        else:
            if sample.key is None:
                source = msgspec.structs.replace(source, fault=sample.reason, fault_at=sample.at)
                if sample.source == RESOURCE_SLICES_SOURCE:
                    nodes.touch(LOCAL_NODE, None)  # the join says why it cannot read them
            elif sample.lost:
                node = nodes.touch(node_of(sample.key), None)
                node.devices[sample.key] = _mark_lost(node.devices.get(sample.key), sample)
            sources[sample.source] = msgspec.structs.replace(source, faults=source.faults + 1)

    def slices() -> Slices:
        reason = slices_unavailable_reason(sources, resource_slices, now)
        return Slices.of(resource_slices, reason)

    views, count, pod_nodes, attributed_until = nodes.finish(snapshot, slices)
    return Snapshot(
        version=snapshot.version + 1,
        published_at=now,
        nodes=views,
        device_count=count,
        sources=MappingProxyType(sources),
        engines=MappingProxyType(engines),
        engine_history=MappingProxyType(engine_history),
        pods=pods,
        pod_index=pod_index,
        pod_nodes=pod_nodes,
        attributed_until=attributed_until,
        resource_slices=resource_slices,
        agents=agents,
    )


_CYCLES = (
    Batch | GpuReading | EngineSample | PodResourcesReading | PodsReading | ResourceSlicesReading
)
"""Samples that are one sampler cycle each."""


class _Node:
    """A node's view being rebuilt within one fold."""

    __slots__ = ("attribution", "devices", "last_heard_at", "name", "reindex")

    def __init__(self, view: NodeView) -> None:
        self.name = view.name
        self.devices: dict[DeviceKey, DeviceState] = _thaw(view.devices)
        self.attribution = view.attribution
        self.last_heard_at = view.last_heard_at
        self.reindex = False

    def attribute(self, reading: PodResourcesReading) -> None:
        old = self.attribution
        if (
            old is None
            or (reading.holders is not old.holders and reading.holders != old.holders)
            or (reading.dra is not old.dra and reading.dra != old.dra)
        ):
            self.reindex = True
        self.attribution = reading


class NodeBuilder:
    """The node views of one fold: untouched ones are kept as they are; touched ones are
    rebuilt, and the indexes by pod with them, by :meth:`finish`."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._old = snapshot.nodes
        self._touched: dict[str, _Node] = {}
        self._removed: set[str] = set()

    def touch(self, name: str, heard_at: float | None) -> _Node:
        node = self._touched.get(name)
        if node is None:
            view = self._old.get(name) if name not in self._removed else None
            node = self._touched[name] = _Node(view or NodeView(name=name))
            if name in self._removed:  # gone and back within one batch: index it anew
                node.reindex = True
                self._removed.discard(name)
        if heard_at is not None:
            node.last_heard_at = heard_at
        return node

    def stopped(self, stopped: SourceStopped) -> None:
        """A source stopped on purpose: the attribution it published goes, and a link to a
        node agent that left takes its node's view with it."""
        for name in [n for n in {*self._old, *self._touched} if n not in self._removed]:
            devices, attribution = self._current(name)
            published = attribution is not None and _under(attribution.source, stopped)
            if name != LOCAL_NODE and (
                published or any(_published_by(d, stopped.source) for d in devices.values())
            ):
                self._touched.pop(name, None)
                self._removed.add(name)
            elif published:
                node = self.touch(name, None)
                node.attribution = None
                node.reindex = True

    def _current(
        self, name: str
    ) -> tuple[Mapping[DeviceKey, DeviceState], PodResourcesReading | None]:
        node = self._touched.get(name)
        if node is not None:
            return node.devices, node.attribution
        view = self._old[name]
        return view.devices, view.attribution

    def finish(
        self, snapshot: Snapshot, slices: Callable[[], Slices]
    ) -> tuple[Mapping[str, NodeView], int, Mapping[PodKey, frozenset[str]], float]:
        """The views, the device count, the index of pods by node and when the freshest
        attribution goes stale; ``slices`` is what the DRA join of a node agent's own
        devices reads (asked only when there is one to join)."""
        if not self._touched and not self._removed:
            return (
                snapshot.nodes,
                snapshot.device_count,
                snapshot.pod_nodes,
                snapshot.attributed_until,
            )
        views = _thaw(self._old)
        count = snapshot.device_count
        pod_nodes: dict[PodKey, frozenset[str]] | None = None
        recount_attribution = False
        attributed_until = snapshot.attributed_until
        for name in self._removed:
            view = views.pop(name, None)
            if view is None:
                continue
            count -= len(view.devices)
            if view.by_pod:
                pod_nodes = _unindex(_copy(pod_nodes, snapshot), name, view.by_pod)
            recount_attribution = recount_attribution or view.attribution is not None
        for name, node in self._touched.items():
            old = views.get(name)
            count += len(node.devices) - (0 if old is None else len(old.devices))
            kept = old if old is not None else NodeView(name=name)
            by_pod, by_device, unidentified = kept.by_pod, kept.by_device, kept.unidentified
            dra = _joined(node, kept.dra, slices)
            if dra is not kept.dra:
                node.reindex = True
            if node.reindex:
                if by_pod:
                    pod_nodes = _unindex(_copy(pod_nodes, snapshot), name, by_pod)
                by_pod, by_device, unidentified = index_holders(node.attribution, dra)
                if by_pod:
                    pod_nodes = _copy(pod_nodes, snapshot)
                    for pod in by_pod:
                        pod_nodes[pod] = pod_nodes.get(pod, frozenset()) | {name}
                recount_attribution = recount_attribution or node.attribution is None
            a = node.attribution
            if a is not None and name != LOCAL_NODE:
                attributed_until = max(attributed_until, a.taken_at + stale_limit_s(a.period_s))
            views[name] = NodeView(
                name=name,
                devices=MappingProxyType(node.devices),
                attribution=node.attribution,
                by_pod=by_pod,
                by_device=by_device,
                dra=dra,
                unidentified=unidentified,
                last_heard_at=node.last_heard_at,
            )
        if recount_attribution:
            attributed_until = max(
                (
                    v.attribution.taken_at + stale_limit_s(v.attribution.period_s)
                    for n, v in views.items()
                    if v.attribution is not None and n != LOCAL_NODE
                ),
                default=-math.inf,
            )
        return (
            MappingProxyType(views),
            count,
            snapshot.pod_nodes if pod_nodes is None else MappingProxyType(pod_nodes),
            attributed_until,
        )


def _joined(
    node: _Node, kept: tuple[DraDevice, ...], slices: Callable[[], Slices]
) -> tuple[DraDevice, ...]:
    """The node's DRA devices joined: ``kept`` (the same object) while that is unchanged.

    A node agent's own (not joined yet) are joined on every fold that touches the node, as
    NVML's devices and the slices move; a cluster scaler's come joined from the agent."""
    a = node.attribution
    if a is None or not a.dra:
        return kept if not kept else ()
    if not node.reindex and all(d.outcome for d in a.dra):
        return kept
    prefix = f"{node.name}/" if node.name != LOCAL_NODE else ""
    joined = join_devices(a.dra, slices(), node.devices, prefix=prefix)
    return kept if joined == kept else joined


_K = TypeVar("_K")
_V = TypeVar("_V")


def _thaw(mapping: Mapping[_K, _V]) -> dict[_K, _V]:
    """A mutable copy. Snapshot maps are MappingProxyTypes, and ``dict(proxy)`` copies one
    key at a time; the proxy's own ``copy()`` is the dict's C copy, ten times faster."""
    if isinstance(mapping, MappingProxyType):
        return mapping.copy()
    return dict(mapping)


def _copy(
    pod_nodes: dict[PodKey, frozenset[str]] | None, snapshot: Snapshot
) -> dict[PodKey, frozenset[str]]:
    """The index of pods by node being rebuilt: the snapshot's, copied on first change."""
    return _thaw(snapshot.pod_nodes) if pod_nodes is None else pod_nodes


def _unindex(
    pod_nodes: dict[PodKey, frozenset[str]],
    name: str,
    by_pod: Mapping[PodKey, tuple[DeviceHolder, ...]],
) -> dict[PodKey, frozenset[str]]:
    """``pod_nodes`` without node ``name`` under the pods of ``by_pod``."""
    for pod in by_pod:
        left = pod_nodes.get(pod, frozenset()) - {name}
        if left:
            pod_nodes[pod] = left
        else:
            pod_nodes.pop(pod, None)
    return pod_nodes


def _under(source: str, stopped: SourceStopped) -> bool:
    return source == stopped.source or source.startswith(stopped.source + "/")


def _published_by(device: DeviceState, source: str) -> bool:
    return device.reading is not None and device.reading.source == source


def _read(
    device: DeviceState | None, reading: GpuReading, plan: HistoryPlan, now: float
) -> DeviceState:
    history = EMPTY_HISTORY
    if plan.keeps_any():
        history = extend_device(
            EMPTY_HISTORY if device is None else device.history, reading, plan, now
        )
    processes = None if device is None else device.processes
    return DeviceState(
        key=reading.key,
        index=reading.index,
        reading=reading,
        history=history,
        processes=processes,
    )


def _processes(device: DeviceState | None, processes: DeviceProcesses) -> DeviceState:
    if device is None:
        return DeviceState(key=processes.key, index=processes.index, processes=processes)
    return msgspec.structs.replace(device, processes=processes)


def _forget(nodes: NodeBuilder, sample: DeviceGone | NodeDevices) -> None:
    """Devices that no longer exist leave their node's view, whose DRA devices are joined
    again (another may now take their place)."""
    if isinstance(sample, DeviceGone):
        nodes.touch(node_of(sample.key), None).devices.pop(sample.key, None)
        return
    node = nodes.touch(sample.node, None)
    for key in node.devices.keys() - sample.keys:
        del node.devices[key]


def _count_cycle(sources: dict[str, SourceState], name: str) -> None:
    source = sources.get(name) or SourceState(name=name)
    sources[name] = msgspec.structs.replace(source, cycles=source.cycles + 1)


def _heard(source: SourceState, at: float, *, fault: str | None = None) -> SourceState:
    return msgspec.structs.replace(
        source,
        last_sample_at=at,
        fault=fault,
        fault_at=None if fault is None else at,
        samples=source.samples + 1,
        faults=source.faults + (fault is not None),
    )


def _mark_lost(device: DeviceState | None, fault: SourceFault) -> DeviceState:
    assert fault.key is not None
    if device is None:
        return DeviceState(
            key=fault.key, index=fault.index, lost_reason=fault.reason, lost_since=fault.at
        )
    since = device.lost_since if device.lost_reason is not None else fault.at
    return msgspec.structs.replace(device, lost_reason=fault.reason, lost_since=since)
