"""ResourceSliceWatcher: this node's ResourceSlices, for the DRA join.

A DRA driver publishes what its devices are in ResourceSlices (``resource.k8s.io/v1``,
cluster-scoped); the kubelet names a pod's DRA devices only as ``(driver, pool, device)``.
A node agent lists, then watches, the slices of its own node, on the shared engine
(:class:`~keda_gpu_scaler.sources.kube.listwatch.ListWatch`)::

    GET /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=<node>

one watch for every driver, so that a device of a driver not among ``--dra-drivers`` that
is a GPU NVML reports can be told apart from a NIC (``domain.dra``); slices of pools that
are not bound to one node (``spec.nodeSelector``, ``allNodes``) are not read. Each object
is decoded into only what the join reads (:class:`ResourceSliceInfo`): the slice's driver,
its pool (name, generation, ``resourceSliceCount``), and each device's name and its
``uuid``, ``parentUUID``, ``type`` and ``profile`` attributes, unqualified or qualified
with the driver's own domain (``gpu.nvidia.com/uuid``); any other attribute, capacities,
counters and taints are skipped unread.

A reading (:class:`ResourceSlicesReading`) is the node's pools as :func:`~keda_gpu_scaler.
domain.dra.pools_of` makes them (latest generation only, incomplete and invalid ones
marked), paced as the pod watch's (every change at once, else at most one a second), with
the same period (10 s: unavailable after 30 s without an answer of the API). Failures (403
when the service account may not list ``resourceslices``, 404 on a cluster without the
``resource.k8s.io/v1`` API, timeouts) are published as a ``SourceFault`` naming the request
and the answer, and retried with backoff; the join then names that reason for every DRA GPU
of the node, whose triggers are UNAVAILABLE, never 0.
"""

from __future__ import annotations

import logging
import random

import anyio
import msgspec
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.dra import pools_of
from keda_gpu_scaler.domain.names import is_node_name
from keda_gpu_scaler.domain.samples import (
    RESOURCE_SLICES_SOURCE,
    ResourceSliceInfo,
    ResourceSlicesReading,
    Sample,
    SliceDevice,
    SourceFault,
)
from keda_gpu_scaler.sources.kube.client import SERVICE_ACCOUNT
from keda_gpu_scaler.sources.kube.listwatch import (
    DEFAULT_BACKOFF,
    DEFAULT_PAGE_SIZE,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_WATCH_TIMEOUT_S,
    ListWatch,
    Resource,
)
from keda_gpu_scaler.sources.kube.store import Pacing
from keda_gpu_scaler.sources.kube.wire import Codec

__all__ = ["GROUP_VERSION", "PERIOD_S", "SLICE_CODEC", "ResourceSliceWatcher", "node_slices"]

GROUP_VERSION = "resource.k8s.io/v1"
PERIOD_S = 10.0
"""A reading's period: the slices are unavailable after three without an answer (30 s)."""
DEFAULT_REFRESH_S = 1.0

log = logging.getLogger(__name__)


def node_slices(node_name: str) -> Resource[ResourceSliceInfo]:
    """The ResourceSlices of node ``node_name``, to list and watch."""
    return Resource(
        version=GROUP_VERSION,
        path="resourceslices",
        selector=("fieldSelector", f"spec.nodeName={node_name}"),
        codec=SLICE_CODEC,
        key=_slice_key,
        title="ResourceSlice watch",
    )


class ResourceSliceWatcher:
    """This node's ResourceSlices, published as :class:`ResourceSlicesReading`; see the
    module docstring. The options are the pod watch's."""

    name = RESOURCE_SLICES_SOURCE

    def __init__(
        self,
        node_name: str,
        *,
        kubeconfig: str | None = None,
        serviceaccount: str = SERVICE_ACCOUNT,
        watch_timeout_s: int = DEFAULT_WATCH_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        refresh_s: float = DEFAULT_REFRESH_S,
        page_size: int = DEFAULT_PAGE_SIZE,
        backoff: Backoff = DEFAULT_BACKOFF,
        rng: random.Random | None = None,
    ) -> None:
        if not is_node_name(node_name):
            raise ValueError(
                f"the ResourceSlice watch needs this node's name (--node-name), not {node_name!r}"
            )
        self.node_name = node_name
        self._engine: ListWatch[ResourceSliceInfo] = ListWatch(
            node_slices(node_name),
            source=self.name,
            log=log,
            log_fields=lambda: {"node": node_name, "slices": len(self._engine.store)},
            kubeconfig=kubeconfig,
            serviceaccount=serviceaccount,
            watch_timeout_s=watch_timeout_s,
            request_timeout_s=request_timeout_s,
            page_size=page_size,
            backoff=backoff,
            rng=rng,
        )
        self._pacing = Pacing(refresh_s)

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            task_status.started()

            async def answered(changed: bool, now: float) -> None:
                if not self._pacing.is_due(changed=changed, now=now):
                    return
                self._pacing.published(now)
                await send.send(self._reading())

            async def failed(reason: str, now: float) -> None:
                self._pacing.faulted()
                await send.send(SourceFault(source=self.name, key=None, at=now, reason=reason))

            await self._engine.run(answered=answered, failed=failed)

    def _reading(self) -> ResourceSlicesReading:
        last = self._engine.last_answer_at
        assert last is not None  # published only once the API answered
        return ResourceSlicesReading(
            source=self.name,
            taken_at=last,
            period_s=PERIOD_S,
            node=self.node_name,
            pools=pools_of(self._engine.store.items()),
        )


def _slice_key(info: ResourceSliceInfo) -> tuple[str]:
    return (info.name,)


# -- the wire format -----------------------------------------------------------------


class _Attribute(msgspec.Struct):
    """A DeviceAttribute: exactly one of string, int, bool, version; only strings are read."""

    string: str | None = None


class _Device(msgspec.Struct):
    name: str
    attributes: dict[str, _Attribute] | None = None


class _Pool(msgspec.Struct, rename="camel"):
    name: str
    generation: int = 0
    resource_slice_count: int = 0


class _Spec(msgspec.Struct, rename="camel"):
    driver: str
    pool: _Pool
    node_name: str | None = None
    devices: list[_Device] | None = None


class _Meta(msgspec.Struct, rename="camel"):
    name: str
    resource_version: str = ""


class _Slice(msgspec.Struct):
    metadata: _Meta
    spec: _Spec


_READ = {"uuid": "uuid", "parentUUID": "parent_uuid", "type": "type", "profile": "profile"}
"""Attribute (in the driver's domain) -> :class:`SliceDevice` field."""


def _device(device: _Device, driver: str) -> SliceDevice:
    attributes = device.attributes or {}
    values: dict[str, str] = {}
    for attribute, field in _READ.items():
        found = attributes.get(attribute) or attributes.get(f"{driver}/{attribute}")
        if found is not None and found.string is not None:
            values[field] = found.string
    return SliceDevice(name=device.name, **values)


def _info(item: _Slice) -> ResourceSliceInfo:
    spec = item.spec
    return ResourceSliceInfo(
        name=item.metadata.name,
        driver=spec.driver,
        pool=spec.pool.name,
        generation=spec.pool.generation,
        slice_count=spec.pool.resource_slice_count,
        node=spec.node_name or "",
        devices=tuple(_device(d, spec.driver) for d in spec.devices or ()),
    )


SLICE_CODEC: Codec[_Slice, ResourceSliceInfo] = Codec(
    noun="ResourceSlice",
    list_kind="ResourceSliceList",
    struct=_Slice,
    convert=_info,
    version_of=lambda item: item.metadata.resource_version,
)
"""ResourceSlices: driver, pool, node, and each device's identifying attributes."""
