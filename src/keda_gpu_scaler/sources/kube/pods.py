"""PodWatcher: the actor that keeps this node's pods, through the Kubernetes API.

It lists, then watches, ``/api/v1/pods?fieldSelector=spec.nodeName=<node>`` with the
shared engine (:class:`~keda_gpu_scaler.sources.kube.listwatch.ListWatch`: pages of 500,
``resourceVersion=0`` the first time, bookmarks, a 15 to 20 s server timeout per watch,
resumed from the last resourceVersion seen, relisted only on 410; see its docstring)::

    ADDED, MODIFIED   upsert by namespace/name
    DELETED           remove
    a pod that moves onto or off the node shows as ADDED or DELETED

Readings (``PodsReading``: the whole set, sorted by namespace then name) say when the API
last answered: a list, any watch event, a watch that opened with 200, a watch that ended
cleanly. ``period_s`` is 10 s, so the labels are unavailable once the API has not answered
for 30 s (three periods); a healthy API answers at least every 20 s, when a watch ends,
even when nothing changes. What is published is paced by
:class:`~keda_gpu_scaler.sources.kube.store.Pacing`: every change at once, otherwise at
most one reading per ``refresh_s`` (1 s).

Failures (no connection, a timeout, 401/403 with the API's message, 5xx, bad JSON) are
published as a ``SourceFault`` whose reason names the request and the answer, and retried
with :class:`~keda_gpu_scaler.domain.backoff.Backoff` delays; the last reading goes stale on
its own meanwhile. A missing configuration (no kubeconfig and not in a cluster) raises
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
        self.node_name = node_name
        resource = Resource(
            version="v1",
            path="pods",
            selector=("fieldSelector", f"spec.nodeName={node_name}"),
            codec=POD_CODEC,
            key=pod_key,
            title="pod watch",
        )
        self._engine = ListWatch(
            resource,
            source=self.name,
            log=log,
            log_fields=lambda: {"node": self.node_name, "pods": len(self._engine.store)},
            kubeconfig=kubeconfig,
            serviceaccount=serviceaccount,
            watch_timeout_s=watch_timeout_s,
            request_timeout_s=request_timeout_s,
            page_size=page_size,
            backoff=backoff,
            rng=rng,
        )
        self._pacing = Pacing(refresh_s)
        self._readings = 0

    def statistics(self) -> PodWatchStatistics:
        engine = self._engine.statistics()
        return PodWatchStatistics(
            lists=engine.lists,
            watches=engine.watches,
            events=engine.events,
            readings=self._readings,
            faults=engine.faults,
            pods=engine.objects,
            resource_version=engine.resource_version,
            last_answer_at=engine.last_answer_at,
            failing=engine.failing,
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

            await self._engine.run(answered=answered, failed=failed)

    async def _answered(
        self, send: MemoryObjectSendStream[Sample], *, changed: bool, now: float
    ) -> None:
        if not self._pacing.is_due(changed=changed, now=now):
            return
        self._pacing.published(now)
        self._readings += 1
        reading = PodsReading(
            source=self.name,
            taken_at=now,
            period_s=PERIOD_S,
            node=self.node_name,
            pods=self._engine.store.items(),
        )
        await send.send(reading)
