"""The objects a list and watch have shown, and when to publish them.

Pure state, no I/O (the list/watch engine awaits; this decides):

- :class:`Store` holds the objects of one kind by key (namespace and name) and the last
  resourceVersion the API gave (of a list, or of any watch event, bookmarks included),
  which is where a watch resumes. Each change says whether anything this product reads
  changed: objects are the decoded values (only the fields read), compared whole, so an
  update of a field nobody reads is not a change.
- :class:`Pacing` decides whether an answer of the API is worth a new reading. A change
  always is. An answer that changed nothing is published when the last reading is
  ``refresh_s`` old or more, or when a fault was published since: the reading's
  ``taken_at`` is then at most ``refresh_s`` older than the API's last answer, which only
  ever makes a reading go stale earlier, never later, and a burst of bookmarks or
  uninteresting updates costs one reading per ``refresh_s``, not one each.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from keda_gpu_scaler.sources.kube.wire import Bookmark, Delete, Upsert

T = TypeVar("T")
Key = tuple[str, ...]


class Store(Generic[T]):
    def __init__(self, key: Callable[[T], Key]) -> None:
        self._key = key
        self._items: dict[Key, T] = {}
        self._sorted: tuple[T, ...] | None = None
        """``items()`` until the next change: a watch publishes the whole set per event."""
        self.resource_version: str | None = None
        """Where the next watch starts; None until a list succeeded."""

    def __len__(self) -> int:
        return len(self._items)

    def replace(self, items: Iterable[T], resource_version: str) -> bool:
        """A full list; True when it differs from what the store held."""
        listed = {self._key(item): item for item in items}
        changed = listed != self._items
        self._items = listed
        self.resource_version = resource_version
        if changed:
            self._sorted = None
        return changed

    def apply(self, event: Upsert[T] | Delete[T] | Bookmark) -> bool:
        """One watch event; True when an object was added, removed or changed."""
        if event.resource_version:
            self.resource_version = event.resource_version
        if isinstance(event, Bookmark):
            return False
        key = self._key(event.item)
        if isinstance(event, Delete):
            changed = self._items.pop(key, None) is not None
        else:
            changed = self._items.get(key) != event.item
            self._items[key] = event.item
        if changed:
            self._sorted = None
        return changed

    def forget_position(self) -> None:
        """The resourceVersion expired (410 Gone): the next step is a list."""
        self.resource_version = None

    def items(self) -> tuple[T, ...]:
        """The objects, sorted by key (sorted once per change)."""
        if self._sorted is None:
            self._sorted = tuple(self._items[key] for key in sorted(self._items))
        return self._sorted


class Pacing:
    def __init__(self, refresh_s: float) -> None:
        if refresh_s < 0:
            raise ValueError(f"refresh_s must be 0 or more, not {refresh_s}")
        self._refresh_s = refresh_s
        self._published_at = -math.inf
        self._faulted = False

    def is_due(self, *, changed: bool, now: float) -> bool:
        """Whether an answer at ``now`` (``changed`` or not) should publish a reading."""
        return changed or self._faulted or now - self._published_at >= self._refresh_s

    def published(self, now: float) -> None:
        self._published_at = now
        self._faulted = False

    def faulted(self) -> None:
        """A fault was published: the next answer publishes, so readers see it clear."""
        self._faulted = True
