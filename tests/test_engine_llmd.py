"""The llm-d router's endpoint picker: the flow-control queue of one pool or target model,
which holds a pool's requests while it has no endpoint."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.domain.engines import EngineKind, LlmdReading
from keda_gpu_scaler.sources.engines.extract import SELECTIONS
from keda_gpu_scaler.sources.engines.llmd import extract_llmd
from keda_gpu_scaler.sources.engines.promtext import parse_exposition
from tests.engine_payloads import LLMD, fixture

NEW = "llm_d_epp_flow_control_queue_size"
OLD = "inference_extension_flow_control_queue_size"


def _read(text: str, **options: str) -> LlmdReading:
    exposition = parse_exposition(text, SELECTIONS[EngineKind.LLMD])
    return extract_llmd(exposition, taken_at=0.0, options=options)[0]


def _without(text: str, *families: str) -> str:
    """``text`` without the samples, HELP and TYPE lines of ``families``."""
    kept = []
    for line in text.splitlines():
        name = line.removeprefix("# HELP ").removeprefix("# TYPE ").split("{")[0].split(" ")[0]
        if name not in families:
            kept.append(line)
    return "\n".join(kept)


def test_a_pool_at_zero_replicas_holds_its_requests_at_the_router() -> None:
    reading = _read(fixture(LLMD), inference_pool="qwen-pool")
    assert reading.queue_size == 4.0  # both fairness and priority bands, counted once
    assert reading.ready_endpoints == 0.0
    assert (reading.average_queue_size, reading.average_kv_cache_percent) == (0.0, 0.0)


def test_the_new_and_the_deprecated_names_are_never_added() -> None:
    assert _read(fixture(LLMD)).queue_size == 4.0
    assert _read(_without(fixture(LLMD), NEW)).queue_size == 4.0  # an older EPP


def test_a_target_model_is_selected_by_its_label() -> None:
    assert _read(fixture(LLMD), target_model_name="Qwen/Qwen3-8B").queue_size == 4.0
    # Flow control runs and held nothing for that model: a real 0.
    assert _read(fixture(LLMD), target_model_name="other").queue_size == 0.0


def test_a_known_pool_that_holds_nothing_is_zero() -> None:
    idle = _without(fixture(LLMD), NEW, OLD)  # no band has held a request since start
    assert _read(idle, inference_pool="qwen-pool").queue_size == 0.0


def test_an_unknown_pool_is_an_error_naming_the_pools() -> None:
    reading = _read(fixture(LLMD), inference_pool="qwen-pol")
    assert reading.queue_size is None
    assert reading.reasons["queue_size"] == (
        'the router knows no InferencePool "qwen-pol" (pools: qwen-pool)'
    )
    assert reading.reasons["ready_endpoints"] == (
        'llm_d_epp_ready_endpoints has no series of pool "qwen-pol" (pools: qwen-pool)'
    )


def test_without_flow_control_the_queue_is_missing_and_says_why() -> None:
    off = _without(
        fixture(LLMD),
        NEW,
        OLD,
        "llm_d_epp_flow_control_pool_saturation",
    )
    reading = _read(off, inference_pool="qwen-pool")
    assert reading.queue_size is None
    assert reading.reasons["queue_size"] == (
        "llm_d_epp_flow_control_queue_size is missing from the payload: the EPP writes it once "
        "flow control has held a request (is flow control enabled?)"
    )
    assert reading.ready_endpoints == 0.0


def test_several_pools_need_a_choice_for_their_averages() -> None:
    second = fixture(LLMD).replace('{name="qwen-pool"} 0', '{name="qwen-pool"} 0\nX')
    lines: list[str] = []
    for line in second.splitlines():
        if line == "X":
            name = lines[-1].split("{")[0]
            line = f'{name}{{name="llama-pool"}} 0.5'
        lines.append(line)
    text = "\n".join(lines)
    reading = _read(text)
    assert reading.average_kv_cache_percent is None
    assert (
        "several pools (llama-pool, qwen-pool): choose one with inferencePool"
        in (reading.reasons["average_kv_cache_percent"])
    )
    assert _read(text, inference_pool="llama-pool").average_kv_cache_percent == pytest.approx(50)
    assert _read(text, inference_pool="llama-pool").queue_size == 0.0
