"""HTTP/2 framing and gRPC statuses for :mod:`keda_gpu_scaler.sources.agents.h2call`.

The frame types, flags and settings of RFC 9113 that the call speaks, the limits it sets, the
ways a call fails, and the small pure pieces of framing: a frame's bytes, a padded payload's
content, a gRPC status from trailers (with gRPC's mapping of HTTP statuses for a response
that carries none).
"""

from __future__ import annotations

from typing import Final

from grpclib.const import Status
from grpclib.metadata import decode_grpc_message
from h2.errors import ErrorCodes

__all__ = [
    "CallAnswered",
    "ConnectionBroke",
    "MessageRefused",
    "NotHttp2",
    "ProtocolViolation",
]

# Frame types and flags (RFC 9113, section 6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# SETTINGS parameters.
ENABLE_PUSH, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 0x2, 0x4, 0x5
MAX_HEADER_LIST_SIZE = 0x6

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
STREAM = 1
DEFAULT_WINDOW = 65_535
MAX_WINDOW = (1 << 31) - 1
FRAME_SIZE = 1 << 18
"""The largest frame the agent may send us: a node's update fits in one."""
HEADER_BLOCK_MAX = 1 << 16
"""Bytes of one header block (HEADERS and its CONTINUATIONs) at most."""
HTTP_TO_GRPC: Final = {
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
UNKNOWN = 2


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


def error_name(code: int) -> str:
    """An HTTP/2 error code's name (``CANCEL``), or the code in hex for one h2 does not know."""
    try:
        return ErrorCodes(code).name
    except ValueError:
        return f"0x{code:x}"


def encode_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    header = len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big")
    return header + payload


def unpad(payload: bytes | bytearray) -> bytes | bytearray:
    if not payload:
        raise ProtocolViolation("a padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ProtocolViolation("padding longer than its frame")
    return payload[1 : len(payload) - pad]


def grpc_status(headers: dict[str, str]) -> tuple[int, str | None]:
    raw = headers.get("grpc-status")
    if raw is None:
        return UNKNOWN, "Missing grpc-status header"
    if not raw.isdigit():
        return UNKNOWN, f"Invalid grpc-status: {raw!r}"
    message = headers.get("grpc-message")
    return int(raw), None if message is None else decode_grpc_message(message)
