"""NodeAgent.WatchNode, the node agent's stream to a cluster scaler.

In virtual time first (the servicer alone on a hub: what it sends, when, and what a slow
reader gets), then from the real node agent over real sockets, with grpclib and with
Google's grpcio: identity then updates, absent fields absent, a slow reader's bounded cost,
and streams that end OK on shutdown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest
from grpclib.client import Channel
from grpclib.config import Configuration
from grpclib.const import Cardinality
from trio.testing import MockClock

from keda_gpu_scaler import __version__
from keda_gpu_scaler._proto_agent.kedagpuscaler.v1 import (
    NodeAgentStub,
    NodeReadings,
    NodeUpdate,
    WatchNodeRequest,
)
from keda_gpu_scaler.domain.samples import (
    Batch,
    DeviceGone,
    DeviceKey,
    DeviceProcesses,
    GpuReading,
    PodResourcesReading,
    PodsReading,
    ProcessUse,
    Sample,
    SourceFault,
)
from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT, Snapshot
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.state import fold
from keda_gpu_scaler.serving.node_agent import NodeAgentService, UpdateBuilder
from keda_gpu_scaler.serving.telemetry import NoTelemetry
from keda_gpu_scaler.sources.fake import FakeGpuSource
from tests.fake_agent import WATCH_NODE, FakeAttribution, holder, serve_agent
from tests.grpcio_client import GrpcioModules, watch_node
from tests.loopback import loopback_scaler
from tests.waiting import wait_until

NODE = "gpu-node-1"


def _reading(
    index: int = 0, *, taken_at: float, period_s: float = 1.0, **values: Any
) -> GpuReading:
    return GpuReading(
        source="nvml",
        key=DeviceKey(f"GPU-{index:04d}"),
        index=index,
        uuid=f"GPU-{index:04d}",
        name="NVIDIA H200",
        taken_at=taken_at,
        period_s=period_s,
        **values,
    )


class _Hub:
    """A hub and the fold, so a test publishes samples as the aggregator would."""

    def __init__(self) -> None:
        self.hub = SnapshotHub()

    def publish(self, *samples: Sample) -> Snapshot:
        snapshot = fold(self.hub.current, samples, anyio.current_time())
        self.hub.publish(snapshot)
        return snapshot


def _kind(update: NodeUpdate) -> str:
    for kind in ("identity", "readings", "heartbeat"):
        if getattr(update, kind) is not None:
            return kind
    raise AssertionError(f"no kind in {update!r}")


def _service(hub: SnapshotHub, **options: Any) -> NodeAgentService:
    return NodeAgentService(hub, NODE, telemetry=NoTelemetry(), **options)


# --- in virtual time ------------------------------------------------------------------------


React = Callable[[int, NodeUpdate], Awaitable[None]]


async def _nothing(count: int, update: NodeUpdate) -> None:
    pass


async def _timeline(
    stream: AsyncIterator[NodeUpdate], n: int, react: React = _nothing
) -> list[tuple[float, str, NodeUpdate]]:
    """The first ``n`` messages, with when (from now) and what kind; ``react(count, update)``
    runs after each. The stream is then cancelled, as a client going away cancels it."""
    t0 = anyio.current_time()
    got: list[tuple[float, str, NodeUpdate]] = []
    with anyio.CancelScope() as scope:
        async for update in stream:
            if scope.cancel_called:
                continue
            got.append((round(anyio.current_time() - t0, 3), _kind(update), update))
            await react(len(got), update)
            if len(got) == n:
                scope.cancel()
    return got


def _times(got: list[tuple[float, str, NodeUpdate]]) -> list[tuple[float, str]]:
    return [(t, kind) for t, kind, _ in got]


@pytest.mark.trio
async def test_identity_then_readings_then_heartbeats_when_nothing_changes(
    autojump_clock: MockClock,
) -> None:
    feed = _Hub()
    feed.publish(_reading(taken_at=anyio.current_time() - 0.25, period_s=2.5))
    service = _service(feed.hub, agent_version="9.9")

    async def react(count: int, update: NodeUpdate) -> None:
        if count == 3:  # a new reading at 2.5 s: sent at once, the next heartbeat 2.5 s later
            feed.publish(_reading(taken_at=anyio.current_time(), period_s=2.5))

    got = await _timeline(service.watch_node(WatchNodeRequest()), 6, react)
    assert _times(got) == [
        (0.0, "identity"),
        (0.0, "readings"),
        (2.5, "heartbeat"),
        (2.5, "readings"),
        (5.0, "heartbeat"),
        (7.5, "heartbeat"),
    ]
    identity = got[0][2].identity
    assert identity is not None
    assert (identity.node_name, identity.agent_version, identity.sample_period_s) == (
        NODE,
        "9.9",
        2.5,
    )
    first = got[1][2].readings
    assert first is not None
    assert first.devices[0].age_s == pytest.approx(0.25)


@pytest.mark.trio
async def test_before_any_reading_the_identity_names_1_s_and_heartbeats_follow_it(
    autojump_clock: MockClock,
) -> None:
    service = _service(SnapshotHub())
    got = await _timeline(service.watch_node(WatchNodeRequest()), 3)
    assert _times(got) == [(0.0, "identity"), (1.0, "heartbeat"), (2.0, "heartbeat")]
    identity = got[0][2].identity
    assert identity is not None and identity.sample_period_s == 1.0


@pytest.mark.trio
async def test_a_slow_reader_gets_the_newest_snapshot_not_a_backlog(
    autojump_clock: MockClock,
) -> None:
    feed = _Hub()
    feed.publish(_reading(taken_at=anyio.current_time(), gpu_utilization=1.0))
    service = _service(feed.hub)

    async def react(count: int, update: NodeUpdate) -> None:
        if count == 2:
            for value in range(2, 50):  # published while the reader reads nothing
                await anyio.sleep(0.01)
                feed.publish(_reading(taken_at=anyio.current_time(), gpu_utilization=float(value)))

    got = await _timeline(service.watch_node(WatchNodeRequest()), 3, react)
    values = [u.readings.devices[0].gpu_utilization for _, _, u in got if u.readings is not None]
    assert values == [1.0, 49.0]
    # Two updates of the hub's 49 snapshots went out, the first and the newest: the 47
    # between them never did.
    assert [kind for _, kind, _ in got] == ["identity", "readings", "readings"]
    assert feed.hub.current.version == 49


@pytest.mark.trio
async def test_a_snapshot_that_changes_nothing_sent_is_not_sent(autojump_clock: MockClock) -> None:
    feed = _Hub()
    feed.publish(_reading(taken_at=anyio.current_time()))
    service = _service(feed.hub)

    async def react(count: int, update: NodeUpdate) -> None:
        if count == 2:
            await anyio.sleep(0.5)  # the pod watch's set, unchanged: the only news
            now = anyio.current_time()
            feed.publish(PodsReading(source="pods", taken_at=now, period_s=10, node=NODE))

    got = await _timeline(service.watch_node(WatchNodeRequest()), 3, react)
    assert _times(got) == [(0.0, "identity"), (0.0, "readings"), (1.0, "heartbeat")]


@pytest.mark.trio
async def test_shutdown_ends_every_stream(autojump_clock: MockClock) -> None:
    feed = _Hub()
    feed.publish(_reading(taken_at=anyio.current_time()))
    service = _service(feed.hub)
    ended: list[int] = []

    async def watch() -> None:
        ended.append(len([u async for u in service.watch_node(WatchNodeRequest())]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        tg.start_soon(watch)
        await anyio.sleep(0.5)
        assert service.open_streams == 2
        service.begin_shutdown()
        with anyio.fail_after(0.01):
            await service.wait_streams_ended()
    assert ended == [2, 2]  # identity and readings, then the end
    assert service.open_streams == 0
    assert [u async for u in service.watch_node(WatchNodeRequest())] == []


def test_ages_are_the_agents_clock_minus_taken_at_and_absent_stays_absent() -> None:
    agent_now = 3 * 3600.0 + 100.0
    reading = _reading(
        taken_at=agent_now - 0.75, gpu_utilization=0.0, sm_active=12.5, memory_used_bytes=0
    )
    lost = SourceFault(
        source="nvml",
        key=DeviceKey("GPU-0001"),
        at=agent_now - 4,
        reason="fell off",
        index=1,
        lost=True,
    )
    fault = SourceFault(source="pod-resources", key=None, at=agent_now - 2, reason="no socket")
    snapshot = fold(
        EMPTY_SNAPSHOT, [Batch(source="nvml", samples=(reading, lost)), fault], agent_now - 1
    )
    update = UpdateBuilder().update(snapshot, agent_now)
    assert update is not None
    [device] = update.devices
    assert device.age_s == pytest.approx(0.75)
    assert (device.gpu_utilization, device.sm_active, device.memory_used_bytes) == (0.0, 12.5, 0)
    assert device.nvlink_tx_mbps is None and device.sm_occupancy is None
    assert device.parent_index is None and device.gpu_instance_id is None
    wire = NodeReadings.parse(bytes(update))
    assert wire.devices[0].gpu_utilization == 0.0  # a zero is sent, present
    assert wire.devices[0].power_mw is None  # an absent reading is not
    [gone] = wire.lost
    assert (gone.key, gone.index, gone.reason, gone.lost_for_s) == ("GPU-0001", 1, "fell off", 4.0)
    [failing] = wire.faults
    assert (failing.source, failing.reason, failing.age_s) == ("pod-resources", "no socket", 2.0)
    assert wire.attribution is None


def test_attribution_goes_once_per_kubelet_answer_and_its_lists_only_when_they_change() -> None:
    builder = UpdateBuilder()
    gpu = _reading(taken_at=0.0)
    a = (holder("llm-0", "GPU-0000"),)

    def answer(at: float, holders: tuple[Any, ...]) -> PodResourcesReading:
        return PodResourcesReading(
            source="pod-resources", taken_at=at, period_s=5.0, holders=holders
        )

    def sent(snapshot: Snapshot, now: float) -> Any:
        update = builder.update(snapshot, now)
        assert update is not None
        return update.attribution

    s1 = fold(EMPTY_SNAPSHOT, [gpu, answer(0.5, a)], 1.0)
    first = sent(s1, 1.0)
    assert (first.same_holders, [h.pod for h in first.holders], first.age_s) == (
        False,
        ["llm-0"],
        0.5,
    )
    s2 = fold(s1, [msgspec.structs.replace(gpu, taken_at=1.0)], 1.0)
    assert sent(s2, 1.5) is None  # the same kubelet answer: not again
    s3 = fold(s2, [answer(5.5, a)], 5.5)
    again = sent(s3, 6.0)
    assert (again.same_holders, again.holders, again.period_s) == (True, [], 5.0)
    b = (*a, holder("llm-1", "GPU-0001::1"))
    s4 = fold(s3, [answer(10.5, b)], 10.5)
    changed = sent(s4, 11.0)
    assert changed.same_holders is False
    assert [(h.pod, h.device_id) for h in changed.holders] == [
        ("llm-0", "GPU-0000"),
        ("llm-1", "GPU-0001::1"),
    ]
    assert builder.update(s4, 12.0) is None


# --- over the network, from the real node agent ---------------------------------------------


@pytest.fixture
async def agent(fake_gpus: FakeGpuSource) -> AsyncIterator[Any]:
    kubelet = FakeAttribution([holder("llm-0", "GPU-fake-0000")], period_s=0.2)
    async with loopback_scaler(fake_gpus, node_name=NODE, samplers=[kubelet]) as running:
        await running.hub.wait_newer(0)
        yield running


async def _first(n: int, stream: AsyncIterator[NodeUpdate]) -> list[NodeUpdate]:
    got: list[NodeUpdate] = []
    async for update in stream:
        got.append(update)
        if len(got) == n:
            break
    return got


@pytest.mark.anyio
async def test_identity_then_updates_over_grpclib(agent: Any) -> None:
    async with Channel("127.0.0.1", agent.port) as channel:
        with anyio.fail_after(5):
            got = await _first(4, NodeAgentStub(channel).watch_node(WatchNodeRequest()))
    identity = got[0].identity
    assert identity is not None
    assert (identity.node_name, identity.agent_version, identity.sample_period_s) == (
        NODE,
        __version__,
        0.2,
    )
    updates = [u.readings for u in got[1:] if u.readings is not None]
    assert updates and all(u.identity is None for u in got[1:])
    busy, idle = updates[0].devices
    assert (busy.key, busy.index, busy.uuid, busy.name) == (
        "GPU-fake-0000",
        0,
        "GPU-fake-0000",
        "Fake GPU",
    )
    assert (busy.gpu_utilization, busy.memory_used_bytes, busy.sm_active) == (87.0, 60 << 30, 55.0)
    assert (idle.gpu_utilization, idle.sm_active) == (3.0, 0.0)
    assert busy.nvlink_tx_mbps is None and busy.memory_utilization is None
    assert busy.period_s == 0.2 and 0 <= busy.age_s < 0.5
    with_attribution = [u.attribution for u in updates if u.attribution is not None]
    assert [h.pod for h in with_attribution[0].holders] == ["llm-0"]


@pytest.mark.anyio
async def test_identity_then_updates_over_grpcio(agent: Any, grpcio_modules: GrpcioModules) -> None:
    watched = await anyio.to_thread.run_sync(watch_node, grpcio_modules, agent.port, 3)
    first, second = watched.messages[0], watched.messages[1]
    assert first.WhichOneof("update") == "identity"
    assert first.identity.node_name == NODE
    assert first.identity.sample_period_s == pytest.approx(0.2)
    assert second.WhichOneof("update") == "readings"
    busy, idle = second.readings.devices
    assert busy.key == "GPU-fake-0000" and busy.gpu_utilization == 87.0
    # Missing is absent, never 0: presence travels, whichever client reads it.
    assert busy.HasField("gpu_utilization") and idle.HasField("sm_active") and idle.sm_active == 0.0
    assert not busy.HasField("nvlink_tx_mbps") and not busy.HasField("parent_index")
    assert not watched.ended


@pytest.mark.anyio
async def test_lost_devices_and_failing_sources_travel(fake_gpus: FakeGpuSource) -> None:
    async with (
        loopback_scaler(fake_gpus, node_name=NODE) as running,
        Channel("127.0.0.1", running.port) as channel,
    ):
        await running.hub.wait_newer(0)
        fake_gpus.lose(1, "GPU has fallen off the bus")
        fake_gpus.crash_next_cycle("driver went away")
        lost: list[str] = []
        faults: list[str] = []
        with anyio.fail_after(5):
            async for update in NodeAgentStub(channel).watch_node(WatchNodeRequest()):
                if update.readings is not None:
                    lost += [f"{d.key}: {d.reason}" for d in update.readings.lost]
                    faults += [f"{f.source}: {f.reason}" for f in update.readings.faults]
                if lost and faults:
                    break
    assert lost[0] == "GPU-fake-0001: GPU has fallen off the bus"
    assert faults[0] == "fake: driver went away"


@pytest.mark.anyio
async def test_a_slow_reader_over_the_network_reads_the_newest_state_at_bounded_cost() -> None:
    feed = _Hub()
    devices = 128  # about 16 KiB per update: the reader's 64 KiB window holds a few only

    def cycle(value: float) -> list[GpuReading]:
        now = anyio.current_time()
        fields = {"gpu_utilization": value, "power_mw": 1e5, "temperature_c": 50.0}
        return [_reading(i, taken_at=now, **fields) for i in range(devices)]

    feed.publish(*cycle(0.0))
    config = Configuration(http2_connection_window_size=65535, http2_stream_window_size=65535)
    published = 500
    read = 0
    async with (
        serve_agent(feed.hub, NODE) as agent,
        Channel("127.0.0.1", agent.port, config=config) as channel,
        channel.request(
            WATCH_NODE, Cardinality.UNARY_STREAM, WatchNodeRequest, NodeUpdate
        ) as stream,
    ):
        await stream.send_message(WatchNodeRequest(), end=True)
        assert (await stream.recv_message()) is not None  # the identity
        for value in range(1, published + 1):  # while the reader reads nothing
            feed.publish(*cycle(float(value)))
            await anyio.lowlevel.checkpoint()
        with anyio.fail_after(5):
            while True:
                update = await stream.recv_message()
                assert update is not None and update.readings is not None
                read += 1
                if update.readings.devices[0].gpu_utilization == published:
                    break
        await stream.cancel()
    # The reader read every update the agent sent, up to the newest (after it nothing
    # changed): fewer than 12, and the hub's other snapshots were never sent.
    assert read < 12
    assert feed.hub.current.version - read > published - 12


@pytest.mark.anyio
async def test_streams_end_ok_on_shutdown_over_both_clients(
    fake_gpus: FakeGpuSource, grpcio_modules: GrpcioModules
) -> None:
    ends: dict[str, int] = {}
    with anyio.fail_after(10):
        async with (
            anyio.create_task_group() as clients,
            loopback_scaler(fake_gpus, node_name=NODE) as running,
        ):
            await running.hub.wait_newer(0)
            metrics = running.metrics
            assert running.node_agent is not None
            node_agent = running.node_agent

            async def over_grpclib() -> None:
                async with Channel("127.0.0.1", running.port) as channel:
                    stream = NodeAgentStub(channel).watch_node(WatchNodeRequest())
                    ends["grpclib"] = len([u async for u in stream])

            async def over_grpcio() -> None:
                watched = await anyio.to_thread.run_sync(
                    watch_node, grpcio_modules, running.port, 10**9
                )
                assert watched.ended
                ends["grpcio"] = len(watched.messages)

            clients.start_soon(over_grpclib)
            clients.start_soon(over_grpcio)
            await wait_until(lambda: node_agent.open_streams == 2)
            assert "keda_gpu_scaler_agent_streams 2.0" in metrics.render().decode()
    # Both clients saw the end with status OK (grpcio and grpclib raise for any other).
    assert set(ends) == {"grpclib", "grpcio"} and min(ends.values()) >= 2
    assert node_agent.open_streams == 0
    rendered = metrics.render().decode()
    assert "keda_gpu_scaler_agent_streams 0.0" in rendered
    assert 'keda_gpu_scaler_grpc_requests_total{code="OK",method="WatchNode"} 2.0' in rendered


def _processes(at: float, *, sm: float | None = 40.0, **fields: Any) -> DeviceProcesses:
    return DeviceProcesses(
        source="nvml",
        key=DeviceKey("GPU-0000"),
        index=0,
        taken_at=at,
        period_s=5.0,
        processes=(
            ProcessUse(pid=101, pod_uid="uid-a", container_id="c" * 64, sm=sm, memory=0.0),
            ProcessUse(pid=7, used_memory_bytes=1 << 30, sm=0.0, mps_server=True),
        ),
        **fields,
    )


def test_per_process_readings_go_once_each_and_in_a_streams_first_message() -> None:
    builder = UpdateBuilder()
    s1 = fold(EMPTY_SNAPSHOT, [_reading(taken_at=0.0), _processes(0.0)], 0.0)
    first = builder.update(s1, 0.5)
    assert first is not None
    [sent] = first.processes
    assert (sent.key, sent.index, sent.age_s, sent.period_s) == ("GPU-0000", 0, 0.5, 5.0)
    wire = NodeReadings.parse(bytes(first)).processes[0]
    a, server = wire.processes
    assert (a.pid, a.pod_uid, a.sm, a.memory, a.used_memory_bytes) == (
        101,
        "uid-a",
        40.0,
        0.0,
        None,
    )
    assert (server.mps_server, server.used_memory_bytes, server.pod_uid) == (True, 1 << 30, "")
    assert wire.memory_unsupported is None and wire.utilization_unsupported is None
    # A new device reading, the same per-process reading: not sent again.
    s2 = fold(s1, [_reading(taken_at=1.0)], 1.0)
    second = builder.update(s2, 1.0)
    assert second is not None and second.processes == []
    # A newer one is; what NVML could not say goes as it was said.
    why = "NVML gives no per-process utilization on this device"
    s3 = fold(s2, [_processes(5.0, sm=None, utilization_unsupported=why)], 5.0)
    third = builder.update(s3, 5.0)
    assert third is not None
    [newer] = NodeReadings.parse(bytes(third)).processes
    assert newer.utilization_unsupported == why
    assert newer.processes[0].sm is None  # absent, not 0
    # A new stream gets every device's newest at once.
    fresh = UpdateBuilder().update(s3, 6.0)
    assert fresh is not None and [p.age_s for p in fresh.processes] == [1.0]


def test_a_device_the_agent_forgot_is_left_out_of_a_message_that_lists_every_device() -> None:
    builder = UpdateBuilder()
    both = fold(
        EMPTY_SNAPSHOT,
        [Batch(source="nvml", samples=(_reading(0, taken_at=1.0), _reading(1, taken_at=1.0)))],
        1.0,
    )
    first = builder.update(both, 1.5)
    assert first is not None
    assert ([d.key for d in first.devices], first.lists_every_device) == (
        ["GPU-0000", "GPU-0001"],
        True,
    )
    went = DeviceGone(source="nvml", key=DeviceKey("GPU-0001"), at=2.0, reason="destroyed")
    one = fold(both, [Batch(source="nvml", samples=(went,))], 2.0)
    # Nothing else changed: the message is sent for the device that went.
    second = builder.update(one, 2.5)
    assert second is not None
    wire = NodeReadings.parse(bytes(second))
    assert ([d.key for d in wire.devices], wire.lost, wire.lists_every_device) == (
        ["GPU-0000"],
        [],
        True,
    )
