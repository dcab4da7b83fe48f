"""Exponential backoff as a value: the supervisor's restarts and the NVML sampler's retries
of a lost GPU follow the same rule."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float = 0.5
    factor: float = 2.0
    maximum_s: float = 30.0

    def delay(self, failures: int) -> float:
        """Delay before attempt number ``failures`` + 1 (``failures`` is 1-based)."""
        return min(self.maximum_s, self.initial_s * self.factor ** (failures - 1))
