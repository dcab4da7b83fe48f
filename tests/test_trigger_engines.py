"""Trigger keys of the engines that name which series of an endpoint a trigger reads."""

from __future__ import annotations

from keda_gpu_scaler.domain.engines import Discovery, EngineKind, EngineTarget
from keda_gpu_scaler.domain.trigger import parse_trigger

EPP = "http://epp.llm.svc:9090/metrics"
DYNAMO = "http://dynamo-frontend.llm.svc:8000/metrics"


def test_a_router_trigger_targets_its_pool_and_model() -> None:
    spec = parse_trigger(
        {
            "profile": "llmd-queue",
            "llmdEndpoint": EPP,
            "inferencePool": "qwen-pool",
            "targetModelName": "Qwen/Qwen3-8B",
        }
    )
    assert (spec.metric_type, spec.target, spec.activation) == ("llmd_queue_size", 5.0, 0.0)
    assert spec.engine_target == EngineTarget(
        EngineKind.LLMD,
        EPP,
        Discovery.STATIC,
        (("inference_pool", "qwen-pool"), ("target_model_name", "Qwen/Qwen3-8B")),
    )
    assert spec.engine_target is not None
    assert spec.engine_target.source == (
        f"llmd:static:{EPP}[inference_pool=qwen-pool,target_model_name=Qwen/Qwen3-8B]"
    )


def test_two_pools_on_one_router_are_two_targets() -> None:
    a, b = (
        parse_trigger({"profile": "llmd-queue", "llmdEndpoint": EPP, "inferencePool": pool})
        for pool in ("a", "b")
    )
    assert a.engine_target != b.engine_target


def test_dynamo_model_and_prefix() -> None:
    spec = parse_trigger(
        {
            "profile": "dynamo-queue",
            "dynamoEndpoint": DYNAMO,
            "dynamoModel": "Qwen/Qwen3-0.6B",
            "dynamoMetricsPrefixFromEnv": "nv_llm_http_service",
        }
    )
    assert spec.engine_target is not None
    assert spec.engine_target.options == (
        ("model", "Qwen/Qwen3-0.6B"),
        ("prefix", "nv_llm_http_service"),
    )


def test_the_default_prefix_and_empty_keys_name_no_option() -> None:
    default = parse_trigger({"profile": "dynamo-queue", "dynamoEndpoint": DYNAMO})
    spelled = parse_trigger(
        {
            "profile": "dynamo-queue",
            "dynamoEndpoint": DYNAMO,
            "dynamoMetricsPrefix": "dynamo_frontend",
            "dynamoModel": "",
        }
    )
    assert default.engine_target == spelled.engine_target
    assert default.engine_target is not None
    assert default.engine_target.options == ()


def test_a_key_of_another_engine_is_ignored_with_a_warning() -> None:
    spec = parse_trigger(
        {"profile": "vllm-queue-depth", "vllmEndpoint": DYNAMO, "inferencePool": "qwen-pool"}
    )
    assert spec.inference_pool is None
    assert spec.engine_target is not None
    assert spec.engine_target.options == ()
    assert spec.warnings == (
        'inferencePool "qwen-pool" is ignored: metricType "vllm_queue_depth" does not read '
        "llmdEndpoint",
    )


def test_trtllm_and_the_new_engines_take_dns_discovery() -> None:
    spec = parse_trigger(
        {
            "profile": "trtllm-queue-depth",
            "trtllmEndpoint": "http://trtllm-headless.llm.svc:8000/prometheus/metrics",
            "endpointDiscovery": "dns",
        }
    )
    assert spec.engine_target is not None
    assert spec.engine_target.kind is EngineKind.TRTLLM
    assert spec.engine_target.discovery is Discovery.DNS
