"""Test kit: the real pipeline, small enough to drive in virtual time.

Like ``trio.testing`` and ``grpclib.testing``, it is shipped with the package and may import
every layer. Everything here is built on the real parts (``fold``, the aggregator, the
supervisor, the servicer), so a test never asserts against an imitation of them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import TypeVar

import anyio

from keda_gpu_scaler.app.compose import RunningPipeline, open_pipeline
from keda_gpu_scaler.domain.samples import GpuReading, Sample, SourceFault, unbatch
from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT, Snapshot
from keda_gpu_scaler.pipeline.state import fold
from keda_gpu_scaler.pipeline.supervisor import Sampler

__all__ = [
    "collect_samples",
    "faults",
    "flatten",
    "inline",
    "open_test_pipeline",
    "readings",
    "snapshot_after",
]

_T = TypeVar("_T")


@asynccontextmanager
async def open_test_pipeline(
    source: Sampler, *, wait_first_snapshot: bool = False
) -> AsyncIterator[RunningPipeline]:
    """``source`` under supervision feeding the real aggregator, as the scaler runs it."""
    async with open_pipeline(source) as pipeline:
        if wait_first_snapshot:
            await pipeline.hub.wait_newer(0)
        yield pipeline


def snapshot_after(samples: Iterable[Sample], now: float) -> Snapshot:
    """What the aggregator holds after folding ``samples`` from an empty start."""
    return fold(EMPTY_SNAPSHOT, samples, now)


async def inline(func: Callable[[], _T]) -> _T:
    """``call_in_thread`` for tests: a fake runs in-process, so the fake clock rules."""
    return func()


@asynccontextmanager
async def collect_samples(source: Sampler) -> AsyncIterator[list[Sample]]:
    """Start ``source`` alone; the yielded list fills with everything it sends."""
    send, receive = anyio.create_memory_object_stream[Sample](10_000)
    received: list[Sample] = []

    async def collect() -> None:
        async with receive:
            async for sample in receive:
                received.append(sample)

    async with anyio.create_task_group() as tg:
        tg.start_soon(collect)
        await tg.start(source.run, send)
        yield received
        tg.cancel_scope.cancel()


def flatten(samples: Iterable[Sample]) -> list[GpuReading | SourceFault]:
    """The readings and faults inside the batches a sampler sent."""
    return [s for s in unbatch(samples) if isinstance(s, GpuReading | SourceFault)]


def readings(samples: Iterable[Sample], key: str | None = None) -> list[GpuReading]:
    return [s for s in flatten(samples) if isinstance(s, GpuReading) and key in (None, s.key)]


def faults(samples: Iterable[Sample]) -> list[SourceFault]:
    return [s for s in flatten(samples) if isinstance(s, SourceFault)]
