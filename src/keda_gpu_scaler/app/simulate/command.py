"""``keda-gpu-scaler simulate``: a ScaledObject through KEDA and the HPA, over a recorded
trace or a synthetic load, in virtual time, with the scaler's real decision code.

Everything is in ``app/simulate/``: the ScaledObject (``scaledobject``), the load format
(``load``), the samples and the real fold (``feeds``), the loop (``runner``) over the pure
models of ``models.kedaloop`` and ``models.hpa``, and the outputs (``report``, ``chart``,
``svg``, ``png``). See docs/simulate.md.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from keda_gpu_scaler.app.simulate.chart import Figure, Series, chart
from keda_gpu_scaler.app.simulate.feeds import (
    BUNDLED,
    Feed,
    LoadFeed,
    TraceFeed,
    read_trace,
)
from keda_gpu_scaler.app.simulate.inputs import BadInput
from keda_gpu_scaler.app.simulate.load import Load, read_load
from keda_gpu_scaler.app.simulate.png import to_png
from keda_gpu_scaler.app.simulate.report import describe, to_json, to_table
from keda_gpu_scaler.app.simulate.runner import Step, simulate, warnings
from keda_gpu_scaler.app.simulate.scaledobject import Plan, read_scaled_object
from keda_gpu_scaler.app.simulate.svg import to_svg
from keda_gpu_scaler.app.simulate.text import num
from keda_gpu_scaler.domain.catalog import CATALOG, Origin
from keda_gpu_scaler.pipeline.hub import HistoryDemand

FORMATS = ("table", "json")
PLOT_SUFFIXES = (".png", ".svg")


@dataclass(frozen=True, slots=True)
class Simulation:
    plan: Plan
    source: str
    """What was simulated, in words."""
    duration: float
    warnings: tuple[str, ...]
    steps: tuple[Step, ...]

    def table(self) -> str:
        return to_table([*describe(self.plan), self.source], self.warnings, self.plan, self.steps)

    def json(self) -> str:
        return to_json(self.warnings, self.steps)

    def figure(self) -> Figure:
        series = [Series(t.hpa_name, CATALOG[t.spec.metric_type].unit) for t in self.plan.triggers]
        title = f"ScaledObject {self.plan.namespace}/{self.plan.name}: {self.source}"
        return chart(title, series, self.steps, self.duration)


def run_simulation(
    scaled_object: Path,
    *,
    trace: str | None = None,
    load: Path | None = None,
    name: str | None = None,
    created_at: float = 0.0,
) -> Simulation:
    """Simulate ``scaled_object`` (the ScaledObject named ``name`` when the file has several)
    over ``trace`` (a file, or ``bundled``) or ``load``, the ScaledObject created
    ``created_at`` seconds in."""
    plan = read_scaled_object(scaled_object, name=name)
    feed: Feed
    if load is not None:
        loaded = read_load(load)
        feed = _load_feed(plan, loaded, str(load))
        replicas = (
            plan.keda.min_replicas if loaded.initial_replicas is None else loaded.initial_replicas
        )
        source = (
            f"load {load}: {num(loaded.duration)} s, {_gpus(loaded.gpus)}, "
            f"{replicas} replica(s) at t=0"
        )
    elif trace is not None:
        feed = _trace_feed(plan, read_trace(trace), trace)
        replicas = plan.keda.min_replicas
        what = "the bundled H200 recording" if trace == BUNDLED else trace
        source = (
            f"trace {what}: {num(feed.duration)} s, {_gpus(feed.gpus)}, "
            f"{replicas} replica(s) at t=0"
        )
    else:
        raise BadInput("simulate needs --trace FILE or --load LOAD.yaml")
    # The history windowed triggers read, as the decider asks it of a running scaler.
    demand = HistoryDemand()
    for trigger in plan.triggers:
        demand.require(trigger.spec.metric_type, trigger.spec.window_s)
    feed.plan = demand.plan
    if not 0 <= created_at < feed.duration:
        raise BadInput(
            f"--created-at {created_at:g}: must be at least 0 and before the end "
            f"({num(feed.duration)} s)"
        )
    if created_at:
        source += f", ScaledObject created at t={num(created_at)}"
    steps = simulate(plan, feed, replicas, start=created_at)
    return Simulation(plan, source, feed.duration, warnings(plan, feed.gpus), tuple(steps))


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _load_feed(plan: Plan, load: Load, origin: str) -> LoadFeed:
    for trigger in plan.triggers:
        spec, where = trigger.spec, f"{trigger.hpa_name} (spec.triggers[{trigger.index}])"
        if spec.metric_type not in load.metrics:
            raise BadInput(
                f"{origin}: {where} reads {spec.metric_type}, which the load does not give "
                f"(metrics: {', '.join(load.metrics)})"
            )
        if spec.mig_instance is not None:
            raise BadInput(
                f"{origin}: {where} names migInstance {spec.mig_instance}; a load has no MIG"
            )
        if spec.gpu_index >= load.gpus:
            raise BadInput(
                f"{origin}: {where} reads gpuIndex {spec.gpu_index}; the load has "
                f"{_gpus(load.gpus)} (0-{load.gpus - 1})"
            )
    targets = [t.spec.engine_target for t in plan.triggers if t.spec.engine_target is not None]
    return LoadFeed(load, targets)


def _trace_feed(plan: Plan, feed: TraceFeed, origin: str) -> TraceFeed:
    for trigger in plan.triggers:
        spec, where = trigger.spec, f"{trigger.hpa_name} (spec.triggers[{trigger.index}])"
        if CATALOG[spec.metric_type].origin is not Origin.GPU:
            raise BadInput(
                f"{origin}: {where} reads {spec.metric_type} from an engine; a trace holds GPU "
                "readings only (give a --load)"
            )
        if spec.gpu_index >= 0 and spec.gpu_index not in feed.indices:
            known = ", ".join(str(i) for i in sorted(feed.indices))
            raise BadInput(
                f"{origin}: {where} reads gpuIndex {spec.gpu_index}; the trace has GPU {known}"
            )
    return feed


def run_simulate(
    scaled_object: Path,
    *,
    trace: str | None = None,
    load: Path | None = None,
    output_format: str = "table",
    plot: Path | None = None,
    out: TextIO | None = None,
    name: str | None = None,
    created_at: str = "0",
) -> int:
    """The command: the table or JSON on ``out`` (standard output), the picture to ``plot``."""
    try:
        start = float(created_at)
    except ValueError:
        raise BadInput(f"--created-at {created_at!r}: give a number of seconds") from None
    if not math.isfinite(start):
        raise BadInput(f"--created-at {created_at!r}: give a number of seconds")
    if output_format not in FORMATS:
        raise BadInput(f"--format {output_format!r}: must be one of {', '.join(FORMATS)}")
    if plot is not None and plot.suffix.lower() not in PLOT_SUFFIXES:
        raise BadInput(f"--plot {plot}: the name must end in .png or .svg")
    result = run_simulation(scaled_object, trace=trace, load=load, name=name, created_at=start)
    stream = sys.stdout if out is None else out
    stream.write(result.table() if output_format == "table" else result.json())
    stream.flush()
    if plot is not None:
        write_plot(result.figure(), plot)
    return 0


def write_plot(figure: Figure, path: Path) -> None:
    data = to_png(figure) if path.suffix.lower() == ".png" else to_svg(figure).encode()
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
