"""The ResourceSlice watch against a fake Kubernetes API on 127.0.0.1, through kr8s and a
kubeconfig: the requests it makes, the pools it publishes, and what a refusal looks like.

Real loopback I/O, so real time: every wait is for a published sample, bounded by
``anyio.fail_after``; backoff delays are shortened to milliseconds.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream

from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.samples import (
    RESOURCE_SLICES_SOURCE,
    ResourceSlicesReading,
    Sample,
    SourceFault,
)
from keda_gpu_scaler.sources.kube import ResourceSliceWatcher
from tests.dra_objects import gpu_device, mig_device, plain_device, resource_slice
from tests.fake_kube_api import FakeKubeApi, open_fake_kube_api, write_kubeconfig

pytestmark = pytest.mark.anyio

NODE = "node-a"
SELECTOR = f"spec.nodeName={NODE}"
FAST = Backoff(initial_s=0.01, factor=2.0, maximum_s=0.04)
WAIT_S = 5.0
PATH = "/apis/resource.k8s.io/v1/resourceslices"


@dataclass
class Watch:
    samples: MemoryObjectReceiveStream[Sample]

    async def next(self) -> Sample:
        with anyio.fail_after(WAIT_S):
            return await self.samples.receive()

    async def reading(self) -> ResourceSlicesReading:
        sample = await self.next()
        assert isinstance(sample, ResourceSlicesReading), sample
        return sample

    async def fault(self) -> SourceFault:
        sample = await self.next()
        assert isinstance(sample, SourceFault), sample
        return sample


@asynccontextmanager
async def watching(api: FakeKubeApi, tmp_path: Path, **options: Any) -> AsyncIterator[Watch]:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    watcher = ResourceSliceWatcher(
        NODE,
        kubeconfig=str(kubeconfig),
        serviceaccount=str(tmp_path / "no-service-account"),
        backoff=FAST,
        refresh_s=60.0,
        **options,
    )
    send, receive = anyio.create_memory_object_stream[Sample](1000)
    async with receive, anyio.create_task_group() as tg:
        tg.start_soon(watcher.run, send)
        yield Watch(receive)
        tg.cancel_scope.cancel()


async def test_lists_this_nodes_slices_of_every_driver_then_watches(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_resource_slice(
            resource_slice(NODE, [gpu_device(0, "GPU-a"), gpu_device(1, "GPU-b")])
        )
        api.add_resource_slice(resource_slice(NODE, [plain_device("eth1")], driver="dra.net"))
        api.add_resource_slice(resource_slice("node-b", [gpu_device(0, "GPU-z")]))
        async with watching(api, tmp_path) as w:
            first = await w.reading()
            with anyio.fail_after(WAIT_S):
                await api.wait_until(lambda: api.open_watches == 1)
    assert (first.source, first.node, first.period_s) == (RESOURCE_SLICES_SOURCE, NODE, 10.0)
    assert [(p.driver, p.name, p.problem) for p in first.pools] == [
        ("dra.net", NODE, None),
        ("gpu.nvidia.com", NODE, None),
    ]
    assert [(d.name, d.uuid, d.type) for d in first.pools[1].devices] == [
        ("gpu-0", "GPU-a", "gpu"),
        ("gpu-1", "GPU-b", "gpu"),
    ]
    listed, watched = api.resource_slice_requests()
    assert (listed.path, dict(listed.query)) == (
        PATH,
        {"fieldSelector": SELECTOR, "limit": "500", "resourceVersion": "0"},
    )
    assert watched.query["fieldSelector"] == SELECTOR
    assert (watched.query["watch"], watched.query["allowWatchBookmarks"]) == ("true", "true")


async def test_a_pool_moving_to_a_new_generation_is_incomplete_until_all_its_slices_are_there(
    tmp_path: Path,
) -> None:
    async with open_fake_kube_api() as api:
        api.add_resource_slice(resource_slice(NODE, [gpu_device(0, "GPU-a")], name="s1"))
        async with watching(api, tmp_path) as w:
            await w.reading()
            # The driver republishes the pool in two slices of generation 2, one after the other.
            mig = mig_device(0, parent_uuid="GPU-a", start=0)
            api.replace_resource_slice(
                resource_slice(NODE, [mig], name="s1", generation=2, count=2)
            )
            (pool,) = (await w.reading()).pools
            assert (pool.generation, pool.slices, pool.slice_count) == (2, 1, 2)
            assert pool.problem is not None and "incomplete" in pool.problem
            api.add_resource_slice(
                resource_slice(NODE, [gpu_device(1, "GPU-b")], name="s2", generation=2, count=2)
            )
            (pool,) = (await w.reading()).pools
    assert (pool.problem, [d.name for d in pool.devices]) == (
        None,
        ["gpu-0-mig-1g10gb-19-0", "gpu-1"],
    )


async def test_no_right_to_list_slices_is_a_fault_naming_the_request_and_the_answer(
    tmp_path: Path,
) -> None:
    forbidden = (
        'resourceslices.resource.k8s.io is forbidden: User "system:serviceaccount:keda:'
        'keda-gpu-scaler" cannot list resource "resourceslices" in API group '
        '"resource.k8s.io" at the cluster scope'
    )
    async with open_fake_kube_api() as api:
        api.fail(403, forbidden, on="resourceslices")
        async with watching(api, tmp_path) as w:
            fault = await w.fault()
            api.heal()
            api.add_resource_slice(resource_slice(NODE, [gpu_device(0, "GPU-a")]))
            recovered = await w.reading()
    assert fault.source == RESOURCE_SLICES_SOURCE
    assert fault.reason == (
        f"Kubernetes API: list {PATH}?fieldSelector={SELECTOR} answered 403 Forbidden: {forbidden}"
    )
    assert [p.name for p in recovered.pools] == [NODE]


async def test_an_expired_watch_lists_again(tmp_path: Path) -> None:
    async with open_fake_kube_api(too_old="event") as api:
        api.add_resource_slice(resource_slice(NODE, [gpu_device(0, "GPU-a")], name="s1"))
        async with watching(api, tmp_path) as w:
            await w.reading()
            with anyio.fail_after(WAIT_S):
                await api.wait_until(lambda: api.open_watches == 1)
            api.replace_resource_slice(resource_slice(NODE, [gpu_device(0, "GPU-b")], name="s1"))
            assert (await w.reading()).pools[0].devices[0].uuid == "GPU-b"
            api.compact()
            api.send_error(410)
            with anyio.fail_after(WAIT_S):
                await api.wait_until(
                    lambda: len([r for r in api.resource_slice_requests() if r.is_list()]) == 2
                )
    lists = [r for r in api.resource_slice_requests() if r.is_list()]
    assert len(lists) == 2
    assert "resourceVersion" not in lists[1].query  # the latest, not the watch cache's


async def test_the_fake_selects_slices_as_the_api_server_does(tmp_path: Path) -> None:
    """The field selectors a real API server accepts for ResourceSlices, and the one it
    refuses, so that this suite's requests would work against one."""
    import httpx

    async with open_fake_kube_api() as api:
        api.add_resource_slice(resource_slice(NODE, [gpu_device(0, "GPU-a")]))
        api.add_resource_slice(resource_slice(NODE, [plain_device("eth1")], driver="dra.net"))
        api.add_resource_slice(resource_slice("node-b", [gpu_device(0, "GPU-z")]))
        async with httpx.AsyncClient(base_url=api.url) as client:

            async def names(selector: str) -> list[str] | int:
                answer = await client.get(PATH, params={"fieldSelector": selector})
                if answer.status_code != 200:
                    return answer.status_code
                return [item["metadata"]["name"] for item in json.loads(answer.content)["items"]]

            both = f"spec.nodeName={NODE},spec.driver=gpu.nvidia.com"
            assert await names(both) == [f"{NODE}-gpu.nvidia.com-g1"]
            assert await names("spec.driver!=gpu.nvidia.com") == [f"{NODE}-dra.net-g1"]
            assert await names("spec.nodeName==node-b") == ["node-b-gpu.nvidia.com-g1"]
            assert await names("spec.pool.name=node-a") == 400
