"""The real scaler on 127.0.0.1 with ephemeral ports, as edge tests start it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from keda_gpu_scaler.app.compose import RunningScaler, open_scaler
from keda_gpu_scaler.pipeline.supervisor import Sampler


@asynccontextmanager
async def loopback_scaler(
    source: Sampler, *, port: int = 0, **options: Any
) -> AsyncIterator[RunningScaler]:
    """gRPC (on ``port``; 0: a free one), metrics and probes on free loopback ports;
    ``options`` override the defaults."""
    settings: dict[str, Any] = {
        "metrics_port": 0,
        "probe_port": 0,
        "health_check_interval_s": 0.001,
        **options,
    }
    async with open_scaler(source, host="127.0.0.1", port=port, **settings) as running:
        yield running
