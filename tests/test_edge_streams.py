"""KEDA multiplexes every stream of a scaler address on one connection: 500 of them here."""

from __future__ import annotations

import time
from functools import partial

import anyio
import h2.connection
import h2.events
import pytest
from grpclib.client import Channel

from keda_gpu_scaler.app.scaler.compose import RunningScaler
from keda_gpu_scaler.serving._proto.externalscaler import (
    ExternalScalerStub,
    GetMetricsRequest,
    ScaledObjectRef,
)
from keda_gpu_scaler.serving.server import DEFAULT_MAX_CONCURRENT_STREAMS
from keda_gpu_scaler.sources.fake import FakeGpuSource
from tests.grpcio_client import GrpcioModules, open_streams
from tests.loopback import loopback_scaler

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

STREAMS = 500


async def test_first_settings_frame_raises_the_stream_limit(scaler: RunningScaler) -> None:
    conn = h2.connection.H2Connection()
    conn.initiate_connection()
    async with await anyio.connect_tcp("127.0.0.1", scaler.port) as tcp:
        await tcp.send(conn.data_to_send())
        events = conn.receive_data(await tcp.receive())
    settings = next(e for e in events if isinstance(e, h2.events.RemoteSettingsChanged))
    limit = settings.changed_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS]
    assert limit.new_value == DEFAULT_MAX_CONCURRENT_STREAMS


async def test_500_streams_on_one_grpclib_connection(scaler: RunningScaler) -> None:
    ref = ScaledObjectRef(name="so", namespace="ns", scaler_metadata={"profile": "training"})
    firsts: list[float] = []
    unary: list[float] = []
    async with Channel("127.0.0.1", scaler.port) as channel:
        stub = ExternalScalerStub(channel)
        opened = time.perf_counter()

        async def stream() -> None:
            async for message in stub.stream_is_active(ref):
                assert message.result is True
                firsts.append(time.perf_counter() - opened)
                return

        async def unary_calls() -> None:
            request = GetMetricsRequest(scaled_object_ref=ref, metric_name="keda_gpu_training")
            for _ in range(20):
                t = time.perf_counter()
                response = await stub.get_metrics(request, timeout=10)
                assert response.metric_values[0].metric_value_float == 87
                unary.append(time.perf_counter() - t)

        async with anyio.create_task_group() as tg:
            for _ in range(STREAMS):
                tg.start_soon(stream)
            tg.start_soon(unary_calls)
    # Every stream answered and every unary call succeeded within its deadline while the
    # streams opened; how fast is a figure for benchmarks/soak.py, not an assertion here.
    assert len(firsts) == STREAMS
    assert len(unary) == 20


async def test_500_streams_on_one_grpcio_connection(
    scaler: RunningScaler, grpcio_modules: GrpcioModules
) -> None:
    result = await anyio.to_thread.run_sync(
        partial(
            open_streams,
            grpcio_modules,
            scaler.port,
            STREAMS,
            {"profile": "training"},
            unary_calls=20,
        )
    )
    assert len(result.first_message_s) == STREAMS
    assert result.unary_errors == 0


async def test_a_burst_of_500_streams_never_makes_a_10_hz_source_unavailable(
    grpcio_modules: GrpcioModules,
) -> None:
    # At 10 Hz three sample periods are 0.3 s: a loop starved while streams open would let
    # readings age past that and answer UNAVAILABLE for a source that is fine.
    source = FakeGpuSource(1, period_s=0.1)
    source.set(0, gpu_utilization=87.0)
    async with loopback_scaler(source) as running:
        await running.hub.wait_newer(0)
        result = await anyio.to_thread.run_sync(
            partial(
                open_streams,
                grpcio_modules,
                running.port,
                STREAMS,
                {"profile": "training"},
                unary_calls=100,
            )
        )
    assert len(result.first_message_s) == STREAMS
    assert result.unary_errors == 0
