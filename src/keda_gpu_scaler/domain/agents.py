"""Which nodes a cluster scaler hears from, and which it is missing.

A cluster scaler's view is only whole when it hears every node agent. Two things tell it
which nodes there are: discovery (EndpointSlices name the node of each agent; DNS and a
static list do not) and the links themselves (an agent's stream names its node). The
roster keeps, per node, when its agent was last heard, and answers the one rule of
coverage:

    heard now                                   present
    not heard, and discovery lists an agent     missing, for as long as discovery lists it
      on the node (ready or not)                (an agent that exists but does not answer)
    not heard, and discovery stopped listing    forgotten at once (the agent was removed:
      the node                                  a node drained or deleted)
    not heard, discovery never listed it        missing for FORGET_AFTER_S (5 minutes)
      (DNS, static: only the link knew it)      after it was last heard, then forgotten

So a node whose agent is gone stays counted as missing for 5 minutes, or until discovery
removes it, then is forgotten; and a node that discovery still lists is never forgotten,
because forgetting it would make a partial view look whole.

Pure: every update is given the time, :meth:`AgentRoster.update` returns a new roster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from keda_gpu_scaler.domain.samples import POD_RESOURCES_SOURCE, PODS_SOURCE, AgentTarget

FORGET_AFTER_S = 300.0
"""How long a node only the links knew stays missing after its agent was last heard."""
_READINGS_PREFIX = "agent/"


def readings_source(node: str) -> str:
    """The source of a node agent's readings and faults on a cluster scaler."""
    return f"{_READINGS_PREFIX}{node}"


def attribution_source(node: str) -> str:
    """The source of a node agent's kubelet attribution on a cluster scaler."""
    return f"{_READINGS_PREFIX}{node}/{POD_RESOURCES_SOURCE}"


_OWN_SERIES = (POD_RESOURCES_SOURCE, PODS_SOURCE)
"""A node agent's sources whose faults count apart from its readings on a cluster scaler."""


def fault_source(node: str, source: str) -> str:
    """Where a node agent's fault of its own ``source`` counts on a cluster scaler.

    Its GPU source's faults are its readings' (``agent/<node>``: the node's GPUs are not
    read); those of its kubelet attribution and of its pod watch have a series of their own
    (``agent/<node>/pod-resources``, ``agent/<node>/pods``), so that a fault there never
    says that fresh readings are down.
    """
    return f"{_READINGS_PREFIX}{node}/{source}" if source in _OWN_SERIES else readings_source(node)


def node_of_source(source: str) -> str | None:
    """The node of :func:`readings_source` or :func:`fault_source`; None for another
    source."""
    if not source.startswith(_READINGS_PREFIX):
        return None
    node = source.removeprefix(_READINGS_PREFIX)
    for own in _OWN_SERIES:
        node = node.removesuffix(f"/{own}")
    return node or None


@dataclass(frozen=True, slots=True)
class Claim:
    """The link that speaks for a node: the one whose stream began last."""

    owner: str
    """The link's agent address."""
    since: float
    """When its current stream first published for the node."""


@dataclass(slots=True)
class NodeClaims:
    """Which link speaks for each node when two claim one node name (an agent's old and
    new pod during a rollout, one agent under two addresses, two nodes with one name).

    The newer stream wins: an update of a link whose stream began after the holder's takes
    the node; one whose stream began before it is dropped. A link whose stream breaks lets
    go of its nodes. Pure: the caller passes the time and logs what :meth:`publish` says."""

    claims: dict[str, Claim] = field(default_factory=dict)

    def publish(self, node: str, owner: str, stream_since: float) -> tuple[bool, Claim | None]:
        """Whether ``owner``'s update for ``node`` counts, and the claim it took over from
        another link (None when it held the node already, or nobody did)."""
        held = self.claims.get(node)
        if held is not None and held.owner == owner:
            return True, None
        if held is not None and held.since > stream_since:
            return False, None
        self.claims[node] = Claim(owner, stream_since)
        return True, held

    def release(self, owner: str) -> list[str]:
        """``owner``'s stream broke or its link stopped: the nodes it held, let go."""
        nodes = [node for node, claim in self.claims.items() if claim.owner == owner]
        for node in nodes:
            del self.claims[node]
        return nodes

    def holder(self, node: str) -> str | None:
        claim = self.claims.get(node)
        return None if claim is None else claim.owner


@dataclass(frozen=True, slots=True)
class NodeSeen:
    """What the roster knows of one node."""

    heard: bool
    """Its agent was heard at the last update."""
    last_heard_at: float | None = None
    """None: never heard (discovery listed it)."""
    listed: bool = False
    """Discovery lists an agent on it now."""
    delisted: bool = False
    """Discovery listed it, then stopped, while its agent was still heard."""


_EMPTY: Mapping[str, NodeSeen] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class AgentRoster:
    nodes: Mapping[str, NodeSeen] = field(default_factory=lambda: _EMPTY)

    def update(
        self,
        *,
        targets: Iterable[AgentTarget],
        heard: Iterable[str],
        now: float,
        forget_after_s: float = FORGET_AFTER_S,
    ) -> AgentRoster:
        """The roster at ``now``: ``targets`` is discovery's current set (its nodes count,
        ready or not; a target without a node names none), ``heard`` the nodes whose
        links are heard now."""
        listed = {target.node for target in targets if target.node}
        heard_now = set(heard)
        nodes: dict[str, NodeSeen] = {}
        for node in sorted(self.nodes.keys() | listed | heard_now):
            seen = _next(
                self.nodes.get(node), node in listed, node in heard_now, now, forget_after_s
            )
            if seen is not None:
                nodes[node] = seen
        return AgentRoster(MappingProxyType(nodes))


def _next(
    seen: NodeSeen | None, listed: bool, heard: bool, now: float, forget_after_s: float
) -> NodeSeen | None:
    """One node's entry after an update; None when it is forgotten."""
    was_listed = seen is not None and (seen.listed or seen.delisted)
    if heard:
        return NodeSeen(
            heard=True, last_heard_at=now, listed=listed, delisted=was_listed and not listed
        )
    if listed:
        last = seen.last_heard_at if seen is not None else None
        return NodeSeen(heard=False, last_heard_at=last, listed=True)
    if seen is None or was_listed:
        return None
    if seen.last_heard_at is None or now - seen.last_heard_at >= forget_after_s:
        return None
    return replace(seen, heard=False)
