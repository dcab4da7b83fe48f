"""Health: gRPC Health Checking Protocol, and HTTP /healthz, /readyz, /metrics, /debug/tap.

/healthz answers while the process and its event loop are alive. /readyz and the gRPC
health service follow the snapshot: ready once a fresh reading exists, unready again when
readings go stale or the source fails, and ready again when it recovers.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Mapping

import anyio
from grpclib.health.check import ServiceCheck
from grpclib.health.service import Health

from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.tap import Tap, TapFilter
from keda_gpu_scaler.serving.http import Request, Response, Route, text
from keda_gpu_scaler.serving.observability import CONTENT_TYPE, SelfMetrics
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


def probe_routes(readiness: Readiness) -> dict[str, Route]:
    async def healthz(_: Request) -> Response:
        return text(200, "ok")

    async def readyz(_: Request) -> Response:
        ready, reason = readiness.check()
        return text(200 if ready else 503, reason)

    return {"/healthz": healthz, "/readyz": readyz}


def metrics_routes(metrics: SelfMetrics, tap: Tap) -> dict[str, Route]:
    async def render(_: Request) -> Response:
        return Response(200, metrics.render(), CONTENT_TYPE)

    async def debug_tap(request: Request) -> Response:
        tap_filter = _tap_filter(request.query)
        subscription = tap.subscribe(tap_filter)

        async def lines() -> AsyncGenerator[bytes, None]:
            with subscription:
                async for line in subscription:
                    yield line

        return Response(200, content_type="application/x-ndjson", stream=lines())

    return {"/metrics": render, "/debug/tap": debug_tap}


def _tap_filter(query: Mapping[str, str]) -> TapFilter:
    return TapFilter(
        source=query.get("source"),
        device=query.get("device"),
        metric=query.get("metric"),
        trigger=query.get("trigger"),
    )
