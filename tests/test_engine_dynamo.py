"""The NVIDIA Dynamo frontend as it writes its metrics: per model, a prefix users may change."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.domain.engines import EngineKind
from keda_gpu_scaler.sources.engines.dynamo import extract_dynamo
from keda_gpu_scaler.sources.engines.extract import extract_vllm, selection_for
from keda_gpu_scaler.sources.engines.promtext import parse_exposition
from tests.engine_payloads import DYNAMO, VLLM_2026, fixture

TTFT = "dynamo_frontend_time_to_first_token_seconds"


def test_every_model_summed() -> None:
    reading, _ = extract_dynamo(
        parse_exposition(fixture(DYNAMO), selection_for(EngineKind.DYNAMO)), taken_at=0.0
    )
    assert (reading.queued, reading.inflight) == (3.0, 14.0)


def test_one_model() -> None:
    options = {"model": "Qwen/Qwen3-0.6B"}
    text = fixture(DYNAMO)
    exposition = parse_exposition(text, selection_for(EngineKind.DYNAMO, options))
    reading, _ = extract_dynamo(exposition, taken_at=0.0, options=options)
    assert (reading.queued, reading.inflight) == (3.0, 12.0)


def test_a_model_without_series_is_named_with_those_there_are() -> None:
    options = {"model": "mistral"}
    exposition = parse_exposition(fixture(DYNAMO), selection_for(EngineKind.DYNAMO, options))
    reading, _ = extract_dynamo(exposition, taken_at=0.0, options=options)
    assert reading.queued is None
    assert reading.reasons["queued"] == (
        'dynamo_frontend_queued_requests has no series of model "mistral" '
        "(models: Qwen/Qwen3-0.6B, llama-3-8b)"
    )


def test_another_prefix_reads_the_renamed_families() -> None:
    renamed = fixture(DYNAMO).replace("dynamo_frontend_", "nv_llm_http_service_")
    default = parse_exposition(renamed, selection_for(EngineKind.DYNAMO))
    reading, _ = extract_dynamo(default, taken_at=0.0)
    assert reading.queued is None
    assert reading.reasons["queued"] == (
        "dynamo_frontend_queued_requests is missing from the payload: the frontend writes it "
        "from its first request on (metric prefix dynamo_frontend)"
    )
    options = {"prefix": "nv_llm_http_service"}
    exposition = parse_exposition(renamed, selection_for(EngineKind.DYNAMO, options))
    reading, _ = extract_dynamo(exposition, taken_at=0.0, options=options)
    assert reading.queued == 3.0


def test_the_ttft_p95_of_one_model_between_two_scrapes() -> None:
    options = {"model": "Qwen/Qwen3-0.6B"}
    text = fixture(DYNAMO)
    first = parse_exposition(text, selection_for(EngineKind.DYNAMO, options))
    _, base = extract_dynamo(first, taken_at=0.0, options=options)
    # Two more first tokens of that model, both in (0.47, 1]: the bounds the frontend chose.
    later = text
    for le, before, after in (("1", 3, 5), ("2.2", 4, 6), ("4.7", 4, 6), ("10", 4, 6)):
        old = f'{TTFT}_bucket{{model="Qwen/Qwen3-0.6B",le="{le}"}} {before}'
        assert old in later, old
        later = later.replace(old, f'{TTFT}_bucket{{model="Qwen/Qwen3-0.6B",le="{le}"}} {after}')
    for le in ("22", "48", "100", "220", "480", "+Inf"):
        old = f'{TTFT}_bucket{{model="Qwen/Qwen3-0.6B",le="{le}"}} 4'
        later = later.replace(old, f'{TTFT}_bucket{{model="Qwen/Qwen3-0.6B",le="{le}"}} 6')
    later = later.replace(
        f'{TTFT}_count{{model="Qwen/Qwen3-0.6B"}} 4', f'{TTFT}_count{{model="Qwen/Qwen3-0.6B"}} 6'
    )
    second = parse_exposition(later, selection_for(EngineKind.DYNAMO, options))
    reading, _ = extract_dynamo(second, taken_at=5.0, previous=base, options=options)
    assert reading.ttft_p95_s == pytest.approx(0.47 + 0.53 * 0.95)


def test_a_worker_passes_its_engines_series_through() -> None:
    # Dynamo's workers add their own labels to the engine's series and inject `model`
    # beside `model_name`: the engine's reading is unchanged.
    labels = 'dynamo_component="backend",dynamo_endpoint="generate",dynamo_namespace="dyn",'
    text = fixture(VLLM_2026).replace("{engine=", "{" + labels + 'model="llama",engine=')
    plain = extract_vllm(
        parse_exposition(fixture(VLLM_2026), selection_for(EngineKind.VLLM)), taken_at=0
    )
    worker = extract_vllm(parse_exposition(text, selection_for(EngineKind.VLLM)), taken_at=0)
    assert worker[0] == plain[0]
