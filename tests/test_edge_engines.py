"""Engine triggers end to end: a real local HTTP engine, the sampler, the gRPC server."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import httpx
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from keda_gpu_scaler.app.scaler.compose import EngineOptions, RunningScaler, open_scaler
from keda_gpu_scaler.serving._proto.externalscaler import (
    ExternalScalerStub,
    GetMetricsRequest,
    ScaledObjectRef,
)
from keda_gpu_scaler.serving.http import HttpServer, Request, Response
from keda_gpu_scaler.sources.engines.http import ScrapePolicy
from keda_gpu_scaler.sources.fake import FakeGpuSource
from tests.engine_payloads import VLLM_V0, FakeResolver, fixture

pytestmark = pytest.mark.anyio

LOOPBACK = ipaddress.ip_address("127.0.0.1")


def _vllm_payload(waiting: float) -> str:
    return fixture(VLLM_V0).replace(
        'vllm:num_requests_waiting{model_name="facebook/opt-125m"} 0.0',
        f'vllm:num_requests_waiting{{model_name="facebook/opt-125m"}} {waiting}',
    )


@dataclass
class FakeEngine:
    """A real HTTP server on 127.0.0.1 whose answer tests choose."""

    mode: str = "ok"
    waiting: float = 3.0
    requests: int = 0
    never: anyio.Event = field(default_factory=anyio.Event)

    async def metrics(self, _: Request) -> Response:
        self.requests += 1
        if self.mode == "garbage":
            return Response(200, b"<html><body>Not the metrics you want</body></html>")
        if self.mode == "huge":
            return Response(200, b"# " + b"x" * (5 << 20) + b"\n")
        if self.mode == "redirect":
            return Response(302, b"", headers=(("location", "http://169.254.169.254/"),))
        if self.mode == "error":
            return Response(503, b"overloaded\n")
        if self.mode == "hang":
            await self.never.wait()
        return Response(200, _vllm_payload(self.waiting).encode())


@asynccontextmanager
async def _stack(
    engine: FakeEngine, **resolve: ipaddress.IPv4Address
) -> AsyncIterator[tuple[RunningScaler, ExternalScalerStub, int]]:
    gpus = FakeGpuSource(1, period_s=0.2)
    gpus.set(0, gpu_utilization=50.0)
    resolver = FakeResolver({"vllm.test": [LOOPBACK], **{k: [v] for k, v in resolve.items()}})
    policy = ScrapePolicy(
        connect_timeout_s=0.5, read_timeout_s=0.5, total_timeout_s=1.0, max_bytes=1 << 20
    )
    options = EngineOptions(
        interval_s=0.2, first_sample_timeout_s=2.0, policy=policy, resolve=resolver
    )
    async with anyio.create_task_group() as tg:
        port = await tg.start(HttpServer({"/metrics": engine.metrics}).serve, "127.0.0.1", 0)
        async with (
            open_scaler(gpus, host="127.0.0.1", port=0, engine_options=options) as scaler,
            Channel("127.0.0.1", scaler.port) as channel,
        ):
            yield scaler, ExternalScalerStub(channel), port
        engine.never.set()
        tg.cancel_scope.cancel()


def _ref(port: int, name: str = "so", **extra: str) -> ScaledObjectRef:
    metadata = {
        "profile": "vllm-queue-depth",
        "cooldownSeconds": "0",
        "vllmEndpoint": f"http://vllm.test:{port}/metrics",
        **extra,
    }
    return ScaledObjectRef(name=name, namespace="ns", scaler_metadata=metadata)


async def _value(stub: ExternalScalerStub, ref: ScaledObjectRef) -> float:
    request = GetMetricsRequest(scaled_object_ref=ref, metric_name="keda_gpu_vllm_queue_depth")
    return (await stub.get_metrics(request, timeout=5)).metric_values[0].metric_value_float


async def _status(stub: ExternalScalerStub, ref: ScaledObjectRef) -> tuple[Status, str]:
    with pytest.raises(GRPCError) as caught:
        await _value(stub, ref)
    return caught.value.status, caught.value.message or ""


async def _next_scrape(scaler: RunningScaler) -> None:
    version = scaler.hub.current.version
    source = next(iter(scaler.hub.current.engines))
    taken = scaler.hub.current.engines[source].taken_at
    with anyio.fail_after(5):
        while (
            scaler.hub.current.engines.get(source) is None
            or scaler.hub.current.engines[source].taken_at == taken
        ):
            await scaler.hub.wait_newer(version)
            version = scaler.hub.current.version


async def test_two_scaled_objects_share_one_sampler_and_agree() -> None:
    engine = FakeEngine(waiting=3.0)
    async with _stack(engine) as (scaler, stub, port):
        first, second = _ref(port, "a"), _ref(port, "b", metricName="other")
        assert await _value(stub, first) == 3
        assert await _value(stub, second) == 3
        assert (await stub.is_active(first)).result is True
        assert scaler.engines.running() == [f"vllm:static:http://vllm.test:{port}/metrics"]
        engine.waiting = 9.0
        await _next_scrape(scaler)
        assert await _value(stub, first) == await _value(stub, second) == 9
        scrapes = scaler.hub.current.sources[scaler.engines.running()[0]].samples
        assert engine.requests == scrapes  # one scrape per cadence, whoever reads


@pytest.mark.parametrize(
    ("mode", "code", "reason"),
    [
        ("garbage", Status.UNAVAILABLE, "line 1"),
        ("huge", Status.UNAVAILABLE, "larger than 1048576 bytes"),
        ("redirect", Status.UNAVAILABLE, "redirect"),
        ("error", Status.UNAVAILABLE, "HTTP 503"),
        ("hang", Status.UNAVAILABLE, "timed out"),
    ],
)
async def test_a_broken_endpoint_is_an_error_with_a_reason_and_recovers(
    mode: str, code: Status, reason: str
) -> None:
    engine = FakeEngine(mode=mode)
    async with _stack(engine) as (scaler, stub, port):
        ref = _ref(port)
        gpu = ScaledObjectRef(name="gpu", namespace="ns", scaler_metadata={"profile": "training"})
        status, message = await _status(stub, ref)
        assert status is code
        assert reason in message
        assert (await stub.is_active(gpu)).result is True  # other triggers are unaffected
        engine.mode = "ok"
        engine.never.set()
        await _next_scrape(scaler)
        await _next_scrape(scaler)
        assert await _value(stub, ref) == 3


async def test_an_endpoint_that_is_down_is_unavailable() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    async with _stack(FakeEngine()) as (_, stub, _port):
        status, message = await _status(stub, _ref(closed_port))
    assert status is Status.UNAVAILABLE
    assert f"http://vllm.test:{closed_port}/metrics" in message


async def test_metadata_address_after_dns_is_refused_before_any_connection() -> None:
    attempts: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        attempts.append(request)
        raise AssertionError("no connection may be attempted")

    gpus = FakeGpuSource(1, period_s=0.2)
    resolver = FakeResolver(
        {
            "evil.test": [ipaddress.ip_address("169.254.169.254")],
            "evil6.test": [ipaddress.ip_address("fd00:ec2::254")],
        }
    )
    options = EngineOptions(interval_s=0.2, resolve=resolver, transport=httpx.MockTransport(refuse))
    async with (
        open_scaler(gpus, host="127.0.0.1", port=0, engine_options=options) as scaler,
        Channel("127.0.0.1", scaler.port) as channel,
    ):
        stub = ExternalScalerStub(channel)
        for host in ("evil.test", "evil6.test"):
            ref = ScaledObjectRef(
                name="so",
                namespace="ns",
                scaler_metadata={
                    "profile": "vllm-queue-depth",
                    "vllmEndpoint": f"http://{host}/metrics",
                },
            )
            status, message = await _status(stub, ref)
            assert status is Status.INVALID_ARGUMENT
            assert f'invalid vllmEndpoint "http://{host}/metrics"' in message
            assert "metadata" in message or "link-local" in message
    assert attempts == []


async def test_an_unread_engine_sampler_stops() -> None:
    engine = FakeEngine()
    async with _stack(engine) as (scaler, stub, port):
        assert await _value(stub, _ref(port)) == 3
        source = scaler.engines.running()[0]
        scaler.engines._stop_idle(anyio.current_time() + 601)
        assert scaler.engines.running() == []
        with anyio.fail_after(5):
            while source in scaler.hub.current.engines:
                await scaler.hub.wait_newer(scaler.hub.current.version)
        assert await _value(stub, _ref(port)) == 3  # asked again: started again
