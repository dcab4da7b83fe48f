"""DRA objects in the ``resource.k8s.io/v1`` schema, as NVIDIA's DRA driver and the scheduler
write them: the ResourceSlices the fake API server serves (and a real one accepts), and the
ResourceClaims whose allocations the fake kubelet's ``dynamic_resources`` list.

    slice_ = resource_slice("node-a", [gpu_device(0, "GPU-aaa")])
    api.add_resource_slice(slice_)
    claim = resource_claim("ml", "llm-gpu", [allocated("node-a", "gpu-0")], pods=["llm-0"])

What NVIDIA's driver (``gpu.nvidia.com``) publishes, per node, in one pool named after the
node: a full GPU ``gpu-<minor>`` with ``type: gpu`` and ``uuid``; a MIG device
``gpu-<minor>-mig-<profile>-<profileId>-<placementStart>`` with ``type: mig``,
``parentUUID`` and ``profile``, and ``uuid`` only when it exists already (not under
dynamic MIG). Attribute names without a domain are the driver's; every value is exactly one
of ``string``, ``int``, ``bool`` or ``version`` (a semantic version), and capacities are
quantities, as the API server validates them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from keda_gpu_scaler.sources.kubelet._proto.v1 import DynamicResource
from tests.fake_kubelet import claim as kubelet_claim
from tests.fake_kubelet import dra_device

Json = dict[str, Any]

NVIDIA = "gpu.nvidia.com"
GROUP_VERSION = "resource.k8s.io/v1"

_COMMON: Json = {
    "productName": {"string": "NVIDIA H100 80GB HBM3"},
    "brand": {"string": "Nvidia"},
    "architecture": {"string": "Hopper"},
    "cudaComputeCapability": {"version": "9.0.0"},
    "driverVersion": {"version": "580.95.5"},
    "cudaDriverVersion": {"version": "13.0.0"},
}


def gpu_device(minor: int, uuid: str, *, memory: str = "80Gi") -> Json:
    """A full GPU, as the driver announces it."""
    return {
        "name": f"gpu-{minor}",
        "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}, **_COMMON},
        "capacity": {"memory": {"value": memory}},
    }


def mig_device(
    minor: int,
    *,
    parent_uuid: str,
    profile: str = "1g.10gb",
    profile_id: int = 19,
    start: int,
    uuid: str | None = None,
    legacy_size: int | None = None,
) -> Json:
    """A MIG device: named by its placement (``gpu-0-mig-1g10gb-19-3``, or the older
    ``gpu-0-mig-19-3-1`` with ``legacy_size``), with ``uuid`` only when it exists already."""
    if legacy_size is None:
        name = f"gpu-{minor}-mig-{profile.replace('.', '')}-{profile_id}-{start}"
    else:
        name = f"gpu-{minor}-mig-{profile_id}-{start}-{legacy_size}"
    attributes: Json = {
        "type": {"string": "mig"},
        "parentUUID": {"string": parent_uuid},
        "profile": {"string": profile},
        **_COMMON,
    }
    if uuid is not None:
        attributes["uuid"] = {"string": uuid}
    return {
        "name": name,
        "attributes": attributes,
        "capacity": {"memory": {"value": "10Gi"}, "multiprocessors": {"value": "16"}},
    }


def plain_device(name: str, attributes: Mapping[str, Json] | None = None) -> Json:
    """Any other driver's device (a NIC, a channel)."""
    return {"name": name, "attributes": dict(attributes or {})}


def resource_slice(
    node: str,
    devices: Sequence[Json],
    *,
    driver: str = NVIDIA,
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
    name: str | None = None,
) -> Json:
    """One ResourceSlice of ``node``'s pool (named after the node unless ``pool``), slice
    ``name`` (default ``<node>-<driver>-<generation>``), one of ``count`` in its generation."""
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}-g{generation}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {
                "name": pool or node,
                "generation": generation,
                "resourceSliceCount": count,
            },
            "devices": list(devices),
        },
    }


def allocated(
    pool: str, device: str, *, request: str = "gpu", driver: str = NVIDIA, share_id: str = ""
) -> Json:
    """One result of a claim's allocation: which device of which pool."""
    result: Json = {"request": request, "driver": driver, "pool": pool, "device": device}
    if share_id:
        result["shareID"] = share_id
    return result


def resource_claim(
    namespace: str,
    name: str,
    results: Sequence[Json],
    *,
    pods: Sequence[tuple[str, str]] = (),
    device_class: str = NVIDIA,
    node: str = "",
) -> Json:
    """A ResourceClaim asking for as many devices as ``results`` (request ``gpu``), with
    its status as the scheduler writes it: allocated (to ``node``'s pool), reserved for
    ``pods`` (name, uid): several pods on one claim share its devices."""
    status: Json = {"allocation": {"devices": {"results": list(results)}}}
    if node:
        status["allocation"]["nodeSelector"] = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
    if pods:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": uid} for pod, uid in pods]
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": device_class,
                            "allocationMode": "ExactCount",
                            "count": len(results),
                        },
                    }
                ]
            }
        },
        "status": status,
    }


def listed(claim: Json) -> DynamicResource:
    """The claim as the kubelet's PodResources ``List`` shows it in a container that uses
    it: its allocation's devices (with their share, if any)."""
    results = claim["status"]["allocation"]["devices"]["results"]
    devices = [
        dra_device(r["driver"], r["pool"], r["device"], share_id=r.get("shareID") or None)
        for r in results
    ]
    return kubelet_claim(claim["metadata"]["namespace"], claim["metadata"]["name"], *devices)
