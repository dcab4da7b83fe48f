"""Trigger metadata: the Go project's keys, defaults and precedence, minus its defects."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.domain.aggregation import Aggregation
from keda_gpu_scaler.domain.catalog import MetricType
from keda_gpu_scaler.domain.errors import InvalidTrigger
from keda_gpu_scaler.domain.profiles import PROFILES
from keda_gpu_scaler.domain.trigger import parse_trigger


def test_empty_metadata_gives_the_go_defaults() -> None:
    spec = parse_trigger({})
    assert spec.metric_name == "keda_gpu_metric"
    assert spec.metric_type is MetricType.GPU_UTILIZATION
    assert (spec.target, spec.activation, spec.gpu_index) == (80.0, 0.0, -1)
    assert spec.aggregation is Aggregation.MAX
    assert (spec.poll_interval_s, spec.cooldown_s) == (10, 60)
    assert (spec.vllm_endpoint, spec.triton_endpoint, spec.warnings) == (None, None, ())


GO_PROFILES = {
    "distributed-training": ("keda_gpu_distributed_training", "nvlink_tx_mbps", 50000, 5000),
    "vllm-inference": ("keda_gpu_vllm_inference", "memory_used_percent", 80, 5),
    "vllm-queue-depth": ("keda_gpu_vllm_queue_depth", "vllm_queue_depth", 5, 1),
    "triton-inference": ("keda_gpu_triton_inference", "gpu_utilization", 75, 10),
    "triton-queue-wait": ("keda_gpu_triton_queue_wait", "triton_queue_wait_ms", 50, 5),
    "triton-request-rate": ("keda_gpu_triton_request_rate", "triton_request_rate", 50, 1),
    "training": ("keda_gpu_training", "gpu_utilization", 90, 0),
    "batch": ("keda_gpu_batch", "memory_used_percent", 70, 1),
    "ollama": ("keda_gpu_ollama", "memory_used_percent", 70, 3),
    "tgi-inference": ("keda_gpu_tgi_inference", "memory_used_percent", 75, 5),
}


@pytest.mark.parametrize(("name", "expected"), GO_PROFILES.items())
def test_profiles_match_the_go_project(name: str, expected: tuple[str, str, int, int]) -> None:
    endpoints = {
        "vllmEndpoint": "http://vllm:8000/metrics",
        "tritonEndpoint": "http://triton:8002/metrics",
    }
    spec = parse_trigger({"profile": name, **endpoints})
    assert (spec.metric_name, spec.metric_type, spec.target, spec.activation) == expected
    assert PROFILES[name].metric_name == expected[0]


def test_explicit_keys_override_the_profile() -> None:
    spec = parse_trigger({"profile": "vllm-inference", "targetValue": "90"})
    assert (spec.metric_name, spec.target, spec.activation) == ("keda_gpu_vllm_inference", 90, 5)


def test_metric_type_keeps_profile_name_target_and_activation() -> None:
    spec = parse_trigger({"profile": "vllm-inference", "metricType": "temperature"})
    assert spec.metric_type is MetricType.TEMPERATURE
    assert (spec.metric_name, spec.target, spec.activation) == ("keda_gpu_vllm_inference", 80, 5)


def test_shorthands_beat_target_and_type_whatever_the_order() -> None:
    spec = parse_trigger(
        {"targetGpuUtilization": "40", "metricType": "temperature", "targetValue": "99"}
    )
    assert (spec.metric_type, spec.target) == (MetricType.GPU_UTILIZATION, 40)
    both = parse_trigger({"targetMemoryUtilization": "70", "targetGpuUtilization": "40"})
    assert (both.metric_type, both.target) == (MetricType.MEMORY_USED_PERCENT, 70)


def test_shorthand_switches_an_engine_profile_to_nvml() -> None:
    spec = parse_trigger({"profile": "vllm-queue-depth", "targetGpuUtilization": "50"})
    assert spec.metric_type is MetricType.GPU_UTILIZATION
    assert spec.endpoint is None


def test_endpoint_requirement_is_checked_after_overrides() -> None:
    with pytest.raises(InvalidTrigger, match="tritonEndpoint"):
        parse_trigger({"profile": "triton-queue-wait"})
    spec = parse_trigger({"profile": "triton-queue-wait", "metricType": "gpu_utilization"})
    assert spec.metric_type is MetricType.GPU_UTILIZATION


def test_empty_endpoint_counts_as_unset() -> None:
    assert parse_trigger({"vllmEndpoint": ""}).vllm_endpoint is None


def test_endpoint_is_validated_for_any_metric_type() -> None:
    with pytest.raises(InvalidTrigger, match="link-local"):
        parse_trigger({"metricType": "gpu_utilization", "vllmEndpoint": "http://169.254.1.1/m"})


def test_from_env_keys_stand_in_for_absent_keys() -> None:
    spec = parse_trigger({"targetValueFromEnv": "42", "profileFromEnv": "training"})
    assert (spec.metric_name, spec.target) == ("keda_gpu_training", 42)
    assert parse_trigger({"targetValue": "7", "targetValueFromEnv": "42"}).target == 7


def test_unknown_keys_are_ignored_and_typos_warned() -> None:
    spec = parse_trigger(
        {
            "scalerAddress": "x:6000",
            "enableTLS": "false",
            "foo": "bar",
            "targetvalue": "3",
            "cooldownSecond": "1",
        }
    )
    assert spec.target == 80
    assert spec.warnings == (
        'unknown key "targetvalue" is ignored; did you mean "targetValue"?',
        'unknown key "cooldownSecond" is ignored; did you mean "cooldownSeconds"?',
    )


def test_metric_name_is_lowercased_and_restricted() -> None:
    spec = parse_trigger({"metricName": "My.GPU metric"})
    assert spec.metric_name == "my_gpu_metric"
    assert spec.warnings == (
        'metricName "My.GPU metric" is served as "my_gpu_metric" (lowercase, [a-z0-9_-])',
    )
    assert parse_trigger({"metricName": "ok-name_1"}).warnings == ()


def test_first_error_wins_in_parse_order() -> None:
    with pytest.raises(InvalidTrigger) as caught:
        parse_trigger({"targetValue": "x", "gpuIndex": "y"})
    assert caught.value.key == "targetValue"


def test_cooldown_seconds() -> None:
    assert parse_trigger({"cooldownSeconds": "0"}).cooldown_s == 0
    assert parse_trigger({"cooldownSeconds": "300"}).cooldown_s == 300


def test_percentile_aggregations_parse() -> None:
    assert parse_trigger({"aggregation": "p95"}).aggregation is Aggregation.P95
