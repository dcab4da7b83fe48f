"""SnapshotHub: holds the newest snapshot and wakes whoever waits for a newer one."""

from __future__ import annotations

import anyio

from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT, Snapshot


class SnapshotHub:
    def __init__(self) -> None:
        self._snapshot = EMPTY_SNAPSHOT
        self._changed = anyio.Event()

    @property
    def current(self) -> Snapshot:
        return self._snapshot

    def publish(self, snapshot: Snapshot) -> None:
        if snapshot.version <= self._snapshot.version:
            raise ValueError("snapshot versions must increase")
        self._snapshot = snapshot
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def wait_newer(self, version: int) -> Snapshot:
        """The first snapshot whose version is above ``version`` (at once if it exists)."""
        while self._snapshot.version <= version:
            await self._changed.wait()
        return self._snapshot
