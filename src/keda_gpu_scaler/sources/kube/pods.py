"""PodWatcher: the actor that keeps this node's pods, or the cluster's, through the
Kubernetes API.

A node agent's watcher (``PodWatcher(node_name)``) lists, then watches,
``/api/v1/pods?fieldSelector=spec.nodeName=<node>``; a cluster scaler's
(:meth:`PodWatcher.cluster`) the pods of every node: ``/api/v1/pods`` of all namespaces, or
``/api/v1/namespaces/<ns>/pods`` of each namespace given, one list and watch each, merged
into one set, or of each namespace a demand names as it grows (``--pod-namespaces
triggers``: the namespaces podSelector triggers name). The same code either way, with a
different scope. Each list and watch runs on the shared engine
(:class:`~keda_gpu_scaler.sources.kube.listwatch.ListWatch`: pages of 500,
``resourceVersion=0`` the first time, bookmarks, a 15 to 20 s server timeout per watch,
resumed from the last resourceVersion seen, relisted only on 410; see its docstring)::

    ADDED, MODIFIED   upsert by namespace/name
    DELETED           remove
    a pod that moves onto or off the node shows as ADDED or DELETED

Readings (``PodsReading``: the whole set, sorted by namespace then name, each pod with its
node; the reading's ``node`` is this node, or empty for a cluster, and its ``namespaces``
those whose pods it holds, None for all) say when the API last answered: a list, any watch
event, a watch that opened with 200, a watch that ended cleanly. ``period_s`` is 10 s, so
the labels are unavailable once the API has not answered for 30 s (three periods); a
healthy API answers at least every 20 s, when a watch ends, even when nothing changes.
What is published is paced by :class:`~keda_gpu_scaler.sources.kube.store.Pacing`: every
change at once (a namespace that joins is one), otherwise at most one reading per
``refresh_s`` (1 s).

With several namespaces, nothing is published until each one given at the start has
listed (a set without a namespace's pods would look like those pods had gone), and a
reading's ``taken_at`` is the oldest of its namespaces' last answers: one namespace whose
watch has gone silent makes the whole set stale, as the pods it would show are unknown.

Following a demand, a namespace that joins later is watched at once, beside the others,
and joins the readings as soon as its list answered; until then the readings go on
without it (their ``namespaces`` do not name it, so its pods read as unknown, not as
none), and a namespace whose list keeps failing holds nothing back. When the demand
becomes every namespace (too many to watch one by one), one watch of all namespaces
starts; once it has listed, it alone is published and the watches of one namespace stop.

Failures (no connection, a timeout, 401/403 with the API's message, 5xx, bad JSON) are
published as a ``SourceFault`` whose reason names the request (so the namespace) and the
answer, and retried with :class:`~keda_gpu_scaler.domain.backoff.Backoff` delays; the last
reading goes stale on its own meanwhile (a fault in one namespace's watch is a fault of the
whole source). A missing configuration (no kubeconfig and not in a cluster) raises
``SourceUnavailable`` out of :meth:`PodWatcher.run`: the supervisor logs it, publishes it
as a fault, and restarts the watcher with its own backoff, so a kubeconfig mounted later is
found.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.domain.names import is_namespace, is_node_name
from keda_gpu_scaler.domain.samples import (
    PODS_SOURCE,
    PodInfo,
    PodsReading,
    Sample,
    SourceFault,
)
from keda_gpu_scaler.sources.kube.client import SERVICE_ACCOUNT
from keda_gpu_scaler.sources.kube.listwatch import (
    DEFAULT_BACKOFF,
    DEFAULT_PAGE_SIZE,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_WATCH_TIMEOUT_S,
    Answered,
    Failed,
    ListWatch,
    Resource,
)
from keda_gpu_scaler.sources.kube.store import Pacing
from keda_gpu_scaler.sources.kube.wire import POD_CODEC

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_REFRESH_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_WATCH_TIMEOUT_S",
    "PERIOD_S",
    "NamespaceDemand",
    "PodWatcher",
]

PERIOD_S = 10.0
"""A reading's period: the labels are unavailable after three without an answer (30 s)."""
DEFAULT_REFRESH_S = 1.0

log = logging.getLogger(__name__)


class NamespaceDemand(Protocol):
    """The namespaces a cluster scaler's pod watch follows as they grow (the pipeline's
    ``PodNamespaces``, with ``--pod-namespaces triggers``)."""

    @property
    def names(self) -> frozenset[str] | None:
        """The namespaces to watch now; None: every namespace."""
        ...

    @property
    def version(self) -> int:
        """Counts the changes of :attr:`names`."""
        ...

    async def wait_changed(self, version: int) -> None:
        """Return once :attr:`version` is past ``version``."""
        ...


@dataclass(frozen=True, slots=True)
class _EngineSettings:
    """How each list and watch is made; kept to start one per namespace as they come."""

    kubeconfig: str | None
    serviceaccount: str
    watch_timeout_s: int
    request_timeout_s: float
    page_size: int
    backoff: Backoff
    rng: random.Random


_EVERY_NAMESPACE = "*"
"""The key of the watch of all namespaces (no namespace is named ``*``)."""


class PodWatcher:
    """This node's pods, or the cluster's (:meth:`cluster`), published as
    :class:`PodsReading`; see the module docstring.

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
        if not is_node_name(node_name):
            raise ValueError(f"node name {node_name!r} is not a Kubernetes node name")
        resource = _pods_resource("pods", ("fieldSelector", f"spec.nodeName={node_name}"))
        self._setup(
            node_name,
            [_Scope(node_name, resource, {"node": node_name})],
            _EngineSettings(
                kubeconfig,
                serviceaccount,
                watch_timeout_s,
                request_timeout_s,
                page_size,
                backoff,
                rng or random.Random(),
            ),
            refresh_s=refresh_s,
        )

    @classmethod
    def cluster(
        cls,
        namespaces: Sequence[str] | None = None,
        *,
        demand: NamespaceDemand | None = None,
        kubeconfig: str | None = None,
        serviceaccount: str = SERVICE_ACCOUNT,
        watch_timeout_s: int = DEFAULT_WATCH_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        refresh_s: float = DEFAULT_REFRESH_S,
        page_size: int = DEFAULT_PAGE_SIZE,
        backoff: Backoff = DEFAULT_BACKOFF,
        rng: random.Random | None = None,
    ) -> PodWatcher:
        """The pods of every node: of all namespaces (``namespaces`` None, one list and
        watch of ``/api/v1/pods``), of the namespaces given (one list and watch of
        ``/api/v1/namespaces/<ns>/pods`` each, merged), or of those ``demand`` names, as
        it grows (``namespaces`` then None). Readings have ``node`` empty."""
        if demand is not None and namespaces is not None:
            raise ValueError("the pod watch follows namespaces given or a demand, not both")
        listed = None if namespaces is None else _namespaces(namespaces)
        if demand is not None:
            names = demand.names
        else:
            names = None if listed is None else frozenset(listed)
        watcher = cls.__new__(cls)
        watcher._setup(
            "",
            _scopes_for(names, watched=()),
            _EngineSettings(
                kubeconfig,
                serviceaccount,
                watch_timeout_s,
                request_timeout_s,
                page_size,
                backoff,
                rng or random.Random(),
            ),
            refresh_s=refresh_s,
            demand=demand,
            listed=listed,
        )
        return watcher

    def _setup(
        self,
        node_name: str,
        scopes: Sequence[_Scope],
        settings: _EngineSettings,
        *,
        refresh_s: float,
        demand: NamespaceDemand | None = None,
        listed: Sequence[str] | None = None,
    ) -> None:
        self.node_name = node_name
        """This node's; empty for a cluster."""
        self._settings = settings
        self._demand = demand
        self._listed_namespaces = None if listed is None else tuple(listed)
        """A fixed set of namespaces, as its readings name them."""
        self._engines: dict[str, ListWatch[PodInfo]] = {}
        """By the node, the namespace, or ``*`` for every namespace, they watch."""
        for scope in scopes:
            self._add(scope)
        self._initial = frozenset(self._engines)
        """The watches each of which must have listed before anything is published."""
        self._published: tuple[str, ...] | None = None
        """The namespaces of the last reading (with a demand)."""
        self._scopes: dict[str, anyio.CancelScope] = {}
        """The running watch of each engine (while :meth:`run` runs)."""
        self._pacing = Pacing(refresh_s)

    def _add(self, scope: _Scope) -> None:
        settings = self._settings
        held: list[ListWatch[PodInfo]] = []

        def log_fields() -> dict[str, object]:
            # This watch's node or namespace, and how many pods it holds.
            return {**scope.fields, "pods": len(held[0].store)}

        engine: ListWatch[PodInfo] = ListWatch(
            scope.resource,
            source=self.name,
            log=log,
            log_fields=log_fields,
            kubeconfig=settings.kubeconfig,
            serviceaccount=settings.serviceaccount,
            watch_timeout_s=settings.watch_timeout_s,
            request_timeout_s=settings.request_timeout_s,
            page_size=settings.page_size,
            backoff=settings.backoff,
            rng=settings.rng,
        )
        held.append(engine)
        self._engines[scope.key] = engine

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            task_status.started()

            async def answered(changed: bool, now: float) -> None:
                await self._answered(send, changed=changed, now=now)

            async def failed(reason: str, now: float) -> None:
                self._pacing.faulted()
                await send.send(SourceFault(source=self.name, key=None, at=now, reason=reason))

            if self._demand is None and len(self._engines) == 1:
                (engine,) = self._engines.values()
                await engine.run(answered=answered, failed=failed)
                return
            # One namespace without a configuration stops them all, raised as it is (not in
            # an exception group), as the supervisor expects.
            async with anyio.create_task_group() as tg:
                running = _Running(tg, answered, failed)
                for key in self._engines:
                    self._start(running, key)
                if self._demand is not None:
                    tg.start_soon(self._follow_demand, running, self._demand)
            if running.unavailable:
                raise running.unavailable[0]

    def _start(self, running: _Running, key: str) -> None:
        """Run the watch of ``key`` in its own cancel scope (stopped when the watch of
        every namespace replaces it)."""
        engine = self._engines[key]
        scope = self._scopes[key] = anyio.CancelScope()

        async def watch() -> None:
            with scope:
                try:
                    await engine.run(answered=running.answered, failed=running.failed)
                except SourceUnavailable as exc:
                    running.unavailable.append(exc)
                    running.tg.cancel_scope.cancel()

        running.tg.start_soon(watch)

    async def _follow_demand(self, running: _Running, demand: NamespaceDemand) -> None:
        """Start a watch for each namespace as the demand names it."""
        while True:
            version = demand.version
            for scope in _scopes_for(demand.names, watched=self._engines.keys()):
                self._add(scope)
                self._start(running, scope.key)
                log.info(
                    "pod watch starts",
                    extra={**scope.fields, "source": self.name, "watches": len(self._engines)},
                )
            await demand.wait_changed(version)

    def _publishable(self) -> dict[str, ListWatch[PodInfo]]:
        """The watches whose pods the next reading holds: those that have listed, once
        each of the first ones has (none before: their pods would be missing from the
        set); the watch of every namespace alone once it has listed."""
        engines = self._engines
        if any(engines[key].last_answer_at is None for key in self._initial):
            return {}
        every = engines.get(_EVERY_NAMESPACE)
        if every is not None and every.last_answer_at is not None:
            return {_EVERY_NAMESPACE: every}
        return {k: e for k, e in engines.items() if e.last_answer_at is not None}

    def _retire_namespaces(self) -> None:
        """The watch of every namespace has listed: the watches of one namespace stop."""
        for key in [k for k in self._engines if k != _EVERY_NAMESPACE]:
            del self._engines[key]
            scope = self._scopes.pop(key, None)
            if scope is not None:
                scope.cancel()
        self._initial = frozenset(self._engines)
        log.info("pod watch covers every namespace", extra={"source": self.name})

    async def _answered(
        self, send: MemoryObjectSendStream[Sample], *, changed: bool, now: float
    ) -> None:
        engines = self._publishable()
        if not engines:
            return  # a namespace not listed yet: its pods would be missing from the set
        if _EVERY_NAMESPACE in engines and len(self._engines) > 1:
            self._retire_namespaces()
        namespaces = self._namespaces_of(engines)
        if self._demand is not None and namespaces != self._published:
            changed = True  # a namespace joined: its readers need not wait the refresh
        if not self._pacing.is_due(changed=changed, now=now):
            return
        self._pacing.published(now)
        self._published = namespaces
        # Each store is sorted by (namespace, name), and several are one namespace each:
        # in namespace order they are the whole set sorted, with no sort of every pod.
        pods = [pod for key in sorted(engines) for pod in engines[key].store.items()]
        reading = PodsReading(
            source=self.name,
            taken_at=_oldest_answer(engines.values()),
            period_s=PERIOD_S,
            node=self.node_name,
            pods=tuple(pods),
            namespaces=namespaces,
            on_demand=self._demand is not None,
        )
        await send.send(reading)

    def _namespaces_of(self, engines: dict[str, ListWatch[PodInfo]]) -> tuple[str, ...] | None:
        """What a reading of ``engines`` says it covers: None for a node or every
        namespace, else their namespaces."""
        if self._demand is None:
            return self._listed_namespaces
        if _EVERY_NAMESPACE in engines:
            return None
        return tuple(sorted(engines))


@dataclass(frozen=True, slots=True)
class _Running:
    """One run of a watcher of several watches: its task group and its callbacks."""

    tg: TaskGroup
    answered: Answered
    failed: Failed
    unavailable: list[SourceUnavailable] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Scope:
    """One list and watch of a watcher: its key, collection, and fields for the logs."""

    key: str
    resource: Resource[PodInfo]
    fields: dict[str, str]


def _scopes_for(names: frozenset[str] | None, *, watched: Iterable[str]) -> list[_Scope]:
    """The watches ``names`` needs beyond those ``watched``: one per namespace, sorted, or
    the one of every namespace for None (the one-namespace watches it replaces stop once
    it has listed)."""
    have = set(watched)
    if names is None:
        if _EVERY_NAMESPACE in have:
            return []
        return [_Scope(_EVERY_NAMESPACE, _pods_resource("pods", None), {"namespace": "*"})]
    return [
        _Scope(ns, _pods_resource(f"namespaces/{ns}/pods", None), {"namespace": ns})
        for ns in sorted(names - have)
        if is_namespace(ns)  # a demand's other names name no pods (and no path)
    ]


def _oldest_answer(engines: Iterable[ListWatch[PodInfo]]) -> float:
    return min(e.last_answer_at for e in engines if e.last_answer_at is not None)


def pod_key(pod: PodInfo) -> tuple[str, str]:
    """Pods are kept by namespace, then name: a reading lists them in that order."""
    return (pod.namespace, pod.name)


def _pods_resource(path: str, selector: tuple[str, str] | None) -> Resource[PodInfo]:
    return Resource(
        version="v1",
        path=path,
        selector=selector,
        codec=POD_CODEC,
        key=pod_key,
        title="pod watch",
    )


def _namespaces(namespaces: Sequence[str]) -> list[str]:
    """The namespaces given, checked, without repeats, sorted."""
    if isinstance(namespaces, str):
        raise ValueError(
            f"namespaces must be a list of namespace names, not the string {namespaces!r}"
        )
    names = list(namespaces)
    if not names:
        raise ValueError("the pod watch needs at least one namespace (or None for all of them)")
    for ns in names:
        if not isinstance(ns, str) or not is_namespace(ns):
            raise ValueError(f"namespace {ns!r} is not a Kubernetes namespace name")
    return sorted(set(names))
