"""StreamMetricSpec, as KEDA 2.21 calls it for ``external-push`` triggers: the specs at once,
always what GetMetricSpec answers, bad metadata refused before any message, then held open
until KEDA cancels it or the server stops, when it ends with OK (kedacore/keda
pkg/scalers/external_scaler.go ``streamMetricSpecOnce``: UNIMPLEMENTED stops it for good, an
EOF is retried after 2 s)."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import anyio
import grpc
import httpx
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from prometheus_client.parser import text_string_to_metric_families
from trio.testing import MockClock

from keda_gpu_scaler.app.scaler.compose import RunningScaler
from keda_gpu_scaler.serving._proto.externalscaler import (
    ExternalScalerStub,
    GetMetricSpecResponse,
    ScaledObjectRef,
)
from keda_gpu_scaler.sources.fake import FakeGpuSource
from keda_gpu_scaler.testing import open_test_service
from tests.grpcio_client import GrpcioModules, ref
from tests.loopback import loopback_scaler

METADATA = {"metricType": "gpu_utilization", "targetValue": "70.5", "pollIntervalSeconds": "2"}
BAD = {"targetValue": "NaN"}


def _source() -> FakeGpuSource:
    source = FakeGpuSource(1, period_s=0.2)
    source.set(0, gpu_utilization=50.0)
    return source


# -- the handler, in virtual time -------------------------------------------------------------


@pytest.mark.trio
async def test_the_specs_at_once_then_nothing_and_ok_on_shutdown(autojump_clock: MockClock) -> None:
    got: list[tuple[float, GetMetricSpecResponse]] = []
    ended: list[float] = []
    source = _source()
    async with open_test_service(source) as served, anyio.create_task_group() as tg:
        message = ScaledObjectRef(name="so", namespace="ns", scaler_metadata=METADATA)
        t0 = anyio.current_time()

        async def collect() -> None:
            async for specs in served.service.stream_metric_spec(message):
                got.append((anyio.current_time() - t0, specs))
            ended.append(anyio.current_time() - t0)

        tg.start_soon(collect)
        # Heartbeats of StreamIsActive come every pollIntervalSeconds (2 s): not here, since
        # every message makes KEDA reconcile the ScaledObject and its HPA.
        await anyio.sleep(30)
        source.set(0, gpu_utilization=95.0)
        await anyio.sleep(30)
        assert served.streams.held_streams == 1
        served.streams.begin_shutdown()
        await served.streams.wait_streams_ended()
        unary = await served.service.get_metric_spec(message)
    assert got == [(0.0, unary)]
    assert ended == [60.0]
    assert served.streams.held_streams == 0
    only = unary.metric_specs[0]
    assert (only.metric_name, only.target_size_float, only.target_size) == (
        "keda_gpu_metric",
        70.5,
        70,
    )


@pytest.mark.trio
async def test_a_stream_opened_during_shutdown_ends_at_once(autojump_clock: MockClock) -> None:
    async with open_test_service(_source()) as served:
        served.streams.begin_shutdown()
        message = ScaledObjectRef(name="so", namespace="ns", scaler_metadata=METADATA)
        with anyio.fail_after(1):
            sent = [m async for m in served.service.stream_metric_spec(message)]
        await served.streams.wait_streams_ended()
    assert len(sent) == 1


# -- grpclib over a real socket -----------------------------------------------------------------


async def _metrics(port: int | None) -> dict[str, float]:
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels
    }


@pytest.mark.anyio
async def test_grpclib_open_equal_to_get_metric_spec_held_then_ok_on_shutdown() -> None:
    message = ScaledObjectRef(name="so", namespace="ns", scaler_metadata=METADATA)
    received: list[GetMetricSpecResponse] = []
    ended_ok = anyio.Event()
    first = anyio.Event()
    channel: Channel | None = None
    try:
        async with anyio.create_task_group() as tg, loopback_scaler(_source()) as running:
            await running.hub.wait_newer(0)
            channel = Channel("127.0.0.1", running.port)
            stub = ExternalScalerStub(channel)

            async def read() -> None:
                async for specs in stub.stream_metric_spec(message):  # raises unless OK
                    received.append(specs)
                    first.set()
                ended_ok.set()

            tg.start_soon(read)
            with anyio.fail_after(2):
                await first.wait()
            unary = await stub.get_metric_spec(message)
            assert received == [unary]
            held = await _metrics(running.metrics_port)
            assert held["keda_gpu_scaler_open_metric_spec_streams"] == 1
            assert held["keda_gpu_scaler_open_streams"] == 0
            await anyio.sleep(0.5)
            assert len(received) == 1
        # The scaler has shut down: the stream ended with status OK, after its one message.
        assert ended_ok.is_set()
        assert len(received) == 1
    finally:
        if channel is not None:
            channel.close()


@pytest.mark.anyio
async def test_grpclib_bad_metadata_is_refused_before_any_message(scaler: RunningScaler) -> None:
    async with Channel("127.0.0.1", scaler.port) as channel:
        stub = ExternalScalerStub(channel)
        got: list[GetMetricSpecResponse] = []

        async def read() -> None:
            async for specs in stub.stream_metric_spec(ScaledObjectRef(scaler_metadata=BAD)):
                got.append(specs)

        with pytest.raises(GRPCError) as caught:
            await read()
    assert got == []
    assert caught.value.status is Status.INVALID_ARGUMENT
    assert 'targetValue "NaN"' in (caught.value.message or "")


# -- grpcio, Google's client ---------------------------------------------------------------------


async def _grpcio_open_and_hold(mods: GrpcioModules, port: int, metadata: dict[str, str]) -> Any:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = mods.pb2_grpc.ExternalScalerStub(channel)
        request = ref(mods, metadata)
        call = stub.StreamMetricSpec(request)
        first = await asyncio.wait_for(call.read(), 2)
        unary = await stub.GetMetricSpec(request, timeout=5)
        # Nothing more while it is open.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(_next(call)), 1.0)
        call.cancel()
        return first, unary


async def _next(call: Any) -> Any:
    return await call.read()


@pytest.mark.anyio
async def test_grpcio_open_equal_to_get_metric_spec(
    scaler: RunningScaler, grpcio_modules: GrpcioModules
) -> None:
    first, unary = await anyio.to_thread.run_sync(
        partial(asyncio.run, _grpcio_open_and_hold(grpcio_modules, scaler.port, METADATA))
    )
    assert first == unary
    assert [(s.metricName, s.targetSizeFloat, s.targetSize) for s in first.metricSpecs] == [
        ("keda_gpu_metric", 70.5, 70)
    ]


@pytest.mark.anyio
async def test_grpcio_bad_metadata_is_refused_before_any_message(
    scaler: RunningScaler, grpcio_modules: GrpcioModules
) -> None:
    def messages() -> list[Any]:
        with grpc.insecure_channel(f"127.0.0.1:{scaler.port}") as channel:
            stub = grpcio_modules.pb2_grpc.ExternalScalerStub(channel)
            got: list[Any] = []
            try:
                for specs in stub.StreamMetricSpec(ref(grpcio_modules, BAD), timeout=5):
                    got.append(specs)
            except grpc.RpcError as exc:
                return [got, exc.code(), exc.details()]
            return [got, None, None]

    got, code, details = await anyio.to_thread.run_sync(messages)
    assert (got, code) == ([], grpc.StatusCode.INVALID_ARGUMENT)
    assert 'targetValue "NaN"' in details


async def _grpcio_until_end(mods: GrpcioModules, port: int, opened: Any) -> tuple[int, Any]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = mods.pb2_grpc.ExternalScalerStub(channel)
        call = stub.StreamMetricSpec(ref(mods, METADATA))
        count = 0
        async for _ in call:
            count += 1
            opened()
        return count, await call.code()


@pytest.mark.anyio
async def test_grpcio_stream_ends_with_ok_on_shutdown(grpcio_modules: GrpcioModules) -> None:
    opened = anyio.Event()
    result: list[tuple[int, Any]] = []
    async with anyio.create_task_group() as tg, loopback_scaler(_source()) as running:
        await running.hub.wait_newer(0)
        token = anyio.lowlevel.current_token()

        def seen() -> None:
            anyio.from_thread.run_sync(opened.set, token=token)

        async def run() -> None:
            result.append(
                await anyio.to_thread.run_sync(
                    partial(asyncio.run, _grpcio_until_end(grpcio_modules, running.port, seen))
                )
            )

        tg.start_soon(run)
        with anyio.fail_after(5):
            await opened.wait()
    assert result == [(1, grpc.StatusCode.OK)]
