"""Agent discovery: which node agents a cluster scaler links to (``--agents``).

    endpoints:NAMESPACE/SERVICE:PORT   the EndpointSlices of a Service, listed then watched
                                       through the Kubernetes API: every address of every
                                       endpoint, ready or not, with its pod and node; PORT
                                       is the slices' port name or number
    dns:HOST:PORT                      every A/AAAA address of HOST (a headless Service),
                                       looked up again every 10 s; no API access needed,
                                       but no pod, node or readiness either
    static:HOST:PORT[,HOST:PORT...]    a fixed list, for tests and demos ([::1]:6000 for
                                       IPv6)

:func:`parse_agents` reads the text (pure, in :mod:`~keda_gpu_scaler.sources.agents.spec`);
:func:`discovery_for` makes the actor. Each actor's ``run(send)`` publishes the **whole**
set it sees (:class:`~keda_gpu_scaler.domain.samples.AgentsReading`, targets sorted) on its
own channel, which the links read (it is not the aggregator's): at once when the set or
the error changes, and the same set again at most once per ``refresh_s``, so ``taken_at``
(when the set was last confirmed) stays within a period of the truth and a consumer can
tell a set that discovery stopped confirming (stale after three ``period_s``):

    endpoints   confirmed by every answer of the API (a watch ends cleanly every 15 to
                20 s when nothing changes); refresh 1 s, period 10 s
    dns         confirmed by every good lookup; refresh 30 s, period 30 s
    static      confirmed every 30 s; period 30 s

Failures never empty the set: a reading with ``error`` set keeps the last set and its
``taken_at`` (a lookup that fails or times out, the API not answering or refusing, the port
on none of the Service's EndpointSlices, no Kubernetes configuration at all), published
when the error starts or changes; the next good answer clears it. Nothing here raises out
of ``run`` for such causes, so discovery needs no supervisor.
"""

from __future__ import annotations

import logging
import math
import random
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.domain.samples import AGENTS_SOURCE, AgentsReading, AgentTarget
from keda_gpu_scaler.sources.agents.spec import (
    AgentsSpec,
    DnsAgents,
    EndpointsAgents,
    StaticAgents,
    check_host,
    check_namespace,
    check_service,
    parse_agents,
    port_number,
    slice_port,
)
from keda_gpu_scaler.sources.cadence import every
from keda_gpu_scaler.sources.kube.client import SERVICE_ACCOUNT
from keda_gpu_scaler.sources.kube.endpointslices import agent_targets, endpoint_slices, host_order
from keda_gpu_scaler.sources.kube.listwatch import (
    DEFAULT_BACKOFF,
    DEFAULT_PAGE_SIZE,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_WATCH_TIMEOUT_S,
    ListWatch,
)

DEFAULT_DNS_INTERVAL_S = 10.0
DEFAULT_DNS_TIMEOUT_S = 5.0
DEFAULT_REFRESH_S = 30.0
"""How often DNS and static discovery confirm an unchanged set (their ``period_s``)."""
ENDPOINTS_PERIOD_S = 10.0
ENDPOINTS_REFRESH_S = 1.0
RESTART_BACKOFF = Backoff()
"""Between attempts when there is no Kubernetes configuration at all (0.5 s to 30 s)."""

__all__ = [
    "AgentDiscovery",
    "AgentsSpec",
    "DnsAgents",
    "DnsDiscovery",
    "EndpointSliceDiscovery",
    "EndpointsAgents",
    "Resolve",
    "StaticAgents",
    "StaticDiscovery",
    "discovery_for",
    "parse_agents",
    "resolve_addresses",
]

log = logging.getLogger(__name__)


# -- readings ------------------------------------------------------------------------------


class _Announcer:
    """When the set is worth a reading, and the reading (pure: the actor sends it)."""

    def __init__(self, *, period_s: float, refresh_s: float) -> None:
        if refresh_s < 0:
            raise ValueError(f"refresh_s must be 0 or more, not {refresh_s}")
        self._period_s = period_s
        self._refresh_s = refresh_s
        self.targets: tuple[AgentTarget, ...] = ()
        self.error: str | None = None
        self.confirmed_at: float | None = None
        self._published_at = -math.inf
        """When the last reading was made; -inf before the first."""

    def confirmed(
        self, targets: tuple[AgentTarget, ...], now: float, *, problem: str | None = None
    ) -> AgentsReading | None:
        """Discovery found ``targets`` at ``now``: a reading if it is due."""
        due = (
            self.confirmed_at is None
            or targets != self.targets
            or problem != self.error
            or now - self._published_at >= self._refresh_s
        )
        self.targets, self.error, self.confirmed_at = targets, problem, now
        return self._reading(now, now) if due else None

    def failed(self, reason: str, now: float) -> AgentsReading | None:
        """Discovery failed at ``now``: a reading (the last set, with the error) when the
        error is new."""
        if reason == self.error and self._published_at > -math.inf:
            return None
        self.error = reason
        taken_at = self.confirmed_at if self.confirmed_at is not None else now
        return self._reading(taken_at, now)

    def _reading(self, taken_at: float, now: float) -> AgentsReading:
        self._published_at = now
        return AgentsReading(
            source=AGENTS_SOURCE,
            taken_at=taken_at,
            period_s=self._period_s,
            targets=self.targets,
            error=self.error,
        )


def _sorted(targets: Iterable[AgentTarget]) -> tuple[AgentTarget, ...]:
    return tuple(sorted(set(targets), key=lambda t: (host_order(t.host), t.port)))


class AgentDiscovery(Protocol):
    """A discovery actor: ``run`` publishes :class:`AgentsReading` on ``send`` until
    cancelled (and closes it then), calling ``task_status.started()`` at once."""

    name: str

    async def run(
        self,
        send: MemoryObjectSendStream[AgentsReading],
        *,
        task_status: TaskStatus[None] = ...,
    ) -> None: ...


# -- static ----------------------------------------------------------------------------------


class StaticDiscovery:
    """The targets given, published at once and confirmed every ``refresh_s``."""

    name = AGENTS_SOURCE

    def __init__(self, targets: Iterable[AgentTarget], *, refresh_s: float = DEFAULT_REFRESH_S):
        if refresh_s <= 0:
            raise ValueError(f"refresh_s must be positive, not {refresh_s}")
        self._targets = _sorted(targets)
        self._refresh_s = refresh_s
        self._announcer = _Announcer(period_s=refresh_s, refresh_s=0.0)

    async def run(
        self,
        send: MemoryObjectSendStream[AgentsReading],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            task_status.started()
            async for now in every(self._refresh_s):
                reading = self._announcer.confirmed(self._targets, now)
                assert reading is not None  # refresh 0: every confirmation publishes
                await send.send(reading)


# -- DNS -------------------------------------------------------------------------------------

Resolve = Callable[[str, int], Awaitable[Sequence[str]]]
"""Every address of a host name; raises ``OSError`` when the lookup fails."""


async def resolve_addresses(host: str, port: int) -> Sequence[str]:
    """Every A and AAAA address of ``host``, through the system resolver."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class DnsDiscovery:
    """Every address of ``host`` (a headless Service's name), looked up every
    ``interval_s``; a lookup waits ``timeout_s`` at most. ``resolve`` is the lookup (the
    system resolver by default; tests give their own)."""

    name = AGENTS_SOURCE

    def __init__(
        self,
        host: str,
        port: int,
        *,
        interval_s: float = DEFAULT_DNS_INTERVAL_S,
        refresh_s: float = DEFAULT_REFRESH_S,
        timeout_s: float = DEFAULT_DNS_TIMEOUT_S,
        resolve: Resolve = resolve_addresses,
    ) -> None:
        check_host(host, "DNS discovery")
        port_number(str(port), "DNS discovery")
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be positive")
        if refresh_s < interval_s:
            raise ValueError(f"refresh_s ({refresh_s}) must be interval_s ({interval_s}) or more")
        self.host = host
        self.port = port
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._resolve = resolve
        self._announcer = _Announcer(period_s=refresh_s, refresh_s=refresh_s)
        self._failing = False

    async def run(
        self,
        send: MemoryObjectSendStream[AgentsReading],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            task_status.started()
            async for _ in every(self._interval_s):
                reading = await self._lookup()
                if reading is not None:
                    await send.send(reading)

    async def _lookup(self) -> AgentsReading | None:
        try:
            with anyio.fail_after(self._timeout_s):
                addresses = await self._resolve(self.host, self.port)
        except TimeoutError:
            return self._failed(
                f"DNS lookup of {self.host}: no answer within {self._timeout_s:g} s"
            )
        except OSError as exc:
            return self._failed(f"DNS lookup of {self.host}: {exc.strerror or exc}")
        targets = _sorted(AgentTarget(host=address, port=self.port) for address in addresses)
        if self._failing or self._announcer.confirmed_at is None:
            log.info(
                "agent discovery by DNS answering",
                extra={"source": AGENTS_SOURCE, "host": self.host, "agents": len(targets)},
            )
        self._failing = False
        return self._announcer.confirmed(targets, anyio.current_time())

    def _failed(self, reason: str) -> AgentsReading | None:
        if not self._failing:
            # Once per failure streak: a name that does not resolve fails every interval.
            log.warning(
                "agent discovery by DNS failing",
                extra={"source": AGENTS_SOURCE, "host": self.host, "error": reason},
            )
        self._failing = True
        return self._announcer.failed(reason, anyio.current_time())


# -- EndpointSlices ----------------------------------------------------------------------


class EndpointSliceDiscovery:
    """The EndpointSlices of ``namespace/service`` through the Kubernetes API (listed, then
    watched, by the engine the pod watch uses), merged into targets on ``port`` (a slice
    port's name or number); see :mod:`~keda_gpu_scaler.sources.kube.endpointslices` for
    what each endpoint becomes. The options are the pod watch's."""

    name = AGENTS_SOURCE

    def __init__(
        self,
        namespace: str,
        service: str,
        port: int | str,
        *,
        kubeconfig: str | None = None,
        serviceaccount: str = SERVICE_ACCOUNT,
        watch_timeout_s: int = DEFAULT_WATCH_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        refresh_s: float = ENDPOINTS_REFRESH_S,
        page_size: int = DEFAULT_PAGE_SIZE,
        backoff: Backoff = DEFAULT_BACKOFF,
        restart_backoff: Backoff = RESTART_BACKOFF,
        rng: random.Random | None = None,
    ) -> None:
        where = "EndpointSlice discovery"
        check_namespace(namespace, where)
        check_service(service, where)
        self.service = f"{namespace}/{service}"
        self.port = slice_port(str(port), where)
        self._restart_backoff = restart_backoff
        self._announcer = _Announcer(period_s=ENDPOINTS_PERIOD_S, refresh_s=refresh_s)
        self._engine = ListWatch(
            endpoint_slices(namespace, service),
            source=AGENTS_SOURCE,
            log=log,
            log_fields=lambda: {"service": self.service, "slices": len(self._engine.store)},
            kubeconfig=kubeconfig,
            serviceaccount=serviceaccount,
            watch_timeout_s=watch_timeout_s,
            request_timeout_s=request_timeout_s,
            page_size=page_size,
            backoff=backoff,
            rng=rng,
        )
        self._unavailable = 0

    async def run(
        self,
        send: MemoryObjectSendStream[AgentsReading],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            task_status.started()

            async def answered(_changed: bool, now: float) -> None:
                self._unavailable = 0
                found = agent_targets(self._engine.store.items(), self.port, service=self.service)
                reading = self._announcer.confirmed(found.targets, now, problem=found.problem)
                if reading is not None:
                    await send.send(reading)

            async def failed(reason: str, now: float) -> None:
                reading = self._announcer.failed(reason, now)
                if reading is not None:
                    await send.send(reading)

            while True:
                try:
                    await self._engine.run(answered=answered, failed=failed)
                except SourceUnavailable as exc:
                    await self._unconfigured(str(exc), failed)

    async def _unconfigured(
        self, reason: str, failed: Callable[[str, float], Awaitable[None]]
    ) -> None:
        """No Kubernetes configuration: an error reading, then try again (a kubeconfig
        mounted later, or a service account, is found)."""
        self._unavailable += 1
        delay = self._restart_backoff.delay(self._unavailable)
        if reason != self._announcer.error:
            log.warning(
                "agent discovery cannot reach the Kubernetes API",
                extra={"source": AGENTS_SOURCE, "error": reason, "retry_in_s": delay},
            )
        await failed(reason, anyio.current_time())
        await anyio.sleep(delay)


def discovery_for(
    spec: AgentsSpec,
    *,
    kubeconfig: str | None = None,
    serviceaccount: str = SERVICE_ACCOUNT,
) -> AgentDiscovery:
    """The discovery actor ``spec`` asks for, with its defaults."""
    if isinstance(spec, EndpointsAgents):
        return EndpointSliceDiscovery(
            spec.namespace,
            spec.service,
            spec.port,
            kubeconfig=kubeconfig,
            serviceaccount=serviceaccount,
        )
    if isinstance(spec, DnsAgents):
        return DnsDiscovery(spec.host, spec.port)
    return StaticDiscovery(spec.targets)
