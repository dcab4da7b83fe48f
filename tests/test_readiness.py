"""Readiness follows the snapshot in virtual time, and each change is logged once."""

from __future__ import annotations

import logging

import anyio
import pytest
from anyio.streams.memory import MemoryObjectSendStream
from trio.testing import MockClock

from keda_gpu_scaler.domain.samples import Sample
from keda_gpu_scaler.pipeline.aggregator import Aggregator
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.supervisor import Backoff, supervise
from keda_gpu_scaler.serving.probes import Readiness
from keda_gpu_scaler.sources.fake import FakeGpuSource


@pytest.mark.trio
async def test_ready_unready_and_ready_again(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.serving.probes")
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, gpu_utilization=1.0)
    source.pause()
    hub = SnapshotHub()
    readiness = Readiness(hub)
    send, receive = anyio.create_memory_object_stream[Sample](16)

    async def start(channel: MemoryObjectSendStream[Sample]) -> None:
        await source.run(channel)

    async with anyio.create_task_group() as tg:
        await tg.start(Aggregator(receive, hub).run)
        tg.start_soon(lambda: supervise("fake", start, send=send, backoff=Backoff(1, 1, 1)))
        await anyio.sleep(0.5)
        assert readiness.check() == (False, "no snapshot yet")
        source.resume()
        await anyio.sleep(1.0)
        assert readiness.check() == (True, "1 of 1 device(s) fresh")
        source.pause()  # at 1.5; the last reading was taken at 1.0: fresh until 4.0
        await anyio.sleep(2.4)
        assert readiness.check()[0] is True
        await anyio.sleep(0.2)
        assert readiness.check() == (False, "no fresh reading: 1 device(s) lost or stale")
        assert readiness.check()[0] is False
        source.resume()
        source.crash_next_cycle("driver gone")
        await anyio.sleep(1.0)
        assert readiness.check() == (False, "source failing: fake: driver gone")
        await anyio.sleep(2.0)  # restarted after 1 s of backoff
        assert readiness.check()[0] is True
        tg.cancel_scope.cancel()
    events = [
        (r.getMessage(), getattr(r, "reason", None))
        for r in caplog.records
        if r.name == "keda_gpu_scaler.serving.probes"
    ]
    assert events == [
        ("not ready", "no snapshot yet"),
        ("ready", "1 of 1 device(s) fresh"),
        ("not ready", "no fresh reading: 1 device(s) lost or stale"),
        ("ready", "1 of 1 device(s) fresh"),
    ]
