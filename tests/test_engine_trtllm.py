"""TensorRT-LLM's ``trtllm-serve`` as its collector writes it, with and without
``enable_iter_perf_stats``."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.domain.engines import EngineKind
from keda_gpu_scaler.sources.engines.extract import SELECTIONS
from keda_gpu_scaler.sources.engines.fields import FIRST_SCRAPE
from keda_gpu_scaler.sources.engines.promtext import Exposition, parse_exposition
from keda_gpu_scaler.sources.engines.trtllm import extract_trtllm
from tests.engine_payloads import TRTLLM, TRTLLM_NO_ITER_STATS, fixture


def _trtllm(text: str) -> Exposition:
    return parse_exposition(text, SELECTIONS[EngineKind.TRTLLM])


def test_with_iteration_stats_every_gauge_reads() -> None:
    reading, _ = extract_trtllm(_trtllm(fixture(TRTLLM)), taken_at=0.0)
    assert (reading.queue_depth, reading.running) == (11.0, 64.0)
    assert reading.kv_cache_usage_percent == pytest.approx(81.25)
    assert reading.kv_cache_hit_rate_percent == pytest.approx(42.0)
    assert reading.ttft_p95_s is None
    assert reading.reasons["ttft_p95_s"] == FIRST_SCRAPE


def test_without_iteration_stats_the_gauges_are_an_error_that_says_so() -> None:
    reading, _ = extract_trtllm(_trtllm(fixture(TRTLLM_NO_ITER_STATS)), taken_at=0.0)
    for field in ("queue_depth", "running", "kv_cache_usage_percent"):
        assert reading.value(field) is None
        assert reading.reasons[field].endswith(
            "is missing from the payload: trtllm-serve writes it only with "
            "enable_iter_perf_stats: true in its LLM API options"
        ), field
    assert reading.reasons["queue_depth"].startswith("trtllm_num_requests_waiting is missing")


def test_latencies_come_from_the_histograms_between_two_scrapes() -> None:
    text = fixture(TRTLLM)
    _, base = extract_trtllm(_trtllm(text), taken_at=0.0)
    later = text.replace(
        'trtllm_request_queue_time_seconds_sum{engine_type="undefined",model_name="undefined"}'
        " 0.31",
        'trtllm_request_queue_time_seconds_sum{engine_type="undefined",model_name="undefined"}'
        " 1.31",
    )
    for name, bucket_floor in (
        ("trtllm_request_queue_time_seconds", 0.3),
        ("trtllm_time_to_first_token_seconds", 0.0),
    ):
        later = _add_observations(later, name, 4, above=bucket_floor)
    reading, _ = extract_trtllm(_trtllm(later), taken_at=5.0, previous=base)
    assert reading.queue_time_mean_s == pytest.approx(1.0 / 4)
    assert reading.ttft_p95_s is not None


def _add_observations(text: str, family: str, n: int, *, above: float) -> str:
    """``n`` more observations in every bucket above ``above`` (and in _count)."""
    lines = []
    for line in text.splitlines():
        if line.startswith(f"{family}_bucket"):
            le = line.split('le="')[1].split('"')[0]
            if le == "+Inf" or float(le) > above:
                value = float(line.rsplit(" ", 1)[1]) + n
                line = f"{line.rsplit(' ', 1)[0]} {value}"
        elif line.startswith(f"{family}_count"):
            value = float(line.rsplit(" ", 1)[1]) + n
            line = f"{line.rsplit(' ', 1)[0]} {value}"
        lines.append(line)
    return "\n".join(lines)
