"""Engine samplers on demand: the first trigger naming an endpoint starts its sampler.

One sampler per :class:`EngineTarget` (kind, URL, discovery) serves every trigger naming it,
so rates come from that sampler's own consecutive scrapes and no caller disturbs another's
baseline. A sampler nobody has read for ``idle_stop_s`` is stopped and its readings are
forgotten. The only wait a KEDA call may make is :meth:`EngineSubscriptions.ensure`: for
the first scrape of a target seen for the first time, bounded by
``first_sample_timeout_s``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.engines import EngineTarget
from keda_gpu_scaler.domain.samples import Sample, SourceStopped
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.supervisor import Backoff, Sampler, supervise

log = logging.getLogger(__name__)


EngineSamplerFactory = Callable[[EngineTarget], Sampler]


class EngineSubscriptions:
    def __init__(
        self,
        hub: SnapshotHub,
        send: MemoryObjectSendStream[Sample],
        factory: EngineSamplerFactory,
        *,
        idle_stop_s: float = 600.0,
        first_sample_timeout_s: float = 1.5,
        backoff: Backoff | None = None,
    ) -> None:
        self._hub = hub
        self._send = send
        self._factory = factory
        self._idle_stop_s = idle_stop_s
        self._first_sample_timeout_s = first_sample_timeout_s
        self._backoff = backoff or Backoff()
        self._tg: TaskGroup | None = None
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._last_read: dict[str, float] = {}

    def running(self) -> list[str]:
        return sorted(self._scopes)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._send, anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            while True:
                await anyio.sleep(self._idle_stop_s / 4)
                self._stop_idle(anyio.current_time())

    def touch(self, target: EngineTarget) -> None:
        """Mark ``target`` as read now, starting its sampler if none runs."""
        source = target.source
        self._last_read[source] = anyio.current_time()
        if source not in self._scopes:
            self._start(target)

    async def ensure(self, target: EngineTarget) -> None:
        """:meth:`touch`, then wait (bounded) for the target's first scrape if none exists."""
        self.touch(target)
        with anyio.move_on_after(self._first_sample_timeout_s):
            while target.source not in self._hub.current.engines:
                await self._hub.wait_newer(self._hub.current.version)

    def _start(self, target: EngineTarget) -> None:
        if self._tg is None:
            raise RuntimeError("EngineSubscriptions.run() has not started")
        scope = anyio.CancelScope()
        self._scopes[target.source] = scope
        sampler = self._factory(target)
        log.info("engine sampler started", extra={"source": target.source})
        self._tg.start_soon(self._supervised, sampler, scope)

    async def _supervised(self, sampler: Sampler, scope: anyio.CancelScope) -> None:
        with scope:
            await supervise(
                sampler.name, sampler.run, send=self._send.clone(), backoff=self._backoff
            )

    def _stop_idle(self, now: float) -> None:
        for source, last in list(self._last_read.items()):
            if now - last < self._idle_stop_s:
                continue
            del self._last_read[source]
            self._scopes.pop(source).cancel()
            log.info(
                "engine sampler stopped: unread",
                extra={"source": source, "idle_s": round(now - last, 1)},
            )
            assert self._tg is not None
            self._tg.start_soon(self._send.send, SourceStopped(source=source))
