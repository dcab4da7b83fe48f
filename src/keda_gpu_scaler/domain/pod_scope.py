"""A ``podSelector``'s scope: the devices that the matching pods of one namespace hold, node
by node, and who holds each (joined by ``domain.attribution``).

A scope is lent to the spec's next measurement while no holder and no pod changed
(:meth:`PodScope.holds`); while attribution or the pod labels are unavailable it is
unavailable too, never 0. It names the devices that pods outside the selection hold too
(:class:`~keda_gpu_scaler.domain.process_share.Shares`), which are measured by process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from keda_gpu_scaler.domain.attribution import (
    device_key,
    pods_unavailable_reason,
    unavailable_reason,
)
from keda_gpu_scaler.domain.attribution import (
    fresh_until as attribution_fresh_until,
)
from keda_gpu_scaler.domain.device_selection import Basis, Group
from keda_gpu_scaler.domain.errors import NoData
from keda_gpu_scaler.domain.process_share import NO_SHARES, Shares
from keda_gpu_scaler.domain.samples import DeviceHolder, DeviceKey, DraDevice, PodInfo
from keda_gpu_scaler.domain.selector import LabelSelector
from keda_gpu_scaler.domain.snapshot import (
    DeviceState,
    NodeView,
    Snapshot,
    by_index,
    node_of,
    stale_limit_s,
)
from keda_gpu_scaler.domain.trigger import TriggerSpec


def attribution_fresh(view: NodeView | None, now: float) -> bool:
    """Whether the node's kubelet attribution (who holds which device) is fresh now."""
    a = None if view is None else view.attribution
    return a is not None and now - a.taken_at <= stale_limit_s(a.period_s)


@dataclass(frozen=True, slots=True)
class PodScope:
    """Which devices of which nodes a ``podSelector`` selects, and who holds each."""

    groups: tuple[Group, ...]
    holders: Mapping[DeviceKey, str]
    """Who holds each device, in words: ``vllm-0``, ``vllm-0, vllm-1; shared``."""
    text: str
    basis: Basis
    indexes: tuple[tuple[str, object], ...]
    """Each node's index of holders by pod it was read from: while these, the pod index
    and the index of pods by node are the same objects, so is the scope."""
    shares: Shares = NO_SHARES
    """The devices other pods hold too, and the selected pods' UIDs."""

    def holds(self, snapshot: Snapshot) -> bool:
        if snapshot.pod_index is not self.basis.pod_index:
            return False
        if snapshot.pod_nodes is not self.basis.pod_nodes:
            return False
        nodes = snapshot.nodes
        for name, by_pod in self.indexes:
            view = nodes.get(name)
            if view is None or view.by_pod is not by_pod:
                return False
        return True


def scope_until(snapshot: Snapshot, pods: PodScope, now: float) -> float:
    """When the pod labels, the attribution of a node in scope, or (on a cluster scaler)
    the freshest attribution of any node, go stale."""
    until = attribution_fresh_until(snapshot)
    if snapshot.attribution is None and snapshot.on_cluster():
        until = min(until, snapshot.attributed_until)
    for name, _ in pods.groups:
        view = snapshot.nodes[name]
        a = view.attribution
        if name and a is not None and attribution_fresh(view, now):
            until = min(until, a.taken_at + stale_limit_s(a.period_s))
    return until


def select_pods(
    spec: TriggerSpec, snapshot: Snapshot, now: float, previous: PodScope | None
) -> PodScope:
    """The devices held by the pods ``podSelector`` matches in ``podNamespace``, each once.

    Reads the pods of that namespace and, through the index of pods by node, the views of
    the nodes they hold devices on: nothing else of the cluster; and not even that while
    ``previous`` still holds. Raises :class:`NoData` when attribution or pod labels are
    unavailable (never 0), or when a matching pod holds a device ID that names no GPU NVML
    reports (never guessed)."""
    selector, namespace = spec.pod_selector, spec.pod_namespace
    assert selector is not None  # parse_trigger sets both
    assert namespace is not None
    reason = unavailable_reason(snapshot, now) or pods_unavailable_reason(snapshot, now, namespace)
    if reason is not None:
        raise NoData(reason)
    if previous is not None and previous.holds(snapshot):
        # The same devices of the same nodes: only what the basis names is newer.
        current = tuple((name, snapshot.nodes[name]) for name, _ in previous.basis.views)
        basis = replace(
            previous.basis,
            views=current,
            pods=snapshot.pods,
            attributed_until=snapshot.attributed_until,
        )
        return replace(previous, basis=basis)
    index = snapshot.pod_index
    selected = sorted(
        (p for p in index.by_namespace.get(namespace, ()) if _selects(selector, p)),
        key=lambda p: (p.namespace, p.name),
    )
    matching = [(p.namespace, p.name) for p in selected]
    chosen: dict[DeviceKey, tuple[DeviceState, NodeView]] = {}
    unmatched: list[DeviceHolder] = []
    unidentified: list[DraDevice] = []
    views: dict[str, NodeView] = {}
    for pod in matching:
        for name in sorted(snapshot.pod_nodes.get(pod, ())):
            view = views[name] = snapshot.nodes[name]
            unidentified.extend(view.unidentified.get(pod, ()))
            prefix = f"{name}/" if name else ""
            for holder in view.by_pod[pod]:
                key = DeviceKey(prefix + device_key(holder.device_id))
                device = view.devices.get(key)
                if device is None:
                    unmatched.append(holder)
                else:
                    chosen[key] = (device, view)
    basis = Basis(
        tuple(views.items()),
        pod_index=index,
        pod_nodes=snapshot.pod_nodes,
        pods=snapshot.pods,
        attributed_until=snapshot.attributed_until,
    )
    indexes = tuple((name, view.by_pod) for name, view in views.items())
    if unidentified:
        raise NoData(_unidentified(unidentified))
    if unmatched:
        held = ", ".join(f"{h.pod} holds {h.resource} {h.device_id}" for h in unmatched)
        raise NoData(f"{held}: no GPU that NVML reports on this node has that ID (not guessed)")
    whose = f"pods {selector} in {namespace}"
    if not chosen:
        if matching:
            names = ", ".join(name for _, name in matching)
            text = f"{whose} ({names}) hold no GPU on this node"
        else:
            text = f"no pod {selector} in {namespace} holds a GPU on this node"
        text += " (a workload with no pods uses no GPU)"
        return PodScope((), MappingProxyType({}), text, basis, indexes)
    chosen_pods = set(matching)
    holders: dict[DeviceKey, str] = {}
    shared: dict[DeviceKey, str] = {}
    for key, (_, view) in chosen.items():
        pods_on = list(
            dict.fromkeys(
                (h.namespace, h.pod)
                for h in view.by_device.get(key, ())
                if (h.namespace, h.pod) not in index.ended
            )
        )
        text = ", ".join(name for ns, name in pods_on if (ns, name) in chosen_pods)
        others = [f"{ns}/{name}" for ns, name in pods_on if (ns, name) not in chosen_pods]
        if len(pods_on) > 1:
            text += "; shared" + (f" with {', '.join(others)}" if others else "")
        if others:
            shared[key] = ", ".join(others)
        holders[key] = text
    groups = _groups([d for d, _ in chosen.values()])
    shares = Shares(
        MappingProxyType(shared),
        frozenset(p.uid for p in selected if p.uid),
        tuple(f"{p.namespace}/{p.name}" for p in selected if not p.uid),
    )
    text = f"the GPUs of {whose}"
    return PodScope(groups, MappingProxyType(holders), text, basis, indexes, shares)


def _selects(selector: LabelSelector, pod: PodInfo) -> bool:
    return not pod.terminated() and selector.matches(pod.labels)


_NAMED_AT_MOST = 3
"""Unidentified DRA devices a reason names; the rest are counted."""


def _unidentified(devices: list[DraDevice]) -> str:
    """Why a scope with DRA devices the join could not identify has no value: each named
    with its pod, claim and the join's words."""
    named = [
        f"{d.namespace}/{d.pod} holds DRA device {d.name} of claim {d.claim}, not identified "
        f"({d.outcome}: {d.detail})"
        for d in devices[:_NAMED_AT_MOST]
    ]
    more = len(devices) - _NAMED_AT_MOST
    if more > 0:
        named.append(f"and {more} more")
    return "; ".join(named) + " (a GPU it holds is never counted as none)"


def _groups(devices: list[DeviceState]) -> tuple[Group, ...]:
    """Selected devices by node (in node order), each node's by NVML index."""
    by_node: dict[str, list[DeviceKey]] = {}
    for device in sorted(devices, key=by_index):
        # By its key, not its reading: a device lost before it was read has none.
        by_node.setdefault(node_of(device.key), []).append(device.key)
    return tuple((node, tuple(keys)) for node, keys in sorted(by_node.items()))
