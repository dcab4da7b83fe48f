"""ListWatch: list, then watch, one collection of the Kubernetes API, for as long as it runs.

The engine under the pod watch and the EndpointSlice discovery, with the steps kr8s's watch
lacks (``docs/decisions/0001-kubernetes-client.md``)::

    LIST  <collection>?<selector>&limit=500[&continue=...]
          -> every object and the list's resourceVersion; an answer
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
quiet collection resumes near the present. A watch answered with HTTP 410 also means list
again; a 410 right after a fresh list is a fault (with backoff), and so is a second watch
in a row that the server ended within a second without an event, so a confused server or
proxy cannot make the engine loop. Bad JSON in a watch means an event may be lost, so the
retry lists again.

The engine keeps the objects in a :class:`~keda_gpu_scaler.sources.kube.store.Store` and
tells its owner two things, which the owner turns into samples:

    answered(changed, now)   the API answered (a list, any watch event, a watch that opened
                             with 200, a watch that ended cleanly); ``changed`` when the
                             store's objects changed
    failed(reason, now)      a request failed; ``reason`` names the request and the answer.
                             The engine then waits out a :class:`~keda_gpu_scaler.domain.
                             backoff.Backoff` delay, which only a working watch (an event, or
                             a watch that lasted) resets

A watch asks the server to end it after 3/4 of ``watch_timeout_s`` to all of it (drawn per
watch, so a DaemonSet's watches do not all end together), so a healthy API answers at least
that often even when nothing changes; a read waits that long plus the request timeout
before the connection counts as hung. A missing configuration (no kubeconfig and not in a
cluster) raises ``SourceUnavailable`` out of :meth:`ListWatch.run`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio

from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.sources.kube.client import SERVICE_ACCOUNT, KubeClient, KubeFailure, KubeGone
from keda_gpu_scaler.sources.kube.store import Key, Store
from keda_gpu_scaler.sources.kube.wire import Codec, WatchError, WireError

DEFAULT_WATCH_TIMEOUT_S = 20
DEFAULT_REQUEST_TIMEOUT_S = 5.0
DEFAULT_PAGE_SIZE = 500
DEFAULT_BACKOFF = Backoff(initial_s=0.5, factor=2.0, maximum_s=30.0)

_SHORT_WATCH_S = 1.0
"""A watch that ends sooner, without an event, is suspect; two in a row are a failure."""

T = TypeVar("T")

Answered = Callable[[bool, float], Awaitable[None]]
Failed = Callable[[str, float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Resource(Generic[T]):
    """One collection to list and watch: ``GET /api/<version>/<path>`` (``/apis/...`` for a
    group version) with one selector, decoded by ``codec``, kept by ``key``."""

    version: str
    """``v1``, or a group version such as ``discovery.k8s.io/v1``."""
    path: str
    """``pods``, ``namespaces/<ns>/endpointslices``, ..."""
    selector: tuple[str, str] | None
    """``("fieldSelector", "spec.nodeName=node-a")``, ``("labelSelector", ...)``; None for
    the whole collection."""
    codec: Codec[Any, T]
    key: Callable[[T], Key]
    title: str
    """Names the engine in logs: ``Kubernetes API <title> answering``."""

    def what(self, verb: str) -> str:
        """The request as failures name it: ``list /api/v1/pods?fieldSelector=...``."""
        base = "api" if self.version == "v1" else "apis"
        query = "" if self.selector is None else "?{}={}".format(*self.selector)
        return f"{verb} /{base}/{self.version}/{self.path}{query}"

    def selector_params(self) -> dict[str, str]:
        """The selector as query parameters (none for the whole collection)."""
        return {} if self.selector is None else dict([self.selector])


class ListWatch(Generic[T]):
    """Lists, then watches ``resource``; see the module docstring.

    ``kubeconfig`` is a path (else kr8s's defaults: ``KUBECONFIG``, ``~/.kube/config``,
    then the service account at ``serviceaccount``); ``request_timeout_s`` bounds
    connecting, a list, and how much longer than the watch's own timeout a watch may stay
    silent. ``source`` and ``log_fields`` go into the log records, written to ``log``."""

    def __init__(
        self,
        resource: Resource[T],
        *,
        source: str,
        log: logging.Logger,
        log_fields: Callable[[], Mapping[str, object]] = dict,
        kubeconfig: str | None = None,
        serviceaccount: str = SERVICE_ACCOUNT,
        watch_timeout_s: int = DEFAULT_WATCH_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        page_size: int = DEFAULT_PAGE_SIZE,
        backoff: Backoff = DEFAULT_BACKOFF,
        rng: random.Random | None = None,
    ) -> None:
        if watch_timeout_s < 1:
            raise ValueError(f"watch_timeout_s must be 1 or more, not {watch_timeout_s}")
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be positive, not {request_timeout_s}")
        if page_size < 1:
            raise ValueError(f"page_size must be 1 or more, not {page_size}")
        self.resource = resource
        self.store: Store[T] = Store(resource.key)
        self._source = source
        self._log = log
        self._log_fields = log_fields
        self._kubeconfig = kubeconfig
        self._serviceaccount = serviceaccount
        self._watch_timeout_s = watch_timeout_s
        self._request_timeout_s = request_timeout_s
        self._page_size = page_size
        self._backoff = backoff
        self._rng = rng or random.Random()
        self._failures = 0
        self._fresh_list = False
        self._short_watches = 0
        self._listed = False
        self.last_answer_at: float | None = None
        """When the API last answered; None until it did."""
        self._failing: str | None = None
        """The reason of the last fault, until the API answers again."""

    async def run(self, *, answered: Answered, failed: Failed) -> None:
        """List and watch until cancelled, telling ``answered`` and ``failed``."""
        async with KubeClient(
            kubeconfig=self._kubeconfig,
            serviceaccount=self._serviceaccount,
            timeout_s=self._request_timeout_s,
        ) as client:
            io = _Io(client, answered, failed)
            await self._connect(io)
            while True:
                await self._step(io)

    async def _connect(self, io: _Io) -> None:
        while True:
            try:
                await io.client.connect()
                return
            except KubeFailure as exc:
                await self._failed(io, exc.reason)

    async def _step(self, io: _Io) -> None:
        """List if there is no position to watch from, then watch once."""
        try:
            if self.store.resource_version is None:
                await self._list(io)
            await self._watch(io)
        except KubeGone as exc:
            # Relist at once, unless the list just made is what expired: then the server
            # is confused, and listing again at once could loop.
            fresh = self._fresh_list
            self.store.forget_position()
            if fresh:
                await self._failed(io, f"{exc.reason} (right after a list)")
        except KubeFailure as exc:
            await self._failed(io, exc.reason)
        except WireError as exc:
            # An event may be lost: only a list makes the set whole again.
            self.store.forget_position()
            await self._failed(io, f"Kubernetes API: {self.resource.what('watch')}: {exc}")

    async def _list(self, io: _Io) -> None:
        what = self.resource.what("list")
        selector = self.resource.selector_params()
        # resourceVersion=0 lets the first list come from the API server's watch cache
        # (cheap for a DaemonSet's worth of lists); a list after 410 reads the latest, which
        # the watch can resume from.
        first: dict[str, str] = {} if self._listed else {"resourceVersion": "0"}
        params = {**selector, "limit": str(self._page_size), **first}
        items: list[T] = []
        while True:
            async with io.client.get(
                self.resource.path, params, what=what, version=self.resource.version
            ) as response:
                try:
                    page = self.resource.codec.decode_page(response.content)
                except WireError as exc:
                    raise KubeFailure(f"Kubernetes API: {what}: {exc}") from exc
            items.extend(page.items)
            if not page.continue_token:
                break
            params = {**selector, "limit": str(self._page_size), "continue": page.continue_token}
        self._listed = True
        self._fresh_list = True
        changed = self.store.replace(items, page.resource_version)
        await self._answered(io, changed=changed)

    async def _watch(self, io: _Io) -> None:
        timeout_s = self._rng.randint(-(-self._watch_timeout_s * 3 // 4), self._watch_timeout_s)
        params = {
            **self.resource.selector_params(),
            "watch": "true",
            "resourceVersion": self.store.resource_version or "",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        opened_at = anyio.current_time()
        events = 0
        async with io.client.get(
            self.resource.path,
            params,
            what=self.resource.what("watch"),
            version=self.resource.version,
            stream=True,
            read_timeout_s=timeout_s + self._request_timeout_s,
        ) as response:
            await self._answered(io, changed=False)
            async for line in response.aiter_lines():
                if line.strip():
                    events += 1
                    await self._event(io, line)
        await self._ended(io, events=events, lasted_s=anyio.current_time() - opened_at)

    async def _event(self, io: _Io, line: str) -> None:
        event = self.resource.codec.decode_event(line)
        if isinstance(event, WatchError):
            reason = (
                f"Kubernetes API: {self.resource.what('watch')} sent ERROR {event.code}"
                f"{' ' + event.reason if event.reason else ''}: {event.message}"
            )
            raise KubeGone(reason) if event.is_gone() else KubeFailure(reason)
        changed = self.store.apply(event)
        self._fresh_list = False
        self._failures = 0
        await self._answered(io, changed=changed)

    async def _ended(self, io: _Io, *, events: int, lasted_s: float) -> None:
        """The server ended the watch cleanly: an answer, and the next watch resumes."""
        self._fresh_list = False
        if events == 0 and lasted_s < _SHORT_WATCH_S:
            self._short_watches += 1
            if self._short_watches > 1:
                await self._answered(io, changed=False)
                await self._failed(
                    io,
                    f"Kubernetes API: {self.resource.what('watch')}: {self._short_watches} watches "
                    f"in a row ended within {_SHORT_WATCH_S:g} s without an event",
                )
                return
        else:
            self._short_watches = 0
            self._failures = 0
        await self._answered(io, changed=False)

    async def _answered(self, io: _Io, *, changed: bool) -> None:
        now = anyio.current_time()
        if self.last_answer_at is None or self._failing is not None:
            self._log.info(
                f"Kubernetes API {self.resource.title} answering",
                extra={"source": self._source, **self._log_fields()},
            )
        self.last_answer_at = now
        self._failing = None
        await io.answered(changed, now)

    async def _failed(self, io: _Io, reason: str) -> None:
        """Tell the owner, then wait out the backoff delay of consecutive failures.

        Only a working watch (an event, or a watch that lasted) resets the count: a server
        that answers lists but fails every watch still backs off further each time."""
        self._failures += 1
        delay = self._backoff.delay(self._failures)
        if reason != self._failing:
            # Once when the watch starts failing and when the cause changes, not every retry.
            self._log.warning(
                f"Kubernetes API {self.resource.title} failing",
                extra={"source": self._source, "error": reason, "retry_in_s": delay},
            )
        self._failing = reason
        await io.failed(reason, anyio.current_time())
        await anyio.sleep(delay)


@dataclass(frozen=True, slots=True)
class _Io:
    """What one run of the engine talks to: its client and its owner."""

    client: KubeClient
    answered: Answered
    failed: Failed
