"""The NVML sampler's pure decisions: loss, retry with backoff, and the PCIe cadence."""

from __future__ import annotations

import anyio
import pytest
import trio.testing

from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.sources.nvml.cycle import Slot, fold_cycle, pcie_due, with_pcie, work_for
from keda_gpu_scaler.sources.nvml.devices import GpuDevice
from keda_gpu_scaler.sources.nvml.errors import NvmlCode, nvml_error
from keda_gpu_scaler.sources.nvml.fake_backend import FakeNvml
from keda_gpu_scaler.sources.nvml.readings import Cycle, DeviceResult
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler
from keda_gpu_scaler.testing import collect_samples, faults, inline

BACKOFF = Backoff(initial_s=1.0, factor=2.0, maximum_s=60.0)


def _gpu(index: int) -> GpuDevice:
    return GpuDevice(index=index, uuid=f"GPU-{index}", name="G", handle=object())


def test_a_failed_read_loses_the_gpu_frees_it_and_backs_off() -> None:
    gpu = _gpu(0)
    slots = (Slot(0, gpu, keys=("GPU-0",), failures=2),)
    lost = nvml_error(NvmlCode.GPU_IS_LOST, "utilization")
    result = DeviceResult(0, gpu, error=lost)
    (slot,), samples, released = fold_cycle(slots, [result], Cycle("nvml", 10.0, 1.0), BACKOFF)
    assert (slot.gpu, slot.failures, slot.retry_at) == (None, 3, 14.0)
    assert released == [gpu]
    assert [(f.key, f.lost, f.at) for f in faults(samples)] == [("GPU-0", True, 10.0)]


def test_only_due_retries_are_attempted() -> None:
    slots = (Slot(0, _gpu(0)), Slot(1, retry_at=5.0), Slot(2, retry_at=4.0))
    assert [w.index for w in work_for(slots, 4.0, None)] == [0, 2]


def test_pcie_is_spread_over_cycles_oldest_first() -> None:
    slots = tuple(Slot(i, _gpu(i)) for i in range(8))
    # 8 GPUs, 1 s cycles, PCIe every 5 s: two GPUs after each cycle keep all within 5 s.
    first = pcie_due(slots, 0.0, interval_s=1.0, pcie_interval_s=5.0)
    assert [g.index for g in first] == [0, 1]
    slots = with_pcie(slots, {g.index: (1, 2) for g in first}, 0.0)
    assert [g.index for g in pcie_due(slots, 1.0, interval_s=1.0, pcie_interval_s=5.0)] == [2, 3]
    slots = with_pcie(slots, dict.fromkeys(range(2, 8), (1, 2)), 1.0)
    assert pcie_due(slots, 4.9, interval_s=1.0, pcie_interval_s=5.0) == []
    assert [g.index for g in pcie_due(slots, 5.0, interval_s=1.0, pcie_interval_s=5.0)] == [0, 1]


@pytest.mark.trio
async def test_every_gpu_gets_pcie_within_its_period(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = FakeNvml.h200(8)
    sampler = NvmlSampler(nvml, pcie_interval_s=5.0, call_in_thread=inline)
    start = anyio.current_time()
    async with collect_samples(sampler):
        await anyio.sleep_until(start + 4.5)
    assert nvml.calls["pcie_throughput_kbs"] == 16  # each of 8 GPUs once, in 4 cycles


def test_processes_are_due_on_their_tick_though_a_real_clock_wakes_late() -> None:
    from keda_gpu_scaler.sources.nvml.cycle import processes_due

    # Read at 0.0002 s; cycles every second wake a fraction after their tick.
    assert processes_due(None, 0.0002, 5.0, cycle_s=1.0)
    assert not processes_due(0.0002, 4.0003, 5.0, cycle_s=1.0)
    assert processes_due(0.0002, 5.0001, 5.0, cycle_s=1.0)  # not at 6 s
    assert not processes_due(0.0002, 5.0001, None, cycle_s=1.0)
