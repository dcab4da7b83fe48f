"""Readiness, and the gRPC Health Checking Protocol that follows it.

Readiness follows the snapshot: ready once a fresh reading exists, unready again when
readings go stale or the source fails, and ready again when it recovers. The HTTP probes
(/healthz, /readyz) are in :mod:`keda_gpu_scaler.serving.routes`.
"""

from __future__ import annotations

import logging

import anyio
from grpclib.health.check import ServiceCheck
from grpclib.health.service import Health

from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.serving.service import ExternalScalerService

log = logging.getLogger(__name__)


class Readiness:
    """Readiness from the newest snapshot; logs each change once, not every check."""

    def __init__(self, hub: SnapshotHub) -> None:
        self._hub = hub
        self._last: bool | None = None

    def check(self) -> tuple[bool, str]:
        ready, reason = self._hub.current.readiness(anyio.current_time())
        if ready != self._last:
            self._last = ready
            log.log(
                logging.INFO if ready else logging.WARNING,
                "ready" if ready else "not ready",
                extra={"reason": reason},
            )
        return ready, reason

    async def is_ready(self) -> bool:
        return self.check()[0]


def grpc_health(
    service: ExternalScalerService, readiness: Readiness, *, interval_s: float
) -> Health:
    """SERVING or NOT_SERVING for "" (overall) and ``externalscaler.ExternalScaler``."""
    check = ServiceCheck(readiness.is_ready, check_ttl=interval_s, check_timeout=interval_s)
    return Health({service: [check]})
