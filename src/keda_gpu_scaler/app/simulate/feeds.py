"""What the scaler's pipeline holds during a simulation: samples in virtual time, folded by
the real ``pipeline.state.fold``, so the real staleness rules (and every rule of the fold)
apply.

A load's GPUs read every second and an engine is scraped every 5 s, ``serve``'s defaults
(``--interval``, ``--engine-interval``); a trace reads at its recorded instants.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from keda_gpu_scaler.app.simulate.inputs import BadInput
from keda_gpu_scaler.app.simulate.load import (
    POWER_LIMIT_W,
    TOTAL_MIB,
    Load,
    MetricLoad,
    bound,
)
from keda_gpu_scaler.domain.catalog import CATALOG, MetricType
from keda_gpu_scaler.domain.engines import READING_TYPES, Discovery, EngineSample, EngineTarget
from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.domain.history import NO_HISTORY, HistoryPlan
from keda_gpu_scaler.domain.samples import Batch, DeviceKey, GpuReading, Sample
from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT, Snapshot
from keda_gpu_scaler.pipeline.state import fold
from keda_gpu_scaler.sources.replay import BUNDLED_IDENTITY, BUNDLED_TRACE
from keda_gpu_scaler.sources.trace import (
    Identity,
    TraceFrame,
    decode_trace,
    frame_to_reading,
    parse_trace,
    trace_period,
)

GPU_PERIOD_S = 1.0
ENGINE_PERIOD_S = 5.0
BUNDLED = "bundled"
"""``--trace bundled``: the H200 recording shipped with the package."""
_MIB = 1 << 20
_SOURCE = "simulated"
_SUMMED_UNITS = frozenset({"requests", "requests/s", "preemptions/s"})
"""Engine metrics that ``endpointDiscovery: dns`` sums over pods (the others: the highest)."""
HELD_WITHOUT_REPLICAS = frozenset({MetricType.LLMD_QUEUE_SIZE})
"""Queues in front of the workload that exist at 0 replicas: a router's."""
FRONT_QUEUES = frozenset({MetricType.LLMD_QUEUE_SIZE, MetricType.DYNAMO_QUEUED_REQUESTS})
"""Queues of one process in front of the replicas (a router, a frontend): a backlog waits
there whole, replicas or not."""
NO_REPLICA = "no replica runs: no engine to scrape"
_GPU_FIELDS: dict[MetricType, Callable[[float], dict[str, Any]]] = {
    MetricType.GPU_UTILIZATION: lambda v: {"gpu_utilization": v},
    MetricType.MEMORY_UTILIZATION: lambda v: {"memory_utilization": v},
    MetricType.MEMORY_USED_MIB: lambda v: {"memory_used_bytes": round(v) * _MIB},
    MetricType.MEMORY_USED_PERCENT: lambda v: {
        "memory_used_bytes": round(v / 100 * TOTAL_MIB) * _MIB
    },
    MetricType.TEMPERATURE: lambda v: {"temperature_c": v},
    MetricType.POWER_DRAW: lambda v: {"power_mw": v * 1000},
    MetricType.PCIE_TX_KBPS: lambda v: {"pcie_tx_kbps": v},
    MetricType.PCIE_RX_KBPS: lambda v: {"pcie_rx_kbps": v},
    MetricType.NVLINK_TX_MBPS: lambda v: {"nvlink_tx_mbps": v},
    MetricType.NVLINK_RX_MBPS: lambda v: {"nvlink_rx_mbps": v},
    MetricType.SM_ACTIVE: lambda v: {"sm_active": v},
    MetricType.SM_OCCUPANCY: lambda v: {"sm_occupancy": v},
    MetricType.TENSOR_ACTIVE: lambda v: {"tensor_active": v},
    MetricType.DRAM_BW_UTIL: lambda v: {"dram_bw_util": v},
}
"""How a GPU reading carries each GPU metric type (the catalog's ``read`` gives it back)."""


class Feed(Protocol):
    duration: float
    """Simulated seconds."""
    gpus: int
    """The GPUs the triggers see."""
    plan: HistoryPlan
    """The readings the fold keeps for windowed triggers."""

    def advance(self, t: float, replicas: int) -> Snapshot:
        """The snapshot once every sample taken at or before ``t`` is folded; samples not
        yet made are made with ``replicas`` in effect."""
        ...

    def next_sample_at(self) -> float | None:
        """When the next sample is taken (None: no more)."""
        ...


def _clip(metric_type: MetricType, value: float) -> float:
    most = bound(metric_type)
    return value if most is None else min(most, value)


def gpu_share(metric: MetricLoad, t: float, gpu: int, replicas: int) -> float | None:
    """What one GPU reads: the series, or with ``demand`` one replica's share of it (0 with
    no replica), at most the metric's bound: a saturated replica reads the bound."""
    value = metric.raw(t, gpu)
    if value is None or not metric.demand:
        return value
    return 0.0 if replicas == 0 else _clip(metric.metric_type, value / replicas)


def engine_share(metric: MetricLoad, t: float, replicas: int, discovery: Discovery) -> float | None:
    """What an engine trigger reads: with ``demand`` one replica's share, and nothing at 0
    replicas (no engine runs to be scraped); ``dns`` discovery sums counts over the replicas'
    pods. A router's queue (``llmd_queue_size``) holds the whole demand while no replica runs
    and nothing once one does: the pool takes the requests. A backlog is shared the same way,
    except in a router's or a frontend's queue, which holds all of it."""
    if metric.backlog is not None:
        return _backlog_share(metric, t, replicas, discovery)
    value = metric.raw(t)
    if value is None or not metric.demand:
        return value
    if metric.metric_type in HELD_WITHOUT_REPLICAS:
        return value if replicas == 0 else 0.0
    if replicas == 0:
        return None
    summed = discovery is Discovery.DNS and CATALOG[metric.metric_type].unit in _SUMMED_UNITS
    share = value if summed else value / replicas
    return _clip(metric.metric_type, share)


def gpu_reading(
    metrics: Sequence[MetricLoad],
    index: int,
    at: float,
    replicas: int,
    *,
    source: str = _SOURCE,
    taken_at: float | None = None,
) -> GpuReading:
    """GPU ``index`` as NVML would read it at ``at`` of the load, with ``replicas`` sharing
    its demand (dated ``taken_at`` on the reader's clock, ``at`` unless given)."""
    fields: dict[str, Any] = {}
    for metric in metrics:
        if metric.metric_type not in _GPU_FIELDS:
            continue
        value = gpu_share(metric, at, index, replicas)
        if value is not None:
            fields |= _GPU_FIELDS[metric.metric_type](value)
    return GpuReading(
        source=source,
        key=DeviceKey(f"GPU-simulated-{index}"),
        index=index,
        uuid=f"GPU-simulated-{index}",
        name="simulated GPU",
        taken_at=at if taken_at is None else taken_at,
        period_s=GPU_PERIOD_S,
        memory_total_bytes=TOTAL_MIB * _MIB,
        power_limit_mw=POWER_LIMIT_W * 1000,
        **fields,
    )


def _backlog_share(
    metric: MetricLoad, t: float, replicas: int, discovery: Discovery
) -> float | None:
    assert metric.backlog is not None
    waiting = metric.backlog.waiting(t, replicas)
    if waiting is None or metric.metric_type in FRONT_QUEUES:
        return waiting
    if replicas == 0:
        return None
    return waiting if discovery is Discovery.DNS else waiting / replicas


class LoadFeed:
    """A synthetic load: every GPU reads its series each second, engines every 5 s."""

    def __init__(self, load: Load, engine_targets: Sequence[EngineTarget] = ()) -> None:
        self.duration = load.duration
        self.gpus = load.gpus
        self._load = load
        self._targets = tuple(dict.fromkeys(engine_targets))
        self._gpu_metrics = [m for m in load.metrics.values() if m.metric_type in _GPU_FIELDS]
        self._snapshot = EMPTY_SNAPSHOT
        self.plan = NO_HISTORY
        """The history windowed triggers need (set by the runner before it advances)."""
        self._instants = self._schedule()
        self._next = next(self._instants, None)

    def _schedule(self) -> Iterator[float]:
        gpu = {float(k) for k in range(math.ceil(self.duration / GPU_PERIOD_S))}
        engine = {k * ENGINE_PERIOD_S for k in range(math.ceil(self.duration / ENGINE_PERIOD_S))}
        return iter(
            sorted((gpu if self._gpu_metrics else set()) | (engine if self._targets else set()))
        )

    def next_sample_at(self) -> float | None:
        return self._next

    def advance(self, t: float, replicas: int) -> Snapshot:
        while self._next is not None and self._next <= t:
            at = self._next
            if samples := self._samples(at, replicas):
                self._snapshot = fold(self._snapshot, samples, at, plan=self.plan)
            self._next = next(self._instants, None)
        return self._snapshot

    def _samples(self, at: float, replicas: int) -> list[Sample]:
        samples: list[Sample] = []
        if at % GPU_PERIOD_S == 0 and self._gpu_metrics:
            readings = tuple(self._gpu(i, at, replicas) for i in range(self.gpus))
            samples.append(Batch(source=_SOURCE, samples=readings))
        if at % ENGINE_PERIOD_S == 0:
            samples += [self._engine(target, at, replicas) for target in self._targets]
        return samples

    def _gpu(self, index: int, at: float, replicas: int) -> GpuReading:
        return gpu_reading(self._gpu_metrics, index, at, replicas)

    def _engine(self, target: EngineTarget, at: float, replicas: int) -> EngineSample:
        fields: dict[str, float | None] = {}
        reasons: dict[str, str] = {}
        for metric in self._load.metrics.values():
            info = CATALOG[metric.metric_type]
            if info.origin.engine is not target.kind or info.engine_field is None:
                continue
            value = engine_share(metric, at, replicas, target.discovery)
            fields[info.engine_field] = None if value is None else value / info.scale
            if value is None:
                no_replica = replicas == 0 and _has_demand(metric, at)
                reasons[info.engine_field] = (
                    NO_REPLICA if no_replica else "no reading at this time in the load"
                )
        reading = READING_TYPES[target.kind](taken_at=at, reasons=reasons, **fields)
        return EngineSample(
            source=target.source,
            kind=target.kind,
            endpoint=target.url,
            taken_at=at,
            period_s=ENGINE_PERIOD_S,
            reading=reading,
        )


def _has_demand(metric: MetricLoad, at: float) -> bool:
    if metric.backlog is not None:
        return metric.backlog.waiting(at, 0) is not None
    return metric.raw(at) is not None


class TraceFeed:
    """A recording: each recorded instant is folded as one batch, the first at t = 0."""

    def __init__(self, frames: list[TraceFrame], *, identity: Identity | None = None) -> None:
        ordered = sorted(frames, key=lambda f: (f.t, f.index))
        self._period = trace_period(ordered)
        start = ordered[0].t
        self.duration = ordered[-1].t - start + self._period
        self.gpus = len({f.index for f in ordered if f.parent_index is None})
        self._cycles = [
            (t - start, tuple(group)) for t, group in itertools.groupby(ordered, lambda f: f.t)
        ]
        self._identity = identity
        self._done = 0
        self._snapshot = EMPTY_SNAPSHOT
        self.plan = NO_HISTORY
        """The history windowed triggers need (set by the runner before it advances)."""

    @property
    def indices(self) -> frozenset[int]:
        return frozenset(f.index for _, cycle in self._cycles for f in cycle)

    @property
    def period_s(self) -> float:
        return self._period

    def next_sample_at(self) -> float | None:
        return self._cycles[self._done][0] if self._done < len(self._cycles) else None

    def advance(self, t: float, replicas: int) -> Snapshot:
        while self._done < len(self._cycles) and self._cycles[self._done][0] <= t:
            at, cycle = self._cycles[self._done]
            readings = tuple(
                frame_to_reading(
                    f, source="replay", taken_at=at, period_s=self._period, identity=self._identity
                )
                for f in cycle
            )
            batch = [Batch(source="replay", samples=readings)]
            self._snapshot = fold(self._snapshot, batch, at, plan=self.plan)
            self._done += 1
        return self._snapshot


def read_trace(name: str) -> TraceFeed:
    """``bundled`` (the H200 recording shipped with the package) or a trace file."""
    try:
        if name == BUNDLED:
            data = resources.files("keda_gpu_scaler.sources").joinpath("data", BUNDLED_TRACE)
            lines = data.read_text(encoding="utf-8").splitlines()
            return TraceFeed(parse_trace(lines, origin=BUNDLED_TRACE), identity=BUNDLED_IDENTITY)
        path = Path(name)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise BadInput(f"cannot read trace {path}: {exc.strerror or exc}") from None
        text = decode_trace(raw, origin=str(path))
        return TraceFeed(parse_trace(text.splitlines(), origin=str(path)))
    except SourceUnavailable as exc:
        raise BadInput(str(exc)) from None
