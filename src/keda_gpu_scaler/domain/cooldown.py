"""Scale-down suppression (``cooldownSeconds``), with the Go project's rules.

- the first value of a key is returned and stored;
- a value at or above the stored one is returned and stored; the window is untouched;
- a lower value within ``cooldown_s`` of the last let-through decrease returns the stored
  (higher) value;
- otherwise the lower value is let through, stored, and the window starts now.

Unlike the Go project, entries are kept per trigger of each ScaledObject (the caller's key:
namespace, name and the whole trigger), so two objects, or two triggers of one object, never
share a baseline.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


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


class CooldownBook(Generic[K]):
    """Cooldown entries by key; entries untouched for ``forget_after_s`` are dropped."""

    def __init__(self, *, forget_after_s: float = 3600.0) -> None:
        self._entries: dict[K, CooldownEntry] = {}
        self._forget_after_s = forget_after_s
        self._last_prune = 0.0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> CooldownEntry | None:
        return self._entries.get(key)

    def put(self, key: K, entry: CooldownEntry) -> None:
        self._entries[key] = entry
        if entry.touched_at - self._last_prune > self._forget_after_s:
            self._prune(entry.touched_at)

    def _prune(self, now: float) -> None:
        self._last_prune = now
        horizon = now - self._forget_after_s
        self._entries = {k: e for k, e in self._entries.items() if e.touched_at >= horizon}
