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
from typing import Final, cast

from grpclib.const import Status
from grpclib.metadata import decode_grpc_message
from h2.errors import ErrorCodes
from hpack import Decoder, Encoder, HPACKError

__all__ = [
    "CallAnswered",
    "ConnectionBroke",
    "MessageRefused",
    "NotHttp2",
    "ProtocolViolation",
    "WatchCall",
]

# Frame types and flags (RFC 9113, section 6).
_DATA, _HEADERS, _PRIORITY, _RST_STREAM, _SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
_PUSH_PROMISE, _PING, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9
_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# SETTINGS parameters.
_ENABLE_PUSH, _INITIAL_WINDOW_SIZE, _MAX_FRAME_SIZE = 0x2, 0x4, 0x5
_MAX_HEADER_LIST_SIZE = 0x6

_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_STREAM = 1
_DEFAULT_WINDOW = 65_535
_MAX_WINDOW = (1 << 31) - 1
_FRAME_SIZE = 1 << 18
"""The largest frame the agent may send us: a node's update fits in one."""
_HEADER_BLOCK_MAX = 1 << 16
"""Bytes of one header block (HEADERS and its CONTINUATIONs) at most."""
_HTTP_TO_GRPC: Final = {
    "400": 13,
    "401": 16,
    "403": 7,
    "404": 12,
    "429": 14,
    "502": 14,
    "503": 14,
    "504": 14,
}
"""HTTP statuses as gRPC codes (gRPC's "HTTP to gRPC status code mapping"); others UNKNOWN."""
_UNKNOWN = 2


class ConnectionBroke(Exception):
    """The connection or the stream went away before the call ended (lost, reset)."""


class ProtocolViolation(Exception):
    """The peer broke HTTP/2 or gRPC framing."""


class NotHttp2(ProtocolViolation):
    """What answered does not speak HTTP/2: its first frame is not SETTINGS (a TLS port
    dialled in plaintext, another protocol)."""


class MessageRefused(Exception):
    """A message this call does not take: compressed, or longer than allowed."""


class CallAnswered(Exception):
    """The call ended with a gRPC status other than OK (``code``), or no valid status."""

    def __init__(self, code: int, message: str | None) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{self.status_name}: {message}" if message else self.status_name)

    @property
    def status_name(self) -> str:
        """The code's gRPC name (``UNIMPLEMENTED``), or ``status N`` for one gRPC has not."""
        try:
            return Status(self.code).name
        except ValueError:
            return f"status {self.code}"


def _error_name(code: int) -> str:
    """An HTTP/2 error code's name (``CANCEL``), or the code in hex for one h2 does not know."""
    try:
        return ErrorCodes(code).name
    except ValueError:
        return f"0x{code:x}"


def _encode_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    header = len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big")
    return header + payload


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
        if not _DEFAULT_WINDOW <= window <= _MAX_WINDOW:
            raise ValueError(
                f"window must be {_DEFAULT_WINDOW} to {_MAX_WINDOW} bytes, not {window}"
            )
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
        self._decoder.max_header_list_size = _HEADER_BLOCK_MAX
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
                (_ENABLE_PUSH, 0),
                (_INITIAL_WINDOW_SIZE, self._window),
                (_MAX_FRAME_SIZE, _FRAME_SIZE),
                (_MAX_HEADER_LIST_SIZE, _HEADER_BLOCK_MAX),
            )
        )
        block = self._encoder.encode(self._request_headers)
        body = b"\x00" + len(self._request).to_bytes(4, "big") + self._request
        self._in_flight = self._window
        wider = self._window - _DEFAULT_WINDOW  # the connection's window, as wide as a stream's
        self._transport.write(
            _PREFACE
            + _encode_frame(_SETTINGS, 0, 0, settings)
            + (_encode_frame(_WINDOW_UPDATE, 0, 0, wider.to_bytes(4, "big")) if wider else b"")
            + _encode_frame(_HEADERS, _END_HEADERS, _STREAM, block)
            + _encode_frame(_DATA, _END_STREAM, _STREAM, body)
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
                if buffer[pos + 3] != _SETTINGS or buffer[pos + 5 : pos + 9] != bytes(4):
                    raise NotHttp2("the answer does not start with HTTP/2 SETTINGS")
                self._answered = True
            length = int.from_bytes(buffer[pos : pos + 3], "big")
            if length > _FRAME_SIZE:
                raise ProtocolViolation(
                    f"a frame of {length} bytes, over the {_FRAME_SIZE} allowed"
                )
            end = pos + 9 + length
            if end > size:
                break
            kind = buffer[pos + 3]
            flags = buffer[pos + 4]
            stream = int.from_bytes(buffer[pos + 5 : pos + 9], "big") & 0x7FFF_FFFF
            payload = buffer[pos + 9 : end]
            pos = end
            if self._block_flags is not None and kind != _CONTINUATION:
                raise ProtocolViolation("a header block interrupted by another frame")
            if kind == _DATA:
                self._data(flags, stream, payload)
            elif kind in (_HEADERS, _CONTINUATION):
                self._header_frame(kind, flags, stream, payload)
            else:
                self._control(kind, flags, stream, payload)
        if buffer is self._inbound:
            del self._inbound[:pos]
        elif pos < size:
            self._inbound += buffer[pos:]

    def _data(self, flags: int, stream: int, payload: bytes | bytearray) -> None:
        if stream != _STREAM or not self._headers_seen or self._ended:
            raise ProtocolViolation(f"DATA on stream {stream} where none may come")
        length = len(payload)
        self._in_flight -= length
        if self._in_flight < 0:
            raise ProtocolViolation("DATA beyond the flow control window")
        if flags & _PADDED:
            payload = _unpad(payload)
        self._messages += payload
        self._unacked += length
        if not self._paused:
            self._acknowledge()
        if flags & _END_STREAM:
            self._ended = True
            self._status = (_UNKNOWN, "the stream ended without trailers (no grpc-status)")

    def _acknowledge(self) -> None:
        if self._unacked >= self._window // 2 and self._transport is not None:
            increment = self._unacked.to_bytes(4, "big")
            self._transport.write(
                _encode_frame(_WINDOW_UPDATE, 0, 0, increment)
                + _encode_frame(_WINDOW_UPDATE, 0, _STREAM, increment)
            )
            self._in_flight += self._unacked
            self._unacked = 0

    def _header_frame(self, kind: int, flags: int, stream: int, payload: bytes | bytearray) -> None:
        if stream != _STREAM:
            raise ProtocolViolation(f"HEADERS on stream {stream}, not the call's")
        if kind == _CONTINUATION:
            if self._block_flags is None:
                raise ProtocolViolation("a CONTINUATION without a header block to continue")
        else:
            if self._ended:
                raise ProtocolViolation("HEADERS after the end of the stream")
            if flags & _PADDED:
                payload = _unpad(payload)
            if flags & _PRIORITY_FLAG:
                payload = payload[5:]
            self._block_flags = flags
        self._block += payload
        if len(self._block) > _HEADER_BLOCK_MAX:
            raise ProtocolViolation(f"a header block over {_HEADER_BLOCK_MAX} bytes")
        if not flags & _END_HEADERS:
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
            self._response(headers, ends=bool(block_flags & _END_STREAM))
        elif block_flags & _END_STREAM:
            self._ended = True
            self._status = _grpc_status(headers)
        else:
            raise ProtocolViolation("a second header block that does not end the stream")

    def _response(self, headers: dict[str, str], *, ends: bool) -> None:
        status = headers.get(":status")
        if status != "200":
            raise CallAnswered(
                _HTTP_TO_GRPC.get(status or "", _UNKNOWN), f"Received :status = {status!r}"
            )
        if ends:  # trailers only: no message, the status says why
            self._ended = True
            self._status = _grpc_status(headers)
            return
        content_type = headers.get("content-type")
        if content_type is None:
            raise CallAnswered(_UNKNOWN, "Missing content-type header")
        if content_type != "application/grpc" and not content_type.startswith("application/grpc+"):
            raise CallAnswered(_UNKNOWN, f"Invalid content-type: {content_type!r}")

    def _control(self, kind: int, flags: int, stream: int, payload: bytes | bytearray) -> None:
        if kind == _SETTINGS:
            if stream or len(payload) % 6 or (flags & _ACK and payload):
                raise ProtocolViolation("a malformed SETTINGS frame")
            if not flags & _ACK:
                self._write(_encode_frame(_SETTINGS, _ACK, 0))
        elif kind == _PING:
            if stream or len(payload) != 8:
                raise ProtocolViolation("a malformed PING frame")
            if not flags & _ACK:
                self._write(_encode_frame(_PING, _ACK, 0, bytes(payload)))
        elif kind == _WINDOW_UPDATE:
            if len(payload) != 4:
                raise ProtocolViolation("a malformed WINDOW_UPDATE frame")
        elif kind == _RST_STREAM:
            if len(payload) != 4 or stream == 0:
                raise ProtocolViolation("a malformed RST_STREAM frame")
            if stream == _STREAM:
                code = int.from_bytes(payload, "big")
                raise ConnectionBroke(
                    f"Stream reset by remote party, error_code: {_error_name(code)}"
                )
        elif kind == _GOAWAY:
            if stream or len(payload) < 8:
                raise ProtocolViolation("a malformed GOAWAY frame")
            last = int.from_bytes(payload[:4], "big") & 0x7FFF_FFFF
            code = int.from_bytes(payload[4:8], "big")
            self._goaway = _error_name(code)
            if last < _STREAM:
                raise ConnectionBroke(f"GOAWAY {self._goaway} before the call was taken")
        elif kind == _PUSH_PROMISE:
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
        code, message = self._status or (_UNKNOWN, None)
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


def _unpad(payload: bytes | bytearray) -> bytes | bytearray:
    if not payload:
        raise ProtocolViolation("a padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ProtocolViolation("padding longer than its frame")
    return payload[1 : len(payload) - pad]


def _grpc_status(headers: dict[str, str]) -> tuple[int, str | None]:
    raw = headers.get("grpc-status")
    if raw is None:
        return _UNKNOWN, "Missing grpc-status header"
    if not raw.isdigit():
        return _UNKNOWN, f"Invalid grpc-status: {raw!r}"
    message = headers.get("grpc-message")
    return int(raw), None if message is None else decode_grpc_message(message)
