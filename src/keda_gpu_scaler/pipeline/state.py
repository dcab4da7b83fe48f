"""Pure state transitions of the aggregator: samples in, the next snapshot out."""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

import msgspec

from keda_gpu_scaler.domain.engines import EngineSample
from keda_gpu_scaler.domain.history import EMPTY_HISTORY, NO_HISTORY, History, HistoryPlan
from keda_gpu_scaler.domain.samples import (
    Batch,
    DeviceKey,
    GpuReading,
    PodResourcesReading,
    PodsReading,
    Sample,
    SourceFault,
    SourceStopped,
    unbatch,
)
from keda_gpu_scaler.domain.snapshot import DeviceState, Snapshot, SourceState
from keda_gpu_scaler.domain.windows import extend_device, extend_engine


def fold(
    snapshot: Snapshot, samples: Iterable[Sample], now: float, *, plan: HistoryPlan = NO_HISTORY
) -> Snapshot:
    """The snapshot after ``samples``, one version later; ``plan`` says what history of
    each device and engine to keep for windows (none by default)."""
    devices: dict[DeviceKey, DeviceState] = dict(snapshot.devices)
    sources: dict[str, SourceState] = dict(snapshot.sources)
    engines: dict[str, EngineSample] = dict(snapshot.engines)
    engine_history: dict[str, History] = dict(snapshot.engine_history)
    attribution = snapshot.attribution
    node_attributions: dict[str, PodResourcesReading] = dict(snapshot.node_attributions)
    pods = snapshot.pods
    samples = tuple(samples)
    for item in samples:
        if isinstance(item, Batch | GpuReading | EngineSample | PodResourcesReading | PodsReading):
            _count_cycle(sources, item.source)
    for sample in unbatch(samples):
        if isinstance(sample, SourceStopped):
            sources.pop(sample.source, None)
            engines.pop(sample.source, None)
            engine_history.pop(sample.source, None)
            if attribution is not None and attribution.source == sample.source:
                attribution = None
            if pods is not None and pods.source == sample.source:
                pods = None
            # A link to a node agent that left: its node's devices and attribution too.
            for key in [k for k, d in devices.items() if _published_by(d, sample.source)]:
                del devices[key]
            for node in [n for n, a in node_attributions.items() if _under(a.source, sample)]:
                del node_attributions[node]
            continue
        source = sources.get(sample.source) or SourceState(name=sample.source)
        if isinstance(sample, GpuReading):
            devices[sample.key] = _read(devices.get(sample.key), sample, plan, now)
            sources[sample.source] = _heard(source, sample.taken_at)
        elif isinstance(sample, EngineSample):
            engines[sample.source] = sample
            if plan.keeps_any():
                history = engine_history.get(sample.source, EMPTY_HISTORY)
                engine_history[sample.source] = extend_engine(history, sample, plan, now)
            else:
                engine_history.pop(sample.source, None)
            sources[sample.source] = _heard(source, sample.taken_at, fault=sample.error)
        elif isinstance(sample, PodResourcesReading):
            if sample.node:  # a node agent's, on a cluster scaler
                node_attributions[sample.node] = sample
            else:
                attribution = sample
            sources[sample.source] = _heard(source, sample.taken_at)
        elif isinstance(sample, PodsReading):
            pods = sample
            sources[sample.source] = _heard(source, sample.taken_at)
        else:
            if sample.key is None:
                source = msgspec.structs.replace(source, fault=sample.reason, fault_at=sample.at)
            elif sample.lost:
                devices[sample.key] = _mark_lost(devices.get(sample.key), sample)
            sources[sample.source] = msgspec.structs.replace(source, faults=source.faults + 1)
    return Snapshot(
        version=snapshot.version + 1,
        published_at=now,
        devices=MappingProxyType(devices),
        sources=MappingProxyType(sources),
        engines=MappingProxyType(engines),
        engine_history=MappingProxyType(engine_history),
        attribution=attribution,
        node_attributions=MappingProxyType(node_attributions),
        pods=pods,
    )


def _under(source: str, stopped: SourceStopped) -> bool:
    return source == stopped.source or source.startswith(stopped.source + "/")


def _published_by(device: DeviceState, source: str) -> bool:
    return (
        device.reading is not None and device.reading.node != "" and device.reading.source == source
    )


def _read(
    device: DeviceState | None, reading: GpuReading, plan: HistoryPlan, now: float
) -> DeviceState:
    history = EMPTY_HISTORY
    if plan.keeps_any():
        history = extend_device(
            EMPTY_HISTORY if device is None else device.history, reading, plan, now
        )
    return DeviceState(key=reading.key, index=reading.index, reading=reading, history=history)


def _count_cycle(sources: dict[str, SourceState], name: str) -> None:
    source = sources.get(name) or SourceState(name=name)
    sources[name] = msgspec.structs.replace(source, cycles=source.cycles + 1)


def _heard(source: SourceState, at: float, *, fault: str | None = None) -> SourceState:
    return msgspec.structs.replace(
        source,
        last_sample_at=at,
        fault=fault,
        fault_at=None if fault is None else at,
        samples=source.samples + 1,
        faults=source.faults + (fault is not None),
    )


def _mark_lost(device: DeviceState | None, fault: SourceFault) -> DeviceState:
    assert fault.key is not None
    if device is None:
        return DeviceState(
            key=fault.key, index=fault.index, lost_reason=fault.reason, lost_since=fault.at
        )
    since = device.lost_since if device.lost_reason is not None else fault.at
    return msgspec.structs.replace(device, lost_reason=fault.reason, lost_since=since)
