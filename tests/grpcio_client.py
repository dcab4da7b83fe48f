"""Google's grpcio, a second and independent client implementation, for edge tests.

The ``_pb2`` modules are generated from protos/ at test time with grpcio-tools: KEDA's
External Scaler contract, and the node agent's own stream (``NodeAgent.WatchNode``).
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import grpc
from grpc_tools import protoc

PROTOS = Path(__file__).resolve().parent.parent / "protos"


@dataclass(frozen=True)
class GrpcioModules:
    pb2: ModuleType
    pb2_grpc: ModuleType
    agent_pb2: ModuleType
    """``kedagpuscaler.v1.node_agent_pb2``: the NodeAgent.WatchNode messages."""
    agent_pb2_grpc: ModuleType


def generate(out: Path) -> GrpcioModules:
    include = str(resources.files("grpc_tools") / "_proto")
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        str(PROTOS / "externalscaler.proto"),
        str(PROTOS / "kedagpuscaler" / "v1" / "node_agent.proto"),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("grpc_tools.protoc failed")
    sys.path.insert(0, str(out))
    try:
        pb2 = importlib.import_module("externalscaler_pb2")
        pb2_grpc = importlib.import_module("externalscaler_pb2_grpc")
        agent_pb2 = importlib.import_module("kedagpuscaler.v1.node_agent_pb2")
        agent_pb2_grpc = importlib.import_module("kedagpuscaler.v1.node_agent_pb2_grpc")
    finally:
        sys.path.remove(str(out))
    return GrpcioModules(pb2, pb2_grpc, agent_pb2, agent_pb2_grpc)


def ref(mods: GrpcioModules, metadata: dict[str, str], name: str = "so") -> Any:
    return mods.pb2.ScaledObjectRef(name=name, namespace="ns", scalerMetadata=metadata)


@dataclass(frozen=True)
class StreamsResult:
    first_message_s: list[float]
    unary_latencies_s: list[float]
    unary_errors: int


async def _open_streams(
    mods: GrpcioModules, port: int, count: int, metadata: dict[str, str], unary_calls: int
) -> StreamsResult:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = mods.pb2_grpc.ExternalScalerStub(channel)
        request = ref(mods, metadata)
        calls = [stub.StreamIsActive(request) for _ in range(count)]
        opened = time.perf_counter()

        async def first(call: Any) -> float:
            await call.read()
            return time.perf_counter() - opened

        async def unary() -> tuple[list[float], int]:
            latencies, errors = [], 0
            for _ in range(unary_calls):
                t = time.perf_counter()
                try:
                    await stub.GetMetrics(
                        mods.pb2.GetMetricsRequest(scaledObjectRef=request, metricName="m"),
                        timeout=10,
                    )
                except grpc.aio.AioRpcError:
                    errors += 1
                latencies.append(time.perf_counter() - t)
            return latencies, errors

        firsts, (latencies, errors) = await asyncio.gather(
            asyncio.gather(*(first(c) for c in calls)), unary()
        )
        for call in calls:
            call.cancel()
        return StreamsResult(list(firsts), latencies, errors)


def open_streams(
    mods: GrpcioModules, port: int, count: int, metadata: dict[str, str], *, unary_calls: int = 20
) -> StreamsResult:
    """Open ``count`` StreamIsActive calls on one grpcio channel (one connection), on a
    private event loop; call from a worker thread."""
    return asyncio.run(_open_streams(mods, port, count, metadata, unary_calls))


class Watched(NamedTuple):
    messages: list[Any]
    """NodeUpdate messages, in order."""
    ended: bool
    """The server ended the stream with status OK (False: ``count`` reached first)."""


def watch_node(mods: GrpcioModules, port: int, count: int, *, timeout_s: float = 10.0) -> Watched:
    """Up to ``count`` messages of ``NodeAgent.WatchNode`` over a grpcio channel, or all
    of them until the server ends the stream; blocking, call from a worker thread. A
    status other than OK raises ``grpc.RpcError``."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = mods.agent_pb2_grpc.NodeAgentStub(channel)
        call = stub.WatchNode(mods.agent_pb2.WatchNodeRequest(), timeout=timeout_s)
        messages: list[Any] = []
        for message in call:
            messages.append(message)
            if len(messages) == count:
                call.cancel()
                return Watched(messages, ended=False)
        return Watched(messages, ended=True)
