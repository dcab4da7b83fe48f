"""Dynamic MIG: instances made and destroyed, and MIG mode switched, while the sampler runs.

Virtual time (trio MockClock, autojump); cycles every second, the MIG layout read again
every 5 s (the default), the fake NVML changed between cycles as NVIDIA's DRA driver or
``nvidia-smi mig`` would change the real one.
"""

from __future__ import annotations

import logging

import anyio
import pytest
import trio.testing

from keda_gpu_scaler.domain.decision import measure
from keda_gpu_scaler.domain.dra import Slices, join_devices
from keda_gpu_scaler.domain.samples import (
    DeviceKey,
    DraDevice,
    DraPool,
    ResourceSlicesReading,
    Sample,
    SliceDevice,
)
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
from keda_gpu_scaler.testing import collect_samples, gone, inline, readings, snapshot_after

PARENT = "GPU-4f60bdab-7290-5bab-ee63-d697ab1e6349"  # the H200's, GPU 0


def _mig_gpu(count: int = 2) -> FakeNvml:
    """GPU 0 in MIG mode with ``count`` 1g instances (GI 7 at slice 0, GI 8 at slice 1)."""
    gpu = h200_gpu(0)
    enable_mig(gpu, mig_instances(0, count))
    for instance in gpu.instances:
        instance.gpm = {GpmMetric.SM_UTIL: 40.0}
    return FakeNvml([gpu])


def _times(samples: list[Sample], key: str, start: float) -> list[float]:
    return [r.taken_at - start for r in readings(samples, key)]


@pytest.mark.trio
async def test_an_instance_made_at_runtime_is_read_from_the_next_layout_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = _mig_gpu(1)
    start = anyio.current_time()
    async with collect_samples(NvmlSampler(nvml, call_in_thread=inline)) as received:
        await anyio.sleep_until(start + 2.5)
        made = nvml.create_mig_device(0, start=3, uuid="MIG-made-0-3")
        made.gpm = {GpmMetric.SM_UTIL: 65.0}
        await anyio.sleep_until(start + 7.5)
    # Read every cycle from the layout read at 5 s; never before it was made.
    assert _times(received, "MIG-made-0-3", start) == [5.0, 6.0, 7.0]
    assert _times(received, "MIG-fake-0-7", start) == [float(t) for t in range(8)]
    first, second = readings(received, "MIG-made-0-3")[:2]
    assert (first.parent_uuid, first.gpu_instance_id, first.placement_start) == (PARENT, 1, 3)
    assert (first.gpu_instance_profile_id, first.placement_size) == (19, 1)
    assert (first.sm_active, second.sm_active) == (None, 65.0)  # GPM needs two samples
    assert gone(received) == []


@pytest.mark.trio
@pytest.mark.parametrize("stale", [NvmlCode.INVALID_ARGUMENT, NvmlCode.NOT_FOUND])
async def test_a_destroyed_instance_is_forgotten_at_the_next_cycle_and_its_buffers_freed(
    autojump_clock: trio.testing.MockClock, stale: NvmlCode
) -> None:
    nvml = _mig_gpu(2)
    nvml.stale_handle_code = stale
    start = anyio.current_time()
    async with collect_samples(NvmlSampler(nvml, call_in_thread=inline)) as received:
        await anyio.sleep_until(start + 2.5)
        live = nvml.live_gpm_samples
        nvml.destroy_mig_device(0, "MIG-fake-0-7")
        await anyio.sleep_until(start + 3.5)
        assert nvml.live_gpm_samples == live - 2  # its two GPM buffers
        after = list(received)
        await anyio.sleep_until(start + 4.5)
    # Its handle is refused at the next cycle (3 s), before the layout's own read at 5 s.
    assert _times(received, "MIG-fake-0-7", start) == [0.0, 1.0, 2.0]
    (went,) = gone(received)
    assert (went.key, went.index, went.at - start) == ("MIG-fake-0-7", 0, 3.0)
    assert "NVML no longer lists MIG instance MIG-fake-0-7 on GPU 0: it was destroyed" in (
        went.reason
    )
    snapshot = snapshot_after(after, start + 3.5)
    assert sorted(snapshot.devices) == sorted([PARENT, "MIG-fake-0-8"])
    # Every GPU of the node is the instance left, fresh: no stale device in the way.
    spec = parse_trigger({"metricType": "sm_active", "aggregation": "max"})
    assert measure(spec, snapshot, start + 3.5).value == 40.0
    # The faults counted nothing: an instance destroyed is no failure.
    assert snapshot.sources["nvml"].faults == 0


@pytest.mark.trio
async def test_a_swap_at_one_placement_reads_the_new_instance_and_joins_the_claim_to_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = _mig_gpu(2)
    start = anyio.current_time()
    async with collect_samples(NvmlSampler(nvml, call_in_thread=inline)) as received:
        await anyio.sleep_until(start + 2.5)
        # The DRA driver tears down GI 8 (slice 1) and makes another 1g there for a new claim.
        nvml.destroy_mig_device(0, "MIG-fake-0-8")
        nvml.create_mig_device(0, start=1, uuid="MIG-new-0-1")
        await anyio.sleep_until(start + 3.5)
    # The old handle is refused at 3 s: the layout is read then, and the new one read at once.
    assert _times(received, "MIG-new-0-1", start) == [3.0]
    assert [g.key for g in gone(received)] == ["MIG-fake-0-8"]
    snapshot = snapshot_after(received, start + 3.5)
    placed = {k: d.reading.placement_start for k, d in snapshot.devices.items() if d.reading}
    assert placed == {PARENT: None, "MIG-fake-0-7": 0, "MIG-new-0-1": 1}
    # A claim's MIG device without a uuid is the one instance at its placement: the new one.
    claim = DraDevice(
        namespace="ml",
        pod="llm-0",
        container="main",
        claim_namespace="ml",
        claim_name="mig",
        driver="gpu.nvidia.com",
        pool="node-1",
        device="gpu-0-mig-1g18gb-19-1",
        gpu=True,
    )
    pool = DraPool(
        driver="gpu.nvidia.com",
        name="node-1",
        generation=1,
        slices=1,
        slice_count=1,
        devices=(SliceDevice(name=claim.device, parent_uuid=PARENT, type="mig"),),
    )
    slices = ResourceSlicesReading(
        source="resource-slices", taken_at=start, period_s=10.0, node="node-1", pools=(pool,)
    )
    (joined,) = join_devices((claim,), Slices.of(slices, None), snapshot.devices)
    assert (joined.outcome, joined.key) == ("placement", "MIG-new-0-1")


@pytest.mark.trio
async def test_mig_mode_turned_on_then_off_while_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = FakeNvml.h200()
    start = anyio.current_time()
    async with collect_samples(NvmlSampler(nvml, call_in_thread=inline)) as received:
        await anyio.sleep_until(start + 2.5)
        nvml.set_mig_mode(0, True)
        nvml.create_mig_device(0, start=0, uuid="MIG-on-0-0")
        await anyio.sleep_until(start + 5.5)
        on = snapshot_after(received, start + 5.5)
        await anyio.sleep_until(start + 7.5)
        nvml.set_mig_mode(0, False)
        await anyio.sleep_until(start + 8.5)
    gpu = readings(received, PARENT)
    assert [(r.taken_at - start, r.mig_enabled) for r in gpu] == [
        *((float(t), False) for t in range(5)),
        *((float(t), True) for t in range(5, 8)),
        (8.0, False),  # the instance's handle refused at 8 s: the layout is read at once
    ]
    # NVML has no whole-GPU utilization in MIG mode: absent from the switch on, at 2.5 s.
    assert [r.gpu_utilization for r in gpu] == [0.0] * 3 + [None] * 5 + [0.0]
    assert _times(received, "MIG-on-0-0", start) == [5.0, 6.0, 7.0]
    # While on, the GPU stands for no reading of its own under "every GPU": its instance does.
    spec = parse_trigger({"metricType": "memory_used_mib", "aggregation": "sum"})
    assert measure(spec, on, start + 5.5).value == 0.0  # the new instance's, none in use
    (went,) = gone(received)
    assert (went.key, went.at - start) == ("MIG-on-0-0", 8.0)
    assert went.reason == "MIG mode is off on GPU 0: MIG instance MIG-on-0-0 no longer exists"
    off = snapshot_after(received, start + 8.5)
    assert list(off.devices) == [PARENT]
    assert measure(parse_trigger({}), off, start + 8.5).value == 0.0


@pytest.mark.trio
async def test_a_pending_mig_mode_is_watched_every_cycle_until_it_takes_effect(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = FakeNvml.h200()
    start = anyio.current_time()
    async with collect_samples(NvmlSampler(nvml, call_in_thread=inline)) as received:
        await anyio.sleep_until(start + 0.5)
        nvml.set_mig_mode(0, True, activate=False)  # in use: enabled at the next reset
        await anyio.sleep_until(start + 6.5)
        assert nvml.calls["mig_mode"] == 3  # at 0 s, 5 s (the cadence: pending seen), 6 s
        nvml.activate_mig_mode(0)
        nvml.create_mig_device(0, start=0, uuid="MIG-reset-0-0")
        await anyio.sleep_until(start + 7.5)
    # Seen at 7 s, not at the next layout read at 10 s.
    assert _times(received, "MIG-reset-0-0", start) == [7.0]
    assert [r.mig_enabled for r in readings(received, PARENT)][-2:] == [False, True]


@pytest.mark.trio
async def test_the_layout_of_a_gpu_without_mig_is_never_read_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = FakeNvml([FakeGpu("GPU-v100", name="Tesla V100", mig_supported=False)])
    start = anyio.current_time()
    async with collect_samples(NvmlSampler(nvml, call_in_thread=inline)):
        await anyio.sleep_until(start + 11.5)
    assert (nvml.calls["mig_mode"], nvml.calls["max_mig_device_count"]) == (1, 0)


@pytest.mark.trio
async def test_the_layout_is_read_on_its_own_cadence_and_can_be_left_to_refused_handles(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = _mig_gpu(1)
    start = anyio.current_time()
    async with collect_samples(NvmlSampler(nvml, call_in_thread=inline)):
        await anyio.sleep_until(start + 11.5)
    assert nvml.calls["max_mig_device_count"] == 3  # at 0, 5 and 10 s
    quiet = _mig_gpu(1)
    sampler = NvmlSampler(quiet, mig_layout_interval_s=None, call_in_thread=inline)
    start = anyio.current_time()
    async with collect_samples(sampler) as received:
        await anyio.sleep_until(start + 2.5)
        quiet.destroy_mig_device(0, "MIG-fake-0-7")
        await anyio.sleep_until(start + 3.5)
    assert quiet.calls["max_mig_device_count"] == 2  # at discovery, and once refused
    assert [g.key for g in gone(received)] == ["MIG-fake-0-7"]


@pytest.mark.trio
async def test_instances_destroyed_while_their_gpu_was_lost_are_forgotten_when_it_returns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    nvml = _mig_gpu(2)
    start = anyio.current_time()
    async with collect_samples(NvmlSampler(nvml, call_in_thread=inline)) as received:
        await anyio.sleep_until(start + 1.5)
        nvml.lose(0)
        await anyio.sleep_until(start + 2.5)
        nvml.restore(0)
        nvml.destroy_mig_device(0, "MIG-fake-0-8")
        await anyio.sleep_until(start + 3.5)
    # Lost at 2 s with both instances; found again at 3 s (the retry after one period).
    snapshot = snapshot_after(received, start + 3.5)
    assert [g.key for g in gone(received)] == ["MIG-fake-0-8"]
    assert sorted(snapshot.devices) == sorted([PARENT, "MIG-fake-0-7"])
    assert not any(d.is_lost() for d in snapshot.devices.values())


@pytest.mark.trio
async def test_layout_changes_are_logged(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    nvml = _mig_gpu(1)
    start = anyio.current_time()
    with caplog.at_level(logging.INFO, logger="keda_gpu_scaler.sources.nvml.sampler"):
        async with collect_samples(NvmlSampler(nvml, call_in_thread=inline)):
            await anyio.sleep_until(start + 0.5)
            nvml.create_mig_device(0, start=2, uuid="MIG-log-0-2")
            nvml.destroy_mig_device(0, "MIG-fake-0-7")
            await anyio.sleep_until(start + 1.5)
    lines = [(r.message, r.gpu, r.uuid) for r in caplog.records]  # type: ignore[attr-defined]
    assert lines == [
        ("MIG instance appeared", 0, "MIG-log-0-2"),
        ("device gone", 0, DeviceKey("MIG-fake-0-7")),
    ]
