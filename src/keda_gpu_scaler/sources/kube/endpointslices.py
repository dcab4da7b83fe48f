"""The EndpointSlices of a Service, sans-I/O: what they say, and the agents they list.

``discovery.k8s.io/v1`` EndpointSlices are what a Service's endpoints are made of: the
EndpointSlice controller writes one or more per Service (labelled
``kubernetes.io/service-name=<service>``, at most 100 endpoints each by default, one
address family each), so a Service is the merge of all its slices::

    {"kind": "EndpointSlice", "addressType": "IPv4",
     "metadata": {"namespace": "gpu", "name": "agents-x7k2p", "resourceVersion": "931",
                  "labels": {"kubernetes.io/service-name": "agents"}},
     "ports": [{"name": "grpc", "port": 6000, "protocol": "TCP"}],
     "endpoints": [{"addresses": ["10.0.3.17"], "nodeName": "gpu-node-3",
                    "targetRef": {"kind": "Pod", "namespace": "gpu", "name": "agent-q8v4d"},
                    "conditions": {"ready": true, "serving": true, "terminating": false}}]}

What each endpoint becomes (:func:`agent_targets`), one target per address:

- ``conditions.ready``: null counts as ready (the API's documented meaning of a nil
  ``ready``); ``terminating``: null counts as not terminating. A target is linkable
  (``AgentTarget.ready``) when the endpoint is ready and not terminating: a terminating
  agent is going away, even while it still serves (``serving``), so it is listed, never
  linked; its node's next agent is linked once it is ready.
- ``targetRef`` names the pod (when it is a Pod), ``nodeName`` the node.
- The port is resolved per slice, from the slice's ``ports`` (TCP only): by name, the port
  with that name; by number, that number when the slice lists it, lists a port with no
  number ("all ports"), or lists no ports at all. A slice that does not have the port
  contributes nothing; when no slice with endpoints has it, the answer says so
  (``problem``), naming the ports the slices do have.
- The same address in two slices (an endpoint moving between slices, which the API allows
  for a moment) is one target: a ready copy wins.

Targets are sorted by node, pod, address, then port.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from keda_gpu_scaler.domain.samples import AgentTarget
from keda_gpu_scaler.sources.kube.listwatch import Resource
from keda_gpu_scaler.sources.kube.wire import Codec

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
GROUP_VERSION = "discovery.k8s.io/v1"


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    addresses: tuple[str, ...]
    ready: bool
    terminating: bool
    node: str = ""
    pod: str = ""

    def is_linkable(self) -> bool:
        return self.ready and not self.terminating


@dataclass(frozen=True, slots=True)
class SlicePort:
    name: str
    port: int | None
    """None: all ports (the API's nil port)."""
    protocol: str = "TCP"


@dataclass(frozen=True, slots=True)
class EndpointSliceInfo:
    """One EndpointSlice, as much of it as discovery reads."""

    namespace: str
    name: str
    endpoints: tuple[SliceEndpoint, ...] = ()
    ports: tuple[SlicePort, ...] = ()

    def port_for(self, port: int | str) -> int | None:
        """The port number ``port`` (a name or a number) means in this slice, if any."""
        tcp = [p for p in self.ports if p.protocol == "TCP"]
        if isinstance(port, str):
            return next((p.port for p in tcp if p.name == port and p.port is not None), None)
        if not self.ports or any(p.port in (port, None) for p in tcp):
            return port
        return None


@dataclass(frozen=True, slots=True)
class SliceTargets:
    """What the slices of a Service list: the targets, and why there are none, if that is
    a misconfiguration (the port is on none of the slices)."""

    targets: tuple[AgentTarget, ...]
    problem: str | None = None


def endpoint_slices(namespace: str, service: str) -> Resource[EndpointSliceInfo]:
    """The EndpointSlices of ``namespace/service``, to list and watch."""
    return Resource(
        version=GROUP_VERSION,
        path=f"namespaces/{namespace}/endpointslices",
        selector=("labelSelector", f"{SERVICE_NAME_LABEL}={service}"),
        codec=SLICE_CODEC,
        key=_slice_key,
        title="EndpointSlice watch",
    )


def agent_targets(
    slices: Iterable[EndpointSliceInfo], port: int | str, *, service: str
) -> SliceTargets:
    """Every address of every endpoint of ``slices`` on ``port``, merged; see the module
    docstring. ``service`` (``namespace/name``) names the Service in ``problem``."""
    found: dict[tuple[str, int], AgentTarget] = {}
    with_endpoints = 0
    resolved = 0
    for eps in slices:
        if not eps.endpoints:
            continue
        with_endpoints += 1
        number = eps.port_for(port)
        if number is None:
            continue
        resolved += 1
        for endpoint in eps.endpoints:
            for address in endpoint.addresses:
                target = AgentTarget(
                    host=address,
                    port=number,
                    pod=endpoint.pod,
                    node=endpoint.node,
                    ready=endpoint.is_linkable(),
                )
                kept = found.get((address, number))
                if kept is None or (target.ready and not kept.ready):
                    found[(address, number)] = target
    targets = tuple(sorted(found.values(), key=_target_order))
    if with_endpoints and not resolved:
        return SliceTargets(targets, _no_such_port(slices, port, service))
    return SliceTargets(targets)


def _no_such_port(slices: Iterable[EndpointSliceInfo], port: int | str, service: str) -> str:
    wanted = f"TCP port named {port!r}" if isinstance(port, str) else f"TCP port {port}"
    listed = sorted({_port_text(p) for eps in slices for p in eps.ports if p.protocol == "TCP"})
    have = f"they list {', '.join(listed)}" if listed else "they list no TCP port"
    return f"the EndpointSlices of {service} have no {wanted} ({have})"


def _port_text(port: SlicePort) -> str:
    number = "any" if port.port is None else str(port.port)
    return f"{port.name} {number}" if port.name else number


def _target_order(target: AgentTarget) -> tuple[str, str, tuple[int, bytes], int]:
    return (target.node, target.pod, host_order(target.host), target.port)


def host_order(host: str) -> tuple[int, bytes]:
    """IPv4 addresses in numeric order, then IPv6, then names."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return (9, host.encode())
    return (address.version, address.packed)


def _slice_key(eps: EndpointSliceInfo) -> tuple[str, str]:
    return (eps.namespace, eps.name)


# -- the wire format -----------------------------------------------------------------


class _Meta(msgspec.Struct, rename="camel"):
    namespace: str
    name: str
    resource_version: str = ""


class _Conditions(msgspec.Struct):
    ready: bool | None = None
    terminating: bool | None = None


class _TargetRef(msgspec.Struct):
    kind: str = ""
    name: str = ""


class _Endpoint(msgspec.Struct, rename="camel"):
    addresses: list[str]
    conditions: _Conditions | None = None
    node_name: str | None = None
    target_ref: _TargetRef | None = None


class _Port(msgspec.Struct):
    name: str | None = None
    port: int | None = None
    protocol: str | None = None


class _Slice(msgspec.Struct, rename="camel"):
    metadata: _Meta
    endpoints: list[_Endpoint] | None = None
    ports: list[_Port] | None = None


def _endpoint(endpoint: _Endpoint) -> SliceEndpoint:
    conditions = endpoint.conditions or _Conditions()
    ref = endpoint.target_ref
    return SliceEndpoint(
        addresses=tuple(endpoint.addresses),
        ready=conditions.ready is not False,
        terminating=conditions.terminating is True,
        node=endpoint.node_name or "",
        pod=ref.name if ref is not None and ref.kind in ("Pod", "") else "",
    )


def _info(eps: _Slice) -> EndpointSliceInfo:
    return EndpointSliceInfo(
        namespace=eps.metadata.namespace,
        name=eps.metadata.name,
        endpoints=tuple(_endpoint(endpoint) for endpoint in eps.endpoints or ()),
        ports=tuple(
            SlicePort(name=p.name or "", port=p.port, protocol=p.protocol or "TCP")
            for p in eps.ports or ()
        ),
    )


SLICE_CODEC: Codec[_Slice, EndpointSliceInfo] = Codec(
    noun="EndpointSlice",
    list_kind="EndpointSliceList",
    struct=_Slice,
    convert=_info,
    version_of=lambda eps: eps.metadata.resource_version,
)
"""EndpointSlices: addresses, conditions, node and pod of each endpoint, and the ports."""
