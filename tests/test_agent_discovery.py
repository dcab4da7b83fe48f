"""Agent discovery for a cluster scaler: ``--agents``, and the three discovery actors.

- ``parse_agents``: a table of good and bad texts, with the messages.
- Static and DNS discovery in virtual time (trio's MockClock): the resolver is injected
  and answers loopback and documentation addresses only; no DNS is asked.
- EndpointSlice discovery against the fake Kubernetes API on 127.0.0.1, through kr8s and a
  kubeconfig the test writes (real loopback I/O, so real time: every wait is for a reading
  or for a request the fake saw, bounded; backoff delays are milliseconds).
- The EndpointSlice wire format and the merge into targets, without I/O.
- The roster's rule (missing for 5 minutes, or until discovery removes the node), pure.
"""

from __future__ import annotations

import logging
import math
import re
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio.testing
from anyio.streams.memory import MemoryObjectReceiveStream

from keda_gpu_scaler.domain.agents import FORGET_AFTER_S, AgentRoster, NodeSeen
from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.samples import AGENTS_SOURCE, AgentsReading, AgentTarget
from keda_gpu_scaler.sources.agents import (
    DnsAgents,
    DnsDiscovery,
    EndpointsAgents,
    EndpointSliceDiscovery,
    StaticAgents,
    StaticDiscovery,
    discovery_for,
    parse_agents,
)
from keda_gpu_scaler.sources.kube.endpointslices import (
    SLICE_CODEC,
    EndpointSliceInfo,
    SliceEndpoint,
    SlicePort,
    agent_targets,
)
from keda_gpu_scaler.sources.kube.wire import Delete, Upsert, WireError
from tests.fake_kube_api import (
    FakeKubeApi,
    open_fake_kube_api,
    slice_endpoint,
    slice_port,
    write_kubeconfig,
)

NS = "gpu"
SERVICE = "agents"
SELECTOR = f"kubernetes.io/service-name={SERVICE}"
SLICES_PATH = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
WATCH_WHAT = f"watch {SLICES_PATH}?labelSelector={SELECTOR}"
FAST = Backoff(initial_s=0.01, factor=2.0, maximum_s=0.04)
WAIT_S = 5.0
GRPC = [slice_port(6000, "grpc")]
SERVICE_LABEL = "kubernetes.io/service-name"


def target(
    host: str, port: int = 6000, *, pod: str = "", node: str = "", ready: bool = True
) -> AgentTarget:
    return AgentTarget(host=host, port=port, pod=pod, node=node, ready=ready)


# -- parse_agents ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("endpoints:gpu/agents:grpc", EndpointsAgents("gpu", "agents", "grpc")),
        ("endpoints:gpu/agents:6000", EndpointsAgents("gpu", "agents", 6000)),
        (
            "endpoints:kube-system/gpu-agent-2:agent-grpc",
            EndpointsAgents("kube-system", "gpu-agent-2", "agent-grpc"),
        ),
        (
            "  dns:agents.gpu.svc.cluster.local:6000 ",
            DnsAgents("agents.gpu.svc.cluster.local", 6000),
        ),
        (
            "dns:agents.gpu.svc.cluster.local.:6000",
            DnsAgents("agents.gpu.svc.cluster.local.", 6000),
        ),
        ("dns:[::1]:6000", DnsAgents("::1", 6000)),
        ("static:127.0.0.1:6000", StaticAgents((target("127.0.0.1"),))),
        (
            "static:127.0.0.1:6000,[::1]:6001,localhost:65535",
            StaticAgents((target("127.0.0.1"), target("::1", 6001), target("localhost", 65535))),
        ),
    ],
)
def test_agents_that_parse(text: str, spec: object) -> None:
    assert parse_agents(text) == spec


def test_a_spec_prints_as_it_is_written() -> None:
    for text in (
        "endpoints:gpu/agents:grpc",
        "dns:[::1]:6000",
        "static:127.0.0.1:6000,[::1]:6001",
    ):
        assert str(parse_agents(text)) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "",
            "no agents given: expected endpoints:NAMESPACE/SERVICE:PORT, dns:HOST:PORT or "
            "static:HOST:PORT[,HOST:PORT...]",
        ),
        ("agents.gpu:6000", "'agents.gpu:6000' is none of endpoints:NAMESPACE/SERVICE:PORT"),
        ("srv:agents:6000", "'srv:agents:6000' is none of"),
        (
            "endpoints:agents:grpc",
            "endpoints:agents:grpc: expected endpoints:NAMESPACE/SERVICE:PORT",
        ),
        ("endpoints:gpu/agents", "endpoints:gpu/agents: expected endpoints:NAMESPACE/SERVICE:PORT"),
        ("endpoints:GPU/agents:grpc", "namespace 'GPU' is not a namespace name"),
        ("endpoints:gpu/9agents:grpc", "service '9agents' is not a Service name"),
        ("endpoints:gpu/" + "a" * 64 + ":grpc", "is not a Service name"),
        ("endpoints:gpu/agents:", "port '' is neither a number (1-65535) nor a port name"),
        ("endpoints:gpu/agents:gRPC", "port 'gRPC' is neither"),
        ("endpoints:gpu/agents:a-very-long-port-name", "port 'a-very-long-port-name' is neither"),
        ("endpoints:gpu/agents:-grpc", "port '-grpc' is neither"),
        ("endpoints:gpu/agents:gr--pc", "port 'gr--pc' is neither"),
        ("endpoints:gpu/agents:0", "port '0' is not a number from 1 to 65535"),
        ("endpoints:gpu/agents:65536", "port '65536' is not a number from 1 to 65535"),
        ("dns:agents.gpu", "dns:agents.gpu: 'agents.gpu' has no port (dns:HOST:PORT)"),
        ("dns:agents.gpu:http", "port 'http' is not a number from 1 to 65535"),
        ("dns:agents_gpu:6000", "'agents_gpu' is not a host name"),
        ("dns::6000", "'' is not a host name"),
        ("dns:300.1.2.3:6000", "'300.1.2.3' is not an IPv4 address"),
        ("dns:::1:6000", "an IPv6 address goes in brackets, as [::1]:6000"),
        ("dns:[::1:6000", "'[::1:6000' is not [IPV6]:PORT"),
        ("dns:[::1]6000", "'[::1]6000' is not [IPV6]:PORT"),
        ("dns:[fe80::zz]:6000", "'fe80::zz' in brackets is not an IPv6 address"),
        ("static:", "static:: an empty entry"),
        ("static:127.0.0.1:6000,", "an empty entry (static:HOST:PORT[,HOST:PORT...])"),
        ("static:127.0.0.1:6000,127.0.0.1", "'127.0.0.1' has no port (HOST:PORT)"),
        ("static:127.0.0.1:6000,127.0.0.1:6000", "127.0.0.1:6000 is listed twice"),
        ("static:[::1]:6000,[0:0::1]:6000", "[::1]:6000 is listed twice"),
    ],
)
def test_agents_that_do_not_parse_name_the_bad_part(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        parse_agents(text)
    assert "\n" not in str(info.value)


def test_discovery_for_each_spec() -> None:
    endpoints = discovery_for(parse_agents("endpoints:gpu/agents:grpc"), kubeconfig="/nope")
    assert isinstance(endpoints, EndpointSliceDiscovery)
    assert (endpoints.service, endpoints.port) == ("gpu/agents", "grpc")
    dns = discovery_for(parse_agents("dns:[::1]:6000"))
    assert isinstance(dns, DnsDiscovery)
    assert (dns.host, dns.port) == ("::1", 6000)
    assert isinstance(discovery_for(parse_agents("static:127.0.0.1:6000")), StaticDiscovery)
    for actor in (endpoints, dns):
        assert actor.name == AGENTS_SOURCE


# -- static ------------------------------------------------------------------------------


@asynccontextmanager
async def running(actor: Any) -> AsyncIterator[MemoryObjectReceiveStream[AgentsReading]]:
    send, receive = anyio.create_memory_object_stream[AgentsReading](100)
    async with receive, anyio.create_task_group() as tg:
        await tg.start(actor.run, send)
        yield receive
        tg.cancel_scope.cancel()


def drain(receive: MemoryObjectReceiveStream[AgentsReading]) -> list[AgentsReading]:
    got = []
    while True:
        try:
            got.append(receive.receive_nowait())
        except anyio.WouldBlock:
            return got


@pytest.mark.trio
async def test_static_publishes_its_sorted_set_at_once_and_confirms_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = anyio.current_time()
    actor = StaticDiscovery([target("127.0.0.2"), target("::1"), target("127.0.0.10")])
    async with running(actor) as receive:
        await anyio.sleep(65)
        got = drain(receive)
    assert [r.taken_at - start for r in got] == [0.0, 30.0, 60.0]
    assert {r.targets for r in got} == {
        (target("127.0.0.2"), target("127.0.0.10"), target("::1")),
    }
    assert {(r.source, r.period_s, r.error) for r in got} == {(AGENTS_SOURCE, 30.0, None)}
    assert len(got) == 3  # every reading it published


# -- DNS --------------------------------------------------------------------------------


@dataclass
class FakeResolver:
    """Answers from a script: the addresses, or an error to raise, or "hang"."""

    answer: Sequence[str] | OSError | str = ()
    calls: list[tuple[float, str, int]] = field(default_factory=list)

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.calls.append((anyio.current_time(), host, port))
        answer = self.answer
        if answer == "hang":
            await anyio.sleep_forever()
        if isinstance(answer, OSError):
            raise answer
        assert not isinstance(answer, str)
        return answer


NXDOMAIN = socket.gaierror(socket.EAI_NONAME, "Name or service not known")


@pytest.mark.trio
async def test_dns_publishes_changes_at_once_and_an_unchanged_set_every_refresh(
    autojump_clock: trio.testing.MockClock,
) -> None:
    resolver = FakeResolver(["127.0.0.10", "127.0.0.2", "127.0.0.2"])
    actor = DnsDiscovery("agents.gpu.svc", 6000, resolve=resolver)
    start = anyio.current_time()
    async with running(actor) as receive:
        await anyio.sleep(15)
        resolver.answer = ["127.0.0.2", "127.0.0.10", "::1"]
        await anyio.sleep(10)  # t = 25
        first, second = drain(receive)
        await anyio.sleep(40)  # t = 65
        refreshed = drain(receive)
    assert [(t - start, host, port) for t, host, port in resolver.calls[:3]] == [
        (0.0, "agents.gpu.svc", 6000),
        (10.0, "agents.gpu.svc", 6000),
        (20.0, "agents.gpu.svc", 6000),
    ]
    assert first.taken_at - start == 0.0
    assert first.targets == (target("127.0.0.2"), target("127.0.0.10"))
    assert (first.source, first.period_s, first.error) == (AGENTS_SOURCE, 30.0, None)
    # IPv4 in numeric order, then IPv6; no pod, no node: DNS cannot tell.
    assert second.taken_at - start == 20.0
    assert second.targets == (target("127.0.0.2"), target("127.0.0.10"), target("::1"))
    assert [r.taken_at - start for r in refreshed] == [50.0]
    assert refreshed[0].targets == second.targets


@pytest.mark.trio
async def test_dns_failures_keep_the_last_set_with_the_error_and_log_once_per_streak(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.sources.agents")
    resolver = FakeResolver(["192.0.2.7"])
    actor = DnsDiscovery("agents.gpu.svc", 6000, resolve=resolver, timeout_s=2.0)
    start = anyio.current_time()
    async with running(actor) as receive:
        await anyio.sleep(5)
        resolver.answer = NXDOMAIN
        await anyio.sleep(20)  # failures at t = 10 and 20
        resolver.answer = "hang"
        await anyio.sleep(10)  # a timeout at t = 32
        resolver.answer = ["192.0.2.8"]
        await anyio.sleep(10)  # recovered at t = 40
        got = drain(receive)
    # Three lookups failed (at 10 and 20, then at 30 one that timed out); four readings: the
    # set, the error when it started and when it changed, and the set the answer at 40 gave.
    assert [t - start for t, _, _ in resolver.calls] == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert [(r.taken_at - start, r.targets, r.error) for r in got] == [
        (0.0, (target("192.0.2.7"),), None),
        (0.0, (target("192.0.2.7"),), "DNS lookup of agents.gpu.svc: Name or service not known"),
        (0.0, (target("192.0.2.7"),), "DNS lookup of agents.gpu.svc: no answer within 2 s"),
        (40.0, (target("192.0.2.8"),), None),
    ]
    logged = [(r.levelname, r.getMessage(), getattr(r, "error", None)) for r in caplog.records]
    assert logged == [
        ("INFO", "agent discovery by DNS answering", None),
        ("WARNING", "agent discovery by DNS failing", got[1].error),
        ("INFO", "agent discovery by DNS answering", None),
    ]


@pytest.mark.trio
async def test_dns_that_never_answered_publishes_an_empty_set_with_the_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    actor = DnsDiscovery("agents.gpu.svc", 6000, resolve=FakeResolver(NXDOMAIN))
    start = anyio.current_time()
    async with running(actor) as receive:
        await anyio.sleep(25)
        got = drain(receive)
    assert [(r.taken_at - start, r.targets, r.error is not None) for r in got] == [(0.0, (), True)]


@pytest.mark.anyio
async def test_dns_by_default_asks_the_system_resolver() -> None:
    # A literal address resolves without asking any DNS server.
    actor = DnsDiscovery("127.0.0.1", 6000)
    async with running(actor) as receive:
        with anyio.fail_after(WAIT_S):
            reading = await receive.receive()
    assert reading.targets == (target("127.0.0.1"),)
    assert reading.error is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"host": "bad_host"}, "'bad_host' is not a host name"),
        ({"port": 0}, "port '0' is not a number"),
        ({"interval_s": 0.0}, "must be positive"),
        ({"refresh_s": 5.0}, "refresh_s (5.0) must be interval_s (10.0) or more"),
    ],
)
def test_dns_refuses_bad_options(options: dict[str, Any], message: str) -> None:
    settings: dict[str, Any] = {"host": "agents", "port": 6000, **options}
    with pytest.raises(ValueError, match=re.escape(message)):
        DnsDiscovery(**settings)


# -- EndpointSlices against the fake API ---------------------------------------------------


@dataclass
class Discovery:
    actor: EndpointSliceDiscovery
    readings: MemoryObjectReceiveStream[AgentsReading]

    async def next(self) -> AgentsReading:
        with anyio.fail_after(WAIT_S):
            return await self.readings.receive()

    def nothing_queued(self) -> bool:
        return self.readings.statistics().current_buffer_used == 0


@asynccontextmanager
async def discovering(
    api: FakeKubeApi, tmp_path: Path, port: int | str = "grpc", **options: Any
) -> AsyncIterator[Discovery]:
    kubeconfig = options.pop("kubeconfig", None) or write_kubeconfig(
        tmp_path / "kubeconfig", api.url
    )
    settings: dict[str, Any] = {"backoff": FAST, "refresh_s": 60.0, **options}
    actor = EndpointSliceDiscovery(
        NS,
        SERVICE,
        port,
        kubeconfig=str(kubeconfig),
        serviceaccount=str(tmp_path / "no-service-account"),
        **settings,
    )
    async with running(actor) as receive:
        yield Discovery(actor, receive)


async def watch_opened(api: FakeKubeApi, count: int = 1) -> None:
    with anyio.fail_after(WAIT_S):
        await api.wait_until(lambda: len(api.watches()) >= count and api.open_watches == 1)


def agent(index: int, *, node: str | None = None, **conditions: bool | None) -> dict[str, Any]:
    """Agent ``index``: 127.0.0.<index>, pod agent-<index>, on node-<index>."""
    return slice_endpoint(
        f"127.0.0.{index}",
        pod=f"agent-{index}",
        node=node or f"node-{index}",
        **conditions,  # type: ignore[arg-type]
    )


def linked(index: int, port: int = 6000, *, ready: bool = True) -> AgentTarget:
    return target(f"127.0.0.{index}", port, pod=f"agent-{index}", node=f"node-{index}", ready=ready)


@pytest.mark.anyio
async def test_lists_the_services_slices_then_watches_from_the_lists_version(
    tmp_path: Path,
) -> None:
    async with open_fake_kube_api(token="fake-token") as api:
        api.add_endpoint_slice(
            NS, "agents-a", service=SERVICE, endpoints=[agent(2), agent(1)], ports=GRPC
        )
        api.add_endpoint_slice(NS, "other-x", service="other", endpoints=[agent(9)], ports=GRPC)
        api.add_endpoint_slice(
            "elsewhere", "agents-b", service=SERVICE, endpoints=[agent(8)], ports=GRPC
        )
        before = anyio.current_time()
        async with discovering(api, tmp_path) as d:
            first = await d.next()
            await watch_opened(api)
            assert d.nothing_queued()
    assert first.source == AGENTS_SOURCE
    assert first.period_s == 10.0
    assert first.error is None
    assert before < first.taken_at <= anyio.current_time()
    assert first.targets == (linked(1), linked(2))
    listed, watched = api.slice_requests()
    assert listed.path == watched.path == SLICES_PATH
    assert dict(listed.query) == {"labelSelector": SELECTOR, "limit": "500", "resourceVersion": "0"}
    assert watched.query["labelSelector"] == SELECTOR
    assert watched.query["watch"] == "true"
    assert watched.query["allowWatchBookmarks"] == "true"
    assert watched.query["resourceVersion"] == api.resource_version
    assert 15 <= int(watched.query["timeoutSeconds"]) <= 20
    assert {r.authorization for r in api.requests} == {"Bearer fake-token"}


@pytest.mark.anyio
async def test_endpoints_added_removed_turning_not_ready_and_terminating(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_endpoint_slice(NS, "agents-a", service=SERVICE, endpoints=[agent(1)], ports=GRPC)
        async with discovering(api, tmp_path) as d:
            assert (await d.next()).targets == (linked(1),)
            await watch_opened(api)
            # Added.
            api.update_endpoint_slice(NS, "agents-a", endpoints=[agent(1), agent(2)])
            assert (await d.next()).targets == (linked(1), linked(2))
            # Turning not-ready: listed, never linked.
            api.update_endpoint_slice(NS, "agents-a", endpoints=[agent(1, ready=False), agent(2)])
            assert (await d.next()).targets == (linked(1, ready=False), linked(2))
            # Terminating while still serving: listed, not linked.
            terminating = agent(2, ready=False, serving=True, terminating=True)
            api.update_endpoint_slice(NS, "agents-a", endpoints=[agent(1), terminating])
            assert (await d.next()).targets == (linked(1), linked(2, ready=False))
            # A slice managed by another controller may say ready and terminating at once.
            # It changes no target, so it publishes nothing: the next reading is the removal's.
            odd = agent(2, ready=True, serving=True, terminating=True)
            api.update_endpoint_slice(NS, "agents-a", endpoints=[agent(1), odd])
            # Removed.
            api.update_endpoint_slice(NS, "agents-a", endpoints=[agent(1)])
            assert (await d.next()).targets == (linked(1),)
            api.update_endpoint_slice(NS, "agents-a", endpoints=[])
            assert (await d.next()).targets == ()
    assert len(api.lists()) == 1
    assert len(api.watches()) == 1


@pytest.mark.anyio
async def test_null_conditions_count_as_ready_and_not_terminating(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        bare = {"addresses": ["127.0.0.1"]}
        nulls = {**agent(2), "conditions": {"ready": None, "serving": None, "terminating": None}}
        api.add_endpoint_slice(NS, "agents-a", service=SERVICE, endpoints=[bare, nulls], ports=GRPC)
        async with discovering(api, tmp_path) as d:
            reading = await d.next()
    assert reading.targets == (target("127.0.0.1"), linked(2))


@pytest.mark.anyio
async def test_several_slices_are_merged_and_a_deleted_slice_leaves_the_set(
    tmp_path: Path,
) -> None:
    async with open_fake_kube_api() as api:
        api.add_endpoint_slice(
            NS, "agents-a", service=SERVICE, endpoints=[agent(3), agent(1)], ports=GRPC
        )
        # The same endpoint in two slices for a moment (moving between them): one target,
        # and the ready copy wins.
        api.add_endpoint_slice(
            NS, "agents-b", service=SERVICE, endpoints=[agent(2), agent(3, ready=False)], ports=GRPC
        )
        async with discovering(api, tmp_path) as d:
            assert (await d.next()).targets == (linked(1), linked(2), linked(3))
            await watch_opened(api)
            api.add_endpoint_slice(
                NS,
                "agents-v6",
                service=SERVICE,
                address_type="IPv6",
                endpoints=[slice_endpoint("::1", pod="agent-4", node="node-4")],
                ports=GRPC,
            )
            added = await d.next()
            api.delete_endpoint_slice(NS, "agents-a")
            after_delete = await d.next()
            # A slice that stops being the Service's (relabelled) leaves it too.
            api.update_endpoint_slice(NS, "agents-b", labels={SERVICE_LABEL: "other"})
            relabelled = await d.next()
    assert added.targets == (
        linked(1),
        linked(2),
        linked(3),
        target("::1", pod="agent-4", node="node-4"),
    )
    assert after_delete.targets == (linked(2), linked(3, ready=False), added.targets[3])
    assert relabelled.targets == (added.targets[3],)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("port", "expected"),
    [
        ("grpc", [linked(1, 6000), linked(2, 6100)]),
        ("metrics", [linked(1, 9400), linked(2, 9400)]),
        (6000, [linked(1, 6000)]),
        (6100, [linked(2, 6100)]),
    ],
)
async def test_the_port_is_resolved_per_slice_by_name_or_number(
    tmp_path: Path, port: int | str, expected: list[AgentTarget]
) -> None:
    async with open_fake_kube_api() as api:
        # A named targetPort that resolves to different numbers on different pods: the
        # controller writes one slice per port set.
        metrics = slice_port(9400, "metrics")
        api.add_endpoint_slice(
            NS,
            "agents-a",
            service=SERVICE,
            endpoints=[agent(1)],
            ports=[slice_port(6000, "grpc"), metrics],
        )
        api.add_endpoint_slice(
            NS,
            "agents-b",
            service=SERVICE,
            endpoints=[agent(2)],
            ports=[slice_port(6100, "grpc"), metrics],
        )
        async with discovering(api, tmp_path, port=port) as d:
            reading = await d.next()
    assert list(reading.targets) == expected
    assert reading.error is None


@pytest.mark.anyio
async def test_a_port_no_slice_has_is_an_error_naming_the_ports_there_are(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_endpoint_slice(
            NS, "agents-a", service=SERVICE, endpoints=[agent(1)], ports=[slice_port(6000, "grpc")]
        )
        async with discovering(api, tmp_path, port="grpc-tls") as d:
            wrong = await d.next()
            await watch_opened(api)
            api.update_endpoint_slice(
                NS, "agents-a", ports=[slice_port(6000, "grpc"), slice_port(6443, "grpc-tls")]
            )
            fixed = await d.next()
    assert wrong.targets == ()
    assert wrong.error == (
        "the EndpointSlices of gpu/agents have no TCP port named 'grpc-tls' (they list grpc 6000)"
    )
    assert fixed.targets == (linked(1, 6443),)
    assert fixed.error is None


@pytest.mark.anyio
async def test_a_service_without_endpoints_is_an_empty_set_without_an_error(
    tmp_path: Path,
) -> None:
    async with open_fake_kube_api() as api:
        api.add_endpoint_slice(NS, "agents-a", service=SERVICE, ports=GRPC)
        async with discovering(api, tmp_path) as d:
            reading = await d.next()
    assert (reading.targets, reading.error) == ((), None)


@pytest.mark.anyio
async def test_changes_nobody_reads_publish_nothing(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_endpoint_slice(NS, "agents-a", service=SERVICE, endpoints=[agent(1)], ports=GRPC)
        async with discovering(api, tmp_path) as d:
            first = await d.next()
            await watch_opened(api)
            api.touch_endpoint_slice(NS, "agents-a")
            api.bookmark()
            api.add_endpoint_slice(NS, "other-x", service="other", endpoints=[agent(9)])
            api.update_endpoint_slice(NS, "agents-a", endpoints=[agent(1), agent(2)])
            after = await d.next()
            assert d.nothing_queued()  # two readings in all: the first, then the update's
    assert after.targets == (linked(1), linked(2))
    assert after.taken_at > first.taken_at
    # The touch, the bookmark and the update came; the other Service's slice did not.
    assert api.events_sent == 3


@pytest.mark.anyio
async def test_a_watch_that_ends_is_resumed_from_the_last_event_without_a_list(
    tmp_path: Path,
) -> None:
    async with open_fake_kube_api() as api:
        api.add_endpoint_slice(NS, "agents-a", service=SERVICE, endpoints=[agent(1)], ports=GRPC)
        async with discovering(api, tmp_path) as d:
            await d.next()
            await watch_opened(api)
            api.update_endpoint_slice(NS, "agents-a", endpoints=[agent(1), agent(2)])
            await d.next()
            seen = api.resource_version
            api.end_watches()
            await watch_opened(api, 2)
            api.update_endpoint_slice(NS, "agents-a", endpoints=[agent(2)])
            assert (await d.next()).targets == (linked(2),)
    first, second = api.watches()
    assert second.query["resourceVersion"] == seen != first.query["resourceVersion"]
    assert len(api.lists()) == 1


@pytest.mark.anyio
async def test_a_dropped_watch_is_resumed_and_misses_nothing(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_endpoint_slice(NS, "agents-a", service=SERVICE, endpoints=[agent(1)], ports=GRPC)
        async with discovering(api, tmp_path) as d:
            last = await d.next()
            await watch_opened(api)
            api.drop_connections()
            # Made while no watch is open: the resumed watch replays it.
            api.update_endpoint_slice(NS, "agents-a", endpoints=[agent(1), agent(2)])
            broken = await d.next()
            reopened = await d.next()
            replayed = await d.next()
    # The fault keeps the last set, and when the API last confirmed it (the watch that
    # opened, after the list); the reopened watch clears it.
    assert broken.error is not None
    assert broken.error.startswith(f"Kubernetes API: {WATCH_WHAT}: the connection broke")
    assert broken.targets == last.targets
    assert last.taken_at < broken.taken_at < reopened.taken_at
    assert (reopened.targets, reopened.error) == (last.targets, None)
    assert replayed.targets == (linked(1), linked(2))
    assert len(api.lists()) == 1
    assert len(api.watches()) == 2


@pytest.mark.anyio
@pytest.mark.parametrize("too_old", ["status", "event"])
async def test_a_resume_from_an_expired_version_relists(tmp_path: Path, too_old: str) -> None:
    async with open_fake_kube_api(too_old=too_old) as api:
        api.add_endpoint_slice(NS, "agents-a", service=SERVICE, endpoints=[agent(1)], ports=GRPC)
        async with discovering(api, tmp_path) as d:
            await d.next()
            await watch_opened(api)
            api.end_watches()
            await watch_opened(api, 2)
            seen = api.resource_version
            # Changes while the watch is away from the server, then history is compacted.
            api.drop_connections()
            api.update_endpoint_slice(NS, "agents-a", endpoints=[agent(2)])
            api.compact()
            while (reading := await d.next()).targets != (linked(2),):
                pass
            await watch_opened(api, 4)
    watches = api.watches()
    assert watches[2].query["resourceVersion"] == seen
    assert watches[3].query["resourceVersion"] == api.resource_version != seen
    first, relist = api.lists()
    assert first.query["resourceVersion"] == "0"
    assert "resourceVersion" not in relist.query
    assert relist.query["labelSelector"] == SELECTOR
    assert reading.error is None


@pytest.mark.anyio
async def test_an_error_event_410_relists_and_the_set_follows(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_endpoint_slice(NS, "agents-a", service=SERVICE, endpoints=[agent(1)], ports=GRPC)
        async with discovering(api, tmp_path) as d:
            await d.next()
            await watch_opened(api)
            api.update_endpoint_slice(NS, "agents-a", endpoints=[agent(1), agent(2)])
            assert (await d.next()).targets == (linked(1), linked(2))
            api.send_error(410)
            await watch_opened(api, 2)
            api.delete_endpoint_slice(NS, "agents-a")
            assert (await d.next()).targets == ()
            assert d.nothing_queued()
    assert len(api.lists()) == 2


@pytest.mark.anyio
async def test_a_big_service_is_listed_in_pages(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        for i in range(1, 6):
            api.add_endpoint_slice(
                NS, f"agents-{i}", service=SERVICE, endpoints=[agent(i)], ports=GRPC
            )
        async with discovering(api, tmp_path, page_size=2) as d:
            reading = await d.next()
    assert reading.targets == tuple(linked(i) for i in range(1, 6))
    assert [bool(r.query.get("continue")) for r in api.lists()] == [False, True, True]


@pytest.mark.anyio
async def test_an_api_that_refuses_keeps_the_last_set_with_the_error_then_clears(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.sources.agents")
    message = (
        'endpointslices.discovery.k8s.io is forbidden: User "system:serviceaccount:gpu:scaler" '
        'cannot watch resource "endpointslices"'
    )
    async with open_fake_kube_api() as api:
        api.add_endpoint_slice(NS, "agents-a", service=SERVICE, endpoints=[agent(1)], ports=GRPC)
        async with discovering(api, tmp_path) as d:
            last = await d.next()
            # Twelve refusals: at least three failed watches (kr8s asks up to four times
            # before a 403 fails the watch), each retried with backoff.
            api.fail(403, message, on="watch", count=12)
            api.end_watches()  # if the first watch opened already
            refused = await d.next()
            # Published once while the error stays the same: the next reading is the one
            # the watch that opened after the refusals gave.
            recovered = await d.next()
    assert refused.error == f"Kubernetes API: {WATCH_WHAT} answered 403 Forbidden: {message}"
    assert refused.targets == last.targets
    assert last.taken_at <= refused.taken_at < recovered.taken_at
    assert (recovered.targets, recovered.error) == (last.targets, None)
    logged = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert logged == [
        ("INFO", "Kubernetes API EndpointSlice watch answering"),
        ("WARNING", "Kubernetes API EndpointSlice watch failing"),
        ("INFO", "Kubernetes API EndpointSlice watch answering"),
    ]
    assert caplog.records[0].__dict__["service"] == "gpu/agents"


@pytest.mark.anyio
async def test_no_kubeconfig_is_an_error_reading_until_one_appears(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "mounted-later"
    async with open_fake_kube_api() as api:
        api.add_endpoint_slice(NS, "agents-a", service=SERVICE, endpoints=[agent(1)], ports=GRPC)
        async with discovering(api, tmp_path, kubeconfig=kubeconfig, restart_backoff=FAST) as d:
            missing = await d.next()
            write_kubeconfig(kubeconfig, api.url)
            found = await d.next()
    assert missing.targets == ()
    assert missing.error == f"Kubernetes API: kubeconfig {kubeconfig} does not exist"
    assert (found.targets, found.error) == ((linked(1),), None)


@pytest.mark.anyio
async def test_the_connection_is_closed_when_discovery_is_cancelled(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_endpoint_slice(NS, "agents-a", service=SERVICE, endpoints=[agent(1)], ports=GRPC)
        async with discovering(api, tmp_path) as d:
            await d.next()
            await watch_opened(api)
        with anyio.fail_after(WAIT_S):
            await api.wait_until(lambda: api.open_connections == 0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("GPU", "agents", "grpc"), "namespace 'GPU' is not a namespace name"),
        (("gpu", "Agents", "grpc"), "service 'Agents' is not a Service name"),
        (("gpu", "agents", 70000), "port '70000' is not a number from 1 to 65535"),
        (("gpu", "agents", "GRPC"), "port 'GRPC' is neither"),
    ],
)
def test_endpoint_slice_discovery_refuses_bad_names(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        EndpointSliceDiscovery(*args)


# -- the EndpointSlice wire format and the merge, without I/O ------------------------------


def test_a_slice_decodes_what_is_read_and_skips_the_rest() -> None:
    body = (
        b'{"kind":"EndpointSliceList","metadata":{"resourceVersion":"931"},"items":[{'
        b'"metadata":{"namespace":"gpu","name":"agents-x","resourceVersion":"930",'
        b'"labels":{"kubernetes.io/service-name":"agents"}},"addressType":"IPv4",'
        b'"endpoints":[{"addresses":["10.0.3.17"],"nodeName":"n3","zone":"z",'
        b'"targetRef":{"kind":"Pod","namespace":"gpu","name":"agent-q"},'
        b'"conditions":{"ready":false,"serving":true,"terminating":true}},'
        b'{"addresses":["10.0.3.18"],"targetRef":{"kind":"Node","name":"n9"}}],'
        b'"ports":[{"name":"grpc","port":6000,"protocol":"TCP"},{"port":53,"protocol":"UDP"},'
        b'{"name":"all"}]},'
        b'{"metadata":{"namespace":"gpu","name":"empty"},"endpoints":null}]}'
    )
    page = SLICE_CODEC.decode_page(body)
    assert page.resource_version == "931"
    assert page.items == (
        EndpointSliceInfo(
            namespace="gpu",
            name="agents-x",
            endpoints=(
                SliceEndpoint(
                    addresses=("10.0.3.17",),
                    ready=False,
                    terminating=True,
                    node="n3",
                    pod="agent-q",
                ),
                SliceEndpoint(addresses=("10.0.3.18",), ready=True, terminating=False),
            ),
            ports=(
                SlicePort("grpc", 6000),
                SlicePort("", 53, "UDP"),
                SlicePort("all", None),
            ),
        ),
        EndpointSliceInfo(namespace="gpu", name="empty"),
    )


def test_slice_watch_events_decode() -> None:
    eps = '{"metadata":{"namespace":"gpu","name":"a","resourceVersion":"7"},"endpoints":[]}'
    assert SLICE_CODEC.decode_event(f'{{"type":"MODIFIED","object":{eps}}}') == Upsert(
        EndpointSliceInfo(namespace="gpu", name="a"), "7"
    )
    assert SLICE_CODEC.decode_event(f'{{"type":"DELETED","object":{eps}}}') == Delete(
        EndpointSliceInfo(namespace="gpu", name="a"), "7"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{}", "the EndpointSlice list is not an EndpointSliceList"),
        (
            b'{"metadata":{"resourceVersion":"1"},"items":[{"metadata":{"namespace":"g",'
            b'"name":"a"},"endpoints":[{"conditions":{}}]}]}',
            "addresses",
        ),
        (b'{"metadata":{},"items":[]}', "the EndpointSlice list has no metadata.resourceVersion"),
    ],
)
def test_a_bad_slice_list_is_a_wire_error_naming_what(body: bytes, message: str) -> None:
    with pytest.raises(WireError, match=re.escape(message)):
        SLICE_CODEC.decode_page(body)


def eps(
    name: str, *endpoints: SliceEndpoint, ports: tuple[SlicePort, ...] = (SlicePort("grpc", 6000),)
) -> EndpointSliceInfo:
    return EndpointSliceInfo(namespace="gpu", name=name, endpoints=endpoints, ports=ports)


def ep(address: str, *, ready: bool = True, terminating: bool = False) -> SliceEndpoint:
    return SliceEndpoint(addresses=(address,), ready=ready, terminating=terminating)


@pytest.mark.parametrize(
    ("ports", "port", "resolved"),
    [
        ((SlicePort("grpc", 6000),), "grpc", 6000),
        ((SlicePort("grpc", 6000),), 6000, 6000),
        ((SlicePort("grpc", 6000),), 7000, None),
        ((SlicePort("grpc", 6000, "UDP"),), "grpc", None),
        ((SlicePort("grpc", None),), "grpc", None),
        ((SlicePort("grpc", None),), 7000, 7000),
        ((), 7000, 7000),
        ((), "grpc", None),
        ((SlicePort("", 6000),), "grpc", None),
    ],
)
def test_a_slice_port_by_name_or_number(
    ports: tuple[SlicePort, ...], port: int | str, resolved: int | None
) -> None:
    assert eps("a", ports=ports).port_for(port) == resolved


def test_one_target_per_address_sorted_with_duplicates_merged() -> None:
    multi = SliceEndpoint(addresses=("10.0.0.9", "10.0.0.10"), ready=True, terminating=False)
    found = agent_targets(
        [
            eps("a", ep("10.0.0.2", ready=False), multi),
            eps("b", ep("10.0.0.2"), ep("10.0.0.3", terminating=True)),
            eps("c", ep("10.0.0.4"), ports=(SlicePort("metrics", 9400),)),
        ],
        "grpc",
        service="gpu/agents",
    )
    assert found.problem is None
    assert found.targets == (
        target("10.0.0.2"),
        target("10.0.0.3", ready=False),
        target("10.0.0.9"),
        target("10.0.0.10"),
    )


def test_a_number_no_slice_lists_names_the_ports_there_are() -> None:
    found = agent_targets(
        [eps("a", ep("10.0.0.2"), ports=(SlicePort("grpc", 6000), SlicePort("", 9400)))],
        7000,
        service="gpu/agents",
    )
    assert found.targets == ()
    assert found.problem == (
        "the EndpointSlices of gpu/agents have no TCP port 7000 (they list 9400, grpc 6000)"
    )


# -- the roster --------------------------------------------------------------------------


def node_target(node: str, *, ready: bool = True) -> AgentTarget:
    return target("10.0.0.1", node=node, ready=ready)


def present_nodes(roster: AgentRoster) -> tuple[str, ...]:
    """The nodes heard at the last update, sorted."""
    return tuple(node for node, seen in sorted(roster.nodes.items()) if seen.heard)


def missing_nodes(roster: AgentRoster) -> tuple[str, ...]:
    """The nodes known and not heard at the last update, sorted."""
    return tuple(node for node, seen in sorted(roster.nodes.items()) if not seen.heard)


def test_a_node_only_the_links_knew_is_missing_for_five_minutes_then_forgotten() -> None:
    roster = AgentRoster().update(targets=[], heard=["a", "b"], now=100.0)
    assert (present_nodes(roster), missing_nodes(roster)) == (("a", "b"), ())
    roster = roster.update(targets=[], heard=["a"], now=110.0)
    assert (present_nodes(roster), missing_nodes(roster)) == (("a",), ("b",))
    assert roster.nodes["b"] == NodeSeen(heard=False, last_heard_at=100.0)
    roster = roster.update(targets=[], heard=["a"], now=100.0 + FORGET_AFTER_S - 0.001)
    assert missing_nodes(roster) == ("b",)
    roster = roster.update(targets=[], heard=["a"], now=100.0 + FORGET_AFTER_S)
    assert (present_nodes(roster), missing_nodes(roster)) == (("a",), ())
    assert "b" not in roster.nodes


def test_a_node_heard_again_is_present_and_its_clock_restarts() -> None:
    roster = AgentRoster().update(targets=[], heard=["a"], now=0.0)
    roster = roster.update(targets=[], heard=[], now=200.0)
    roster = roster.update(targets=[], heard=["a"], now=250.0)
    roster = roster.update(targets=[], heard=[], now=500.0)
    assert missing_nodes(roster) == ("a",)
    assert missing_nodes(roster.update(targets=[], heard=[], now=550.0)) == ()


def test_a_node_discovery_lists_is_missing_for_as_long_as_it_is_listed() -> None:
    listed = [node_target("a"), node_target("b", ready=False), target("10.0.0.9")]
    roster = AgentRoster().update(targets=listed, heard=["a"], now=0.0)
    assert (present_nodes(roster), missing_nodes(roster)) == (("a",), ("b",))
    assert roster.nodes["b"] == NodeSeen(heard=False, last_heard_at=None, listed=True)
    roster = roster.update(targets=listed, heard=[], now=3600.0)
    assert (present_nodes(roster), missing_nodes(roster)) == ((), ("a", "b"))
    assert roster.nodes["a"].last_heard_at == 0.0


def test_a_node_discovery_removes_is_forgotten_at_once() -> None:
    roster = AgentRoster().update(targets=[node_target("a"), node_target("b")], heard=["a"], now=0)
    roster = roster.update(targets=[], heard=[], now=10.0)
    assert (present_nodes(roster), missing_nodes(roster), dict(roster.nodes)) == ((), (), {})


def test_a_node_removed_from_discovery_while_heard_is_forgotten_when_it_goes_quiet() -> None:
    roster = AgentRoster().update(targets=[node_target("a")], heard=["a"], now=0.0)
    # The endpoint is gone (a drained node), the stream still runs for a moment.
    roster = roster.update(targets=[], heard=["a"], now=5.0)
    assert present_nodes(roster) == ("a",)
    assert roster.nodes["a"].delisted
    roster = roster.update(targets=[], heard=[], now=6.0)
    assert dict(roster.nodes) == {}


def test_a_node_listed_again_after_delisting_follows_the_listing() -> None:
    roster = AgentRoster().update(targets=[node_target("a")], heard=["a"], now=0.0)
    roster = roster.update(targets=[], heard=["a"], now=1.0)
    roster = roster.update(targets=[node_target("a")], heard=["a"], now=2.0)
    assert roster.nodes["a"] == NodeSeen(heard=True, last_heard_at=2.0, listed=True)
    roster = roster.update(targets=[node_target("a")], heard=[], now=2.0 + 10 * FORGET_AFTER_S)
    assert missing_nodes(roster) == ("a",)


def test_the_roster_is_a_value() -> None:
    empty = AgentRoster()
    later = empty.update(targets=[], heard=["a"], now=0.0)
    assert dict(empty.nodes) == {}
    assert later != empty
    assert later == AgentRoster().update(targets=[], heard=["a"], now=0.0)
    with pytest.raises(TypeError):
        later.nodes["b"] = NodeSeen(heard=True)  # type: ignore[index]
    assert math.isclose(FORGET_AFTER_S, 300.0)
