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

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from keda_gpu_scaler.domain.aggregation import Aggregation
from keda_gpu_scaler.domain.errors import InvalidTrigger
from keda_gpu_scaler.domain.names import is_node_name

if TYPE_CHECKING:
    from keda_gpu_scaler.domain.trigger import TriggerSpec

DEFAULT_MIN_COVERAGE = 0.75
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


_NUMBER = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)")


def parse_min_coverage(raw: str) -> float:
    """``minCoverage``: a number in (0, 1]."""
    value = float(raw) if _NUMBER.fullmatch(raw) else math.nan
    if not 0 < value <= 1:
        raise InvalidTrigger("minCoverage", raw, "must be a number above 0 and at most 1")
    return value


def parse_node_name(raw: str) -> str:
    """``nodeName``: a Kubernetes node name (RFC 1123 subdomain)."""
    if not is_node_name(raw):
        raise InvalidTrigger("nodeName", raw, "must be a node name (RFC 1123 subdomain)")
    return raw


def check_cluster_trigger(spec: TriggerSpec) -> None:
    """On a cluster scaler, ``gpuIndex`` and ``migInstance`` name a device of one node:
    without ``nodeName`` they are refused (every node has a GPU 0)."""
    if spec.node_name is not None:
        return
    if spec.gpu_index >= 0:
        raise InvalidTrigger("gpuIndex", str(spec.gpu_index), "needs nodeName on a cluster scaler")
    if spec.mig_instance is not None:
        raise InvalidTrigger(
            "migInstance", str(spec.mig_instance), "needs nodeName on a cluster scaler"
        )
