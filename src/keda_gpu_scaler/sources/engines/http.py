"""Fetch an engine's ``/metrics`` safely: vetted, pinned addresses, capped in size and time.

SSRF (defect D10 of the Go project): before any connection the hostname is resolved and
**every** address is checked (``refusal_for_address``: link-local, cloud metadata IPv4 and
IPv6, ...; and the optional allow-list); one bad address refuses the endpoint. The request
then goes to the vetted IP itself, with the original ``Host`` header (and, for https, the
original name as SNI, which is also the name the certificate is verified against). We pin
by rewriting the URL rather than with a custom resolver or transport: httpx has no resolver
hook, a transport would have to wrap httpcore internals, and a rewritten URL means no
second DNS lookup happens at all, so a rebinding between check and connect cannot matter.
Redirects are never followed (a 3xx is an error naming the target), and proxies from the
environment must be off (:func:`new_engine_client`), since a proxy would resolve again.

Errors, translated where httpx raises them:
    EndpointRefused  the endpoint is refused by policy (configuration: fix the trigger)
    ScrapeFailed     resolution, connection, timeout, status, size or parse failure
                     (transient: the sampler publishes it and tries again next cycle)
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio
import httpx

from keda_gpu_scaler.domain.endpoints import IpAddress, endpoint_refusal, refusal_for_address
from keda_gpu_scaler.domain.errors import EndpointRefused, ScrapeFailed
from keda_gpu_scaler.sources.engines.promtext import (
    Exposition,
    ExpositionError,
    Selection,
    parse_exposition,
)

ACCEPT = "text/plain; version=0.0.4"
"""Never OpenMetrics: prometheus_client then renames vLLM's series (``vllm_`` escaping)."""
DEFAULT_MAX_BYTES = 4 << 20

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[Sequence[IpAddress]]]

_TRANSLATED: tuple[tuple[type[httpx.HTTPError], str], ...] = (
    (httpx.ConnectTimeout, "connect timed out"),
    (httpx.TimeoutException, "timed out"),
    (httpx.ConnectError, "connection failed"),
    (httpx.RemoteProtocolError, "protocol error"),
    (httpx.DecodingError, "cannot decode the response body"),
    (httpx.HTTPError, "request failed"),
)
"""httpx exception -> what an operator reads; first match wins, so subclasses come first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrapePolicy:
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 5.0
    total_timeout_s: float = 10.0
    """Caps a server that trickles bytes just inside the read timeout."""
    max_bytes: int = DEFAULT_MAX_BYTES
    """Decoded body size cap (a gzip bomb counts at its inflated size)."""
    allowed_networks: tuple[IpNetwork, ...] | None = None
    """When set, every resolved address must lie in one of these networks."""

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(
            connect=self.connect_timeout_s,
            read=self.read_timeout_s,
            write=self.read_timeout_s,
            pool=self.connect_timeout_s,
        )


@dataclass(frozen=True, slots=True)
class Scrape:
    """One pod's parsed payload: which address answered and how long it took."""

    address: str
    exposition: Exposition
    duration_s: float


@dataclass(frozen=True, slots=True)
class PodScrape:
    address: str
    scrape: Scrape | None
    error: str | None


def new_engine_client(*, max_connections: int = 64) -> httpx.AsyncClient:
    """The shared client: no proxies from the environment (they would re-resolve names)."""
    return httpx.AsyncClient(
        trust_env=False,
        follow_redirects=False,
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=16),
    )


async def system_resolver(host: str, port: int) -> list[IpAddress]:
    """Every A/AAAA address of ``host``, in resolver order, without duplicates."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: dict[IpAddress, None] = {}
    for *_, sockaddr in infos:
        found[ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])] = None
    return list(found)


class EngineScraper:
    """GETs ``/metrics`` through one shared ``httpx.AsyncClient`` (a MockTransport in tests)."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        policy: ScrapePolicy | None = None,
        resolve: Resolver = system_resolver,
    ) -> None:
        self._client = client
        self._policy = policy or ScrapePolicy()
        self._resolve = resolve

    async def vetted_addresses(self, url: str) -> list[IpAddress]:
        """Resolve ``url``'s host and check every address; no connection is made."""
        reason = endpoint_refusal(url)
        if reason is not None:
            raise EndpointRefused(url, reason)
        parsed = httpx.URL(url)
        try:
            addresses = list(await self._resolve(parsed.host, _port(parsed)))
        except OSError as exc:
            raise ScrapeFailed(f"cannot resolve {parsed.host}: {exc.strerror or exc}") from exc
        if not addresses:
            raise ScrapeFailed(f"{parsed.host} resolves to no address")
        for ip in addresses:
            refusal = self._refusal(ip)
            if refusal is not None:
                raise EndpointRefused(url, f"{parsed.host} resolves to {refusal}")
        return addresses

    async def fetch(self, url: str, selection: Selection) -> Scrape:
        """Scrape one endpoint at its first vetted address."""
        addresses = await self.vetted_addresses(url)
        return await self.fetch_at(url, addresses[0], selection)

    async def fetch_pods(self, url: str, selection: Selection) -> list[PodScrape]:
        """``endpointDiscovery: dns``: scrape every address of a headless Service, concurrently.

        A refused address refuses them all (raised); a failing pod is an entry with its error.
        """
        addresses = await self.vetted_addresses(url)
        results: dict[IpAddress, PodScrape] = {}

        async def one(ip: IpAddress) -> None:
            try:
                results[ip] = PodScrape(str(ip), await self.fetch_at(url, ip, selection), None)
            except ScrapeFailed as exc:
                results[ip] = PodScrape(str(ip), None, str(exc))

        async with anyio.create_task_group() as tg:
            for ip in addresses:
                tg.start_soon(one, ip)
        return [results[ip] for ip in addresses]

    async def fetch_at(self, url: str, ip: IpAddress, selection: Selection) -> Scrape:
        """GET ``url`` from ``ip`` (already vetted), then parse the wanted families."""
        started = anyio.current_time()
        body = await self._get(url, ip)
        try:
            text = body.decode("utf-8")
            exposition = parse_exposition(text, selection)
        except UnicodeDecodeError as exc:
            raise ScrapeFailed(f"{url} ({ip}): response is not UTF-8 text: {exc.reason}") from exc
        except ExpositionError as exc:
            raise ScrapeFailed(f"{url} ({ip}): not Prometheus text: {exc}") from exc
        return Scrape(str(ip), exposition, anyio.current_time() - started)

    def _refusal(self, ip: IpAddress) -> str | None:
        reason = refusal_for_address(ip)
        allowed = self._policy.allowed_networks
        if reason is None and allowed is not None and not any(ip in net for net in allowed):
            reason = f"{ip}, which is not in the allowed networks"
        return reason

    async def _get(self, url: str, ip: IpAddress) -> bytes:
        request = self._pinned_request(httpx.URL(url), ip)
        where = f"{url} ({ip})"
        try:
            with anyio.fail_after(self._policy.total_timeout_s):
                return await self._send(request, where)
        except TimeoutError as exc:
            limit = self._policy.total_timeout_s
            raise ScrapeFailed(f"{where}: no complete response within {limit:g} s") from exc
        except httpx.HTTPError as exc:
            raise ScrapeFailed(f"{where}: {_describe(exc)}") from exc

    def _pinned_request(self, url: httpx.URL, ip: IpAddress) -> httpx.Request:
        extensions = {"sni_hostname": url.host} if url.scheme == "https" else None
        return self._client.build_request(
            "GET",
            url.copy_with(host=str(ip)),
            headers={"Accept": ACCEPT, "Host": url.netloc.decode("ascii")},
            timeout=self._policy.timeout(),
            extensions=extensions,
        )

    async def _send(self, request: httpx.Request, where: str) -> bytes:
        response = await self._client.send(request, stream=True, follow_redirects=False)
        try:
            _check_status(response, where)
            return await _read_capped(response, self._policy.max_bytes, where)
        finally:
            await response.aclose()


def _port(url: httpx.URL) -> int:
    return url.port or (443 if url.scheme == "https" else 80)


def _check_status(response: httpx.Response, where: str) -> None:
    if response.is_redirect:
        target = response.headers.get("location", "?")
        raise ScrapeFailed(f"{where}: redirect to {target} refused (HTTP {response.status_code})")
    if response.status_code != 200:
        raise ScrapeFailed(f"{where}: returned HTTP {response.status_code}")


async def _read_capped(response: httpx.Response, limit: int, where: str) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ScrapeFailed(f"{where}: response larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:  # stop reading: the rest never enters memory
            raise ScrapeFailed(f"{where}: response larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _describe(exc: httpx.HTTPError) -> str:
    for kind, text in _TRANSLATED:
        if isinstance(exc, kind):
            detail = str(exc)
            return f"{text}: {detail}" if detail else text
    return str(exc)  # unreachable: HTTPError is the last row
