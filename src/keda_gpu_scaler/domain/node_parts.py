"""One node's part of a measurement: the readings of the devices a trigger selects there.

A measurement over many nodes is made node by node (:class:`NodePart`): a node whose view is
the same object as at the spec's last measurement, and whose readings are still fresh, lends
its part unchanged, so only the nodes that changed are read again. A selected device with no
usable reading is missing; whether the others may still be answered is the coverage rule
(:func:`coverage_of`, ``domain.coverage``). A device of a ``podSelector``'s scope that other
pods hold too is measured by the selected pods' processes (``domain.process_share``); one
without such a share is no partial view but a reason the whole measurement has no value
(``unshared``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from keda_gpu_scaler.domain.catalog import MetricInfo
from keda_gpu_scaler.domain.coverage import Coverage, refusal
from keda_gpu_scaler.domain.errors import NoData
from keda_gpu_scaler.domain.history import History
from keda_gpu_scaler.domain.process_share import Shares, process_share
from keda_gpu_scaler.domain.samples import DeviceKey
from keda_gpu_scaler.domain.snapshot import (
    STALE_AFTER_PERIODS,
    DeviceState,
    NodeView,
    stale_limit_s,
)
from keda_gpu_scaler.domain.trigger import TriggerSpec
from keda_gpu_scaler.domain.windows import Windowed, window_value


@dataclass(frozen=True, slots=True)
class NodePart:
    """What one node's selected devices contributed to a measurement: kept for the next
    one while the node's view is the same object (a node that sent nothing new) and its
    readings are fresh, so a measurement over many nodes redoes only the nodes that
    changed."""

    view: NodeView
    keys: tuple[DeviceKey, ...]
    attributed: bool
    """Its attribution was fresh (or not needed): a stale one makes its devices missing."""
    parts: tuple[tuple[int, float], ...]
    labels: tuple[str, ...]
    unsupported: tuple[DeviceState, ...]
    missing: tuple[str, ...]
    counts: tuple[int, ...]
    until: float
    """When this part must be redone at the latest (a reading goes stale, a window moves)."""
    shares: Shares | None = None
    """The scope's shared devices it was measured with (the same object while it holds)."""
    unshared: tuple[str, ...] = ()
    """Shared devices with no share of the workload's own, each with why."""


class Rescope(Exception):
    """A device the cached pod scope names is gone from its node: select afresh."""


def node_part(
    spec: TriggerSpec,
    info: MetricInfo,
    view: NodeView,
    keys: tuple[DeviceKey, ...],
    attributed: bool,
    holders: Mapping[DeviceKey, str] | None,
    now: float,
    shares: Shares | None = None,
) -> NodePart:
    devices = view.devices
    fresh: list[DeviceState] = []
    missing: list[str] = []
    aging = False
    for key in keys:
        device = devices.get(key)
        if device is None:
            raise Rescope(key)
        why = _why_missing(device, now)
        if why is None and not attributed:
            why = f"{device.label}: the attribution of node {view.name} is stale"
        if why is None:
            fresh.append(device)
        else:
            missing.append(why)
            aging = aging or (not device.is_lost() and device.reading is not None)
    until = min((_fresh_until(d) for d in fresh), default=math.inf)
    if aging:
        until = now  # "stale: 4.0 s old" is true now only: redone on the next call
    parts: list[tuple[int, float]] = []
    labels: list[str] = []
    unsupported: list[DeviceState] = []
    counts: list[int] = []
    unshared: list[str] = []
    for device in _counted_once(info.per_parent, fresh):
        assert device.reading is not None
        assert info.read is not None
        if shares is not None and device.key in shares.others:
            share = _share(spec, device, shares, now)
            if isinstance(share, str):
                unshared.append(share)
                continue
            parts.append((device.index, share[0]))
            until = min(until, share[1])
            assert holders is not None  # a scope's shares come with its holders
            labels.append(f"{device.label} ({holders[device.key]}; own processes)")
            continue
        value = info.read(device.reading)
        if value is None:
            unsupported.append(device)
            continue
        # A whole-GPU reading seen through an instance belongs to the GPU.
        label = _gpu_label(device) if info.per_parent else device.label
        if spec.window_s:
            window = read_window(spec, device.history, now, label)
            value, until = window.value, min(until, window.fresh_until)
            counts.append(window.readings)
        parts.append((device.index, value))
        labels.append(label if holders is None else f"{label} ({holders[device.key]})")
    return NodePart(
        view,
        keys,
        attributed,
        tuple(parts),
        tuple(labels),
        tuple(unsupported),
        tuple(missing),
        tuple(counts),
        until,
        shares,
        tuple(unshared),
    )


def _share(
    spec: TriggerSpec, device: DeviceState, shares: Shares, now: float
) -> tuple[float, float] | str:
    """(value, fresh until) of the workload's own processes on a shared device, or why
    there is none, in words naming the device."""
    if spec.window_s:
        why = "windowSeconds does not apply to a share of its processes (no history is kept)"
    else:
        share = process_share(spec.metric_type, device, shares, now)
        if not isinstance(share, str):
            return share.value, share.fresh_until
        why = share
    return (
        f"{device.label} is shared with {shares.others[device.key]}, and {why}; "
        "sharedDevices: whole measures the whole device, its neighbours' load included"
    )


def _why_missing(device: DeviceState, now: float) -> str | None:
    """Why a device has no usable reading now, or None when it has one."""
    if device.lost_reason is not None:
        return f"{device.label} ({device.key}) is lost: {device.lost_reason}"
    reading = device.reading
    if reading is None:
        return f"{device.label} ({device.key}) has no reading yet"
    if device.is_stale(now):
        limit = stale_limit_s(reading.period_s)
        return (
            f"{device.label} reading is stale: {now - reading.taken_at:.1f} s old "
            f"(limit {limit:g} s: {STALE_AFTER_PERIODS} sample periods, 1 s at least)"
        )
    return None


def _counted_once(per_parent: bool, devices: list[DeviceState]) -> list[DeviceState]:
    """Instances carry copies of whole-GPU readings: keep one instance per GPU for those
    (``devices`` are of one node: GPU 0 of two nodes are two GPUs)."""
    if not per_parent:
        return devices
    seen: set[int] = set()
    kept = []
    for device in devices:
        if is_instance(device):
            if device.index in seen:
                continue
            seen.add(device.index)
        kept.append(device)
    return kept


def _gpu_label(device: DeviceState) -> str:
    """The physical GPU of a device (a MIG instance's parent), with its node on a cluster."""
    node = device.reading.node if device.reading is not None else ""
    return f"{node} GPU {device.index}" if node else f"GPU {device.index}"


def _fresh_until(device: DeviceState) -> float:
    reading = device.reading
    assert reading is not None  # checked fresh
    return reading.taken_at + stale_limit_s(reading.period_s)


def coverage_of(spec: TriggerSpec, cluster: bool, parts: Iterable[NodePart]) -> Coverage | None:
    """On a node agent every selected device must be fresh; on a cluster scaler a partial
    view is answered where the coverage rule allows it (None: nothing is missing). A shared
    device with no share of the workload's own is never left out of a partial view: it
    leaves the measurement without a value."""
    parts = list(parts)
    unshared = [u for p in parts for u in p.unshared]
    if unshared:
        more = f" (and {len(unshared) - 1} more such device(s))" if len(unshared) > 1 else ""
        raise NoData(unshared[0] + more)
    missing = tuple(m for p in parts for m in p.missing)
    if not missing:
        return None
    if not cluster:
        raise NoData(missing[0])
    coverage = Coverage(sum(len(p.keys) for p in parts), missing)
    reason = refusal(spec.aggregation, coverage, spec.min_coverage)
    if reason is not None:
        raise NoData(reason)
    return coverage


def read_window(spec: TriggerSpec, history: History, now: float, who: str) -> Windowed:
    """The trigger's window over one device's (or endpoint's) history, named ``who``."""
    return window_value(
        history, spec.metric_type, spec.window_aggregation, spec.window_s, now, who=who
    )


def unsupported_message(spec: TriggerSpec, needs: str | None, devices: list[DeviceState]) -> str:
    """Why no selected device gave a value: the metric is not supported on any of them."""
    gpus = [str(d.index) for d in devices if not is_instance(d)]
    instances = [d.label.removeprefix("MIG ") for d in devices if is_instance(d)]
    groups = [f"GPU {', '.join(gpus)}"] if gpus else []
    groups += [f"MIG {', '.join(instances)}"] if instances else []
    text = f"{spec.metric_type} is not supported on {' and '.join(groups)} (no reading, not 0)"
    return text if needs is None else f"{text}: it needs {needs}"


def is_instance(device: DeviceState) -> bool:
    """A MIG instance (whose whole-GPU readings are copies of its parent's)."""
    return device.reading is not None and device.reading.is_mig_instance()
