"""From one ``List`` answer of the kubelet to who holds which GPU: sans-I/O.

Each device id of a matching resource is one :class:`DeviceHolder`: a container given two
GPUs holds two, and a time-sliced or MPS device shared by two pods (replicas
``<uuid>::<n>``) has a holder in each. Devices of other resources (NICs, FPGAs, hugepages
through a plugin) are dropped. Every device of a DRA claim is one :class:`DraDevice`,
whatever its driver, marked ``gpu`` when its driver is a GPU driver (``--dra-drivers``);
which NVML device each is, is the join's call (``domain.dra``).

The kubelet lists pods in no particular order, so both tuples are sorted: two answers
that list the same allocations give equal tuples.
"""

from __future__ import annotations

from keda_gpu_scaler.domain.samples import DeviceHolder, DraDevice
from keda_gpu_scaler.sources.kubelet._proto.v1 import (
    ContainerResources,
    ListPodResourcesResponse,
    PodResources,
)
from keda_gpu_scaler.sources.kubelet.resources import (
    DEFAULT_DRA_DRIVERS,
    DraDrivers,
    ResourceNames,
)


def holders_of(
    response: ListPodResourcesResponse,
    names: ResourceNames,
    drivers: DraDrivers = DEFAULT_DRA_DRIVERS,
) -> tuple[tuple[DeviceHolder, ...], tuple[DraDevice, ...]]:
    """The GPU devices held (of a resource ``names`` matches) and every DRA device held
    (those of ``drivers`` marked as GPUs)."""
    holders: list[DeviceHolder] = []
    dra: list[DraDevice] = []
    for pod in response.pod_resources:
        for container in pod.containers:
            holders.extend(_device_holders(pod, container, names))
            dra.extend(_dra_devices(pod, container, drivers))
    return tuple(sorted(holders, key=_holder_order)), tuple(sorted(dra, key=_dra_order))


def _device_holders(
    pod: PodResources, container: ContainerResources, names: ResourceNames
) -> list[DeviceHolder]:
    return [
        DeviceHolder(
            namespace=pod.namespace,
            pod=pod.name,
            container=container.name,
            resource=devices.resource_name,
            device_id=device_id,
        )
        for devices in container.devices
        if names.matches(devices.resource_name)
        for device_id in devices.device_ids
    ]


def _dra_devices(
    pod: PodResources, container: ContainerResources, drivers: DraDrivers
) -> list[DraDevice]:
    return [
        DraDevice(
            namespace=pod.namespace,
            pod=pod.name,
            container=container.name,
            claim_namespace=claim.claim_namespace,
            claim_name=claim.claim_name,
            driver=resource.driver_name,
            pool=resource.pool_name,
            device=resource.device_name,
            share_id=resource.share_id or None,
            gpu=drivers.is_gpu_driver(resource.driver_name),
        )
        for claim in container.dynamic_resources
        for resource in claim.claim_resources
    ]


def _holder_order(h: DeviceHolder) -> tuple[str, ...]:
    return (h.namespace, h.pod, h.container, h.resource, h.device_id)


def _dra_order(d: DraDevice) -> tuple[str, ...]:
    return (
        d.namespace,
        d.pod,
        d.container,
        d.claim_namespace,
        d.claim_name,
        d.driver,
        d.pool,
        d.device,
        d.share_id or "",
    )
