"""Which pod holds which GPU: the kubelet's device IDs joined with NVML's devices.

The NVIDIA device plugin names devices by their NVML UUID: ``GPU-<uuid>`` for a whole GPU,
``MIG-<uuid>`` for a MIG instance (both MIG strategies), and ``<uuid>::<n>`` for the n-th
replica of a time-sliced or MPS-shared device. A replica is the device itself: NVML reads the
device, so every pod sharing it sees the same numbers, and the device counts once.

An ID that names no device NVML reports (another plugin's naming, a GPU that fell off the
bus) is kept apart as unmatched: reported, never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from keda_gpu_scaler.domain.samples import (
    POD_RESOURCES_SOURCE,
    PODS_SOURCE,
    DeviceHolder,
    DeviceKey,
    PodResourcesReading,
    PodsReading,
)
from keda_gpu_scaler.domain.snapshot import DeviceState, Snapshot, stale_limit_s

REPLICA_SEPARATOR = "::"


def device_key(device_id: str) -> DeviceKey:
    """The NVML key a device ID names: the ID without a ``::<n>`` replica suffix."""
    return DeviceKey(device_id.split(REPLICA_SEPARATOR, 1)[0])


@dataclass(frozen=True, slots=True)
class Attribution:
    """The holders of every device NVML knows, and the IDs it does not."""

    by_device: Mapping[DeviceKey, tuple[DeviceHolder, ...]]
    """Every live holder of each device, in the kubelet's order."""
    unmatched: tuple[DeviceHolder, ...]
    """Holders of a device ID that matches no device in the snapshot."""

    def holders(self, key: DeviceKey) -> tuple[DeviceHolder, ...]:
        return self.by_device.get(key, ())


def terminated(pods: PodsReading | None) -> frozenset[tuple[str, str]]:
    """(namespace, name) of the pods that have terminated, as far as the pod watch knows."""
    if pods is None:
        return frozenset()
    return frozenset((p.namespace, p.name) for p in pods.pods if p.terminated())


def live_holders(
    attribution: PodResourcesReading, ended: frozenset[tuple[str, str]]
) -> Iterable[DeviceHolder]:
    """The holders of pods that have not ``ended``."""
    if not ended:
        return attribution.holders
    return (h for h in attribution.holders if (h.namespace, h.pod) not in ended)


def attribute(snapshot: Snapshot) -> Attribution | None:
    """Who holds which device of the snapshot; None without a PodResources answer.

    On a cluster scaler each node agent's answer names its node, and its device IDs name
    the keys ``<node>/<uuid>``."""
    readings = [r for r in (snapshot.attribution, *snapshot.node_attributions.values()) if r]
    if not readings:
        return None
    by_device: dict[DeviceKey, list[DeviceHolder]] = {}
    unmatched: list[DeviceHolder] = []
    ended = terminated(snapshot.pods)  # once, not once per node
    for reading in readings:
        prefix = f"{reading.node}/" if reading.node else ""
        for holder in live_holders(reading, ended):
            key = DeviceKey(prefix + device_key(holder.device_id))
            if key in snapshot.devices:
                by_device.setdefault(key, []).append(holder)
            else:
                unmatched.append(holder)
    return Attribution({k: tuple(v) for k, v in by_device.items()}, tuple(unmatched))


def unavailable_reason(snapshot: Snapshot, now: float) -> str | None:
    """Why pod attribution cannot be used now, or None when it can. On a cluster scaler it
    can while one node's is fresh: the devices of a node whose attribution is stale count
    as missing (``domain.coverage``)."""
    if snapshot.attribution is None and snapshot.node_attributions:
        if any(
            now - a.taken_at <= stale_limit_s(a.period_s)
            for a in snapshot.node_attributions.values()
        ):
            return None
        return "pod attribution is stale on every node (no node agent's kubelet answered)"
    return _unavailable(
        snapshot,
        snapshot.attribution,
        POD_RESOURCES_SOURCE,
        now,
        what="pod attribution",
        silent="the kubelet PodResources API has not answered (is --pod-resources-socket "
        "set, and the socket's directory mounted?)",
        stale="the kubelet's last good answer is {age:.0f} s old",
    )


def pods_unavailable_reason(snapshot: Snapshot, now: float) -> str | None:
    """Why the pod labels cannot be used now, or None when they can."""
    return _unavailable(
        snapshot,
        snapshot.pods,
        PODS_SOURCE,
        now,
        what="pod labels",
        silent="the Kubernetes API has not answered (is --node-name set, and may the "
        "service account list and watch pods?)",
        stale="the Kubernetes API last answered {age:.0f} s ago",
    )


def _unavailable(
    snapshot: Snapshot,
    reading: PodResourcesReading | PodsReading | None,
    default_source: str,
    now: float,
    *,
    what: str,
    silent: str,
    stale: str,
) -> str | None:
    source = snapshot.sources.get(reading.source if reading else default_source)
    fault = f": {source.fault}" if source is not None and source.fault else ""
    verb = "are" if what.endswith("s") else "is"
    if reading is None:
        return f"{what} {verb} unavailable" + (fault or f": {silent}")
    age = now - reading.taken_at
    limit = stale_limit_s(reading.period_s)
    if age <= limit:
        return None
    return f"{what} {verb} stale: {stale.format(age=age)} (limit {limit:g} s){fault}"


def fresh_until(snapshot: Snapshot) -> float:
    """When the attribution or the pod labels in use go stale, whichever is first."""
    ends = [
        r.taken_at + stale_limit_s(r.period_s)
        for r in (snapshot.attribution, snapshot.pods)
        if r is not None
    ]
    return min(ends, default=float("inf"))


def devices_of(
    attribution: Attribution, pods: set[tuple[str, str]], devices: Mapping[DeviceKey, DeviceState]
) -> tuple[list[DeviceState], list[DeviceHolder]]:
    """The devices held by ``pods`` (namespace, name), each once, by NVML index; and the
    holders among those pods of IDs that match no device."""
    chosen = [
        devices[key]
        for key, holders in attribution.by_device.items()
        if any((h.namespace, h.pod) in pods for h in holders)
    ]
    chosen.sort(key=lambda d: (d.index, d.key))
    lost = [h for h in attribution.unmatched if (h.namespace, h.pod) in pods]
    return chosen, lost
