"""The cluster-scope pod watch (every node's pods, of all namespaces or of a set of them)
against a fake Kubernetes API on 127.0.0.1, through kr8s and a kubeconfig.

Real loopback I/O, so real time: every wait is for a published sample or a request the
fake saw, bounded by ``anyio.fail_after``; backoff delays are shortened to milliseconds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream

from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.domain.samples import PODS_SOURCE, PodInfo, PodsReading, Sample, SourceFault
from keda_gpu_scaler.sources.kube import PodWatcher
from tests.fake_kube_api import FakeKubeApi, open_fake_kube_api, write_kubeconfig

FAST = Backoff(initial_s=0.01, factor=2.0, maximum_s=0.04)
WAIT_S = 5.0


@dataclass
class Watch:
    """A running watcher and what it publishes."""

    watcher: PodWatcher
    samples: MemoryObjectReceiveStream[Sample]

    async def next(self) -> Sample:
        with anyio.fail_after(WAIT_S):
            return await self.samples.receive()

    async def reading(self) -> PodsReading:
        sample = await self.next()
        assert isinstance(sample, PodsReading), sample
        return sample

    async def fault(self) -> SourceFault:
        sample = await self.next()
        assert isinstance(sample, SourceFault), sample
        return sample

    async def reading_where(self, condition: Callable[[PodsReading], bool]) -> PodsReading:
        """The first reading for which ``condition`` holds, skipping faults and the
        readings before it."""
        with anyio.fail_after(WAIT_S):
            while True:
                sample = await self.samples.receive()
                if isinstance(sample, PodsReading) and condition(sample):
                    return sample


@asynccontextmanager
async def watching(
    api: FakeKubeApi,
    tmp_path: Path,
    namespaces: Sequence[str] | None = None,
    **options: Any,
) -> AsyncIterator[Watch]:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, token="fake-token")
    settings: dict[str, Any] = {"backoff": FAST, "refresh_s": 60.0, **options}
    watcher = PodWatcher.cluster(
        namespaces,
        kubeconfig=str(kubeconfig),
        serviceaccount=str(tmp_path / "no-service-account"),
        **settings,
    )
    send, receive = anyio.create_memory_object_stream[Sample](1000)
    async with receive, anyio.create_task_group() as tg:
        tg.start_soon(watcher.run, send)
        yield Watch(watcher, receive)
        tg.cancel_scope.cancel()


async def watches_open(api: FakeKubeApi, count: int) -> None:
    """Until the fake has ``count`` watches open now."""
    with anyio.fail_after(WAIT_S):
        await api.wait_until(lambda: api.open_watches == count)


def names(reading: PodsReading) -> list[str]:
    return [f"{pod.namespace}/{pod.name}" for pod in reading.pods]


def pod(reading: PodsReading, namespace: str, name: str) -> PodInfo:
    return next(p for p in reading.pods if (p.namespace, p.name) == (namespace, name))


def two_nodes_two_namespaces(api: FakeKubeApi) -> None:
    api.add_pod("serving", "vllm-1", node="node-b", labels={"app": "vllm"})
    api.add_pod("ml", "train-0", node="node-a", labels={"app": "train"})
    api.add_pod("serving", "vllm-0", node="node-a", labels={"app": "vllm"})
    api.add_pod("ml", "train-1", node="node-b", labels={"app": "train"}, phase="Pending")
    api.add_pod("ml", "queued", node=None)


# -- all namespaces ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_all_namespaces_watches_every_nodes_pods_with_their_nodes(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        two_nodes_two_namespaces(api)
        async with watching(api, tmp_path) as w:
            first = await w.reading()
            await watches_open(api, 1)
            listed, watched = api.pod_requests()
    assert first.source == PODS_SOURCE
    assert first.node == ""
    assert first.period_s == 10.0
    assert names(first) == [
        "ml/queued",
        "ml/train-0",
        "ml/train-1",
        "serving/vllm-0",
        "serving/vllm-1",
    ]
    assert [p.node for p in first.pods] == ["", "node-a", "node-b", "node-a", "node-b"]
    assert pod(first, "ml", "train-1") == PodInfo(
        namespace="ml",
        name="train-1",
        uid="00000000-0000-4000-8000-000000000004",
        labels={"app": "train"},
        phase="Pending",
        node="node-b",
    )
    # The whole collection: no field selector, no namespace in the path.
    assert listed.path == watched.path == "/api/v1/pods"
    assert dict(listed.query) == {"limit": "500", "resourceVersion": "0"}
    assert "fieldSelector" not in watched.query
    assert watched.query["watch"] == "true"
    assert watched.query["resourceVersion"] == api.resource_version


@pytest.mark.anyio
async def test_all_namespaces_follows_labels_moves_and_deletes(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        two_nodes_two_namespaces(api)
        async with watching(api, tmp_path) as w:
            await w.reading()
            await watches_open(api, 1)
            api.update_pod("serving", "vllm-1", labels={"app": "vllm", "tier": "gold"})
            relabelled = await w.reading()
            api.update_pod("ml", "queued", node="node-b")
            scheduled = await w.reading()
            api.delete_pod("ml", "train-0")
            deleted = await w.reading()
            api.add_pod("batch", "job-0", node="node-c")
            added = await w.reading()
            # One watch for the whole cluster, resumed, never relisted.
            assert len(api.lists()) == 1
    assert pod(relabelled, "serving", "vllm-1").labels == {"app": "vllm", "tier": "gold"}
    assert pod(relabelled, "serving", "vllm-0").labels == {"app": "vllm"}
    assert pod(scheduled, "ml", "queued").node == "node-b"
    assert names(deleted) == ["ml/queued", "ml/train-1", "serving/vllm-0", "serving/vllm-1"]
    assert names(added)[0] == "batch/job-0"
    assert pod(added, "batch", "job-0").node == "node-c"


# -- a set of namespaces ------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_namespace_set_watches_each_namespace_and_merges_them(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        two_nodes_two_namespaces(api)
        api.add_pod("other", "elsewhere", node="node-a")
        async with watching(api, tmp_path, ["serving", "ml"]) as w:
            first = await w.reading()
            await watches_open(api, 2)
            api.add_pod("other", "also-elsewhere", node="node-b")
            api.update_pod("serving", "vllm-0", phase="Succeeded")
            changed = await w.reading()
            api.update_pod("ml", "train-0", labels={"app": "train", "step": "2"})
            relabelled = await w.reading()
            requests = api.pod_requests()
    assert first.node == ""
    assert names(first) == [
        "ml/queued",
        "ml/train-0",
        "ml/train-1",
        "serving/vllm-0",
        "serving/vllm-1",
    ]
    assert [p.node for p in first.pods] == ["", "node-a", "node-b", "node-a", "node-b"]
    assert pod(changed, "serving", "vllm-0").terminated()
    assert "other/also-elsewhere" not in names(changed)
    assert pod(relabelled, "ml", "train-0").labels == {"app": "train", "step": "2"}
    assert len(relabelled.pods) == 5
    # One list and one watch per namespace, on the namespaced paths, and nothing else.
    paths = {r.path for r in requests}
    assert paths == {"/api/v1/namespaces/ml/pods", "/api/v1/namespaces/serving/pods"}
    for path in paths:
        ours = [r for r in requests if r.path == path]
        assert [r.query.get("watch") for r in ours] == [None, "true"]
        assert "fieldSelector" not in ours[0].query


@pytest.mark.anyio
async def test_a_namespace_given_twice_is_watched_once(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_pod("ml", "a", node="node-a")
        async with watching(api, tmp_path, ["ml", "ml"]) as w:
            reading = await w.reading()
            await watches_open(api, 1)
    assert names(reading) == ["ml/a"]
    assert [r.path for r in api.lists()] == ["/api/v1/namespaces/ml/pods"]


@pytest.mark.anyio
async def test_a_forbidden_namespace_is_a_fault_naming_it_and_nothing_partial_is_published(
    tmp_path: Path,
) -> None:
    message = 'pods is forbidden: User "system:serviceaccount:gpu:scaler" cannot list "pods"'
    async with open_fake_kube_api() as api:
        two_nodes_two_namespaces(api)
        api.fail(403, message, on="list", namespace="serving")
        async with watching(api, tmp_path, ["ml", "serving"]) as w:
            fault = await w.fault()
            again = await w.fault()
            # ml has listed and watches; its answers publish nothing while serving's pods
            # are unknown.
            await watches_open(api, 1)
            api.update_pod("ml", "train-0", labels={"app": "other"})
            # ml has read it when its next watch resumes from it.
            updated = api.resource_version
            api.end_watches()
            with anyio.fail_after(WAIT_S):
                await api.wait_until(
                    lambda: (
                        api.watches()[-1].query["resourceVersion"] == updated
                        and api.open_watches == 1
                    )
                )
            api.heal()
            # The first reading published at all is the whole set.
            whole = await w.reading_where(lambda r: True)
    assert fault.source == PODS_SOURCE
    assert fault.reason == (
        f"Kubernetes API: list /api/v1/namespaces/serving/pods answered 403 Forbidden: {message}"
    )
    assert again.reason == fault.reason
    assert names(whole) == [
        "ml/queued",
        "ml/train-0",
        "ml/train-1",
        "serving/vllm-0",
        "serving/vllm-1",
    ]
    assert pod(whole, "ml", "train-0").labels == {"app": "other"}


@pytest.mark.anyio
async def test_one_silent_namespace_makes_the_whole_set_stale(tmp_path: Path) -> None:
    message = 'pods is forbidden: User "system:serviceaccount:gpu:scaler" cannot watch "pods"'
    async with open_fake_kube_api() as api:
        two_nodes_two_namespaces(api)
        async with watching(api, tmp_path, ["ml", "serving"]) as w:
            await w.reading()
            await watches_open(api, 2)
            # serving's next watch is refused: it answers no more, while ml goes on.
            api.fail(403, message, on="watch", namespace="serving")
            ended_at = anyio.current_time()
            api.end_watches()
            fault = await w.fault()
            await watches_open(api, 1)
            serving_last = anyio.current_time()
            api.update_pod("ml", "train-0", labels={"app": "train", "step": "3"})
            changed = await w.reading_where(
                lambda r: pod(r, "ml", "train-0").labels.get("step") == "3"
            )
    assert fault.reason == (
        f"Kubernetes API: watch /api/v1/namespaces/serving/pods answered 403 Forbidden: {message}"
    )
    # ml answered just now, but the set is as old as serving's last answer: the end of its
    # watch, after the watches were ended and before its next one was refused.
    assert ended_at <= changed.taken_at < serving_last
    assert len(changed.pods) == 5


# -- bad input and configuration ----------------------------------------------------------


@pytest.mark.parametrize(
    ("namespaces", "message"),
    [
        ([], "at least one namespace"),
        ("ml", "a list of namespace names, not the string 'ml'"),
        (["ml", "ML"], "namespace 'ML' is not a Kubernetes namespace name"),
        ([""], "namespace '' is not a Kubernetes namespace name"),
        (["a" * 64], "is not a Kubernetes namespace name"),
        (["ml/x"], "namespace 'ml/x' is not"),
    ],
)
def test_bad_namespaces_are_named(namespaces: Sequence[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PodWatcher.cluster(namespaces)


def test_a_cluster_watcher_has_no_node() -> None:
    assert PodWatcher.cluster().node_name == ""
    assert PodWatcher.cluster(["ml"]).name == PODS_SOURCE


@pytest.mark.anyio
@pytest.mark.parametrize("namespaces", [None, ["ml", "serving"]])
async def test_a_missing_kubeconfig_is_source_unavailable_as_is(
    tmp_path: Path, namespaces: Sequence[str] | None
) -> None:
    watcher = PodWatcher.cluster(namespaces, kubeconfig=str(tmp_path / "nope"))
    send, receive = anyio.create_memory_object_stream[Sample](10)
    with receive, pytest.raises(SourceUnavailable) as info:
        await watcher.run(send)
    assert str(info.value) == f"Kubernetes API: kubeconfig {tmp_path / 'nope'} does not exist"
