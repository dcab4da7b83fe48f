"""MIG: per-instance readings with a unique identity, and triggers over them."""

from __future__ import annotations

import anyio
import pytest
import trio.testing

from keda_gpu_scaler.domain.decision import decide, measure
from keda_gpu_scaler.domain.errors import NoData
from keda_gpu_scaler.domain.samples import GpuReading
from keda_gpu_scaler.domain.snapshot import Snapshot
from keda_gpu_scaler.domain.trigger import parse_trigger
from keda_gpu_scaler.sources.nvml.backend import GpmMetric
from keda_gpu_scaler.sources.nvml.errors import NvmlCode
from keda_gpu_scaler.sources.nvml.fake_backend import (
    FakeGpu,
    FakeNvml,
    enable_mig,
    h200_gpu,
    mig_instances,
)
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler
from keda_gpu_scaler.testing import collect_samples, inline, readings, snapshot_after

GIB = 1 << 30


def _mig_node() -> FakeNvml:
    """GPU 0: MIG with instances GI 7 and GI 8; GPU 1: a plain H200."""
    mig = h200_gpu(0)
    instances = mig_instances(0, 2)
    instances[0].memory_used = 3 * GIB
    instances[1].memory_used = 5 * GIB
    instances[0].gpm = {GpmMetric.SM_UTIL: 10.0, GpmMetric.DRAM_BW_UTIL: float("nan")}
    instances[1].gpm = {GpmMetric.SM_UTIL: 60.0, GpmMetric.ANY_TENSOR_UTIL: 40.0}
    enable_mig(mig, instances)
    plain = h200_gpu(1)
    plain.memory_used = 7 * GIB
    plain.memory_reserved = 0
    return FakeNvml([mig, plain])


async def _two_cycles(nvml: FakeNvml) -> tuple[list[GpuReading], Snapshot, float]:
    start = anyio.current_time()
    async with collect_samples(NvmlSampler(nvml, call_in_thread=inline)) as received:
        await anyio.sleep_until(start + 1.5)
    now = start + 1.5
    return readings(received), snapshot_after(received, now), now


@pytest.mark.trio
async def test_instances_have_their_own_identity_memory_and_gpm(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = _mig_node()
    got, _, _ = await _two_cycles(nvml)
    last: dict[str, GpuReading] = {r.key: r for r in got}
    parent, i7, i8 = last[nvml.gpus[0].uuid], last["MIG-fake-0-7"], last["MIG-fake-0-8"]
    assert parent.mig_enabled
    assert not parent.is_mig_instance()
    assert parent.gpu_utilization is None  # NVML has none for a GPU in MIG mode
    assert (i7.index, i7.parent_index, i7.parent_uuid) == (0, 0, nvml.gpus[0].uuid)
    assert (i7.gpu_instance_id, i7.compute_instance_id, i8.gpu_instance_id) == (7, 0, 8)
    assert not i7.mig_enabled
    # Each GPU instance's profile and placement (memory slices 0 and 1), and none on a GPU.
    assert (i7.gpu_instance_profile_id, i7.placement_start, i7.placement_size) == (19, 0, 1)
    assert (i8.placement_start, i8.placement_size) == (1, 1)
    assert (parent.placement_start, parent.gpu_instance_profile_id) == (None, None)
    assert (i7.memory_used_bytes, i8.memory_used_bytes) == (3 * GIB, 5 * GIB)
    assert i7.memory_total_bytes == 16 * GIB
    assert (i7.sm_active, i7.dram_bw_util, i8.sm_active, i8.tensor_active) == (
        10.0,
        None,
        60.0,
        40.0,
    )
    assert i7.gpu_utilization is None  # absent, not the 0 the Go project reported
    # Whole-GPU readings are copied from the parent.
    assert (i7.temperature_c, i7.power_mw) == (parent.temperature_c, parent.power_mw)
    assert nvml.calls["gpm_mig_sample_get"] == 4  # two GIs, two cycles


@pytest.mark.trio
async def test_a_placement_nvml_refuses_is_absent_and_the_instance_still_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = _mig_node()
    nvml.fail("gpu_instance_info", NvmlCode.NO_PERMISSION)
    got, _, _ = await _two_cycles(nvml)
    i7 = next(r for r in got if r.key == "MIG-fake-0-7")
    assert (i7.gpu_instance_profile_id, i7.placement_start, i7.placement_size) == (None,) * 3
    assert (i7.gpu_instance_id, i7.memory_used_bytes) == (7, 3 * GIB)


@pytest.mark.trio
async def test_triggers_over_instances_count_whole_gpu_readings_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    _, snapshot, now = await _two_cycles(_mig_node())

    def value(**metadata: str) -> float:
        return measure(parse_trigger(metadata), snapshot, now).value

    # gpuIndex -1: instances stand for GPU 0; GPU 1 is itself.
    assert value(metricType="memory_used_mib", aggregation="sum") == 3 * 1024 + 5 * 1024 + 7 * 1024
    # Power is per GPU: GPU 0 counted once, not once per instance.
    assert value(metricType="power_draw", aggregation="sum") == pytest.approx(2 * 123.59)
    assert value(metricType="temperature", aggregation="avg") == 36.0
    # gpuIndex N is the physical GPU.
    assert value(metricType="memory_used_mib", gpuIndex="0") == 644_939_776 // (1 << 20)
    # migInstance picks one instance, by ids or by UUID.
    assert value(metricType="sm_active", migInstance="0:8") == 60.0
    assert value(metricType="sm_active", migInstance="MIG-fake-0-7") == 10.0
    assert value(metricType="sm_active", migInstance="0:8:0") == 60.0


@pytest.mark.trio
async def test_explanations_name_instances_without_index_collisions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    _, snapshot, now = await _two_cycles(_mig_node())
    spec = parse_trigger({"metricType": "sm_active", "aggregation": "max"})
    decision = decide(spec, snapshot, None, now)
    assert "MIG 0:7=10, MIG 0:8=60" in decision.explanation
    power = decide(parse_trigger({"metricType": "power_draw"}), snapshot, now=now, entry=None)
    assert "[GPU 0=123.59, GPU 1=123.59]" in power.explanation


@pytest.mark.trio
async def test_unknown_mig_instance_is_no_data_listing_the_instances(
    autojump_clock: trio.testing.MockClock,
) -> None:
    _, snapshot, now = await _two_cycles(_mig_node())
    with pytest.raises(NoData, match=r"no MIG instance 1:7 on this node \(MIG instances: MIG 0:7"):
        measure(parse_trigger({"migInstance": "1:7"}), snapshot, now)


@pytest.mark.trio
async def test_mig_enabled_without_instances_gives_nothing_under_all_gpus(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gpu = FakeGpu(uuid="GPU-empty-mig")
    enable_mig(gpu, [])
    _, snapshot, now = await _two_cycles(FakeNvml([gpu]))
    with pytest.raises(NoData, match="no MIG instance exists"):
        measure(parse_trigger({"metricType": "temperature"}), snapshot, now)
    assert measure(parse_trigger({"metricType": "temperature", "gpuIndex": "0"}), snapshot, now)


@pytest.mark.trio
async def test_gpm_metrics_on_a_gpu_without_gpm_fail_clearly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    older = FakeGpu(uuid="GPU-a100", name="NVIDIA A100", gpm_supported=False)
    nvml = FakeNvml([older])
    got, snapshot, now = await _two_cycles(nvml)
    assert {r.sm_active for r in got} == {None}
    assert nvml.calls["gpm_sample_alloc"] == 0
    with pytest.raises(NoData, match=r"sm_active is not supported on GPU 0 .*needs GPM"):
        measure(parse_trigger({"profile": "gpu-busy"}), snapshot, now)


@pytest.mark.trio
async def test_memory_falls_back_to_v1_where_v2_is_missing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    old_driver = FakeGpu(uuid="GPU-old", memory_v2_supported=False)
    nvml = FakeNvml([old_driver])
    got, _, _ = await _two_cycles(nvml)
    assert {r.memory_used_bytes for r in got} == {644_939_776}  # v1 used includes reserved
    assert {r.memory_reserved_bytes for r in got} == {None}
    assert nvml.calls["memory_v2"] == 1  # not retried every cycle


@pytest.mark.trio
async def test_instances_without_gpm_are_named_in_the_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gpu = FakeGpu(uuid="GPU-a100", name="NVIDIA A100", gpm_supported=False)
    enable_mig(gpu, mig_instances(0, 2))
    _, snapshot, now = await _two_cycles(FakeNvml([gpu]))
    with pytest.raises(NoData, match=r"sm_active is not supported on MIG 0:7, 0:8 .*needs GPM"):
        measure(parse_trigger({"metricType": "sm_active"}), snapshot, now)
