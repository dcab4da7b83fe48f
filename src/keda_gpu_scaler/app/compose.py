"""Wiring: a source under supervision, the aggregator, and the gRPC server, in one task group."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from ssl import SSLContext
from typing import Protocol

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.domain.samples import Sample
from keda_gpu_scaler.pipeline.aggregator import Aggregator, SampleObserver
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.supervisor import supervise
from keda_gpu_scaler.pipeline.tap import Tap
from keda_gpu_scaler.serving.http import HttpServer, Route
from keda_gpu_scaler.serving.observability import DecisionLog, SelfMetrics
from keda_gpu_scaler.serving.probes import Readiness, grpc_health, metrics_routes, probe_routes
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
    tap: Tap
    metrics: SelfMetrics
    metrics_port: int | None = None
    """Bound port of /metrics and /debug/tap; None when disabled."""
    probe_port: int | None = None
    """Bound port of /healthz and /readyz; None when disabled."""


@dataclass(frozen=True, slots=True)
class RunningPipeline:
    hub: SnapshotHub
    aggregator: Aggregator
    source: Sampler


@asynccontextmanager
async def open_pipeline(
    source: Sampler, *, hub: SnapshotHub | None = None, observers: Sequence[SampleObserver] = ()
) -> AsyncIterator[RunningPipeline]:
    """A supervised source feeding the aggregator; everything stops on exit."""
    hub = hub or SnapshotHub()
    send, receive = anyio.create_memory_object_stream[Sample](SAMPLE_BUFFER)
    aggregator = Aggregator(receive, hub, observers=observers)
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
    ssl: SSLContext | None = None,
    metrics_port: int | None = None,
    probe_port: int | None = None,
    health_check_interval_s: float = 10.0,
) -> AsyncIterator[RunningScaler]:
    """Start the pipeline, the gRPC server (with gRPC health) and the HTTP endpoints.

    ``metrics_port``/``probe_port``: None disables, 0 picks a free port, and one port may
    serve both. On exit, streams end with OK and everything stops.
    """
    hub = SnapshotHub()
    tap = Tap()
    decisions = DecisionLog(tap)
    service = ExternalScalerService(hub, decisions=decisions)
    metrics = SelfMetrics(hub, decisions, open_streams=lambda: service.open_streams, tap=tap)
    service.set_rpc_observer(metrics.observe_rpc)
    observers = [tap.publish_samples, metrics.observe_samples]
    async with open_pipeline(source, hub=hub, observers=observers) as pipeline:
        readiness = Readiness(pipeline.hub)
        health = grpc_health(service, readiness, interval_s=health_check_interval_s)
        server = ScalerServer(
            service, extra_handlers=[health], max_concurrent_streams=max_concurrent_streams
        )
        bound = await server.start(host, port, ssl=ssl)
        try:
            async with anyio.create_task_group() as http:
                ports = await _start_http(
                    http,
                    host,
                    metrics_port,
                    probe_port,
                    metrics_routes(metrics, tap),
                    probe_routes(readiness),
                )
                yield RunningScaler(
                    bound, pipeline.hub, service, pipeline.aggregator, source, tap, metrics, *ports
                )
                http.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await server.aclose()


async def _start_http(
    tg: TaskGroup,
    host: str,
    metrics_port: int | None,
    probe_port: int | None,
    metrics: dict[str, Route],
    probes: dict[str, Route],
) -> tuple[int | None, int | None]:
    if metrics_port is not None and metrics_port == probe_port and metrics_port != 0:
        bound = await tg.start(HttpServer({**metrics, **probes}).serve, host, metrics_port)
        return bound, bound
    bound_metrics = bound_probes = None
    if metrics_port is not None:
        bound_metrics = await tg.start(HttpServer(metrics).serve, host, metrics_port)
    if probe_port is not None:
        bound_probes = await tg.start(HttpServer(probes).serve, host, probe_port)
    return bound_metrics, bound_probes


async def _supervised(source: Sampler, send: MemoryObjectSendStream[Sample]) -> None:
    await supervise(source.name, source.run, send=send)
