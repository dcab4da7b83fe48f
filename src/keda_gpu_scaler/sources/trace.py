"""The replay trace format, sans I/O: one JSON object per line, one GPU reading each.

Fields (all but ``t`` optional; absent means "no reading"): ``t`` seconds since the start,
``phase`` a label, ``index``/``uuid``/``name`` the GPU, ``util_gpu``/``util_mem`` percent,
``mem_used``/``mem_total``/``mem_reserved`` bytes from NVML memory info v2 (when
``mem_reserved`` is present, ``mem_used`` excludes it), ``temp_c``, ``power_mw``,
``power_limit_mw``, ``clock_sm`` MHz, ``pcie_tx_kbs``/``pcie_rx_kbs`` KB/s,
``nvlink_tx_mbps``/``nvlink_rx_mbps`` MB/s, and ``gpm`` with ``sm_util``, ``sm_occupancy``,
``any_tensor_util``, ``dram_bw_util`` in percent. A bare ``NaN`` is read as no reading.
Frames of several GPUs share a ``t``.

MIG (written by :mod:`keda_gpu_scaler.sources.recorder`, optional): ``mig_enabled`` true on
a GPU that its instances stand for; on an instance, ``uuid`` is its ``MIG-...`` UUID,
``index`` and ``parent_index`` its GPU's index, plus ``parent_uuid``, ``gpu_instance_id``
and ``compute_instance_id``.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Iterable

import msgspec

from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.domain.samples import DeviceKey, GpuReading, finite_or_none

_BARE_NON_FINITE = re.compile(r"(?<=[:\[,])(\s*)(?:NaN|-?Infinity)(?=\s*[,\]}])")


class GpmFrame(msgspec.Struct, frozen=True, omit_defaults=True):
    sm_util: float | None = None
    sm_occupancy: float | None = None
    any_tensor_util: float | None = None
    dram_bw_util: float | None = None


class TraceFrame(msgspec.Struct, frozen=True, omit_defaults=True):
    t: float
    phase: str | None = None
    index: int = 0
    uuid: str | None = None
    name: str | None = None
    util_gpu: float | None = None
    util_mem: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    mem_reserved: int | None = None
    temp_c: float | None = None
    power_mw: float | None = None
    power_limit_mw: float | None = None
    clock_sm: float | None = None
    pcie_tx_kbs: float | None = None
    pcie_rx_kbs: float | None = None
    nvlink_tx_mbps: float | None = None
    nvlink_rx_mbps: float | None = None
    gpm: GpmFrame | None = None
    mig_enabled: bool = False
    parent_index: int | None = None
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


_DECODER = msgspec.json.Decoder(TraceFrame)
_ENCODER = msgspec.json.Encoder()


def parse_trace(lines: Iterable[str], *, origin: str = "trace") -> list[TraceFrame]:
    """Decode trace lines; blank lines are skipped, a bad line names its number."""
    frames = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            frames.append(_DECODER.decode(_BARE_NON_FINITE.sub(r"\1null", line)))
        except msgspec.DecodeError as exc:
            raise SourceUnavailable(f"{origin}:{number}: not a trace frame: {exc}") from exc
    if not frames:
        raise SourceUnavailable(f"{origin}: the trace holds no frames")
    return frames


def encode_frame(frame: TraceFrame) -> bytes:
    return _ENCODER.encode(frame) + b"\n"


def trace_period(frames: list[TraceFrame]) -> float:
    """The median gap between distinct timestamps: the sampling period of the recording."""
    times = sorted({f.t for f in frames})
    gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
    return statistics.median(gaps) if gaps else 1.0


class Identity(msgspec.Struct, frozen=True):
    uuid: str
    name: str


def frame_to_reading(
    frame: TraceFrame,
    *,
    source: str,
    taken_at: float,
    period_s: float,
    identity: Identity | None = None,
) -> GpuReading:
    uuid = frame.uuid or (identity.uuid if identity else f"GPU-replay-{frame.index}")
    name = frame.name or (identity.name if identity else "replayed GPU")
    used = frame.mem_used
    if used is not None and frame.mem_reserved is not None:
        used += frame.mem_reserved
    gpm = frame.gpm or GpmFrame()
    return GpuReading(
        source=source,
        key=DeviceKey(uuid),
        index=frame.index,
        uuid=uuid,
        name=name,
        taken_at=taken_at,
        period_s=period_s,
        gpu_utilization=finite_or_none(frame.util_gpu),
        memory_utilization=finite_or_none(frame.util_mem),
        memory_used_bytes=used,
        memory_total_bytes=frame.mem_total,
        memory_reserved_bytes=frame.mem_reserved,
        temperature_c=finite_or_none(frame.temp_c),
        power_mw=finite_or_none(frame.power_mw),
        power_limit_mw=finite_or_none(frame.power_limit_mw),
        sm_clock_mhz=finite_or_none(frame.clock_sm),
        pcie_tx_kbps=finite_or_none(frame.pcie_tx_kbs),
        pcie_rx_kbps=finite_or_none(frame.pcie_rx_kbs),
        nvlink_tx_mbps=finite_or_none(frame.nvlink_tx_mbps),
        nvlink_rx_mbps=finite_or_none(frame.nvlink_rx_mbps),
        sm_active=finite_or_none(gpm.sm_util),
        sm_occupancy=finite_or_none(gpm.sm_occupancy),
        tensor_active=finite_or_none(gpm.any_tensor_util),
        dram_bw_util=finite_or_none(gpm.dram_bw_util),
        mig_enabled=frame.mig_enabled,
        parent_index=frame.parent_index,
        parent_uuid=frame.parent_uuid,
        gpu_instance_id=frame.gpu_instance_id,
        compute_instance_id=frame.compute_instance_id,
    )


def reading_to_frame(reading: GpuReading, t: float, *, phase: str | None = None) -> TraceFrame:
    """The trace frame of a reading taken ``t`` seconds into a recording.

    Memory is written as v2 does (``mem_used`` without ``mem_reserved``) when the reserved
    part is known, so :func:`frame_to_reading` gives back the same v1-style used bytes.
    """
    used = reading.memory_used_bytes
    if used is not None and reading.memory_reserved_bytes is not None:
        used -= reading.memory_reserved_bytes
    gpm = GpmFrame(
        sm_util=reading.sm_active,
        sm_occupancy=reading.sm_occupancy,
        any_tensor_util=reading.tensor_active,
        dram_bw_util=reading.dram_bw_util,
    )
    return TraceFrame(
        t=round(t, 3),
        phase=phase,
        index=reading.index,
        uuid=reading.uuid,
        name=reading.name,
        util_gpu=reading.gpu_utilization,
        util_mem=reading.memory_utilization,
        mem_used=used,
        mem_total=reading.memory_total_bytes,
        mem_reserved=reading.memory_reserved_bytes,
        temp_c=reading.temperature_c,
        power_mw=reading.power_mw,
        power_limit_mw=reading.power_limit_mw,
        clock_sm=reading.sm_clock_mhz,
        pcie_tx_kbs=reading.pcie_tx_kbps,
        pcie_rx_kbs=reading.pcie_rx_kbps,
        nvlink_tx_mbps=reading.nvlink_tx_mbps,
        nvlink_rx_mbps=reading.nvlink_rx_mbps,
        gpm=None if gpm == GpmFrame() else gpm,
        mig_enabled=reading.mig_enabled,
        parent_index=reading.parent_index,
        parent_uuid=reading.parent_uuid,
        gpu_instance_id=reading.gpu_instance_id,
        compute_instance_id=reading.compute_instance_id,
    )
