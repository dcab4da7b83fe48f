"""Per-node state on a cluster scaler: a node's update rebuilds that node's view only, the
index of pods by node follows every change of holders, and a measurement that read nothing
a newer snapshot changed is kept for it."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keda_gpu_scaler.domain.decision import measure
from keda_gpu_scaler.domain.samples import (
    PODS_SOURCE,
    Batch,
    DeviceHolder,
    DeviceKey,
    GpuReading,
    PodInfo,
    PodResourcesReading,
    PodsReading,
    Sample,
    SourceFault,
    SourceStopped,
)
from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT, Snapshot, node_of
from keda_gpu_scaler.domain.trigger import parse_trigger
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.state import fold
from keda_gpu_scaler.serving.decider import Decider
from keda_gpu_scaler.testing import CountingMeasure, agent_reading

NOW = 100.0
NODES = ("node-a", "node-b", "node-c")


def _reading(node: str, gpu: int, value: float = 50.0, *, at: float = NOW) -> GpuReading:
    return agent_reading(node, gpu, value, taken_at=at)


def _update(node: str, value: float = 50.0, *, at: float = NOW) -> Batch:
    return Batch(
        source=f"agent/{node}", samples=tuple(_reading(node, g, value, at=at) for g in (0, 1))
    )


def _holders(node: str, pods: dict[int, str]) -> PodResourcesReading:
    return PodResourcesReading(
        source=f"agent/{node}/pod-resources",
        taken_at=NOW,
        period_s=5.0,
        node=node,
        holders=tuple(
            DeviceHolder(
                namespace="serve",
                pod=pod,
                container="main",
                resource="nvidia.com/gpu",
                device_id=f"GPU-{node}-{gpu}",
            )
            for gpu, pod in pods.items()
        ),
    )


def _pods(*names: str, at: float = NOW) -> PodsReading:
    return PodsReading(
        source=PODS_SOURCE,
        taken_at=at,
        period_s=10.0,
        node="",
        pods=tuple(
            PodInfo(namespace="serve", name=n, labels={"app": n.split("-")[0]}, phase="Running")
            for n in names
        ),
    )


def _cluster() -> Snapshot:
    return fold(
        EMPTY_SNAPSHOT,
        [
            *(_update(n) for n in NODES),
            _holders("node-a", {0: "vllm-0", 1: "train-0"}),
            _holders("node-b", {0: "vllm-1"}),
            _holders("node-c", {1: "train-1"}),
            _pods("vllm-0", "vllm-1", "train-0", "train-1"),
        ],
        NOW,
    )


def test_an_update_of_one_node_keeps_every_other_view_as_it_was() -> None:
    before = _cluster()
    after = fold(before, [_update("node-b", 70.0)], NOW + 1)
    assert after.nodes["node-a"] is before.nodes["node-a"]
    assert after.nodes["node-c"] is before.nodes["node-c"]
    assert after.nodes["node-b"] is not before.nodes["node-b"]
    assert after.pod_nodes is before.pod_nodes  # no holder changed
    assert after.pod_index is before.pod_index
    assert after.devices[DeviceKey("node-b/GPU-node-b-0")].reading.gpu_utilization == 70.0  # type: ignore[union-attr]
    assert len(after.devices) == after.device_count == 6


def test_the_same_holders_again_keep_the_index() -> None:
    before = _cluster()
    after = fold(before, [_holders("node-a", {0: "vllm-0", 1: "train-0"})], NOW + 5)
    assert after.pod_nodes is before.pod_nodes
    assert after.nodes["node-a"].by_pod is before.nodes["node-a"].by_pod
    assert after.nodes["node-a"].attribution is not before.nodes["node-a"].attribution


def test_a_pod_that_moves_moves_in_the_index() -> None:
    after = fold(
        _cluster(),
        [_holders("node-a", {0: "train-0"}), _holders("node-c", {0: "vllm-0", 1: "train-1"})],
        NOW,
    )
    assert after.pod_nodes[("serve", "vllm-0")] == frozenset({"node-c"})
    assert after.pod_nodes[("serve", "train-0")] == frozenset({"node-a"})
    spec = parse_trigger({"podSelector": "app=vllm", "aggregation": "sum"}, "serve")
    measured = measure(spec, after, NOW)
    assert sorted(measured.labels) == ["node-b GPU 0 (vllm-1)", "node-c GPU 0 (vllm-0)"]


def test_a_node_that_leaves_leaves_the_index() -> None:
    after = fold(_cluster(), [SourceStopped(source="agent/node-a")], NOW)
    assert set(after.nodes) == {"node-b", "node-c"}
    assert ("serve", "vllm-0") not in after.pod_nodes
    assert ("serve", "train-0") not in after.pod_nodes
    assert after.device_count == len(list(after.devices)) == 4


# -- the views against a model: whatever the order of samples ------------------------------

_NODE = st.sampled_from(NODES)
_PODS = st.dictionaries(
    st.sampled_from([0, 1, 2]), st.sampled_from(["p-0", "p-1", "p-2"]), max_size=3
)
_STEP = st.one_of(
    st.tuples(st.just("readings"), _NODE, st.sets(st.sampled_from([0, 1, 2]), max_size=3)),
    st.tuples(st.just("holders"), _NODE, _PODS),
    st.tuples(st.just("lost"), _NODE, st.sampled_from([0, 1, 2])),
    st.tuples(st.just("stopped"), _NODE, st.none()),
)


def _sample(step: tuple[str, str, object]) -> Sample:
    kind, node, arg = step
    if kind == "readings":
        assert isinstance(arg, set)
        return Batch(source=f"agent/{node}", samples=tuple(_reading(node, g) for g in sorted(arg)))
    if kind == "holders":
        assert isinstance(arg, dict)
        return _holders(node, arg)
    if kind == "lost":
        assert isinstance(arg, int)
        key = DeviceKey(f"{node}/GPU-{node}-{arg}")
        return SourceFault(source=f"agent/{node}", key=key, at=NOW, reason="fell off", lost=True)
    return SourceStopped(source=f"agent/{node}")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_STEP, min_size=1, max_size=4), max_size=8))
def test_views_and_indexes_agree_with_a_model(batches: list[list[tuple[str, str, object]]]) -> None:
    snapshot = EMPTY_SNAPSHOT
    devices: dict[str, set[str]] = {}
    read: set[str] = set()  # nodes with a reading (a lost device alone has none)
    holders: dict[str, dict[int, str]] = {}
    for batch in batches:
        for kind, node, arg in batch:
            if kind == "readings":
                assert isinstance(arg, set)
                devices.setdefault(node, set()).update(f"{node}/GPU-{node}-{g}" for g in arg)
                read.update([node] if arg else [])
            elif kind == "holders":
                assert isinstance(arg, dict)
                holders[node] = dict(arg)
                devices.setdefault(node, set())
            elif kind == "lost":
                assert isinstance(arg, int)
                devices.setdefault(node, set()).add(f"{node}/GPU-{node}-{arg}")
            else:
                # A link that leaves takes its node's view, if it published anything there.
                if node in read or node in holders:
                    devices.pop(node, None)
                    holders.pop(node, None)
                    read.discard(node)
        snapshot = fold(snapshot, [_sample(s) for s in batch], NOW)
    expected = sorted(k for keys in devices.values() for k in keys)
    assert sorted(snapshot.devices) == expected
    assert len(snapshot.devices) == snapshot.device_count == len(expected)
    for key in expected:
        assert key in snapshot.devices
        assert snapshot.devices[DeviceKey(key)].key == key
        assert node_of(DeviceKey(key)) in snapshot.nodes
    pod_nodes: dict[tuple[str, str], set[str]] = {}
    for node, pods in holders.items():
        for pod in pods.values():
            pod_nodes.setdefault(("serve", pod), set()).add(node)
    assert {k: set(v) for k, v in snapshot.pod_nodes.items()} == pod_nodes
    for pod_key, nodes in snapshot.pod_nodes.items():
        for node in nodes:
            assert pod_key in snapshot.nodes[node].by_pod


# -- one measurement for many versions -----------------------------------------------------


@pytest.mark.anyio
async def test_a_measurement_is_kept_while_only_other_nodes_change() -> None:
    hub = SnapshotHub()
    counting = CountingMeasure()
    decider = Decider(hub, measure=counting)
    spec = parse_trigger({"podSelector": "app=vllm"}, "serve")
    hub.publish(_cluster())
    first = decider.measurement(spec, hub.current, NOW)
    hub.publish(fold(hub.current, [_update("node-c", 90.0)], NOW + 0.5))  # train-1's node
    assert decider.measurement(spec, hub.current, NOW + 0.5) is first
    assert len(counting.calls) == 1
    hub.publish(fold(hub.current, [_update("node-a", 10.0, at=NOW + 0.6)], NOW + 0.6))
    again = decider.measurement(spec, hub.current, NOW + 0.6)
    assert len(counting.calls) == 2
    assert again.parts != first.parts


@pytest.mark.anyio
async def test_a_kept_measurement_still_ends_when_its_readings_go_stale() -> None:
    hub = SnapshotHub()
    counting = CountingMeasure()
    decider = Decider(hub, measure=counting)
    spec = parse_trigger({"podSelector": "app=vllm"}, "serve")
    hub.publish(_cluster())
    decider.measurement(spec, hub.current, NOW)
    later = NOW + 5  # node-a's and node-b's readings (1 s period) are stale by now
    hub.publish(fold(hub.current, [_update("node-c", at=later)], later))
    with pytest.raises(Exception, match="stale"):
        decider.measurement(spec, hub.current, later)
    assert len(counting.calls) == 2


@pytest.mark.anyio
async def test_a_node_that_joins_changes_every_gpu() -> None:
    hub = SnapshotHub()
    counting = CountingMeasure()
    decider = Decider(hub, measure=counting)
    spec = parse_trigger({"aggregation": "sum"}, "serve")
    hub.publish(_cluster())
    assert decider.measurement(spec, hub.current, NOW).value == 300.0
    hub.publish(fold(hub.current, [_update("node-d")], NOW))
    assert decider.measurement(spec, hub.current, NOW).value == 400.0
    assert len(counting.calls) == 2


def _instance(node: str, gi: int, temperature: float) -> GpuReading:
    uuid = f"MIG-{node}-0-{gi}"
    return GpuReading(
        source=f"agent/{node}",
        key=DeviceKey(f"{node}/{uuid}"),
        index=0,
        uuid=uuid,
        name="H200",
        taken_at=NOW,
        period_s=1.0,
        temperature_c=temperature,
        parent_index=0,
        parent_uuid=f"GPU-{node}-0",
        gpu_instance_id=gi,
        compute_instance_id=0,
        node=node,
    )


def test_mig_gpus_of_two_nodes_with_one_index_are_two_gpus() -> None:
    # A whole-GPU reading seen through instances counts once per GPU: per GPU of a node.
    snapshot = fold(
        EMPTY_SNAPSHOT,
        [
            Batch(
                source="agent/node-a",
                samples=(_instance("node-a", 1, 40.0), _instance("node-a", 2, 40.0)),
            ),
            Batch(
                source="agent/node-b",
                samples=(_instance("node-b", 1, 60.0), _instance("node-b", 2, 60.0)),
            ),
        ],
        NOW,
    )
    spec = parse_trigger({"metricType": "temperature", "aggregation": "avg"}, "serve")
    measured = measure(spec, snapshot, NOW)
    assert measured.labels == ("node-a GPU 0", "node-b GPU 0")
    assert measured.value == 50.0


def test_the_next_measurement_redoes_only_the_nodes_that_changed() -> None:
    spec = parse_trigger({"aggregation": "sum"}, "serve")
    before = _cluster()
    first = measure(spec, before, NOW)
    after = fold(before, [_update("node-b", 70.0)], NOW)
    second = measure(spec, after, NOW, first)
    assert second.node_parts["node-a"] is first.node_parts["node-a"]
    assert second.node_parts["node-c"] is first.node_parts["node-c"]
    assert second.node_parts["node-b"] is not first.node_parts["node-b"]
    assert second.value == measure(spec, after, NOW).value == 340.0


def test_a_pod_scope_is_kept_until_a_holder_or_a_pod_changes() -> None:
    spec = parse_trigger({"podSelector": "app=vllm", "aggregation": "sum"}, "serve")
    before = _cluster()
    first = measure(spec, before, NOW)
    kept = measure(spec, fold(before, [_update("node-a", 10.0)], NOW), NOW, first)
    assert kept.pods is not None and first.pods is not None
    assert kept.pods.groups is first.pods.groups  # the scope itself, not selected again
    assert kept.value == 60.0  # vllm-0 on node-a GPU 0 (10), vllm-1 on node-b GPU 0 (50)
    moved = fold(
        before, [_holders("node-c", {0: "vllm-2"}), _pods("vllm-0", "vllm-1", "vllm-2")], NOW
    )
    again = measure(spec, moved, NOW, first)
    assert again.pods is not None and first.pods is not None
    assert again.pods.groups is not first.pods.groups
    assert again.value == 150.0


def test_a_namespace_the_pod_watch_does_not_cover_is_unavailable_never_zero() -> None:
    from keda_gpu_scaler.domain.errors import NoData

    covering = msgspec.structs.replace(_pods("vllm-0"), namespaces=("other",), on_demand=True)
    snapshot = fold(_cluster(), [covering], NOW)
    spec = parse_trigger({"podSelector": "app=vllm"}, "serve")
    with pytest.raises(NoData, match="pods of namespace serve are not watched yet"):
        measure(spec, snapshot, NOW)


def test_snapshot_structs_stay_out_of_the_cyclic_collector() -> None:
    # A cluster scaler holds thousands of these and replaces them every second; tracked,
    # every collection of the young generations walks them (docs/benchmarks.md).
    import gc

    snapshot = _cluster()
    view = snapshot.nodes["node-a"]
    device = next(iter(view.devices.values()))
    for struct in (snapshot, view, device, snapshot.pod_index, snapshot.pods):
        assert not gc.is_tracked(struct), type(struct).__name__
    assert not gc.is_tracked(_update("node-a"))
    assert not gc.is_tracked(_holders("node-a", {0: "p"}))


# -- a measurement made from the previous one is the one made afresh ------------------------

_SPECS = [
    {"podSelector": "app=vllm", "aggregation": "avg", "minCoverage": "0.5"},
    {"podSelector": "app=train", "aggregation": "sum"},
    {"aggregation": "max", "minCoverage": "0.3"},
    {"nodeName": "node-b", "aggregation": "min"},
]
_EVENT = st.one_of(
    st.tuples(st.just("read"), _NODE, st.floats(0, 100), st.floats(0, 4)),
    st.tuples(
        st.just("holders"),
        _NODE,
        st.dictionaries(
            st.sampled_from([0, 1]), st.sampled_from(["vllm-0", "vllm-1", "train-0"]), max_size=2
        ),
        st.none(),
    ),
    st.tuples(
        st.just("pods"),
        st.none(),
        st.sets(st.sampled_from(["vllm-0", "vllm-1", "train-0"])),
        st.none(),
    ),
    st.tuples(st.just("stopped"), _NODE, st.none(), st.none()),
    st.tuples(st.just("wait"), st.none(), st.floats(0, 3), st.none()),
)


def _outcome(
    spec: object, snapshot: Snapshot, now: float, previous: object
) -> tuple[tuple[object, ...], object]:
    from keda_gpu_scaler.domain.decision import Measurement
    from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData

    assert previous is None or isinstance(previous, Measurement)
    try:
        m = measure(spec, snapshot, now, previous)  # type: ignore[arg-type]
    except (NoData, InvalidTrigger) as exc:
        return ("error", str(exc)), None
    return (m.value, m.parts, m.labels, m.unsupported, m.coverage, m.scope, m.fresh_until), m


def _decided(decider: Decider, spec: object, snapshot: Snapshot, now: float) -> tuple[object, ...]:
    from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData

    try:
        m = decider.measurement(spec, snapshot, now)  # type: ignore[arg-type]
    except (NoData, InvalidTrigger) as exc:
        return ("error", str(exc))
    return (m.value, m.parts, m.labels, m.unsupported, m.coverage, m.scope, m.fresh_until)


@settings(max_examples=200, deadline=None)
@given(st.lists(_EVENT, max_size=25))
def test_a_measurement_from_the_previous_one_is_the_same_as_afresh(
    events: list[tuple[str, str | None, object, object]],
) -> None:
    specs = [parse_trigger(m, "serve") for m in _SPECS]
    snapshot, now = _cluster(), NOW
    previous: list[object] = [None] * len(specs)
    hub = SnapshotHub()
    decider = Decider(hub)  # its cache, kept across versions by Basis, must agree too
    hub.publish(snapshot)
    for kind, node, a, b in events:
        if kind == "read":
            assert node is not None and isinstance(a, float) and isinstance(b, float)
            snapshot = fold(snapshot, [_update(node, a, at=now - b)], now)
        elif kind == "holders":
            assert node is not None and isinstance(a, dict)
            snapshot = fold(snapshot, [_holders(node, a)], now)
        elif kind == "pods":
            assert isinstance(a, set)
            snapshot = fold(snapshot, [_pods(*sorted(a), at=now)], now)
        elif kind == "stopped":
            snapshot = fold(snapshot, [SourceStopped(source=f"agent/{node}")], now)
        else:
            assert isinstance(a, float)
            now += a
        if snapshot.version > hub.current.version:
            hub.publish(snapshot)
        for i, spec in enumerate(specs):
            afresh, _ = _outcome(spec, snapshot, now, None)
            reused, made = _outcome(spec, snapshot, now, previous[i])
            assert reused == afresh, (spec, kind)
            previous[i] = made or previous[i]
            # A failure holds for its snapshot version (its reason may age meanwhile).
            decided = _decided(decider, spec, snapshot, now)
            assert decided[:1] == afresh[:1] if afresh[0] == "error" else decided == afresh


@pytest.mark.anyio
async def test_when_every_agent_is_gone_a_kept_zero_is_not_served() -> None:
    # A workload whose pods hold no GPU measures 0; once no node agent is left, that 0 must
    # not be served from the cache: with no attribution at all, the answer is UNAVAILABLE.
    from keda_gpu_scaler.domain.errors import NoData

    hub = SnapshotHub()
    decider = Decider(hub)
    spec = parse_trigger({"podSelector": "app=idle"}, "serve")
    # Every node's kubelet says no pod holds a GPU (nodes leaving then change no index).
    snapshot = fold(_cluster(), [_holders(node, {}) for node in NODES], NOW)
    hub.publish(fold(snapshot, [_pods("idle-0")], NOW))
    assert decider.measurement(spec, hub.current, NOW).value == 0.0
    for node in NODES:
        hub.publish(fold(hub.current, [SourceStopped(source=f"agent/{node}")], NOW))
    with pytest.raises(NoData, match="pod attribution is unavailable"):
        decider.measurement(spec, hub.current, NOW)


def test_a_lost_device_without_a_reading_held_by_a_selected_pod_is_missing_not_a_crash() -> None:
    # node-a's GPU 1 fell off the bus before it was ever read: the link sends it as lost.
    lost = SourceFault(
        source="agent/node-a",
        key=DeviceKey("node-a/GPU-node-a-9"),
        at=NOW,
        reason="fell off the bus",
        index=9,
        lost=True,
    )
    snapshot = fold(
        _cluster(), [lost, _holders("node-a", {0: "vllm-0", 9: "vllm-0", 1: "train-0"})], NOW
    )
    spec = parse_trigger({"podSelector": "app=vllm", "minCoverage": "0.5"}, "serve")
    measured = measure(spec, snapshot, NOW)
    assert "node-a GPU 9 (node-a/GPU-node-a-9) is lost: fell off the bus" in measured.coverage
