"""PodWatcher: the actor that keeps this node's pods, through the Kubernetes API.

List, then watch, as Kubernetes' own informers do, with the steps kr8s's watch lacks::

    LIST  /api/v1/pods?fieldSelector=spec.nodeName=<node>&limit=500[&continue=...]
          -> every pod of the node and the list's resourceVersion; publish
          (the first list asks resourceVersion=0: the API server's watch cache may answer,
          which is cheap when a whole DaemonSet starts; a list after 410 reads the latest)
    WATCH ...&watch=true&resourceVersion=<rv>&allowWatchBookmarks=true&timeoutSeconds=<n>
          ADDED, MODIFIED   upsert by namespace/name
          DELETED           remove
          BOOKMARK          progress only
          ERROR 410         the resourceVersion expired: list again
          ERROR other       a fault; resume after a backoff delay
    the server ends the watch (timeoutSeconds)
          -> watch again at once from the last resourceVersion seen, without listing
    the connection drops or hangs
          -> a fault; after a backoff delay, watch again from there, without listing

Every event moves the resourceVersion the next watch starts from, bookmarks included, so a
quiet node resumes near the present. A watch answered with HTTP 410 also means list
again; a 410 right after a fresh list is a fault (with backoff), and so is a second watch
in a row that the server ended within a second without an event, so a confused server or
proxy cannot make the watcher loop.

Readings (``PodsReading``: the whole set, sorted by namespace then name) say when the API
last answered: a list, any watch event, a watch that opened with 200, a watch that ended
cleanly. ``period_s`` is 10 s, so the labels are unavailable once the API has not answered
for 30 s (three periods). A watch asks the server to end it after 15 to 20 s (drawn per
watch, so a DaemonSet's watches do not all end together), so a healthy API answers at
least that often even when nothing changes; a read waits that long plus the request timeout
(5 s) before the connection counts as hung. What is published is paced by
:class:`~keda_gpu_scaler.sources.kube.podset.Pacing`: every change at once, otherwise at
most one reading per ``refresh_s`` (1 s).

Failures (no connection, a timeout, 401/403 with the API's message, 5xx, bad JSON) are
published as a ``SourceFault`` whose reason names the request and the answer, and retried
with :class:`~keda_gpu_scaler.domain.backoff.Backoff` delays; the last reading goes stale on
its own meanwhile. Bad JSON in a watch means an event may be lost, so the retry lists
again. A missing configuration (no kubeconfig and not in a cluster) raises
``SourceUnavailable`` out of :meth:`PodWatcher.run`: the supervisor logs it, publishes it
as a fault, and restarts the watcher with its own backoff, so a kubeconfig mounted later is
found.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.samples import (
    PODS_SOURCE,
    PodInfo,
    PodsReading,
    Sample,
    SourceFault,
)
from keda_gpu_scaler.sources.kube.client import SERVICE_ACCOUNT, KubeClient, KubeFailure, KubeGone
from keda_gpu_scaler.sources.kube.podset import Pacing, PodSet
from keda_gpu_scaler.sources.kube.wire import (
    WatchError,
    WireError,
    decode_event,
    decode_page,
)

PERIOD_S = 10.0
"""A reading's period: the labels are unavailable after three without an answer (30 s)."""
DEFAULT_WATCH_TIMEOUT_S = 20
DEFAULT_REQUEST_TIMEOUT_S = 5.0
DEFAULT_REFRESH_S = 1.0
DEFAULT_PAGE_SIZE = 500
DEFAULT_BACKOFF = Backoff(initial_s=0.5, factor=2.0, maximum_s=30.0)

log = logging.getLogger(__name__)

_SHORT_WATCH_S = 1.0
"""A watch that ends sooner, without an event, is suspect; two in a row are a failure."""
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True, slots=True)
class PodWatchStatistics:
    """What the watcher did so far, for logs, the debug endpoint and tests."""

    lists: int
    watches: int
    events: int
    readings: int
    faults: int
    pods: int
    resource_version: str | None
    last_answer_at: float | None
    failing: str | None
    """The reason of the last fault, until the API answers again."""


class PodWatcher:
    """This node's pods, published as :class:`PodsReading`; see the module docstring.

    ``kubeconfig`` is a path (else kr8s's defaults: ``KUBECONFIG``, ``~/.kube/config``,
    then the service account at ``serviceaccount``). ``watch_timeout_s`` is the longest a
    watch is asked to last (each one draws 3/4 of it to all of it); ``request_timeout_s``
    bounds connecting, a list, and how much longer than that a watch may stay silent.
    """

    name = PODS_SOURCE

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
        if not node_name:
            raise ValueError("the pod watch needs this node's name (--node-name or NODE_NAME)")
        if len(node_name) > 253 or not _NODE_NAME.fullmatch(node_name):
            raise ValueError(f"node name {node_name!r} is not a Kubernetes node name")
        if watch_timeout_s < 1:
            raise ValueError(f"watch_timeout_s must be 1 or more, not {watch_timeout_s}")
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be positive, not {request_timeout_s}")
        if page_size < 1:
            raise ValueError(f"page_size must be 1 or more, not {page_size}")
        self.node_name = node_name
        self._kubeconfig = kubeconfig
        self._serviceaccount = serviceaccount
        self._watch_timeout_s = watch_timeout_s
        self._request_timeout_s = request_timeout_s
        self._page_size = page_size
        self._backoff = backoff
        self._rng = rng or random.Random()
        self._selector = f"spec.nodeName={node_name}"
        self._pods = PodSet()
        self._pacing = Pacing(refresh_s)
        self._failures = 0
        self._fresh_list = False
        self._short_watches = 0
        self._lists = self._watches = self._events = self._readings = self._faults = 0
        self._last_answer_at: float | None = None
        self._failing: str | None = None

    def statistics(self) -> PodWatchStatistics:
        return PodWatchStatistics(
            lists=self._lists,
            watches=self._watches,
            events=self._events,
            readings=self._readings,
            faults=self._faults,
            pods=len(self._pods),
            resource_version=self._pods.resource_version,
            last_answer_at=self._last_answer_at,
            failing=self._failing,
        )

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            task_status.started()
            async with KubeClient(
                kubeconfig=self._kubeconfig,
                serviceaccount=self._serviceaccount,
                timeout_s=self._request_timeout_s,
            ) as client:
                await self._connect(client, send)
                while True:
                    await self._step(client, send)

    async def _connect(self, client: KubeClient, send: MemoryObjectSendStream[Sample]) -> None:
        while True:
            try:
                await client.connect()
                return
            except KubeFailure as exc:
                await self._failed(send, exc.reason)

    async def _step(self, client: KubeClient, send: MemoryObjectSendStream[Sample]) -> None:
        """List if there is no position to watch from, then watch once."""
        try:
            if self._pods.resource_version is None:
                await self._list(client, send)
            await self._watch(client, send)
        except KubeGone as exc:
            # Relist at once, unless the list just made is what expired: then the server
            # is confused, and listing again at once could loop.
            fresh = self._fresh_list
            self._pods.forget_position()
            if fresh:
                await self._failed(send, f"{exc.reason} (right after a list)")
        except KubeFailure as exc:
            await self._failed(send, exc.reason)
        except WireError as exc:
            # An event may be lost: only a list makes the set whole again.
            self._pods.forget_position()
            await self._failed(send, f"Kubernetes API: {self._what('watch')}: {exc}")

    async def _list(self, client: KubeClient, send: MemoryObjectSendStream[Sample]) -> None:
        # resourceVersion=0 lets the first list come from the API server's watch cache
        # (cheap for a DaemonSet's worth of lists); a list after 410 reads the latest, which
        # the watch can resume from.
        first: dict[str, str] = {"resourceVersion": "0"} if self._lists == 0 else {}
        params = {"fieldSelector": self._selector, "limit": str(self._page_size), **first}
        pods: list[PodInfo] = []
        while True:
            async with client.get("pods", params, what=self._what("list")) as response:
                try:
                    page = decode_page(response.content)
                except WireError as exc:
                    raise KubeFailure(f"Kubernetes API: {self._what('list')}: {exc}") from exc
            pods.extend(page.pods)
            if not page.continue_token:
                break
            params = {
                "fieldSelector": self._selector,
                "limit": str(self._page_size),
                "continue": page.continue_token,
            }
        self._lists += 1
        self._fresh_list = True
        changed = self._pods.replace(pods, page.resource_version)
        await self._answered(send, changed=changed)

    async def _watch(self, client: KubeClient, send: MemoryObjectSendStream[Sample]) -> None:
        timeout_s = self._rng.randint(-(-self._watch_timeout_s * 3 // 4), self._watch_timeout_s)
        params = {
            "fieldSelector": self._selector,
            "watch": "true",
            "resourceVersion": self._pods.resource_version or "",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        self._watches += 1
        opened_at = anyio.current_time()
        events = 0
        async with client.get(
            "pods",
            params,
            what=self._what("watch"),
            stream=True,
            read_timeout_s=timeout_s + self._request_timeout_s,
        ) as response:
            await self._answered(send, changed=False)
            async for line in response.aiter_lines():
                if line.strip():
                    events += 1
                    await self._event(line, send)
        await self._ended(send, events=events, lasted_s=anyio.current_time() - opened_at)

    async def _event(self, line: str, send: MemoryObjectSendStream[Sample]) -> None:
        event = decode_event(line)
        self._events += 1
        if isinstance(event, WatchError):
            reason = (
                f"Kubernetes API: {self._what('watch')} sent ERROR {event.code}"
                f"{' ' + event.reason if event.reason else ''}: {event.message}"
            )
            raise KubeGone(reason) if event.is_gone() else KubeFailure(reason)
        changed = self._pods.apply(event)
        self._fresh_list = False
        self._failures = 0
        await self._answered(send, changed=changed)

    async def _ended(
        self, send: MemoryObjectSendStream[Sample], *, events: int, lasted_s: float
    ) -> None:
        """The server ended the watch cleanly: an answer, and the next watch resumes."""
        self._fresh_list = False
        if events == 0 and lasted_s < _SHORT_WATCH_S:
            self._short_watches += 1
            if self._short_watches > 1:
                await self._answered(send, changed=False)
                await self._failed(
                    send,
                    f"Kubernetes API: {self._what('watch')}: {self._short_watches} watches "
                    f"in a row ended within {_SHORT_WATCH_S:g} s without an event",
                )
                return
        else:
            self._short_watches = 0
            self._failures = 0
        await self._answered(send, changed=False)

    async def _answered(self, send: MemoryObjectSendStream[Sample], *, changed: bool) -> None:
        now = anyio.current_time()
        if self._last_answer_at is None or self._failing is not None:
            log.info(
                "Kubernetes API pod watch answering",
                extra={"source": self.name, "node": self.node_name, "pods": len(self._pods)},
            )
        self._last_answer_at = now
        self._failing = None
        if not self._pacing.is_due(changed=changed, now=now):
            return
        self._pacing.published(now)
        self._readings += 1
        reading = PodsReading(
            source=self.name,
            taken_at=now,
            period_s=PERIOD_S,
            node=self.node_name,
            pods=self._pods.pods(),
        )
        await send.send(reading)

    async def _failed(self, send: MemoryObjectSendStream[Sample], reason: str) -> None:
        """Publish the fault, then wait out the backoff delay of consecutive failures.

        Only a working watch (an event, or a watch that lasted) resets the count: a server
        that answers lists but fails every watch still backs off further each time."""
        self._failures += 1
        self._faults += 1
        self._pacing.faulted()
        delay = self._backoff.delay(self._failures)
        if reason != self._failing:
            # Once when the watch starts failing and when the cause changes, not every retry.
            log.warning(
                "Kubernetes API pod watch failing",
                extra={"source": self.name, "error": reason, "retry_in_s": delay},
            )
        self._failing = reason
        now = anyio.current_time()
        await send.send(SourceFault(source=self.name, key=None, at=now, reason=reason))
        await anyio.sleep(delay)

    def _what(self, verb: str) -> str:
        return f"{verb} /api/v1/pods?fieldSelector={self._selector}"
