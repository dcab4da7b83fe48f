"""Sans-I/O conversions from NVML values to reading fields; no calls, no clock.

Rules: a failed field or metric return code is no reading; NaN is no reading; memory uses
v1 semantics (``used`` includes driver-reserved memory) whichever version was read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from keda_gpu_scaler.domain.samples import finite_or_none
from keda_gpu_scaler.sources.nvml.backend import (
    FI_NVLINK_LINK_COUNT,
    FI_NVLINK_THROUGHPUT_DATA_RX,
    FI_NVLINK_THROUGHPUT_DATA_TX,
    SCOPE_ALL_LINKS,
    FieldRequest,
    FieldValue,
    GpmMetric,
    GpmMetricValue,
    MemoryV1,
    MemoryV2,
)
from keda_gpu_scaler.sources.nvml.errors import NVML_SUCCESS

NVLINK_FIELDS = (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX)
NVLINK_ALL_LINKS = tuple(FieldRequest(f, SCOPE_ALL_LINKS) for f in NVLINK_FIELDS)
"""Both directions summed over every link by the driver (the scope ``UINT_MAX``)."""
NVLINK_LINK_COUNT = (FieldRequest(FI_NVLINK_LINK_COUNT),)
GPM_METRICS = (
    GpmMetric.SM_UTIL,
    GpmMetric.SM_OCCUPANCY,
    GpmMetric.ANY_TENSOR_UTIL,
    GpmMetric.DRAM_BW_UTIL,
)
_KIB_PER_MB = 1024
"""NVLink "MB/s" are KiB counters divided by 1024 (MiB), as the Go project's numbers are."""


@dataclass(frozen=True, slots=True)
class Memory:
    used_bytes: int | None = None
    """v1 semantics: v2 ``used`` + ``reserved``."""
    total_bytes: int | None = None
    reserved_bytes: int | None = None
    """Only known from v2."""
    version: int | None = None


def memory_from_v2(m: MemoryV2) -> Memory:
    return Memory(m.used + m.reserved, m.total, m.reserved, version=2)


def memory_from_v1(m: MemoryV1 | None) -> Memory:
    if m is None:
        return Memory()
    return Memory(m.used, m.total, None, version=1)


@dataclass(frozen=True, slots=True)
class NvlinkCounters:
    """Cumulative NVLink KiB counters at one instant; None where the field failed."""

    tx_kib: int | None
    rx_kib: int | None
    at_s: float
    """The driver's timestamp of the fields, or the sampler's clock if it gave none."""


def nvlink_per_link(links: int) -> tuple[FieldRequest, ...]:
    """Both directions of links ``0 .. links - 1``, for a driver that refuses the aggregate."""
    return tuple(FieldRequest(f, link) for link in range(links) for f in NVLINK_FIELDS)


def all_succeeded(values: Sequence[FieldValue]) -> bool:
    return bool(values) and all(v.return_code == NVML_SUCCESS for v in values)


def link_count(values: Sequence[FieldValue] | None) -> int:
    """The NVLink link count field's value; 0 when the driver could not give it."""
    if values is None or not all_succeeded(values):
        return 0
    return max(0, values[0].value)


def nvlink_counters(values: Sequence[FieldValue], fallback_at_s: float) -> NvlinkCounters:
    """Each direction summed over the scopes read (one aggregate, or every link).

    Each field's own return code is checked (the call succeeds even when a field does not),
    and a direction with any failed scope is absent: a sum missing a link is a wrong number.
    """

    def counter(field_id: int) -> int | None:
        of_field = [v for v in values if v.field_id == field_id]
        if not of_field or any(v.return_code != NVML_SUCCESS for v in of_field):
            return None
        return sum(v.value for v in of_field)

    stamps = [v.timestamp_us for v in values if v.return_code == NVML_SUCCESS]
    at_s = max(stamps) / 1e6 if stamps and min(stamps) > 0 else fallback_at_s
    return NvlinkCounters(
        counter(FI_NVLINK_THROUGHPUT_DATA_TX), counter(FI_NVLINK_THROUGHPUT_DATA_RX), at_s
    )


def counter_rate_mbps(before: int | None, after: int | None, seconds: float) -> float | None:
    """MB/s between two KiB counter values; None for a missing value or a reset."""
    if before is None or after is None or seconds <= 0 or after < before:
        return None
    return (after - before) / _KIB_PER_MB / seconds


def nvlink_rates(
    before: NvlinkCounters | None, after: NvlinkCounters
) -> tuple[float | None, float | None]:
    """(TX, RX) in MB/s; TX is what this GPU sent (field 138), RX what it received (139)."""
    if before is None:
        return None, None
    seconds = after.at_s - before.at_s
    return (
        counter_rate_mbps(before.tx_kib, after.tx_kib, seconds),
        counter_rate_mbps(before.rx_kib, after.rx_kib, seconds),
    )


@dataclass(frozen=True, slots=True)
class GpmReadings:
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_bw_util: float | None = None


def gpm_readings(metrics: Sequence[GpmMetricValue]) -> GpmReadings:
    """Each metric's own return code is checked, and NaN (seen on the H200) is dropped."""
    values: dict[int, float | None] = {
        m.metric_id: finite_or_none(m.value) if m.return_code == NVML_SUCCESS else None
        for m in metrics
    }
    return GpmReadings(
        sm_active=values.get(GpmMetric.SM_UTIL),
        sm_occupancy=values.get(GpmMetric.SM_OCCUPANCY),
        tensor_active=values.get(GpmMetric.ANY_TENSOR_UTIL),
        dram_bw_util=values.get(GpmMetric.DRAM_BW_UTIL),
    )
