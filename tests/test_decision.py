"""Pure decisions on hand-built snapshots."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import msgspec
import pytest

from keda_gpu_scaler.domain.decision import decide, measure
from keda_gpu_scaler.domain.engines import EngineKind, EngineSample, VllmReading
from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData
from keda_gpu_scaler.domain.samples import DeviceKey, GpuReading
from keda_gpu_scaler.domain.snapshot import DeviceState, Snapshot
from keda_gpu_scaler.domain.trigger import parse_trigger
from keda_gpu_scaler.testing import snapshot_of

GIB = 1 << 30


def _reading(index: int, *, taken_at: float = 100.0, **fields: Any) -> GpuReading:
    base = GpuReading(
        source="t",
        key=DeviceKey(f"GPU-{index}"),
        index=index,
        uuid=f"GPU-{index}",
        name="test",
        taken_at=taken_at,
        period_s=1.0,
    )
    return msgspec.structs.replace(base, **fields)


def _snapshot(*devices: DeviceState) -> Snapshot:
    return snapshot_of(devices, published_at=100.0)


def _device(reading: GpuReading) -> DeviceState:
    return DeviceState(key=reading.key, index=reading.index, reading=reading)


FOUR = _snapshot(
    *(
        _device(_reading(i, gpu_utilization=u, power_mw=100_000.0))
        for i, u in enumerate([10.0, 40.0, 20.0, 30.0])
    )
)


@pytest.mark.parametrize(
    ("aggregation", "expected"), [("max", 40), ("min", 10), ("avg", 25), ("sum", 100), ("p95", 40)]
)
def test_all_gpus_are_aggregated(aggregation: str, expected: float) -> None:
    spec = parse_trigger({"aggregation": aggregation})
    assert measure(spec, FOUR, 100.0).value == expected


def test_gpu_index_selects_one_gpu_and_ignores_aggregation() -> None:
    spec = parse_trigger({"gpuIndex": "2", "aggregation": "sum"})
    assert measure(spec, FOUR, 100.0).value == 20


def test_missing_gpu_index_is_unavailable() -> None:
    with pytest.raises(NoData, match=r"no GPU with gpuIndex 7 on this node \(GPUs: 0, 1, 2, 3\)"):
        measure(parse_trigger({"gpuIndex": "7"}), FOUR, 100.0)


def test_unsupported_metric_is_an_error_not_zero() -> None:
    with pytest.raises(NoData, match="nvlink_tx_mbps is not supported on GPU 0, 1, 2, 3"):
        measure(parse_trigger({"profile": "distributed-training"}), FOUR, 100.0)


def test_devices_without_the_metric_are_left_out_and_named() -> None:
    snap = _snapshot(_device(_reading(0, sm_active=50.0)), _device(_reading(1)))
    measured = measure(parse_trigger({"metricType": "sm_active"}), snap, 100.0)
    assert (measured.value, measured.unsupported) == (50, (1,))


def test_memory_percent_uses_whole_mib_like_the_go_project() -> None:
    used = 60 * GIB + (1 << 19)  # half a MiB more is dropped
    snap = _snapshot(_device(_reading(0, memory_used_bytes=used, memory_total_bytes=80 * GIB)))
    assert measure(parse_trigger({"metricType": "memory_used_percent"}), snap, 100.0).value == 75
    assert measure(parse_trigger({"metricType": "memory_used_mib"}), snap, 100.0).value == 61440


def test_power_is_in_watts() -> None:
    assert measure(parse_trigger({"metricType": "power_draw"}), FOUR, 100.0).value == 100


def test_stale_reading_is_unavailable() -> None:
    spec = parse_trigger({})
    assert measure(spec, FOUR, 103.0).value == 40  # exactly three periods old is still fresh
    with pytest.raises(NoData, match=r"GPU 0 reading is stale: 3.1 s old \(limit 3 s"):
        measure(spec, FOUR, 103.1)


def test_lost_gpu_is_unavailable_even_with_an_old_reading() -> None:
    reading = _reading(0, gpu_utilization=50.0)
    lost = DeviceState(key=reading.key, index=0, reading=reading, lost_reason="GPU is lost")
    with pytest.raises(NoData, match=r"GPU 0 \(GPU-0\) is lost: GPU is lost"):
        measure(parse_trigger({}), _snapshot(lost), 100.0)


def test_empty_snapshot_is_unavailable() -> None:
    with pytest.raises(NoData, match="no GPU readings yet"):
        measure(parse_trigger({}), _snapshot(), 0.0)


def test_engine_metric_types_are_unavailable_not_zero() -> None:
    spec = parse_trigger({"profile": "vllm-queue-depth", "vllmEndpoint": "http://vllm/metrics"})
    with pytest.raises(NoData, match=r"no scrape of http://vllm/metrics yet"):
        measure(spec, FOUR, 100.0)


def _engine_snapshot(sample: EngineSample) -> Snapshot:
    return Snapshot(
        version=1, published_at=100.0, engines=MappingProxyType({sample.source: sample})
    )


VLLM_SPEC = {"vllmEndpoint": "http://vllm:8000/metrics", "cooldownSeconds": "0"}
VLLM_SOURCE = "vllm:static:http://vllm:8000/metrics"


def _vllm(reading: VllmReading | None = None, **fields: Any) -> EngineSample:
    return EngineSample(
        source=VLLM_SOURCE,
        kind=EngineKind.VLLM,
        endpoint="http://vllm:8000/metrics",
        taken_at=99.0,
        period_s=5.0,
        reading=reading,
        **fields,
    )


def test_engine_metrics_read_the_samplers_newest_scrape() -> None:
    reading = VllmReading(
        taken_at=99.0,
        queue_depth=7.0,
        ttft_p95_s=0.25,
        reasons={"kv_cache_usage_percent": "vllm:kv_cache_usage_perc is missing from the payload"},
    )
    snap = _engine_snapshot(_vllm(reading))
    queue = decide(parse_trigger({"profile": "vllm-queue-depth", **VLLM_SPEC}), snap, None, 100.0)
    assert (queue.value, queue.active) == (7, True)
    assert queue.explanation.startswith("vllm_queue_depth max of [http://vllm:8000/metrics=7]")
    ttft = measure(parse_trigger({"metricType": "vllm_ttft_p95_ms", **VLLM_SPEC}), snap, 100.0)
    assert ttft.value == 250  # seconds in the reading, milliseconds in the metric
    with pytest.raises(NoData, match="vllm:kv_cache_usage_perc is missing from the payload"):
        measure(parse_trigger({"metricType": "vllm_kv_cache_usage", **VLLM_SPEC}), snap, 100.0)


def test_a_scrape_error_that_names_the_url_is_not_prefixed_with_it_again() -> None:
    spec = parse_trigger({"profile": "vllm-queue-depth", **VLLM_SPEC})
    error = "http://vllm:8000/metrics (10.0.0.7): returned HTTP 404"
    with pytest.raises(NoData) as caught:
        measure(spec, _engine_snapshot(_vllm(error=error)), 100.0)
    assert str(caught.value) == error
    assert str(caught.value).count("http://vllm:8000/metrics") == 1


def test_engine_failure_staleness_and_refusal() -> None:
    spec = parse_trigger({"profile": "vllm-queue-depth", **VLLM_SPEC})
    down = _engine_snapshot(_vllm(error="connection failed: connection refused"))
    with pytest.raises(NoData, match=r"http://vllm:8000/metrics: connection failed"):
        measure(spec, down, 100.0)
    fresh = _engine_snapshot(_vllm(VllmReading(taken_at=99.0, queue_depth=1.0)))
    assert measure(spec, fresh, 114.0).value == 1
    with pytest.raises(NoData, match="stale"):
        measure(spec, fresh, 114.1)
    refused = _engine_snapshot(_vllm(error="vllm resolves to 169.254.169.254", refused=True))
    with pytest.raises(InvalidTrigger, match='invalid vllmEndpoint "http://vllm:8000/metrics"'):
        measure(spec, refused, 100.0)


def test_activity_is_strictly_above_the_threshold() -> None:
    idle = _snapshot(_device(_reading(0, gpu_utilization=0.0)))
    decision = decide(parse_trigger({"cooldownSeconds": "0"}), idle, None, 100.0)
    assert (decision.value, decision.active) == (0, False)
    at = parse_trigger({"activationThreshold": "40", "cooldownSeconds": "0"})
    assert decide(at, FOUR, None, 100.0).active is False
    above = parse_trigger({"activationThreshold": "39.9", "cooldownSeconds": "0"})
    assert decide(above, FOUR, None, 100.0).active is True


def test_explanation_says_why() -> None:
    spec = parse_trigger({"profile": "triton-inference", "cooldownSeconds": "0"})
    decision = decide(spec, FOUR, None, 100.0)
    assert decision.explanation == (
        "gpu_utilization max of [GPU 0=10, GPU 1=40, GPU 2=20, GPU 3=30] = 40; "
        "40 > activation 10: active; target 75"
    )


def test_cooldown_holds_and_explains() -> None:
    spec = parse_trigger({"cooldownSeconds": "60", "gpuIndex": "1"})
    high = decide(spec, FOUR, None, 100.0)
    low_snap = _snapshot(_device(_reading(1, taken_at=100.0, gpu_utilization=5.0)))
    first_drop = decide(spec, low_snap, high.cooldown.entry if high.cooldown else None, 100.0)
    assert first_drop.value == 5
    lower = _snapshot(_device(_reading(1, taken_at=110.0, gpu_utilization=1.0)))
    held = decide(spec, lower, first_drop.cooldown.entry if first_drop.cooldown else None, 110.0)
    assert (held.value, held.raw_value, held.active) == (5, 1, True)
    assert "cooldown holds 5 for 50 s more" in held.explanation
