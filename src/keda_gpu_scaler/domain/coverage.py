"""Partial views: when an aggregate may be answered from the devices that are fresh.

On a cluster scaler some selected devices can be missing at any moment (an agent down, a
node partitioned, an attribution gone stale). The rule, decided once for every aggregate:

- every selected device fresh: answer;
- some missing: ``avg``, ``max``, ``min``, ``p95`` and ``p99`` are answered from the fresh
  ones while at least ``minCoverage`` of the selected devices are fresh (a shared device
  counts once); ``sum`` never is, since a partial sum can only under-report and scale a
  busy workload in;
- otherwise: no answer (UNAVAILABLE), naming what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

from keda_gpu_scaler.domain.aggregation import Aggregation

MISSING_NAMED = 8
"""Missing devices named in a reason at most; the rest are counted."""


@dataclass(frozen=True, slots=True)
class Coverage:
    selected: int
    """Devices the trigger selects, each once."""
    missing: tuple[str, ...]
    """Who is missing and why, in words (``node-b GPU 3: stale 12 s``)."""

    @property
    def fresh(self) -> int:
        return self.selected - len(self.missing)

    @property
    def share(self) -> float:
        return 1.0 if self.selected == 0 else self.fresh / self.selected

    @property
    def partial(self) -> bool:
        return bool(self.missing)

    def describe(self) -> str:
        named = ", ".join(self.missing[:MISSING_NAMED])
        more = len(self.missing) - MISSING_NAMED
        if more > 0:
            named += f" and {more} more"
        return f"{self.fresh} of {self.selected} devices fresh; missing: {named}"


def refusal(how: Aggregation, coverage: Coverage, min_coverage: float) -> str | None:
    """Why ``how`` may not be answered from this coverage, or None when it may."""
    if not coverage.partial:
        return None
    if coverage.fresh == 0:
        return f"no selected device is fresh ({coverage.describe()})"
    if how is Aggregation.SUM:
        return (
            "sum is never answered from a partial view, it could only under-report "
            f"({coverage.describe()})"
        )
    if coverage.share < min_coverage:
        return (
            f"coverage {coverage.share:.2f} is below minCoverage {min_coverage:g} "
            f"({coverage.describe()})"
        )
    return None
