"""Every HTTP route, in one place: /metrics and /debug/tap, /healthz and /readyz.

/healthz answers while the process and its event loop are alive; /readyz follows
:class:`~keda_gpu_scaler.serving.probes.Readiness`. /debug/tap streams JSON lines of samples
and decisions, filtered by the query (``source``, ``device``, ``metric``, ``trigger``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping

from keda_gpu_scaler.pipeline.tap import Tap, TapFilter
from keda_gpu_scaler.serving.http import Request, Response, Route, text
from keda_gpu_scaler.serving.observability import CONTENT_TYPE, SelfMetrics
from keda_gpu_scaler.serving.probes import Readiness


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
