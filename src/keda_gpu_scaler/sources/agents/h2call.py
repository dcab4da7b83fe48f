"""One server-streaming gRPC call on an HTTP/2 connection of its own, read in the callbacks.

A cluster scaler holds one WatchNode stream per node agent and receives one message per agent
per second. Through a general gRPC client each message costs a read of the socket, h2's frame
parsing and event objects, a buffer of chunks, and a turn of the event loop for the task that
waits on that buffer. :class:`WatchCall` is an :class:`asyncio.Protocol` that knows one call:
it sends the request when the connection is made, parses the frames as they arrive and hands
each complete message to ``on_message`` right there, in ``data_received``.

What it speaks of HTTP/2 (RFC 9113), as a client with one stream (id 1):

- the preface and its SETTINGS (no push, a frame size and a stream window of its own), a
  WINDOW_UPDATE that opens the connection window as wide, then the request's HEADERS and one
  DATA frame that ends the stream;
- SETTINGS (acknowledged), PING (answered), WINDOW_UPDATE and PRIORITY (nothing to send after
  the request, so nothing to do), GOAWAY (the stream may still end; a connection lost after it
  says so), RST_STREAM on the call's stream (the call fails), frames of unknown types (ignored);
- HEADERS and CONTINUATION decoded with HPACK (every block, so that the dynamic table stays
  in step), PADDED and PRIORITY flags; the response's ``:status`` and ``content-type``, the
  trailers' ``grpc-status`` and ``grpc-message``, and a trailers-only answer;
- DATA with padding: the 5-byte gRPC prefix of each message, a compressed flag refused (none
  was asked for), a length over ``max_message_bytes`` refused from the prefix, before the
  message is read;
- flow control: received bytes are acknowledged once half a window has been received; while
  the receiver is paused (:meth:`pause`), nothing more is acknowledged, so the agent stops once
  it has sent a window's worth, and a peer sending beyond the window is a protocol error.

Anything else the peer does wrong (a frame over the size it was allowed, a PUSH_PROMISE, a
frame that makes no sense where it is) fails the call with :class:`ProtocolViolation`. Every
way the call ends is the future :attr:`WatchCall.finished`: None when the stream ended with
status OK after its last message, else one of the exceptions below or what ``on_message``
raised. ``on_message`` runs inside ``data_received`` and must not block; at most
``per_turn`` messages are handed over per turn of the event loop, the rest on the next.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable
from typing import cast

from hpack import Decoder, Encoder, HPACKError

from keda_gpu_scaler.sources.agents.h2wire import (
    ACK,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    FRAME_SIZE,
    GOAWAY,
    HEADER_BLOCK_MAX,
    HEADERS,
    HTTP_TO_GRPC,
    INITIAL_WINDOW_SIZE,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    PRIORITY_FLAG,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    STREAM,
    UNKNOWN,
    WINDOW_UPDATE,
    CallAnswered,
    ConnectionBroke,
    MessageRefused,
    NotHttp2,
    ProtocolViolation,
    encode_frame,
    error_name,
    grpc_status,
    unpad,
)

__all__ = ["WatchCall"]  # the ways a call ends are h2wire's


class WatchCall(asyncio.Protocol):
    """The call ``path`` with ``request`` (a serialized message), answered by a stream."""

    def __init__(
        self,
        *,
        authority: str,
        path: str,
        request: bytes,
        on_message: Callable[[bytes], None],
        tls: bool = False,
        max_message_bytes: int = 1 << 20,
        window: int = 1 << 20,
        per_turn: int = 16,
        user_agent: str = "keda-gpu-scaler",
    ) -> None:
        if not DEFAULT_WINDOW <= window <= MAX_WINDOW:
            raise ValueError(f"window must be {DEFAULT_WINDOW} to {MAX_WINDOW} bytes, not {window}")
        if per_turn < 1:
            raise ValueError(f"per_turn must be at least 1, not {per_turn}")
        self._request_headers = [
            (":method", "POST"),
            (":scheme", "https" if tls else "http"),
            (":path", path),
            (":authority", authority),
            ("te", "trailers"),
            ("content-type", "application/grpc"),
            ("user-agent", user_agent),
        ]
        self._request = request
        self._on_message = on_message
        self._max_message = max_message_bytes
        self._window = window
        self._per_turn = per_turn
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Done once the call is over: None for status OK, else the exception that ended it."""
        self._transport: asyncio.Transport | None = None
        self._encoder = Encoder()
        self._decoder = Decoder()
        self._decoder.max_header_list_size = HEADER_BLOCK_MAX
        self._inbound = bytearray()
        """Received bytes not yet parsed into frames (at most a frame's worth)."""
        self._messages = bytearray()
        """The stream's DATA, not yet handed over as messages."""
        self._block = bytearray()
        self._block_flags: int | None = None
        """The HEADERS frame's flags while its block's CONTINUATIONs are awaited."""
        self._headers_seen = False
        self._ended = False  # the peer ended the stream (END_STREAM)
        self._status: tuple[int, str | None] | None = None
        self._goaway: str | None = None
        self._unacked = 0  # DATA bytes received and not yet acknowledged
        self._in_flight = 0  # DATA bytes the peer may still send before an acknowledgement
        self._paused = False  # by the receiver
        self._yielding = False  # ``per_turn`` handed over: the rest on the next turn
        self._answered = False  # the peer's first frame (SETTINGS) came

    # --- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        settings = b"".join(
            struct.pack(">HI", key, value)
            for key, value in (
                (ENABLE_PUSH, 0),
                (INITIAL_WINDOW_SIZE, self._window),
                (MAX_FRAME_SIZE, FRAME_SIZE),
                (MAX_HEADER_LIST_SIZE, HEADER_BLOCK_MAX),
            )
        )
        block = self._encoder.encode(self._request_headers)
        body = b"\x00" + len(self._request).to_bytes(4, "big") + self._request
        self._in_flight = self._window
        wider = self._window - DEFAULT_WINDOW  # the connection's window, as wide as a stream's
        self._transport.write(
            PREFACE
            + encode_frame(SETTINGS, 0, 0, settings)
            + (encode_frame(WINDOW_UPDATE, 0, 0, wider.to_bytes(4, "big")) if wider else b"")
            + encode_frame(HEADERS, END_HEADERS, STREAM, block)
            + encode_frame(DATA, END_STREAM, STREAM, body)
        )

    def data_received(self, data: bytes) -> None:
        if self.finished.done():
            return
        try:
            self._parse(data)
            self._deliver()
        except Exception as exc:  # the peer's fault or on_message's: the call is over
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self.finished.done() or self._ended:
            return  # what is buffered is handed over, then the call finishes
        why = f"GOAWAY {self._goaway}, then the connection closed" if self._goaway else None
        if why is None:
            why = f"connection lost: {exc}" if exc is not None else "Connection lost"
        self._set(ConnectionBroke(why))

    # --- the receiver's side -----------------------------------------------------------------

    def pause(self) -> None:
        """Hand over no more messages (and acknowledge no more bytes) until :meth:`resume`."""
        self._paused = True

    def resume(self) -> None:
        """Hand over what is buffered (``per_turn`` per loop turn) and read on."""
        if not self._paused:
            return
        self._paused = False
        if not self._yielding:
            self._go_on()

    def close(self) -> None:
        """Close the connection (the call is cancelled if it is not over)."""
        if self._transport is not None:
            self._transport.abort()
            self._transport = None
        if not self.finished.done():
            self._set(ConnectionBroke("closed by this side"))

    # --- frames ------------------------------------------------------------------------------

    def _parse(self, data: bytes) -> None:
        if self._inbound:
            self._inbound += data
            buffer: bytes | bytearray = self._inbound
        else:
            buffer = data
        pos, size = 0, len(buffer)
        while size - pos >= 9:
            if not self._answered:
                if buffer[pos + 3] != SETTINGS or buffer[pos + 5 : pos + 9] != bytes(4):
                    raise NotHttp2("the answer does not start with HTTP/2 SETTINGS")
                self._answered = True
            length = int.from_bytes(buffer[pos : pos + 3], "big")
            if length > FRAME_SIZE:
                raise ProtocolViolation(f"a frame of {length} bytes, over the {FRAME_SIZE} allowed")
            end = pos + 9 + length
            if end > size:
                break
            kind = buffer[pos + 3]
            flags = buffer[pos + 4]
            stream = int.from_bytes(buffer[pos + 5 : pos + 9], "big") & 0x7FFF_FFFF
            payload = buffer[pos + 9 : end]
            pos = end
            if self._block_flags is not None and kind != CONTINUATION:
                raise ProtocolViolation("a header block interrupted by another frame")
            if kind == DATA:
                self._data(flags, stream, payload)
            elif kind in (HEADERS, CONTINUATION):
                self._header_frame(kind, flags, stream, payload)
            else:
                self._control(kind, flags, stream, payload)
        if buffer is self._inbound:
            del self._inbound[:pos]
        elif pos < size:
            self._inbound += buffer[pos:]

    def _data(self, flags: int, stream: int, payload: bytes | bytearray) -> None:
        if stream != STREAM or not self._headers_seen or self._ended:
            raise ProtocolViolation(f"DATA on stream {stream} where none may come")
        length = len(payload)
        self._in_flight -= length
        if self._in_flight < 0:
            raise ProtocolViolation("DATA beyond the flow control window")
        if flags & PADDED:
            payload = unpad(payload)
        self._messages += payload
        self._unacked += length
        if not self._paused:
            self._acknowledge()
        if flags & END_STREAM:
            self._ended = True
            self._status = (UNKNOWN, "the stream ended without trailers (no grpc-status)")

    def _acknowledge(self) -> None:
        if self._unacked >= self._window // 2 and self._transport is not None:
            increment = self._unacked.to_bytes(4, "big")
            self._transport.write(
                encode_frame(WINDOW_UPDATE, 0, 0, increment)
                + encode_frame(WINDOW_UPDATE, 0, STREAM, increment)
            )
            self._in_flight += self._unacked
            self._unacked = 0

    def _header_frame(self, kind: int, flags: int, stream: int, payload: bytes | bytearray) -> None:
        if stream != STREAM:
            raise ProtocolViolation(f"HEADERS on stream {stream}, not the call's")
        if kind == CONTINUATION:
            if self._block_flags is None:
                raise ProtocolViolation("a CONTINUATION without a header block to continue")
        else:
            if self._ended:
                raise ProtocolViolation("HEADERS after the end of the stream")
            if flags & PADDED:
                payload = unpad(payload)
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self._block_flags = flags
        self._block += payload
        if len(self._block) > HEADER_BLOCK_MAX:
            raise ProtocolViolation(f"a header block over {HEADER_BLOCK_MAX} bytes")
        if not flags & END_HEADERS:
            return
        block_flags, self._block_flags = self._block_flags, None
        assert block_flags is not None
        try:
            # Header names and values as str (raw=False), whatever hpack's annotations say.
            headers = cast(dict[str, str], dict(self._decoder.decode(bytes(self._block))))
        except HPACKError as exc:
            raise ProtocolViolation(f"a header block that does not decode ({exc})") from exc
        finally:
            self._block.clear()
        if not self._headers_seen:
            self._headers_seen = True
            self._response(headers, ends=bool(block_flags & END_STREAM))
        elif block_flags & END_STREAM:
            self._ended = True
            self._status = grpc_status(headers)
        else:
            raise ProtocolViolation("a second header block that does not end the stream")

    def _response(self, headers: dict[str, str], *, ends: bool) -> None:
        status = headers.get(":status")
        if status != "200":
            raise CallAnswered(
                HTTP_TO_GRPC.get(status or "", UNKNOWN), f"Received :status = {status!r}"
            )
        if ends:  # trailers only: no message, the status says why
            self._ended = True
            self._status = grpc_status(headers)
            return
        content_type = headers.get("content-type")
        if content_type is None:
            raise CallAnswered(UNKNOWN, "Missing content-type header")
        if content_type != "application/grpc" and not content_type.startswith("application/grpc+"):
            raise CallAnswered(UNKNOWN, f"Invalid content-type: {content_type!r}")

    def _control(self, kind: int, flags: int, stream: int, payload: bytes | bytearray) -> None:
        if kind == SETTINGS:
            if stream or len(payload) % 6 or (flags & ACK and payload):
                raise ProtocolViolation("a malformed SETTINGS frame")
            if not flags & ACK:
                self._write(encode_frame(SETTINGS, ACK, 0))
        elif kind == PING:
            if stream or len(payload) != 8:
                raise ProtocolViolation("a malformed PING frame")
            if not flags & ACK:
                self._write(encode_frame(PING, ACK, 0, bytes(payload)))
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                raise ProtocolViolation("a malformed WINDOW_UPDATE frame")
        elif kind == RST_STREAM:
            if len(payload) != 4 or stream == 0:
                raise ProtocolViolation("a malformed RST_STREAM frame")
            if stream == STREAM:
                code = int.from_bytes(payload, "big")
                raise ConnectionBroke(
                    f"Stream reset by remote party, error_code: {error_name(code)}"
                )
        elif kind == GOAWAY:
            if stream or len(payload) < 8:
                raise ProtocolViolation("a malformed GOAWAY frame")
            last = int.from_bytes(payload[:4], "big") & 0x7FFF_FFFF
            code = int.from_bytes(payload[4:8], "big")
            self._goaway = error_name(code)
            if last < STREAM:
                raise ConnectionBroke(f"GOAWAY {self._goaway} before the call was taken")
        elif kind == PUSH_PROMISE:
            raise ProtocolViolation("a PUSH_PROMISE, though push was disabled")
        # PRIORITY and frame types this does not know are ignored, as the RFC asks.

    # --- messages ----------------------------------------------------------------------------

    def _deliver(self) -> None:
        buffer = self._messages
        handed = 0
        pos = 0
        try:
            while not (self._paused or self._yielding) and len(buffer) - pos >= 5:
                if handed == self._per_turn:
                    self._later()
                    return
                if buffer[pos]:
                    raise MessageRefused("a compressed message, though none was asked for")
                length = int.from_bytes(buffer[pos + 1 : pos + 5], "big")
                if length > self._max_message:
                    raise MessageRefused(
                        f"a message of {length} bytes, over the cap of {self._max_message} bytes"
                    )
                end = pos + 5 + length
                if end > len(buffer):
                    break
                message = bytes(buffer[pos + 5 : end])
                pos = end
                handed += 1
                self._on_message(message)
                if self.finished.done():
                    return
        finally:
            del buffer[:pos]
        if self._paused or self._yielding:
            return
        self._acknowledge()
        if self._ended:
            if buffer:
                self._set(ConnectionBroke("the stream ended inside a message"))
            else:
                self._finish()

    def _later(self) -> None:
        """The rest of the buffered messages on the next turn of the loop."""
        self._yielding = True
        asyncio.get_running_loop().call_soon(self._go_on)

    def _go_on(self) -> None:
        """Hand over what is buffered, unless paused or over."""
        self._yielding = False
        if self._paused or self.finished.done():
            return
        try:
            self._deliver()
        except Exception as exc:  # what on_message raised: the call is over
            self._fail(exc)

    def _finish(self) -> None:
        code, message = self._status or (UNKNOWN, None)
        if code == 0:
            self._set(None)
        else:
            self._set(CallAnswered(code, message))
        if self._transport is not None:
            self._transport.close()

    def _fail(self, exc: Exception) -> None:
        self._set(exc)
        if self._transport is not None:
            self._transport.abort()
            self._transport = None

    def _set(self, outcome: Exception | None) -> None:
        if self.finished.done():
            return
        if outcome is None:
            self.finished.set_result(None)
        else:
            self.finished.set_exception(outcome)
        self.finished.exception()  # retrieved: no "exception was never retrieved" if unawaited

    def _write(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)
