"""AgentLinks: one supervised link per ready agent, started and stopped as discovery says."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest
import trio.testing
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.agents import FORGET_AFTER_S
from keda_gpu_scaler.domain.samples import (
    AGENTS_SOURCE,
    AgentsReading,
    AgentTarget,
    Batch,
    Sample,
    SourceFault,
    SourceStopped,
)
from keda_gpu_scaler.pipeline.agents import AgentLinks
from tests.test_agent_discovery import missing_nodes, present_nodes

RUNS: dict[str, int] = {}
RUNNING: dict[str, _Link] = {}
"""The links running now, by address."""


class _Link:
    """Publishes one fault naming its agent, then waits; counts its runs and says while it
    runs."""

    def __init__(self, target: AgentTarget, gate: Callable[[Sample], bool]) -> None:
        self.target = target
        self.name = f"agent/{target.address}"
        self.gate = gate

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        RUNS[self.target.address] = RUNS.get(self.target.address, 0) + 1
        RUNNING[self.target.address] = self
        try:
            async with send:
                task_status.started()
                at = anyio.current_time()
                fault = SourceFault(source=self.name, key=None, at=at, reason="hello")
                if self.gate(fault):
                    await send.send(fault)
                await anyio.sleep_forever()
        finally:
            if RUNNING.get(self.target.address) is self:  # not yet replaced by a new link
                del RUNNING[self.target.address]


def _reading(*targets: AgentTarget) -> AgentsReading:
    return AgentsReading(source=AGENTS_SOURCE, taken_at=0.0, period_s=10.0, targets=targets)


A = AgentTarget(host="10.0.0.1", port=6000, node="a")
B = AgentTarget(host="10.0.0.2", port=6000, node="b")
B_NOT_READY = AgentTarget(host="10.0.0.2", port=6000, node="b", ready=False)
B_MOVED = AgentTarget(host="10.0.0.2", port=6000, node="c")


@pytest.mark.trio
async def test_links_follow_discovery(autojump_clock: trio.testing.MockClock) -> None:
    RUNS.clear()
    RUNNING.clear()
    targets_send, targets_receive = anyio.create_memory_object_stream[AgentsReading](8)
    send, receive = anyio.create_memory_object_stream[Sample](64)
    links = AgentLinks(targets_receive, send, _Link)
    got: list[Sample] = []

    async def settle() -> None:
        await anyio.sleep(1)
        while True:
            try:
                got.append(receive.receive_nowait())
            except anyio.WouldBlock:
                return

    async with targets_send, receive, anyio.create_task_group() as tg:
        await tg.start(links.run)
        await targets_send.send(_reading(A, B))
        await settle()
        assert sorted(RUNNING) == ["10.0.0.1:6000", "10.0.0.2:6000"]
        assert {s.source for s in got if isinstance(s, SourceFault)} == {
            "agent/10.0.0.1:6000",
            "agent/10.0.0.2:6000",
        }
        got.clear()
        # B turns not-ready: its link stops and its readings are forgotten; it stays listed.
        await targets_send.send(_reading(A, B_NOT_READY))
        await settle()
        assert sorted(RUNNING) == ["10.0.0.1:6000"]
        # Discovery's set goes on to the aggregator (the tap and /metrics list it).
        assert [s for s in got if isinstance(s, AgentsReading)] == [_reading(A, B_NOT_READY)]
        assert [s for s in got if not isinstance(s, AgentsReading)] == [
            SourceStopped(source="agent/10.0.0.2:6000")
        ]
        assert links.discovered is not None
        assert B_NOT_READY in links.discovered.targets
        # Ready again, then the same address for another node: a new link each time.
        await targets_send.send(_reading(A, B))
        await settle()
        await targets_send.send(_reading(A, B_MOVED))
        await settle()
        assert RUNS == {"10.0.0.1:6000": 1, "10.0.0.2:6000": 3}
        assert RUNNING["10.0.0.2:6000"].target.node == "c"
        # An unchanged set starts nothing.
        await targets_send.send(_reading(A, B_MOVED))
        await settle()
        assert RUNS == {"10.0.0.1:6000": 1, "10.0.0.2:6000": 3}
        tg.cancel_scope.cancel()


# -- one link per node, and nodes missing then forgotten ---------------------------------


class _Agent:
    """A link to a scripted agent of ``node``: a Batch every second while ``up``; a broken
    stream (a fault naming the link) when it goes down."""

    def __init__(self, target: AgentTarget, node: str) -> None:
        self.target = target
        self.node = node
        self.name = f"agent/{node}"
        self.up = True
        self.gate: Callable[[Sample], bool] = lambda sample: True

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            task_status.started()
            was_up = False
            while True:
                up = self.up  # as of this tick: the test may flip it while this one sends
                sample: Sample | None = None
                if up:
                    sample = Batch(source=self.name, samples=())
                elif was_up:
                    sample = SourceFault(
                        source=self.name, key=None, at=anyio.current_time(), reason="down"
                    )
                if sample is not None and self.gate(sample):
                    await send.send(sample)
                was_up = up
                await anyio.sleep(1)


class _Harness:
    def __init__(self, agents: dict[str, _Agent]) -> None:
        self.agents = agents
        self.targets_send, targets_receive = anyio.create_memory_object_stream[AgentsReading](8)
        self.send, self.receive = anyio.create_memory_object_stream[Sample](1024)
        self.links = AgentLinks(targets_receive, self.send, self._link)
        self.got: list[Sample] = []

    def _link(self, target: AgentTarget, gate: Callable[[Sample], bool]) -> _Agent:
        agent = self.agents[target.address]
        agent.gate = gate
        return agent

    async def settle(self, seconds: float = 1.5) -> list[Sample]:
        await anyio.sleep(seconds)
        new: list[Sample] = []
        while True:
            try:
                new.append(self.receive.receive_nowait())
            except anyio.WouldBlock:
                self.got.extend(new)
                return new


def _by(samples: list[Sample], kind: type) -> list[str]:
    return [s.source for s in samples if isinstance(s, kind)]


OLD = AgentTarget(host="10.0.0.5", port=6000)
NEW = AgentTarget(host="10.0.0.6", port=6000)


@pytest.mark.trio
async def test_two_links_for_one_node_the_newer_stream_wins(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = _Agent(OLD, "gpu-1"), _Agent(NEW, "gpu-1")
    h = _Harness({OLD.address: old, NEW.address: new})
    async with h.targets_send, h.receive, anyio.create_task_group() as tg:
        await tg.start(h.links.run)
        await h.targets_send.send(_reading(OLD))
        assert _by(await h.settle(3), Batch) == ["agent/gpu-1"] * 3
        await h.targets_send.send(_reading(OLD, NEW))
        await h.settle(0.1)
        # Only the newer stream is passed on: one batch a second, not two.
        assert len(_by(await h.settle(5), Batch)) == 5
        assert any("newer stream wins" in r.message for r in caplog.records)
        dropped = [r for r in caplog.records if "this one is dropped" in r.message]
        assert len(dropped) == 1 and dropped[0].agent == OLD.address  # type: ignore[attr-defined]
        # The newer one's stream breaks: the older one speaks for the node again, and the
        # newer one's fault is passed on (it held the node), not the older one's.
        new.up = False
        later = await h.settle(5)
        assert _by(later, SourceFault) == ["agent/gpu-1"]
        assert len(_by(later, Batch)) >= 4
        tg.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_node_only_its_link_knew_is_missing_five_minutes_then_forgotten(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = _Agent(OLD, "gpu-1")
    h = _Harness({OLD.address: agent})
    async with h.targets_send, h.receive, anyio.create_task_group() as tg:
        await tg.start(h.links.run)
        await h.targets_send.send(_reading(OLD))
        await h.settle(3)
        agent.up = False
        await h.settle(2)
        assert missing_nodes(h.links.roster) == ("gpu-1",)
        # Missing, not forgotten, for five minutes after it was last heard...
        assert _by(await h.settle(FORGET_AFTER_S - 30), SourceStopped) == []
        # ...then forgotten: its view goes.
        assert _by(await h.settle(60), SourceStopped) == ["agent/gpu-1"]
        assert "gpu-1" not in h.links.roster.nodes
        # The agent comes back: heard again.
        agent.up = True
        await h.settle(3)
        assert present_nodes(h.links.roster) == ("gpu-1",)
        tg.cancel_scope.cancel()


@pytest.mark.trio
async def test_an_address_dns_stops_naming_is_missing_not_forgotten_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = _Agent(OLD, "gpu-1")
    h = _Harness({OLD.address: agent})
    async with h.targets_send, h.receive, anyio.create_task_group() as tg:
        await tg.start(h.links.run)
        await h.targets_send.send(_reading(OLD))
        await h.settle(3)
        await h.targets_send.send(_reading())  # re-resolved: the address is gone
        assert _by(await h.settle(60), SourceStopped) == []
        assert missing_nodes(h.links.roster) == ("gpu-1",)
        assert _by(await h.settle(FORGET_AFTER_S), SourceStopped) == ["agent/gpu-1"]
        tg.cancel_scope.cancel()


LISTED = AgentTarget(host="10.0.0.7", port=6000, node="gpu-2")
LISTED_NOT_READY = AgentTarget(host="10.0.0.7", port=6000, node="gpu-2", ready=False)


@pytest.mark.trio
async def test_a_node_discovery_lists_stays_missing_and_goes_when_delisted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = _Agent(LISTED, "gpu-2")
    h = _Harness({LISTED.address: agent})
    async with h.targets_send, h.receive, anyio.create_task_group() as tg:
        await tg.start(h.links.run)
        await h.targets_send.send(_reading(LISTED))
        await h.settle(3)
        # Not ready (its agent fails its probe): unlinked, missing, never forgotten.
        await h.targets_send.send(_reading(LISTED_NOT_READY))
        assert _by(await h.settle(FORGET_AFTER_S * 2), SourceStopped) == []
        assert missing_nodes(h.links.roster) == ("gpu-2",)
        # Removed from the EndpointSlice (the node drained): forgotten at once.
        await h.targets_send.send(_reading())
        assert _by(await h.settle(1), SourceStopped) == ["agent/gpu-2"]
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_every_agent_discovery_sees_is_in_the_snapshot_the_tap_and_metrics() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from keda_gpu_scaler.pipeline.state import fold
    from keda_gpu_scaler.pipeline.tap import Tap, TapFilter
    from keda_gpu_scaler.serving.observability import SelfMetrics
    from keda_gpu_scaler.testing import snapshot_after

    seen = _reading(A, B_NOT_READY)
    snapshot = snapshot_after([seen], 0.0)
    assert snapshot.agents == seen
    assert snapshot.sources[AGENTS_SOURCE].samples == 1
    tap = Tap(max_buffer=8)
    with tap.subscribe(TapFilter()) as subscription:
        tap.folded([seen], fold(snapshot, [seen], 0.0))
        line = await subscription.__anext__()
    assert b'"type":"agents"' in line and b'"ready":false' in line
    metrics = SelfMetrics()
    metrics.read_live(lambda: snapshot, lambda: 0)
    rows = [
        sample.labels
        for family in text_string_to_metric_families(metrics.render().decode())
        for sample in family.samples
        if sample.name == "keda_gpu_scaler_agent_targets"
    ]
    assert rows == [
        {"address": "10.0.0.1:6000", "node": "a", "pod": "", "ready": "true"},
        {"address": "10.0.0.2:6000", "node": "b", "pod": "", "ready": "false"},
    ]
