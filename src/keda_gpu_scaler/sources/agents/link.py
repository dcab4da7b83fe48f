"""AgentLink: the actor that reads one node agent's WatchNode stream on a cluster scaler.

It connects (plaintext or TLS), calls ``WatchNode`` and publishes each update as samples
(see :mod:`.updates`: node-qualified keys, dates on this process's clock). It never raises:
whatever breaks the link is a :class:`SourceFault` naming the agent's address and the cause,
logged once when the link starts failing and when the cause changes (not per retry), and the
link connects again after :class:`Backoff`'s delay:

- refused or unreachable, a TLS handshake refused, the stream reset or the connection lost;
- an answer that is not OK (an agent too old to serve WatchNode: ``UNIMPLEMENTED``);
- garbage: a message over ``max_message_bytes`` (refused from its length prefix, before it
  is read), one that does not decode, or one that breaks the stream's rules;
- silence: no identity within ``min_idle_s``, then nothing for ``max(5 heartbeats,
  min_idle_s)`` (the identity names the heartbeat: a message at least that often, its
  sample period and 1 s at least), which is an agent or a network that hangs; its readings
  meanwhile go stale by the usual rule, since nothing refreshes them;
- the agent ending the stream (status OK: it shuts down).

grpclib has no limit on a received message's size and reads a whole message before handing
it over, so the link reads the 5-byte gRPC prefix itself and refuses a length over the cap
(``_recv_message``, through grpclib's client stream internals; grpclib is pinned). grpclib
runs on asyncio only.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from ssl import SSLContext
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream
from grpclib.client import Channel
from grpclib.client import Stream as ClientStream
from grpclib.config import Configuration
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.metadata import decode_grpc_message

from keda_gpu_scaler._proto_agent.kedagpuscaler.v1 import WatchNodeRequest
from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.errors import SourceFailure
from keda_gpu_scaler.domain.samples import AgentTarget, Sample, SourceFault
from keda_gpu_scaler.sources.agents.codec import CodecError, decode_update
from keda_gpu_scaler.sources.agents.messages import NodeUpdate
from keda_gpu_scaler.sources.agents.updates import BadUpdate, StreamReader, readings_source

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MIN_IDLE_S",
    "IDLE_HEARTBEATS",
    "WATCH_NODE",
    "AgentLink",
    "LinkFailed",
]

WATCH_NODE = "/kedagpuscaler.v1.NodeAgent/WatchNode"
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
"""A node's update is a few KiB (eight GPUs, or 56 MIG instances, and their holders);
1 MiB leaves room for any real node and bounds what a broken agent can make us hold."""
DEFAULT_MIN_IDLE_S = 5.0
IDLE_HEARTBEATS = 5
_YIELD_EVERY = 16
"""Messages a link handles at most without a turn of the event loop."""
_WINDOW_MIN = 1 << 16
_WINDOW_MAX = 1 << 22


class LinkFailed(SourceFailure):
    """The link broke; ``detail`` says how (the fault adds the agent's address)."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(detail)


@dataclass(slots=True)
class _LinkHistory:
    """What the link's log lines and backoff need to know of its streams so far."""

    failing: str | None = None
    """Why the link is down (the latest cause); None while it streams."""
    node: str | None = None
    logged: str | None = None
    """The cause last logged: the same one is not logged again until a long healthy stream."""
    told_up: bool = False
    """"Streaming" logged since the last failure logged."""
    up_since: float | None = None
    """When the current stream's identity came."""


class AgentLink:
    """Reads ``target``'s WatchNode stream until cancelled; satisfies ``Sampler``."""

    def __init__(
        self,
        target: AgentTarget,
        *,
        ssl: SSLContext | None = None,
        server_name: str = "",
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        backoff: Backoff = Backoff(),  # noqa: B008 - a frozen value
        min_idle_s: float = DEFAULT_MIN_IDLE_S,
        gate: Callable[[Sample], bool] | None = None,
    ) -> None:
        """``server_name`` is what the agent's certificate is checked against (default: the
        host dialled); ``gate`` is asked, for each sample, whether to publish it (the
        cluster's one-link-per-node rule); none: every sample. Raises ValueError naming a bad
        value."""
        if max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be at least 1, not {max_message_bytes}")
        if not min_idle_s > 0:
            raise ValueError(f"min_idle_s must be a positive number of seconds, not {min_idle_s}")
        if server_name and ssl is None:
            raise ValueError("a TLS server name without TLS")
        self.target = target
        self.address = target.address
        self.name = readings_source(target.node or target.address)
        """The source of its readings and faults: ``agent/<node>``, once the node is known
        (from discovery, else from the stream's identity), ``agent/<address>`` before."""
        self.max_message_bytes = max_message_bytes
        self.backoff = backoff
        self.min_idle_s = min_idle_s
        self._ssl = ssl
        window = min(max(max_message_bytes, _WINDOW_MIN), _WINDOW_MAX)
        self._config = Configuration(
            ssl_target_name_override=server_name or None,
            http2_connection_window_size=window,
            http2_stream_window_size=window,
        )
        self._history = _LinkHistory(node=target.node or None)
        self._gate = gate or _every

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Stream, and after each break a fault and a delay, until cancelled."""
        failures = 0
        async with send:
            task_status.started()
            while True:
                detail = await self._stream_once(send)
                up_since, self._history.up_since = self._history.up_since, None
                healthy = (
                    up_since is not None
                    and anyio.current_time() - up_since > self.backoff.maximum_s
                )
                if healthy:
                    failures = 0  # a long healthy stream: the next break starts afresh
                failures += 1
                fault = self._failed(detail, after_healthy_stream=healthy)
                if self._gate(fault):
                    await send.send(fault)
                await anyio.sleep(self.backoff.delay(failures))

    async def _stream_once(self, send: MemoryObjectSendStream[Sample]) -> str:
        """One connection, until it breaks; what broke it."""
        channel = Channel(self.target.host, self.target.port, ssl=self._ssl, config=self._config)
        try:
            await self._watch(channel, send)
        except LinkFailed as exc:
            return exc.detail
        except BadUpdate as exc:
            return f"sent garbage: {exc}"
        except GRPCError as exc:
            said = f"{exc.status.name}: {exc.message}" if exc.message else exc.status.name
            return f"answered {said}"
        except ssl.SSLError as exc:  # before OSError: it is one
            return f"TLS failed: {_ssl_reason(exc)}"
        except (OSError, ProtocolError, StreamTerminatedError) as exc:
            return _transport_detail(exc) + self._hint(exc)
        finally:
            channel.close()
        return "the agent ended the stream (shutting down?)"

    async def _watch(self, channel: Channel, send: MemoryObjectSendStream[Sample]) -> None:
        reader = StreamReader(expected_node=self.target.node)
        async with channel.request(
            WATCH_NODE, Cardinality.UNARY_STREAM, WatchNodeRequest, NodeUpdate
        ) as stream:
            with anyio.move_on_after(self.min_idle_s) as opening:
                await stream.send_message(WatchNodeRequest(), end=True)
                await _recv_initial_metadata(stream)
                update = await self._recv(stream)
            if opening.cancelled_caught:
                raise LinkFailed(f"no identity within {self.min_idle_s:g} s (hung?)")
            if update is None:  # ended before a word: its status says why
                await stream.recv_trailing_metadata()
                return
            received_at = anyio.current_time()
            samples = reader.receive(update, received_at)  # the identity, or refused
            self._streaming(reader)
            idle_s = max(IDLE_HEARTBEATS * (reader.heartbeat_s or 0.0), self.min_idle_s)
            received = 0
            clock = asyncio.get_running_loop().time  # anyio's clock, without its lookup
            with anyio.CancelScope() as silence:
                watchdog = _Watchdog(silence, idle_s)
                try:
                    while True:
                        for sample in samples:
                            if self._gate(sample):
                                await _hand_over(send, sample)
                        received += 1
                        if received % _YIELD_EVERY == 0:
                            # A receive that finds its message buffered does not yield: a
                            # link with a backlog gives the loop a turn now and then.
                            await anyio.lowlevel.checkpoint()
                        watchdog.waiting_since = clock()
                        update = await self._recv(stream)
                        watchdog.waiting_since = math.inf
                        if update is None:
                            break
                        received_at = clock()
                        samples = reader.receive(update, received_at)
                finally:
                    watchdog.stop()
            if silence.cancelled_caught:
                raise LinkFailed(f"no message for {idle_s:g} s (hung?)")
            await stream.recv_trailing_metadata()  # raises GRPCError unless the status is OK

    async def _recv(self, stream: ClientStream[Any, Any]) -> NodeUpdate | None:
        data = await _recv_message(stream, self.max_message_bytes)
        if data is None:
            return None
        try:
            return decode_update(data)
        except CodecError as exc:
            raise BadUpdate(f"a message that does not decode ({exc})") from exc

    def _hint(self, exc: Exception) -> str:
        """What a connection dropped before any answer usually means (an agent that refuses
        the TLS settings closes it after the handshake, or never starts one)."""
        lost = isinstance(exc, StreamTerminatedError | ConnectionResetError)
        if not lost or self._history.up_since is not None:
            return ""
        if self._ssl is None:
            return ", before any answer: does the agent want TLS (--agents-tls-ca)?"
        return (
            ", before any answer: does the agent want a client certificate it trusts "
            "(--agents-tls-cert, --agents-tls-key)?"
        )

    def _streaming(self, reader: StreamReader) -> None:
        c = self._history
        c.node = reader.node
        c.up_since = anyio.current_time()
        if reader.node is not None:
            self.name = readings_source(reader.node)
        if not c.told_up:
            log.info(
                "agent link streaming",
                extra={
                    "agent": self.address,
                    "node": reader.node,
                    "agent_version": reader.agent_version,
                    "sample_period_s": reader.period_s,
                    "after_failure": c.failing,
                },
            )
            c.told_up = True
        c.failing = None

    def _failed(self, detail: str, *, after_healthy_stream: bool) -> SourceFault:
        c = self._history
        if after_healthy_stream:
            c.logged = None
        # Once when the link starts failing and when the cause changes, not every retry, even
        # when each retry gets as far as the identity (an agent sending garbage after it).
        if detail != c.logged:
            log.warning(
                "agent link failing", extra={"agent": self.address, "node": c.node, "error": detail}
            )
            c.logged = detail
            c.told_up = False
        c.failing = detail
        return SourceFault(
            source=self.name,
            key=None,
            at=anyio.current_time(),
            reason=f"agent {self.address}: {detail}",
        )


def _every(sample: Sample) -> bool:
    return True


async def _hand_over(send: MemoryObjectSendStream[Sample], sample: Sample) -> None:
    """``send.send(sample)`` without its turn of the event loop while there is room (a
    thousand links' updates a second would pay a turn each); waits while there is none."""
    try:
        send.send_nowait(sample)
    except anyio.WouldBlock:
        await send.send(sample)


class _Watchdog:
    """Cancels ``scope`` once a wait for the next message has lasted ``idle_s``.

    One loop timer per ``idle_s`` (seconds) instead of a cancel scope and a timer per message,
    which a thousand links a second would pay for. Only a wait counts: ``waiting_since`` is
    set before each receive and cleared after it, so a hand-over that blocks is not silence.
    grpclib runs on asyncio only, so the timer is the asyncio loop's.
    """

    __slots__ = ("_handle", "_idle_s", "_loop", "_scope", "waiting_since")

    def __init__(self, scope: anyio.CancelScope, idle_s: float) -> None:
        self._scope = scope
        self._idle_s = idle_s
        self._loop = asyncio.get_running_loop()
        self.waiting_since = math.inf
        self._handle: asyncio.TimerHandle | None = self._loop.call_at(
            self._loop.time() + idle_s, self._check
        )

    def _check(self) -> None:
        silent_until = self.waiting_since + self._idle_s
        if self._loop.time() >= silent_until:
            self._handle = None
            self._scope.cancel()
            return
        due = min(silent_until, self._loop.time() + self._idle_s)
        self._handle = self._loop.call_at(due, self._check)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def _recv_initial_metadata(stream: ClientStream[Any, Any]) -> None:
    """As grpclib's, but an answer without a content type (grpclib's own "method not found",
    an agent too old for WatchNode) is named by its status, not as a missing header."""
    try:
        await stream.recv_initial_metadata()
    except GRPCError as exc:
        headers = dict(stream._stream.headers or ())
        status = headers.get("grpc-status")
        if exc.status is not Status.UNKNOWN or status is None or not status.isdigit():
            raise
        try:
            said = Status(int(status))
        except ValueError:
            raise exc from None
        message = headers.get("grpc-message")
        raise GRPCError(said, None if message is None else decode_grpc_message(message)) from exc


async def _recv_message(stream: ClientStream[Any, Any], max_bytes: int) -> bytes | None:
    """The next message's bytes, None at the end of the stream; refuses one over
    ``max_bytes`` from its length prefix, before reading it.

    grpclib's own ``recv_message`` reads any length the prefix announces. This reads the
    same buffer (``stream._stream``) under the same wrapper (``stream._wrapper``, which turns
    a reset or a lost connection into ``StreamTerminatedError``)."""
    try:
        with stream._wrapper:
            prefix = await stream._stream.recv_data(5)
            if not prefix:
                return None
            if prefix[0]:
                raise BadUpdate("a compressed message, though none was asked for")
            length = int.from_bytes(prefix[1:], "big")
            if length > max_bytes:
                raise BadUpdate(f"a message of {length} bytes, over the cap of {max_bytes} bytes")
            return await stream._stream.recv_data(length)
    except AssertionError as exc:  # grpclib's buffer: the stream ended inside a message
        raise LinkFailed("the stream ended inside a message") from exc


_OS_HINTS: tuple[tuple[type[OSError], str], ...] = (
    (ConnectionRefusedError, "connection refused (no agent listening there?)"),
    (ConnectionResetError, "connection reset by the agent"),
    (TimeoutError, "timed out"),
)


def _transport_detail(exc: Exception) -> str:
    for kind, hint in _OS_HINTS:
        if isinstance(exc, kind):
            return hint
    if isinstance(exc, OSError):
        return f"cannot connect: {exc.strerror or exc}"
    if isinstance(exc, StreamTerminatedError):
        return f"the stream broke ({exc})"
    return f"the connection broke ({type(exc).__name__}: {exc})"


def _ssl_reason(exc: ssl.SSLError) -> str:
    verify = getattr(exc, "verify_message", None)
    if verify:
        return f"the agent's certificate is refused: {verify}"
    return str(exc.reason or exc).replace("_", " ").lower()
