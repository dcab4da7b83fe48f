"""``keda-gpu-scaler tap``: print a running server's debug tap, one JSON object per line."""

from __future__ import annotations

import signal
import sys

import anyio
import httpx

EXIT_UNREACHABLE = 1


async def _stream(url: str, params: dict[str, str]) -> None:
    timeout = httpx.Timeout(5.0, read=None)  # a quiet tap is not a dead one
    async with (
        httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client,
        client.stream("GET", url, params=params) as response,
    ):
        if response.status_code != 200:
            raise httpx.HTTPStatusError(
                f"{url} answered {response.status_code}",
                request=response.request,
                response=response,
            )
        async for line in response.aiter_lines():
            if line:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()


async def _until_signal(url: str, params: dict[str, str]) -> str | None:
    """Stream until SIGINT/SIGTERM or the end of the tap; the error text, if it failed."""
    error: str | None = None
    async with anyio.create_task_group() as tg:

        async def stop() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()

        tg.start_soon(stop)
        try:
            await _stream(url, params)
        except httpx.HTTPError as exc:
            error = str(exc) or type(exc).__name__
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
    url = f"http://{address}/debug/tap"
    filters = {"source": source, "device": device, "metric": metric, "trigger": trigger}
    params = {k: v for k, v in filters.items() if v is not None}
    try:
        error = anyio.run(_until_signal, url, params, backend="asyncio")
    except BrokenPipeError:
        return 0
    if error is not None:
        print(f"keda-gpu-scaler tap: {url}: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE
    return 0
