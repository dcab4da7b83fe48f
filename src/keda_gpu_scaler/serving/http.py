"""A small HTTP/1.1 server (h11 on anyio) for /metrics, probes and the debug tap.

GET only; keep-alive; a streamed body goes out chunked. Idle connections close after
``idle_timeout_s``. A handler error is answered with 500 and logged; the server keeps going.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

import anyio
import h11
from anyio.abc import SocketStream, TaskStatus

log = logging.getLogger(__name__)

_RECEIVE_BYTES = 65536


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    stream: AsyncGenerator[bytes, None] | None = None
    headers: tuple[tuple[str, str], ...] = ()


Route = Callable[[Request], Awaitable[Response]]


def text(status: int, body: str) -> Response:
    return Response(status, body.encode() + b"\n")


class HttpServer:
    def __init__(self, routes: Mapping[str, Route], *, idle_timeout_s: float = 60.0) -> None:
        self._routes = dict(routes)
        self._idle_timeout_s = idle_timeout_s

    async def serve(
        self, host: str, port: int, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen and serve until cancelled; reports the bound port to ``task_status``."""
        listener = await anyio.create_tcp_listener(
            local_host=host, local_port=port, reuse_port=False
        )
        async with listener:
            task_status.started(int(listener.extra(anyio.abc.SocketAttribute.local_port)))
            await listener.serve(self._connection)

    async def _connection(self, stream: SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        async with stream:
            try:
                while await self._one_exchange(conn, stream):
                    conn.start_next_cycle()
            except (
                h11.RemoteProtocolError,
                anyio.BrokenResourceError,
                anyio.ClosedResourceError,
                anyio.EndOfStream,
                TimeoutError,
            ):
                return

    async def _one_exchange(self, conn: h11.Connection, stream: SocketStream) -> bool:
        """Serve one request; False when the connection should close."""
        with anyio.fail_after(self._idle_timeout_s):
            event = await _next_event(conn, stream)
        if not isinstance(event, h11.Request):
            return False
        while not isinstance(await _next_event(conn, stream), h11.EndOfMessage):
            pass  # a GET body, if any, is ignored
        response = await self._respond(event)
        await _send(conn, stream, response)
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE

    async def _respond(self, event: h11.Request) -> Response:
        target = urlsplit(event.target.decode("ascii", "replace"))
        route = self._routes.get(target.path)
        if route is None:
            return text(404, f"not found: {target.path}")
        if event.method != b"GET":
            return text(405, "only GET is served")
        request = Request("GET", target.path, dict(parse_qsl(target.query)))
        try:
            return await route(request)
        except Exception:
            log.exception("HTTP handler failed", extra={"path": target.path})
            return text(500, "internal error")


async def _next_event(conn: h11.Connection, stream: SocketStream) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        try:
            data = await stream.receive(_RECEIVE_BYTES)
        except anyio.EndOfStream:
            data = b""
        conn.receive_data(data)


async def _send(conn: h11.Connection, stream: SocketStream, response: Response) -> None:
    headers = [
        ("content-type", response.content_type),
        ("cache-control", "no-store"),
        *response.headers,
    ]
    if response.stream is None:
        headers.append(("content-length", str(len(response.body))))
    await stream.send(conn.send(h11.Response(status_code=response.status, headers=headers)))
    if response.stream is None:
        await stream.send(conn.send(h11.Data(data=response.body)))
    else:
        await _send_stream(conn, stream, response.stream)
    await stream.send(conn.send(h11.EndOfMessage()))


async def _send_stream(
    conn: h11.Connection, stream: SocketStream, body: AsyncGenerator[bytes, None]
) -> None:
    """Send chunks until the body ends or the client goes away.

    A quiet stream (the tap with a narrow filter) would otherwise notice a vanished client
    only at its next write, holding its subscription until then.
    """

    gone = False

    async def watch_peer() -> None:
        nonlocal gone
        try:
            while await stream.receive(_RECEIVE_BYTES):
                pass  # a client does not send while it reads a streamed answer
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        gone = True
        tg.cancel_scope.cancel()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_peer)
            async for chunk in body:
                await stream.send(conn.send(h11.Data(data=chunk)))
            tg.cancel_scope.cancel()
    finally:
        await body.aclose()
    if gone:
        raise anyio.BrokenResourceError("the client went away")
