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
[...]}, ...]`` gives one series per GPU instead of ``steps``. Anything else is refused.
"""

from __future__ import annotations

import bisect
import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import msgspec

from keda_gpu_scaler.app.simulation.inputs import BadInput, convert, read_yaml
from keda_gpu_scaler.domain.catalog import CATALOG, MetricType, Origin

MAX_DURATION_S = 86_400.0
TOTAL_MIB = 100_000
"""The memory of a simulated GPU: 100 000 MiB, so that a percentage is whole MiB."""


class _Ramp(msgspec.Struct, forbid_unknown_fields=True):
    to: float
    over: float


class _Step(msgspec.Struct, forbid_unknown_fields=True):
    at: float
    value: float | msgspec.UnsetType | None = msgspec.UNSET
    ramp: _Ramp | None = None


class _GpuSeries(msgspec.Struct, forbid_unknown_fields=True):
    steps: list[_Step]


class _Metric(msgspec.Struct, forbid_unknown_fields=True):
    demand: bool = False
    steps: list[_Step] | None = None
    gpus: list[_GpuSeries] | None = None


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
    """One per GPU, or one for every GPU (and for an engine metric)."""

    def raw(self, t: float, gpu: int = 0) -> float | None:
        return self.series[gpu if len(self.series) > 1 else 0].value(t)


@dataclass(frozen=True, slots=True)
class Load:
    duration: float
    gpus: int
    initial_replicas: int | None
    metrics: dict[MetricType, MetricLoad]


def ceiling(metric_type: MetricType) -> float | None:
    """The most a reading of the metric can be: 100 for a percentage, the GPU's memory."""
    if CATALOG[metric_type].unit == "percent":
        return 100.0
    if metric_type is MetricType.MEMORY_USED_MIB:
        return float(TOTAL_MIB)
    return None


def read_load(path: Path) -> Load:
    raw = convert(read_yaml(path, what="load"), _Load, origin=str(path))
    return load_of(raw, origin=str(path))


def load_of(raw: _Load, *, origin: str) -> Load:
    if not 0 < raw.duration <= MAX_DURATION_S:
        raise BadInput(f"{origin}: duration {raw.duration:g}: must be above 0 and at most 86400 s")
    if not raw.metrics:
        raise BadInput(f"{origin}: metrics: give at least one metric type")
    metrics = {}
    for name, metric in raw.metrics.items():
        kind = _metric_type(name, f"{origin}: metrics")
        metrics[kind] = _metric(kind, metric, raw, f"{origin}: metrics.{name}")
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


def _metric(kind: MetricType, raw: _Metric, load: _Load, where: str) -> MetricLoad:
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
    most = ceiling(kind)
    if not demand and most is not None and value > most:
        unit = CATALOG[kind].unit
        raise BadInput(
            f"{here}: {value:g} is above {most:g}, the most {kind} reads ({unit}); "
            "a total demand above it wants demand: true"
        )
