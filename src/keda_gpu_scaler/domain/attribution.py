"""Which pod holds which GPU: the kubelet's device IDs joined with NVML's devices.

The NVIDIA device plugin names devices by their NVML UUID: ``GPU-<uuid>`` for a whole GPU,
``MIG-<uuid>`` for a MIG instance (both MIG strategies), and ``<uuid>::<n>`` for the n-th
replica of a time-sliced or MPS-shared device. A replica is the device itself: NVML reads the
device, so every pod sharing it sees the same numbers, and the device counts once.

An ID that names no device NVML reports (another plugin's naming, a GPU that fell off the
bus) is kept apart as unmatched: reported, never guessed.

A device allocated through DRA is joined to NVML by ``domain.dra`` (through the node's
ResourceSlices); once joined it holds its NVML device exactly as a device plugin's ID does,
and one the join could not identify is kept by pod (``NodeView.unidentified``), so that a
trigger over its pod has no value rather than a 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from keda_gpu_scaler.domain.dra import is_joined, is_unidentified
from keda_gpu_scaler.domain.samples import (
    POD_RESOURCES_SOURCE,
    PODS_SOURCE,
    RESOURCE_SLICES_SOURCE,
    DeviceHolder,
    DeviceKey,
    DraDevice,
    PodResourcesReading,
    PodsReading,
    ResourceSlicesReading,
)
from keda_gpu_scaler.domain.snapshot import PodKey, Snapshot, SourceState, stale_limit_s

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


HolderIndex = tuple[
    Mapping[PodKey, tuple[DeviceHolder, ...]],
    Mapping[DeviceKey, tuple[DeviceHolder, ...]],
    Mapping[PodKey, tuple[DraDevice, ...]],
]


def index_holders(
    reading: PodResourcesReading | None, dra: tuple[DraDevice, ...] = ()
) -> HolderIndex:
    """One node's holders by pod, and by the device key each ID names (``<node>/<uuid>``
    on a cluster scaler), and the DRA devices of each pod that the join could not identify.

    ``dra`` is ``reading``'s DRA devices joined (``domain.dra``): a joined one holds its
    NVML device as a device plugin's ID does (``resource`` its driver, ``device_id`` the
    UUID), so a device shared through one claim has every pod on it as a holder. A pod with
    an unidentified one is in the index by pod even when it holds nothing else."""
    if reading is None or not (reading.holders or dra):
        return MappingProxyType({}), MappingProxyType({}), MappingProxyType({})
    prefix = f"{reading.node}/" if reading.node else ""
    by_pod: dict[PodKey, list[DeviceHolder]] = {}
    by_device: dict[DeviceKey, list[DeviceHolder]] = {}
    unidentified: dict[PodKey, list[DraDevice]] = {}
    for holder in (*reading.holders, *(dra_holder(d) for d in dra if is_joined(d))):
        by_pod.setdefault((holder.namespace, holder.pod), []).append(holder)
        by_device.setdefault(DeviceKey(prefix + device_key(holder.device_id)), []).append(holder)
    for device in dra:
        if is_unidentified(device):
            by_pod.setdefault((device.namespace, device.pod), [])
            unidentified.setdefault((device.namespace, device.pod), []).append(device)
    return (
        MappingProxyType({k: tuple(v) for k, v in by_pod.items()}),
        MappingProxyType({k: tuple(v) for k, v in by_device.items()}),
        MappingProxyType({k: tuple(v) for k, v in unidentified.items()}),
    )


def dra_holder(device: DraDevice) -> DeviceHolder:
    """A joined DRA device as the holder of its NVML device."""
    assert device.key is not None
    return DeviceHolder(
        namespace=device.namespace,
        pod=device.pod,
        container=device.container,
        resource=device.driver,
        device_id=device.key,
    )


def attribute(snapshot: Snapshot, *, node: str | None = None) -> Attribution | None:
    """Who holds which device of the snapshot, on every node (or on ``node`` only); None
    without a PodResources answer. Holders of pods that terminated do not count."""
    if node is None:
        candidates = list(snapshot.nodes.values())
    else:
        one = snapshot.nodes.get(node)
        candidates = [] if one is None else [one]
    views = [v for v in candidates if v.attribution is not None]
    if not views:
        return None
    ended = snapshot.pod_index.ended
    by_device: dict[DeviceKey, tuple[DeviceHolder, ...]] = {}
    unmatched: list[DeviceHolder] = []
    for view in views:
        for key, holders in view.by_device.items():
            live = tuple(h for h in holders if (h.namespace, h.pod) not in ended)
            if not live:
                continue
            if key in view.devices:
                by_device[key] = live
            else:
                unmatched.extend(live)
    return Attribution(by_device, tuple(unmatched))


def unavailable_reason(snapshot: Snapshot, now: float) -> str | None:
    """Why pod attribution cannot be used now, or None when it can. On a cluster scaler it
    can while one node's is fresh: the devices of a node whose attribution is stale count
    as missing (``domain.coverage``)."""
    if snapshot.attribution is None and snapshot.on_cluster():
        if now <= snapshot.attributed_until:
            return None
        if snapshot.attributed_until > -math.inf:
            return "pod attribution is stale on every node (no node agent's kubelet answered)"
        return "pod attribution is unavailable: no node agent has sent its kubelet's answer yet"
    return _unavailable(
        snapshot.sources,
        snapshot.attribution,
        POD_RESOURCES_SOURCE,
        now,
        what="pod attribution",
        silent="the kubelet PodResources API has not answered (is --pod-resources-socket "
        "set, and the socket's directory mounted?)",
        stale="the kubelet's last good answer is {age:.0f} s old",
    )


def pods_unavailable_reason(
    snapshot: Snapshot, now: float, namespace: str | None = None
) -> str | None:
    """Why the pod labels (of ``namespace``'s pods, when given) cannot be used now, or None
    when they can. A namespace the pod watch does not cover has pods unknown: never read as
    none (:func:`pods_coverage_reason`)."""
    reason = _unavailable(
        snapshot.sources,
        snapshot.pods,
        PODS_SOURCE,
        now,
        what="pod labels",
        silent="the Kubernetes API has not answered (is --node-name set, and may the "
        "service account list and watch pods?)",
        stale="the Kubernetes API last answered {age:.0f} s ago",
    )
    if reason is None and namespace is not None:
        return pods_coverage_reason(snapshot.pods, namespace)
    return reason


_NAMED_AT_MOST = 10
"""Namespaces a reason lists by name; the rest are counted."""


def pods_coverage_reason(reading: PodsReading | None, namespace: str) -> str | None:
    """Why ``reading`` holds no pods of ``namespace``, or None when it covers it (or there
    is no reading at all, which :func:`pods_unavailable_reason` explains)."""
    if reading is None or reading.namespaces is None or namespace in reading.namespaces:
        return None
    if reading.on_demand:
        return (
            f"pods of namespace {namespace} are not watched yet (the cluster scaler started "
            "watching it when a trigger first named it, and the Kubernetes API has not "
            "listed its pods)"
        )
    listed = reading.namespaces
    names = ",".join(listed[:_NAMED_AT_MOST])
    more = len(listed) - _NAMED_AT_MOST
    if more > 0:
        names += f" and {more} more"
    return f"pods of namespace {namespace} are not watched: not among --pod-namespaces {names}"


def slices_unavailable_reason(
    sources: Mapping[str, SourceState], reading: ResourceSlicesReading | None, now: float
) -> str | None:
    """Why this node's ResourceSlices cannot be used for the DRA join now, or None."""
    return _unavailable(
        sources,
        reading,
        RESOURCE_SLICES_SOURCE,
        now,
        what="this node's ResourceSlices",
        silent="none has been read (is the DRA join on, --dra-join, and may the service "
        "account list and watch resourceslices?)",
        stale="the Kubernetes API last answered {age:.0f} s ago",
    )


def _unavailable(
    sources: Mapping[str, SourceState],
    reading: PodResourcesReading | PodsReading | ResourceSlicesReading | None,
    default_source: str,
    now: float,
    *,
    what: str,
    silent: str,
    stale: str,
) -> str | None:
    source = sources.get(reading.source if reading else default_source)
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
