"""Links to node agents, one per ready agent discovery finds, on a cluster scaler.

Discovery publishes the whole set of agents it sees (:class:`AgentsReading`) on its own
channel; this actor keeps one supervised link sampler per *ready* agent address, started
when the address appears and stopped when it leaves. Not-ready agents are kept for the tap
and ``/metrics`` (:attr:`AgentLinks.discovered`), never linked. Links are built by a factory
the composition root injects, so the pipeline never imports a source.

Every sample a link publishes is first shown to this actor (the link's gate, called on the
event loop, synchronous), which is where two rules of a cluster's view are kept:

- **one link per node**: when two links publish for one node name, the newer stream wins
  (:class:`~keda_gpu_scaler.domain.agents.NodeClaims`), with a log line; the older one's
  updates are dropped until the newer one's stream breaks;
- **missing, then forgotten**: a node whose agent is not heard stays missing (its readings
  go stale, and coverage counts them) for as long as discovery lists an agent on it, or for
  five minutes after it was last heard when discovery never named it (DNS, static); then
  it is forgotten (:class:`SourceStopped` of its source), so a partial view does not stay
  partial forever (:class:`~keda_gpu_scaler.domain.agents.AgentRoster`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from keda_gpu_scaler.domain.agents import (
    AgentRoster,
    NodeClaims,
    node_of_source,
    readings_source,
)
from keda_gpu_scaler.domain.samples import (
    AgentsReading,
    AgentTarget,
    Batch,
    PodResourcesReading,
    Sample,
    SourceFault,
    SourceStopped,
)
from keda_gpu_scaler.pipeline.supervisor import Backoff, Sampler, supervise

log = logging.getLogger(__name__)

SampleGate = Callable[[Sample], bool]
"""Given to each link: whether a sample it is about to publish goes on (False: drop it)."""
AgentLinkFactory = Callable[[AgentTarget, SampleGate], Sampler]
ROSTER_SWEEP_S = 10.0
"""How often the roster is looked at for nodes to forget, besides every discovery change
and every stream that starts or breaks."""


@dataclass(slots=True)
class _Linked:
    target: AgentTarget
    scope: anyio.CancelScope
    link: Sampler | None = None
    stream_since: float | None = None
    """When the link's current stream first published; None while it has none."""
    dropped: bool = False
    """Its updates are dropped (another link holds its node): logged once."""


class AgentLinks:
    def __init__(
        self,
        targets: MemoryObjectReceiveStream[AgentsReading],
        send: MemoryObjectSendStream[Sample],
        factory: AgentLinkFactory,
        *,
        backoff: Backoff | None = None,
        sweep_s: float = ROSTER_SWEEP_S,
    ) -> None:
        self._targets = targets
        self._send = send
        self._factory = factory
        self._backoff = backoff or Backoff()
        self._sweep_s = sweep_s
        self._tg: TaskGroup | None = None
        self._links: dict[str, _Linked] = {}
        self._claims = NodeClaims()
        self._roster_due = anyio.Event()
        self._released: list[str] = []
        self.roster = AgentRoster()
        """Which nodes are heard, missing, and (by leaving it) forgotten."""
        self.discovered: AgentsReading | None = None
        """The newest set discovery published (ready and not-ready), for visibility."""

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._targets, self._send, anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._roster_task)
            task_status.started()
            async for reading in self._targets:
                await self._apply(reading)

    async def _apply(self, reading: AgentsReading) -> None:
        self.discovered = reading
        await self._send.send(reading)  # for the snapshot: the tap and /metrics list them
        ready = {t.address: t for t in reading.targets if t.ready}
        stopped: list[_Linked] = []
        for address in [a for a in self._links if a not in ready]:
            stopped.append(self._links.pop(address))
            log.info("agent link stopped", extra={"agent": address})
        for address, target in ready.items():
            current = self._links.get(address)
            if current is not None and current.target == target:
                continue
            if current is not None:  # same address, another pod or node: a new agent
                stopped.append(current)
            self._start(target)
        for linked in stopped:
            linked.scope.cancel()
            self._claims.release(linked.target.address)
        await self._update_roster()
        running = {linked.link.name for linked in self._links.values() if linked.link}
        for linked in stopped:
            # A link that never named a node (no stream yet) leaves its own source's faults.
            assert linked.link is not None
            name = linked.link.name
            if node_of_source(name) not in self.roster.nodes and name not in running:
                await self._send.send(SourceStopped(source=name))

    def _start(self, target: AgentTarget) -> None:
        assert self._tg is not None  # run() started
        linked = _Linked(target, anyio.CancelScope())
        linked.link = self._factory(target, partial(self._admit, linked))
        self._links[target.address] = linked
        log.info("agent link started", extra={"agent": target.address, "node": target.node})
        self._tg.start_soon(self._supervised, linked)

    async def _supervised(self, linked: _Linked) -> None:
        link = linked.link
        assert link is not None
        with linked.scope:
            await supervise(link.name, link.run, send=self._send.clone(), backoff=self._backoff)

    def _admit(self, linked: _Linked, sample: Sample) -> bool:
        """The gate of a link's samples: whether one goes on to the aggregator. Not those
        of a stopped link, nor those for a node a newer stream holds (see NodeClaims)."""
        if self._links.get(linked.target.address) is not linked:
            return False  # stopped: a late sample of a link being cancelled
        if isinstance(sample, SourceFault) and sample.key is None:
            return self._broke(linked, sample)
        node = _node_of(sample)
        return node is None or self._speaks(linked, node)

    def _speaks(self, linked: _Linked, node: str) -> bool:
        address = linked.target.address
        if linked.stream_since is None:
            linked.stream_since = anyio.current_time()
        counts, took_from = self._claims.publish(node, address, linked.stream_since)
        if not counts:
            if not linked.dropped:
                log.warning(
                    "two agents claim one node: the newer stream wins, this one is dropped",
                    extra={"node": node, "agent": address, "newer": self._claims.holder(node)},
                )
                linked.dropped = True
            return False
        if took_from is not None:
            log.warning(
                "two agents claim one node: the newer stream wins",
                extra={"node": node, "agent": address, "older": took_from.owner},
            )
        linked.dropped = False
        seen = self.roster.nodes.get(node)
        if seen is None or not seen.heard:
            self._roster_due.set()
        return True

    def _broke(self, linked: _Linked, fault: SourceFault) -> bool:
        """A link's stream broke: it lets go of its nodes, which the roster hears no more;
        its fault is passed on if it spoke for its node (or nobody does)."""
        released = self._claims.release(linked.target.address)
        linked.stream_since = None
        if released:
            self._released.extend(released)
            self._roster_due.set()
        node = node_of_source(fault.source)
        return bool(released) or node is None or self._claims.holder(node) is None

    async def _roster_task(self) -> None:
        """The roster, updated when a node is first heard or stops being heard, and every
        ``sweep_s`` (nodes to forget)."""
        while True:
            with anyio.move_on_after(self._sweep_s):
                await self._roster_due.wait()
            self._roster_due = anyio.Event()
            released, self._released = self._released, []
            if released:  # last heard now, then not heard
                await self._update_roster(heard_also=released)
            await self._update_roster()

    async def _update_roster(self, *, heard_also: list[str] | None = None) -> None:
        """The roster now; each node it forgets loses its view (a SourceStopped)."""
        heard = set(self._claims.claims) | set(heard_also or ())
        targets = () if self.discovered is None else self.discovered.targets
        before = self.roster
        self.roster = before.update(targets=targets, heard=heard, now=anyio.current_time())
        for node in before.nodes.keys() - self.roster.nodes.keys():
            log.info("node forgotten: its agent is gone", extra={"node": node})
            await self._send.send(SourceStopped(source=readings_source(node)))


def _node_of(sample: Sample) -> str | None:
    """The node a link's sample speaks for (None: a sample of no node, passed on)."""
    if isinstance(sample, Batch | PodResourcesReading):
        return node_of_source(sample.source)
    return None
