"""Supervision: restart a failing sampler with exponential backoff.

A crash is published as a :class:`SourceFault`, so health and readiness see it, and the
sampler's last readings go stale rather than freeze.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.samples import Sample, SourceFault

__all__ = ["Backoff", "Sampler", "supervise"]

log = logging.getLogger(__name__)

_RESTART_BACKOFF = Backoff()


class Sampler(Protocol):
    """A source actor: ``run`` publishes samples on ``send`` (its own clone) until cancelled,
    calling ``task_status.started()`` once it is ready. Supervised by :func:`supervise`."""

    name: str

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = ...,
    ) -> None: ...


async def supervise(
    name: str,
    start: Callable[[MemoryObjectSendStream[Sample]], Awaitable[None]],
    *,
    send: MemoryObjectSendStream[Sample],
    backoff: Backoff = _RESTART_BACKOFF,
) -> None:
    """Run ``start(clone of send)`` until it returns; after an exception publish a fault on
    ``send`` and start it again with a fresh clone. ``send`` is closed when this returns.

    Consecutive failures lengthen the delay; a run that lasted longer than the longest delay
    resets it.
    """
    failures = 0
    async with send:
        while True:
            started_at = anyio.current_time()
            try:
                await start(send.clone())
            except Exception as exc:
                if anyio.current_time() - started_at > backoff.maximum_s:
                    failures = 0
                failures += 1
                delay = backoff.delay(failures)
                log.warning(
                    "source failed; restarting",
                    extra={"source": name, "error": str(exc), "retry_in_s": delay},
                )
                fault = SourceFault(source=name, key=None, at=anyio.current_time(), reason=str(exc))
                await send.send(fault)
                await anyio.sleep(delay)
            else:
                log.info("source finished", extra={"source": name})
                return
