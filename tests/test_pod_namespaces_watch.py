"""The cluster pod watch following the namespaces triggers name (``--pod-namespaces
triggers``), against a fake Kubernetes API on 127.0.0.1, through kr8s and a kubeconfig.

Real loopback I/O, so real time: every wait is for a published sample or a request the
fake saw, bounded by ``anyio.fail_after``; backoff delays are shortened to milliseconds,
and readings are paced at one a minute unless something changed, so that every reading a
test sees is one the watcher had to publish.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream

from keda_gpu_scaler.app.scaler.compose import build_cluster_pods
from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.samples import PODS_SOURCE, PodsReading, Sample, SourceFault
from keda_gpu_scaler.pipeline.podnamespaces import PodNamespaces
from keda_gpu_scaler.sources.kube import PodWatcher
from tests.fake_kube_api import FakeKubeApi, open_fake_kube_api, write_kubeconfig

pytestmark = pytest.mark.anyio

FAST = Backoff(initial_s=0.01, factor=2.0, maximum_s=0.04)
WAIT_S = 5.0


@dataclass
class Watch:
    watcher: PodWatcher
    samples: MemoryObjectReceiveStream[Sample]
    seen: list[Sample]

    async def reading_where(self, condition: Callable[[PodsReading], bool]) -> PodsReading:
        """The first reading for which ``condition`` holds; every sample is kept in
        :attr:`seen`."""
        with anyio.fail_after(WAIT_S):
            while True:
                sample = await self.samples.receive()
                self.seen.append(sample)
                if isinstance(sample, PodsReading) and condition(sample):
                    return sample

    async def fault_where(self, condition: Callable[[SourceFault], bool]) -> SourceFault:
        with anyio.fail_after(WAIT_S):
            while True:
                sample = await self.samples.receive()
                self.seen.append(sample)
                if isinstance(sample, SourceFault) and condition(sample):
                    return sample

    def readings(self) -> list[PodsReading]:
        return [s for s in self.seen if isinstance(s, PodsReading)]


@asynccontextmanager
async def following(
    api: FakeKubeApi, tmp_path: Path, demand: PodNamespaces
) -> AsyncIterator[Watch]:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, token="fake-token")
    watcher = PodWatcher.cluster(
        demand=demand,
        kubeconfig=str(kubeconfig),
        serviceaccount=str(tmp_path / "no-service-account"),
        backoff=FAST,
        refresh_s=60.0,
    )
    send, receive = anyio.create_memory_object_stream[Sample](1000)
    async with receive, anyio.create_task_group() as tg:
        tg.start_soon(watcher.run, send)
        yield Watch(watcher, receive, [])
        tg.cancel_scope.cancel()


async def watches_open(api: FakeKubeApi, count: int) -> None:
    with anyio.fail_after(WAIT_S):
        await api.wait_until(lambda: api.open_watches == count)


def names(reading: PodsReading) -> list[str]:
    return [f"{pod.namespace}/{pod.name}" for pod in reading.pods]


def three_namespaces(api: FakeKubeApi) -> None:
    api.add_pod("ml", "train-0", node="node-a", labels={"app": "train"})
    api.add_pod("serving", "vllm-0", node="node-b", labels={"app": "vllm"})
    api.add_pod("serving", "vllm-1", node="node-c", labels={"app": "vllm"})
    api.add_pod("batch", "job-0", node="node-a", labels={"app": "job"})


def requests_of(api: FakeKubeApi, namespace: str) -> list[str]:
    """``list`` and ``watch``, in order, of one namespace's pods."""
    return [
        "watch" if r.is_watch() else "list" for r in api.pod_requests() if r.namespace == namespace
    ]


async def test_a_namespace_named_late_is_listed_watched_and_joins_the_readings(
    tmp_path: Path,
) -> None:
    demand = PodNamespaces.triggers()
    demand.require("ml")
    async with open_fake_kube_api() as api:
        three_namespaces(api)
        async with following(api, tmp_path, demand) as w:
            first = await w.reading_where(lambda r: True)
            await watches_open(api, 1)
            demand.require("serving")
            joined = await w.reading_where(lambda r: r.namespaces == ("ml", "serving"))
            await watches_open(api, 2)
            api.update_pod("serving", "vllm-1", labels={"app": "vllm", "tier": "gold"})
            relabelled = await w.reading_where(lambda r: len(r.pods[-1].labels) == 2)
    assert first.source == PODS_SOURCE
    assert first.node == ""
    assert first.namespaces == ("ml",)
    assert first.on_demand
    assert names(first) == ["ml/train-0"]
    assert names(joined) == ["ml/train-0", "serving/vllm-0", "serving/vllm-1"]
    assert joined.on_demand
    assert relabelled.namespaces == ("ml", "serving")
    # The namespace that joined is listed, then watched, on its own path; the first one
    # goes on with its watch, never listed again; no other namespace is asked for.
    assert requests_of(api, "serving") == ["list", "watch"]
    assert requests_of(api, "ml") == ["list", "watch"]
    assert {r.namespace for r in api.pod_requests()} == {"ml", "serving"}


async def test_nothing_is_watched_or_published_until_a_trigger_names_a_namespace(
    tmp_path: Path,
) -> None:
    demand = PodNamespaces.triggers()
    async with open_fake_kube_api() as api:
        three_namespaces(api)
        async with following(api, tmp_path, demand) as w:
            await anyio.wait_all_tasks_blocked()
            assert api.pod_requests() == []
            demand.require("batch")
            reading = await w.reading_where(lambda r: True)
    assert reading.namespaces == ("batch",)
    assert names(reading) == ["batch/job-0"]
    assert w.seen == [reading]


async def test_a_namespace_whose_list_fails_holds_the_others_back_in_nothing(
    tmp_path: Path,
) -> None:
    message = 'pods is forbidden: User "system:serviceaccount:keda:scaler" cannot list "pods"'
    demand = PodNamespaces.triggers()
    demand.require("ml")
    async with open_fake_kube_api() as api:
        three_namespaces(api)
        api.fail(403, message, on="list", namespace="serving")
        async with following(api, tmp_path, demand) as w:
            await w.reading_where(lambda r: True)
            await watches_open(api, 1)
            demand.require("serving")
            fault = await w.fault_where(lambda f: "serving" in f.reason)
            # Meanwhile ml's changes are published at once, without serving's pods, and
            # say so: serving is not among the namespaces they hold.
            api.update_pod("ml", "train-0", phase="Succeeded")
            changed = await w.reading_where(lambda r: r.pods[0].terminated())
            api.heal()
            joined = await w.reading_where(lambda r: "serving" in (r.namespaces or ()))
    assert fault.reason == (
        f"Kubernetes API: list /api/v1/namespaces/serving/pods answered 403 Forbidden: {message}"
    )
    assert changed.namespaces == ("ml",)
    assert names(changed) == ["ml/train-0"]
    # Every reading before serving's list answered left it out, and named what it held.
    assert all(r.namespaces == ("ml",) for r in w.readings()[:-1])
    assert joined.namespaces == ("ml", "serving")
    assert names(joined) == ["ml/train-0", "serving/vllm-0", "serving/vllm-1"]


async def test_the_namespaces_named_at_the_start_are_published_whole(tmp_path: Path) -> None:
    """Those the demand names when the watch starts are published together, as a fixed set
    is; only later ones join one by one."""
    demand = PodNamespaces.triggers()
    demand.require("ml")
    demand.require("serving")
    async with open_fake_kube_api() as api:
        three_namespaces(api)
        api.fail(503, on="list", namespace="serving", count=3)
        async with following(api, tmp_path, demand) as w:
            first = await w.reading_where(lambda r: True)
    assert first.namespaces == ("ml", "serving")
    assert names(first) == ["ml/train-0", "serving/vllm-0", "serving/vllm-1"]
    assert requests_of(api, "serving")[:4] == ["list"] * 4


async def test_past_the_limit_one_watch_of_every_namespace_replaces_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    demand = PodNamespaces.triggers(limit=2)
    demand.require("ml")
    async with open_fake_kube_api() as api:
        three_namespaces(api)
        api.add_pod("other", "elsewhere", node="node-b")
        async with following(api, tmp_path, demand) as w:
            await w.reading_where(lambda r: True)
            demand.require("serving")
            await w.reading_where(lambda r: r.namespaces == ("ml", "serving"))
            await watches_open(api, 2)
            demand.require("batch")  # the third: every namespace from now on
            demand.require("more")
            every = await w.reading_where(lambda r: r.namespaces is None)
            api.add_pod("late", "new-0", node="node-c")
            added = await w.reading_where(lambda r: "late/new-0" in names(r))
            # That came through the watch of every namespace; those of one have stopped.
            await watches_open(api, 1)
    assert demand.names is None
    assert every.on_demand
    assert names(every) == [
        "batch/job-0",
        "ml/train-0",
        "other/elsewhere",
        "serving/vllm-0",
        "serving/vllm-1",
    ]
    assert added.namespaces is None
    assert [r.path for r in api.lists()][-1] == "/api/v1/pods"
    assert requests_of(api, "batch") == []  # never watched on its own
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert [r.getMessage() for r in warnings] == ["pod watch covers every namespace from now on"]


def test_a_watch_follows_namespaces_given_or_a_demand_not_both() -> None:
    with pytest.raises(ValueError, match="namespaces given or a demand, not both"):
        PodWatcher.cluster(["ml"], demand=PodNamespaces.triggers())


@pytest.mark.parametrize(
    ("flag", "paths", "namespaces"),
    [
        ("all", {"/api/v1/pods"}, None),
        (
            "serving,ml",
            {"/api/v1/namespaces/ml/pods", "/api/v1/namespaces/serving/pods"},
            ("ml", "serving"),
        ),
        ("triggers", {"/api/v1/namespaces/batch/pods"}, ("batch",)),
    ],
)
async def test_each_flag_value_builds_its_watch(
    tmp_path: Path, flag: str, paths: set[str], namespaces: tuple[str, ...] | None
) -> None:
    chosen = PodNamespaces.parse(flag)
    chosen.require("batch")  # a trigger's: only triggers follows it
    async with open_fake_kube_api() as api:
        three_namespaces(api)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, token="fake-token")
        (watcher,) = build_cluster_pods(chosen, kubeconfig=str(kubeconfig))
        send, receive = anyio.create_memory_object_stream[Sample](100)
        async with receive, anyio.create_task_group() as tg:
            tg.start_soon(watcher.run, send)
            with anyio.fail_after(WAIT_S):
                reading = await receive.receive()
            tg.cancel_scope.cancel()
    assert isinstance(reading, PodsReading)
    assert reading.namespaces == namespaces
    assert reading.on_demand is (flag == "triggers")
    assert {r.path for r in api.lists()} == paths
