"""Triton as its core writes per-model series today: a ``namespace`` label with model
namespacing, a failure counter per ``reason``, and the first-response histogram."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.domain.engines import EngineKind
from keda_gpu_scaler.sources.engines.extract import SELECTIONS, extract_triton
from keda_gpu_scaler.sources.engines.promtext import Exposition, parse_exposition
from tests.engine_payloads import TRITON, fixture

FIRST = "nv_inference_first_response_histogram_ms"


def _triton(text: str) -> Exposition:
    return parse_exposition(text, SELECTIONS[EngineKind.TRITON])


def _namespaced(success: tuple[int, int], queue_us: tuple[int, int]) -> str:
    """One model name in two namespaces (``--model-namespacing``): its own series in each."""
    lines = ["# TYPE nv_inference_request_success counter"]
    lines += [
        f'nv_inference_request_success{{model="m",namespace="{ns}",version="1"}} {n}'
        for ns, n in zip(("a", "b"), success, strict=True)
    ]
    lines.append("# TYPE nv_inference_queue_duration_us counter")
    lines += [
        f'nv_inference_queue_duration_us{{model="m",namespace="{ns}",version="1"}} {us}'
        for ns, us in zip(("a", "b"), queue_us, strict=True)
    ]
    lines.append("# TYPE nv_inference_pending_request_count gauge")
    lines += [
        f'nv_inference_pending_request_count{{model="m",namespace="{ns}",version="1"}} 2'
        for ns in ("a", "b")
    ]
    return "\n".join(lines)


def test_namespaces_keep_their_own_series() -> None:
    _, base = extract_triton(_triton(_namespaced((0, 0), (0, 0))), taken_at=0.0)
    reading, _ = extract_triton(
        _triton(_namespaced((10, 30), (20_000, 30_000))), taken_at=5.0, previous=base
    )
    assert reading.pending_requests == 4.0
    assert reading.queue_wait_ms == pytest.approx(50_000 / 40 / 1000)
    assert reading.request_rate == pytest.approx(40 / 5)


def _first_response(counts: tuple[int, int, int], total_ms: float) -> str:
    bounds = ("100", "500", "+Inf")
    labels = 'model="llm",namespace="prod",version="1"'
    lines = [f"# TYPE {FIRST} histogram"]
    lines += [
        f'{FIRST}_bucket{{{labels},le="{le}"}} {n}' for le, n in zip(bounds, counts, strict=True)
    ]
    lines += [f"{FIRST}_sum{{{labels}}} {total_ms}", f"{FIRST}_count{{{labels}}} {counts[-1]}"]
    return "\n".join(lines)


def test_the_first_response_histogram_gives_a_p95_in_ms() -> None:
    _, base = extract_triton(_triton(_first_response((0, 0, 0), 0)), taken_at=0.0)
    reading, _ = extract_triton(
        _triton(_first_response((10, 20, 20), 4000.0)), taken_at=5.0, previous=base
    )
    # rank 19 of 20 lies in (100, 500]: 100 + 400 × 9/10.
    assert reading.first_response_p95_ms == pytest.approx(460.0)


def test_without_histogram_latencies_it_says_how_to_turn_it_on() -> None:
    _, base = extract_triton(_triton(fixture(TRITON)), taken_at=0.0)
    reading, _ = extract_triton(_triton(fixture(TRITON)), taken_at=5.0, previous=base)
    assert reading.first_response_p95_ms is None
    assert reading.reasons["first_response_p95_ms"] == (
        f"{FIRST} is missing from the payload: Triton writes it for decoupled models only, "
        "with --metrics-config histogram_latencies=true"
    )
