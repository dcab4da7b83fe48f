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

The call itself is a :class:`~.h2call.WatchCall` on a connection of its own: each message is
decoded, read by the stream's rules and handed to the aggregator inside the protocol's
``data_received``, without a task step per message (a thousand agents send a thousand a
second). While the aggregator's channel is full the call is paused, so HTTP/2 flow control
holds the agent back, and the link's task waits to hand over what is pending. A length over
the cap is refused from the message's 5-byte prefix, before the message is read. The call
runs on asyncio only.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from ssl import SSLContext

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.errors import SourceFailure
from keda_gpu_scaler.domain.samples import AgentTarget, Sample, SourceFault
from keda_gpu_scaler.sources.agents.h2call import WatchCall
from keda_gpu_scaler.sources.agents.h2wire import (
    CallAnswered,
    ConnectionBroke,
    MessageRefused,
    NotHttp2,
    ProtocolViolation,
)
from keda_gpu_scaler.sources.agents.pump import Pump, Watchdog
from keda_gpu_scaler.sources.agents.updates import BadUpdate, StreamReader, readings_source
from keda_gpu_scaler.tls_files import ssl_reason

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
        self._server_name = server_name
        self._window = min(max(max_message_bytes, _WINDOW_MIN), _WINDOW_MAX)
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
        try:
            await self._watch(send)
        except LinkFailed as exc:
            return exc.detail
        except (BadUpdate, MessageRefused) as exc:
            return f"sent garbage: {exc}"
        except CallAnswered as exc:
            return f"answered {exc}"
        except ProtocolViolation as exc:
            return f"broke the protocol: {exc}" + self._hint(exc)
        except ssl.SSLError as exc:  # before OSError: it is one
            return f"TLS failed: {_tls_failure(exc)}"
        except (OSError, ConnectionBroke) as exc:
            return _transport_detail(exc) + self._hint(exc)
        return "the agent ended the stream (shutting down?)"

    async def _watch(self, send: MemoryObjectSendStream[Sample]) -> None:
        loop = asyncio.get_running_loop()
        pump = Pump(
            send,
            StreamReader(expected_node=self.target.node),
            clock=loop.time,
            gate=self._gate,
            on_identity=self._streaming,
        )
        call: WatchCall | None = None
        try:
            with anyio.move_on_after(self.min_idle_s) as opening:
                _, call = await loop.create_connection(
                    lambda: self._call(pump),
                    self.target.host,
                    self.target.port,
                    ssl=self._ssl,
                    server_hostname=(self._server_name or None) if self._ssl else None,
                )
                identified = await pump.opened()
            if opening.cancelled_caught:
                raise LinkFailed(f"no identity within {self.min_idle_s:g} s (hung?)")
            assert call is not None
            if identified:
                idle_s = max(IDLE_HEARTBEATS * (pump.reader.heartbeat_s or 0.0), self.min_idle_s)
                with anyio.CancelScope() as silence:
                    watchdog = Watchdog(silence, idle_s)
                    pump.watch(watchdog)
                    try:
                        await pump.run()
                    finally:
                        watchdog.stop()
                if silence.cancelled_caught:
                    raise LinkFailed(f"no message for {idle_s:g} s (hung?)")
            call.finished.result()  # raises unless the stream ended with status OK
        finally:
            if call is not None:
                call.close()

    def _call(self, pump: Pump) -> WatchCall:
        call = WatchCall(
            authority=_authority(self.target.host, self.target.port),
            path=WATCH_NODE,
            request=b"",  # WatchNodeRequest: no fields
            on_message=pump.on_message,
            tls=self._ssl is not None,
            max_message_bytes=self.max_message_bytes,
            window=self._window,
            per_turn=_YIELD_EVERY,
        )
        pump.attach(call)
        return call

    def _hint(self, exc: Exception) -> str:
        """What a connection dropped before any answer usually means (an agent that refuses
        the TLS settings closes it after the handshake, or never starts one)."""
        lost = isinstance(exc, ConnectionBroke | ConnectionResetError | NotHttp2)
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


def _authority(host: str, port: int) -> str:
    """``:authority`` for ``host`` (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
    return f"the stream broke ({exc})"


def _tls_failure(exc: ssl.SSLError) -> str:
    verify = getattr(exc, "verify_message", None)
    if verify:
        return f"the agent's certificate is refused: {verify}"
    return ssl_reason(exc)
