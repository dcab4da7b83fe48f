"""The debug tap: never blocks the publisher, drops and counts for slow readers, filters."""

from __future__ import annotations

import json

import anyio
import pytest
from trio.testing import MockClock

from keda_gpu_scaler.domain.samples import (
    Batch,
    DeviceHolder,
    DeviceKey,
    GpuReading,
    PodResourcesReading,
    SourceFault,
)
from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT, DeviceState
from keda_gpu_scaler.pipeline.tap import Tap, TapDecision, TapEvent, TapFilter, tap_attribution
from keda_gpu_scaler.testing import agent_reading, snapshot_of


def _reading(index: int, source: str = "nvml") -> GpuReading:
    return GpuReading(
        source=source,
        key=DeviceKey(f"GPU-{index}"),
        index=index,
        uuid=f"GPU-{index}",
        name="g",
        taken_at=1.0,
        period_s=1.0,
        gpu_utilization=float(index),
    )


def _decision(trigger: str = "ns/a", metric: str = "m") -> TapDecision:
    return TapDecision(
        trigger=trigger,
        metric=metric,
        metric_type="gpu_utilization",
        rpc="GetMetrics",
        at=1.0,
        value=1.0,
        target=2.0,
        active=True,
        why="w",
    )


def test_publishing_without_readers_does_nothing() -> None:
    tap = Tap()
    tap.folded([Batch(source="nvml", samples=(_reading(0),))], EMPTY_SNAPSHOT)
    assert (tap.subscribers, tap.dropped) == (0, 0)


def test_a_stuck_reader_loses_events_and_they_are_counted() -> None:
    tap = Tap(max_buffer=10)
    stuck = tap.subscribe()
    for _ in range(1000):
        tap.publish(_decision())
    assert stuck.dropped == 990
    assert (tap.subscribers, tap.dropped) == (1, 990)


@pytest.mark.parametrize(
    ("tap_filter", "expected"),
    [
        (TapFilter(), ["s0", "s1", "f", "d"]),
        (TapFilter(source="replay"), ["s1"]),
        (TapFilter(device="1"), ["s1"]),
        (TapFilter(device="GPU-0"), ["s0", "f"]),
        (TapFilter(metric="m"), ["d"]),
        (TapFilter(metric="gpu_utilization"), ["d"]),
        (TapFilter(trigger="ns/b"), []),
    ],
)
def test_filters(tap_filter: TapFilter, expected: list[str]) -> None:
    events: dict[str, TapEvent] = {
        "s0": _reading(0),
        "s1": _reading(1, source="replay"),
        "f": SourceFault(source="nvml", key=DeviceKey("GPU-0"), at=1.0, reason="r", index=0),
        "d": _decision(),
    }
    assert [name for name, e in events.items() if tap_filter.accepts(e)] == expected


@pytest.mark.trio
async def test_reader_gets_json_lines_in_order(autojump_clock: MockClock) -> None:
    tap = Tap()
    subscription = tap.subscribe()
    got: list[dict[str, object]] = []

    async def read() -> None:
        with subscription:
            async for line in subscription:
                got.append(json.loads(line))
                if len(got) == 3:
                    return

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        await anyio.sleep(1)
        tap.folded([Batch(source="nvml", samples=(_reading(0), _reading(1)))], EMPTY_SNAPSHOT)
        tap.publish(_decision())
    assert [(e["type"], e.get("index")) for e in got] == [
        ("gpu", 0),
        ("gpu", 1),
        ("decision", None),
    ]
    assert (tap.subscribers, tap.dropped) == (0, 0)  # the reader returned: unsubscribed


def _held_by(node: str, index: int, pod: str) -> DeviceHolder:
    return DeviceHolder(
        namespace="serve",
        pod=pod,
        container="engine",
        resource="nvidia.com/gpu",
        device_id=f"GPU-{node}-{index}",
    )


def test_a_cluster_attribution_event_shows_the_devices_of_its_node_only() -> None:
    answers = {
        node: PodResourcesReading(
            source=f"agent/{node}/pod-resources",
            taken_at=10.0,
            period_s=5.0,
            node=node,
            holders=(_held_by(node, 0, f"vllm-{node}"),),
        )
        for node in ("node-a", "node-b")
    }
    readings = [agent_reading(n, i, 50.0, taken_at=10.0) for n in answers for i in (0, 1)]
    snapshot = snapshot_of(
        [DeviceState(key=r.key, index=r.index, reading=r) for r in readings],
        attributions=answers.values(),
        published_at=10.0,
    )
    event = tap_attribution(answers["node-b"], snapshot)
    assert [(d.key, [h.pod for h in d.holders]) for d in event.devices] == [
        ("node-b/GPU-node-b-0", ["vllm-node-b"])
    ]
    assert event.source == "agent/node-b/pod-resources"
