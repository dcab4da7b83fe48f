"""PodWatcher: the actor that keeps this node's pods, or the cluster's, through the
Kubernetes API.

A node agent's watcher (``PodWatcher(node_name)``) lists, then watches,
``/api/v1/pods?fieldSelector=spec.nodeName=<node>``; a cluster scaler's
(:meth:`PodWatcher.cluster`) the pods of every node: ``/api/v1/pods`` of all namespaces, or
``/api/v1/namespaces/<ns>/pods`` of each namespace given, one list and watch each, merged
into one set. Each list and watch runs on the shared engine
(:class:`~keda_gpu_scaler.sources.kube.listwatch.ListWatch`: pages of 500,
``resourceVersion=0`` the first time, bookmarks, a 15 to 20 s server timeout per watch,
resumed from the last resourceVersion seen, relisted only on 410; see its docstring)::

    ADDED, MODIFIED   upsert by namespace/name
    DELETED           remove
    a pod that moves onto or off the node shows as ADDED or DELETED

Readings (``PodsReading``: the whole set, sorted by namespace then name, each pod with its
node; the reading's ``node`` is this node, or empty for a cluster) say when the API last
answered: a list, any watch event, a watch that opened with 200, a watch that ended
cleanly. ``period_s`` is 10 s, so the labels are unavailable once the API has not answered
for 30 s (three periods); a healthy API answers at least every 20 s, when a watch ends,
even when nothing changes. What is published is paced by
:class:`~keda_gpu_scaler.sources.kube.store.Pacing`: every change at once, otherwise at
most one reading per ``refresh_s`` (1 s).

With several namespaces, nothing is published until each one's list has answered (a set
without a namespace's pods would look like those pods had gone), and a reading's
``taken_at`` is the oldest of the namespaces' last answers: one namespace whose watch has
gone silent makes the whole set stale, as the pods it would show are unknown.

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
import re
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.errors import SourceUnavailable
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
    ListWatch,
    Resource,
)
from keda_gpu_scaler.sources.kube.podset import pod_key
from keda_gpu_scaler.sources.kube.store import Pacing
from keda_gpu_scaler.sources.kube.wire import POD_CODEC

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_REFRESH_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_WATCH_TIMEOUT_S",
    "PERIOD_S",
    "PodWatchStatistics",
    "PodWatcher",
]

PERIOD_S = 10.0
"""A reading's period: the labels are unavailable after three without an answer (30 s)."""
DEFAULT_REFRESH_S = 1.0

log = logging.getLogger(__name__)

_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


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
    """Where the watch resumes; with several namespaces, None (each has its own)."""
    last_answer_at: float | None
    """The API's last answer; with several namespaces, the oldest of their last answers
    (None until each answered)."""
    failing: str | None
    """The reason of the last fault, until the API answers again (with several namespaces,
    that of the first one failing)."""


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
        if len(node_name) > 253 or not _NODE_NAME.fullmatch(node_name):
            raise ValueError(f"node name {node_name!r} is not a Kubernetes node name")
        resource = _pods_resource("pods", ("fieldSelector", f"spec.nodeName={node_name}"))
        self._setup(
            node_name,
            [(resource, {"node": node_name})],
            kubeconfig=kubeconfig,
            serviceaccount=serviceaccount,
            watch_timeout_s=watch_timeout_s,
            request_timeout_s=request_timeout_s,
            refresh_s=refresh_s,
            page_size=page_size,
            backoff=backoff,
            rng=rng,
        )

    @classmethod
    def cluster(
        cls,
        namespaces: Sequence[str] | None = None,
        *,
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
        watch of ``/api/v1/pods``), or of the namespaces given (one list and watch of
        ``/api/v1/namespaces/<ns>/pods`` each, merged). Readings have ``node`` empty."""
        if namespaces is None:
            scopes = [(_pods_resource("pods", None), {"namespace": "*"})]
        else:
            scopes = [
                (_pods_resource(f"namespaces/{ns}/pods", None), {"namespace": ns})
                for ns in _namespaces(namespaces)
            ]
        watcher = cls.__new__(cls)
        watcher._setup(
            "",
            scopes,
            kubeconfig=kubeconfig,
            serviceaccount=serviceaccount,
            watch_timeout_s=watch_timeout_s,
            request_timeout_s=request_timeout_s,
            refresh_s=refresh_s,
            page_size=page_size,
            backoff=backoff,
            rng=rng,
        )
        return watcher

    def _setup(
        self,
        node_name: str,
        scopes: Sequence[tuple[Resource[PodInfo], dict[str, str]]],
        *,
        kubeconfig: str | None,
        serviceaccount: str,
        watch_timeout_s: int,
        request_timeout_s: float,
        refresh_s: float,
        page_size: int,
        backoff: Backoff,
        rng: random.Random | None,
    ) -> None:
        self.node_name = node_name
        """This node's; empty for a cluster."""
        rng = rng or random.Random()
        self._engines: list[ListWatch[PodInfo]] = []
        for resource, fields in scopes:
            held: list[ListWatch[PodInfo]] = []

            def log_fields(
                fields: dict[str, str] = fields, held: list[ListWatch[PodInfo]] = held
            ) -> dict[str, object]:
                # This watch's node or namespace, and how many pods it holds.
                return {**fields, "pods": len(held[0].store)}

            engine: ListWatch[PodInfo] = ListWatch(
                resource,
                source=self.name,
                log=log,
                log_fields=log_fields,
                kubeconfig=kubeconfig,
                serviceaccount=serviceaccount,
                watch_timeout_s=watch_timeout_s,
                request_timeout_s=request_timeout_s,
                page_size=page_size,
                backoff=backoff,
                rng=rng,
            )
            held.append(engine)
            self._engines.append(engine)
        self._pacing = Pacing(refresh_s)
        self._readings = 0

    def statistics(self) -> PodWatchStatistics:
        engines = [engine.statistics() for engine in self._engines]
        answers = [e.last_answer_at for e in engines]
        failing = [e.failing for e in engines if e.failing is not None]
        return PodWatchStatistics(
            lists=sum(e.lists for e in engines),
            watches=sum(e.watches for e in engines),
            events=sum(e.events for e in engines),
            readings=self._readings,
            faults=sum(e.faults for e in engines),
            pods=sum(e.objects for e in engines),
            resource_version=engines[0].resource_version if len(engines) == 1 else None,
            last_answer_at=None if None in answers else min(a for a in answers if a is not None),
            failing=failing[0] if failing else None,
        )

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

            if len(self._engines) == 1:
                await self._engines[0].run(answered=answered, failed=failed)
                return
            # One namespace without a configuration stops them all, raised as it is (not in
            # an exception group), as the supervisor expects.
            unavailable: list[SourceUnavailable] = []
            async with anyio.create_task_group() as tg:

                async def watch(engine: ListWatch[PodInfo]) -> None:
                    try:
                        await engine.run(answered=answered, failed=failed)
                    except SourceUnavailable as exc:
                        unavailable.append(exc)
                        tg.cancel_scope.cancel()

                for engine in self._engines:
                    tg.start_soon(watch, engine)
            if unavailable:
                raise unavailable[0]

    async def _answered(
        self, send: MemoryObjectSendStream[Sample], *, changed: bool, now: float
    ) -> None:
        answers = [engine.last_answer_at for engine in self._engines]
        if None in answers:
            return  # a namespace not listed yet: its pods would be missing from the set
        if not self._pacing.is_due(changed=changed, now=now):
            return
        self._pacing.published(now)
        self._readings += 1
        pods = sorted(
            (pod for engine in self._engines for pod in engine.store.items()), key=pod_key
        )
        reading = PodsReading(
            source=self.name,
            taken_at=min(a for a in answers if a is not None),
            period_s=PERIOD_S,
            node=self.node_name,
            pods=tuple(pods),
        )
        await send.send(reading)


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
        if not isinstance(ns, str) or len(ns) > 63 or not _NAMESPACE.fullmatch(ns):
            raise ValueError(f"namespace {ns!r} is not a Kubernetes namespace name")
    return sorted(set(names))
