"""The scaler's gRPC server: its services on grpclib (with the seams of
:mod:`keda_gpu_scaler.serving.transport`), and a shutdown that never hangs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from ssl import SSLContext
from typing import Any, cast

import anyio

from keda_gpu_scaler.serving.service import ExternalScalerService
from keda_gpu_scaler.serving.streams import StreamRegistry
from keda_gpu_scaler.serving.transport import GrpcServer

DEFAULT_MAX_CONCURRENT_STREAMS = 4096
__all__ = ["DEFAULT_MAX_CONCURRENT_STREAMS", "ScalerServer"]


class ScalerServer:
    """Serves an :class:`ExternalScalerService`; ``aclose()`` ends streams cleanly, then stops."""

    def __init__(
        self,
        service: ExternalScalerService,
        streams: StreamRegistry,
        *,
        extra_handlers: Collection[Any] = (),
        max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS,
    ) -> None:
        self.service = service
        self._streams = streams
        self._server = GrpcServer(
            [service, *extra_handlers], max_concurrent_streams=max_concurrent_streams
        )
        self._started = False

    async def start(self, host: str, port: int, *, ssl: SSLContext | None = None) -> int:
        """Listen on ``host:port`` (port 0 picks one) and return the bound port.

        With ``ssl``, every connection is TLS (see :mod:`keda_gpu_scaler.serving.tls`).
        """
        await self._server.start(host, port, reuse_address=True, ssl=ssl)
        self._started = True
        listener = cast(asyncio.Server, self._server._server)
        return int(listener.sockets[0].getsockname()[1])

    async def aclose(self, *, grace_s: float = 1.0, drain_s: float = 0.3) -> None:
        """End open streams with status OK, stop accepting, then close connections.

        Streams and requests get ``grace_s`` to finish; connections then stay open for
        ``drain_s`` so clients read the trailers already sent (some clients fail every
        stream still unread when a GOAWAY arrives), and are closed whatever the clients do.
        """
        if not self._started:
            return
        self._started = False
        streams_were_open = self._streams.open_streams + self._streams.held_streams > 0
        self._streams.begin_shutdown()
        with anyio.move_on_after(grace_s):
            await self._streams.wait_streams_ended()
            # A handler that returned has yet to send its trailers (status OK).
            await self._server.wait_requests_done()
        self._server.close()  # stop listening; cancel whatever is still running
        if streams_were_open:
            await anyio.sleep(drain_s)
        # Connections still in their TLS handshake never reached connection_made: nothing to
        # wait for there.
        connected = [p for p in self._server.protocols if p.transport is not None]
        for protocol in connected:
            protocol.goaway_and_close()
        with anyio.move_on_after(grace_s):
            await self._server.wait_closed()
            # Python 3.11's wait_closed returns before a TLS close has finished its round trip.
            for protocol in connected:
                await protocol.lost.wait()
        for protocol in connected:
            transport = protocol.transport
            if not protocol.lost.is_set() and isinstance(transport, asyncio.WriteTransport):
                transport.abort()
