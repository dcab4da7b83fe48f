"""Test kit: the real pipeline, small enough to drive in virtual time.

Like ``trio.testing`` and ``grpclib.testing``, it is shipped with the package and may import
every layer. Everything here is built on the real parts (``fold``, the aggregator, the
supervisor, the servicer), so a test never asserts against an imitation of them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from keda_gpu_scaler.app.scaler.compose import RunningPipeline, open_pipeline
from keda_gpu_scaler.domain.attribution import slices_unavailable_reason
from keda_gpu_scaler.domain.decision import Measurement
from keda_gpu_scaler.domain.decision import measure as real_measure
from keda_gpu_scaler.domain.dra import Slices
from keda_gpu_scaler.domain.samples import (
    DeviceGone,
    DeviceKey,
    DeviceProcesses,
    GpuReading,
    PodResourcesReading,
    PodsReading,
    ResourceSlicesReading,
    Sample,
    SourceFault,
    unbatch,
)
from keda_gpu_scaler.domain.snapshot import (
    EMPTY_POD_INDEX,
    EMPTY_SNAPSHOT,
    LOCAL_NODE,
    DeviceState,
    Snapshot,
    index_pods,
    node_of,
)
from keda_gpu_scaler.domain.trigger import TriggerSpec
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.state import NodeBuilder, fold
from keda_gpu_scaler.pipeline.supervisor import Sampler
from keda_gpu_scaler.serving.decider import Decider, Measure
from keda_gpu_scaler.serving.service import ExternalScalerService
from keda_gpu_scaler.serving.streams import StreamRegistry
from keda_gpu_scaler.serving.telemetry import NoTelemetry, Telemetry

__all__ = [
    "CountingMeasure",
    "TestService",
    "agent_reading",
    "collect_samples",
    "faults",
    "flatten",
    "inline",
    "open_test_pipeline",
    "open_test_service",
    "process_readings",
    "readings",
    "snapshot_after",
    "snapshot_of",
    "unary_service",
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


@dataclass(frozen=True, slots=True)
class TestService:
    """The servicer as the scaler wires it, without the network."""

    service: ExternalScalerService
    streams: StreamRegistry
    decider: Decider
    pipeline: RunningPipeline


@asynccontextmanager
async def open_test_service(
    source: Sampler,
    *,
    telemetry: Telemetry | None = None,
    measure: Measure | None = None,
) -> AsyncIterator[TestService]:
    """``source`` through the real pipeline to a servicer with a running stream registry;
    waits for the first snapshot."""
    telemetry = telemetry or NoTelemetry()
    async with (
        open_test_pipeline(source, wait_first_snapshot=True) as pipeline,
        anyio.create_task_group() as tg,
    ):
        decider = Decider(pipeline.hub, telemetry=telemetry, measure=measure or real_measure)
        streams = StreamRegistry(pipeline.hub, decider)
        await tg.start(streams.run)
        yield TestService(
            ExternalScalerService(decider, streams, telemetry), streams, decider, pipeline
        )
        tg.cancel_scope.cancel()


def unary_service(hub: SnapshotHub) -> ExternalScalerService:
    """A servicer answering unary calls from ``hub`` (no stream driver runs)."""
    decider = Decider(hub)
    return ExternalScalerService(decider, StreamRegistry(hub, decider), NoTelemetry())


class CountingMeasure:
    """The real :func:`~keda_gpu_scaler.domain.decision.measure`, counting its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[TriggerSpec, int]] = []
        """(spec, snapshot version) of every evaluation."""

    def __call__(
        self,
        spec: TriggerSpec,
        snapshot: Snapshot,
        now: float,
        previous: Measurement | None = None,
    ) -> Measurement:
        self.calls.append((spec, snapshot.version))
        return real_measure(spec, snapshot, now, previous)


def snapshot_after(samples: Iterable[Sample], now: float) -> Snapshot:
    """What the aggregator holds after folding ``samples`` from an empty start."""
    return fold(EMPTY_SNAPSHOT, samples, now)


def agent_reading(
    node: str, index: int, value: float, *, taken_at: float, period_s: float = 1.0
) -> GpuReading:
    """A GPU reading as a cluster scaler's link publishes it for ``node``: GPU ``index``
    (UUID ``GPU-<node>-<index>``, key ``<node>/<uuid>``) at ``value`` % utilization."""
    uuid = f"GPU-{node}-{index}"
    return GpuReading(
        source=f"agent/{node}",
        key=DeviceKey(f"{node}/{uuid}"),
        index=index,
        uuid=uuid,
        name="H200",
        taken_at=taken_at,
        period_s=period_s,
        gpu_utilization=value,
        node=node,
    )


def snapshot_of(
    devices: Iterable[DeviceState] = (),
    *,
    attributions: Iterable[PodResourcesReading] = (),
    pods: PodsReading | None = None,
    resource_slices: ResourceSlicesReading | None = None,
    published_at: float = 0.0,
    **fields: Any,
) -> Snapshot:
    """A snapshot holding these device states (lost, or with a history, as a test needs)
    and attributions (each on its ``node``; a node agent's DRA devices joined through
    ``resource_slices``), with the node views and indexes the fold's own
    :class:`~keda_gpu_scaler.pipeline.state.NodeBuilder` makes of them; ``fields`` are other
    :class:`Snapshot` fields (``engines``, ``sources``)."""
    builder = NodeBuilder(EMPTY_SNAPSHOT)
    for device in devices:
        builder.touch(node_of(device.key), published_at).devices[device.key] = device
    for reading in attributions:
        builder.touch(reading.node or LOCAL_NODE, published_at).attribute(reading)
    sources = fields.get("sources", {})

    def slices() -> Slices:
        reason = slices_unavailable_reason(sources, resource_slices, published_at)
        return Slices.of(resource_slices, reason)

    nodes, count, pod_nodes, attributed_until = builder.finish(EMPTY_SNAPSHOT, slices)
    return Snapshot(
        version=1,
        published_at=published_at,
        nodes=nodes,
        device_count=count,
        pods=pods,
        pod_index=EMPTY_POD_INDEX if pods is None else index_pods(pods.pods),
        pod_nodes=pod_nodes,
        attributed_until=attributed_until,
        resource_slices=resource_slices,
        **fields,
    )


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


def process_readings(samples: Iterable[Sample], key: str | None = None) -> list[DeviceProcesses]:
    """The per-process readings inside the batches a sampler sent (of device ``key``)."""
    return [s for s in unbatch(samples) if isinstance(s, DeviceProcesses) and key in (None, s.key)]


def faults(samples: Iterable[Sample]) -> list[SourceFault]:
    return [s for s in flatten(samples) if isinstance(s, SourceFault)]


def gone(samples: Iterable[Sample]) -> list[DeviceGone]:
    """The devices a sampler said no longer exist."""
    return [s for s in unbatch(samples) if isinstance(s, DeviceGone)]
