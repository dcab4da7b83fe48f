"""Scaling from zero through the gRPC edge: at zero replicas the workload has no engine to
scrape, and the llm-d router's queue is what activates it."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
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
from tests.engine_payloads import LLMD, VLLM_2026_ASLEEP, FakeResolver, fixture

pytestmark = pytest.mark.anyio

LOOPBACK = ipaddress.ip_address("127.0.0.1")
QUEUE = "llm_d_epp_flow_control_queue_size"


@dataclass
class FakeRouter:
    """An llm-d EPP on 127.0.0.1 whose pool is at zero: flow control on, ``held`` requests."""

    held: int = 0

    async def metrics(self, _: Request) -> Response:
        lines = fixture(LLMD).splitlines()
        if self.held == 0:  # no band has held a request since the EPP started
            lines = [line for line in lines if "flow_control_queue_size" not in line]
        else:
            lines = [line.replace("} 3", f"}} {self.held - 1}") for line in lines]
        return Response(200, "\n".join(lines).encode())

    async def asleep(self, _: Request) -> Response:
        return Response(200, fixture(VLLM_2026_ASLEEP).encode())


@asynccontextmanager
async def _stack(
    router: FakeRouter,
) -> AsyncIterator[tuple[RunningScaler, ExternalScalerStub, int]]:
    gpus = FakeGpuSource(1, period_s=0.2)
    resolver = FakeResolver({"epp.test": [LOOPBACK], "vllm-sleepy.test": [LOOPBACK]})
    policy = ScrapePolicy(
        connect_timeout_s=0.5, read_timeout_s=0.5, total_timeout_s=1.0, max_bytes=1 << 20
    )
    options = EngineOptions(
        interval_s=0.2, first_sample_timeout_s=2.0, policy=policy, resolve=resolver
    )
    routes = {"/metrics": router.metrics, "/asleep": router.asleep}
    async with anyio.create_task_group() as tg:
        port = await tg.start(HttpServer(routes).serve, "127.0.0.1", 0)
        async with (
            open_scaler(gpus, host="127.0.0.1", port=0, engine_options=options) as scaler,
            Channel("127.0.0.1", scaler.port) as channel,
        ):
            yield scaler, ExternalScalerStub(channel), port
        tg.cancel_scope.cancel()


def _router(port: int) -> ScaledObjectRef:
    metadata = {
        "profile": "llmd-queue",
        "llmdEndpoint": f"http://epp.test:{port}/metrics",
        "inferencePool": "qwen-pool",
        "cooldownSeconds": "0",
    }
    return ScaledObjectRef(name="qwen", namespace="llm", scaler_metadata=metadata)


def _engine() -> ScaledObjectRef:
    """The workload's own engines, behind a headless Service with no pod at zero replicas."""
    metadata = {
        "profile": "vllm-queue-depth",
        "vllmEndpoint": "http://vllm-headless.test:8000/metrics",
        "endpointDiscovery": "dns",
    }
    return ScaledObjectRef(name="qwen", namespace="llm", scaler_metadata=metadata)


async def _value(stub: ExternalScalerStub, ref: ScaledObjectRef, metric: str) -> float:
    request = GetMetricsRequest(scaled_object_ref=ref, metric_name=metric)
    return (await stub.get_metrics(request, timeout=5)).metric_values[0].metric_value_float


async def _next_scrape(scaler: RunningScaler) -> None:
    version = scaler.hub.current.version
    with anyio.fail_after(5):
        for _ in range(2):  # one that started before the change may still be in flight
            await scaler.hub.wait_newer(version)
            version = scaler.hub.current.version
            while not any(s.startswith("llmd:") for s in scaler.hub.current.engines):
                await scaler.hub.wait_newer(version)
                version = scaler.hub.current.version


async def test_the_router_queue_activates_a_pool_at_zero_replicas() -> None:
    router = FakeRouter(held=0)
    async with _stack(router) as (scaler, stub, port):
        # Nothing held: the router's trigger is a real 0 and inactive ...
        assert await _value(stub, _router(port), "keda_gpu_llmd_queue") == 0
        assert (await stub.is_active(_router(port))).result is False
        # ... and the workload's own engine, with no pod, has no value at all.
        with pytest.raises(GRPCError) as caught:
            await _value(stub, _engine(), "keda_gpu_vllm_queue_depth")
        assert caught.value.status is Status.UNAVAILABLE

        seen: list[bool] = []
        first, active = anyio.Event(), anyio.Event()

        async def watch() -> None:
            async for message in stub.stream_is_active(_router(port)):
                seen.append(message.result)
                first.set()
                if message.result:
                    active.set()
                    return

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            with anyio.fail_after(5):
                await first.wait()
            assert seen == [False]
            router.held = 3  # requests arrive for the pool: flow control holds them
            with anyio.fail_after(5):
                await active.wait()
        await _next_scrape(scaler)
        assert (await stub.is_active(_router(port))).result is True
        assert await _value(stub, _router(port), "keda_gpu_llmd_queue") == 3


async def test_an_unknown_pool_is_unavailable_naming_the_pools() -> None:
    async with _stack(FakeRouter(held=2)) as (_, stub, port):
        ref = _router(port)
        ref.scaler_metadata["inferencePool"] = "qwen-pol"
        with pytest.raises(GRPCError) as caught:
            await stub.is_active(ref)
    assert caught.value.status is Status.UNAVAILABLE
    assert 'the router knows no InferencePool "qwen-pol" (pools: qwen-pool)' in (
        caught.value.message or ""
    )


async def test_a_sleeping_vllm_says_it_is_asleep() -> None:
    async with _stack(FakeRouter()) as (_, stub, port):
        metadata = {
            "profile": "vllm-queue-depth",
            "vllmEndpoint": f"http://vllm-sleepy.test:{port}/asleep",
        }
        ref = ScaledObjectRef(name="so", namespace="ns", scaler_metadata=metadata)
        with pytest.raises(GRPCError) as caught:
            await _value(stub, ref, "keda_gpu_vllm_queue_depth")
    assert caught.value.status is Status.UNAVAILABLE
    message = caught.value.message or ""
    assert "vLLM is asleep: engine 0 of 127.0.0.1 (level 1: weights offloaded)" in message
    assert message.endswith("or scale on another trigger (no value, not 0)")
