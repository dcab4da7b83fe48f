"""vLLM as 0.34 writes it: data-parallel engines, buckets users choose, waiting by reason,
admission rejections and sleeping engines."""

from __future__ import annotations

import math

import pytest

from keda_gpu_scaler.domain.engines import EngineKind
from keda_gpu_scaler.sources.engines.extract import SELECTIONS, extract_vllm
from keda_gpu_scaler.sources.engines.promtext import Exposition, parse_exposition
from keda_gpu_scaler.sources.engines.window import (
    Absent,
    histogram_delta,
    take_baseline,
    window_between,
)
from tests.engine_payloads import vllm_histogram

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
    with pytest.raises(Absent, match="missing from the payload"):
        histogram_delta(window, TTFT)
