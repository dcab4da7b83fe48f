"""The real scaler on 127.0.0.1 with ephemeral ports, as edge tests start it; and a way for
fake servers to serve connections without leaving one unclosed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from anyio.abc import SocketListener, SocketStream, TaskGroup
from anyio.streams.stapled import MultiListener

from keda_gpu_scaler.app.scaler.compose import RunningScaler, open_scaler
from keda_gpu_scaler.pipeline.supervisor import Sampler


@asynccontextmanager
async def loopback_scaler(
    source: Sampler, *, port: int = 0, **options: Any
) -> AsyncIterator[RunningScaler]:
    """gRPC (on ``port``; 0: a free one), metrics and probes on free loopback ports;
    ``options`` override the defaults."""
    settings: dict[str, Any] = {
        "metrics_port": 0,
        "probe_port": 0,
        "health_check_interval_s": 0.001,
        **options,
    }
    async with open_scaler(source, host="127.0.0.1", port=port, **settings) as running:
        yield running


async def serve_closing(
    listener: MultiListener[SocketStream],
    handler: Callable[[SocketStream], Awaitable[None]],
    task_group: TaskGroup,
) -> None:
    """``listener.serve(handler, task_group=...)``, except that no accepted connection is
    left to the garbage collector: anyio's own accepts a connection, then starts its handler,
    and a cancellation between the two leaves a socket no one closes (a ResourceWarning, an
    error here). Every connection still open when this ends is closed."""
    (one,) = listener.listeners
    assert isinstance(one, SocketListener)  # create_tcp_listener on one address
    open_: set[SocketStream] = set()

    async def handle(stream: SocketStream) -> None:
        try:
            await handler(stream)
        finally:
            open_.discard(stream)

    try:
        while True:
            stream = await one.accept()
            open_.add(stream)
            task_group.start_soon(handle, stream)
    finally:
        with anyio.CancelScope(shield=True):
            for stream in list(open_):
                await anyio.aclose_forcefully(stream)
