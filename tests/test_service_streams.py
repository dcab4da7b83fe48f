"""StreamIsActive semantics in virtual time: at once, on change, heartbeat, failures skipped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
import trio
from trio.testing import MockClock

from keda_gpu_scaler.serving._proto.externalscaler import GetMetricsRequest, ScaledObjectRef
from keda_gpu_scaler.serving.service import ExternalScalerService
from keda_gpu_scaler.sources.fake import FakeGpuSource
from keda_gpu_scaler.testing import CountingMeasure, open_test_service

Messages = list[tuple[float, bool]]


@asynccontextmanager
async def _served(source: FakeGpuSource) -> AsyncIterator[ExternalScalerService]:
    async with open_test_service(source) as served:
        yield served.service


async def _collect(
    service: ExternalScalerService, metadata: dict[str, str], into: Messages
) -> None:
    ref = ScaledObjectRef(name="so", namespace="ns", scaler_metadata=metadata)
    await _collect_ref(service, ref, into)


@pytest.mark.trio
async def test_sends_at_once_on_change_and_as_heartbeat(autojump_clock: MockClock) -> None:
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, gpu_utilization=50.0)
    got: Messages = []
    metadata = {"pollIntervalSeconds": "5", "activationThreshold": "10", "cooldownSeconds": "0"}
    async with _served(source) as service, anyio.create_task_group() as tg:
        t0 = anyio.current_time()
        tg.start_soon(_collect, service, metadata, got)
        await anyio.sleep(2.5)
        source.set(0, gpu_utilization=5.0)  # published at t0 + 3
        await anyio.sleep_until(t0 + 12.5)
        tg.cancel_scope.cancel()
    assert [(round(t - t0, 3), a) for t, a in got] == [
        (0.0, True),  # at once on open
        (3.0, False),  # on the change, with the sample that showed it
        (8.0, False),  # heartbeat every pollIntervalSeconds
    ]


@pytest.mark.trio
async def test_failed_readings_are_never_sent_as_activity(autojump_clock: MockClock) -> None:
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, gpu_utilization=50.0)
    got: Messages = []
    async with _served(source) as service, anyio.create_task_group() as tg:
        t0 = anyio.current_time()
        tg.start_soon(_collect, service, {"pollIntervalSeconds": "2", "cooldownSeconds": "0"}, got)
        await anyio.sleep(0.5)
        source.lose(0, "GPU is lost")  # from t0 + 1
        await anyio.sleep_until(t0 + 9.5)
        source.restore(0)  # from t0 + 10
        await anyio.sleep_until(t0 + 10.5)
        tg.cancel_scope.cancel()
    assert [(round(t - t0, 3), a) for t, a in got] == [(0.0, True), (10.0, True)]


@pytest.mark.trio
async def test_stale_source_pauses_the_stream(autojump_clock: MockClock) -> None:
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, gpu_utilization=50.0)
    got: Messages = []
    async with _served(source) as service, anyio.create_task_group() as tg:
        t0 = anyio.current_time()
        tg.start_soon(_collect, service, {"pollIntervalSeconds": "2", "cooldownSeconds": "0"}, got)
        await anyio.sleep(0.5)
        source.pause()  # last reading at t0; stale after t0 + 3
        await anyio.sleep_until(t0 + 20)
        tg.cancel_scope.cancel()
    assert [(round(t - t0, 3), a) for t, a in got] == [(0.0, True), (2.0, True)]


@pytest.mark.trio
async def test_shutdown_ends_streams_cleanly(autojump_clock: MockClock) -> None:
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, gpu_utilization=50.0)
    got: Messages = []
    async with open_test_service(source) as served:
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(_collect, served.service, {}, got)
            await anyio.sleep(1.5)
            assert served.streams.open_streams == 3
            served.streams.begin_shutdown()
            with anyio.fail_after(0.001):
                await served.streams.wait_streams_ended()
        assert served.streams.open_streams == 0
    assert len(got) == 3


@pytest.mark.trio
async def test_cancelled_stream_releases_its_slot(autojump_clock: MockClock) -> None:
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, gpu_utilization=50.0)
    async with open_test_service(source) as served:
        with anyio.move_on_after(3):
            await _collect(served.service, {}, [])
        assert served.streams.open_streams == 0


@pytest.mark.trio
async def test_two_triggers_of_one_object_keep_their_own_cooldown(
    autojump_clock: MockClock,
) -> None:
    # Two power_draw triggers of one ScaledObject, different only in their activation: each
    # holds its own value back, never the other's.
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, power_mw=300_000.0)
    low = {"metricType": "power_draw", "activationThreshold": "50", "cooldownSeconds": "60"}
    high = {**low, "activationThreshold": "250"}

    async def value(service: ExternalScalerService, metadata: dict[str, str]) -> float:
        ref = ScaledObjectRef(name="so", namespace="ns", scaler_metadata=metadata)
        request = GetMetricsRequest(scaled_object_ref=ref, metric_name="m")
        return (await service.get_metrics(request)).metric_values[0].metric_value_float

    async with open_test_service(source) as served:
        assert await value(served.service, low) == 300.0
        source.set(0, power_mw=200_000.0)
        await anyio.sleep(1.5)
        assert await value(served.service, low) == 200.0  # a decrease: its window starts
        source.set(0, power_mw=100_000.0)
        await anyio.sleep(1.0)
        assert await value(served.service, low) == 200.0  # held back within the window
        assert await value(served.service, high) == 100.0  # its own first value, not 200


@pytest.mark.trio
async def test_200_streams_with_one_spec_cost_one_evaluation_per_snapshot(
    autojump_clock: MockClock,
) -> None:
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, gpu_utilization=50.0)
    metadata = {"pollIntervalSeconds": "4", "activationThreshold": "10", "cooldownSeconds": "0"}
    counting = CountingMeasure()
    got: Messages = []
    async with open_test_service(source, measure=counting) as served:
        async with anyio.create_task_group() as tg:
            t0 = anyio.current_time()
            for i in range(200):
                ref = ScaledObjectRef(name=f"so-{i}", namespace="ns", scaler_metadata=metadata)
                tg.start_soon(_collect_ref, served.service, ref, got)
            await anyio.sleep(2.5)
            source.set(0, gpu_utilization=5.0)  # published at t0 + 3
            await anyio.sleep_until(t0 + 9.0)  # before any second heartbeat (9.4 at the soonest)
            tg.cancel_scope.cancel()
        hub = served.pipeline.hub
    versions = [version for _, version in counting.calls]
    assert len(versions) == len(set(versions))  # never twice for one snapshot
    assert len(versions) <= hub.current.version
    times = [round(t - t0, 3) for t, _ in got]
    assert len(got) == 3 * 200
    assert times.count(0.0) == times.count(3.0) == 200  # at once, and on the change
    # Then a heartbeat, 4 s after the change at the latest, each stream by its own amount
    # early (a fifth of the interval at most): 200 streams do not beat in the same turn.
    beats = sorted(t for t in times if t > 3.0)
    assert len(beats) == 200
    assert beats[0] >= 6.2 and beats[-1] <= 7.0
    assert beats[-1] - beats[0] > 0.75
    assert max(beats.count(t) for t in beats) <= 2
    assert all(active is (t < t0 + 3) for t, active in got)


async def _collect_ref(
    service: ExternalScalerService, ref: ScaledObjectRef, into: Messages
) -> None:
    async for message in service.stream_is_active(ref):
        into.append((anyio.current_time(), message.result))


class _DriverSteps(trio.abc.Instrument):
    """Counts the steps of the stream registry's driver task."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if "StreamRegistry.run" in task.name:
            self.steps += 1


@pytest.mark.trio
async def test_with_no_stream_open_the_driver_sleeps_through_snapshots(
    autojump_clock: MockClock,
) -> None:
    # A cluster scaler publishes a hundred snapshots a second; a driver with nothing to judge
    # must not wake for each.
    source = FakeGpuSource(1, period_s=0.1)
    source.set(0, gpu_utilization=50.0)
    steps = _DriverSteps()
    async with open_test_service(source) as served:
        trio.lowlevel.add_instrument(steps)
        first = served.pipeline.hub.current.version
        await anyio.sleep(10)
        assert served.pipeline.hub.current.version - first >= 90
        assert steps.steps <= 2
        # A stream opened now is still served at once.
        got: Messages = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(_collect, served.service, {"activationThreshold": "10"}, got)
            await anyio.sleep(0.5)
            tg.cancel_scope.cancel()
        trio.lowlevel.remove_instrument(steps)
    assert [active for _, active in got] == [True]
