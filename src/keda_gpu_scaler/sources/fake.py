"""FakeGpuSource: a scriptable GPU source for tests and demos.

Tests set readings, lose and restore devices, or pause the whole source, and the fake
publishes the current state once per period in anyio time. ``ScriptedAttribution`` and
``ScriptedPods`` stand for the kubelet PodResources API and the pod watch (who holds which
GPU, and the pods' labels), so that ``demo --cluster`` needs no Kubernetes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.errors import SourceFailure
from keda_gpu_scaler.domain.samples import (
    POD_RESOURCES_SOURCE,
    PODS_SOURCE,
    Batch,
    DeviceHolder,
    DeviceKey,
    GpuReading,
    PodInfo,
    PodResourcesReading,
    PodsReading,
    Sample,
    SourceFault,
)
from keda_gpu_scaler.sources.cadence import every


@dataclass
class _FakeGpu:
    index: int
    uuid: str
    fields: dict[str, Any] = field(default_factory=dict)
    lost_reason: str | None = None


class FakeGpuSource:
    """``FakeGpuSource(n)`` fakes ``n`` GPUs with every reading absent until set."""

    def __init__(self, count: int = 1, *, period_s: float = 1.0, name: str = "fake") -> None:
        self.name = name
        self.period_s = period_s
        self._gpus = [_FakeGpu(i, f"GPU-fake-{i:04d}") for i in range(count)]
        self._paused = False
        self._crash_with: str | None = None
        self.cycles = 0

    def set(self, index: int, **readings: Any) -> None:
        """Set reading fields of GPU ``index`` (names of :class:`GpuReading` fields)."""
        unknown = set(readings) - set(GpuReading.__struct_fields__)
        if unknown:
            raise TypeError(f"not GpuReading fields: {sorted(unknown)}")
        self._gpus[index].fields.update(readings)

    def lose(self, index: int, reason: str = "GPU is lost") -> None:
        self._gpus[index].lost_reason = reason

    def restore(self, index: int) -> None:
        self._gpus[index].lost_reason = None

    def pause(self) -> None:
        """Stop publishing (a hung source): readings go stale."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    def crash_next_cycle(self, reason: str) -> None:
        """Make the next cycle raise :class:`SourceFailure`, as a broken driver would."""
        self._crash_with = reason

    def readings(self, now: float) -> list[GpuReading | SourceFault]:
        samples: list[GpuReading | SourceFault] = []
        for gpu in self._gpus:
            key = DeviceKey(gpu.uuid)
            if gpu.lost_reason is not None:
                samples.append(
                    SourceFault(
                        source=self.name,
                        key=key,
                        at=now,
                        reason=gpu.lost_reason,
                        index=gpu.index,
                        lost=True,
                    )
                )
                continue
            base = GpuReading(
                source=self.name,
                key=key,
                index=gpu.index,
                uuid=gpu.uuid,
                name="Fake GPU",
                taken_at=now,
                period_s=self.period_s,
            )
            samples.append(msgspec.structs.replace(base, **gpu.fields))
        return samples

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            task_status.started()
            async for now in every(self.period_s):
                if self._crash_with is not None:
                    reason, self._crash_with = self._crash_with, None
                    raise SourceFailure(reason)
                if not self._paused:
                    readings = self.readings(now)
                    await send.send(Batch(source=self.name, samples=tuple(readings)))
                    self.cycles += 1


def _check_period(period_s: float) -> float:
    if not period_s > 0:
        raise ValueError(f"period_s must be a positive number of seconds, not {period_s!r}")
    return period_s


class ScriptedAttribution:
    """A kubelet PodResources sampler's answers: ``holders`` (who holds which device) every
    ``period_s``, as :class:`PodResourcesReading`."""

    def __init__(self, holders: Sequence[DeviceHolder] = (), *, period_s: float = 1.0) -> None:
        self.name = POD_RESOURCES_SOURCE
        self.period_s = _check_period(period_s)
        self.holders = tuple(holders)

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            task_status.started()
            async for now in every(self.period_s):
                reading = PodResourcesReading(
                    source=self.name, taken_at=now, period_s=self.period_s, holders=self.holders
                )
                await send.send(reading)


class ScriptedPods:
    """A pod watch's answers: ``pods`` (labels, phase, node) every ``period_s``, as
    :class:`PodsReading` of ``node`` (empty: the pods of every node, as on a cluster
    scaler)."""

    def __init__(
        self, pods: Sequence[PodInfo] = (), *, period_s: float = 1.0, node: str = ""
    ) -> None:
        self.name = PODS_SOURCE
        self.period_s = _check_period(period_s)
        self.node = node
        self.pods = tuple(pods)

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            task_status.started()
            async for now in every(self.period_s):
                reading = PodsReading(
                    source=self.name,
                    taken_at=now,
                    period_s=self.period_s,
                    node=self.node,
                    pods=self.pods,
                )
                await send.send(reading)
