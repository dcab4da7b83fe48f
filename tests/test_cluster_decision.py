"""Decisions on a cluster scaler's snapshot: devices of several nodes (keys ``<node>/<uuid>``),
partial views by the coverage rule, ``nodeName``, and ``podSelector`` across nodes."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.domain.decision import decide, measure
from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData
from keda_gpu_scaler.domain.samples import (
    PODS_SOURCE,
    DeviceHolder,
    GpuReading,
    PodInfo,
    PodResourcesReading,
    PodsReading,
    SourceStopped,
)
from keda_gpu_scaler.domain.snapshot import DeviceState, Snapshot
from keda_gpu_scaler.domain.trigger import TriggerSpec, parse_trigger
from keda_gpu_scaler.pipeline.state import fold
from keda_gpu_scaler.testing import agent_reading, snapshot_of

NOW = 1000.0
NODES = ("node-a", "node-b", "node-c")
UTIL = {"node-a": (10.0, 20.0), "node-b": (30.0, 40.0), "node-c": (50.0, 60.0)}


def _reading(node: str, index: int, *, taken_at: float = NOW) -> GpuReading:
    return agent_reading(node, index, UTIL[node][index], taken_at=taken_at)


def _attribution(
    node: str, holders: list[tuple[str, int]], *, taken_at: float = NOW
) -> PodResourcesReading:
    return PodResourcesReading(
        source=f"agent/{node}/pod-resources",
        taken_at=taken_at,
        period_s=5.0,
        node=node,
        holders=tuple(
            DeviceHolder(
                namespace="serve",
                pod=pod,
                container="engine",
                resource="nvidia.com/gpu",
                device_id=f"GPU-{node}-{index}",
            )
            for pod, index in holders
        ),
    )


def _snapshot(*, stale: str | None = None, attribution_stale: str | None = None) -> Snapshot:
    readings = [
        _reading(node, i, taken_at=NOW - 10 if node == stale else NOW)
        for node in NODES
        for i in (0, 1)
    ]
    devices = {r.key: DeviceState(key=r.key, index=r.index, reading=r) for r in readings}
    # vllm-0 on node-a GPU 1, vllm-1 on node-b GPU 0, vllm-2 on node-c GPU 1; train elsewhere.
    attributions = {
        "node-a": _attribution("node-a", [("vllm-0", 1), ("train-0", 0)]),
        "node-b": _attribution("node-b", [("vllm-1", 0), ("train-0", 1)]),
        "node-c": _attribution(
            "node-c",
            [("vllm-2", 1)],
            taken_at=NOW - 30 if attribution_stale == "node-c" else NOW,
        ),
    }
    pods = tuple(
        PodInfo(namespace="serve", name=name, labels={"app": name.split("-")[0]}, phase="Running")
        for name in ("vllm-0", "vllm-1", "vllm-2", "train-0")
    )
    return snapshot_of(
        devices.values(),
        attributions=attributions.values(),
        pods=PodsReading(source=PODS_SOURCE, taken_at=NOW, period_s=10.0, node="", pods=pods),
        published_at=NOW,
    )


def _spec(**metadata: str) -> TriggerSpec:
    return parse_trigger(metadata, "serve")


def test_every_node_counts() -> None:
    assert measure(_spec(), _snapshot(), NOW).value == 60.0
    assert measure(_spec(aggregation="sum"), _snapshot(), NOW).value == 210.0


def test_a_workload_spread_over_three_nodes_gets_exactly_its_gpus() -> None:
    spec = _spec(podSelector="app=vllm", aggregation="sum")
    measured = measure(spec, _snapshot(), NOW)
    assert measured.value == 20.0 + 30.0 + 60.0
    why = decide(spec, _snapshot(), None, NOW).explanation
    assert "node-a GPU 1 (vllm-0)=20" in why
    assert "node-b GPU 0 (vllm-1)=30" in why


def test_a_node_missing_is_a_partial_view_down_to_min_coverage() -> None:
    snapshot = _snapshot(stale="node-c")  # 4 of 6 fresh: 0.67
    with pytest.raises(NoData, match=r"coverage 0\.67 is below minCoverage 0\.75") as caught:
        measure(_spec(), snapshot, NOW)
    assert "node-c GPU 0 reading is stale" in str(caught.value)
    spec = _spec(minCoverage="0.5")
    assert measure(spec, snapshot, NOW).value == 40.0
    assert "partial view: 4 of 6 devices fresh" in decide(spec, snapshot, None, NOW).explanation


def test_sum_is_never_partial() -> None:
    with pytest.raises(NoData, match="sum is never answered from a partial view"):
        measure(_spec(aggregation="sum", minCoverage="0.1"), _snapshot(stale="node-c"), NOW)


def test_a_stale_attribution_makes_that_nodes_devices_missing() -> None:
    snapshot = _snapshot(attribution_stale="node-c")
    spec = _spec(podSelector="app=vllm")  # 2 of 3 devices: below 0.75
    with pytest.raises(NoData, match="the attribution of node node-c is stale"):
        measure(spec, snapshot, NOW)
    assert measure(_spec(podSelector="app=vllm", minCoverage="0.6"), snapshot, NOW).value == 30.0


def test_gpu_index_and_mig_instance_need_a_node_name() -> None:
    with pytest.raises(InvalidTrigger, match=r"gpuIndex .*needs nodeName"):
        measure(_spec(gpuIndex="1"), _snapshot(), NOW)
    with pytest.raises(InvalidTrigger, match=r"migInstance .*needs nodeName"):
        measure(_spec(migInstance="0:1"), _snapshot(), NOW)
    assert measure(_spec(gpuIndex="1", nodeName="node-b"), _snapshot(), NOW).value == 40.0
    assert measure(_spec(nodeName="node-a"), _snapshot(), NOW).value == 20.0
    with pytest.raises(NoData, match="no GPU of node node-z reported"):
        measure(_spec(nodeName="node-z"), _snapshot(), NOW)


@pytest.mark.parametrize(
    ("key", "raw"),
    [("minCoverage", "0"), ("minCoverage", "1.5"), ("minCoverage", "x"), ("nodeName", "Node_A")],
)
def test_bad_cluster_keys_name_the_key_and_the_value(key: str, raw: str) -> None:
    with pytest.raises(InvalidTrigger) as caught:
        parse_trigger({key: raw})
    assert (caught.value.key, caught.value.value) == (key, raw)


def test_a_link_that_leaves_takes_its_nodes_devices_and_attribution() -> None:
    snapshot = fold(_snapshot(), [SourceStopped(source="agent/node-c")], NOW)
    assert {d.reading.node for d in snapshot.devices.values() if d.reading} == {"node-a", "node-b"}
    assert set(snapshot.node_attributions) == {"node-a", "node-b"}
    assert measure(_spec(), snapshot, NOW).value == 40.0
