"""Arbitrary metadata only ever gives a valid answer or INVALID_ARGUMENT (or, for readings,
UNAVAILABLE): never another error, never a bad number."""

from __future__ import annotations

import math

import anyio
import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keda_gpu_scaler.domain.trigger_keys import TRIGGER_KEYS
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.state import fold
from keda_gpu_scaler.serving._proto.externalscaler import GetMetricsRequest, ScaledObjectRef
from keda_gpu_scaler.serving.service import ExternalScalerService
from keda_gpu_scaler.sources.fake import FakeGpuSource
from keda_gpu_scaler.testing import unary_service

INT64_MAX = 2**63 - 1
INTERESTING = [
    "",
    "0",
    "-1",
    "1",
    "80",
    "0.5",
    "1e3",
    "NaN",
    "inf",
    "-Inf",
    "max",
    "p99",
    "training",
    "vllm-inference",
    "gpu_utilization",
    "sm_active",
    "nvlink_tx_mbps",
    "vllm_queue_depth",
    "http://vllm:8000/metrics",
    "http://169.254.169.254/",
    "ftp://x",
    " 1",
    "1_000",
    "0x10",
    "1.0",
    "99999999999999999999999",
    "30",
    "3600",
    "3601",
    "avg",
    "last",
]

keys = st.one_of(st.sampled_from(TRIGGER_KEYS), st.text(max_size=12))
values = st.one_of(st.sampled_from(INTERESTING), st.text(max_size=30))
metadata_maps = st.dictionaries(keys, values, max_size=8)


def _service_with_readings() -> ExternalScalerService:
    source = FakeGpuSource(2, period_s=1.0)
    source.set(
        0,
        gpu_utilization=42.0,
        memory_used_bytes=1 << 30,
        memory_total_bytes=8 << 30,
        power_mw=150_000.0,
        sm_active=12.0,
    )
    source.set(1, gpu_utilization=0.0, memory_used_bytes=0, memory_total_bytes=8 << 30)
    hub = SnapshotHub()
    hub.publish(fold(hub.current, source.readings(anyio.current_time()), anyio.current_time()))
    return unary_service(hub)


async def _answers(metadata: dict[str, str]) -> None:
    service = _service_with_readings()
    ref = ScaledObjectRef(name="so", namespace="ns", scaler_metadata=metadata)
    try:
        spec = (await service.get_metric_spec(ref)).metric_specs
    except GRPCError as exc:
        assert exc.status is Status.INVALID_ARGUMENT, exc
        assert exc.message and exc.message.startswith("failed to parse scaler metadata: ")
        return
    assert len(spec) == 1
    assert spec[0].target_size_float > 0 and math.isfinite(spec[0].target_size_float)
    assert spec[0].target_size == min(INT64_MAX, max(1, round(spec[0].target_size_float)))
    assert spec[0].metric_name and set(spec[0].metric_name) <= set(
        "abcdefghijklmnopqrstuvwxyz0123456789_-"
    )
    for call in (
        service.get_metrics(GetMetricsRequest(scaled_object_ref=ref, metric_name="x")),
        service.is_active(ref),
    ):
        try:
            answer = await call
        except GRPCError as exc:
            assert exc.status is Status.UNAVAILABLE, exc
            continue
        if hasattr(answer, "metric_values"):
            (value,) = answer.metric_values
            assert value.metric_value_float >= 0 and math.isfinite(value.metric_value_float)
            assert value.metric_value == min(INT64_MAX, round(value.metric_value_float))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(metadata_maps)
def test_any_metadata_gives_an_answer_or_invalid_argument(metadata: dict[str, str]) -> None:
    anyio.run(_answers, metadata, backend="asyncio")


@pytest.mark.parametrize("metadata", [{"targetValue": "1e308"}, {"activationThreshold": "-5"}])
def test_extreme_but_valid_numbers(metadata: dict[str, str]) -> None:
    anyio.run(_answers, metadata, backend="asyncio")
