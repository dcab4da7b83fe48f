"""The places where serving/transport.py replaces grpclib's or h2's per-stream walks and work.

Each touches a library's internals (pinned: grpclib 0.4.9, h2 4.x); these tests fail loudly
when an upgrade moves them.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import textwrap
from types import SimpleNamespace
from typing import Any, cast

import h2.config
import h2.connection
import h2.exceptions
import pytest
from h2.events import WindowUpdated
from h2.settings import SettingCodes

from keda_gpu_scaler.serving import transport
from keda_gpu_scaler.serving._proto.externalscaler import GetMetricsRequest, ScaledObjectRef


def _pair(limit: int) -> tuple[h2.connection.H2Connection, h2.connection.H2Connection]:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    srv = transport._H2Connection(h2.config.H2Configuration(client_side=False))
    srv.local_settings = h2.settings.Settings(
        client=False, initial_values={SettingCodes.MAX_CONCURRENT_STREAMS: limit}
    )
    srv.initiate_connection()
    client.initiate_connection()
    srv.receive_data(client.data_to_send())
    client.receive_data(srv.data_to_send())
    srv.receive_data(client.data_to_send())
    return client, srv


def _open(client: h2.connection.H2Connection, *, end: bool) -> int:
    stream_id = client.get_next_available_stream_id()
    headers = [(":method", "POST"), (":path", "/x"), (":scheme", "http"), (":authority", "a")]
    client.send_headers(stream_id, headers, end_stream=end)
    return stream_id


def _answer(srv: h2.connection.H2Connection, stream_id: int) -> None:
    srv.send_headers(stream_id, [(":status", "200")], end_stream=True)


def test_closed_streams_are_forgotten_and_the_limit_still_holds() -> None:
    client, srv = _pair(limit=400)
    long_lived = [_open(client, end=False) for _ in range(300)]
    srv.receive_data(client.data_to_send())
    for _ in range(2000):  # unary calls come and go beside the long-lived streams
        stream_id = _open(client, end=True)
        srv.receive_data(client.data_to_send())
        _answer(srv, stream_id)
        client.receive_data(srv.data_to_send())
    assert len(srv.streams) <= 2 * len(long_lived) + 64 + 1
    assert srv.open_inbound_streams == 300
    # The client believes it may open more, so the server's own check is what refuses.
    client.remote_settings = h2.settings.Settings(
        client=False, initial_values={SettingCodes.MAX_CONCURRENT_STREAMS: 1000}
    )
    for _ in range(100):
        _open(client, end=False)
    srv.receive_data(client.data_to_send())
    assert srv.open_inbound_streams == 400
    _open(client, end=False)
    with pytest.raises(h2.exceptions.TooManyStreamsError):
        srv.receive_data(client.data_to_send())


@pytest.mark.anyio
async def test_a_connection_window_update_wakes_only_streams_that_wait() -> None:
    processor = transport._EventsProcessor(cast(Any, SimpleNamespace()), cast(Any, None))
    idle = SimpleNamespace(id=1, window_updated=None)
    blocked = SimpleNamespace(id=3, window_updated=None)
    processor.register(cast(Any, idle))
    processor.register(cast(Any, blocked))
    waiter = asyncio.ensure_future(blocked.window_updated.wait())
    await asyncio.sleep(0)
    processor.process_window_updated(cast(WindowUpdated, SimpleNamespace(stream_id=0)))
    await asyncio.wait_for(waiter, 1)
    assert blocked.window_updated.is_set()
    assert not idle.window_updated.is_set()  # nobody waited: nothing to wake


class _Task:
    def __init__(self, *, done: bool) -> None:
        self._done = done

    def done(self) -> bool:
        return self._done


@pytest.mark.anyio
async def test_the_request_table_is_swept_at_a_constant_cost_and_stays_bounded() -> None:
    handler = transport._Handler({}, cast(Any, None), None, cast(Any, None))
    tasks: dict[Any, Any] = {object(): _Task(done=False) for _ in range(1000)}  # streams
    handler._tasks = tasks
    sweeps = 0
    for _ in range(20_000):  # unary calls, each finished by the time the next one comes
        tasks = cast(dict[Any, Any], handler._tasks)
        tasks[object()] = _Task(done=True)
        before = len(handler._tasks)
        handler.__gc_step__()
        sweeps += len(handler._tasks) < before
        assert len(handler._tasks) <= 2 * 1000 + 10
    assert 10 <= sweeps <= 20  # about once per thousand requests, not once per ten


def test_a_repeated_request_is_decoded_once_and_the_table_stays_bounded() -> None:
    codec = transport.RepeatedRequests([GetMetricsRequest], max_entries=2)
    first = bytes(
        GetMetricsRequest(
            scaled_object_ref=ScaledObjectRef(name="a", namespace="ns"), metric_name="m"
        )
    )
    decoded = codec.decode(first, GetMetricsRequest)
    assert decoded == GetMetricsRequest().parse(first)
    assert codec.decode(first, GetMetricsRequest) is decoded  # the same bytes: no parse
    other = bytes(GetMetricsRequest(metric_name="other"))
    assert codec.decode(other, GetMetricsRequest).metric_name == "other"
    assert codec.decode(first, GetMetricsRequest) is decoded
    codec.decode(bytes(GetMetricsRequest(metric_name="third")), GetMetricsRequest)
    assert codec.decode(first, GetMetricsRequest) is not decoded  # the oldest went first
    # A type not named is decoded every time.
    ref = bytes(ScaledObjectRef(name="a"))
    assert codec.decode(ref, ScaledObjectRef) is not codec.decode(ref, ScaledObjectRef)
    with pytest.raises(ValueError, match="max_entries must be at least 1, not 0"):
        transport.RepeatedRequests([GetMetricsRequest], max_entries=0)


def _body_without_docstring(function: Any) -> list[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    definition = tree.body[0]
    assert isinstance(definition, ast.FunctionDef)
    body = definition.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return [ast.dump(statement) for statement in body]


def test_receive_frame_is_h2s_own_less_its_trace_line() -> None:
    # The override copies h2's method; an h2 that changes it must be copied again.
    theirs = _body_without_docstring(h2.connection.H2Connection._receive_frame)
    trace = [s for s in theirs if "trace" in s]
    assert len(trace) == 1
    theirs.remove(trace[0])
    assert _body_without_docstring(transport._H2Connection._receive_frame) == theirs


def test_a_frame_on_a_reset_stream_is_answered_with_a_reset_not_a_connection_error() -> None:
    # The override's first error path: DATA on a stream the server has reset.
    client, srv = _pair(10)
    stream_id = _open(client, end=False)
    srv.receive_data(client.data_to_send())
    srv.reset_stream(stream_id)
    srv.data_to_send()
    # The client has not seen the reset yet: its DATA crosses it.
    frame = (4).to_bytes(3, "big") + b"\x00\x00" + stream_id.to_bytes(4, "big") + b"late"
    assert srv.receive_data(frame) == []
    answer = srv.data_to_send()
    assert answer[3] == 0x3  # RST_STREAM
    assert int.from_bytes(answer[5:9], "big") == stream_id
    assert srv.state_machine.state is not h2.connection.ConnectionState.CLOSED
