"""The fake NVML backend reproduces what the real H200 answered, and scripts the rest."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from keda_gpu_scaler.sources.nvml.backend import (
    FI_NVLINK_LINK_COUNT,
    FI_NVLINK_THROUGHPUT_DATA_RX,
    FI_NVLINK_THROUGHPUT_DATA_TX,
    SCOPE_ALL_LINKS,
    FieldRequest,
    GpmMetric,
    GpuInstanceInfo,
    PcieDirection,
    ProcessInfo,
)
from keda_gpu_scaler.sources.nvml.errors import (
    NvmlAbsent,
    NvmlCode,
    NvmlDeviceLost,
    NvmlError,
    NvmlLibraryError,
)
from keda_gpu_scaler.sources.nvml.fake_backend import (
    FakeGpu,
    FakeNvlink,
    FakeNvml,
    enable_mig,
    mig_instances,
)
from keda_gpu_scaler.sources.nvml.fake_processes import EPOCH_US, FakeMps, FakeProcess

PROBE: dict[str, Any] = json.loads(
    (Path(__file__).parent / "fixtures" / "nvml-h200" / "probe.json").read_text()
)
STATIC = PROBE["static"]


def test_h200_preset_matches_the_probe() -> None:
    nvml = FakeNvml.h200()
    h = nvml.device_handle(0)
    assert nvml.device_count() == STATIC["count"]
    assert (nvml.uuid(h), nvml.name(h)) == (STATIC["uuid"], STATIC["name"])
    v1, v2 = nvml.memory_v1(h), nvml.memory_v2(h)
    assert (v1.total, v1.free, v1.used) == tuple(
        STATIC["memory_v1"][k] for k in ("total", "free", "used")
    )
    assert (v2.total, v2.reserved, v2.free, v2.used) == tuple(
        STATIC["memory_v2"][k] for k in ("total", "reserved", "free", "used")
    )
    assert nvml.temperature_c(h) == STATIC["temp_c"]
    assert nvml.power_usage_mw(h) == STATIC["power_mw"]
    assert nvml.power_limit_mw(h) == STATIC["enforced_power_limit_mw"]
    assert nvml.sm_clock_mhz(h) == STATIC["clock_sm"]
    assert nvml.pcie_throughput_kbs(h, PcieDirection.TX) == STATIC["pcie_tx_kbs"]
    assert nvml.pcie_throughput_kbs(h, PcieDirection.RX) == STATIC["pcie_rx_kbs"]
    util = nvml.utilization(h)
    assert (util.gpu, util.memory) == (STATIC["util"]["gpu"], STATIC["util"]["memory"])
    assert nvml.mig_mode(h) == tuple(STATIC["mig_mode"])
    assert nvml.max_mig_device_count(h) == STATIC["max_mig"]
    assert nvml.gpm_supported(h) is bool(PROBE["gpm"]["supported"]["isSupportedDevice"])


@pytest.mark.parametrize(
    ("probe_error", "call"),
    [
        ("fan", lambda n, h: n.fan_speed_percent(h)),
        ("mig_by_index", lambda n, h: n.mig_device_handle(h, 0)),
    ],
)
def test_h200_errors_match_the_probe(probe_error: str, call: Any) -> None:
    nvml = FakeNvml.h200()
    with pytest.raises(NvmlAbsent) as caught:
        call(nvml, nvml.device_handle(0))
    assert caught.value.code == PROBE["errors"][probe_error]["value"]


def test_h200_nvlink_fields_succeed_with_a_per_field_not_supported() -> None:
    nvml = FakeNvml.h200()
    ids = [FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX, FI_NVLINK_LINK_COUNT]
    values = nvml.field_values(nvml.device_handle(0), [FieldRequest(i) for i in ids])
    probe = {f["fieldId"]: f for f in STATIC["fieldvalues"]}
    assert [(v.field_id, v.return_code, v.value) for v in values] == [
        (i, probe[i]["nvmlReturn"], probe[i]["ull"]) for i in ids
    ]


def test_nvlink_throughput_is_per_link_and_the_all_links_scope_sums_them() -> None:
    gpu = FakeGpu(uuid="GPU-x", nvlinks=[FakeNvlink(100, 7), FakeNvlink(20, 8), FakeNvlink(3, 9)])
    nvml = FakeNvml([gpu])
    h = nvml.device_handle(0)
    tx = FI_NVLINK_THROUGHPUT_DATA_TX
    requests = [FieldRequest(tx), FieldRequest(tx, 2), FieldRequest(tx, SCOPE_ALL_LINKS)]
    values = nvml.field_values(h, [*requests, FieldRequest(FI_NVLINK_LINK_COUNT)])
    # A bare field id is scope 0: link 0 alone, as nvml.h and nvidia-ml-py have it.
    assert [(v.scope_id, v.return_code, v.value) for v in values] == [
        (0, 0, 100),
        (2, 0, 3),
        (SCOPE_ALL_LINKS, 0, 123),
        (0, 0, 3),
    ]
    (past_the_end,) = nvml.field_values(h, [FieldRequest(tx, 3)])
    assert past_the_end.return_code == NvmlCode.INVALID_ARGUMENT
    gpu.nvlink_all_links_code = NvmlCode.INVALID_ARGUMENT  # an older driver
    (refused,) = nvml.field_values(h, [FieldRequest(tx, SCOPE_ALL_LINKS)])
    assert (refused.return_code, refused.value) == (NvmlCode.INVALID_ARGUMENT, 0)


def test_h200_gpm_gives_nan_dram_bandwidth_between_two_samples() -> None:
    nvml = FakeNvml.h200()
    h = nvml.device_handle(0)
    first, second = nvml.gpm_sample_alloc(), nvml.gpm_sample_alloc()
    nvml.gpm_sample_get(h, first)
    nvml.gpm_sample_get(h, second)
    metrics = {m.metric_id: m for m in nvml.gpm_metrics(first, second, list(GpmMetric))}
    assert math.isnan(metrics[GpmMetric.DRAM_BW_UTIL].value)
    assert metrics[GpmMetric.DRAM_BW_UTIL].return_code == 0
    assert metrics[GpmMetric.SM_UTIL].value == 0.0


def test_gpm_metrics_need_two_samples_oldest_first() -> None:
    nvml = FakeNvml.h200()
    h = nvml.device_handle(0)
    first, second = nvml.gpm_sample_alloc(), nvml.gpm_sample_alloc()
    nvml.gpm_sample_get(h, first)
    with pytest.raises(NvmlAbsent):
        nvml.gpm_metrics(first, second, [GpmMetric.SM_UTIL])
    nvml.gpm_sample_get(h, second)
    with pytest.raises(NvmlAbsent):
        nvml.gpm_metrics(second, first, [GpmMetric.SM_UTIL])


def test_mig_layout_handles_and_ids() -> None:
    gpu = FakeGpu(uuid="GPU-a")
    enable_mig(gpu, mig_instances(0, 2, first_gi=9))
    nvml = FakeNvml([gpu])
    parent = nvml.device_handle(0)
    assert nvml.mig_mode(parent) == (1, 1)
    assert nvml.max_mig_device_count(parent) == 7
    mig = nvml.mig_device_handle(parent, 1)
    assert (nvml.gpu_instance_id(mig), nvml.compute_instance_id(mig)) == (10, 0)
    assert nvml.uuid(mig) == "MIG-fake-0-10"
    # The GPU instance by its id, on the parent: its profile and placement.
    assert nvml.gpu_instance_info(parent, 10) == GpuInstanceInfo(19, 1, 1)
    with pytest.raises(NvmlAbsent):
        nvml.gpu_instance_info(parent, 3)  # no such GPU instance
    with pytest.raises(NvmlAbsent):
        nvml.gpu_instance_info(mig, 10)  # a GPU instance is looked up on its GPU
    assert nvml.memory_v2(mig).total == 16384 << 20
    with pytest.raises(NvmlAbsent):
        nvml.mig_device_handle(parent, 2)  # an empty slot
    with pytest.raises(NvmlAbsent):
        nvml.temperature_c(mig)  # whole-GPU readings only on the parent
    with pytest.raises(NvmlAbsent):
        nvml.utilization(parent)  # no whole-GPU utilization in MIG mode
    with pytest.raises(NvmlAbsent):
        nvml.gpu_instance_id(parent)


def test_lost_gpu_raises_gpu_is_lost_on_every_call_until_restored() -> None:
    nvml = FakeNvml.h200(2)
    h = nvml.device_handle(1)
    nvml.lose(1)
    with pytest.raises(NvmlDeviceLost) as caught:
        nvml.temperature_c(h)
    assert caught.value.code == NvmlCode.GPU_IS_LOST
    with pytest.raises(NvmlDeviceLost):
        nvml.device_handle(1)
    assert nvml.temperature_c(nvml.device_handle(0)) == 36
    nvml.restore(1)
    assert nvml.temperature_c(nvml.device_handle(1)) == 36


def test_injected_faults_hit_the_named_call_gpu_and_count() -> None:
    nvml = FakeNvml.h200(2)
    nvml.fail("temperature_c", NvmlCode.UNKNOWN, gpu=1, times=2)
    nvml.fail("device_count", NvmlCode.DRIVER_NOT_LOADED, times=1)
    h0, h1 = nvml.device_handle(0), nvml.device_handle(1)
    assert nvml.temperature_c(h0) == 36
    for _ in range(2):
        with pytest.raises(NvmlDeviceLost):
            nvml.temperature_c(h1)
    assert nvml.temperature_c(h1) == 36
    with pytest.raises(NvmlLibraryError):
        nvml.device_count()
    assert nvml.device_count() == 2


def test_slow_calls_go_through_the_injected_sleep() -> None:
    slept: list[float] = []
    nvml = FakeNvml.h200(sleep=slept.append)
    nvml.set_latency("pcie_throughput_kbs", 0.0208)
    h = nvml.device_handle(0)
    nvml.pcie_throughput_kbs(h, PcieDirection.TX)
    nvml.temperature_c(h)
    assert slept == [0.0208]
    assert nvml.calls["pcie_throughput_kbs"] == 1


def test_foreign_handles_and_freed_samples_are_refused() -> None:
    nvml = FakeNvml.h200()
    with pytest.raises(NvmlError):
        nvml.temperature_c(object())
    sample = nvml.gpm_sample_alloc()
    assert nvml.live_gpm_samples == 1
    nvml.gpm_sample_free(sample)
    assert nvml.live_gpm_samples == 0
    with pytest.raises(NvmlAbsent):
        nvml.gpm_sample_get(nvml.device_handle(0), sample)


def _clocked() -> tuple[FakeNvml, list[float]]:
    now = [10.0]
    nvml = FakeNvml([FakeGpu("GPU-p")], clock=lambda: now[0])
    return nvml, now


def test_process_samples_follow_the_last_seen_protocol() -> None:
    nvml, now = _clocked()
    gpu = nvml.gpus[0]
    busy, idle = FakeProcess(7, sm=40, memory=10), FakeProcess(8)
    gpu.processes = [busy, idle]
    h = nvml.device_handle(0)
    (first,) = nvml.processes_utilization_info(h, 0)
    # One entry per busy process, at the CPU clock's microseconds; the idle one is not listed.
    assert (first.pid, first.sm, first.memory) == (7, 40, 10)
    assert first.timestamp_us == EPOCH_US + 10_000_000
    # Nothing newer than what was seen: NotFound, not an empty list and not zeros.
    with pytest.raises(NvmlAbsent) as caught:
        nvml.processes_utilization_info(h, first.timestamp_us + 1)
    assert caught.value.code == NvmlCode.NOT_FOUND
    now[0] = 11.0
    busy.sm = 80
    (second,) = nvml.process_utilization(h, first.timestamp_us)
    assert (second.sm, second.timestamp_us) == (80, EPOCH_US + 11_000_000)
    # From 0, every sample the driver keeps, averaged per process.
    (everything,) = nvml.process_utilization(h, 0)
    assert everything.sm == (40 + 80) // 2


def test_an_exited_process_leaves_its_samples_and_the_list() -> None:
    nvml, now = _clocked()
    nvml.gpus[0].processes = [FakeProcess(7, sm=40), FakeProcess(9, sm=20)]
    h = nvml.device_handle(0)
    seen = max(s.timestamp_us for s in nvml.process_utilization(h, 0))
    now[0] = 10.5
    nvml.exit_process(0, 9)
    now[0] = 11.0
    assert [p.pid for p in nvml.compute_processes_v3(h)] == [7]
    assert [(s.pid, s.sm) for s in nvml.process_utilization(h, seen)] == [(7, 40), (9, 20)]


def test_process_calls_by_driver_version_and_device_kind() -> None:
    nvml, _ = _clocked()
    gpu = nvml.gpus[0]
    gpu.processes = [FakeProcess(7, used_memory=None)]
    gpu.process_call_version = 2
    gpu.process_utilization_call = "legacy"
    h = nvml.device_handle(0)
    assert [(p.pid, p.used_memory) for p in nvml.compute_processes_v2(h)] == [(7, None)]
    for call in (
        lambda: nvml.compute_processes_v3(h),
        lambda: nvml.mps_compute_processes_v3(h),
        lambda: nvml.processes_utilization_info(h, 0),
    ):
        with pytest.raises(NvmlAbsent) as caught:
            call()
        assert caught.value.code == NvmlCode.FUNCTION_NOT_FOUND
    gpu.process_utilization_call = "none"
    with pytest.raises(NvmlAbsent) as caught:
        nvml.process_utilization(h, 0)
    assert caught.value.code == NvmlCode.NOT_SUPPORTED


def test_mig_instances_list_their_processes_and_refuse_utilization() -> None:
    gpu = FakeGpu("GPU-m")
    instances = mig_instances(0, 2)
    instances[1].processes = [FakeProcess(5, used_memory=3)]
    enable_mig(gpu, instances)
    nvml = FakeNvml([gpu])
    h = nvml.device_handle(0)
    i8 = nvml.mig_device_handle(h, 1)
    assert nvml.compute_processes_v3(i8) == [ProcessInfo(5, 3, 8, 0)]
    assert nvml.compute_processes_v3(h) == [ProcessInfo(5, 3, 8, 0)]
    for handle in (h, i8):
        with pytest.raises(NvmlAbsent) as caught:
            nvml.processes_utilization_info(handle, 0)
        assert caught.value.code == NvmlCode.NOT_SUPPORTED


def test_mps_lists_the_server_and_its_clients_apart() -> None:
    nvml, _ = _clocked()
    gpu = nvml.gpus[0]
    gpu.mps = FakeMps(FakeProcess(55, used_memory=1))
    gpu.processes = [FakeProcess(7, used_memory=2, sm=30), FakeProcess(8, used_memory=4, sm=50)]
    h = nvml.device_handle(0)
    assert [p.pid for p in nvml.compute_processes_v3(h)] == [55]
    assert [p.pid for p in nvml.mps_compute_processes_v3(h)] == [7, 8]
    # The clients' work, sampled under the server's PID.
    assert [(s.pid, s.sm) for s in nvml.process_utilization(h, 0)] == [(55, 80)]
    gpu.mps.mps_call_supported = False
    with pytest.raises(NvmlAbsent):
        nvml.mps_compute_processes_v3(h)


def _code(call: Any) -> int:
    with pytest.raises(NvmlError) as caught:
        call()
    return caught.value.code


def test_mig_devices_are_made_at_runtime_a_gpu_instance_then_a_compute_instance() -> None:
    nvml = FakeNvml([FakeGpu("GPU-d")])
    nvml.set_mig_mode(0, True)
    parent = nvml.device_handle(0)
    assert (nvml.mig_mode(parent), nvml.max_mig_device_count(parent)) == ((1, 1), 7)
    gi = nvml.create_gpu_instance(0, start=3, profile_id=19)
    # A GPU instance alone is no MIG device: nothing to enumerate yet, but its placement is.
    assert _code(lambda: nvml.mig_device_handle(parent, 0)) == NvmlCode.NOT_FOUND
    assert nvml.gpu_instance_info(parent, gi) == GpuInstanceInfo(19, 3, 1)
    made = nvml.create_compute_instance(0, gi)
    mig = nvml.mig_device_handle(parent, 0)
    assert nvml.uuid(mig) == made.uuid
    assert (nvml.gpu_instance_id(mig), nvml.compute_instance_id(mig)) == (gi, 0)
    # Instances never overlap; a second 1g at slice 3 is refused, one at slice 4 is not.
    assert _code(lambda: nvml.create_gpu_instance(0, start=2, size=2)) == (
        NvmlCode.INSUFFICIENT_RESOURCES
    )
    other = nvml.create_mig_device(0, start=4)
    assert other.gpu_instance_id != gi
    assert [nvml.uuid(nvml.mig_device_handle(parent, i)) for i in (0, 1)] == [
        made.uuid,
        other.uuid,
    ]


def test_nothing_is_made_while_mig_mode_is_off() -> None:
    nvml = FakeNvml.h200()
    assert _code(lambda: nvml.create_gpu_instance(0, start=0)) == NvmlCode.NOT_SUPPORTED
    old = FakeNvml([FakeGpu("GPU-v100", mig_supported=False)])
    assert _code(lambda: old.mig_mode(old.device_handle(0))) == NvmlCode.NOT_SUPPORTED
    assert _code(lambda: old.set_mig_mode(0, True)) == NvmlCode.NOT_SUPPORTED


@pytest.mark.parametrize("stale", [NvmlCode.INVALID_ARGUMENT, NvmlCode.NOT_FOUND])
def test_a_destroyed_mig_devices_handle_is_invalid_and_its_placement_free_again(
    stale: NvmlCode,
) -> None:
    gpu = FakeGpu("GPU-e")
    enable_mig(gpu, mig_instances(0, 2))
    nvml = FakeNvml([gpu])
    nvml.stale_handle_code = stale
    parent = nvml.device_handle(0)
    first, second = nvml.mig_device_handle(parent, 0), nvml.mig_device_handle(parent, 1)
    # A GPU instance with a compute instance cannot go first.
    assert _code(lambda: nvml.destroy_gpu_instance(0, 7)) == NvmlCode.IN_USE
    nvml.destroy_compute_instance(0, 7, 0)
    assert _code(lambda: nvml.uuid(first)) == stale
    assert _code(lambda: nvml.memory_v2(first)) == stale
    assert _code(lambda: nvml.gpu_instance_id(first)) == stale
    # The other instance moves up to index 0; its own handle still works.
    assert nvml.uuid(second) == nvml.uuid(nvml.mig_device_handle(parent, 0)) == "MIG-fake-0-8"
    assert _code(lambda: nvml.mig_device_handle(parent, 1)) == NvmlCode.NOT_FOUND
    assert _code(lambda: nvml.gpm_mig_sample_get(parent, 7, nvml.gpm_sample_alloc())) == (
        NvmlCode.NOT_FOUND
    )
    # The GPU instance outlives its compute instance until destroyed itself.
    assert nvml.gpu_instance_info(parent, 7) == GpuInstanceInfo(19, 0, 1)
    nvml.destroy_gpu_instance(0, 7)
    assert _code(lambda: nvml.gpu_instance_info(parent, 7)) == NvmlCode.NOT_FOUND
    # Made again at the same placement: another MIG device, with a UUID of its own.
    again = nvml.create_mig_device(0, start=0)
    assert (again.placement_start, again.uuid != "MIG-fake-0-7") == (0, True)
    assert _code(lambda: nvml.uuid(first)) == stale


def test_a_mig_device_with_processes_cannot_be_destroyed() -> None:
    gpu = FakeGpu("GPU-f")
    instances = mig_instances(0, 1)
    instances[0].processes = [FakeProcess(5)]
    enable_mig(gpu, instances)
    nvml = FakeNvml([gpu])
    assert _code(lambda: nvml.destroy_mig_device(0, "MIG-fake-0-7")) == NvmlCode.IN_USE
    instances[0].processes = []
    nvml.destroy_mig_device(0, "MIG-fake-0-7")
    assert gpu.instances == [] and gpu.bare_gpu_instances == {}


def test_mig_mode_is_pending_until_activated_which_destroys_every_instance() -> None:
    gpu = FakeGpu("GPU-g")
    enable_mig(gpu, mig_instances(0, 2))
    nvml = FakeNvml([gpu])
    parent = nvml.device_handle(0)
    mig = nvml.mig_device_handle(parent, 0)
    nvml.set_mig_mode(0, False, activate=False)
    assert nvml.mig_mode(parent) == (1, 0)  # current on, pending off: a reset away
    assert nvml.uuid(mig) == "MIG-fake-0-7"
    nvml.activate_mig_mode(0)
    assert (nvml.mig_mode(parent), nvml.max_mig_device_count(parent)) == ((0, 0), 0)
    assert _code(lambda: nvml.uuid(mig)) == NvmlCode.INVALID_ARGUMENT
    assert nvml.utilization(parent).gpu == 0  # whole-GPU utilization is back
    nvml.set_mig_mode(0, True)
    assert (nvml.mig_mode(parent), nvml.max_mig_device_count(parent)) == ((1, 1), 7)
    assert _code(lambda: nvml.mig_device_handle(parent, 0)) == NvmlCode.NOT_FOUND
