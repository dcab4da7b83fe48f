from __future__ import annotations

import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from keda_gpu_scaler.app.compose import RunningScaler
from keda_gpu_scaler.serving._proto.externalscaler import (
    ExternalScalerStub,
    GetMetricsRequest,
    ScaledObjectRef,
)

pytestmark = pytest.mark.anyio


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
