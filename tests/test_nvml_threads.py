"""Which thread does what in the NVML sampler, with real worker threads: every NVML call runs
off the event loop, and the sampler's state changes only on it."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

from keda_gpu_scaler.domain.samples import Batch, Sample
from keda_gpu_scaler.sources.nvml.backend import Handle
from keda_gpu_scaler.sources.nvml.fake_backend import FakeNvml, h200_gpu
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler
from keda_gpu_scaler.testing import faults


class ThreadRecordingNvml(FakeNvml):
    """The fake, noting the thread of every NVML call."""

    def __init__(self) -> None:
        super().__init__([h200_gpu(0), h200_gpu(1)], sleep=lambda _: None)
        self.call_threads: set[int] = set()

    def _enter(self, call: str, handle: Handle | None = None) -> Any:
        self.call_threads.add(threading.get_ident())
        return super()._enter(call, handle)


class WatchedSampler(NvmlSampler):
    """The real sampler, noting the thread of every change to its own attributes."""

    writes: list[tuple[str, int]]

    def __setattr__(self, name: str, value: object) -> None:
        if name != "writes":
            self.__dict__.setdefault("writes", []).append((name, threading.get_ident()))
        super().__setattr__(name, value)


async def _batches(receive: anyio.abc.ObjectReceiveStream[Sample], count: int) -> list[Sample]:
    return [await receive.receive() for _ in range(count)]


@pytest.mark.trio
async def test_nvml_runs_in_worker_threads_and_state_changes_only_on_the_event_loop() -> None:
    loop_thread = threading.get_ident()
    nvml = ThreadRecordingNvml()
    sampler = WatchedSampler(nvml, interval_s=0.01, pcie_interval_s=0.02, max_retry_s=0.02)
    send, receive = anyio.create_memory_object_stream[Sample](100)
    async with anyio.create_task_group() as tg, receive:
        await tg.start(sampler.run, send)
        received = await _batches(receive, 3)
        nvml.lose(0)  # losses, retries and rediscovery change the slots the most
        received += await _batches(receive, 5)
        nvml.restore(0)
        received += await _batches(receive, 10)
        tg.cancel_scope.cancel()
    assert all(isinstance(s, Batch) for s in received)
    assert any(f.lost for f in faults(received)), "the loss was not seen"
    assert loop_thread not in nvml.call_threads
    assert nvml.call_threads  # some NVML call was made, in some worker thread
    assert {thread for _, thread in sampler.writes} == {loop_thread}
    # Not vacuous: every cycle and every PCIe read replaced the slots.
    assert sum(attribute == "_slots" for attribute, _ in sampler.writes) > 18
