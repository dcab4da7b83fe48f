"""vLLM as 0.34 writes it: data-parallel engines, buckets users choose, waiting by reason,
admission rejections and sleeping engines."""

from __future__ import annotations

import math

import pytest

from keda_gpu_scaler.domain.engines import EngineKind
from keda_gpu_scaler.sources.engines.extract import SELECTIONS, extract_vllm
from keda_gpu_scaler.sources.engines.fields import FIRST_SCRAPE
from keda_gpu_scaler.sources.engines.promtext import (
    Exposition,
    merge_expositions,
    parse_exposition,
)
from keda_gpu_scaler.sources.engines.window import (
    Absent,
    histogram_delta,
    take_baseline,
    window_between,
)
from tests.engine_payloads import (
    VLLM_2026,
    VLLM_2026_ASLEEP,
    VLLM_V0,
    fixture,
    vllm_histogram,
)

TTFT = "vllm:time_to_first_token_seconds"


def _vllm(text: str) -> Exposition:
    return parse_exposition(text, SELECTIONS[EngineKind.VLLM])


# --- histogram buckets are whatever the engine was started with ----------------------------


def _ttft(engines: dict[str, list[tuple[str, float]]]) -> str:
    """Each engine's buckets; its _sum is a quarter of a second per observation."""
    lines: list[str] = []
    for engine, buckets in engines.items():
        labels = f'engine="{engine}",model_name="m"'
        total = buckets[-1][1] / 4
        lines += vllm_histogram(TTFT, buckets, total=total, labels=labels)[1:]
    return f"# TYPE {TTFT} histogram\n" + "\n".join(lines)


def _zeros(engines: dict[str, list[tuple[str, float]]]) -> dict[str, list[tuple[str, float]]]:
    return {e: [(le, 0.0) for le, _ in b] for e, b in engines.items()}


def test_engines_with_different_custom_buckets_merge_on_the_bounds_they_share() -> None:
    # --custom-histogram-buckets differs between two engines (pods restarted with other
    # bounds): only the shared bounds have a known cumulative count for both.
    engines = {
        "0": [("0.1", 5.0), ("1.0", 9.0), ("+Inf", 10.0)],
        "1": [("0.05", 0.0), ("0.1", 0.0), ("0.5", 10.0), ("1.0", 10.0), ("+Inf", 10.0)],
    }
    names = ("vllm:time_to_first_token_seconds_bucket", f"{TTFT}_count", f"{TTFT}_sum")
    before = take_baseline(_vllm(_ttft(_zeros(engines))), names, 0.0)
    after = take_baseline(_vllm(_ttft(engines)), names, 5.0)
    window = window_between(before, after)
    assert window is not None
    assert histogram_delta(window, TTFT).buckets == [(0.1, 5.0), (1.0, 19.0), (math.inf, 20.0)]


def test_no_shared_finite_bound_is_no_quantile_rather_than_zero() -> None:
    engines = {"0": [("1.0", 3.0), ("+Inf", 4.0)], "1": [("2.0", 1.0), ("+Inf", 4.0)]}
    _, base = extract_vllm(_vllm(_ttft(_zeros(engines))), taken_at=0.0)
    reading, _ = extract_vllm(_vllm(_ttft(engines)), taken_at=5.0, previous=base)
    assert reading.ttft_p95_s is None
    assert "share no finite bucket bound" in reading.reasons["ttft_p95_s"]
    assert reading.ttft_mean_s == pytest.approx(0.25)  # the mean needs no bounds


def test_buckets_changed_by_a_restart_rebaseline_then_read() -> None:
    old = {"0": [("0.5", 1.0), ("+Inf", 2.0)]}
    new = {"0": [("0.25", 1.0), ("2.5", 3.0), ("+Inf", 4.0)]}
    more = {"0": [("0.25", 1.0), ("2.5", 7.0), ("+Inf", 8.0)]}
    _, base = extract_vllm(_vllm(_ttft(old)), taken_at=0.0)
    reading, base = extract_vllm(_vllm(_ttft(new)), taken_at=5.0, previous=base)
    assert reading.ttft_p95_s is None
    assert "re-baselined" in reading.reasons["ttft_p95_s"]
    reading, _ = extract_vllm(_vllm(_ttft(more)), taken_at=10.0, previous=base)
    # 4 new observations, all in (0.25, 2.5]: p95 interpolates to 95 % of that bucket.
    assert reading.ttft_p95_s == pytest.approx(0.25 + 2.25 * 0.95)


def test_absent_means_absent_when_the_histogram_is_missing() -> None:
    before = take_baseline(_vllm(""), (f"{TTFT}_bucket",), 0.0)
    window = window_between(before, take_baseline(_vllm(""), (f"{TTFT}_bucket",), 1.0))
    assert window is not None
    with pytest.raises(Absent, match="missing") as caught:
        histogram_delta(window, TTFT)
    assert caught.value.missing


# --- the 0.34 payload -----------------------------------------------------------------------


def _rejected(text: str, count: int) -> str:
    old = 'reason="max_num_queued_reqs"} 17.0'
    assert old in text
    return text.replace(old, f'reason="max_num_queued_reqs"}} {count}.0')


def test_the_034_payload_reads_every_signal_of_both_engines() -> None:
    reading, _ = extract_vllm(_vllm(fixture(VLLM_2026)), taken_at=0.0)
    assert reading.queue_depth == 8.0
    assert (reading.queue_capacity, reading.queue_deferred) == (7.0, 1.0)
    assert reading.running == 89.0
    assert reading.kv_cache_usage_percent == pytest.approx(91.2)  # the hotter engine
    assert reading.engines_asleep == 0.0
    assert reading.admission_rejections_per_s is None
    assert reading.reasons["admission_rejections_per_s"] == FIRST_SCRAPE
    assert "gpu_cache_usage_perc" not in fixture(VLLM_2026)


def test_admission_rejections_are_a_rate_over_every_reason() -> None:
    text = fixture(VLLM_2026)
    _, base = extract_vllm(_vllm(text), taken_at=0.0)
    reading, base = extract_vllm(_vllm(_rejected(text, 42)), taken_at=5.0, previous=base)
    assert reading.admission_rejections_per_s == pytest.approx(25 / 5)
    reading, _ = extract_vllm(_vllm(_rejected(text, 42)), taken_at=10.0, previous=base)
    assert reading.admission_rejections_per_s == 0.0  # none refused since: a real 0


def test_a_release_without_the_new_series_says_so() -> None:
    reading, _ = extract_vllm(_vllm(fixture(VLLM_V0)), taken_at=0.0)
    assert reading.queue_depth == 0.0
    assert reading.queue_capacity is None
    assert reading.reasons["queue_capacity"] == (
        "vllm:num_requests_waiting_by_reason is missing from the payload"
    )
    assert reading.engines_asleep is None


def test_a_sleeping_engine_does_not_read_as_idle() -> None:
    reading, _ = extract_vllm(_vllm(fixture(VLLM_2026_ASLEEP)), taken_at=0.0)
    assert reading.engines_asleep == 2.0
    for field in ("queue_depth", "queue_capacity", "running", "kv_cache_usage_percent"):
        assert reading.value(field) is None, field
        reason = reading.reasons[field]
        assert reason.startswith("vLLM is asleep: engine 0 (level 1: weights offloaded), ")
        assert reason.endswith("wake it (POST /wake_up) or scale on another trigger")
    assert reading.value("preemptions_per_s") is None


def test_one_sleeping_pod_behind_a_service_makes_the_deployment_unknown() -> None:
    awake = _vllm(fixture(VLLM_2026)).with_label("__address__", "10.0.0.1:8000")
    asleep = _vllm(fixture(VLLM_2026_ASLEEP)).with_label("__address__", "10.0.0.2:8000")
    reading, _ = extract_vllm(merge_expositions([awake, asleep]), taken_at=0.0)
    assert reading.queue_depth is None
    assert (
        "engine 0 of 10.0.0.2:8000 (level 1: weights offloaded)" in reading.reasons["queue_depth"]
    )
    assert reading.engines_asleep == 2.0


def test_sleep_level_2_and_a_released_kv_cache_are_named() -> None:
    text = fixture(VLLM_2026_ASLEEP)
    level2 = text.replace(
        'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="discard_all"} 0.0',
        'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct",sleep_state="discard_all"} 1.0',
    ).replace(
        'engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct",'
        'sleep_state="weights_offloaded"} 1.0',
        'engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct",'
        'sleep_state="weights_offloaded"} 0.0',
    )
    reading, _ = extract_vllm(_vllm(level2), taken_at=0.0)
    reason = reading.reasons["queue_depth"]
    assert "engine 0 (level 2: weights and KV cache discarded)" in reason
    assert "engine 1 (KV cache released)" in reason
