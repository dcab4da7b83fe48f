"""Engine readings from parsed samples: aggregation rules, units, absent-with-reason, rates."""

from __future__ import annotations

import math

import pytest

from keda_gpu_scaler.domain.engines import EngineKind
from keda_gpu_scaler.sources.engines.extract import (
    SELECTIONS,
    extract_sglang,
    extract_tgi,
    extract_triton,
    extract_vllm,
)
from keda_gpu_scaler.sources.engines.promtext import Exposition, parse_exposition
from keda_gpu_scaler.sources.engines.window import (
    Absent,
    HistogramDelta,
    histogram_quantile,
)
from tests.engine_payloads import (
    SGLANG,
    TGI,
    TRITON,
    VLLM_V0,
    VLLM_V1,
    fixture,
    triton_payload,
    vllm_histogram,
)


def _parse(kind: EngineKind, text: str) -> Exposition:
    return parse_exposition(text, SELECTIONS[kind])


def _vllm(text: str) -> Exposition:
    return _parse(EngineKind.VLLM, text)


# --- vLLM ---------------------------------------------------------------------------------


def test_vllm_v0_fixture_reads_the_old_kv_name() -> None:
    reading, _ = extract_vllm(_vllm(fixture(VLLM_V0)), taken_at=10.0)
    assert reading.queue_depth == 0.0
    assert reading.running == 0.0
    assert reading.kv_cache_usage_percent == 0.0
    assert reading.taken_at == 10.0
    assert reading.ttft_p95_s is None
    assert reading.why_absent("ttft_p95_s") == "first scrape: a rate needs two scrapes"


def test_vllm_v1_fixture_lacks_queue_and_kv_and_says_so() -> None:
    reading, _ = extract_vllm(_vllm(fixture(VLLM_V1)), taken_at=0.0)
    assert reading.running == 8.0
    assert reading.queue_depth is None
    assert reading.why_absent("queue_depth") == (
        "vllm:num_requests_waiting is missing from the payload"
    )
    assert reading.kv_cache_usage_percent is None
    assert "vllm:kv_cache_usage_perc is missing" in reading.reasons["kv_cache_usage_percent"]


DATA_PARALLEL = """
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 4.0
vllm:num_requests_waiting{engine="0",model_name="other"} 1.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 99.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 16.0
vllm:num_requests_running{engine="1",model_name="m"} 9.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.875
"""


def test_vllm_sums_queues_over_engines_and_models_and_takes_the_hottest_kv() -> None:
    reading, _ = extract_vllm(_vllm(DATA_PARALLEL), taken_at=0.0)
    assert reading.queue_depth == 8.0  # never the _by_reason series, never "last line wins"
    assert reading.running == 25.0
    assert reading.kv_cache_usage_percent == 87.5


def test_vllm_with_both_kv_names_reads_the_new_one_only() -> None:
    both = DATA_PARALLEL + (
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.875\n'
    )
    reading, _ = extract_vllm(_vllm(both), taken_at=0.0)
    assert reading.kv_cache_usage_percent == 87.5


def test_vllm_kv_above_one_is_refused() -> None:
    text = 'vllm:kv_cache_usage_perc{model_name="m"} 87.5\n'
    reading, _ = extract_vllm(_vllm(text), taken_at=0.0)
    assert reading.kv_cache_usage_percent is None
    assert reading.reasons["kv_cache_usage_percent"] == (
        "vllm:kv_cache_usage_perc is 87.5, above 1 (expected a fraction 0..1)"
    )


def test_vllm_nan_gauge_and_declared_empty_family_are_absent() -> None:
    text = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="m"} NaN\n'
    )
    reading, _ = extract_vllm(_vllm(text), taken_at=0.0)
    assert reading.queue_depth is None
    assert "declared but has no samples" in reading.reasons["queue_depth"]
    assert reading.running is None
    assert reading.reasons["running"] == 'vllm:num_requests_running{model_name="m"} is nan'


def _vllm_scrape(
    ttft: list[tuple[str, float]], ttft_sum: float, preemptions: float, engines: int = 1
) -> str:
    lines = ["# TYPE vllm:num_preemptions_total counter"]
    for e in range(engines):
        lines.append(f'vllm:num_preemptions_total{{engine="{e}",model_name="m"}} {preemptions}')
    for e in range(engines):
        lines += vllm_histogram(
            "vllm:time_to_first_token_seconds", ttft, ttft_sum, f'engine="{e}",model_name="m"'
        )
    return "\n".join(lines)


def test_vllm_latency_from_histogram_deltas_between_two_scrapes() -> None:
    before = _vllm_scrape([("0.1", 10), ("0.5", 20), ("1.0", 20), ("+Inf", 20)], 4.0, 2, 2)
    after = _vllm_scrape([("0.1", 10), ("0.5", 60), ("1.0", 100), ("+Inf", 100)], 44.0, 5, 2)
    _, baseline = extract_vllm(_vllm(before), taken_at=0.0)
    reading, _ = extract_vllm(_vllm(after), taken_at=10.0, previous=baseline)
    # Two engines: Δbuckets (0, 40, 40, 0) each, so 160 observations and Δsum 80 s.
    assert reading.ttft_mean_s == pytest.approx(0.5)
    # Rank 0.95 × 160 = 152 lies in (0.5, 1.0]: 0.5 + 0.5 × (152 − 80) / 80.
    assert reading.ttft_p95_s == pytest.approx(0.95)
    assert reading.preemptions_per_s == pytest.approx(0.6)
    assert reading.queue_time_mean_s is None
    assert reading.reasons["queue_time_mean_s"] == (
        "vllm:request_queue_time_seconds is missing from the payload"
    )


def test_vllm_no_new_observations_is_absent_not_zero() -> None:
    same = _vllm_scrape([("0.1", 1), ("+Inf", 1)], 0.05, 0)
    _, baseline = extract_vllm(_vllm(same), taken_at=0.0)
    reading, _ = extract_vllm(_vllm(same), taken_at=5.0, previous=baseline)
    assert reading.ttft_p95_s is None
    assert reading.reasons["ttft_p95_s"] == (
        "no vllm:time_to_first_token_seconds observations in the window"
    )
    assert reading.preemptions_per_s == 0.0  # a counter that did not move is a real 0


def test_vllm_reset_histogram_rebaselines() -> None:
    high = _vllm_scrape([("0.1", 50), ("+Inf", 90)], 30.0, 9)
    low = _vllm_scrape([("0.1", 1), ("+Inf", 2)], 0.2, 0)
    _, baseline = extract_vllm(_vllm(high), taken_at=0.0)
    reading, _ = extract_vllm(_vllm(low), taken_at=5.0, previous=baseline)
    assert reading.ttft_mean_s is None
    assert "re-baselined" in reading.reasons["ttft_mean_s"]
    assert reading.preemptions_per_s is None
    assert "re-baselined" in reading.reasons["preemptions_per_s"]


def test_vllm_histogram_without_inf_bucket_uses_count() -> None:
    # The V1 docs example has no +Inf bucket and no _sum.
    first = _vllm(fixture(VLLM_V1))
    grown = (
        fixture(VLLM_V1)
        .replace('le="0.1",', 'le="0.1",')
        .replace(
            '_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} 140.0',
            '_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} 150.0',
        )
    )
    _, baseline = extract_vllm(first, taken_at=0.0)
    reading, _ = extract_vllm(_vllm(grown), taken_at=1.0, previous=baseline)
    assert reading.ttft_p95_s == pytest.approx(0.1)  # all ten new ones above the last bound
    assert reading.reasons["ttft_mean_s"] == (
        "vllm:time_to_first_token_seconds_sum is missing from the payload"
    )


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.0, 0.0), (0.25, 0.5), (0.5, 1.0), (0.75, 1.5), (1.0, 2.0)],
)
def test_histogram_quantile_matches_promql_interpolation(q: float, expected: float) -> None:
    hist = HistogramDelta([(1.0, 2.0), (2.0, 4.0), (math.inf, 4.0)], 4.0, None)
    assert histogram_quantile(q, hist, "h") == pytest.approx(expected)


def test_histogram_quantile_in_the_inf_bucket_answers_the_last_bound() -> None:
    hist = HistogramDelta([(1.0, 1.0), (math.inf, 10.0)], 10.0, None)
    assert histogram_quantile(0.9, hist, "h") == 1.0
    with pytest.raises(Absent, match="no h observations"):
        histogram_quantile(0.9, HistogramDelta([(1.0, 0.0), (math.inf, 0.0)], 0.0, None), "h")


# --- Triton -------------------------------------------------------------------------------


def _triton(models: dict[str, tuple[int, int, int, int, int]]) -> Exposition:
    return _parse(EngineKind.TRITON, triton_payload(models))


def test_triton_fixture_first_scrape_has_levels_but_no_rates() -> None:
    reading, _ = extract_triton(_parse(EngineKind.TRITON, fixture(TRITON)), taken_at=0.0)
    assert reading.pending_requests == 0.0
    assert reading.request_rate is None
    assert reading.reasons["request_rate"] == "first scrape: a rate needs two scrapes"
    assert reading.queue_wait_ms is None


def test_triton_queue_wait_divides_by_requests_not_batch_items() -> None:
    # success, failure, items, queue_us, pending: 10 requests of batch 8 = 80 items.
    _, base = extract_triton(_triton({"a": (0, 0, 0, 0, 0), "b": (5, 0, 5, 0, 0)}), taken_at=0.0)
    reading, _ = extract_triton(
        _triton({"a": (10, 2, 80, 50_000, 7), "b": (15, 0, 15, 30_000, 1)}),
        taken_at=2.0,
        previous=base,
    )
    assert reading.pending_requests == 8.0
    assert reading.queue_wait_ms == pytest.approx(80_000 / 20 / 1000)  # 4 ms, not 0.84
    assert reading.request_rate == pytest.approx((20 + 2) / 2.0)
    assert reading.inference_rate == pytest.approx((80 + 10) / 2.0)


def test_triton_no_new_requests_gives_zero_rate_and_absent_wait() -> None:
    models = {"a": (3, 0, 3, 145, 0)}
    _, base = extract_triton(_triton(models), taken_at=0.0)
    reading, _ = extract_triton(_triton(models), taken_at=5.0, previous=base)
    assert reading.request_rate == 0.0
    assert reading.queue_wait_ms is None
    assert reading.reasons["queue_wait_ms"] == (
        "no request succeeded in the window: queue wait per request is undefined"
    )


def test_triton_reset_of_one_model_skips_it_and_of_all_is_absent() -> None:
    _, base = extract_triton(
        _triton({"a": (100, 0, 100, 1000, 0), "b": (50, 0, 50, 500, 0)}), taken_at=0.0
    )
    reading, base = extract_triton(
        _triton({"a": (4, 0, 4, 40, 0), "b": (60, 0, 60, 700, 0)}), taken_at=1.0, previous=base
    )
    assert reading.request_rate == pytest.approx(10.0)  # model a reloaded: only b counts
    assert reading.queue_wait_ms == pytest.approx(200 / 10 / 1000)
    reading, _ = extract_triton(
        _triton({"a": (1, 0, 1, 1, 0), "b": (2, 0, 2, 2, 0)}), taken_at=2.0, previous=base
    )
    assert reading.request_rate is None  # a server restart: never a negative or false 0 rate
    assert "re-baselined" in reading.reasons["request_rate"]


def test_triton_model_appearing_is_rebaselined() -> None:
    _, base = extract_triton(_triton({"a": (1, 0, 1, 10, 0)}), taken_at=0.0)
    reading, _ = extract_triton(
        _triton({"a": (3, 0, 3, 30, 0), "new": (500, 0, 500, 9000, 0)}), taken_at=1.0, previous=base
    )
    assert reading.request_rate == pytest.approx(2.0)


# --- TGI and SGLang -----------------------------------------------------------------------


def test_tgi_fixture() -> None:
    reading, _ = extract_tgi(_parse(EngineKind.TGI, fixture(TGI)), taken_at=0.0)
    assert (reading.queue_size, reading.batch_size) == (0.0, 0.0)
    assert reading.reasons == {}


def test_sglang_fixture_converts_token_usage_to_percent() -> None:
    reading, _ = extract_sglang(_parse(EngineKind.SGLANG, fixture(SGLANG)), taken_at=0.0)
    assert reading.queue_requests == 2826.0
    assert reading.running_requests == 162.0
    assert reading.token_usage_percent == pytest.approx(28.0)


def test_sglang_max_over_tensor_ranks_then_sum_over_data_parallel_ranks() -> None:
    text = (
        "\n".join(
            f'sglang:num_queue_reqs{{dp_rank="{dp}",model_name="m",tp_rank="{tp}"}} {q}'
            for dp, tp, q in [(0, 0, 5), (0, 1, 5), (1, 0, 2), (1, 1, 3)]
        )
        + '\nsglang:token_usage{dp_rank="0",model_name="m",tp_rank="0"} 0.5\n'
    )
    reading, _ = extract_sglang(_parse(EngineKind.SGLANG, text), taken_at=0.0)
    assert reading.queue_requests == 8.0
    assert reading.token_usage_percent == 50.0
    assert reading.running_requests is None
