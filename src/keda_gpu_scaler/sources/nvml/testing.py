"""Test helpers for code that runs an NvmlSampler: run it in-process and collect its samples.

Like ``trio.testing``: shipped so that tests of the app can drive the sampler with
:class:`~keda_gpu_scaler.sources.nvml.fake_backend.FakeNvml` in virtual time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from types import MappingProxyType
from typing import TypeVar

import anyio
import msgspec

from keda_gpu_scaler.domain.samples import (
    DeviceKey,
    GpuReading,
    Sample,
    SourceFault,
    unbatch,
)
from keda_gpu_scaler.domain.snapshot import DeviceState, Snapshot
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler

_T = TypeVar("_T")


async def inline(func: Callable[[], _T]) -> _T:
    """``call_in_thread`` for tests: the fake runs in-process, so the fake clock rules."""
    return func()


@asynccontextmanager
async def running(sampler: NvmlSampler) -> AsyncIterator[list[Sample]]:
    """Start ``sampler``; the yielded list fills with everything it sends."""
    send, receive = anyio.create_memory_object_stream[Sample](10_000)
    received: list[Sample] = []

    async def collect() -> None:
        async with receive:
            async for sample in receive:
                received.append(sample)

    async with anyio.create_task_group() as tg:
        tg.start_soon(collect)
        await tg.start(sampler.run, send)
        yield received
        tg.cancel_scope.cancel()


def flatten(samples: Iterable[Sample]) -> list[GpuReading | SourceFault]:
    """The readings and faults inside the batches a sampler sent."""
    return [s for s in unbatch(samples) if isinstance(s, GpuReading | SourceFault)]


def readings(samples: Iterable[Sample], key: str | None = None) -> list[GpuReading]:
    return [s for s in flatten(samples) if isinstance(s, GpuReading) and key in (None, s.key)]


def faults(samples: Iterable[Sample]) -> list[SourceFault]:
    return [s for s in flatten(samples) if isinstance(s, SourceFault)]


def snapshot_of(samples: Iterable[Sample], now: float) -> Snapshot:
    """What an aggregator would hold after ``samples`` (last word per device)."""
    devices: dict[DeviceKey, DeviceState] = {}
    for s in flatten(samples):
        if isinstance(s, GpuReading):
            devices[s.key] = DeviceState(key=s.key, index=s.index, reading=s)
        elif s.key is not None and s.lost:
            old = devices.get(s.key) or DeviceState(key=s.key, index=s.index)
            devices[s.key] = msgspec.structs.replace(old, lost_reason=s.reason, lost_since=s.at)
    return Snapshot(version=1, published_at=now, devices=MappingProxyType(devices))
