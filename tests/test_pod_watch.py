"""The pod watch against a fake Kubernetes API on 127.0.0.1, through kr8s and a kubeconfig.

Real loopback I/O, so real time: every wait is for a published sample or a request the
fake saw, bounded by ``anyio.fail_after``; backoff delays are shortened to milliseconds.
The wire format and the pacing are also tested on their own, without I/O.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator
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
from keda_gpu_scaler.sources.kube.pods import pod_key
from keda_gpu_scaler.sources.kube.store import Pacing, Store
from keda_gpu_scaler.sources.kube.wire import (
    POD_CODEC,
    Bookmark,
    Delete,
    Upsert,
    WatchError,
    WireError,
)
from tests.fake_kube_api import FakeKubeApi, open_fake_kube_api, write_kubeconfig

NODE = "node-a"
SELECTOR = f"spec.nodeName={NODE}"
FAST = Backoff(initial_s=0.01, factor=2.0, maximum_s=0.04)
WAIT_S = 5.0
LIST_WHAT = f"list /api/v1/pods?fieldSelector={SELECTOR}"
WATCH_WHAT = f"watch /api/v1/pods?fieldSelector={SELECTOR}"


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

    def nothing_queued(self) -> bool:
        return self.samples.statistics().current_buffer_used == 0


@asynccontextmanager
async def watching(
    api: FakeKubeApi, tmp_path: Path, *, token: str = "fake-token", **options: Any
) -> AsyncIterator[Watch]:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, token=token)
    settings: dict[str, Any] = {"backoff": FAST, "refresh_s": 60.0, **options}
    watcher = PodWatcher(
        NODE,
        kubeconfig=str(kubeconfig),
        serviceaccount=str(tmp_path / "no-service-account"),
        **settings,
    )
    send, receive = anyio.create_memory_object_stream[Sample](1000)
    async with receive, anyio.create_task_group() as tg:
        tg.start_soon(watcher.run, send)
        yield Watch(watcher, receive)
        tg.cancel_scope.cancel()


async def watch_opened(api: FakeKubeApi, count: int = 1) -> None:
    """Until the fake has seen ``count`` watches and has one open now."""
    with anyio.fail_after(WAIT_S):
        await api.wait_until(lambda: len(api.watches()) >= count and api.open_watches == 1)


def names(reading: PodsReading) -> list[str]:
    return [f"{pod.namespace}/{pod.name}" for pod in reading.pods]


def labels_of(reading: PodsReading, name: str) -> dict[str, str]:
    return next(pod.labels for pod in reading.pods if pod.name == name)


# -- list, then watch ----------------------------------------------------------------


@pytest.mark.anyio
async def test_lists_this_nodes_pods_then_watches_from_the_lists_version(tmp_path: Path) -> None:
    async with open_fake_kube_api(token="s3cret") as api:
        api.add_pod("ml", "vllm-1", node=NODE, labels={"app": "vllm"})
        api.add_pod("default", "other-node", node="node-b")
        api.add_pod("ml", "vllm-0", node=NODE, labels={"app": "vllm"}, phase="Pending")
        api.add_pod("batch", "unscheduled", node=None)
        before = anyio.current_time()
        async with watching(api, tmp_path, token="s3cret") as w:
            first = await w.reading()
            await watch_opened(api)
    assert first.source == PODS_SOURCE
    assert first.node == NODE
    assert first.period_s == 10.0
    assert before < first.taken_at <= anyio.current_time()
    assert names(first) == ["ml/vllm-0", "ml/vllm-1"]
    assert first.pods[0] == PodInfo(
        namespace="ml",
        name="vllm-0",
        uid="00000000-0000-4000-8000-000000000003",
        labels={"app": "vllm"},
        phase="Pending",
        node=NODE,
    )
    listed, watched = api.pod_requests()
    assert dict(listed.query) == {"fieldSelector": SELECTOR, "limit": "500", "resourceVersion": "0"}
    assert watched.query["fieldSelector"] == SELECTOR
    assert watched.query["watch"] == "true"
    assert watched.query["allowWatchBookmarks"] == "true"
    assert watched.query["resourceVersion"] == api.resource_version
    assert 15 <= int(watched.query["timeoutSeconds"]) <= 20
    assert {r.authorization for r in api.requests} == {"Bearer s3cret"}


@pytest.mark.anyio
async def test_added_modified_and_deleted_change_the_published_set(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_pod("ml", "vllm-0", node=NODE, labels={"app": "vllm"})
        async with watching(api, tmp_path) as w:
            assert names(await w.reading()) == ["ml/vllm-0"]
            await watch_opened(api)
            api.add_pod("ml", "vllm-1", node=NODE, labels={"app": "vllm"})
            assert names(await w.reading()) == ["ml/vllm-0", "ml/vllm-1"]
            api.update_pod("ml", "vllm-0", labels={"app": "vllm", "tier": "gold"})
            changed = await w.reading()
            assert labels_of(changed, "vllm-0") == {"app": "vllm", "tier": "gold"}
            api.update_pod("ml", "vllm-1", phase="Succeeded")
            finished = await w.reading()
            assert finished.pods[1].phase == "Succeeded" and finished.pods[1].terminated()
            api.delete_pod("ml", "vllm-0")
            assert names(await w.reading()) == ["ml/vllm-1"]
            assert len(api.lists()) == 1
            assert len(api.watches()) == 1
            # The next watch resumes from the last event.
            seen = api.resource_version
            api.end_watches()
            await watch_opened(api, 2)
    assert api.watches()[1].query["resourceVersion"] == seen


@pytest.mark.anyio
async def test_changes_nobody_reads_publish_nothing_until_a_change(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_pod("ml", "vllm-0", node=NODE)
        async with watching(api, tmp_path) as w:
            first = await w.reading()
            await watch_opened(api)
            api.touch_pod("ml", "vllm-0")
            api.add_pod("ml", "elsewhere", node="node-b")
            api.bookmark()
            api.add_pod("ml", "vllm-1", node=NODE)
            after = await w.reading()
            assert w.nothing_queued()  # two readings in all: the first, then the new pod's
    assert names(after) == ["ml/vllm-0", "ml/vllm-1"]
    assert after.taken_at > first.taken_at
    # The touch, the bookmark and the new pod came; the other node's pod did not.
    assert api.events_sent == 3


@pytest.mark.anyio
async def test_a_pod_scheduled_onto_the_node_appears_and_one_moved_away_leaves(
    tmp_path: Path,
) -> None:
    async with open_fake_kube_api() as api:
        api.add_pod("ml", "pending", node=None, phase="Pending")
        api.add_pod("ml", "here", node=NODE)
        async with watching(api, tmp_path) as w:
            assert names(await w.reading()) == ["ml/here"]
            await watch_opened(api)
            api.update_pod("ml", "pending", node=NODE)
            assert names(await w.reading()) == ["ml/here", "ml/pending"]
            api.update_pod("ml", "here", node="node-b")
            assert names(await w.reading()) == ["ml/pending"]


@pytest.mark.anyio
async def test_a_big_list_is_read_in_pages(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        for i in range(5):
            api.add_pod("ml", f"pod-{i}", node=NODE)
        async with watching(api, tmp_path, page_size=2) as w:
            reading = await w.reading()
            await watch_opened(api)
    assert names(reading) == [f"ml/pod-{i}" for i in range(5)]
    first, second, third = api.lists()
    assert first.query["resourceVersion"] == "0"
    assert "continue" not in first.query
    for page in (second, third):
        assert page.query["continue"]
        assert page.query["limit"] == "2"
        assert "resourceVersion" not in page.query
    assert api.watches()[0].query["resourceVersion"] == api.resource_version


# -- resuming and relisting ----------------------------------------------------------


@pytest.mark.anyio
async def test_a_watch_that_ends_is_resumed_from_the_last_event_without_a_list(
    tmp_path: Path,
) -> None:
    async with open_fake_kube_api() as api, watching(api, tmp_path) as w:
        assert names(await w.reading()) == []
        await watch_opened(api)
        api.add_pod("ml", "vllm-0", node=NODE)
        await w.reading()
        seen = api.resource_version
        api.end_watches()
        await watch_opened(api, 2)
        api.add_pod("ml", "vllm-1", node=NODE)
        assert names(await w.reading()) == ["ml/vllm-0", "ml/vllm-1"]
    first, second = api.watches()
    assert second.query["resourceVersion"] == seen != first.query["resourceVersion"]
    assert len(api.lists()) == 1


@pytest.mark.anyio
async def test_a_bookmark_moves_where_the_next_watch_resumes(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_pod("ml", "vllm-0", node=NODE)
        async with watching(api, tmp_path) as w:
            await w.reading()
            await watch_opened(api)
            for i in range(3):
                api.add_pod("other", f"p{i}", node="node-b")
            api.bookmark()
            api.end_watches()  # after the bookmark, on the same stream
            await watch_opened(api, 2)
            assert w.nothing_queued()
    assert api.watches()[1].query["resourceVersion"] == api.resource_version
    assert api.events_sent == 1  # the bookmark; the other node's pods were not sent
    assert len(api.lists()) == 1


@pytest.mark.anyio
async def test_a_dropped_connection_is_resumed_without_a_list_and_misses_nothing(
    tmp_path: Path,
) -> None:
    async with open_fake_kube_api() as api:
        api.add_pod("ml", "vllm-0", node=NODE)
        async with watching(api, tmp_path) as w:
            await w.reading()
            await watch_opened(api)
            api.drop_connections()
            # Made while no watch is open: the resumed watch replays it.
            api.update_pod("ml", "vllm-0", labels={"tier": "gold"})
            fault = await w.fault()
            reopened = await w.reading()
            changed = await w.reading()
    assert fault.reason.startswith(f"Kubernetes API: {WATCH_WHAT}: the connection broke")
    # The reopened watch is an answer (it clears the fault), then the replay comes.
    assert labels_of(reopened, "vllm-0") == {}
    assert labels_of(changed, "vllm-0") == {"tier": "gold"}
    assert len(api.lists()) == 1
    assert len(api.watches()) == 2


@pytest.mark.anyio
async def test_an_error_event_410_makes_a_fresh_list(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_pod("ml", "vllm-0", node=NODE)
        async with watching(api, tmp_path) as w:
            await w.reading()
            await watch_opened(api)
            api.add_pod("ml", "vllm-1", node=NODE)
            await w.reading()
            api.send_error(410)
            await watch_opened(api, 2)
            api.delete_pod("ml", "vllm-0")
            assert names(await w.reading()) == ["ml/vllm-1"]
            assert w.nothing_queued()
    first, relist = api.lists()
    assert first.query["resourceVersion"] == "0"
    assert "resourceVersion" not in relist.query
    assert relist.query["fieldSelector"] == SELECTOR


@pytest.mark.anyio
@pytest.mark.parametrize("too_old", ["status", "event"])
async def test_a_resume_from_an_expired_version_makes_a_fresh_list(
    tmp_path: Path, too_old: str
) -> None:
    async with open_fake_kube_api(too_old=too_old) as api:
        api.add_pod("ml", "vllm-0", node=NODE)
        async with watching(api, tmp_path) as w:
            await w.reading()
            await watch_opened(api)
            api.add_pod("ml", "vllm-1", node=NODE)
            await w.reading()
            seen = api.resource_version
            # Changes the watch does not see move the version on; then history is compacted.
            api.add_pod("other", "elsewhere", node="node-b")
            api.compact()
            api.end_watches()
            with anyio.fail_after(WAIT_S):
                await api.wait_until(lambda: len(api.lists()) == 2)
            await watch_opened(api, 3)
            assert w.nothing_queued()
    watches = api.watches()
    assert watches[1].query["resourceVersion"] == seen
    assert watches[2].query["resourceVersion"] == api.resource_version != seen


@pytest.mark.anyio
async def test_a_410_right_after_a_list_is_a_fault_not_a_tight_loop(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.fail(410, "too old resource version: 1 (100)", on="watch", count=1)
        async with watching(api, tmp_path) as w:
            await w.reading()
            fault = await w.fault()
            await w.reading()
            await watch_opened(api, 2)
    assert fault.reason == (
        f"Kubernetes API: {WATCH_WHAT} answered 410 Gone: too old resource version: 1 (100) "
        "(right after a list)"
    )
    assert len(api.lists()) == 2


@pytest.mark.anyio
async def test_an_error_event_other_than_410_is_a_fault_and_the_watch_resumes(
    tmp_path: Path,
) -> None:
    async with open_fake_kube_api() as api, watching(api, tmp_path) as w:
        await w.reading()
        await watch_opened(api)
        api.send_error(500, "etcdserver: request timed out")
        fault = await w.fault()
        await w.reading()
        await watch_opened(api, 2)
    assert fault.reason == (
        f"Kubernetes API: {WATCH_WHAT} sent ERROR 500 InternalError: etcdserver: request timed out"
    )
    assert len(api.lists()) == 1


@pytest.mark.anyio
async def test_bad_json_in_a_watch_is_a_fault_then_a_fresh_list(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_pod("ml", "vllm-0", node=NODE)
        async with watching(api, tmp_path) as w:
            await w.reading()
            await watch_opened(api)
            api.send_raw(b'{"type": "ADDED", "object": {"metadata": 7}}\n')
            fault = await w.fault()
            assert names(await w.reading()) == ["ml/vllm-0"]
    assert fault.reason.startswith(f"Kubernetes API: {WATCH_WHAT}: a watch event is not valid")
    assert "$.metadata" in fault.reason
    assert len(api.lists()) == 2


@pytest.mark.anyio
async def test_watches_that_end_at_once_twice_in_a_row_are_a_fault(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api, watching(api, tmp_path) as w:
        await w.reading()
        await watch_opened(api)
        api.end_watches()
        await watch_opened(api, 2)
        assert w.nothing_queued()
        api.end_watches()
        fault = await w.fault()
        await w.reading()
    assert fault.reason == (
        f"Kubernetes API: {WATCH_WHAT}: 2 watches in a row ended within 1 s without an event"
    )


# -- failures ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_500_is_a_fault_naming_the_request_then_the_watcher_recovers(
    tmp_path: Path,
) -> None:
    async with open_fake_kube_api() as api:
        api.add_pod("ml", "vllm-0", node=NODE)
        api.fail(500, "etcdserver: leader changed", on="list", count=2)
        async with watching(api, tmp_path) as w:
            first, second = await w.fault(), await w.fault()
            reading = await w.reading()
    assert first.source == PODS_SOURCE and first.key is None
    assert first.reason == (
        f"Kubernetes API: {LIST_WHAT} answered 500 Internal Server Error: "
        "etcdserver: leader changed"
    )
    assert second.at - first.at >= FAST.delay(1)
    assert names(reading) == ["ml/vllm-0"]


@pytest.mark.anyio
async def test_a_403_carries_the_apis_message_and_clears_once_allowed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.sources.kube")
    message = 'pods is forbidden: User "system:serviceaccount:gpu:scaler" cannot watch "pods"'
    async with open_fake_kube_api() as api, watching(api, tmp_path) as w:
        await w.reading()
        api.fail(403, message, on="watch")
        fault = await w.fault()
        again = await w.fault()
        api.heal()
        recovered = await w.reading()
    assert fault.reason == f"Kubernetes API: {WATCH_WHAT} answered 403 Forbidden: {message}"
    assert again.reason == fault.reason
    # Logged when it starts answering, once when it starts failing (not per retry), and
    # when it answers again.
    logged = [(r.levelname, r.getMessage(), getattr(r, "error", None)) for r in caplog.records]
    assert logged == [
        ("INFO", "Kubernetes API pod watch answering", None),
        ("WARNING", "Kubernetes API pod watch failing", fault.reason),
        ("INFO", "Kubernetes API pod watch answering", None),
    ]
    assert recovered.taken_at > again.at
    # kr8s loads the credentials again and retries a 401/403 three times before failing.
    assert len([r for r in api.watches() if r.query["resourceVersion"]]) >= 8


@pytest.mark.anyio
async def test_a_wrong_token_is_a_401_until_the_kubeconfig_has_the_right_one(
    tmp_path: Path,
) -> None:
    async with (
        open_fake_kube_api(token="right") as api,
        watching(api, tmp_path, token="wrong") as w,
    ):
        fault = await w.fault()
        write_kubeconfig(tmp_path / "kubeconfig", api.url, token="right")
        while isinstance(sample := await w.next(), SourceFault):
            pass
    assert fault.reason == "Kubernetes API: GET /version answered 401 Unauthorized: Unauthorized"
    assert isinstance(sample, PodsReading)
    assert api.requests[-1].authorization == "Bearer right"


@pytest.mark.anyio
async def test_while_the_api_is_down_no_reading_is_published_so_labels_go_stale(
    tmp_path: Path,
) -> None:
    async with open_fake_kube_api() as api:
        api.add_pod("ml", "vllm-0", node=NODE)
        # Every answer publishes (no refresh interval): the readings say when it answered.
        async with watching(api, tmp_path, refresh_s=0.0) as w:
            listed = await w.reading()
            last = await w.reading()  # the watch that opened answered too
            await watch_opened(api)
            await api.take_down()
            # Faults only: the API answered nothing meanwhile.
            faults = [await w.fault() for _ in range(4)]
            await api.bring_up()
            while isinstance(sample := await w.next(), SourceFault):
                pass
    assert isinstance(sample, PodsReading)
    assert sample.taken_at > faults[-1].at > last.taken_at > listed.taken_at
    assert faults[0].reason.startswith(f"Kubernetes API: {WATCH_WHAT}: the connection broke")
    assert faults[-1].reason.startswith(f"Kubernetes API: {WATCH_WHAT}: cannot connect")
    # Exponential backoff between attempts, capped.
    gaps = [b.at - a.at for a, b in itertools.pairwise(faults[1:])]
    assert all(gap >= FAST.delay(2) for gap in gaps)
    assert len(api.lists()) == 1


@pytest.mark.anyio
async def test_a_list_that_never_answers_times_out_with_a_fault(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.hang(on="list")
        async with watching(api, tmp_path, request_timeout_s=0.2) as w:
            # A busy machine may take longer than that to load the credentials.
            while (fault := await w.fault()).reason.startswith("Kubernetes API: GET /version"):
                pass
            api.heal()
            await w.reading()
    assert fault.reason == f"Kubernetes API: {LIST_WHAT}: no answer in time (limit 0.2 s)"


@pytest.mark.anyio
async def test_a_server_that_never_answers_the_version_times_out(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.hang()
        async with watching(api, tmp_path, request_timeout_s=0.1) as w:
            fault = await w.fault()
            api.heal()
            await w.reading()
    assert fault.reason == "Kubernetes API: GET /version: no answer within 0.1 s"


# -- freshness ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_taken_at_advances_when_a_quiet_watch_is_reopened(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_pod("ml", "vllm-0", node=NODE)
        async with watching(api, tmp_path, refresh_s=0.0) as w:
            listed = await w.reading()
            opened = await w.reading()
            await watch_opened(api)
            api.end_watches()
            ended = await w.reading()
            reopened = await w.reading()
            await watch_opened(api, 2)
    assert listed.taken_at < opened.taken_at < ended.taken_at < reopened.taken_at
    assert listed.pods == opened.pods == ended.pods == reopened.pods
    assert len(api.lists()) == 1


@pytest.mark.anyio
async def test_an_answer_that_changes_nothing_publishes_once_the_last_reading_is_old(
    tmp_path: Path,
) -> None:
    async with open_fake_kube_api() as api, watching(api, tmp_path, refresh_s=0.05) as w:
        first = await w.reading()
        await watch_opened(api)
        await anyio.sleep(0.06)
        api.bookmark()
        refreshed = await w.reading()
        api.bookmark()  # within refresh_s of that reading: it publishes nothing...
        api.add_pod("ml", "vllm-0", node=NODE)
        changed = await w.reading()  # ...so the next reading is the change's
    assert refreshed.taken_at - first.taken_at >= 0.05
    assert names(refreshed) == [] and names(changed) == ["ml/vllm-0"]


# -- configuration ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_kubeconfig_from_the_environment_is_used_when_none_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_fake_kube_api(token="from-env") as api:
        path = write_kubeconfig(tmp_path / "env-kubeconfig", api.url, token="from-env")
        monkeypatch.setenv("KUBECONFIG", str(path))
        watcher = PodWatcher(NODE, serviceaccount=str(tmp_path / "none"), backoff=FAST)
        send, receive = anyio.create_memory_object_stream[Sample](10)
        async with receive, anyio.create_task_group() as tg:
            tg.start_soon(watcher.run, send)
            with anyio.fail_after(WAIT_S):
                reading = await receive.receive()
            tg.cancel_scope.cancel()
    assert isinstance(reading, PodsReading)
    assert api.requests[0].authorization == "Bearer from-env"


@pytest.mark.anyio
async def test_no_kubeconfig_and_no_service_account_is_source_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    watcher = PodWatcher(NODE, serviceaccount=str(tmp_path / "no-sa"))
    send, receive = anyio.create_memory_object_stream[Sample](10)
    with receive, pytest.raises(SourceUnavailable) as info:
        await watcher.run(send)
    assert str(info.value) == (
        f"Kubernetes API: no credentials: KUBECONFIG={tmp_path / 'missing'} gives no cluster, "
        f"and there is no service account at {tmp_path / 'no-sa'} (not running in a cluster?)"
    )


@pytest.mark.anyio
async def test_an_explicit_kubeconfig_that_does_not_exist_is_named(tmp_path: Path) -> None:
    watcher = PodWatcher(NODE, kubeconfig=str(tmp_path / "nope"))
    send, receive = anyio.create_memory_object_stream[Sample](10)
    with receive, pytest.raises(SourceUnavailable) as info:
        await watcher.run(send)
    assert str(info.value) == f"Kubernetes API: kubeconfig {tmp_path / 'nope'} does not exist"


@pytest.mark.anyio
async def test_a_kubeconfig_that_does_not_load_is_source_unavailable(tmp_path: Path) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("clusters: [\n")
    watcher = PodWatcher(NODE, kubeconfig=str(broken))
    send, receive = anyio.create_memory_object_stream[Sample](10)
    with receive, pytest.raises(SourceUnavailable) as info:
        await watcher.run(send)
    assert str(info.value).startswith(
        f"Kubernetes API: cannot load the credentials (kubeconfig {broken}"
    )


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ("", "needs this node's name"),
        ("Node_A", "'Node_A' is not a Kubernetes node name"),
        ("a,b", "'a,b' is not a Kubernetes node name"),
        ("x" * 254, "is not a Kubernetes node name"),
    ],
)
def test_a_bad_node_name_is_refused_at_construction(node: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PodWatcher(node)


@pytest.mark.parametrize(
    ("option", "value"),
    [("watch_timeout_s", 0), ("request_timeout_s", 0.0), ("page_size", 0), ("refresh_s", -1.0)],
)
def test_bad_options_are_refused_naming_the_option(option: str, value: float) -> None:
    options: dict[str, Any] = {option: value}
    with pytest.raises(ValueError, match=option):
        PodWatcher(NODE, **options)


@pytest.mark.anyio
async def test_the_connection_is_closed_when_the_watcher_is_cancelled(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.fail(500, on="watch")
        slow = Backoff(initial_s=60.0, maximum_s=60.0)
        async with watching(api, tmp_path, backoff=slow) as w:
            await w.reading()
            await w.fault()
            # Waiting out the backoff: the connection is idle in the httpx client's pool.
            assert api.open_connections == 1
        with anyio.fail_after(WAIT_S):
            await api.wait_until(lambda: api.open_connections == 0)


@pytest.mark.trio
async def test_the_watch_runs_on_trio_too(tmp_path: Path) -> None:
    async with open_fake_kube_api() as api:
        api.add_pod("ml", "vllm-0", node=NODE)
        async with watching(api, tmp_path) as w:
            assert names(await w.reading()) == ["ml/vllm-0"]
            await watch_opened(api)
            api.update_pod("ml", "vllm-0", labels={"app": "vllm"})
            assert labels_of(await w.reading(), "vllm-0") == {"app": "vllm"}


# -- the wire format and the pacing, without I/O ----------------------------------------


def test_a_pod_list_decodes_what_is_read_and_skips_the_rest() -> None:
    body = (
        b'{"kind":"PodList","metadata":{"resourceVersion":"812","continue":"abc"},"items":['
        b'{"metadata":{"namespace":"ml","name":"a","uid":"u1","labels":{"app":"x"},'
        b'"resourceVersion":"800"},"spec":{"containers":[{"name":"c"}]},"status":{"phase":"Running"}},'
        b'{"metadata":{"namespace":"ml","name":"b"}}]}'
    )
    page = POD_CODEC.decode_page(body)
    assert page.resource_version == "812"
    assert page.continue_token == "abc"
    assert page.items == (
        PodInfo(namespace="ml", name="a", uid="u1", labels={"app": "x"}, phase="Running"),
        PodInfo(namespace="ml", name="b"),
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[]", "the pod list is not a PodList"),
        (b'{"metadata":{},"items":[]}', "no metadata.resourceVersion"),
        (b'{"metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"a"}}]}', "namespace"),
        (b"<html>", "the pod list is not a PodList"),
    ],
)
def test_a_bad_pod_list_is_a_wire_error_naming_what(body: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message):
        POD_CODEC.decode_page(body)


def test_watch_events_decode_by_type() -> None:
    pod = '{"metadata":{"namespace":"ml","name":"a","resourceVersion":"9"},"status":{}}'
    assert POD_CODEC.decode_event(f'{{"type":"ADDED","object":{pod}}}') == Upsert(
        PodInfo(namespace="ml", name="a"), "9"
    )
    assert POD_CODEC.decode_event(f'{{"type":"DELETED","object":{pod}}}') == Delete(
        PodInfo(namespace="ml", name="a"), "9"
    )
    bookmark = '{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"12"}}}'
    assert POD_CODEC.decode_event(bookmark) == Bookmark("12")
    error = (
        '{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"m"}}'
    )
    assert POD_CODEC.decode_event(error) == WatchError(410, "Expired", "m")
    assert WatchError(410, "Expired", "m").is_gone() and not WatchError(500, "", "").is_gone()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"type":"SURPRISE","object":{}}', "unknown watch event type 'SURPRISE'"),
        ('{"type":"BOOKMARK","object":{"metadata":{}}}', "BOOKMARK event has no"),
        ('{"type":"ADDED"}', "a watch event is not valid"),
        ("not json", "a watch event is not valid"),
    ],
)
def test_a_bad_watch_event_is_a_wire_error_naming_what(line: str, message: str) -> None:
    with pytest.raises(WireError, match=message):
        POD_CODEC.decode_event(line)


def test_the_pod_set_says_what_changed_and_keeps_the_resume_point() -> None:
    pods = Store(pod_key)  # as the pod watch keeps them
    a = PodInfo(namespace="ml", name="a", labels={"app": "x"}, phase="Running")
    b = PodInfo(namespace="default", name="b")
    assert pods.replace([a, b], "10") is True
    assert pods.items() == (b, a)
    assert pods.replace([b, a], "11") is False
    assert pods.apply(Upsert(a, "12")) is False
    relabelled = PodInfo(namespace="ml", name="a", labels={"app": "y"}, phase="Running")
    assert pods.apply(Upsert(relabelled, "13")) is True
    assert pods.items() == (b, relabelled)  # the sorted set is kept only until a change
    assert pods.apply(Bookmark("20")) is False
    assert pods.resource_version == "20"
    assert pods.apply(Delete(b, "21")) is True
    assert pods.apply(Delete(b, "22")) is False
    assert pods.items() == (relabelled,)
    pods.forget_position()
    assert pods.resource_version is None


def test_pacing_publishes_changes_at_once_and_sameness_once_per_refresh() -> None:
    pacing = Pacing(refresh_s=1.0)
    assert pacing.is_due(changed=False, now=0.0)
    pacing.published(0.0)
    assert not pacing.is_due(changed=False, now=0.5)
    assert pacing.is_due(changed=True, now=0.5)
    assert pacing.is_due(changed=False, now=1.0)
    pacing.published(1.0)
    pacing.faulted()
    assert pacing.is_due(changed=False, now=1.1)
    pacing.published(1.1)
    assert not pacing.is_due(changed=False, now=1.2)
