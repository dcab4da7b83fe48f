"""Node agents for link tests: real grpclib servers on 127.0.0.1, port 0, as scripted.

    async with serve_agent(hub, "gpu-node-1") as agent:      # the real NodeAgentService on
        link = AgentLink(agent.target)                       # a hub the test publishes to
        agent.kill()                                         # every connection dropped

    async with scripted_agent([identity("n"), b"garbage"]) as agent:   # raw bytes as sent
    async with hanging_agent() as agent:                     # accepts, never answers
    async with serving_nothing() as agent:                   # UNIMPLEMENTED

and ``FakeAttribution``, a sampler publishing a kubelet PodResources answer every period.
grpclib runs on asyncio only.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
from anyio.abc import SocketStream
from grpclib.const import Cardinality, Handler
from grpclib.encoding.base import CodecBase
from grpclib.protocol import H2Protocol
from grpclib.server import Server, Stream

from keda_gpu_scaler._proto_agent.kedagpuscaler.v1 import (
    DeviceReading,
    NodeIdentity,
    NodeReadings,
    NodeUpdate,
)
from keda_gpu_scaler.domain.samples import (
    AgentTarget,
    DeviceHolder,
)
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.serving.node_agent import NodeAgentService
from keda_gpu_scaler.serving.telemetry import NoTelemetry
from keda_gpu_scaler.sources.fake import ScriptedAttribution
from tests.loopback import serve_closing

HOST = "127.0.0.1"
WATCH_NODE = "/kedagpuscaler.v1.NodeAgent/WatchNode"


def FakeAttribution(  # noqa: N802 (a sampler, named as one)
    holders: Sequence[DeviceHolder] = (), *, period_s: float = 0.2
) -> ScriptedAttribution:
    """A kubelet PodResources sampler's answers: ``holders`` every ``period_s``."""
    return ScriptedAttribution(holders, period_s=period_s)


def holder(pod: str, device_id: str, *, namespace: str = "ml") -> DeviceHolder:
    return DeviceHolder(
        namespace=namespace,
        pod=pod,
        container="main",
        resource="nvidia.com/gpu",
        device_id=device_id,
    )


class _KeptServer(Server):
    """grpclib's server, keeping its connections so that :meth:`kill` can drop them."""

    def __init__(self, handlers: Sequence[Any], *, codec: CodecBase | None = None) -> None:
        super().__init__(handlers, codec=codec)
        self.protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()
        self.accepted = 0

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        self.protocols.add(protocol)
        self.accepted += 1
        return protocol

    def kill(self) -> None:
        """Every connection dropped at once, as a killed process drops them."""
        for protocol in list(self.protocols):
            processor = getattr(protocol, "processor", None)
            if processor is not None:
                processor.close("agent killed")


@dataclass
class RunningAgent:
    port: int
    server: _KeptServer
    service: NodeAgentService | None = None

    @property
    def target(self) -> AgentTarget:
        return AgentTarget(host=HOST, port=self.port)

    @property
    def connections(self) -> int:
        """Connections accepted so far."""
        return self.server.accepted

    def kill(self) -> None:
        self.server.kill()


@asynccontextmanager
async def _serving(server: _KeptServer, port: int = 0) -> AsyncIterator[int]:
    await server.start(HOST, port, reuse_address=True)
    listener = cast(asyncio.Server, server._server)
    bound = int(listener.sockets[0].getsockname()[1])
    try:
        yield bound
    finally:
        server.kill()
        server.close()
        with anyio.move_on_after(2):
            await server.wait_closed()


@asynccontextmanager
async def serve_agent(
    hub: SnapshotHub,
    node_name: str,
    *,
    clock: Callable[[], float] = anyio.current_time,
    port: int = 0,
) -> AsyncIterator[RunningAgent]:
    """The real WatchNode servicer on ``hub``, its ages dated by ``clock``."""
    service = NodeAgentService(hub, node_name, telemetry=NoTelemetry(), clock=clock)
    server = _KeptServer([service])
    async with _serving(server, port) as bound:
        yield RunningAgent(bound, server, service)


class RawCodec(CodecBase):
    """Messages as bytes, sent as they are: what a broken agent might put on the wire."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


@dataclass
class _Script:
    messages: Sequence[bytes]
    then_hang: bool
    streams: list[float] = field(default_factory=list)

    async def watch(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        self.streams.append(anyio.current_time())
        for message in self.messages:
            await stream.send_message(message)
        if self.then_hang:
            await anyio.sleep_forever()

    def __mapping__(self) -> dict[str, Handler]:
        return {WATCH_NODE: Handler(self.watch, Cardinality.UNARY_STREAM, bytes, bytes)}


@dataclass
class ScriptedAgent(RunningAgent):
    script: _Script | None = None

    @property
    def streams(self) -> int:
        """WatchNode calls received so far."""
        assert self.script is not None
        return len(self.script.streams)


@asynccontextmanager
async def scripted_agent(
    messages: Sequence[bytes], *, then_hang: bool = True
) -> AsyncIterator[ScriptedAgent]:
    """Answers every WatchNode with ``messages`` (raw bytes, each framed as one gRPC
    message), then hangs (or ends the stream with OK)."""
    script = _Script(messages, then_hang)
    server = _KeptServer([script], codec=RawCodec())
    async with _serving(server) as bound:
        yield ScriptedAgent(bound, server, script=script)


def identity(node: str, *, period_s: float = 0.05) -> bytes:
    """An identity promising a message every ``period_s``: its link gives up after five."""
    message = NodeIdentity(node_name=node, sample_period_s=period_s, heartbeat_s=period_s)
    return bytes(NodeUpdate(identity=message))


def readings(*devices: DeviceReading) -> bytes:
    return bytes(NodeUpdate(readings=NodeReadings(devices=list(devices))))


@asynccontextmanager
async def serving_nothing() -> AsyncIterator[RunningAgent]:
    """A gRPC server with no services: every call is UNIMPLEMENTED (an agent too old)."""
    server = _KeptServer([])
    async with _serving(server) as bound:
        yield RunningAgent(bound, server)


@dataclass
class HangingAgent:
    port: int
    accepted: int = 0

    @property
    def target(self) -> AgentTarget:
        return AgentTarget(host=HOST, port=self.port)


@asynccontextmanager
async def hanging_agent() -> AsyncIterator[HangingAgent]:
    """Accepts connections and never answers (no HTTP/2 settings, nothing)."""
    listener = await anyio.create_tcp_listener(local_host=HOST, local_port=0)
    agent = HangingAgent(port=int(listener.extra(anyio.abc.SocketAttribute.local_port)))

    async def hold(client: SocketStream) -> None:
        agent.accepted += 1
        async with client:
            await anyio.sleep_forever()

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(serve_closing, listener, hold, tg)
        try:
            yield agent
        finally:
            tg.cancel_scope.cancel()
