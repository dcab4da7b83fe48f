"""The partial-view rule, for every aggregation."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.domain.aggregation import Aggregation
from keda_gpu_scaler.domain.coverage import Coverage, refusal
from keda_gpu_scaler.domain.trigger_values import DEFAULT_MIN_COVERAGE


def _coverage(selected: int, missing: int) -> Coverage:
    return Coverage(selected, tuple(f"node-{i} GPU 0: stale" for i in range(missing)))


@pytest.mark.parametrize("how", list(Aggregation))
def test_a_full_view_is_always_answered(how: Aggregation) -> None:
    assert refusal(how, _coverage(8, 0), DEFAULT_MIN_COVERAGE) is None


@pytest.mark.parametrize("how", [a for a in Aggregation if a is not Aggregation.SUM])
def test_a_partial_view_is_answered_down_to_min_coverage(how: Aggregation) -> None:
    assert refusal(how, _coverage(8, 2), 0.75) is None  # 6 of 8 = 0.75
    reason = refusal(how, _coverage(8, 3), 0.75)  # 5 of 8
    assert reason is not None
    assert "coverage 0.62 is below minCoverage 0.75" in reason
    assert "5 of 8 devices fresh; missing: node-0 GPU 0: stale" in reason


def test_sum_is_never_answered_from_a_partial_view() -> None:
    reason = refusal(Aggregation.SUM, _coverage(100, 1), 0.01)
    assert reason is not None
    assert reason.startswith("sum is never answered from a partial view")


def test_nothing_fresh_is_refused_whatever_the_threshold() -> None:
    reason = refusal(Aggregation.MAX, _coverage(3, 3), 0.0001)
    assert reason is not None
    assert reason.startswith("no selected device is fresh")


def test_long_lists_of_missing_devices_are_cut() -> None:
    text = _coverage(40, 20).describe()
    assert text.endswith("and 12 more")
    assert text.count("GPU 0") == 8
