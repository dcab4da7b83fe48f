"""AgentLink: a cluster scaler's link to one node agent's WatchNode stream.

The stream's rules first (sans-I/O), then the link against real agents over real sockets on
127.0.0.1: the node agent itself, the WatchNode servicer on a hub the test feeds (an agent
clock hours off), and fake agents that die, hang, or send garbage. Backoff and idle limits
are short, real time, and waits are for events.
"""

from __future__ import annotations

import logging
import math
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream

from keda_gpu_scaler._proto_agent.kedagpuscaler import v1 as proto
from keda_gpu_scaler._proto_agent.kedagpuscaler.v1 import (
    Attribution,
    DeviceHolder,
    DeviceReading,
    Heartbeat,
    LostDevice,
    NodeIdentity,
    NodeReadings,
    NodeUpdate,
    SourceFault,
)
from keda_gpu_scaler.app.scaler.compose import open_scaler
from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.samples import (
    AgentTarget,
    Batch,
    DeviceGone,
    DeviceKey,
    DeviceProcesses,
    GpuReading,
    NodeDevices,
    PodResourcesReading,
    ProcessUse,
    Sample,
    SourceStopped,
)
from keda_gpu_scaler.domain.samples import SourceFault as Fault
from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT, stale_limit_s
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.state import fold
from keda_gpu_scaler.serving.tls import ReloadingTlsContext, TlsConfig
from keda_gpu_scaler.sources.agents import (
    AgentLink,
    AgentTlsConfig,
    AgentTlsConfigError,
    BadUpdate,
    StreamReader,
    build_agent_client_context,
)
from keda_gpu_scaler.sources.agents.codec import decode_update
from keda_gpu_scaler.sources.agents.link import _authority
from keda_gpu_scaler.sources.agents.pump import Watchdog
from keda_gpu_scaler.sources.fake import FakeGpuSource
from keda_gpu_scaler.testing import open_test_pipeline
from tests.fake_agent import (
    FakeAttribution,
    hanging_agent,
    holder,
    identity,
    readings,
    scripted_agent,
    serve_agent,
    serving_nothing,
)
from tests.loopback import loopback_scaler
from tests.test_tls import SERVICE_NAMES, Authority, Identity, _encrypted
from tests.waiting import wait_until

NODE = "gpu-node-1"
FAST = Backoff(initial_s=0.05, factor=2.0, maximum_s=0.2)


# --- the stream's rules, sans-I/O -------------------------------------------------------------


def _identity(node: str = NODE, period_s: float = 1.0, heartbeat_s: float = 1.0) -> NodeUpdate:
    return NodeUpdate(
        identity=NodeIdentity(node_name=node, sample_period_s=period_s, heartbeat_s=heartbeat_s)
    )


def _device(key: str = "GPU-aaa", **fields: Any) -> DeviceReading:
    values: dict[str, Any] = {
        "index": 0,
        "uuid": key,
        "name": "H200",
        "age_s": 0.5,
        "period_s": 1.0,
    }
    return DeviceReading(key=key, **{**values, **fields})


def _readings(*devices: DeviceReading, **fields: Any) -> NodeUpdate:
    return NodeUpdate(readings=NodeReadings(devices=list(devices), **fields))


def _receive(reader: StreamReader, update: NodeUpdate, received_at: float) -> tuple[Sample, ...]:
    """``update`` as a link receives it: encoded as the agent does, decoded by the codec."""
    return reader.receive(decode_update(bytes(update)), received_at)


def _identified(node: str = NODE) -> StreamReader:
    reader = StreamReader()
    assert _receive(reader, _identity(node), 0.0) == ()
    return reader


def test_readings_get_node_qualified_keys_and_dates_on_the_receivers_clock() -> None:
    reader = _identified()
    received_at = 1000.0
    [batch] = _receive(
        reader,
        _readings(_device(gpu_utilization=0.0, memory_used_bytes=7, age_s=0.25)),
        received_at,
    )
    assert isinstance(batch, Batch)
    assert batch.source == "agent/gpu-node-1"
    [reading] = batch.samples
    assert isinstance(reading, GpuReading)
    assert (reading.key, reading.node, reading.uuid, reading.source) == (
        "gpu-node-1/GPU-aaa",
        NODE,
        "GPU-aaa",
        "agent/gpu-node-1",
    )
    assert reading.taken_at == received_at - 0.25
    assert (reading.gpu_utilization, reading.memory_used_bytes) == (0.0, 7)
    assert reading.power_mw is None and reading.parent_index is None  # absent stays absent


def test_an_agent_listing_every_device_makes_the_receiver_forget_what_it_leaves_out() -> None:
    reader = _identified()
    lost = LostDevice(key="GPU-bbb", index=1, reason="fell off", lost_for_s=1.0)
    every = {"lists_every_device": True, "lost": [lost]}
    mig = _device("MIG-ccc", index=2)
    [first] = _receive(reader, _readings(_device(), mig, **every), 10.0)
    assert isinstance(first, Batch)
    # A stream's first readings list the node's devices, first: any other is forgotten.
    listed, *_ = first.samples
    assert isinstance(listed, NodeDevices)
    assert (listed.source, listed.node, listed.at) == ("agent/gpu-node-1", NODE, 10.0)
    assert listed.keys == {f"{NODE}/{k}" for k in ("GPU-aaa", "GPU-bbb", "MIG-ccc")}
    [same] = _receive(reader, _readings(_device(), mig, **every), 11.0)
    assert isinstance(same, Batch)
    assert not any(isinstance(s, NodeDevices | DeviceGone) for s in same.samples)
    # The instance is destroyed on the agent: left out of the next readings, it is gone.
    [later] = _receive(reader, _readings(_device(), **every), 12.0)
    assert isinstance(later, Batch)
    gone, *_ = later.samples
    assert isinstance(gone, DeviceGone)
    assert (gone.key, gone.index, gone.at, gone.source) == (
        f"{NODE}/MIG-ccc",
        2,
        12.0,
        "agent/gpu-node-1",
    )
    assert gone.reason == f"the node agent of {NODE} no longer has it: it no longer exists there"


def test_an_older_agent_that_does_not_list_every_device_has_nothing_forgotten() -> None:
    reader = _identified()
    for devices in ((_device(), _device("MIG-ccc")), (_device(),)):
        [batch] = _receive(reader, _readings(*devices), 10.0)
        assert isinstance(batch, Batch)
        assert all(isinstance(s, GpuReading) for s in batch.samples)


def test_a_nan_or_an_infinity_is_no_reading_and_the_rest_is_kept() -> None:
    update = _readings(
        _device(
            gpu_utilization=math.nan,
            power_mw=-math.inf,
            sm_active=12.5,
            memory_used_bytes=7,
            parent_uuid="GPU-parent",
            parent_index=0,
        )
    )
    [batch] = _receive(_identified(), update, 10.0)
    assert isinstance(batch, Batch)
    [reading] = batch.samples
    assert isinstance(reading, GpuReading)
    assert (reading.gpu_utilization, reading.power_mw) == (None, None)
    assert (reading.sm_active, reading.memory_used_bytes) == (12.5, 7)
    assert (reading.parent_uuid, reading.parent_index, reading.node) == ("GPU-parent", 0, NODE)


def test_lost_devices_faults_and_attribution_become_their_samples() -> None:
    reader = _identified()
    update = _readings(
        lost=[LostDevice(key="GPU-bbb", index=1, reason="fell off the bus", lost_for_s=3.0)],
        faults=[
            SourceFault(source="nvml", reason="driver gone", age_s=1.0),
            SourceFault(source="pod-resources", reason="no socket", age_s=2.0),
        ],
        attribution=Attribution(
            age_s=0.5,
            period_s=5.0,
            holders=[
                DeviceHolder(
                    namespace="ml",
                    pod="p",
                    container="c",
                    resource="nvidia.com/gpu",
                    device_id="GPU-aaa",
                )
            ],
        ),
    )
    attribution, batch = _receive(reader, update, 100.0)
    assert isinstance(attribution, PodResourcesReading) and isinstance(batch, Batch)
    assert (attribution.source, attribution.node, attribution.taken_at, attribution.period_s) == (
        "agent/gpu-node-1/pod-resources",
        NODE,
        99.5,
        5.0,
    )
    assert [(h.pod, h.device_id) for h in attribution.holders] == [("p", "GPU-aaa")]
    lost, gpu_fault, kubelet_fault = batch.samples
    assert lost == Fault(
        source="agent/gpu-node-1",
        key=DeviceKey("gpu-node-1/GPU-bbb"),
        at=97.0,
        reason="fell off the bus",
        index=1,
        lost=True,
    )
    assert isinstance(gpu_fault, Fault) and isinstance(kubelet_fault, Fault)
    assert (gpu_fault.source, gpu_fault.key, gpu_fault.at) == ("agent/gpu-node-1", None, 99.0)
    assert gpu_fault.reason == "nvml on node gpu-node-1: driver gone"
    assert kubelet_fault.source == "agent/gpu-node-1/pod-resources"
    # Same holders again: the link keeps the lists it had.
    again = _readings(attribution=Attribution(age_s=0.1, period_s=5.0, same_holders=True))
    repeated, _ = _receive(reader, again, 105.0)
    assert isinstance(repeated, PodResourcesReading)
    assert repeated.holders == attribution.holders and repeated.taken_at == 104.9


def test_a_fault_of_the_agents_pod_watch_is_its_own_source_not_its_readings() -> None:
    """An agent whose pod watch faults while its GPUs are read is not down: ``source_up``
    (a source's ``fault``) stays 1 for ``agent/<node>``, and the fault has its own series
    until the agent stops reporting it."""
    reader = _identified()
    watch_fault = SourceFault(source="pods", reason="403 Forbidden", age_s=1.0)
    snapshot = fold(
        EMPTY_SNAPSHOT, _receive(reader, _readings(_device(), faults=[watch_fault]), 10.0), 10.0
    )
    readings, watch = (
        snapshot.sources["agent/gpu-node-1"],
        snapshot.sources["agent/gpu-node-1/pods"],
    )
    assert readings.fault is None
    assert watch.fault == "pods on node gpu-node-1: 403 Forbidden"
    snapshot = fold(
        snapshot, _receive(reader, _readings(_device(), faults=[watch_fault]), 11.0), 11.0
    )
    assert snapshot.sources["agent/gpu-node-1/pods"].fault is not None  # still reported
    snapshot = fold(snapshot, _receive(reader, _readings(_device()), 12.0), 12.0)
    assert "agent/gpu-node-1/pods" not in snapshot.sources  # the agent's watch works again
    assert snapshot.sources["agent/gpu-node-1"].fault is None
    # The node forgotten (its agent gone): its own series go with it.
    snapshot = fold(
        snapshot, _receive(reader, _readings(_device(), faults=[watch_fault]), 13.0), 13.0
    )
    snapshot = fold(snapshot, [SourceStopped(source="agent/gpu-node-1")], 14.0)
    assert not [name for name in snapshot.sources if name.startswith("agent/gpu-node-1")]


def test_heartbeats_and_an_empty_node_are_not_garbage() -> None:
    reader = _identified()
    assert _receive(reader, NodeUpdate(heartbeat=Heartbeat()), 1.0) == ()
    [batch] = _receive(reader, _readings(), 2.0)
    assert isinstance(batch, Batch) and batch.samples == ()


@pytest.mark.parametrize(
    ("updates", "message"),
    [
        ([NodeUpdate()], "no known kind of update"),
        ([_readings(_device())], "the first message is readings, not the agent's identity"),
        ([NodeUpdate(heartbeat=Heartbeat())], "the first message is heartbeat"),
        ([_identity(), _identity("gpu-node-2")], "node name changed mid-stream, from gpu-node-1"),
        ([_identity(), _identity()], "a second identity"),
        ([_identity("")], "names no usable node: ''"),
        ([_identity("a/b")], "names no usable node: 'a/b'"),
        ([_identity(period_s=0.0)], "sample_period_s 0.0 is not a positive"),
        ([_identity(period_s=math.nan)], "sample_period_s nan"),
        ([_identity(heartbeat_s=0.0)], "heartbeat_s 0.0 is not a positive"),
        ([_identity(), _readings(_device(age_s=-1.0))], "GPU-aaa's age_s -1.0 is not"),
        ([_identity(), _readings(_device(age_s=math.inf))], "GPU-aaa's age_s inf"),
        ([_identity(), _readings(_device(period_s=0.0))], "GPU-aaa's period_s 0.0"),
        ([_identity(), _readings(_device(key=""))], "a device without a key"),
        ([_identity(), _readings(_device(), _device())], "device GPU-aaa twice"),
        (
            [_identity(), _readings(attribution=Attribution(period_s=5.0, same_holders=True))],
            "same holders as none before it",
        ),
    ],
)
def test_a_stream_that_breaks_its_rules_is_refused_with_the_reason(
    updates: list[NodeUpdate], message: str
) -> None:
    reader = StreamReader()
    *accepted, refused = updates
    for update in accepted:
        _receive(reader, update, 0.0)
    with pytest.raises(BadUpdate) as caught:
        _receive(reader, refused, 0.0)
    assert message in str(caught.value)


def test_an_identity_must_match_the_node_discovery_found() -> None:
    with pytest.raises(
        BadUpdate, match="says it is node gpu-node-2, discovery found it on gpu-node-1"
    ):
        _receive(StreamReader(expected_node=NODE), _identity("gpu-node-2"), 0.0)
    assert _receive(StreamReader(expected_node=NODE), _identity(NODE), 0.0) == ()


# --- a link, running ----------------------------------------------------------------------------


@dataclass
class Running:
    link: AgentLink
    receive: MemoryObjectReceiveStream[Sample]
    samples: list[Sample] = field(default_factory=list)

    async def next_batch(self, timeout_s: float = 5.0) -> Batch:
        return await self.next(lambda s: isinstance(s, Batch), timeout_s)  # type: ignore[return-value]

    async def next_fault(self, timeout_s: float = 5.0) -> Fault:
        found = await self.next(lambda s: isinstance(s, Fault) and s.key is None, timeout_s)
        assert isinstance(found, Fault)
        return found

    async def next(self, wanted: Callable[[Sample], bool], timeout_s: float = 5.0) -> Sample:
        with anyio.fail_after(timeout_s):
            async for sample in self.receive:
                self.samples.append(sample)
                if wanted(sample):
                    return sample
        raise AssertionError("the link stopped")


@asynccontextmanager
async def running_link(link: AgentLink) -> AsyncIterator[Running]:
    send, receive = anyio.create_memory_object_stream[Sample](1000)
    async with anyio.create_task_group() as tg, receive:
        await tg.start(link.run, send)
        try:
            yield Running(link, receive)
        finally:
            tg.cancel_scope.cancel()


def _link(target: AgentTarget, **options: Any) -> AgentLink:
    return AgentLink(target, **{"backoff": FAST, "min_idle_s": 0.3, **options})


def _failing_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.__dict__["error"] for r in caplog.records if r.getMessage() == "agent link failing"]


def _streaming_logs(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """A link logs "streaming" when its first stream starts and when one starts after a
    failure it logged."""
    return [r for r in caplog.records if r.getMessage() == "agent link streaming"]


@pytest.fixture
def link_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.sources.agents.link")
    return caplog


@pytest.mark.anyio
async def test_readings_from_a_real_node_agent_arrive_with_node_qualified_keys(
    fake_gpus: FakeGpuSource, link_logs: pytest.LogCaptureFixture
) -> None:
    kubelet = FakeAttribution([holder("llm-0", "GPU-fake-0000")])
    async with loopback_scaler(fake_gpus, node_name=NODE, samplers=[kubelet]) as agent:
        await agent.hub.wait_newer(0)
        async with running_link(_link(AgentTarget(host="127.0.0.1", port=agent.port))) as running:
            batch = await running.next_batch()
            received_at = anyio.current_time()
            attribution = await running.next(lambda s: isinstance(s, PodResourcesReading))
            streams = agent.metrics.render().decode()
    assert batch.source == "agent/gpu-node-1"
    busy, idle = (s for s in batch.samples if isinstance(s, GpuReading))
    assert (busy.key, idle.key) == ("gpu-node-1/GPU-fake-0000", "gpu-node-1/GPU-fake-0001")
    assert (busy.node, busy.index, busy.gpu_utilization, busy.sm_active) == (NODE, 0, 87.0, 55.0)
    assert idle.sm_active == 0.0 and idle.nvlink_tx_mbps is None
    assert received_at - 0.5 < busy.taken_at <= received_at
    assert isinstance(attribution, PodResourcesReading)
    assert (attribution.source, attribution.node) == ("agent/gpu-node-1/pod-resources", NODE)
    assert [h.pod for h in attribution.holders] == ["llm-0"]
    # One stream, to the node the identity named, and never a failure.
    assert "keda_gpu_scaler_agent_streams 1.0" in streams
    [streaming] = _streaming_logs(link_logs)
    assert (streaming.__dict__["node"], streaming.__dict__["after_failure"]) == (NODE, None)
    assert _failing_logs(link_logs) == []


@pytest.mark.anyio
async def test_an_agent_clock_hours_off_changes_nothing_on_the_cluster() -> None:
    hours = 5 * 3600.0

    def agent_clock() -> float:  # the agent's monotonic clock: hours ahead of ours
        return anyio.current_time() + hours

    hub = SnapshotHub()
    now = agent_clock()
    fresh = _gpu("GPU-fresh", taken_at=now - 0.25)
    old = _gpu("GPU-old", taken_at=now - 10.0, index=1)
    hub.publish(fold(hub.current, [Batch(source="nvml", samples=(fresh, old))], now))
    async with (
        serve_agent(hub, NODE, clock=agent_clock) as agent,
        open_test_pipeline(_link(agent.target)) as cluster,
    ):
        await wait_until(lambda: len(cluster.hub.current.devices) == 2)
        snapshot = cluster.hub.current
        cluster_now = anyio.current_time()
    f, o = (
        snapshot.devices[DeviceKey("gpu-node-1/GPU-fresh")],
        snapshot.devices[DeviceKey("gpu-node-1/GPU-old")],
    )
    assert f.reading is not None and o.reading is not None
    # Freshness depends only on the age sent and the receipt time, on this clock.
    assert 0.25 <= cluster_now - f.reading.taken_at < 0.25 + 0.5
    assert 10.0 <= cluster_now - o.reading.taken_at < 10.0 + 0.5
    assert not f.is_stale(cluster_now) and o.is_stale(cluster_now)
    assert abs(f.reading.taken_at - fresh.taken_at) > hours - 1  # not the agent's timestamps


def _gpu(key: str, *, taken_at: float, index: int = 0, period_s: float = 1.0) -> GpuReading:
    return GpuReading(
        source="nvml",
        key=DeviceKey(key),
        index=index,
        uuid=key,
        name="H200",
        taken_at=taken_at,
        period_s=period_s,
        gpu_utilization=50.0,
    )


@pytest.mark.anyio
async def test_an_agent_shut_down_then_restarted_on_its_port_is_read_again(
    fake_gpus: FakeGpuSource, link_logs: pytest.LogCaptureFixture
) -> None:
    async with anyio.create_task_group() as tg:
        first = await _start_agent(tg, fake_gpus, port=0)
        link = _link(AgentTarget(host="127.0.0.1", port=first.port))
        async with running_link(link) as running:
            await running.next_batch()
            await first.stop()  # streams end with OK, then the port closes
            faults = [await running.next_fault()]
            while "refused" not in faults[-1].reason:
                faults.append(await running.next_fault())
            faults.append(await running.next_fault())  # refused again, after a longer delay
            second = await _start_agent(tg, fake_gpus, port=first.port)
            batch = await running.next_batch()
            logged = _failing_logs(link_logs)
            streaming = _streaming_logs(link_logs)
            await second.stop()
    ended, refused = faults[0], faults[-1]
    assert ended.source == "agent/gpu-node-1"
    assert ended.reason == (
        f"agent 127.0.0.1:{first.port}: the agent ended the stream (shutting down?)"
    )
    assert refused.reason == (
        f"agent 127.0.0.1:{first.port}: connection refused (no agent listening there?)"
    )
    assert batch.source == "agent/gpu-node-1" and batch.samples
    # Every failure reached the channel as a fault, and nothing else failed before the batch.
    assert [s for s in running.samples if isinstance(s, Fault) and s.key is None] == faults
    # Two streams: the first, and the second after the refusals.
    assert [r.__dict__["after_failure"] for r in streaming] == [
        None,
        refused.reason.split(": ", 1)[1],
    ]
    # One line per cause, not one per retry.
    assert logged == [
        "the agent ended the stream (shutting down?)",
        "connection refused (no agent listening there?)",
    ]


@dataclass
class _Agent:
    port: int
    stop_event: anyio.Event
    stopped: anyio.Event

    async def stop(self) -> None:
        self.stop_event.set()
        await self.stopped.wait()


async def _start_agent(tg: TaskGroup, source: FakeGpuSource, *, port: int) -> _Agent:
    """A node agent in a task of its own, so that a test can stop it and start another."""
    started: list[int] = []
    ready, stop, stopped = anyio.Event(), anyio.Event(), anyio.Event()

    async def serve() -> None:
        try:
            async with open_scaler(source, host="127.0.0.1", port=port, node_name=NODE) as agent:
                await agent.hub.wait_newer(0)
                started.append(agent.port)
                ready.set()
                await stop.wait()
        finally:
            stopped.set()

    tg.start_soon(serve)
    await ready.wait()
    return _Agent(started[0], stop, stopped)


@pytest.mark.anyio
async def test_an_agent_killed_mid_stream_is_a_fault_and_a_reconnect(
    link_logs: pytest.LogCaptureFixture,
) -> None:
    hub = SnapshotHub()
    now = anyio.current_time()
    hub.publish(fold(hub.current, [_gpu("GPU-a", taken_at=now)], now))
    async with serve_agent(hub, NODE) as agent, running_link(_link(agent.target)) as running:
        await running.next_batch()
        agent.kill()  # every connection dropped, no trailers
        broken = await running.next_fault()
        await running.next_batch()  # the agent still listens: streaming again
        assert agent.connections == 2
    assert broken.reason.startswith(f"agent 127.0.0.1:{agent.port}: ")
    assert "the stream broke" in broken.reason or "connection" in broken.reason


@pytest.mark.anyio
async def test_an_agent_that_accepts_and_never_answers_is_dropped_and_retried(
    link_logs: pytest.LogCaptureFixture,
) -> None:
    async with hanging_agent() as agent, running_link(_link(agent.target)) as running:
        first = await running.next_fault()
        await running.next_fault()
        await wait_until(lambda: agent.accepted >= 2)
    assert first.reason == f"agent 127.0.0.1:{agent.port}: no identity within 0.3 s (hung?)"
    assert _failing_logs(link_logs) == ["no identity within 0.3 s (hung?)"]


@pytest.mark.anyio
async def test_an_agent_that_hangs_mid_stream_goes_stale_and_is_reconnected(
    link_logs: pytest.LogCaptureFixture,
) -> None:
    # Identity promising a message every 0.05 s, one reading already 0.8 s old, then silence.
    old = _device("GPU-a", age_s=0.8, period_s=0.05, gpu_utilization=10.0)
    key = DeviceKey("gpu-node-1/GPU-a")
    async with (
        scripted_agent([identity(NODE, period_s=0.05), readings(old)]) as agent,
        open_test_pipeline(_link(agent.target)) as cluster,
    ):
        await wait_until(lambda: key in cluster.hub.current.devices)
        device = cluster.hub.current.devices[key]
        assert device.reading is not None
        assert not device.is_stale(anyio.current_time())
        assert stale_limit_s(device.reading.period_s) == 1.0  # three periods, 1 s at least
        # Nothing refreshes it: it goes stale by the usual rule, 0.2 s after receipt...
        await wait_until(lambda: cluster.hub.current.devices[key].is_stale(anyio.current_time()))
        assert agent.streams == 1
        # ...and after five promised messages missed (0.3 s here, min_idle_s), a reconnect.
        await wait_until(lambda: agent.streams == 2)
        state = cluster.hub.current.sources["agent/gpu-node-1"]
        assert state.faults == 1
        assert _failing_logs(link_logs)[0] == "no message for 0.3 s (hung?)"


class _FakeTimer:
    def __init__(self, when: float, callback: Callable[[], object]) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class _FakeTimers:
    """A loop's clock and timers, moved on by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[_FakeTimer] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object]) -> _FakeTimer:
        timer = _FakeTimer(when, callback)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        """Moves the clock on, running every timer that falls due, in order."""
        until = self.now + seconds
        while due := sorted(
            (t for t in self.timers if not t.cancelled and t.when <= until), key=lambda t: t.when
        ):
            timer = due[0]
            self.timers.remove(timer)
            self.now = max(self.now, timer.when)
            timer.callback()
        self.now = until

    def pending(self) -> list[float]:
        return [t.when for t in self.timers if not t.cancelled]


@pytest.mark.anyio
async def test_the_silence_watchdog_counts_only_waits_for_a_message() -> None:
    # A link blocked handing samples over (the aggregator's channel full) is not silent.
    # (Under a loop only because a cancel scope needs one: the timers are the fake's.)
    timers = _FakeTimers()
    scope = anyio.CancelScope()
    watchdog = Watchdog(scope, 2.0, timers=timers)
    assert timers.pending() == [102.0]  # one timer per idle_s, not one per message
    timers.advance(60.0)  # no wait started: however long, not silent
    assert not scope.cancel_called
    assert timers.pending() == [162.0]
    timers.now = 160.5
    watchdog.waiting_since = timers.now  # a wait for the next message starts
    timers.advance(1.5)  # the timer due at 162.0 finds 1.5 s of waiting, and aims for 162.5
    assert not scope.cancel_called
    assert timers.pending() == [162.5]
    timers.advance(0.5)
    assert scope.cancel_called  # 2 s of waiting: cancelled, on the dot
    assert timers.pending() == []


@pytest.mark.anyio
async def test_a_message_in_time_keeps_the_watchdog_quiet_and_stop_cancels_its_timer() -> None:
    timers = _FakeTimers()
    scope = anyio.CancelScope()
    watchdog = Watchdog(scope, 2.0, timers=timers)
    for _ in range(10):  # a message every 1.5 s: each wait ends before 2 s
        watchdog.waiting_since = timers.now
        timers.advance(1.5)
        watchdog.waiting_since = math.inf
    assert not scope.cancel_called
    watchdog.stop()
    assert timers.pending() == []
    timers.advance(100.0)
    assert not scope.cancel_called


@pytest.mark.anyio
async def test_a_full_channel_holds_the_stream_back_and_loses_nothing(
    link_logs: pytest.LogCaptureFixture,
) -> None:
    # The aggregator's channel holds nothing: every hand-over waits for the consumer, which
    # takes its time; the link pauses the call meanwhile and is never taken for silent.
    updates = [readings(_device(gpu_utilization=float(i))) for i in range(200)]
    send, receive = anyio.create_memory_object_stream[Sample](0)
    async with scripted_agent([identity(NODE, period_s=0.05), *updates], then_hang=False) as agent:
        link = _link(agent.target, min_idle_s=0.3)
        values: list[float] = []
        async with anyio.create_task_group() as tg, receive:
            await tg.start(link.run, send)
            with anyio.fail_after(20):
                async for sample in receive:
                    if isinstance(sample, Fault):
                        fault = sample
                        break
                    assert isinstance(sample, Batch)
                    for reading in sample.samples:
                        assert isinstance(reading, GpuReading)
                        values.append(reading.gpu_utilization or 0.0)
                    # A slow consumer, twice slower than the link's silence limit (0.3 s):
                    # right after the identity, and mid-stream.
                    await anyio.sleep(0.4 if len(values) in (1, 100) else 0)
            tg.cancel_scope.cancel()
    assert values == [float(i) for i in range(200)]
    assert fault.reason.endswith("the agent ended the stream (shutting down?)")
    assert _failing_logs(link_logs) == ["the agent ended the stream (shutting down?)"]


# --- garbage --------------------------------------------------------------------------------------

CAP = 4096


def _framed_garbage() -> dict[str, tuple[list[bytes], str]]:
    return {
        "oversized": (
            [identity(NODE), b"\x00" * (CAP + 1)],
            f"sent garbage: a message of {CAP + 1} bytes, over the cap of {CAP} bytes",
        ),
        "undecodable": (
            [identity(NODE), b"\x0a\xff"],
            "sent garbage: a message that does not decode",
        ),
        "no kind": ([identity(NODE), b"\x20\x01"], "no known kind of update in it"),
        "no identity": ([readings(_device())], "the first message is readings"),
        "renamed": (
            [identity(NODE), readings(_device()), identity("gpu-node-9")],
            "the node name changed mid-stream, from gpu-node-1 to 'gpu-node-9'",
        ),
    }


@pytest.mark.anyio
@pytest.mark.parametrize("case", sorted(_framed_garbage()))
async def test_garbage_drops_the_link_with_one_log_line_and_other_links_keep_going(
    case: str, link_logs: pytest.LogCaptureFixture
) -> None:
    messages, reason = _framed_garbage()[case]
    hub = SnapshotHub()
    now = anyio.current_time()
    hub.publish(fold(hub.current, [_gpu("GPU-good", taken_at=now, period_s=0.05)], now))
    async with (
        scripted_agent(messages, then_hang=False) as bad,
        serve_agent(hub, "gpu-node-2") as good,
        running_link(_link(bad.target, max_message_bytes=CAP)) as broken,
        running_link(_link(good.target, max_message_bytes=CAP)) as healthy,
    ):
        faults = [await broken.next_fault() for _ in range(3)]
        await wait_until(lambda: bad.streams >= 3)
        # The good agent's link kept streaming all along (heartbeats every second, then a
        # reading when the hub changes).
        await healthy.next_batch()
        now = anyio.current_time()
        hub.publish(fold(hub.current, [_gpu("GPU-good", taken_at=now)], now))
        batch = await healthy.next_batch()
    assert all(reason in f.reason for f in faults), faults
    assert faults[0].reason.startswith(f"agent 127.0.0.1:{bad.port}: ")
    assert _failing_logs(link_logs) == [faults[0].reason.split(": ", 1)[1]]
    assert [s.key for s in batch.samples if isinstance(s, GpuReading)] == ["gpu-node-2/GPU-good"]
    # The good link never failed: no fault of it, and no line about it.
    assert not [s for s in healthy.samples if isinstance(s, Fault)]
    failing = [r for r in link_logs.records if r.getMessage() == "agent link failing"]
    assert {r.__dict__["agent"] for r in failing} == {bad.target.address}


@pytest.mark.anyio
async def test_an_agent_too_old_for_watch_node_is_named_by_its_status() -> None:
    async with serving_nothing() as agent, running_link(_link(agent.target)) as running:
        fault = await running.next_fault()
    assert fault.reason == f"agent {agent.target.address}: answered UNIMPLEMENTED: Method not found"


# --- TLS --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentPki:
    ca: Authority
    agent: Identity
    cluster: Identity
    other_ca: Authority


@pytest.fixture(scope="session")
def agent_pki(tmp_path_factory: pytest.TempPathFactory) -> AgentPki:
    out = tmp_path_factory.mktemp("agent-pki")
    ca = Authority.create("agents-ca", out)
    return AgentPki(
        ca=ca,
        agent=ca.issue("agent", server=True, sans=SERVICE_NAMES),
        cluster=ca.issue("cluster-scaler", server=False),
        other_ca=Authority.create("other-ca", out),
    )


def _ca_file(authority: Authority) -> Path:
    path = authority.out / f"{authority.name}.crt"
    path.write_bytes(authority.pem)
    return path


@asynccontextmanager
async def _tls_agent(
    source: FakeGpuSource, pki: AgentPki, *, mtls: bool
) -> AsyncIterator[AgentTarget]:
    config = TlsConfig(pki.agent.cert_file, pki.agent.key_file, _ca_file(pki.ca) if mtls else None)
    tls = ReloadingTlsContext(config)
    async with loopback_scaler(source, node_name=NODE, ssl=tls.context) as agent:
        await agent.hub.wait_newer(0)
        yield AgentTarget(host="127.0.0.1", port=agent.port)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("mtls", "client", "server_name"),
    [
        (False, False, ""),
        (False, False, "keda-gpu-scaler.ns.svc"),
        (True, True, ""),
    ],
)
async def test_tls_and_mutual_tls_links_stream(
    fake_gpus: FakeGpuSource, agent_pki: AgentPki, mtls: bool, client: bool, server_name: str
) -> None:
    config = AgentTlsConfig(
        ca_file=_ca_file(agent_pki.ca),
        cert_file=agent_pki.cluster.cert_file if client else None,
        key_file=agent_pki.cluster.key_file if client else None,
        server_name=server_name,
    )
    context = build_agent_client_context(config)
    assert context is not None
    async with (
        _tls_agent(fake_gpus, agent_pki, mtls=mtls) as target,
        running_link(_link(target, ssl=context, server_name=server_name)) as running,
    ):
        batch = await running.next_batch()
    assert batch.source == "agent/gpu-node-1"
    assert len([s for s in batch.samples if isinstance(s, GpuReading)]) == 2


_UNTRUSTED = "TLS failed: the agent's certificate is refused: unable to get local issuer"
_WRONG_NAME = "TLS failed: the agent's certificate is refused: Hostname mismatch"
_NO_CLIENT_CERT = "before any answer: does the agent want a client certificate it trusts"
_PLAINTEXT = "before any answer: does the agent want TLS (--agents-tls-ca)?"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("mtls", "trusted", "server_name", "reason"),
    [
        (False, False, "", _UNTRUSTED),
        (False, True, "wrong.example", _WRONG_NAME),
        (True, True, "", _NO_CLIENT_CERT),
        (False, True, None, _PLAINTEXT),  # None: plaintext to the TLS port
    ],
)
async def test_tls_links_that_cannot_work_fail_with_the_reason(
    fake_gpus: FakeGpuSource,
    agent_pki: AgentPki,
    link_logs: pytest.LogCaptureFixture,
    mtls: bool,
    trusted: bool,
    server_name: str | None,
    reason: str,
) -> None:
    context: ssl.SSLContext | None = None
    if server_name is not None:
        ca = agent_pki.ca if trusted else agent_pki.other_ca
        config = AgentTlsConfig(ca_file=_ca_file(ca), server_name=server_name)
        context = build_agent_client_context(config)
    async with (
        _tls_agent(fake_gpus, agent_pki, mtls=mtls) as target,
        running_link(_link(target, ssl=context, server_name=server_name or "")) as running,
    ):
        fault = await running.next_fault()
    assert fault.reason.startswith(f"agent {target.address}: ")
    assert reason in fault.reason
    assert _streaming_logs(link_logs) == []  # no stream ever started


def test_the_client_context_speaks_h2_from_tls_1_2_and_checks_the_agent(
    agent_pki: AgentPki,
) -> None:
    context = build_agent_client_context(AgentTlsConfig(ca_file=_ca_file(agent_pki.ca)))
    assert context is not None
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert build_agent_client_context(AgentTlsConfig()) is None


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"cert_file": "cert"}, "--agents-tls-cert and --agents-tls-key go together"),
        ({"key_file": "key"}, "--agents-tls-cert and --agents-tls-key go together"),
        ({"server_name": "x"}, "--agents-tls-server-name needs TLS"),
        ({"ca_file": "missing"}, "--agents-tls-ca {missing}: not found"),
        ({"ca_file": "empty"}, "--agents-tls-ca {empty}: the file is empty"),
        ({"ca_file": "junk"}, "--agents-tls-ca {junk}: not PEM (no -----BEGIN line in it)"),
        ({"ca_file": "key"}, "--agents-tls-ca {key}: no PEM certificate in it"),
        ({"ca_file": "der"}, "--agents-tls-ca {der}: DER (binary), not PEM: convert it"),
        ({"cert_file": "der", "key_file": "key"}, "--agents-tls-cert {der}: DER (binary), not"),
        ({"cert_file": "cert", "key_file": "der"}, "--agents-tls-key {der}: DER (binary), not"),
        (
            {"cert_file": "cert", "key_file": "other_key"},
            "--agents-tls-key {other_key} does not match",
        ),
        ({"cert_file": "cert", "key_file": "junk"}, "--agents-tls-key {junk}: not PEM"),
        ({"cert_file": "key", "key_file": "key"}, "no usable PEM certificate chain"),
        ({"ca_file": "directory"}, "--agents-tls-ca {directory}: is a directory, not a file"),
        (
            {"cert_file": "cert", "key_file": "encrypted"},
            "--agents-tls-key {encrypted}: encrypted; give an unencrypted key",
        ),
    ],
)
def test_bad_agent_tls_settings_name_the_flag_and_the_file(
    agent_pki: AgentPki, tmp_path: Path, files: dict[str, str], message: str
) -> None:
    paths = {
        "cert": agent_pki.cluster.cert_file,
        "key": agent_pki.cluster.key_file,
        "other_key": agent_pki.agent.key_file,
        "missing": tmp_path / "missing.pem",
        "empty": tmp_path / "empty.pem",
        "junk": tmp_path / "junk.pem",
        "directory": tmp_path,
        "encrypted": tmp_path / "encrypted.key",
        "der": tmp_path / "cert.der",
    }
    paths["der"].write_bytes(ssl.PEM_cert_to_DER_cert(paths["cert"].read_text()))
    paths["empty"].write_text("")
    paths["junk"].write_text("not a certificate\n")
    paths["encrypted"].write_bytes(_encrypted(agent_pki.cluster.key_file.read_bytes()))
    config: dict[str, Any] = {k: (v if k == "server_name" else paths[v]) for k, v in files.items()}
    with pytest.raises(AgentTlsConfigError) as refused:
        build_agent_client_context(AgentTlsConfig(**config))
    assert message.format(**{k: str(v) for k, v in paths.items()}) in str(refused.value)


def test_a_link_refuses_settings_that_cannot_work() -> None:
    target = AgentTarget(host="127.0.0.1", port=1)
    with pytest.raises(ValueError, match="max_message_bytes must be at least 1"):
        AgentLink(target, max_message_bytes=0)
    with pytest.raises(ValueError, match="min_idle_s must be a positive"):
        AgentLink(target, min_idle_s=0)
    with pytest.raises(ValueError, match="a TLS server name without TLS"):
        AgentLink(target, server_name="x")
    assert AgentLink(target).name == "agent/127.0.0.1:1"
    assert AgentLink(AgentTarget(host="::1", port=6000, node=NODE)).name == "agent/gpu-node-1"


@pytest.mark.anyio
async def test_a_link_found_by_address_takes_its_nodes_name_from_the_identity() -> None:
    hub = SnapshotHub()
    now = anyio.current_time()
    hub.publish(fold(hub.current, [_gpu("GPU-a", taken_at=now)], now))
    async with serve_agent(hub, NODE) as agent:
        link = _link(agent.target)  # no node: DNS or a static list
        assert link.name == f"agent/127.0.0.1:{agent.port}"
        async with running_link(link) as running:
            await running.next_batch()
            assert link.name == "agent/gpu-node-1"  # what SourceStopped must name
            agent.kill()
            fault = await running.next_fault()
    assert fault.source == "agent/gpu-node-1"


def test_the_calls_authority_brackets_an_ipv6_address() -> None:
    assert _authority("10.0.0.7", 9400) == "10.0.0.7:9400"
    assert _authority("gpu-agents.ns.svc", 9400) == "gpu-agents.ns.svc:9400"
    assert _authority("fd00::7", 9400) == "[fd00::7]:9400"


def _device_processes(key: str = "GPU-aaa", **fields: Any) -> proto.DeviceProcesses:
    values: dict[str, Any] = {"index": 0, "age_s": 2.0, "period_s": 5.0}
    return proto.DeviceProcesses(key=key, **{**values, **fields})


def test_per_process_readings_become_node_qualified_samples() -> None:
    uses = [
        proto.ProcessUse(pid=101, pod_uid="uid-a", container_id="c" * 64, sm=35.0, memory=math.nan),
        proto.ProcessUse(pid=303, used_memory_bytes=1 << 30, sm=5.0),
    ]
    update = _readings(
        _device(),
        processes=[
            _device_processes(processes=uses),
            _device_processes("MIG-bbb", utilization_unsupported="MIG: Not Supported"),
        ],
    )
    [batch] = _receive(_identified(), update, 100.0)
    assert isinstance(batch, Batch)
    reading, gpu, mig = batch.samples
    assert isinstance(reading, GpuReading)
    assert isinstance(gpu, DeviceProcesses) and isinstance(mig, DeviceProcesses)
    assert (gpu.key, gpu.node, gpu.source, gpu.taken_at, gpu.period_s) == (
        "gpu-node-1/GPU-aaa",
        NODE,
        "agent/gpu-node-1",
        98.0,
        5.0,
    )
    assert gpu.processes == (
        ProcessUse(pid=101, pod_uid="uid-a", container_id="c" * 64, sm=35.0),  # NaN: none
        ProcessUse(pid=303, used_memory_bytes=1 << 30, sm=5.0),
    )
    assert (mig.key, mig.processes, mig.utilization_unsupported) == (
        "gpu-node-1/MIG-bbb",
        (),
        "MIG: Not Supported",
    )


def test_an_agent_without_per_process_readings_sends_none_and_bad_ones_are_refused() -> None:
    # An agent of a release before them: the field is absent, so there is nothing.
    [batch] = _receive(_identified(), _readings(_device()), 1.0)
    assert isinstance(batch, Batch)
    assert not [s for s in batch.samples if isinstance(s, DeviceProcesses)]
    for processes, message in (
        ([_device_processes(""), _device_processes()], "a device without a key"),
        ([_device_processes(), _device_processes()], "device GPU-aaa twice in one update"),
        ([_device_processes(age_s=-1.0)], "GPU-aaa's processes' age_s -1.0 is not"),
        ([_device_processes(period_s=0.0)], "GPU-aaa's processes' period_s 0.0 is not"),
    ):
        with pytest.raises(BadUpdate) as caught:
            _receive(_identified(), _readings(processes=processes), 1.0)
        assert message in str(caught.value)
