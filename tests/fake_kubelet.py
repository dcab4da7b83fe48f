"""A scripted kubelet PodResources server: real grpclib on a unix socket in a test folder.

    async with fake_kubelet(tmp_path) as kubelet:
        kubelet.set_pods([
            pod("ml", "llm-0", containers=[container("vllm", devices=[gpus("GPU-aaa")])]),
        ])
        sampler = PodResourcesSampler(kubelet.socket_path)
        kubelet.exhaust(times=2)          # the next two Lists: RESOURCE_EXHAUSTED
        await kubelet.stop()              # socket removed, connections dropped
        await kubelet.start()             # back on the same path

The builders make the messages the NVIDIA device plugin and DRA drivers produce: whole
GPUs ``GPU-<uuid>``, MIG instances ``MIG-<uuid>`` (``nvidia.com/gpu`` with the single
strategy, ``nvidia.com/mig-<profile>`` with mixed), time-slicing or MPS replicas
``<id>::<n>``, DRA claims, and any other resource. grpclib runs on asyncio only.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.protocol import H2Protocol
from grpclib.server import Server

from keda_gpu_scaler.sources.kubelet._proto.v1 import (
    CdiDevice,
    ClaimResource,
    ContainerDevices,
    ContainerResources,
    DynamicResource,
    ListPodResourcesRequest,
    ListPodResourcesResponse,
    PodResources,
    PodResourcesListerBase,
)

GPU = "nvidia.com/gpu"
RATE_LIMIT_MESSAGE = "rejected by rate limit"  # the kubelet's own words
_MAX_UNIX_PATH = 107  # sun_path holds 108 bytes with the terminating NUL

DeviceGroup = tuple[str, Sequence[str]]
"""One ``ContainerDevices``: the resource name and its device ids."""


def gpus(*device_ids: str, resource: str = GPU) -> DeviceGroup:
    """Whole GPUs, MIG instances of the single strategy or replicas, under ``resource``."""
    return (resource, list(device_ids))


def mig_mixed(profile: str, *device_ids: str) -> DeviceGroup:
    """MIG instances of the mixed strategy: ``nvidia.com/mig-<profile>``."""
    return (f"nvidia.com/mig-{profile}", list(device_ids))


def replicas(device_id: str, *numbers: int) -> list[str]:
    """Time-slicing or MPS replicas of one device: ``<id>::<n>``."""
    return [f"{device_id}::{n}" for n in numbers]


def dra_device(
    driver: str,
    pool: str,
    device: str,
    *,
    share_id: str | None = None,
    cdi: Iterable[str] = (),
) -> ClaimResource:
    return ClaimResource(
        cdi_devices=[CdiDevice(name=name) for name in cdi],
        driver_name=driver,
        pool_name=pool,
        device_name=device,
        share_id=share_id,
    )


def claim(namespace: str, name: str, *devices: ClaimResource) -> DynamicResource:
    return DynamicResource(
        claim_name=name, claim_namespace=namespace, claim_resources=list(devices)
    )


def container(
    name: str,
    *,
    devices: Iterable[DeviceGroup] = (),
    dra: Iterable[DynamicResource] = (),
    cpu_ids: Iterable[int] = (),
) -> ContainerResources:
    return ContainerResources(
        name=name,
        devices=[ContainerDevices(resource_name=r, device_ids=list(ids)) for r, ids in devices],
        cpu_ids=list(cpu_ids),
        dynamic_resources=list(dra),
    )


def pod(
    namespace: str, name: str, *, containers: Iterable[ContainerResources] = ()
) -> PodResources:
    return PodResources(name=name, namespace=namespace, containers=list(containers))


def listing(*pods: PodResources) -> ListPodResourcesResponse:
    """The answer of ``List`` for these pods."""
    return ListPodResourcesResponse(pod_resources=list(pods))


class _Lister(PodResourcesListerBase):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    async def list(self, message: ListPodResourcesRequest) -> ListPodResourcesResponse:
        return await self._kubelet._answer()


class _Server(Server):
    """grpclib's server, keeping its connections so that stopping can drop them: a kubelet
    that restarts breaks every connection, while asyncio's server only stops listening."""

    def __init__(self, kubelet: FakeKubelet) -> None:
        super().__init__([_Lister(kubelet)])
        self._kubelet = kubelet
        self.protocols: weakref.WeakSet[H2Protocol] = weakref.WeakSet()

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        self.protocols.add(protocol)
        self._kubelet.connections_accepted += 1
        return protocol

    def drop_connections(self) -> None:
        for protocol in list(self.protocols):
            processor = getattr(protocol, "processor", None)
            if processor is not None:
                processor.close("kubelet stopped")


class FakeKubelet:
    """Serves ``List`` from :attr:`pods`, as scripted; see the module docstring."""

    def __init__(self, socket_path: str) -> None:
        if len(os.fsencode(socket_path)) > _MAX_UNIX_PATH:
            raise ValueError(
                f"unix socket path too long ({len(socket_path)} > {_MAX_UNIX_PATH}): {socket_path}"
            )
        self.socket_path = socket_path
        self.pods: list[PodResources] = []
        self.list_calls: list[float] = []
        """``anyio.current_time()`` of every ``List`` received, rejected ones included."""
        self.connections_accepted = 0
        """Client connections accepted since this fake was made, over every restart."""
        self._exhausted = 0
        self._hold_s = 0.0
        self._server: _Server | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def set_pods(self, pods: Iterable[PodResources]) -> None:
        self.pods = list(pods)

    def exhaust(self, times: int = 1) -> None:
        """The next ``times`` calls are rejected as the kubelet's rate limiter does."""
        self._exhausted += times

    def hold(self, seconds: float) -> None:
        """Answer each call ``seconds`` late (0 answers at once again)."""
        self._hold_s = seconds

    def connections(self) -> int:
        """Client connections open now."""
        if self._server is None:
            return 0
        # grpclib closes a connection's handler when the connection is lost.
        return sum(
            1
            for p in self._server.protocols
            if hasattr(p, "processor") and not getattr(p.handler, "closing", False)
        )

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("the fake kubelet is already serving")
        server = _Server(self)
        await server.start(path=self.socket_path)
        self._server = server

    async def stop(self) -> None:
        """Drops every connection, stops listening and removes the socket file."""
        server, self._server = self._server, None
        if server is None:
            return
        server.drop_connections()
        server.close()
        await server.wait_closed()
        await anyio.Path(self.socket_path).unlink(missing_ok=True)

    async def _answer(self) -> ListPodResourcesResponse:
        self.list_calls.append(anyio.current_time())
        if self._exhausted > 0:
            self._exhausted -= 1
            raise GRPCError(Status.RESOURCE_EXHAUSTED, RATE_LIMIT_MESSAGE)
        if self._hold_s > 0:
            await anyio.sleep(self._hold_s)
        return listing(*self.pods)


@asynccontextmanager
async def fake_kubelet(
    folder: Path, *, pods: Iterable[PodResources] = ()
) -> AsyncIterator[FakeKubelet]:
    """A fake kubelet serving ``folder/kubelet.sock``, stopped (socket removed) on exit."""
    kubelet = FakeKubelet(str(folder / "kubelet.sock"))
    kubelet.set_pods(pods)
    await kubelet.start()
    try:
        yield kubelet
    finally:
        await kubelet.stop()
