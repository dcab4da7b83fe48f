"""WatchCall, the agent link's one-stream gRPC client, against h2 as the server peer.

Sans-I/O: the call writes into a fake transport, h2's server-side connection (an independent
HTTP/2 implementation) reads what it wrote and answers with frames the test scripts, and those
bytes go back into ``data_received`` in whatever pieces the test chooses. A few cases are raw
bytes no correct HTTP/2 peer would send. One test runs over a real loopback socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keda_gpu_scaler.sources.agents import h2wire
from keda_gpu_scaler.sources.agents.h2call import WatchCall
from keda_gpu_scaler.sources.agents.h2wire import (
    CallAnswered,
    ConnectionBroke,
    MessageRefused,
    NotHttp2,
    ProtocolViolation,
)

pytestmark = pytest.mark.anyio

PATH = "/kedagpuscaler.v1.NodeAgent/WatchNode"
OK_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]
OK_TRAILERS = [("grpc-status", "0")]


def grpc(message: bytes, *, compressed: bool = False) -> bytes:
    return bytes([compressed]) + len(message).to_bytes(4, "big") + message


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.aborted = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


@dataclass
class Peer:
    """h2's server side, wired to a call through a fake transport."""

    call: WatchCall
    transport: FakeTransport
    received: list[bytes] = field(default_factory=list)
    server: h2.connection.H2Connection = field(
        default_factory=lambda: h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
    )
    events: list[h2.events.Event] = field(default_factory=list)

    def pump_to_server(self) -> list[h2.events.Event]:
        """Hands the server what the call wrote since; its events."""
        data = bytes(self.transport.written)
        self.transport.written.clear()
        events = self.server.receive_data(data) if data else []
        self.events += events
        return events

    def to_call(self, *, piece: int | None = None) -> None:
        """What the server has to send, into the call (in pieces of ``piece`` bytes)."""
        data = self.server.data_to_send()
        step = piece or max(len(data), 1)
        for at in range(0, len(data), step):
            self.call.data_received(data[at : at + step])

    def answer(self, *messages: bytes, trailers: list[tuple[str, str]] | None = None) -> None:
        self.server.send_headers(1, OK_HEADERS)
        for message in messages:
            self.server.send_data(1, grpc(message))
        if trailers is not None:
            self.server.send_headers(1, trailers, end_stream=True)


def open_call(on_message: Callable[[bytes], None] | None = None, **options: Any) -> Peer:
    received: list[bytes] = []
    call = WatchCall(
        authority="127.0.0.1:9400",
        path=PATH,
        request=b"",
        on_message=on_message or received.append,
        **options,
    )
    transport = FakeTransport()
    peer = Peer(call, transport, received)
    peer.server.initiate_connection()
    call.connection_made(transport)
    events = peer.pump_to_server()
    request = [e for e in events if isinstance(e, h2.events.RequestReceived)]
    assert len(request) == 1
    peer.to_call()  # the server's SETTINGS (and the ACK of ours)
    peer.pump_to_server()  # our ACK of its SETTINGS
    return peer


async def test_the_request_is_the_grpc_call_h2_understands() -> None:
    peer = open_call()
    request = next(e for e in peer.events if isinstance(e, h2.events.RequestReceived))
    headers: dict[Any, Any] = dict(request.headers)  # str: header_encoding="utf-8"
    assert headers == {
        ":method": "POST",
        ":scheme": "http",
        ":path": PATH,
        ":authority": "127.0.0.1:9400",
        "te": "trailers",
        "content-type": "application/grpc",
        "user-agent": "keda-gpu-scaler",
    }
    data = [e for e in peer.events if isinstance(e, h2.events.DataReceived)]
    assert [e.data for e in data] == [grpc(b"")]
    assert any(isinstance(e, h2.events.StreamEnded) for e in peer.events)
    assert any(isinstance(e, h2.events.SettingsAcknowledged) for e in peer.events)
    # Our SETTINGS as h2 read them: no push, our window and frame size.
    settings = next(e for e in peer.events if isinstance(e, h2.events.RemoteSettingsChanged))
    changed = {int(k): v.new_value for k, v in settings.changed_settings.items()}
    assert changed[h2.settings.SettingCodes.ENABLE_PUSH] == 0
    assert changed[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE] == 1 << 20
    assert changed[h2.settings.SettingCodes.MAX_FRAME_SIZE] == 1 << 18
    assert peer.server.outbound_flow_control_window == 1 << 20  # the connection's, widened


@pytest.mark.parametrize("piece", [None, 1, 7, 4096])
async def test_messages_arrive_whole_and_in_order_however_the_bytes_are_cut(
    piece: int | None,
) -> None:
    peer = open_call()
    messages = [b"", b"a", bytes(range(256)) * 40, b"last"]
    peer.server.send_headers(1, OK_HEADERS)
    # One message over several DATA frames, several in one frame, padding on some.
    whole = b"".join(grpc(m) for m in messages)
    peer.server.send_data(1, whole[:3], pad_length=5)
    peer.server.send_data(1, whole[3:5000])
    peer.server.send_data(1, whole[5000:], pad_length=0)
    peer.server.send_headers(1, OK_TRAILERS, end_stream=True)
    peer.to_call(piece=piece)
    for _ in range(3):
        await asyncio.sleep(0)  # at most 16 per loop turn
    assert peer.received == messages
    assert peer.call.finished.done() and peer.call.finished.result() is None
    assert peer.transport.closed


async def test_a_header_block_in_continuation_frames_with_priority_and_padding() -> None:
    peer = open_call()
    # h2 never splits a small block; frames written by hand (HPACK by h2's own encoder).
    block = peer.server.encoder.encode([*OK_HEADERS, ("x-long", "v" * 300)])
    first = block[:10]
    headers = (
        (len(first) + 1 + 5 + 2).to_bytes(3, "big")
        + bytes([0x1, 0x8 | 0x20])
        + (1).to_bytes(4, "big")
    )
    headers += bytes([2]) + bytes(5) + first + b"\x00\x00"  # pad length 2, priority, padding
    rest = block[10:]
    cont1 = len(rest[:50]).to_bytes(3, "big") + bytes([0x9, 0]) + (1).to_bytes(4, "big") + rest[:50]
    cont2 = len(rest[50:]).to_bytes(3, "big") + bytes([0x9, 0x4]) + (1).to_bytes(4, "big")
    peer.call.data_received(headers + cont1 + cont2 + rest[50:])
    # Header compression state stays in step: the trailers use h2's dynamic table.
    trailers = peer.server.encoder.encode(OK_TRAILERS)
    peer.call.data_received(_raw(0x0, 0, 1, grpc(b"one")) + _raw(0x1, 0x1 | 0x4, 1, trailers))
    assert peer.received == [b"one"]
    assert peer.call.finished.result() is None


async def test_pings_and_settings_are_answered() -> None:
    peer = open_call()
    peer.server.ping(b"12345678")
    peer.server.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 5})
    peer.to_call()
    events = peer.pump_to_server()
    acks = [e for e in events if isinstance(e, h2.events.PingAckReceived)]
    assert [a.ping_data for a in acks] == [b"12345678"]
    assert any(isinstance(e, h2.events.SettingsAcknowledged) for e in events)
    assert not peer.call.finished.done()


async def test_only_half_a_window_is_acknowledged_at_a_time_and_none_while_paused() -> None:
    window = 1 << 16
    peer = open_call(window=window)
    peer.server.send_headers(1, OK_HEADERS)
    chunk = grpc(b"x" * 1000)
    sent = 0
    while sent + len(chunk) < window // 2 - len(chunk):
        peer.server.send_data(1, chunk)
        sent += len(chunk)
    peer.to_call()
    assert not [e for e in peer.pump_to_server() if isinstance(e, h2.events.WindowUpdated)]
    peer.server.send_data(1, chunk)
    peer.server.send_data(1, chunk)
    peer.to_call()
    updated = [e for e in peer.pump_to_server() if isinstance(e, h2.events.WindowUpdated)]
    assert {e.stream_id for e in updated} == {0, 1}
    # Paused: the rest of the window comes in, nothing is acknowledged, the server is stuck.
    peer.call.pause()
    while peer.server.local_flow_control_window(1) >= len(chunk):
        peer.server.send_data(1, chunk)
    peer.to_call()
    count = len(peer.received)
    await asyncio.sleep(0)
    assert len(peer.received) == count
    assert not [e for e in peer.pump_to_server() if isinstance(e, h2.events.WindowUpdated)]
    peer.call.resume()
    for _ in range(window // len(chunk) // 16 + 2):
        await asyncio.sleep(0)
    assert len(peer.received) > count
    assert [e for e in peer.pump_to_server() if isinstance(e, h2.events.WindowUpdated)]
    assert not peer.call.finished.done()


async def test_a_receiver_that_pauses_inside_on_message_gets_nothing_more_until_resumed() -> None:
    got: list[bytes] = []
    holder: list[WatchCall] = []

    def on_message(message: bytes) -> None:
        got.append(message)
        holder[0].pause()

    peer = open_call(on_message)
    holder.append(peer.call)
    peer.answer(b"1", b"2", b"3", trailers=OK_TRAILERS)
    peer.to_call()
    assert got == [b"1"]
    peer.call.resume()
    assert got == [b"1", b"2"]
    peer.call.resume()
    assert not peer.call.finished.done()  # a message is left: not over yet
    peer.call.resume()
    assert got == [b"1", b"2", b"3"]
    assert peer.call.finished.result() is None


async def test_at_most_per_turn_messages_are_handed_over_per_loop_turn() -> None:
    peer = open_call(per_turn=4)
    peer.answer(*[b"m%d" % i for i in range(10)], trailers=OK_TRAILERS)
    peer.to_call()
    assert len(peer.received) == 4
    await asyncio.sleep(0)
    assert len(peer.received) == 8
    await asyncio.sleep(0)
    assert len(peer.received) == 10
    assert peer.call.finished.result() is None


async def test_an_error_status_in_the_trailers_or_trailers_only_is_answered() -> None:
    peer = open_call()
    peer.answer(b"one", trailers=[("grpc-status", "14"), ("grpc-message", "going%20away")])
    peer.to_call()
    with pytest.raises(CallAnswered) as caught:
        peer.call.finished.result()
    assert (caught.value.code, caught.value.message) == (14, "going away")
    assert peer.received == [b"one"]

    peer = open_call()
    peer.server.send_headers(
        1,
        [*OK_HEADERS, ("grpc-status", "12"), ("grpc-message", "Method not found")],
        end_stream=True,
    )
    peer.to_call()
    with pytest.raises(CallAnswered) as caught:
        peer.call.finished.result()
    assert (caught.value.code, caught.value.message) == (12, "Method not found")


@pytest.mark.parametrize(
    ("headers", "code", "message"),
    [
        ([(":status", "503")], 14, "Received :status = '503'"),
        ([(":status", "418")], 2, "Received :status = '418'"),
        ([(":status", "200")], 2, "Missing content-type header"),
        (
            [(":status", "200"), ("content-type", "text/html")],
            2,
            "Invalid content-type: 'text/html'",
        ),
    ],
)
async def test_an_answer_that_is_not_grpc_is_named(
    headers: list[tuple[str, str]], code: int, message: str
) -> None:
    peer = open_call()
    peer.server.send_headers(1, headers)
    peer.to_call()
    with pytest.raises(CallAnswered) as caught:
        peer.call.finished.result()
    assert (caught.value.code, caught.value.message) == (code, message)
    assert peer.transport.aborted


async def test_trailers_without_a_status_and_an_end_without_trailers_are_unknown() -> None:
    peer = open_call()
    peer.answer(b"x", trailers=[("x-other", "1")])
    peer.to_call()
    with pytest.raises(CallAnswered, match="Missing grpc-status header"):
        peer.call.finished.result()

    peer = open_call()
    peer.server.send_headers(1, OK_HEADERS)
    peer.server.send_data(1, grpc(b"x"), end_stream=True)
    peer.to_call()
    with pytest.raises(CallAnswered, match="without trailers"):
        peer.call.finished.result()


async def test_a_reset_a_goaway_and_a_lost_connection_break_the_call() -> None:
    peer = open_call()
    peer.answer(b"x")
    peer.server.reset_stream(1, error_code=h2.errors.ErrorCodes.CANCEL)
    peer.to_call()
    with pytest.raises(ConnectionBroke, match="error_code: CANCEL"):
        peer.call.finished.result()

    peer = open_call()
    peer.answer(b"x")
    peer.server.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR, last_stream_id=1)
    peer.to_call()
    assert not peer.call.finished.done()  # the stream may still end...
    peer.call.connection_lost(None)  # ...but the connection closed first
    with pytest.raises(ConnectionBroke, match="GOAWAY NO_ERROR, then the connection closed"):
        peer.call.finished.result()

    peer = open_call()
    peer.server.close_connection(error_code=h2.errors.ErrorCodes.REFUSED_STREAM, last_stream_id=0)
    peer.to_call()
    with pytest.raises(ConnectionBroke, match="GOAWAY REFUSED_STREAM before the call was taken"):
        peer.call.finished.result()

    peer = open_call()
    peer.answer(b"x")
    peer.to_call()
    peer.call.connection_lost(ConnectionResetError("reset by peer"))
    with pytest.raises(ConnectionBroke, match="connection lost: reset by peer"):
        peer.call.finished.result()
    assert peer.received == [b"x"]


async def test_a_stream_that_ends_inside_a_message_is_broken() -> None:
    peer = open_call()
    peer.server.send_headers(1, OK_HEADERS)
    peer.server.send_data(1, grpc(b"abcdef")[:7])
    peer.server.send_headers(1, OK_TRAILERS, end_stream=True)
    peer.to_call()
    with pytest.raises(ConnectionBroke, match="ended inside a message"):
        peer.call.finished.result()


async def test_a_message_over_the_cap_is_refused_from_its_prefix() -> None:
    peer = open_call(max_message_bytes=100)
    peer.server.send_headers(1, OK_HEADERS)
    peer.server.send_data(1, (101).to_bytes(5, "big"))  # the prefix alone, no body yet
    peer.to_call()
    with pytest.raises(MessageRefused, match="a message of 101 bytes, over the cap of 100 bytes"):
        peer.call.finished.result()
    assert peer.transport.aborted


async def test_a_compressed_message_is_refused() -> None:
    peer = open_call()
    peer.server.send_headers(1, OK_HEADERS)
    peer.server.send_data(1, grpc(b"zz", compressed=True))
    peer.to_call()
    with pytest.raises(MessageRefused, match="compressed"):
        peer.call.finished.result()


async def test_what_on_message_raises_ends_the_call() -> None:
    def refuse(message: bytes) -> None:
        raise ValueError(f"not this: {message!r}")

    peer = open_call(refuse)
    peer.answer(b"bad", b"never")
    peer.to_call()
    with pytest.raises(ValueError, match="not this: b'bad'"):
        peer.call.finished.result()
    assert peer.transport.aborted


def _raw(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload
    )


@pytest.mark.parametrize(
    ("frames", "error", "match"),
    [
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", NotHttp2, "does not start with HTTP/2 SETTINGS"),
        (b"\x15\x03\x03\x00\x02\x02\x46" * 2, NotHttp2, "SETTINGS"),  # TLS alerts
        (
            _raw(0x4, 0, 0, b"") + (1 << 18 + 1).to_bytes(3, "big") + bytes(6),
            ProtocolViolation,
            "over",
        ),
        (_raw(0x4, 0, 0, b"") + _raw(0x5, 0x4, 1, bytes(8)), ProtocolViolation, "PUSH_PROMISE"),
        (_raw(0x4, 0, 0, b"") + _raw(0x0, 0, 1, b"x"), ProtocolViolation, "DATA on stream 1"),
        (_raw(0x4, 0, 0, b"") + _raw(0x0, 0, 3, b"x"), ProtocolViolation, "DATA on stream 3"),
        (_raw(0x4, 0, 0, b"\x00"), ProtocolViolation, "malformed SETTINGS"),
        (_raw(0x4, 0, 0, b"") + _raw(0x6, 0, 0, b"1234"), ProtocolViolation, "malformed PING"),
        (_raw(0x4, 0, 0, b"") + _raw(0x9, 0x4, 1, b""), ProtocolViolation, "CONTINUATION without"),
        (
            _raw(0x4, 0, 0, b"") + _raw(0x1, 0, 1, b"") + _raw(0x6, 0, 0, bytes(8)),
            ProtocolViolation,
            "interrupted",
        ),
        (
            _raw(0x4, 0, 0, b"") + _raw(0x1, 0x4, 1, b"\xff\xff\xff"),
            ProtocolViolation,
            "does not decode",
        ),
    ],
)
async def test_frames_no_http2_server_sends_fail_the_call(
    frames: bytes, error: type[Exception], match: str
) -> None:
    received: list[bytes] = []
    call = WatchCall(authority="a:1", path=PATH, request=b"", on_message=received.append)
    transport = FakeTransport()
    call.connection_made(transport)
    call.data_received(frames)
    with pytest.raises(error, match=match):
        call.finished.result()
    assert transport.aborted


async def test_a_connection_closed_before_any_frame_is_broken() -> None:
    call = WatchCall(authority="a:1", path=PATH, request=b"", on_message=print)
    call.connection_made(FakeTransport())
    call.data_received(b"\x15\x03\x03\x00\x02\x02\x46")  # one TLS alert: not a frame yet
    call.connection_lost(None)
    with pytest.raises(ConnectionBroke, match="Connection lost"):
        call.finished.result()


async def test_data_beyond_the_window_is_a_protocol_violation() -> None:
    window = 1 << 16
    received: list[bytes] = []
    call = WatchCall(
        authority="a:1", path=PATH, request=b"", on_message=received.append, window=window
    )
    transport = FakeTransport()
    call.connection_made(transport)
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    server.initiate_connection()
    server.receive_data(bytes(transport.written))
    server.send_headers(1, OK_HEADERS)
    call.data_received(server.data_to_send())
    call.pause()  # nothing acknowledged from here on
    frame = _raw(0x0, 0, 1, bytes(1 << 14))
    for _ in range(window // (1 << 14)):
        call.data_received(frame)
    assert not call.finished.done()
    call.data_received(_raw(0x0, 0, 1, b"x"))
    with pytest.raises(ProtocolViolation, match="beyond the flow control window"):
        call.finished.result()


def test_settings_that_cannot_work_are_refused() -> None:
    async def make(**options: Any) -> WatchCall:
        return WatchCall(authority="a:1", path=PATH, request=b"", on_message=print, **options)

    with pytest.raises(ValueError, match="window must be 65535 to 2147483647 bytes, not 10"):
        asyncio.run(make(window=10))
    with pytest.raises(ValueError, match="per_turn must be at least 1, not 0"):
        asyncio.run(make(per_turn=0))


async def test_a_call_over_a_loopback_socket_to_an_h2_server() -> None:
    """The same call, over a real socket, to an h2 server run on asyncio."""

    class Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport
            self.conn = h2.connection.H2Connection(
                h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
            )
            self.conn.initiate_connection()
            transport.write(self.conn.data_to_send())  # type: ignore[attr-defined]

        def data_received(self, data: bytes) -> None:
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.StreamEnded):
                    self.conn.send_headers(1, OK_HEADERS)
                    for i in range(50):
                        self.conn.send_data(1, grpc(b"%d" % i))
                    self.conn.send_headers(1, OK_TRAILERS, end_stream=True)
            self.transport.write(self.conn.data_to_send())

    loop = asyncio.get_running_loop()
    server = await loop.create_server(Server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    received: list[bytes] = []
    try:
        _, call = await loop.create_connection(
            lambda: WatchCall(
                authority=f"127.0.0.1:{port}", path=PATH, request=b"", on_message=received.append
            ),
            "127.0.0.1",
            port,
        )
        await asyncio.wait_for(call.finished, 10)
    finally:
        server.close()
        await server.wait_closed()
    assert received == [b"%d" % i for i in range(50)]


def test_a_status_or_error_code_nobody_named_is_still_said() -> None:
    assert str(CallAnswered(12, "Method not found")) == "UNIMPLEMENTED: Method not found"
    assert str(CallAnswered(99, None)) == "status 99"
    peer_error = h2wire.error_name
    assert (peer_error(0x8), peer_error(0x99)) == ("CANCEL", "0x99")


def _valid_answer() -> bytes:
    """What h2's server side sends for a call with three messages and trailers (after the
    SETTINGS that ``open_call`` already fed the call)."""
    peer = open_call()
    peer.server.ping(b"pingpong")
    peer.answer(b"one", b"two" * 100, b"", trailers=OK_TRAILERS)
    return peer.server.data_to_send()


_OUTCOMES = (ProtocolViolation, ConnectionBroke, MessageRefused, CallAnswered)


def _feed(data: bytes, cuts: list[int]) -> Peer:
    peer = open_call()
    at = 0
    for cut in [*sorted({c % (len(data) + 1) for c in cuts}), len(data)]:
        peer.call.data_received(data[at:cut])
        at = cut
    return peer


def _outcome_is_one_of_the_calls(peer: Peer) -> None:
    if peer.call.finished.done():
        outcome = peer.call.finished.exception()
        assert outcome is None or isinstance(outcome, _OUTCOMES), repr(outcome)


@settings(max_examples=300, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(0, 1 << 12), st.integers(1, 255)), max_size=4),
    cut_at=st.integers(0, 1 << 12),
    cuts=st.lists(st.integers(0, 1 << 12), max_size=6),
)
async def test_any_damage_to_an_answer_ends_the_call_with_one_of_its_errors(
    flips: list[tuple[int, int]], cut_at: int, cuts: list[int]
) -> None:
    # Bytes flipped and the answer cut short, in any pieces: the call never raises out of
    # data_received and never ends with an error other than its own (no IndexError, no
    # struct.error, no HPACK exception leaking through).
    valid = _valid_answer()
    damaged = bytearray(valid[: cut_at % (len(valid) + 1)])
    for at, xor in flips:
        if damaged:
            damaged[at % len(damaged)] ^= xor
    peer = _feed(bytes(damaged), cuts)
    _outcome_is_one_of_the_calls(peer)


@settings(max_examples=200, deadline=None)
@given(
    frames=st.lists(
        st.tuples(
            st.integers(0, 10),  # frame type, known ones and one past them
            st.integers(0, 255),  # flags
            st.sampled_from([0, 1, 3, 0x7FFF_FFFF]),  # stream
            st.binary(max_size=40),  # payload
        ),
        max_size=8,
    )
)
async def test_any_frames_after_the_settings_end_the_call_with_one_of_its_errors(
    frames: list[tuple[int, int, int, bytes]],
) -> None:
    data = b"".join(_raw(kind, flags, stream, payload) for kind, flags, stream, payload in frames)
    peer = _feed(data, [])
    _outcome_is_one_of_the_calls(peer)
