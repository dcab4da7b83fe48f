"""A GPU lost during a StreamIsActive subscription, with the NVML sampler over the fake
backend: the stream keeps running and never reports the lost GPU as active or inactive."""

from __future__ import annotations

import anyio
import pytest
import trio.testing

from keda_gpu_scaler.serving._proto.externalscaler import ScaledObjectRef
from keda_gpu_scaler.serving.service import ExternalScalerService
from keda_gpu_scaler.sources.nvml import FakeNvml, NvmlSampler
from keda_gpu_scaler.sources.nvml.backend import Utilization
from keda_gpu_scaler.testing import inline, open_test_service


@pytest.mark.trio
async def test_lost_gpu_during_a_stream(autojump_clock: trio.testing.MockClock) -> None:
    nvml = FakeNvml.h200(2, clock=anyio.current_time, sleep=lambda _: None)
    nvml.gpus[1].utilization = Utilization(gpu=90, memory=10)
    sampler = NvmlSampler(nvml, interval_s=1.0, pcie_interval_s=None, call_in_thread=inline)
    got: list[tuple[float, bool]] = []
    ref = ScaledObjectRef(
        name="so",
        namespace="ns",
        scaler_metadata={
            "gpuIndex": "1",
            "activationThreshold": "50",
            "pollIntervalSeconds": "2",
            "cooldownSeconds": "0",
        },
    )

    async def stream(service: ExternalScalerService) -> None:
        async for message in service.stream_is_active(ref):
            got.append((anyio.current_time() - start, message.result))

    async with open_test_service(sampler) as served, anyio.create_task_group() as tg:
        hub = served.pipeline.hub
        start = anyio.current_time()
        tg.start_soon(stream, served.service)
        await anyio.sleep_until(start + 2.5)
        nvml.lose(1)  # from the cycle at 3: GpuIsLost on every call
        await anyio.sleep_until(start + 9.5)
        assert [d.index for d in hub.current.devices.values() if d.is_lost()] == [1]
        nvml.gpus[1].utilization = Utilization(gpu=10, memory=1)  # back, and idle
        nvml.restore(1)
        await anyio.sleep_until(start + 20.5)
        tg.cancel_scope.cancel()
    # Lost from 3 to 10 (the sampler retries at 4, 6 and 10): no message at all, not even the
    # heartbeats due at 4, 6 and 8; back at 10, idle, and inactive from then on.
    assert got == [
        (0.0, True),
        (2.0, True),
        (10.0, False),
        (12.0, False),
        (14.0, False),
        (16.0, False),
        (18.0, False),
        (20.0, False),
    ]
