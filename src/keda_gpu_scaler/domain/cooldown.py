"""Scale-down suppression (``cooldownSeconds``), with the Go project's rules.

- the first value of a key is returned and stored;
- a value at or above the stored one is returned and stored; the window is untouched;
- a lower value within ``cooldown_s`` of the last let-through decrease returns the stored
  (higher) value;
- otherwise the lower value is let through, stored, and the window starts now.

Unlike the Go project, the key holds the ScaledObject's namespace and name too, so two
objects (or two triggers of one object) never share a baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from keda_gpu_scaler.domain.trigger import TriggerSpec


class CooldownKey(msgspec.Struct, frozen=True):
    namespace: str
    name: str
    metric_name: str
    metric_type: str
    aggregation: str
    gpu_index: int
    vllm_endpoint: str | None
    triton_endpoint: str | None
    mig_instance: str | None = None
    engine: str | None = None
    """The engine sampler read (kind, discovery, URL), for the engine metric types."""


def cooldown_key(namespace: str, name: str, spec: TriggerSpec) -> CooldownKey:
    return CooldownKey(
        namespace,
        name,
        spec.metric_name,
        spec.metric_type.value,
        spec.aggregation.value,
        spec.gpu_index,
        spec.vllm_endpoint,
        spec.triton_endpoint,
        None if spec.mig_instance is None else str(spec.mig_instance),
        None if (target := spec.engine_target) is None else target.source,
    )


@dataclass(frozen=True, slots=True)
class CooldownEntry:
    stored: float
    last_decrease_at: float | None
    touched_at: float


@dataclass(frozen=True, slots=True)
class CooldownOutcome:
    value: float
    held: bool
    """True when a lower raw value was held back."""
    entry: CooldownEntry
    remaining_s: float = 0.0


def apply_cooldown(
    entry: CooldownEntry | None, raw: float, *, cooldown_s: float, now: float
) -> CooldownOutcome:
    """The value to serve for ``raw`` and the entry to store next (a pure transition)."""
    if entry is None or cooldown_s <= 0 or raw >= entry.stored:
        last = None if entry is None else entry.last_decrease_at
        return CooldownOutcome(raw, False, CooldownEntry(raw, last, now))
    if entry.last_decrease_at is not None:
        elapsed = now - entry.last_decrease_at
        if elapsed < cooldown_s:
            kept = CooldownEntry(entry.stored, entry.last_decrease_at, now)
            return CooldownOutcome(entry.stored, True, kept, cooldown_s - elapsed)
    return CooldownOutcome(raw, False, CooldownEntry(raw, now, now))


class CooldownBook:
    """Cooldown entries per trigger; entries untouched for ``forget_after_s`` are dropped."""

    def __init__(self, *, forget_after_s: float = 3600.0) -> None:
        self._entries: dict[CooldownKey, CooldownEntry] = {}
        self._forget_after_s = forget_after_s
        self._last_prune = 0.0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: CooldownKey) -> CooldownEntry | None:
        return self._entries.get(key)

    def put(self, key: CooldownKey, entry: CooldownEntry) -> None:
        self._entries[key] = entry
        if entry.touched_at - self._last_prune > self._forget_after_s:
            self._prune(entry.touched_at)

    def _prune(self, now: float) -> None:
        self._last_prune = now
        horizon = now - self._forget_after_s
        self._entries = {k: e for k, e in self._entries.items() if e.touched_at >= horizon}
