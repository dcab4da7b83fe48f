"""The NVML sampler's pure decisions: loss, retry with backoff, and the PCIe cadence."""

from __future__ import annotations

import anyio
import pytest
import trio.testing

from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.samples import DeviceKey, GpuReading
from keda_gpu_scaler.sources.nvml.cycle import (
    Slot,
    fold_cycle,
    is_due,
    pcie_due,
    with_pcie,
    work_for,
)
from keda_gpu_scaler.sources.nvml.devices import GpuDevice, MigDevice
from keda_gpu_scaler.sources.nvml.errors import NvmlCode, nvml_error
from keda_gpu_scaler.sources.nvml.fake_backend import FakeNvml
from keda_gpu_scaler.sources.nvml.readings import Cycle, DeviceResult
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler
from keda_gpu_scaler.testing import collect_samples, faults, gone, inline

BACKOFF = Backoff(initial_s=1.0, factor=2.0, maximum_s=60.0)


def _gpu(index: int) -> GpuDevice:
    return GpuDevice(index=index, uuid=f"GPU-{index}", name="G", handle=object())


def _reading(uuid: str) -> GpuReading:
    return GpuReading(
        source="nvml", key=DeviceKey(uuid), index=0, uuid=uuid, name="G", taken_at=5.0, period_s=1
    )


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
    # Read at 0.0002 s; cycles every second wake a fraction after their tick.
    assert is_due(None, 0.0002, 5.0, cycle_s=1.0)
    assert not is_due(0.0002, 4.0003, 5.0, cycle_s=1.0)
    assert is_due(0.0002, 5.0001, 5.0, cycle_s=1.0)  # not at 6 s
    assert not is_due(0.0002, 5.0001, None, cycle_s=1.0)


def test_devices_no_slot_knows_any_more_are_gone_first_and_none_found_elsewhere() -> None:
    a, b = _gpu(0), _gpu(1)
    a.mig_enabled = True
    slots = (Slot(0, a, keys=("GPU-0", "MIG-x", "MIG-y")), Slot(1, b, keys=("GPU-1",)))
    # After a reset, NVML lists the GPUs the other way round, GPU 0 with one instance left.
    swapped_a, swapped_b = _gpu(1), _gpu(0)
    swapped_b.mig_enabled = True
    swapped_b.instances = [
        MigDevice(uuid="MIG-y", name="m", handle=object(), gpu_instance_id=8, compute_instance_id=0)
    ]
    results = [
        DeviceResult(0, swapped_a, readings=(_reading("GPU-1"),)),
        DeviceResult(1, swapped_b, readings=(_reading("GPU-0"),)),
    ]
    _, samples, _ = fold_cycle(slots, results, Cycle("nvml", 5.0, 1.0), BACKOFF)
    assert [type(s).__name__ for s in samples] == ["DeviceGone", "GpuReading", "GpuReading"]
    (went,) = gone(samples)
    assert (went.key, went.index, went.at) == ("MIG-x", 0, 5.0)
    assert "NVML no longer lists MIG instance MIG-x on GPU 0" in went.reason


def test_a_lost_gpu_keeps_its_instances_known_to_mark_them_lost() -> None:
    gpu = _gpu(0)
    gpu.instances = [
        MigDevice(uuid="MIG-x", name="m", handle=object(), gpu_instance_id=7, compute_instance_id=0)
    ]
    slots = (Slot(0, gpu, keys=("GPU-0", "MIG-x")),)
    result = DeviceResult(0, gpu, error=nvml_error(NvmlCode.GPU_IS_LOST, "uuid"))
    _, samples, _ = fold_cycle(slots, [result], Cycle("nvml", 5.0, 1.0), BACKOFF)
    assert gone(samples) == []
    assert [f.key for f in faults(samples)] == ["GPU-0", "MIG-x"]
