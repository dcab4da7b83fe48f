"""Shared fixtures.

Actor and decision tests are marked ``@pytest.mark.trio`` and request pytest-trio's
``autojump_clock`` (a MockClock with autojump_threshold=0). Edge tests are marked
``@pytest.mark.anyio`` and run on asyncio, because grpclib is asyncio-only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from keda_gpu_scaler.app.scaler.compose import RunningScaler
from keda_gpu_scaler.sources.fake import FakeGpuSource
from tests.grpcio_client import GrpcioModules, generate
from tests.loopback import loopback_scaler


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fake_gpus() -> FakeGpuSource:
    """Two fake GPUs at 0.2 s: GPU 0 busy, GPU 1 idle; NVLink unsupported on both."""
    source = FakeGpuSource(2, period_s=0.2)
    gib = 1 << 30
    source.set(
        0,
        gpu_utilization=87.0,
        memory_used_bytes=60 * gib,
        memory_total_bytes=80 * gib,
        power_mw=350_000.0,
        temperature_c=61.0,
        sm_active=55.0,
    )
    source.set(
        1,
        gpu_utilization=3.0,
        memory_used_bytes=1 * gib,
        memory_total_bytes=80 * gib,
        power_mw=80_000.0,
        temperature_c=35.0,
        sm_active=0.0,
    )
    return source


@pytest.fixture
async def scaler(fake_gpus: FakeGpuSource) -> AsyncIterator[RunningScaler]:
    """The real server on 127.0.0.1, an ephemeral port, fed by ``fake_gpus``."""
    async with loopback_scaler(fake_gpus) as running:
        await running.hub.wait_newer(0)
        yield running


@pytest.fixture(scope="session")
def grpcio_modules(tmp_path_factory: pytest.TempPathFactory) -> GrpcioModules:
    return generate(tmp_path_factory.mktemp("grpcio"))
