"""AgentLinks: one supervised link per ready agent, started and stopped as discovery says."""

from __future__ import annotations

import anyio
import pytest
import trio.testing
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.samples import (
    AGENTS_SOURCE,
    AgentsReading,
    AgentTarget,
    Sample,
    SourceFault,
    SourceStopped,
)
from keda_gpu_scaler.pipeline.agents import AgentLinks

RUNS: dict[str, int] = {}


class _Link:
    """Publishes one fault naming its agent, then waits; counts its runs."""

    def __init__(self, target: AgentTarget) -> None:
        self.target = target
        self.name = f"agent/{target.address}"

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        RUNS[self.target.address] = RUNS.get(self.target.address, 0) + 1
        async with send:
            task_status.started()
            await send.send(
                SourceFault(source=self.name, key=None, at=anyio.current_time(), reason="hello")
            )
            await anyio.sleep_forever()


def _reading(*targets: AgentTarget) -> AgentsReading:
    return AgentsReading(source=AGENTS_SOURCE, taken_at=0.0, period_s=10.0, targets=targets)


A = AgentTarget(host="10.0.0.1", port=6000, node="a")
B = AgentTarget(host="10.0.0.2", port=6000, node="b")
B_NOT_READY = AgentTarget(host="10.0.0.2", port=6000, node="b", ready=False)
B_MOVED = AgentTarget(host="10.0.0.2", port=6000, node="c")


@pytest.mark.trio
async def test_links_follow_discovery(autojump_clock: trio.testing.MockClock) -> None:
    RUNS.clear()
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
        assert [t.address for t in links.linked()] == ["10.0.0.1:6000", "10.0.0.2:6000"]
        assert {s.source for s in got if isinstance(s, SourceFault)} == {
            "agent/10.0.0.1:6000",
            "agent/10.0.0.2:6000",
        }
        got.clear()
        # B turns not-ready: its link stops and its readings are forgotten; it stays listed.
        await targets_send.send(_reading(A, B_NOT_READY))
        await settle()
        assert [t.address for t in links.linked()] == ["10.0.0.1:6000"]
        assert got == [SourceStopped(source="agent/10.0.0.2:6000")]
        assert links.discovered is not None
        assert B_NOT_READY in links.discovered.targets
        # Ready again, then the same address for another node: a new link each time.
        await targets_send.send(_reading(A, B))
        await settle()
        await targets_send.send(_reading(A, B_MOVED))
        await settle()
        assert RUNS == {"10.0.0.1:6000": 1, "10.0.0.2:6000": 3}
        assert links.linked()[1].node == "c"
        # An unchanged set starts nothing.
        await targets_send.send(_reading(A, B_MOVED))
        await settle()
        assert RUNS == {"10.0.0.1:6000": 1, "10.0.0.2:6000": 3}
        tg.cancel_scope.cancel()
