"""Decisions: ``(trigger spec, snapshot, cooldown entry, now) -> value, activity, explanation``."""

from __future__ import annotations

from dataclasses import dataclass

from keda_gpu_scaler.domain.aggregation import aggregate
from keda_gpu_scaler.domain.catalog import CATALOG
from keda_gpu_scaler.domain.cooldown import CooldownEntry, CooldownOutcome, apply_cooldown
from keda_gpu_scaler.domain.errors import NoData
from keda_gpu_scaler.domain.snapshot import STALE_AFTER_PERIODS, DeviceState, Snapshot
from keda_gpu_scaler.domain.trigger import TriggerSpec


@dataclass(frozen=True, slots=True)
class Measurement:
    value: float
    parts: tuple[tuple[int, float], ...]
    """(GPU index, value) of every device that contributed."""
    unsupported: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    value: float
    """The value to serve: the measurement after scale-down suppression."""
    raw_value: float
    active: bool
    target: float
    activation: float
    explanation: str
    cooldown: CooldownOutcome | None = None


def _select(spec: TriggerSpec, snapshot: Snapshot) -> list[DeviceState]:
    devices = snapshot.ordered_devices()
    if not devices:
        raise NoData("no GPU readings yet")
    if spec.gpu_index < 0:
        return devices
    chosen = [d for d in devices if d.index == spec.gpu_index]
    if not chosen:
        known = ", ".join(str(d.index) for d in devices)
        raise NoData(f"no GPU with gpuIndex {spec.gpu_index} on this node (GPUs: {known})")
    return chosen


def _check_fresh(device: DeviceState, now: float) -> None:
    if device.lost_reason is not None:
        raise NoData(f"GPU {device.index} ({device.key}) is lost: {device.lost_reason}")
    reading = device.reading
    if reading is None:
        raise NoData(f"GPU {device.index} ({device.key}) has no reading yet")
    if device.is_stale(now):
        limit = STALE_AFTER_PERIODS * reading.period_s
        raise NoData(
            f"GPU {device.index} reading is stale: {now - reading.taken_at:.1f} s old "
            f"(limit {limit:g} s, {STALE_AFTER_PERIODS} sample periods)"
        )


def measure(spec: TriggerSpec, snapshot: Snapshot, now: float) -> Measurement:
    """The aggregated value of the trigger's metric; raises :class:`NoData` if there is none."""
    info = CATALOG[spec.metric_type]
    if info.read is None:
        raise NoData(
            f'metricType "{spec.metric_type}" reads the engine at {spec.endpoint}; '
            "engine sampling is not available in this version"
        )
    parts: list[tuple[int, float]] = []
    unsupported: list[int] = []
    for device in _select(spec, snapshot):
        _check_fresh(device, now)
        assert device.reading is not None
        value = info.read(device.reading)
        if value is None:
            unsupported.append(device.index)
        else:
            parts.append((device.index, value))
    if not parts:
        gpus = ", ".join(str(i) for i in unsupported)
        raise NoData(f"{spec.metric_type} is not supported on GPU {gpus} (no reading, not 0)")
    value = aggregate(spec.aggregation, [v for _, v in parts])
    return Measurement(value, tuple(parts), tuple(unsupported))


def decide(
    spec: TriggerSpec, snapshot: Snapshot, entry: CooldownEntry | None, now: float
) -> Decision:
    """Measure, apply scale-down suppression, and judge activity (value > activation)."""
    measured = measure(spec, snapshot, now)
    outcome = apply_cooldown(entry, measured.value, cooldown_s=spec.cooldown_s, now=now)
    active = outcome.value > spec.activation
    return Decision(
        value=outcome.value,
        raw_value=measured.value,
        active=active,
        target=spec.target,
        activation=spec.activation,
        explanation=_explain(spec, measured, outcome, active),
        cooldown=outcome,
    )


def _explain(
    spec: TriggerSpec, measured: Measurement, outcome: CooldownOutcome, active: bool
) -> str:
    parts = ", ".join(f"GPU {i}={v:g}" for i, v in measured.parts)
    text = f"{spec.metric_type} {spec.aggregation} of [{parts}] = {measured.value:g}"
    if measured.unsupported:
        text += f" (not supported on GPU {', '.join(map(str, measured.unsupported))})"
    if outcome.held:
        text += f"; cooldown holds {outcome.value:g} for {outcome.remaining_s:.0f} s more"
    verdict = "active" if active else "inactive"
    relation = ">" if active else "<="
    text += f"; {outcome.value:g} {relation} activation {spec.activation:g}: {verdict}"
    return text + f"; target {spec.target:g}"
