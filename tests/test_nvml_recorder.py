"""Recording a replay trace from an NVML backend, and reading old and new traces back."""

from __future__ import annotations

import hashlib
import math
from importlib import resources
from pathlib import Path

import anyio
import msgspec
import pytest
import trio.testing

from keda_gpu_scaler.domain.errors import SourceFailure, SourceUnavailable
from keda_gpu_scaler.domain.samples import DeviceKey, GpuReading
from keda_gpu_scaler.sources.nvml.backend import GpmMetric
from keda_gpu_scaler.sources.nvml.errors import NvmlCode
from keda_gpu_scaler.sources.nvml.fake_backend import FakeNvml, enable_mig, h200_gpu, mig_instances
from keda_gpu_scaler.sources.recorder import record_trace
from keda_gpu_scaler.sources.trace import (
    GpmFrame,
    TraceFrame,
    encode_frame,
    frame_to_reading,
    parse_trace,
    reading_to_frame,
    trace_period,
)
from keda_gpu_scaler.testing import inline

_COMPARED = [f for f in GpuReading.__struct_fields__ if f not in {"source", "taken_at", "period_s"}]


def _node() -> FakeNvml:
    mig = h200_gpu(0)
    enable_mig(mig, mig_instances(0, 2))
    mig.instances[1].gpm = {GpmMetric.SM_UTIL: 42.0}
    return FakeNvml([mig, h200_gpu(1)])


@pytest.mark.trio
async def test_recording_writes_one_frame_per_device_and_cycle(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    output = tmp_path / "trace.jsonl"
    summary = await record_trace(
        _node(), output, duration_s=3.0, interval_s=1.0, phase="idle", call_in_thread=inline
    )
    frames = parse_trace(output.read_text().splitlines(), origin=str(output))
    assert (summary.frames, summary.faults, summary.devices) == (12, 0, 4)
    assert sorted({f.t for f in frames}) == [0.0, 1.0, 2.0]
    assert {f.phase for f in frames} == {"idle"}
    instance = [f for f in frames if f.uuid == "MIG-fake-0-8"]
    assert [f.gpm.sm_active if f.gpm else None for f in instance] == [None, 42.0, 42.0]
    assert (instance[0].parent_index, instance[0].gpu_instance_id) == (0, 8)
    # The GPU instance's profile and placement, which the DRA join matches MIG devices by.
    assert (
        instance[0].gpu_instance_profile_id,
        instance[0].placement_start,
        instance[0].placement_size,
    ) == (19, 1, 1)
    # v2 memory is written as captured: used without the reserved part.
    plain = next(f for f in frames if f.index == 1)
    assert (plain.memory_used_bytes, plain.memory_reserved_bytes) == (0, 644_939_776)


@pytest.mark.trio
async def test_recorded_frames_replay_as_the_same_readings(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    output = tmp_path / "trace.jsonl"
    await record_trace(_node(), output, duration_s=2.0, call_in_thread=inline)
    for frame in parse_trace(output.read_text().splitlines()):
        reading = frame_to_reading(frame, source="replay", taken_at=frame.t, period_s=1.0)
        again = reading_to_frame(reading, frame.t)
        assert again == frame


def test_reading_to_frame_round_trips_every_field() -> None:
    reading = GpuReading(
        source="s",
        key="MIG-x",  # type: ignore[arg-type]
        index=2,
        uuid="MIG-x",
        name="n",
        taken_at=5.0,
        period_s=1.0,
        gpu_utilization=1.0,
        memory_utilization=2.0,
        memory_used_bytes=300,
        memory_total_bytes=1000,
        memory_reserved_bytes=100,
        temperature_c=40.0,
        power_mw=5.0,
        power_limit_mw=6.0,
        sm_clock_mhz=7.0,
        pcie_tx_kbps=8.0,
        pcie_rx_kbps=9.0,
        nvlink_tx_mbps=10.0,
        nvlink_rx_mbps=11.0,
        sm_active=12.0,
        sm_occupancy=13.0,
        tensor_active=14.0,
        dram_bw_util=15.0,
        parent_index=2,
        parent_uuid="GPU-p",
        gpu_instance_id=7,
        compute_instance_id=1,
        gpu_instance_profile_id=9,
        placement_start=4,
        placement_size=4,
    )
    frame = reading_to_frame(reading, 1.23456)
    assert frame.t == 1.235
    back = frame_to_reading(frame, source="s", taken_at=5.0, period_s=1.0)
    assert [getattr(back, f) for f in _COMPARED] == [getattr(reading, f) for f in _COMPARED]


def test_the_shipped_h200_trace_still_reads() -> None:
    text = resources.files("keda_gpu_scaler.sources").joinpath("data", "h200-trace.jsonl")
    frames = parse_trace(text.read_text(encoding="utf-8").splitlines())
    assert len(frames) == 557
    first = frame_to_reading(frames[0], source="replay", taken_at=0.0, period_s=0.1)
    assert first.memory_used_bytes == 644_939_776  # v2 used 0 + reserved
    assert first.dram_bw_util is None  # a bare NaN in the file
    assert not first.is_mig_instance()
    assert not first.mig_enabled
    assert all(f.parent_index is None for f in frames)
    assert any(f.gpm and f.gpm.sm_active and f.gpm.sm_active > 90 for f in frames)
    assert not any(f.gpm and f.gpm.dram_bw_util and math.isnan(f.gpm.dram_bw_util) for f in frames)


@pytest.mark.trio
async def test_an_unwritable_output_is_a_clear_error(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    output = tmp_path / "missing-dir" / "trace.jsonl"
    with pytest.raises(SourceUnavailable, match=r"cannot write trace .*missing-dir"):
        await record_trace(FakeNvml.h200(), output, duration_s=1.0, call_in_thread=inline)


@pytest.mark.trio
async def test_nvml_failing_during_a_recording_is_reported_plainly(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml = FakeNvml.h200()
    nvml.fail("temperature_c", NvmlCode.DRIVER_NOT_LOADED)
    with pytest.raises(SourceFailure, match="Driver Not Loaded"):
        await record_trace(nvml, tmp_path / "t.jsonl", duration_s=5.0, call_in_thread=inline)


@pytest.mark.trio
async def test_recording_uses_worker_threads_by_default(tmp_path: Path) -> None:
    output = tmp_path / "trace.jsonl"
    with anyio.fail_after(10):
        summary = await record_trace(
            FakeNvml.h200(), output, duration_s=0.05, interval_s=0.01, pcie_interval_s=None
        )
    assert summary.frames >= 1
    assert output.read_text().count("\n") == summary.frames


def test_a_recording_made_on_a_real_h200_replays() -> None:
    path = Path(__file__).parent / "fixtures" / "nvml-h200" / "sampler-record.jsonl"
    frames = parse_trace(path.read_text().splitlines(), origin=str(path))
    assert frames[0].t == 0.0
    # Real time: each cycle within a few ms of its slot, no drift over the run.
    assert trace_period(frames) == pytest.approx(0.5, abs=0.005)
    assert frames[-1].t == pytest.approx(4.5, abs=0.01)
    assert len(frames) == 10
    assert frames[0].gpm is None  # GPM needs two samples
    busy = frame_to_reading(frames[-1], source="replay", taken_at=0.0, period_s=0.5)
    assert busy.sm_active is not None
    assert busy.sm_active > 90
    assert busy.nvlink_tx_mbps is None  # NotSupported per field on this H200, not 0
    assert busy.memory_used_bytes == frames[-1].memory_used_bytes + 644_939_776  # type: ignore[operator]


def test_a_frame_carries_every_field_of_a_reading() -> None:
    """A new GpuReading field must reach the trace, or recordings silently drop it."""
    # ``node`` is the cluster scaler's: a recording is of one node.
    not_recorded = {"source", "key", "taken_at", "period_s", "node"}
    in_frame = set(TraceFrame.__struct_fields__) | set(GpmFrame.__struct_fields__)
    assert set(GpuReading.__struct_fields__) - not_recorded <= in_frame


def test_the_trace_keeps_the_names_of_the_capture() -> None:
    reading = GpuReading(
        source="s",
        key=DeviceKey("GPU-1"),
        index=1,
        uuid="GPU-1",
        name="G",
        taken_at=0.0,
        period_s=1.0,
        gpu_utilization=5.0,
        memory_used_bytes=30,
        memory_reserved_bytes=10,
        sm_clock_mhz=1980.0,
        pcie_rx_kbps=7.0,
        sm_active=1.0,
        tensor_active=2.0,
    )
    line = encode_frame(reading_to_frame(reading, 0.5, phase="p"))
    assert line == (
        b'{"t":0.5,"phase":"p","index":1,"uuid":"GPU-1","name":"G","util_gpu":5.0,'
        b'"mem_used":20,"mem_reserved":10,"clock_sm":1980.0,"pcie_rx_kbs":7.0,'
        b'"gpm":{"sm_util":1.0,"any_tensor_util":2.0}}\n'
    )


def test_the_shipped_h200_trace_reads_as_before_the_rename_table() -> None:
    """Digests of the readings (and of the frames written back) taken with the field-by-field
    copies this table replaced: every recording loads, and records, byte for byte the same."""
    text = resources.files("keda_gpu_scaler.sources").joinpath("data", "h200-trace.jsonl")
    frames = parse_trace(text.read_text(encoding="utf-8").splitlines())
    got = [frame_to_reading(f, source="replay", taken_at=f.t, period_s=0.1) for f in frames]
    encoded = b"".join(msgspec.json.encode(r) + b"\n" for r in got)
    written = b"".join(
        encode_frame(reading_to_frame(r, f.t, phase=f.phase))
        for r, f in zip(got, frames, strict=True)
    )
    assert hashlib.sha256(encoded).hexdigest()[:16] == "52458104f28271ba"
    assert hashlib.sha256(written).hexdigest()[:16] == "77428d1f4f73d1ac"
