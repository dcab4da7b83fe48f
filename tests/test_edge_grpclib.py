"""Every RPC over a real socket through a grpclib client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeVar

import anyio
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from keda_gpu_scaler.app.scaler.compose import RunningScaler, open_scaler
from keda_gpu_scaler.serving._proto.externalscaler import (
    ExternalScalerStub,
    GetMetricsRequest,
    ScaledObjectRef,
)
from keda_gpu_scaler.sources.fake import FakeGpuSource
from tests.metadata_cases import BAD_METADATA

pytestmark = pytest.mark.anyio

_M = TypeVar("_M")


async def test_get_metrics_over_a_real_socket(scaler: RunningScaler) -> None:
    async with Channel("127.0.0.1", scaler.port) as channel:
        stub = ExternalScalerStub(channel)
        ref = ScaledObjectRef(name="so", namespace="ns", scaler_metadata={"profile": "training"})
        spec = (await stub.get_metric_spec(ref)).metric_specs[0]
        assert (spec.metric_name, spec.target_size_float, spec.target_size) == (
            "keda_gpu_training",
            90.0,
            90,
        )
        request = GetMetricsRequest(scaled_object_ref=ref, metric_name="keda_gpu_training")
        value = (await stub.get_metrics(request)).metric_values[0]
        assert (value.metric_value_float, value.metric_value) == (87.0, 87)
        assert (await stub.is_active(ref)).result is True
        bad = ScaledObjectRef(scaler_metadata={"targetValue": "NaN"})
        with pytest.raises(GRPCError) as caught:
            await stub.get_metric_spec(bad)
        assert caught.value.status is Status.INVALID_ARGUMENT
        assert 'targetValue "NaN"' in (caught.value.message or "")


@pytest.mark.parametrize(("metadata", "message"), BAD_METADATA)
async def test_bad_metadata_is_invalid_argument_on_every_rpc(
    scaler: RunningScaler, metadata: dict[str, str], message: str
) -> None:
    bad = ScaledObjectRef(name="so", namespace="ns", scaler_metadata=metadata)
    async with Channel("127.0.0.1", scaler.port) as channel:
        stub = ExternalScalerStub(channel)
        calls = (
            stub.get_metric_spec(bad),
            stub.get_metrics(GetMetricsRequest(scaled_object_ref=bad, metric_name="m")),
            stub.is_active(bad),
            _first(stub.stream_is_active(bad)),
            _first(stub.stream_metric_spec(bad)),
        )
        for call in calls:
            with pytest.raises(GRPCError) as caught:
                await call
            assert caught.value.status is Status.INVALID_ARGUMENT
            assert message in (caught.value.message or "")
        assert (await stub.is_active(ScaledObjectRef(scaler_metadata={}))).result is True


async def _first(stream: AsyncIterator[_M]) -> _M:
    async for message in stream:
        return message
    raise AssertionError("the stream ended without a message")


async def test_stream_is_active_sends_current_state_at_once(scaler: RunningScaler) -> None:
    async with Channel("127.0.0.1", scaler.port) as channel:
        stub = ExternalScalerStub(channel)
        idle = ScaledObjectRef(scaler_metadata={"gpuIndex": "1", "activationThreshold": "5"})
        with anyio.fail_after(2):
            assert (await _first(stub.stream_is_active(idle))).result is False
            assert (await _first(stub.stream_is_active(ScaledObjectRef()))).result is True


async def test_get_metrics_answers_with_the_requested_name(scaler: RunningScaler) -> None:
    async with Channel("127.0.0.1", scaler.port) as channel:
        stub = ExternalScalerStub(channel)
        ref = ScaledObjectRef(scaler_metadata={"metricName": "gpu-busy"})
        assert (await stub.get_metric_spec(ref)).metric_specs[0].metric_name == "gpu-busy"
        for asked in ("gpu-busy", "GPU-BUSY", ""):
            response = await stub.get_metrics(
                GetMetricsRequest(scaled_object_ref=ref, metric_name=asked)
            )
            assert [v.metric_name for v in response.metric_values] == [asked or "gpu-busy"]


async def test_unavailable_before_any_reading_after_a_bounded_wait(
    fake_gpus: FakeGpuSource,
) -> None:
    fake_gpus.pause()
    async with (
        open_scaler(fake_gpus, host="127.0.0.1", port=0) as running,
        Channel("127.0.0.1", running.port) as channel,
    ):
        stub = ExternalScalerStub(channel)
        with anyio.fail_after(5), pytest.raises(GRPCError) as caught:
            await stub.is_active(ScaledObjectRef())
        assert caught.value.status is Status.UNAVAILABLE
        assert caught.value.message == "no GPU readings yet"
