"""Links to node agents, one per ready agent discovery finds, on a cluster scaler.

Discovery publishes the whole set of agents it sees (:class:`AgentsReading`) on its own
channel; this actor keeps one supervised link sampler per *ready* agent address, started
when the address appears and stopped when it leaves, and then makes the aggregator forget
what that link published (:class:`SourceStopped`). Not-ready agents are kept for the tap and
``/metrics`` (:attr:`AgentLinks.discovered`), never linked. Links are built by a factory the
composition root injects, so the pipeline never imports a source.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from keda_gpu_scaler.domain.samples import AgentsReading, AgentTarget, Sample, SourceStopped
from keda_gpu_scaler.pipeline.supervisor import Backoff, Sampler, supervise

log = logging.getLogger(__name__)

AgentLinkFactory = Callable[[AgentTarget], Sampler]


class AgentLinks:
    def __init__(
        self,
        targets: MemoryObjectReceiveStream[AgentsReading],
        send: MemoryObjectSendStream[Sample],
        factory: AgentLinkFactory,
        *,
        backoff: Backoff | None = None,
    ) -> None:
        self._targets = targets
        self._send = send
        self._factory = factory
        self._backoff = backoff or Backoff()
        self._tg: TaskGroup | None = None
        self._links: dict[str, tuple[AgentTarget, Sampler, anyio.CancelScope]] = {}
        self.discovered: AgentsReading | None = None
        """The newest set discovery published (ready and not-ready), for visibility."""

    def linked(self) -> list[AgentTarget]:
        """The agents linked now, by address."""
        return [target for _, (target, _, _) in sorted(self._links.items())]

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._targets, self._send, anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            async for reading in self._targets:
                await self._apply(reading)

    async def _apply(self, reading: AgentsReading) -> None:
        self.discovered = reading
        ready = {t.address: t for t in reading.targets if t.ready}
        for address in [a for a in self._links if a not in ready]:
            target, link, scope = self._links.pop(address)
            scope.cancel()
            log.info("agent link stopped", extra={"agent": address, "node": target.node})
            await self._send.send(SourceStopped(source=link.name))
        for address, target in ready.items():
            linked = self._links.get(address)
            if linked is not None and linked[0] == target:
                continue
            if linked is not None:  # same address, another pod or node: a new agent
                linked[2].cancel()
                await self._send.send(SourceStopped(source=linked[1].name))
            self._start(target)

    def _start(self, target: AgentTarget) -> None:
        assert self._tg is not None  # run() started
        scope = anyio.CancelScope()
        link = self._factory(target)
        self._links[target.address] = (target, link, scope)
        log.info("agent link started", extra={"agent": target.address, "node": target.node})
        self._tg.start_soon(self._supervised, link, scope)

    async def _supervised(self, link: Sampler, scope: anyio.CancelScope) -> None:
        with scope:
            await supervise(link.name, link.run, send=self._send.clone(), backoff=self._backoff)
