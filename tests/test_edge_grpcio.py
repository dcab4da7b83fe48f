"""Every RPC over a real socket through Google's grpcio client."""

from __future__ import annotations

from functools import partial
from typing import Any

import anyio
import grpc
import pytest

from keda_gpu_scaler.app.scaler.compose import RunningScaler
from tests.grpcio_client import GrpcioModules, open_streams, ref
from tests.metadata_cases import BAD_METADATA

pytestmark = pytest.mark.anyio


def _call(port: int, method: str, request: Any, mods: GrpcioModules) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = mods.pb2_grpc.ExternalScalerStub(channel)
        return getattr(stub, method)(request, timeout=5)


async def _rpc(scaler: RunningScaler, mods: GrpcioModules, method: str, request: Any) -> Any:
    return await anyio.to_thread.run_sync(partial(_call, scaler.port, method, request, mods))


async def test_unary_rpcs(scaler: RunningScaler, grpcio_modules: GrpcioModules) -> None:
    mods = grpcio_modules
    request = ref(mods, {"profile": "triton-inference", "cooldownSeconds": "0"})
    spec = await _rpc(scaler, mods, "GetMetricSpec", request)
    assert len(spec.metricSpecs) == 1
    only = spec.metricSpecs[0]
    assert (only.metricName, only.targetSizeFloat, only.targetSize) == (
        "keda_gpu_triton_inference",
        75.0,
        75,
    )
    # KEDA sends back the name it got; the answer carries exactly that name.
    metrics = await _rpc(
        scaler,
        mods,
        "GetMetrics",
        mods.pb2.GetMetricsRequest(scaledObjectRef=request, metricName="keda_gpu_triton_inference"),
    )
    assert [(v.metricName, v.metricValueFloat, v.metricValue) for v in metrics.metricValues] == [
        ("keda_gpu_triton_inference", 87.0, 87)
    ]
    assert (await _rpc(scaler, mods, "IsActive", request)).result is True


async def test_fractional_targets_keep_both_fields_consistent(
    scaler: RunningScaler, grpcio_modules: GrpcioModules
) -> None:
    request = ref(
        grpcio_modules,
        {
            "metricType": "power_draw",
            "targetValue": "0.4",
            "aggregation": "avg",
            "cooldownSeconds": "0",
        },
    )
    spec = (await _rpc(scaler, grpcio_modules, "GetMetricSpec", request)).metricSpecs[0]
    assert (spec.targetSizeFloat, spec.targetSize) == (0.4, 1)
    value = (
        await _rpc(
            scaler,
            grpcio_modules,
            "GetMetrics",
            grpcio_modules.pb2.GetMetricsRequest(
                scaledObjectRef=request, metricName=spec.metricName
            ),
        )
    ).metricValues[0]
    assert (value.metricValueFloat, value.metricValue) == (215.0, 215)


async def test_unavailable_when_the_metric_is_not_supported(
    scaler: RunningScaler, grpcio_modules: GrpcioModules
) -> None:
    request = ref(grpcio_modules, {"profile": "distributed-training"})
    # GetMetricSpec depends on metadata only, so KEDA's fallback keeps working.
    spec = await _rpc(scaler, grpcio_modules, "GetMetricSpec", request)
    assert spec.metricSpecs[0].metricName == "keda_gpu_distributed_training"
    for method, message in (
        ("IsActive", request),
        (
            "GetMetrics",
            grpcio_modules.pb2.GetMetricsRequest(
                scaledObjectRef=request, metricName="keda_gpu_distributed_training"
            ),
        ),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            await _rpc(scaler, grpcio_modules, method, message)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "nvlink_tx_mbps is not supported" in caught.value.details()


@pytest.mark.parametrize(("metadata", "message"), BAD_METADATA)
async def test_bad_metadata_is_invalid_argument_and_the_server_keeps_serving(
    scaler: RunningScaler, grpcio_modules: GrpcioModules, metadata: dict[str, str], message: str
) -> None:
    mods = grpcio_modules
    bad = ref(mods, metadata)
    for method, request in (
        ("GetMetricSpec", bad),
        ("GetMetrics", mods.pb2.GetMetricsRequest(scaledObjectRef=bad, metricName="m")),
        ("IsActive", bad),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            await _rpc(scaler, mods, method, request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in caught.value.details()
    good = await _rpc(scaler, mods, "IsActive", ref(mods, {}))
    assert good.result is True


async def test_stream_is_active_sends_at_once(
    scaler: RunningScaler, grpcio_modules: GrpcioModules
) -> None:
    result = await anyio.to_thread.run_sync(
        partial(
            open_streams, grpcio_modules, scaler.port, 3, {"profile": "training"}, unary_calls=2
        )
    )
    assert len(result.first_message_s) == 3


async def test_stream_with_bad_metadata_fails_at_once(
    scaler: RunningScaler, grpcio_modules: GrpcioModules
) -> None:
    def first_message() -> Any:
        with grpc.insecure_channel(f"127.0.0.1:{scaler.port}") as channel:
            stub = grpcio_modules.pb2_grpc.ExternalScalerStub(channel)
            call = stub.StreamIsActive(ref(grpcio_modules, {"pollIntervalSeconds": "0"}), timeout=5)
            return next(iter(call))

    with pytest.raises(grpc.RpcError) as caught:
        await anyio.to_thread.run_sync(first_message)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert 'pollIntervalSeconds "0"' in caught.value.details()
