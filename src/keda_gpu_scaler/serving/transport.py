"""Seams into grpclib and h2: what the scaler's gRPC server changes in them, and why.

grpclib advertises ``SETTINGS_MAX_CONCURRENT_STREAMS`` 100 (h2's default) and has no
option for it, while KEDA puts every stream for one scaler address on one connection. The
protocol below sends the raised limit in the very first SETTINGS frame, so no stream is
ever refused while an update waits for its acknowledgement. The other classes remove work
that grows with the number of open streams or is spent on every frame for nothing: h2's
walk over every stream per new one and its trace line per frame, grpclib's window waits
and its sweep of request tasks, one write per frame, and a parse per repeated request.

These touch library internals (grpclib and h2 are pinned); ``tests/test_server_seams.py``
fails loudly when an upgrade moves them. :class:`GrpcServer` puts them together;
:mod:`keda_gpu_scaler.serving.server` runs it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import weakref
from asyncio import BaseTransport
from collections.abc import Callable, Collection
from typing import Any, Literal, cast

from grpclib.config import Configuration
from grpclib.encoding.proto import ProtoCodec
from grpclib.protocol import AbstractHandler, Connection, EventsProcessor, H2Protocol
from grpclib.protocol import Stream as GrpclibStream
from grpclib.server import Handler, Server
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import Event, RemoteSettingsChanged, WindowUpdated
from h2.exceptions import StreamClosedError, StreamIDTooLowError
from h2.settings import SettingCodes, Settings
from hyperframe.frame import Frame, RstStreamFrame

from keda_gpu_scaler.serving._proto.externalscaler import GetMetricsRequest, ScaledObjectRef

log = logging.getLogger(__name__)

__all__ = ["GrpcServer", "RepeatedRequests"]


class _H2Connection(H2Connection):
    """h2's connection, without a walk over every stream for each new one, and without
    formatting every frame it receives.

    h2 counts open inbound streams by walking all of them (forgetting the closed ones as it
    goes) each time a client opens a stream, to enforce ``MAX_CONCURRENT_STREAMS``. With a
    thousand StreamIsActive streams on a connection that is a thousand steps for every unary
    call. The number of streams h2 still holds is an upper bound of the open ones, which is
    all the limit check needs while it is below the limit; the walk runs again once that
    number has doubled since the last walk, so closed streams are still forgotten, at a
    constant cost per stream.
    """

    _walk_at = 0

    @property
    def open_inbound_streams(self) -> int:
        held = len(self.streams)
        if held < self._walk_at and held < self.local_settings.max_concurrent_streams:
            return held
        count = super().open_inbound_streams
        self._walk_at = 2 * len(self.streams) + 64
        return count

    def _receive_frame(self, frame: Frame) -> list[Event]:
        """h2's (4.4.1, pinned), less its first line: a trace log whose argument,
        ``repr(frame)``, is computed for every received frame whether anything logs it or not
        (a DATA frame's body serialized again to show its first bytes), about a twentieth
        of the server's CPU under unary load."""
        events: list[Event]
        try:
            frames, events = self._frame_dispatch_table[frame.__class__](frame)
        except StreamClosedError as e:
            # Closed by RST_STREAM: answer with RST_STREAM; otherwise a connection error.
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = e.error_code
                self._prepare_for_sending([f])
                events = e._events
            else:
                raise
        except StreamIDTooLowError as e:
            # A stream already forgotten: a stream error if it was reset, a connection error
            # if it ended (STREAM_CLOSED) or was closed implicitly (PROTOCOL_ERROR).
            if self._stream_is_closed_by_reset(e.stream_id):
                f = RstStreamFrame(e.stream_id)
                f.error_code = ErrorCodes.STREAM_CLOSED
                self._prepare_for_sending([f])
                events = []
            elif self._stream_is_closed_by_end(e.stream_id):
                raise StreamClosedError(e.stream_id) from e
            else:
                raise
        else:
            self._prepare_for_sending(frames)
        return events


class _WindowEvent(asyncio.Event):
    """A stream's "window updated" event that knows when its stream waits on it."""

    def __init__(self, waiting: set[_WindowEvent]) -> None:
        super().__init__()
        self._waiting = waiting

    async def wait(self) -> Literal[True]:
        self._waiting.add(self)
        try:
            return await super().wait()
        finally:
            self._waiting.discard(self)


class _EventsProcessor(EventsProcessor):
    """grpclib's processor, waking only the streams that wait for flow-control window.

    grpclib sets every stream's event on each connection-level WINDOW_UPDATE, which clients
    send often; with a thousand idle streams that is a thousand wake-ups for nothing. A
    stream waits only after it ran out of window, and only those are woken here.
    """

    def __init__(self, handler: AbstractHandler, connection: Connection) -> None:
        super().__init__(handler, connection)
        self._waiting: set[_WindowEvent] = set()

    def register(self, stream: GrpclibStream) -> Callable[[], None]:
        stream.window_updated = _WindowEvent(self._waiting)
        return super().register(stream)

    def process_window_updated(self, event: WindowUpdated) -> None:
        if event.stream_id == 0:
            for waiting in list(self._waiting):
                waiting.set()
        else:
            super().process_window_updated(event)

    def process_remote_settings_changed(self, event: RemoteSettingsChanged) -> None:
        if SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
            for waiting in list(self._waiting):
                waiting.set()


_DIRECT_BYTES = 2048
"""A read this small (a few requests) is parsed at once."""
_FEED_BYTES = 256
"""Of a larger read (a burst of new streams), parsed per event-loop turn: about four new
streams' headers, a few milliseconds. 2 KiB held the loop three times as long in a burst of
a thousand opens (docs/benchmarks.md, "Burst of 1000 streams opened at once")."""
_BATCH_BYTES = 4096
"""Written at once when this much is pending: about 150 StreamIsActive messages."""


class _BatchedWrites:
    """A transport whose writes of one event-loop iteration go out as one.

    grpclib writes each frame group (headers, a message, trailers) to the transport as soon
    as it is made, and asyncio sends every write at once: three system calls per unary call,
    one per message of each of a thousand streams that change together. Joined, they cost
    one per connection and loop iteration. Order is kept: every write goes through here.
    """

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._pending: list[bytes] = []
        self._size = 0
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))
        self._size += len(data)
        if self._size >= _BATCH_BYTES:
            self.flush()  # the first messages of a large burst need not wait for the last

    def flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._size = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._size = 0
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


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
        self._backlog = bytearray()
        self.lost = asyncio.Event()
        """Set once the connection is gone (TLS included: its close takes a round trip)."""

    def connection_made(self, transport: BaseTransport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Without it every RPC waits ~40 ms for delayed ACKs.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        h2_conn = _H2Connection(config=self.h2_config)
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
        writes = _BatchedWrites(cast(asyncio.Transport, transport))
        self.connection = Connection(h2_conn, cast(Any, writes), config=self.config)
        self.connection.flush()
        self.connection.initialize()
        self.processor = _EventsProcessor(self.handler, self.connection)

    def data_received(self, data: bytes) -> None:
        """Parse a large read ``_FEED_BYTES`` per turn of the event loop.

        A client that opens a thousand streams at once sends their headers in one read, and
        h2 parses it in one go: a third of a second in which nothing else runs, not the
        samplers, not the unary calls already parsed. Fed in slices, with reading paused
        while a backlog is left, every other task gets its turn between them.
        """
        if not self._backlog and len(data) <= _DIRECT_BYTES:
            super().data_received(data)
            return
        start = not self._backlog
        self._backlog += data
        if start:
            if isinstance(self.transport, asyncio.ReadTransport):
                self.transport.pause_reading()
            asyncio.get_running_loop().call_soon(self._feed_backlog)

    def _feed_backlog(self) -> None:
        if self.lost.is_set():
            self._backlog.clear()
            return
        chunk = bytes(self._backlog[:_FEED_BYTES])
        del self._backlog[:_FEED_BYTES]
        super().data_received(chunk)
        if self._backlog:
            asyncio.get_running_loop().call_soon(self._feed_backlog)
        elif isinstance(self.transport, asyncio.ReadTransport) and not self.transport.is_closing():
            self.transport.resume_reading()

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


class _Handler(Handler):
    """grpclib's handler, forgetting finished request tasks at a constant cost per request.

    grpclib rebuilds its table of request tasks every ten requests; with a thousand open
    streams in it that is a hundred steps per request. Swept again once as many requests
    have come as tasks were left by the last sweep, the work per request stays constant and
    the table stays within twice its live size.
    """

    _since_sweep = 0
    _left_by_sweep = 0

    def __gc_step__(self) -> None:
        self._since_sweep += 1
        if self._since_sweep >= max(10, self._left_by_sweep):
            self.__gc_collect__()
            self._since_sweep = 0
            self._left_by_sweep = len(self._tasks)


class RepeatedRequests(ProtoCodec):
    """grpclib's codec, decoding a request of ``message_types`` once per distinct bytes.

    KEDA sends each ScaledObject's same GetMetrics and IsActive request on every poll, and
    betterproto2 spends about 30 µs parsing one. Requests are only read, never changed, so
    one decoded message serves every call with the same bytes. At most ``max_entries`` are
    kept; past that the oldest goes first.
    """

    def __init__(self, message_types: Collection[type], *, max_entries: int = 4096) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self._types = frozenset(message_types)
        self._max_entries = max_entries
        self._decoded: dict[tuple[type, bytes], Any] = {}

    def decode(self, data: bytes, message_type: Any) -> Any:
        if message_type not in self._types:
            return super().decode(data, message_type)
        key = (message_type, bytes(data))
        message = self._decoded.get(key)
        if message is None:
            message = super().decode(data, message_type)
            if len(self._decoded) >= self._max_entries:
                del self._decoded[next(iter(self._decoded))]
            self._decoded[key] = message
        return message


class GrpcServer(Server):
    """grpclib's server with this module's connection, protocol, handler and codec."""

    def __init__(self, handlers: Collection[Any], *, max_concurrent_streams: int) -> None:
        super().__init__(handlers, codec=RepeatedRequests((GetMetricsRequest, ScaledObjectRef)))
        self._max_concurrent_streams = max_concurrent_streams
        self.protocols: weakref.WeakSet[_StreamLimitProtocol] = weakref.WeakSet()

    def _protocol_factory(self) -> H2Protocol:
        self.__gc_step__()
        handler = _Handler(
            self._mapping, self._codec, self._status_details_codec, self.__dispatch__
        )
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
