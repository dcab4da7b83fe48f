"""Which devices a trigger selects by ``gpuIndex``, ``migInstance`` and ``nodeName``, node by
node, and what the selection read (:class:`Basis`), so that a later snapshot can tell whether
it still holds. A ``podSelector`` selects through the pods instead (``domain.pod_scope``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from keda_gpu_scaler.domain.errors import NoData
from keda_gpu_scaler.domain.node_parts import NodePart, is_instance
from keda_gpu_scaler.domain.samples import DeviceKey, PodsReading
from keda_gpu_scaler.domain.snapshot import (
    DeviceState,
    NodeView,
    PodIndex,
    PodKey,
    Snapshot,
    by_index,
)
from keda_gpu_scaler.domain.trigger import TriggerSpec, check_cluster_trigger

Group = tuple[str, tuple[DeviceKey, ...]]
"""A node and the keys of its selected devices, by NVML index."""


@dataclass(frozen=True, slots=True)
class Basis:
    """What a measurement read, so that a later snapshot can tell it still holds: the node
    views (the same objects while a node sends nothing new), and for ``podSelector`` the pod
    index and the index of pods by node."""

    views: tuple[tuple[str, NodeView | None], ...]
    node_count: int | None = None
    """Set when every node was read: a node that joins changes the answer."""
    pod_index: PodIndex | None = None
    pod_nodes: Mapping[PodKey, frozenset[str]] | None = None
    pods: PodsReading | None = None
    """The pod watch's reading it read (how fresh the labels are, which namespaces)."""
    attributed_until: float | None = None
    """On a cluster scaler, the snapshot's: pod attribution is usable while one node's is
    fresh, and an earlier end (nodes gone) may make it unusable."""

    def holds(self, snapshot: Snapshot) -> bool:
        if self.node_count is not None and len(snapshot.nodes) != self.node_count:
            return False
        if self.attributed_until is not None and snapshot.attributed_until < self.attributed_until:
            return False
        if self.pods is not None and snapshot.pods is not self.pods:
            return False
        if self.pod_index is not None and snapshot.pod_index is not self.pod_index:
            return False
        if self.pod_nodes is not None and snapshot.pod_nodes is not self.pod_nodes:
            return False
        nodes = snapshot.nodes
        return all(nodes.get(name) is view for name, view in self.views)


def _is_mig_parent(device: DeviceState) -> bool:
    return device.reading is not None and device.reading.mig_enabled


def select_devices(
    spec: TriggerSpec, snapshot: Snapshot, known: Mapping[str, NodePart]
) -> tuple[tuple[Group, ...], Basis]:
    """gpuIndex -1: every GPU, a MIG-enabled GPU by its instances; N: physical GPU N; on a
    cluster scaler, node by node, and with ``nodeName`` of that node only (its view, not the
    whole cluster). A node whose view is that of its ``known`` part keeps that selection."""
    if not snapshot.device_count:
        raise NoData("no GPU readings yet")
    if snapshot.on_cluster():
        check_cluster_trigger(spec)
    if spec.node_name is None:
        basis = Basis(tuple(snapshot.nodes.items()), node_count=len(snapshot.nodes))
        views = sorted(snapshot.nodes.items())
    else:
        view = snapshot.nodes.get(spec.node_name)
        basis = Basis(((spec.node_name, view),))
        if view is None or not view.devices:
            nodes = sorted(n for n, v in snapshot.nodes.items() if n and v.devices)
            raise NoData(
                f"no GPU of node {spec.node_name} reported (nodes: {', '.join(nodes) or 'none'})"
            )
        views = [(spec.node_name, view)]
    groups = []
    for name, one in views:
        part = known.get(name)
        if part is not None and part.view is one:
            groups.append((name, part.keys))
            continue
        chosen = _chosen(spec, sorted(one.devices.values(), key=by_index))
        if chosen:
            groups.append((name, tuple(d.key for d in chosen)))
    if not groups:
        devices = [d for _, v in views for d in v.devices.values()]
        raise NoData(_nothing_selected(spec, sorted(devices, key=by_index)))
    return tuple(groups), basis


def _chosen(spec: TriggerSpec, devices: list[DeviceState]) -> list[DeviceState]:
    """The devices of one node the trigger selects, by NVML index."""
    if spec.mig_instance is not None:
        return [
            d for d in devices if d.reading is not None and spec.mig_instance.matches(d.reading)
        ]
    if spec.gpu_index < 0:
        return [d for d in devices if not _is_mig_parent(d)]
    return [d for d in devices if d.index == spec.gpu_index and not is_instance(d)]


def _nothing_selected(spec: TriggerSpec, devices: list[DeviceState]) -> str:
    """Why no device of ``devices`` (every node's read, by index) is selected."""
    if spec.mig_instance is not None:
        known = ", ".join(f"{d.label} ({d.key})" for d in devices if is_instance(d))
        return (
            f"no MIG instance {spec.mig_instance} on this node (MIG instances: {known or 'none'})"
        )
    if spec.gpu_index < 0:
        return "MIG is enabled on every GPU of this node and no MIG instance exists"
    known = ", ".join(sorted({str(d.index) for d in devices}, key=int))
    return f"no GPU with gpuIndex {spec.gpu_index} on this node (GPUs: {known})"
