"""A device that no longer exists is forgotten by the fold at once, not left to go stale."""

from __future__ import annotations

import json

import pytest

from keda_gpu_scaler.domain.catalog import MetricType
from keda_gpu_scaler.domain.history import HistoryPlan
from keda_gpu_scaler.domain.samples import (
    Batch,
    DeviceGone,
    DeviceKey,
    DeviceProcesses,
    GpuReading,
    NodeDevices,
)
from keda_gpu_scaler.pipeline.state import fold
from keda_gpu_scaler.pipeline.tap import Tap, TapFilter
from keda_gpu_scaler.testing import agent_reading, snapshot_after

MIG = DeviceKey("MIG-a")


def _instance(uuid: str, taken_at: float, *, node: str = "") -> GpuReading:
    key = DeviceKey(f"{node}/{uuid}" if node else uuid)
    return GpuReading(
        source=f"agent/{node}" if node else "nvml",
        key=key,
        index=0,
        uuid=uuid,
        name="MIG 1g",
        taken_at=taken_at,
        period_s=1.0,
        sm_active=40.0,
        parent_index=0,
        parent_uuid="GPU-0",
        gpu_instance_id=7,
        node=node,
    )


def _gone(key: str, at: float) -> DeviceGone:
    return DeviceGone(source="nvml", key=DeviceKey(key), at=at, reason="r", index=0)


def test_a_gone_device_leaves_the_snapshot_with_its_history_and_processes() -> None:
    plan = HistoryPlan(seconds=60, metrics=frozenset({MetricType.SM_ACTIVE}))
    processes = DeviceProcesses(source="nvml", key=MIG, index=0, taken_at=1.0, period_s=5.0)
    first = [Batch(source="nvml", samples=(_instance("MIG-a", 1.0), _instance("MIG-b", 1.0)))]
    snapshot = snapshot_after([*first, processes], 1.0)
    snapshot = fold(
        snapshot, [Batch(source="nvml", samples=(_instance("MIG-a", 2.0),))], 2.0, plan=plan
    )
    assert len(snapshot.devices[MIG].history) == 1
    kept = snapshot.devices[DeviceKey("MIG-b")]
    after = fold(snapshot, [Batch(source="nvml", samples=(_gone("MIG-a", 2.5),))], 2.5, plan=plan)
    assert list(after.devices) == ["MIG-b"]
    assert after.device_count == 1
    assert after.devices[DeviceKey("MIG-b")] is kept
    # A device it never had, or had already forgotten: nothing to do.
    again = fold(after, [_gone("MIG-a", 3.0), _gone("MIG-z", 3.0)], 3.0)
    assert list(again.devices) == ["MIG-b"]


def test_a_gone_device_of_one_node_leaves_the_other_nodes_as_they_were() -> None:
    snapshot = snapshot_after(
        [_instance("MIG-a", 1.0, node="n1"), agent_reading("n2", 0, 5.0, taken_at=1.0)], 1.0
    )
    n2 = snapshot.nodes["n2"]
    after = fold(snapshot, [_gone("n1/MIG-a", 2.0)], 2.0)
    assert (list(after.nodes["n1"].devices), after.device_count) == ([], 1)
    assert after.nodes["n2"] is n2


@pytest.mark.trio
async def test_the_tap_shows_a_gone_device_and_filters_it_by_its_gpu_or_key() -> None:
    tap = Tap()
    filters = [TapFilter(device="0"), TapFilter(device="MIG-a"), TapFilter(device="1")]
    subscriptions = [tap.subscribe(f) for f in filters]
    snapshot = snapshot_after([_instance("MIG-a", 1.0)], 1.0)
    tap.folded([Batch(source="nvml", samples=(_gone("MIG-a", 2.0),))], snapshot)
    got = []
    for subscription in subscriptions:
        subscription.close()
        got.append([json.loads(line) async for line in subscription])
    event = {"type": "gone", "source": "nvml", "key": "MIG-a", "at": 2.0, "reason": "r", "index": 0}
    assert got == [[event], [event], []]


def test_a_node_agents_list_of_its_devices_forgets_the_others_of_its_node_only() -> None:
    snapshot = snapshot_after(
        [
            agent_reading("n1", 0, 5.0, taken_at=1.0),
            _instance("MIG-a", 1.0, node="n1"),
            _instance("MIG-b", 1.0, node="n1"),
            agent_reading("n2", 0, 5.0, taken_at=1.0),
        ],
        1.0,
    )
    n2 = snapshot.nodes["n2"]
    listed = NodeDevices(
        source="agent/n1",
        node="n1",
        at=2.0,
        keys=frozenset({DeviceKey("n1/GPU-n1-0"), DeviceKey("n1/MIG-b"), DeviceKey("n1/MIG-new")}),
    )
    # The list comes first in its batch: devices read after it are the node's own.
    batch = Batch(source="agent/n1", samples=(listed, _instance("MIG-new", 2.0, node="n1")))
    after = fold(snapshot, [batch], 2.0)
    assert sorted(after.nodes["n1"].devices) == ["n1/GPU-n1-0", "n1/MIG-b", "n1/MIG-new"]
    assert after.device_count == 4
    assert after.nodes["n2"] is n2
