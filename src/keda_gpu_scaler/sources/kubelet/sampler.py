"""PodResourcesSampler: the actor that asks the kubelet which pod holds which GPU.

On every tick of its interval (never per request of anyone: the kubelet rate-limits the
socket) it calls ``List`` once and publishes one sample:

- a good answer is a :class:`PodResourcesReading` (``taken_at`` when the kubelet answered,
  ``period_s`` the interval): the GPU devices held, see :mod:`.convert`;
- a failed call (no socket, refused, rate-limited, no answer in time, any gRPC error) is a
  :class:`SourceFault` with ``key=None`` naming the socket and the cause. The sampler does
  not raise: it tries again on the next tick, on a new connection when the old one broke,
  while the snapshot keeps the last good reading until it goes stale (three intervals).

The sampler is ready at once (``task_status.started()`` before the first call): nothing
downstream waits for the first answer, and a socket that is missing shows up as a fault
instead of holding start-up. grpclib needs the asyncio backend.
"""

from __future__ import annotations

import logging
import math

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.samples import POD_RESOURCES_SOURCE, PodResourcesReading, SourceFault
from keda_gpu_scaler.sources.cadence import every
from keda_gpu_scaler.sources.kubelet.client import PodResourcesClient, PodResourcesFailed
from keda_gpu_scaler.sources.kubelet.convert import holders_of
from keda_gpu_scaler.sources.kubelet.resources import (
    DEFAULT_DRA_DRIVERS,
    DEFAULT_RESOURCE_NAMES,
    DraDrivers,
    ResourceNames,
)

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0
MAX_DEFAULT_TIMEOUT_S = 2.0
"""A local kubelet answers in milliseconds; waiting longer only delays the fault."""

FAILURE_PREFIX = "kubelet PodResources List failed: "


def default_timeout_s(interval_s: float) -> float:
    """A bit under the interval, 2 s at most, so a call never runs into the next tick."""
    return min(0.8 * interval_s, MAX_DEFAULT_TIMEOUT_S)


class PodResourcesSampler:
    """Polls ``List`` on the kubelet's unix socket every ``interval_s`` seconds."""

    def __init__(
        self,
        socket_path: str,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        resource_names: ResourceNames = DEFAULT_RESOURCE_NAMES,
        dra_drivers: DraDrivers = DEFAULT_DRA_DRIVERS,
        timeout_s: float | None = None,
    ) -> None:
        """``timeout_s`` bounds each call (default :func:`default_timeout_s`); it may not
        exceed the interval. Raises ValueError naming a bad value."""
        if not socket_path:
            raise ValueError("the kubelet PodResources socket path is empty")
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(
                f"the PodResources interval must be a positive number of seconds, "
                f"not {interval_s!r}"
            )
        timeout = default_timeout_s(interval_s) if timeout_s is None else timeout_s
        if not (math.isfinite(timeout) and 0 < timeout <= interval_s):
            raise ValueError(
                f"the PodResources timeout must be positive and at most the interval "
                f"({interval_s:g} s), not {timeout!r}"
            )
        self.name = POD_RESOURCES_SOURCE
        self.socket_path = socket_path
        self.interval_s = interval_s
        self.timeout_s = timeout
        self.resource_names = resource_names
        self.dra_drivers = dra_drivers
        self._client = PodResourcesClient(socket_path, timeout_s=timeout)
        self._answered_once = False
        self._failing: str | None = None
        """Why the calls since the last answer failed (the latest reason); None while
        answering."""

    async def run(
        self,
        send: MemoryObjectSendStream[PodResourcesReading | SourceFault],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """One sample per tick until cancelled; the connection is closed on the way out."""
        async with send:
            try:
                task_status.started()
                # A call slower than the interval skips the ticks it missed, never bunches them.
                async for _ in every(self.interval_s):
                    await send.send(await self.sample())
            finally:
                self.close()

    async def sample(self) -> PodResourcesReading | SourceFault:
        """One ``List``: its reading, or the fault that says why there is none."""
        try:
            response = await self._client.list()
        except PodResourcesFailed as exc:
            return self._failed(exc, anyio.current_time())
        now = anyio.current_time()
        holders, dra = holders_of(response, self.resource_names, self.dra_drivers)
        self._answered(len(response.pod_resources), len(holders))
        return PodResourcesReading(
            source=self.name, taken_at=now, period_s=self.interval_s, holders=holders, dra=dra
        )

    def close(self) -> None:
        """Closes the connection (:meth:`run` does on its way out); a later call reopens."""
        self._client.close()

    def _failed(self, exc: PodResourcesFailed, now: float) -> SourceFault:
        if exc.detail != self._failing:
            # Once when the calls start failing and when the cause changes, not every tick.
            log.warning(
                "kubelet PodResources List failing",
                extra={"source": self.name, "socket": self.socket_path, "error": exc.detail},
            )
        self._failing = exc.detail
        return SourceFault(source=self.name, key=None, at=now, reason=FAILURE_PREFIX + exc.detail)

    def _answered(self, pods: int, holders: int) -> None:
        if not self._answered_once or self._failing is not None:
            log.info(
                "kubelet PodResources List answering",
                extra={
                    "source": self.name,
                    "socket": self.socket_path,
                    "pods": pods,
                    "gpu_devices_held": holders,
                },
            )
        self._answered_once = True
        self._failing = None
