from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keda_gpu_scaler.domain.aggregation import Aggregation, aggregate, nearest_rank


def test_each_aggregation() -> None:
    values = [3.0, 1.0, 2.0, 10.0]
    assert aggregate(Aggregation.MAX, values) == 10
    assert aggregate(Aggregation.MIN, values) == 1
    assert aggregate(Aggregation.AVG, values) == 4
    assert aggregate(Aggregation.SUM, values) == 16


def test_nearest_rank_matches_the_go_project() -> None:
    values = [float(v) for v in range(1, 21)]
    assert aggregate(Aggregation.P95, values) == 19
    assert aggregate(Aggregation.P99, values) == 20
    assert aggregate(Aggregation.P95, [5.0]) == 5
    assert aggregate(Aggregation.P95, [float(v) for v in range(19)]) == 18  # max for n <= 19
    assert aggregate(Aggregation.P99, [float(v) for v in range(99)]) == 98  # max for n <= 99


def test_no_values_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        aggregate(Aggregation.MAX, [])


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=200), st.sampled_from([0.95, 0.99]))
def test_nearest_rank_is_an_element_between_min_and_max(values: list[float], p: float) -> None:
    result = nearest_rank(values, p)
    assert result in values
    assert min(values) <= result <= max(values)
    assert sum(v <= result for v in values) >= math.ceil(p * len(values))
