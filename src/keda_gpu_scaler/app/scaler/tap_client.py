"""``keda-gpu-scaler tap``: print a running server's debug tap, one JSON object per line.

The events go to standard output; what the client itself has to say (connected, a filter
that matches nothing, an error) goes to standard error, so the output stays JSON lines.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Mapping

import anyio
import httpx

EXIT_UNREACHABLE = 1
QUIET_WARNING_S = 10.0
"""With a filter, a tap this long without a matching event says so (once per quiet spell)."""

Write = Callable[[str], None]


async def follow(
    client: httpx.AsyncClient,
    url: str,
    params: Mapping[str, str],
    *,
    out: Write,
    err: Write,
    quiet_warning_s: float = QUIET_WARNING_S,
) -> None:
    """Stream the tap at ``url`` until it ends; raises :class:`httpx.HTTPError`."""
    async with client.stream("GET", url, params=dict(params)) as response:
        if response.status_code != 200:
            raise httpx.HTTPStatusError(
                f"answered {response.status_code}", request=response.request, response=response
            )
        shown = ", ".join(f"--{k} {v}" for k, v in params.items())
        err(f"keda-gpu-scaler tap: connected to {url}{f' ({shown})' if shown else ''}\n")
        last_event = anyio.current_time()

        async def warn_while_quiet() -> None:
            warned_for = None
            while True:
                quiet_since = last_event
                if warned_for == quiet_since:  # said once; look again later for a new spell
                    await anyio.sleep(quiet_warning_s)
                    continue
                await anyio.sleep_until(quiet_since + quiet_warning_s)
                if last_event == quiet_since:
                    warned_for = quiet_since
                    err(
                        f"keda-gpu-scaler tap: no event matched {shown} in "
                        f"{quiet_warning_s:g} s: is the value right (a GPU index or UUID, a "
                        "source such as nvml or replay, a trigger as namespace/name)?\n"
                    )

        async with anyio.create_task_group() as tg:
            if params:
                tg.start_soon(warn_while_quiet)
            async for line in response.aiter_lines():
                if line:
                    out(line + "\n")
                    last_event = anyio.current_time()
            tg.cancel_scope.cancel()


def _write_out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _write_err(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


_TAP_PORT = "the tap is on the metrics port (--metrics-port, 9090 by default)"


def failure(address: str, url: str, exc: httpx.HTTPError, *, probes: bool = False) -> str:
    """What went wrong, said of the address given: which port it is, when it is another of
    the scaler's, and where the tap is. ``probes``: the address answers ``/healthz``."""
    if isinstance(exc, httpx.RemoteProtocolError):
        return (
            f"{address} does not answer HTTP/1.1: it looks like the scaler's gRPC port "
            f"(--port, 6000 by default), which speaks HTTP/2; {_TAP_PORT}"
        )
    if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 404:
        if probes:
            return (
                f"{address} is the scaler's probe port (--probe-port, 8081 by default: "
                f"/healthz and /readyz only); {_TAP_PORT}"
            )
        return f"{url} answered 404: {address} is not a keda-gpu-scaler metrics port; {_TAP_PORT}"
    return f"{url}: {str(exc) or type(exc).__name__}"


async def _is_probe_port(client: httpx.AsyncClient, url: str) -> bool:
    try:
        response = await client.get(url.replace("/debug/tap", "/healthz"))
    except httpx.HTTPError:
        return False
    return response.status_code in (200, 503)


async def _until_signal(address: str, url: str, params: dict[str, str]) -> str | None:
    """Stream until SIGINT/SIGTERM or the end of the tap; the error text, if it failed."""
    error: str | None = None
    timeout = httpx.Timeout(5.0, read=None)  # a quiet tap is not a dead one
    async with (
        httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as client,
        anyio.create_task_group() as tg,
    ):

        async def stop() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()

        tg.start_soon(stop)
        try:
            await follow(client, url, params, out=_write_out, err=_write_err)
        except httpx.HTTPError as exc:
            probes = isinstance(exc, httpx.HTTPStatusError) and await _is_probe_port(client, url)
            error = failure(address, url, exc, probes=probes)
        tg.cancel_scope.cancel()
    return error


def run_tap(
    address: str,
    *,
    source: str | None = None,
    device: str | None = None,
    metric: str | None = None,
    trigger: str | None = None,
) -> int:
    """Follow the tap at ``address`` (HOST:PORT, checked by the parser); the exit status.

    A closed standard output (``tap | head -1``) and Ctrl-C propagate, for the caller to
    end quietly.
    """
    url = f"http://{address}/debug/tap"
    filters = {"source": source, "device": device, "metric": metric, "trigger": trigger}
    params = {k: v for k, v in filters.items() if v is not None}
    error = anyio.run(_until_signal, address, url, params, backend="asyncio")
    if error is not None:
        print(f"keda-gpu-scaler tap: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE
    return 0
