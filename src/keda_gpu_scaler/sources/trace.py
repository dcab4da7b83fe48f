"""The replay trace format, sans I/O: one JSON object per line, one GPU reading each.

Fields (all but ``t`` optional; absent means "no reading"): ``t`` seconds since the start,
``phase`` a label, ``index``/``uuid``/``name`` the GPU, ``util_gpu``/``util_mem`` percent,
``mem_used``/``mem_total``/``mem_reserved`` bytes from NVML memory info v2 (when
``mem_reserved`` is present, ``mem_used`` excludes it), ``temp_c``, ``power_mw``,
``power_limit_mw``, ``clock_sm`` MHz, ``pcie_tx_kbs``/``pcie_rx_kbs`` KB/s,
``nvlink_tx_mbps``/``nvlink_rx_mbps`` MB/s, and ``gpm`` with ``sm_util``, ``sm_occupancy``,
``any_tensor_util``, ``dram_bw_util`` in percent. A bare ``NaN`` is read as no reading.
Frames of several GPUs share a ``t``.

A frame is a :class:`GpuReading`'s wire form: the same fields, renamed by one table
(``_TRACE_NAMES``, ``_GPM_NAMES``) that msgspec applies both ways. Only memory is converted.

MIG (written by :mod:`keda_gpu_scaler.sources.recorder`, optional): ``mig_enabled`` true on
a GPU that its instances stand for; on an instance, ``uuid`` is its ``MIG-...`` UUID,
``index`` and ``parent_index`` its GPU's index, plus ``parent_uuid``, ``gpu_instance_id``,
``compute_instance_id``, and its GPU instance's ``gpu_instance_profile_id``,
``placement_start`` and ``placement_size`` where NVML gave them.
"""

from __future__ import annotations

import gzip
import itertools
import re
import statistics
import zlib
from collections.abc import Iterable
from typing import Any

import msgspec

from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.domain.samples import DeviceKey, GpuReading, finite_or_none

_BARE_NON_FINITE = re.compile(r"(?<=[:\[,])(\s*)(?:NaN|-?Infinity)(?=\s*[,\]}])")


_TRACE_NAMES = {
    "gpu_utilization": "util_gpu",
    "memory_utilization": "util_mem",
    "memory_used_bytes": "mem_used",
    "memory_total_bytes": "mem_total",
    "memory_reserved_bytes": "mem_reserved",
    "temperature_c": "temp_c",
    "sm_clock_mhz": "clock_sm",
    "pcie_tx_kbps": "pcie_tx_kbs",
    "pcie_rx_kbps": "pcie_rx_kbs",
}
""":class:`GpuReading` field -> its name in a trace (the names of the H200 capture, so old
recordings keep loading); a field not listed keeps its name."""
_GPM_NAMES = {"sm_active": "sm_util", "tensor_active": "any_tensor_util"}


class GpmFrame(msgspec.Struct, frozen=True, omit_defaults=True, rename=_GPM_NAMES):
    """The GPM fields of a :class:`GpuReading`, nested under ``gpm`` in a trace."""

    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_bw_util: float | None = None


class TraceFrame(msgspec.Struct, frozen=True, omit_defaults=True, rename=_TRACE_NAMES):
    """A :class:`GpuReading`'s wire form in a trace: its fields under the trace's names, GPM
    nested, and ``t``/``phase`` instead of the sample's source, key and clock."""

    t: float
    phase: str | None = None
    index: int = 0
    uuid: str | None = None
    name: str | None = None
    gpu_utilization: float | None = None
    memory_utilization: float | None = None
    memory_used_bytes: int | None = None
    """As written by memory info v2: without ``memory_reserved_bytes`` when that is known."""
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    temperature_c: float | None = None
    power_mw: float | None = None
    power_limit_mw: float | None = None
    sm_clock_mhz: float | None = None
    pcie_tx_kbps: float | None = None
    pcie_rx_kbps: float | None = None
    nvlink_tx_mbps: float | None = None
    nvlink_rx_mbps: float | None = None
    gpm: GpmFrame | None = None
    mig_enabled: bool = False
    parent_index: int | None = None
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    gpu_instance_profile_id: int | None = None
    placement_start: int | None = None
    placement_size: int | None = None


_SHARED = tuple(
    f
    for f in TraceFrame.__struct_fields__
    if f in GpuReading.__struct_fields__ and f not in {"uuid", "name"}
)
"""The fields a frame and a reading share, copied as they are (floats checked finite)."""
_NO_GPM = GpmFrame()


_DECODER = msgspec.json.Decoder(TraceFrame)
_ENCODER = msgspec.json.Encoder()


def decode_trace(data: bytes, *, origin: str = "trace") -> str:
    """The text of a trace file: UTF-8, or gzip-compressed UTF-8 (``record ... | gzip``)."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise SourceUnavailable(f"{origin}: a damaged gzip file ({exc})") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceUnavailable(
            f"{origin}: not a trace (JSON lines in UTF-8, or gzipped): "
            f"byte {exc.start} is not UTF-8 text"
        ) from None


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
    gpm = frame.gpm or _NO_GPM
    values: dict[str, Any] = {f: _finite(getattr(frame, f)) for f in _SHARED}
    values.update({f: _finite(getattr(gpm, f)) for f in GpmFrame.__struct_fields__})
    if frame.memory_used_bytes is not None and frame.memory_reserved_bytes is not None:
        values["memory_used_bytes"] = frame.memory_used_bytes + frame.memory_reserved_bytes
    return GpuReading(
        source=source,
        key=DeviceKey(uuid),
        uuid=uuid,
        name=name,
        taken_at=taken_at,
        period_s=period_s,
        **values,
    )


def reading_to_frame(reading: GpuReading, t: float, *, phase: str | None = None) -> TraceFrame:
    """The trace frame of a reading taken ``t`` seconds into a recording.

    Memory is written as v2 does (used without the reserved part) when the reserved part is
    known, so :func:`frame_to_reading` gives back the same v1-style used bytes.
    """
    values: dict[str, Any] = {f: getattr(reading, f) for f in _SHARED}
    used, reserved = reading.memory_used_bytes, reading.memory_reserved_bytes
    if used is not None and reserved is not None:
        values["memory_used_bytes"] = used - reserved
    gpm = GpmFrame(**{f: getattr(reading, f) for f in GpmFrame.__struct_fields__})
    return TraceFrame(
        t=round(t, 3),
        phase=phase,
        uuid=reading.uuid,
        name=reading.name,
        gpm=None if gpm == _NO_GPM else gpm,
        **values,
    )


def _finite(value: Any) -> Any:
    return finite_or_none(value) if isinstance(value, float) else value
