"""Wiring: a source under supervision, the aggregator, and the gRPC server, in one task group."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.domain.samples import Sample
from keda_gpu_scaler.pipeline.aggregator import Aggregator
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.supervisor import supervise
from keda_gpu_scaler.serving.server import DEFAULT_MAX_CONCURRENT_STREAMS, ScalerServer
from keda_gpu_scaler.serving.service import ExternalScalerService
from keda_gpu_scaler.sources.replay import ReplaySampler

log = logging.getLogger(__name__)

SAMPLE_BUFFER = 1024


class Sampler(Protocol):
    name: str

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = ...,
    ) -> None: ...


def build_source(spec: str, *, interval_s: float = 1.0) -> Sampler:
    """``nvml``, ``replay`` (the bundled H200 trace) or ``replay:PATH``.

    Raises :class:`SourceUnavailable` with a one-line reason; never falls back to fake data.
    """
    if spec == "replay":
        return ReplaySampler.bundled()
    if spec.startswith("replay:"):
        return ReplaySampler.from_path(Path(spec.removeprefix("replay:")))
    if spec == "nvml":
        from keda_gpu_scaler.sources.nvml import open_nvml_sampler

        return open_nvml_sampler(interval_s=interval_s)
    raise SourceUnavailable(f'unknown source "{spec}": use nvml, replay or replay:PATH')


@dataclass(frozen=True, slots=True)
class RunningScaler:
    port: int
    hub: SnapshotHub
    service: ExternalScalerService
    aggregator: Aggregator
    source: Sampler


@dataclass(frozen=True, slots=True)
class RunningPipeline:
    hub: SnapshotHub
    aggregator: Aggregator
    source: Sampler


@asynccontextmanager
async def open_pipeline(source: Sampler) -> AsyncIterator[RunningPipeline]:
    """A supervised source feeding the aggregator; everything stops on exit."""
    hub = SnapshotHub()
    send, receive = anyio.create_memory_object_stream[Sample](SAMPLE_BUFFER)
    aggregator = Aggregator(receive, hub)
    async with anyio.create_task_group() as tg:
        await tg.start(aggregator.run)
        tg.start_soon(_supervised, source, send)
        try:
            yield RunningPipeline(hub, aggregator, source)
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def open_scaler(
    source: Sampler,
    *,
    host: str,
    port: int,
    max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS,
) -> AsyncIterator[RunningScaler]:
    """Start the pipeline and the server; on exit end streams with OK and stop everything."""
    async with open_pipeline(source) as pipeline:
        service = ExternalScalerService(pipeline.hub)
        server = ScalerServer(service, max_concurrent_streams=max_concurrent_streams)
        bound = await server.start(host, port)
        try:
            yield RunningScaler(bound, pipeline.hub, service, pipeline.aggregator, source)
        finally:
            with anyio.CancelScope(shield=True):
                await server.aclose()


async def _supervised(source: Sampler, send: MemoryObjectSendStream[Sample]) -> None:
    await supervise(source.name, source.run, send=send)
