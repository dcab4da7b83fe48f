"""NvmlSampler over the fake backend, in virtual time (trio MockClock, autojump)."""

from __future__ import annotations

import threading

import anyio
import pytest
import trio.testing

from keda_gpu_scaler.domain.decision import measure
from keda_gpu_scaler.domain.errors import NoData, SourceFailure
from keda_gpu_scaler.domain.samples import Batch, DeviceKey, Sample
from keda_gpu_scaler.domain.trigger import parse_trigger
from keda_gpu_scaler.sources.nvml.errors import NvmlCode
from keda_gpu_scaler.sources.nvml.fake_backend import H200_UUID, FakeNvlink, FakeNvml
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler
from keda_gpu_scaler.testing import collect_samples, faults, inline, readings, snapshot_after


def _sampler(nvml: FakeNvml, **options: float | None) -> NvmlSampler:
    return NvmlSampler(nvml, call_in_thread=inline, **options)  # type: ignore[arg-type]


@pytest.mark.trio
async def test_h200_is_read_every_second_with_absent_not_zero(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = FakeNvml.h200(clock=anyio.current_time)
    start = anyio.current_time()
    async with collect_samples(_sampler(nvml)) as received:
        await anyio.sleep_until(start + 2.5)
    got = readings(received)
    assert [r.taken_at - start for r in got] == [0.0, 1.0, 2.0]
    first, second = got[0], got[1]
    assert (first.key, first.index, first.name, first.period_s) == (
        H200_UUID,
        0,
        "NVIDIA H200",
        1.0,
    )
    # v1 semantics from the v2 call: used + reserved; reserved carried separately.
    assert (first.memory_used_bytes, first.memory_reserved_bytes) == (644_939_776, 644_939_776)
    assert first.memory_total_bytes == 150_754_820_096
    assert (first.temperature_c, first.power_mw, first.power_limit_mw) == (36.0, 123590.0, 7e5)
    assert (first.sm_clock_mhz, first.gpu_utilization, first.memory_utilization) == (
        1980.0,
        0.0,
        0.0,
    )
    # NVLink fields answer NotSupported per field on this GPU: absent, never 0.
    assert all(r.nvlink_tx_mbps is None and r.nvlink_rx_mbps is None for r in got)
    # GPM needs two samples; the H200's NaN DRAM bandwidth is no reading.
    assert (first.sm_active, first.sm_occupancy, first.tensor_active) == (None, None, None)
    assert (second.sm_active, second.sm_occupancy, second.tensor_active) == (0.0, 0.0, 0.0)
    assert second.dram_bw_util is None
    assert second.pcie_tx_kbps == 1315.0
    assert second.pcie_rx_kbps == 423.0
    assert nvml.calls["fan_speed_percent"] == 0
    assert faults(received) == []


@pytest.mark.trio
async def test_pcie_runs_on_its_own_slower_cadence_and_is_carried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = FakeNvml.h200()
    start = anyio.current_time()
    async with collect_samples(_sampler(nvml, pcie_interval_s=5.0)) as received:
        await anyio.sleep_until(start + 5.5)
        nvml.gpus[0].pcie_tx_kbs = 9999
        await anyio.sleep_until(start + 11.5)
    got = {r.taken_at - start: r.pcie_tx_kbps for r in readings(received)}
    assert nvml.calls["temperature_c"] == 12  # t = 0 .. 11
    assert nvml.calls["pcie_throughput_kbs"] == 6  # t = 0, 5, 10; TX and RX
    assert [got[t] for t in (1.0, 4.0, 6.0, 9.0)] == [1315.0] * 4
    assert got[11.0] == 9999.0


@pytest.mark.trio
async def test_pcie_can_be_switched_off(autojump_clock: trio.testing.MockClock) -> None:
    nvml = FakeNvml.h200()
    async with collect_samples(_sampler(nvml, pcie_interval_s=None)) as received:
        await anyio.sleep(2.5)
    assert nvml.calls["pcie_throughput_kbs"] == 0
    assert {r.pcie_tx_kbps for r in readings(received)} == {None}


@pytest.mark.trio
async def test_nvlink_is_a_rate_from_counters_in_the_right_direction(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = FakeNvml.h200(clock=anyio.current_time)
    gpu = nvml.gpus[0]
    (link,) = gpu.nvlinks = [FakeNvlink(10_000, 20_000)]
    start = anyio.current_time()
    async with collect_samples(_sampler(nvml)) as received:
        await anyio.sleep_until(start + 0.5)
        link.tx_kib = 10_000 + 500 * 1024  # this GPU sent 500 MiB
        link.rx_kib = 20_000 + 100 * 1024
        await anyio.sleep_until(start + 1.5)
    got = readings(received)
    assert (got[0].nvlink_tx_mbps, got[0].nvlink_rx_mbps) == (None, None)
    assert (got[1].nvlink_tx_mbps, got[1].nvlink_rx_mbps) == (500.0, 100.0)


async def _nvlink_rates_over_18_links(nvml: FakeNvml) -> list[tuple[float | None, ...]]:
    """Link ``i`` of the GPU sends ``i + 1`` MiB and receives 1 MiB in the second cycle."""
    links = nvml.gpus[0].nvlinks = [FakeNvlink(0, 0) for _ in range(18)]
    start = anyio.current_time()
    async with collect_samples(_sampler(nvml)) as received:
        await anyio.sleep_until(start + 0.5)
        for i, link in enumerate(links):
            link.tx_kib, link.rx_kib = (i + 1) * 1024, 1024
        await anyio.sleep_until(start + 1.5)
    return [(r.nvlink_tx_mbps, r.nvlink_rx_mbps) for r in readings(received)]


@pytest.mark.trio
async def test_nvlink_is_the_sum_of_all_links_not_link_0(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = FakeNvml.h200(clock=anyio.current_time)
    assert await _nvlink_rates_over_18_links(nvml) == [(None, None), (171.0, 18.0)]
    assert nvml.calls["field_values"] == 2  # the driver sums: one call per cycle


@pytest.mark.trio
@pytest.mark.parametrize("refusal", ["per field", "whole call"])
async def test_nvlink_is_summed_link_by_link_where_the_driver_refuses_the_all_links_scope(
    autojump_clock: trio.testing.MockClock, refusal: str
) -> None:
    nvml = FakeNvml.h200(clock=anyio.current_time)
    if refusal == "per field":
        nvml.gpus[0].nvlink_all_links_code = NvmlCode.INVALID_ARGUMENT
    else:
        nvml.fail("field_values", NvmlCode.NOT_SUPPORTED, times=1)
    assert await _nvlink_rates_over_18_links(nvml) == [(None, None), (171.0, 18.0)]


@pytest.mark.trio
async def test_gpu_lost_mid_run_is_marked_retried_with_backoff_and_recovers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = FakeNvml.h200(2)
    lost_key = nvml.gpus[1].uuid
    start = anyio.current_time()
    sampler = _sampler(nvml)
    async with collect_samples(sampler) as received:
        await anyio.sleep_until(start + 2.5)
        nvml.lose(1)
        await anyio.sleep_until(start + 5.5)
        mid_run = list(received)
        await anyio.sleep_until(start + 6.5)
        nvml.restore(1)
        await anyio.sleep_until(start + 11.5)
    assert [r.taken_at - start for r in readings(received, H200_UUID)] == [
        float(t) for t in range(12)
    ]
    assert [r.taken_at - start for r in readings(received, lost_key)] == [0, 1, 2, 10, 11]
    lost = faults(received)
    assert [f.at - start for f in lost] == [3.0, 4.0, 6.0]  # retries after 1 s, then 2 s, 4 s
    assert all(f.lost and f.key == lost_key and f.index == 1 for f in lost)
    assert "GPU is lost" in lost[0].reason
    assert [
        d.index for d in snapshot_after(received, start + 11.5).devices.values() if d.is_lost()
    ] == []

    snapshot = snapshot_after(mid_run, start + 5.5)
    assert [d.index for d in snapshot.devices.values() if d.is_lost()] == [1]
    assert snapshot.devices[DeviceKey(lost_key)].lost_since == start + 3.0  # the first loss
    with pytest.raises(NoData, match=r"GPU 1 \(.*\) is lost"):
        measure(parse_trigger({"gpuIndex": "1"}), snapshot, start + 5.5)
    with pytest.raises(NoData, match="is lost"):
        measure(parse_trigger({}), snapshot, start + 5.5)
    assert measure(parse_trigger({"gpuIndex": "0"}), snapshot, start + 5.5).value == 0.0


@pytest.mark.trio
async def test_unknown_error_marks_the_device_lost_and_gpm_buffers_are_freed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = FakeNvml.h200()
    nvml.fail("utilization", NvmlCode.UNKNOWN, gpu=0, times=1)
    start = anyio.current_time()
    async with collect_samples(_sampler(nvml)) as received:
        await anyio.sleep_until(start + 1.5)
        assert nvml.live_gpm_samples == 2
    (fault,) = faults(received)
    assert (fault.at, fault.lost, fault.key) == (start, True, H200_UUID)
    assert "Unknown Error" in fault.reason
    assert [r.taken_at - start for r in readings(received)] == [1.0]
    assert nvml.live_gpm_samples == 0


@pytest.mark.trio
async def test_gpu_that_fails_discovery_is_reported_without_a_made_up_key(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = FakeNvml.h200()
    nvml.fail("device_handle", NvmlCode.GPU_IS_LOST, times=1)
    start = anyio.current_time()
    async with collect_samples(_sampler(nvml)) as received:
        await anyio.sleep_until(start + 1.5)
    (fault,) = faults(received)
    assert (fault.key, fault.lost) == (None, False)
    assert fault.reason.startswith("GPU 0 cannot be read")
    assert [r.taken_at - start for r in readings(received)] == [1.0]


@pytest.mark.trio
async def test_nvml_failing_as_a_whole_ends_run_with_source_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = FakeNvml.h200()
    nvml.fail("temperature_c", NvmlCode.DRIVER_NOT_LOADED)
    send, receive = anyio.create_memory_object_stream[Sample](100)
    with receive, pytest.raises(SourceFailure, match="Driver Not Loaded"):
        await _sampler(nvml).run(send)


@pytest.mark.trio
async def test_nvml_failing_at_discovery_raises_before_started(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = FakeNvml.h200()
    nvml.fail("device_count", NvmlCode.UNINITIALIZED)
    send, receive = anyio.create_memory_object_stream[Sample](100)
    with receive, pytest.raises(SourceFailure, match="Uninitialized"):
        await _sampler(nvml).run(send)


@pytest.mark.trio
async def test_slow_calls_are_measured_and_do_not_shift_the_schedule(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = FakeNvml.h200(sleep=autojump_clock.jump)
    nvml.set_latency("utilization", 0.25)
    nvml.set_latency("pcie_throughput_kbs", 0.0208)
    start = anyio.current_time()
    sampler = _sampler(nvml, pcie_interval_s=None)
    async with collect_samples(sampler) as received:
        await anyio.sleep_until(start + 2.9)
    assert [r.taken_at - start for r in readings(received)] == [0.0, 1.0, 2.0]
    cycles = [s for s in received if isinstance(s, Batch)]
    assert [b.cycle_s for b in cycles] == pytest.approx([0.25] * 3)


@pytest.mark.trio
async def test_nvml_calls_run_off_the_event_loop() -> None:
    """With the default worker thread, a blocked NVML call leaves the event loop free."""
    entered, release = threading.Event(), threading.Event()

    def blocking_call(_seconds: float) -> None:
        entered.set()
        release.wait(5)

    nvml = FakeNvml.h200(sleep=blocking_call)
    nvml.set_latency("utilization", 1.0)
    sampler = NvmlSampler(nvml, pcie_interval_s=None)
    send, receive = anyio.create_memory_object_stream[Sample](100)
    async with anyio.create_task_group() as tg:
        await tg.start(sampler.run, send)
        assert await anyio.to_thread.run_sync(entered.wait, 5)
        # Still here, and no cycle finished: the call is blocked in its worker thread.
        assert receive.statistics().current_buffer_used == 0
        release.set()
        with receive:
            (first,) = readings([await receive.receive()])
        assert first.key == H200_UUID
        tg.cancel_scope.cancel()
