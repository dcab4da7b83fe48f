"""The grpclib server, with the HTTP/2 stream limit raised and a shutdown that never hangs.

grpclib advertises ``SETTINGS_MAX_CONCURRENT_STREAMS`` 100 (h2's default) and has no
option for it, while KEDA puts every stream for one scaler address on one connection. The
protocol below sends the raised limit in the very first SETTINGS frame, so no stream is
ever refused while an update waits for its acknowledgement.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import weakref
from asyncio import BaseTransport
from collections.abc import Collection
from ssl import SSLContext
from typing import Any, cast

import anyio
from grpclib.config import Configuration
from grpclib.const import Status
from grpclib.protocol import Connection, EventsProcessor, H2Protocol
from grpclib.server import Handler, Server
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.settings import SettingCodes, Settings

from keda_gpu_scaler.serving.service import ExternalScalerService
from keda_gpu_scaler.serving.streams import StreamRegistry

log = logging.getLogger(__name__)

DEFAULT_MAX_CONCURRENT_STREAMS = 4096
__all__ = ["DEFAULT_MAX_CONCURRENT_STREAMS", "ScalerServer", "Status"]


class _StreamLimitProtocol(H2Protocol):
    """grpclib's H2Protocol with a configurable stream limit in the initial SETTINGS."""

    def __init__(
        self,
        handler: Handler,
        config: Configuration,
        h2_config: H2Configuration,
        *,
        max_concurrent_streams: int,
    ) -> None:
        super().__init__(handler, config, h2_config)
        self._max_concurrent_streams = max_concurrent_streams
        self.transport: BaseTransport | None = None
        self.lost = asyncio.Event()
        """Set once the connection is gone (TLS included: its close takes a round trip)."""

    def connection_made(self, transport: BaseTransport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Without it every RPC waits ~40 ms for delayed ACKs.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        h2_conn = H2Connection(config=self.h2_config)
        h2_conn.local_settings = Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: self._max_concurrent_streams,
                SettingCodes.MAX_HEADER_LIST_SIZE: h2_conn.DEFAULT_MAX_HEADER_LIST_SIZE,
            },
        )
        h2_conn.initiate_connection()
        initial = h2_conn.local_settings.initial_window_size
        conn_delta = self.config.http2_connection_window_size - initial
        if conn_delta:
            h2_conn.increment_flow_control_window(conn_delta)
        if self.config.http2_stream_window_size != initial:
            h2_conn.update_settings(
                {SettingCodes.INITIAL_WINDOW_SIZE: self.config.http2_stream_window_size}
            )
        self.connection = Connection(h2_conn, cast(Any, transport), config=self.config)
        self.connection.flush()
        self.connection.initialize()
        self.processor = EventsProcessor(self.handler, self.connection)

    def connection_lost(self, exc: BaseException | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            self.lost.set()

    def goaway_and_close(self) -> None:
        connection = getattr(self, "connection", None)
        if connection is None:
            return
        try:
            connection._connection.close_connection()  # GOAWAY: no new streams here
            connection.flush()
        except Exception:  # the peer may already be gone; closing is all that matters
            log.debug("GOAWAY not sent", exc_info=True)
        connection.close()


class _Server(Server):
    def __init__(self, handlers: Collection[Any], *, max_concurrent_streams: int) -> None:
        super().__init__(handlers)
        self._max_concurrent_streams = max_concurrent_streams
        self.protocols: weakref.WeakSet[_StreamLimitProtocol] = weakref.WeakSet()

    def _protocol_factory(self) -> H2Protocol:
        self.__gc_step__()
        handler = Handler(self._mapping, self._codec, self._status_details_codec, self.__dispatch__)
        self._handlers.add(handler)
        protocol = _StreamLimitProtocol(
            handler,
            self._config,
            self._h2_config,
            max_concurrent_streams=self._max_concurrent_streams,
        )
        self.protocols.add(protocol)
        return protocol

    async def wait_requests_done(self) -> None:
        """Until every request task has finished, trailers included."""
        tasks = [t for h in self._handlers for t in h._tasks.values() if not t.done()]
        if tasks:
            await asyncio.wait(tasks)


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
        self._server = _Server(
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
        streams_were_open = self._streams.open_streams > 0
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
