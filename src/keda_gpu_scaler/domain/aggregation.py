"""Aggregation of per-device values: max, min, avg, sum and nearest-rank percentiles."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence


class Aggregation(enum.StrEnum):
    MAX = "max"
    MIN = "min"
    AVG = "avg"
    SUM = "sum"
    P95 = "p95"
    P99 = "p99"


def nearest_rank(values: Sequence[float], p: float) -> float:
    """The value at rank ceil(p·n) of the ascending values (index clamped to the range)."""
    ordered = sorted(values)
    index = math.ceil(p * len(ordered)) - 1
    return ordered[min(max(index, 0), len(ordered) - 1)]


def aggregate(how: Aggregation, values: Sequence[float]) -> float:
    """Combine at least one value."""
    if not values:
        raise ValueError("aggregate() needs at least one value")
    match how:
        case Aggregation.MAX:
            return max(values)
        case Aggregation.MIN:
            return min(values)
        case Aggregation.AVG:
            return math.fsum(values) / len(values)
        case Aggregation.SUM:
            return math.fsum(values)
        case Aggregation.P95:
            return nearest_rank(values, 0.95)
        case Aggregation.P99:
            return nearest_rank(values, 0.99)
