"""The synthetic load format (docs/simulate.md): what a workload's GPUs, or its inference
engine, read over simulated time.

```yaml
duration: 1200          # simulated seconds
gpus: 2                 # GPUs the triggers see
initialReplicas: 1      # default: minReplicaCount
metrics:
  gpu_utilization:      # a metricType of this scaler
    demand: true        # total demand, shared by the replicas
    steps: [{at: 0, value: 40}, {at: 60, ramp: {to: 310, over: 300}}, {at: 500, value: null}]
```

``{at, value}`` holds from ``at`` on (``null``: no reading); ``{at, ramp: {to, over}}`` goes
linearly from the value in effect to ``to`` over ``over`` seconds, then holds. ``gpus: [{steps:
[...]}, ...]`` gives one series per GPU instead of ``steps``. A queue metric may instead read
the backlog of a bounded demand (``backlog: gpu_utilization``, ``perRequest: 10``): what the
replicas cannot serve. Anything else is refused.
"""

from __future__ import annotations

import bisect
import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import msgspec

from keda_gpu_scaler.app.simulate.inputs import BadInput, convert, read_yaml
from keda_gpu_scaler.domain.catalog import (
    CATALOG,
    QUEUES,
    Bound,
    DeviceLimits,
    MetricType,
    Origin,
)

MAX_DURATION_S = 86_400.0
TOTAL_MIB = 100_000
"""The memory of a simulated GPU: 100 000 MiB, so that a percentage is whole MiB."""
POWER_LIMIT_W = 700.0
"""The power limit of a simulated GPU (an H100 or H200 SXM board's)."""
SIMULATED_DEVICE = DeviceLimits(memory_mib=float(TOTAL_MIB), power_limit_w=POWER_LIMIT_W)


class _Ramp(msgspec.Struct, forbid_unknown_fields=True):
    to: float
    over: float


class _Step(msgspec.Struct, forbid_unknown_fields=True):
    at: float
    value: float | msgspec.UnsetType | None = msgspec.UNSET
    ramp: _Ramp | None = None


class _GpuSeries(msgspec.Struct, forbid_unknown_fields=True):
    steps: list[_Step]


class _Metric(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    demand: bool = False
    steps: list[_Step] | None = None
    gpus: list[_GpuSeries] | None = None
    backlog: str | None = None
    per_request: float | None = None


class _Load(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    duration: float
    metrics: dict[str, _Metric]
    gpus: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    initial_replicas: Annotated[int, msgspec.Meta(ge=0)] | None = None


@dataclass(frozen=True, slots=True)
class Piece:
    """From ``at`` on: ``start`` held, or a ramp from ``start`` to ``to`` over ``over`` s."""

    at: float
    start: float | None
    to: float | None = None
    over: float = 0.0

    def value(self, t: float) -> float | None:
        if self.to is None or self.start is None:
            return self.start
        done = min(1.0, (t - self.at) / self.over)
        return self.start + (self.to - self.start) * done


@dataclass(frozen=True, slots=True)
class Series:
    pieces: tuple[Piece, ...]

    def value(self, t: float) -> float | None:
        """The value at ``t`` (None: no reading)."""
        i = bisect.bisect_right([p.at for p in self.pieces], t) - 1
        return None if i < 0 else self.pieces[i].value(t)


@dataclass(frozen=True, slots=True)
class MetricLoad:
    metric_type: MetricType
    demand: bool
    series: tuple[Series, ...]
    """One per GPU, or one for every GPU (and for an engine metric); none for a backlog."""
    backlog: Backlog | None = None
    """A queue that reads what another metric's demand leaves waiting."""

    def raw(self, t: float, gpu: int = 0) -> float | None:
        return self.series[gpu if len(self.series) > 1 else 0].value(t)


@dataclass(frozen=True, slots=True)
class Backlog:
    """The demand of ``source`` that its replicas cannot serve, as requests waiting: on each
    of ``devices`` devices, what is above the bound times the replica count, over
    ``per_request`` (the demand one waiting request stands for)."""

    source: MetricLoad
    devices: int
    per_request: float

    def waiting(self, t: float, replicas: int) -> float | None:
        """Requests waiting at ``t`` with ``replicas`` replicas (None: no reading)."""
        most = bound(self.source.metric_type)
        assert most is not None  # checked when the load was read
        queued = 0.0
        for device in range(self.devices):
            demand = self.source.raw(t, device)
            if demand is None:
                return None
            queued += max(0.0, demand - most * replicas)
        return queued / self.per_request


@dataclass(frozen=True, slots=True)
class Load:
    duration: float
    gpus: int
    initial_replicas: int | None
    metrics: dict[MetricType, MetricLoad]


def bound(metric_type: MetricType) -> float | None:
    """The most one simulated device reads of the metric (the catalog's bound): 100 for a
    percentage, the GPU's memory, its power limit; None for counts and queues."""
    return CATALOG[metric_type].limit(SIMULATED_DEVICE)


def read_load(path: Path) -> Load:
    raw = convert(read_yaml(path, what="load"), _Load, origin=str(path))
    return load_of(raw, origin=str(path))


def load_of(raw: _Load, *, origin: str) -> Load:
    if not 0 < raw.duration <= MAX_DURATION_S:
        raise BadInput(f"{origin}: duration {raw.duration:g}: must be above 0 and at most 86400 s")
    if not raw.metrics:
        raise BadInput(f"{origin}: metrics: give at least one metric type")
    metrics: dict[MetricType, MetricLoad] = {}
    queues = {}
    for name, metric in raw.metrics.items():
        kind = _metric_type(name, f"{origin}: metrics")
        if metric.backlog is not None:
            queues[kind] = metric
            continue
        metrics[kind] = _metric(kind, metric, raw, f"{origin}: metrics.{name}")
    for kind, metric in queues.items():
        metrics[kind] = _backlog(kind, metric, metrics, raw, f"{origin}: metrics.{kind}")
    if {MetricType.MEMORY_USED_MIB, MetricType.MEMORY_USED_PERCENT} <= set(metrics):
        raise BadInput(
            f"{origin}: metrics: memory_used_mib and memory_used_percent both set the memory "
            "in use; give one"
        )
    return Load(raw.duration, raw.gpus, raw.initial_replicas, metrics)


def _metric_type(name: str, where: str) -> MetricType:
    try:
        return MetricType(name)
    except ValueError:
        close = difflib.get_close_matches(name, list(MetricType), n=1)
        hint = f"; did you mean {close[0]}?" if close else " (see docs/configuration.md)"
        raise BadInput(f"{where}: {name!r} is not a metricType of this scaler{hint}") from None


def _backlog(
    kind: MetricType,
    raw: _Metric,
    metrics: dict[MetricType, MetricLoad],
    load: _Load,
    where: str,
) -> MetricLoad:
    assert raw.backlog is not None
    if raw.steps is not None or raw.gpus is not None or raw.demand:
        raise BadInput(f"{where}: a backlog reads another metric; give no steps, gpus or demand")
    if kind not in QUEUES:
        queues = ", ".join(sorted(QUEUES))
        raise BadInput(f"{where}.backlog: {kind} counts no waiting requests (queues: {queues})")
    source_type = _metric_type(raw.backlog, f"{where}.backlog")
    source = metrics.get(source_type)
    if source is None:
        raise BadInput(f"{where}.backlog: {source_type} is not a metric of this load")
    if not source.demand or CATALOG[source_type].bound is Bound.NONE:
        raise BadInput(
            f"{where}.backlog: {source_type} must be a demand (demand: true) with a bound per "
            "device (a percentage, memory_used_mib or power_draw)"
        )
    per_request = 1.0 if raw.per_request is None else raw.per_request
    if not 0 < per_request < math.inf:
        raise BadInput(f"{where}.perRequest: {per_request:g} must be a positive number")
    devices = load.gpus if CATALOG[source_type].origin is Origin.GPU else 1
    return MetricLoad(kind, False, (), Backlog(source, devices, per_request))


def _metric(kind: MetricType, raw: _Metric, load: _Load, where: str) -> MetricLoad:
    if raw.per_request is not None:
        raise BadInput(f"{where}.perRequest: only a backlog (backlog: METRIC) has one")
    if (raw.steps is None) == (raw.gpus is None):
        raise BadInput(f"{where}: give either steps or gpus (one series per GPU)")
    if raw.gpus is not None:
        if CATALOG[kind].origin is not Origin.GPU:
            raise BadInput(f"{where}.gpus: {kind} is an engine metric, with one series (steps)")
        if len(raw.gpus) != load.gpus:
            raise BadInput(f"{where}.gpus: {len(raw.gpus)} series for {load.gpus} GPUs")
        series = tuple(
            _series(kind, g.steps, raw.demand, load.duration, f"{where}.gpus[{i}].steps")
            for i, g in enumerate(raw.gpus)
        )
    else:
        assert raw.steps is not None
        series = (_series(kind, raw.steps, raw.demand, load.duration, f"{where}.steps"),)
    return MetricLoad(kind, raw.demand, series)


def _series(
    kind: MetricType, steps: list[_Step], demand: bool, duration: float, where: str
) -> Series:
    if not steps:
        raise BadInput(f"{where}: give at least one step")
    pieces: list[Piece] = []
    for i, step in enumerate(steps):
        here = f"{where}[{i}]"
        _check_at(step.at, pieces, duration, here)
        if (step.ramp is None) == (step.value is msgspec.UNSET):
            raise BadInput(f"{here}: give either value or ramp")
        if step.ramp is not None:
            start = pieces[-1].value(step.at) if pieces else None
            if start is None:
                raise BadInput(f"{here}.ramp: a ramp starts from a value in effect, and none is")
            _check_value(kind, step.ramp.to, demand, f"{here}.ramp.to")
            if not 0 < step.ramp.over < math.inf:
                raise BadInput(f"{here}.ramp.over: {step.ramp.over:g} must be a positive duration")
            pieces.append(Piece(step.at, start, step.ramp.to, step.ramp.over))
        else:
            value = step.value
            assert not isinstance(value, msgspec.UnsetType)
            if value is not None:
                _check_value(kind, value, demand, f"{here}.value")
            pieces.append(Piece(step.at, value))
    return Series(tuple(pieces))


def _check_at(at: float, pieces: list[Piece], duration: float, here: str) -> None:
    if not pieces and at != 0:
        raise BadInput(f"{here}.at: the first step is at 0 (what would hold before it?)")
    if pieces and not at > pieces[-1].at:
        raise BadInput(f"{here}.at: {at:g} must be after the step before ({pieces[-1].at:g})")
    if not at < duration:
        raise BadInput(f"{here}.at: {at:g} is not before the end ({duration:g} s)")


def _check_value(kind: MetricType, value: float, demand: bool, here: str) -> None:
    if not 0 <= value < math.inf:
        raise BadInput(f"{here}: {value:g} must be a finite number, 0 or more")
    most = bound(kind)
    if not demand and most is not None and value > most:
        unit = CATALOG[kind].unit
        raise BadInput(
            f"{here}: {value:g} is above {most:g}, the most {kind} reads ({unit}); "
            "a total demand above it wants demand: true"
        )
