"""The scraper: SSRF checks before any connection, pinning, caps, errors, a real local server."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator, Callable

import anyio
import httpx
import pytest
from anyio.abc import SocketStream

from keda_gpu_scaler.domain.endpoints import IpAddress
from keda_gpu_scaler.domain.engines import EngineKind
from keda_gpu_scaler.domain.errors import EndpointRefused, ScrapeFailed
from keda_gpu_scaler.sources.engines.extract import SELECTIONS
from keda_gpu_scaler.sources.engines.http import (
    ACCEPT,
    EngineScraper,
    ScrapePolicy,
    new_engine_client,
    system_resolver,
)
from tests.engine_payloads import VLLM_V0, FakeEndpoint, FakeResolver, fixture

VLLM = SELECTIONS[EngineKind.VLLM]
POD = ipaddress.ip_address("10.1.2.3")


def _ip(text: str) -> IpAddress:
    return ipaddress.ip_address(text)


def _must_not_connect(request: httpx.Request) -> httpx.Response:
    pytest.fail(f"a connection was attempted to {request.url}")


@pytest.mark.anyio
@pytest.mark.parametrize("address", ["169.254.169.254", "fd00:ec2::254", "fe80::1", "0.0.0.0"])
async def test_refused_address_is_refused_before_any_connection(address: str) -> None:
    resolver = FakeResolver({"vllm.evil.test": [POD, _ip(address)]})
    async with httpx.AsyncClient(transport=httpx.MockTransport(_must_not_connect)) as client:
        scraper = EngineScraper(client, resolve=resolver)
        with pytest.raises(EndpointRefused, match="not allowed") as info:
            await scraper.fetch("http://vllm.evil.test:8000/metrics", VLLM)
        with pytest.raises(EndpointRefused):
            await scraper.fetch_pods("http://vllm.evil.test:8000/metrics", VLLM)
    assert "vllm.evil.test resolves to" in str(info.value)
    assert address in str(info.value)
    assert resolver.calls == [("vllm.evil.test", 8000)] * 2


@pytest.mark.anyio
async def test_static_refusals_need_no_resolution() -> None:
    resolver = FakeResolver({})
    async with httpx.AsyncClient(transport=httpx.MockTransport(_must_not_connect)) as client:
        scraper = EngineScraper(client, resolve=resolver)
        for url, reason in [
            ("ftp://x/metrics", "unsupported scheme"),
            ("http://metadata.google.internal/x", "cloud metadata hostname"),
            ("http://169.254.169.254/latest", "cloud metadata address not allowed"),
            ("http://169.254.10.1/metrics", "link-local address not allowed"),
        ]:
            with pytest.raises(EndpointRefused, match=reason):
                await scraper.fetch(url, VLLM)
    assert resolver.calls == []


@pytest.mark.anyio
async def test_allow_list_refuses_addresses_outside_it() -> None:
    policy = ScrapePolicy(allowed_networks=(ipaddress.ip_network("10.0.0.0/8"),))
    resolver = FakeResolver({"in.test": [POD], "out.test": [_ip("192.168.1.1")]})
    endpoint = FakeEndpoint({str(POD): fixture(VLLM_V0)})
    async with endpoint.client() as client:
        scraper = EngineScraper(client, policy=policy, resolve=resolver)
        assert (await scraper.fetch("http://in.test:8000/metrics", VLLM)).address == str(POD)
        with pytest.raises(EndpointRefused, match="not in the allowed networks"):
            await scraper.fetch("http://out.test:8000/metrics", VLLM)


@pytest.mark.anyio
async def test_request_is_pinned_to_the_vetted_address_with_the_original_host() -> None:
    resolver = FakeResolver({"vllm.ns.svc": [POD, _ip("10.9.9.9")]})
    endpoint = FakeEndpoint({str(POD): fixture(VLLM_V0)})
    async with endpoint.client() as client:
        scrape = await EngineScraper(client, resolve=resolver).fetch(
            "http://vllm.ns.svc:8000/metrics?x=1", VLLM
        )
    (request,) = endpoint.requests
    assert str(request.url) == "http://10.1.2.3:8000/metrics?x=1"
    assert request.headers["host"] == "vllm.ns.svc:8000"
    assert request.headers["accept"] == ACCEPT
    assert scrape.address == "10.1.2.3"
    assert len(scrape.exposition.samples) > 10


@pytest.mark.anyio
async def test_https_sends_the_hostname_as_sni_and_ipv6_is_bracketed() -> None:
    v6 = _ip("fd12::7")
    endpoint = FakeEndpoint({"fd12::7": fixture(VLLM_V0)})
    async with endpoint.client() as client:
        scraper = EngineScraper(client, resolve=FakeResolver({"tgi.test": [v6]}))
        await scraper.fetch("https://tgi.test/metrics", VLLM)
    (request,) = endpoint.requests
    assert str(request.url) == "https://[fd12::7]/metrics"
    assert request.headers["host"] == "tgi.test"
    assert request.extensions["sni_hostname"] == "tgi.test"


def iter_chunks(body: bytes, copies: int) -> AsyncIterator[bytes]:
    """A streamed body without Content-Length, so only the streaming cap can stop it."""

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(copies):
            yield body

    return chunks()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (lambda: httpx.Response(503, text="busy"), "returned HTTP 503"),
        (
            lambda: httpx.Response(302, headers={"location": "http://169.254.169.254/"}),
            "redirect to http://169.254.169.254/ refused",
        ),
        (lambda: httpx.Response(200, text="<html>oops</html>"), "not Prometheus text: line 1"),
        (lambda: httpx.Response(200, content=b"\xff\xfe\x00garbage"), "not UTF-8"),
        (lambda: httpx.Response(200, text="m 1\n" * 400), "response larger than 1024 bytes"),
        (
            lambda: httpx.Response(200, content=iter_chunks(b"m 1\n" * 100, 5)),
            "response larger than 1024 bytes",
        ),
    ],
)
async def test_bad_answers_are_failed_scrapes_with_a_reason(
    response: Callable[[], httpx.Response], reason: str
) -> None:
    endpoint = FakeEndpoint({str(POD): response()})
    async with endpoint.client() as client:
        scraper = EngineScraper(
            client, policy=ScrapePolicy(max_bytes=1024), resolve=FakeResolver({"e.test": [POD]})
        )
        with pytest.raises(ScrapeFailed, match=reason) as info:
            await scraper.fetch("http://e.test:8000/metrics", VLLM)
    assert "http://e.test:8000/metrics (10.1.2.3)" in str(info.value)


@pytest.mark.anyio
async def test_connection_and_resolution_failures_are_failed_scrapes() -> None:
    async with FakeEndpoint().client() as client:
        scraper = EngineScraper(client, resolve=FakeResolver({"down.test": [POD]}))
        with pytest.raises(ScrapeFailed, match="connection failed: connection refused"):
            await scraper.fetch("http://down.test:8000/metrics", VLLM)
        with pytest.raises(ScrapeFailed, match=r"cannot resolve nowhere\.test"):
            await scraper.fetch("http://nowhere.test:8000/metrics", VLLM)


@pytest.mark.trio
async def test_slow_endpoint_times_out_in_virtual_time(autojump_clock: object) -> None:
    endpoint = FakeEndpoint({str(POD): "m 1"}, delay_s=60.0)
    async with endpoint.client() as client:
        scraper = EngineScraper(
            client,
            policy=ScrapePolicy(total_timeout_s=3.0),
            resolve=FakeResolver({"s.test": [POD]}),
        )
        start = anyio.current_time()
        with pytest.raises(ScrapeFailed, match="no complete response within 3 s"):
            await scraper.fetch("http://s.test:8000/metrics", VLLM)
        assert anyio.current_time() - start == pytest.approx(3.0)


@pytest.mark.anyio
async def test_fan_out_scrapes_every_pod_and_reports_each_failure() -> None:
    pods = [_ip("10.0.0.1"), _ip("10.0.0.2"), _ip("10.0.0.3")]
    endpoint = FakeEndpoint(
        {"10.0.0.1": fixture(VLLM_V0), "10.0.0.3": httpx.Response(500)}
    )  # 10.0.0.2 refuses connections
    async with endpoint.client() as client:
        scraper = EngineScraper(client, resolve=FakeResolver({"vllm-headless": pods}))
        results = await scraper.fetch_pods("http://vllm-headless:8000/metrics", VLLM)
    assert [r.address for r in results] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert results[0].scrape is not None and results[0].error is None
    assert results[1].error is not None and "connection failed" in results[1].error
    assert results[2].error is not None and "HTTP 500" in results[2].error
    assert sorted(r.url.host for r in endpoint.requests) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


# --- the real httpx path, on a real socket --------------------------------------------------


async def _serve_fixture(stream: SocketStream, body: bytes, seen: list[bytes]) -> None:
    async with stream:
        request = b""
        while b"\r\n\r\n" not in request:
            request += await stream.receive()
        seen.append(request)
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
        )
        await stream.send(head + body)


@pytest.mark.anyio
async def test_real_http_server_on_loopback() -> None:
    body = fixture(VLLM_V0).encode()
    seen: list[bytes] = []
    async with (
        await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0) as listener,
        anyio.create_task_group() as tg,
    ):
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.start_soon(listener.serve, lambda s: _serve_fixture(s, body, seen))
        async with new_engine_client() as client:
            named = EngineScraper(client, resolve=FakeResolver({"vllm.test": [_ip("127.0.0.1")]}))
            scrape = await named.fetch(f"http://vllm.test:{port}/metrics", VLLM)
            literal = await EngineScraper(client).fetch(f"http://127.0.0.1:{port}/metrics", VLLM)
        tg.cancel_scope.cancel()
    assert scrape.address == literal.address == "127.0.0.1"
    assert scrape.exposition == literal.exposition
    assert len(scrape.exposition.samples) == 23
    assert seen[0].startswith(b"GET /metrics HTTP/1.1\r\n")
    assert f"host: vllm.test:{port}\r\n".encode() in seen[0].lower()
    assert b"accept: text/plain; version=0.0.4\r\n" in seen[0].lower()


@pytest.mark.anyio
async def test_system_resolver_on_a_literal_needs_no_network() -> None:
    assert await system_resolver("127.0.0.1", 80) == [_ip("127.0.0.1")]


def test_sources_never_raise_the_answers_to_keda() -> None:
    """InvalidTrigger and NoData are what the decision layer answers; sources publish data."""
    import ast
    from pathlib import Path

    sources = Path(__file__).resolve().parents[1] / "src" / "keda_gpu_scaler" / "sources"
    offenders = []
    for path in sources.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Name) and node.id in {"InvalidTrigger", "NoData"}:
                offenders.append(f"{path.relative_to(sources)}:{node.lineno} {node.id}")
    assert offenders == []


def test_a_refusal_is_permanent_and_a_failed_scrape_transient() -> None:
    from keda_gpu_scaler.domain.errors import SourceFailure, SourceUnavailable

    refused = EndpointRefused("http://169.254.169.254/", "cloud metadata address not allowed")
    assert isinstance(refused, SourceUnavailable)
    assert refused.reason == "cloud metadata address not allowed"
    assert str(refused) == (
        'endpoint "http://169.254.169.254/" refused: cloud metadata address not allowed'
    )
    assert issubclass(ScrapeFailed, SourceFailure)
