"""The pods of this node as the list and watch have shown them, and when to publish them.

Pure state, no I/O (the watcher awaits; this decides):

- :class:`PodSet` holds the pods by namespace and name and the last resourceVersion the
  API gave (of a list, or of any watch event, bookmarks included), which is where a watch
  resumes. Each change says whether anything this product reads (the set, a pod's uid,
  labels or phase) changed; a pod whose status conditions moved is not a change.
- :class:`Pacing` decides whether an answer of the API is worth a new reading. A change
  always is. An answer that changed nothing is published when the last reading is
  ``refresh_s`` old or more, or when a fault was published since: the reading's
  ``taken_at`` is then at most ``refresh_s`` older than the API's last answer, which only
  ever makes the labels go stale earlier, never later, and a burst of bookmarks or
  uninteresting pod updates costs one reading per ``refresh_s``, not one each.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from keda_gpu_scaler.domain.samples import PodInfo
from keda_gpu_scaler.sources.kube.wire import Bookmark, Delete, Upsert

PodKey = tuple[str, str]


class PodSet:
    def __init__(self) -> None:
        self._pods: dict[PodKey, PodInfo] = {}
        self.resource_version: str | None = None
        """Where the next watch starts; None until a list succeeded."""

    def __len__(self) -> int:
        return len(self._pods)

    def replace(self, pods: Iterable[PodInfo], resource_version: str) -> bool:
        """A full list; True when it differs from what the set held."""
        listed = {(pod.namespace, pod.name): pod for pod in pods}
        changed = listed != self._pods
        self._pods = listed
        self.resource_version = resource_version
        return changed

    def apply(self, event: Upsert | Delete | Bookmark) -> bool:
        """One watch event; True when the set, or a pod's uid, labels or phase changed."""
        if event.resource_version:
            self.resource_version = event.resource_version
        if isinstance(event, Bookmark):
            return False
        key = (event.pod.namespace, event.pod.name)
        if isinstance(event, Delete):
            return self._pods.pop(key, None) is not None
        changed = self._pods.get(key) != event.pod
        self._pods[key] = event.pod
        return changed

    def forget_position(self) -> None:
        """The resourceVersion expired (410 Gone): the next step is a list."""
        self.resource_version = None

    def pods(self) -> tuple[PodInfo, ...]:
        """The pods, sorted by namespace then name."""
        return tuple(self._pods[key] for key in sorted(self._pods))


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
