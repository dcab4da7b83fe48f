"""Pure NVML conversions and the error table, checked against the H200 capture."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from keda_gpu_scaler.sources.nvml.backend import (
    FI_NVLINK_THROUGHPUT_DATA_RX,
    FI_NVLINK_THROUGHPUT_DATA_TX,
    FieldValue,
    GpmMetric,
    GpmMetricValue,
    MemoryV1,
    MemoryV2,
)
from keda_gpu_scaler.sources.nvml.convert import (
    GpmReadings,
    NvlinkCounters,
    counter_rate_mbps,
    gpm_readings,
    memory_from_v1,
    memory_from_v2,
    nvlink_counters,
    nvlink_rates,
)
from keda_gpu_scaler.sources.nvml.errors import (
    NvmlAbsent,
    NvmlCode,
    NvmlDeviceLost,
    NvmlLibraryError,
    nvml_error,
)

PROBE: dict[str, Any] = json.loads(
    (Path(__file__).parent / "fixtures" / "nvml-h200" / "probe.json").read_text()
)


def test_memory_v2_and_v1_of_the_h200_give_the_same_used_bytes() -> None:
    v1 = MemoryV1(**PROBE["static"]["memory_v1"])
    v2_raw = dict(PROBE["static"]["memory_v2"])
    del v2_raw["version"]
    v2 = MemoryV2(**v2_raw)
    assert v2.used == 0  # the capture: v2 hides the driver's reservation in "reserved"
    from_v2, from_v1 = memory_from_v2(v2), memory_from_v1(v1)
    assert from_v2.used_bytes == from_v1.used_bytes == 644_939_776
    assert from_v2.reserved_bytes == 644_939_776
    assert from_v1.reserved_bytes is None
    assert (from_v2.version, from_v1.version) == (2, 1)
    assert from_v2.total_bytes == from_v1.total_bytes == 150_754_820_096


def test_memory_v1_missing_is_all_absent() -> None:
    memory = memory_from_v1(None)
    assert (memory.used_bytes, memory.total_bytes, memory.version) == (None, None, None)


def _probe_fields() -> list[FieldValue]:
    return [
        FieldValue(f["fieldId"], f["nvmlReturn"], f["ull"], f["ts"])
        for f in PROBE["static"]["fieldvalues"]
    ]


def test_h200_nvlink_fields_are_absent_not_zero() -> None:
    fields = _probe_fields()
    # The trap: the call succeeded and each value is 0; only the per-field code says no.
    assert [f.value for f in fields] == [0, 0, 0]
    counters = nvlink_counters(fields, fallback_at_s=5.0)
    assert (counters.tx_kib, counters.rx_kib) == (None, None)
    assert nvlink_rates(counters, counters) == (None, None)


def _fields(tx: int, rx: int, at_us: int) -> list[FieldValue]:
    return [
        FieldValue(FI_NVLINK_THROUGHPUT_DATA_TX, 0, tx, at_us),
        FieldValue(FI_NVLINK_THROUGHPUT_DATA_RX, 0, rx, at_us),
    ]


def test_nvlink_rate_is_mb_per_second_from_the_driver_timestamps_in_the_right_direction() -> None:
    before = nvlink_counters(_fields(1_000, 50_000, 10_000_000), fallback_at_s=99.0)
    after = nvlink_counters(_fields(1_000 + 2 * 1024 * 300, 50_000, 12_000_000), 99.0)
    assert before.at_s == 10.0  # the driver's clock, not the fallback
    tx, rx = nvlink_rates(before, after)
    assert tx == pytest.approx(300.0)  # 600 MiB in 2 s: TX is what this GPU sent
    assert rx == 0.0


def test_nvlink_rate_falls_back_to_the_sampler_clock_without_timestamps() -> None:
    before = nvlink_counters(_fields(0, 0, 0), fallback_at_s=1.0)
    after = nvlink_counters(_fields(4096, 2048, 0), fallback_at_s=3.0)
    assert nvlink_rates(before, after) == (2.0, 1.0)


def test_nvlink_counters_sum_the_links_and_a_failed_link_makes_the_direction_absent() -> None:
    tx, rx, failed = FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX, 3
    fields = [
        FieldValue(tx, 0, 1_000, 5_000_000, scope_id=0),
        FieldValue(rx, 0, 10, 5_000_000, scope_id=0),
        FieldValue(tx, 0, 2_000, 5_000_000, scope_id=1),
        FieldValue(rx, failed, 0, 5_000_000, scope_id=1),
    ]
    counters = nvlink_counters(fields, fallback_at_s=0.0)
    # A sum missing a link would be a wrong number: absent instead.
    assert (counters.tx_kib, counters.rx_kib, counters.at_s) == (3_000, None, 5.0)


def test_nvlink_rate_of_one_failed_direction_keeps_the_other() -> None:
    fields = [
        FieldValue(FI_NVLINK_THROUGHPUT_DATA_TX, 0, 2048, 2_000_000),
        FieldValue(FI_NVLINK_THROUGHPUT_DATA_RX, int(NvmlCode.NOT_SUPPORTED), 0, 2_000_000),
    ]
    before = NvlinkCounters(tx_kib=1024, rx_kib=None, at_s=1.0)
    assert nvlink_rates(before, nvlink_counters(fields, 0.0)) == (1.0, None)


@pytest.mark.parametrize(
    ("before", "after", "seconds"),
    [(None, 5, 1.0), (5, None, 1.0), (10, 5, 1.0), (5, 10, 0.0), (5, 10, -1.0)],
)
def test_counter_rate_is_none_without_a_valid_interval(
    before: int | None, after: int | None, seconds: float
) -> None:
    assert counter_rate_mbps(before, after, seconds) is None


def test_no_rate_before_the_second_sample() -> None:
    assert nvlink_rates(None, NvlinkCounters(1, 1, 1.0)) == (None, None)


def test_gpm_nan_and_failed_metrics_are_no_reading() -> None:
    readings = gpm_readings(
        [
            GpmMetricValue(GpmMetric.SM_UTIL, 0, 95.6),
            GpmMetricValue(GpmMetric.SM_OCCUPANCY, 0, 14.1),
            GpmMetricValue(GpmMetric.ANY_TENSOR_UTIL, int(NvmlCode.NOT_SUPPORTED), 0.0),
            GpmMetricValue(GpmMetric.DRAM_BW_UTIL, 0, math.nan),
        ]
    )
    assert readings == GpmReadings(sm_active=95.6, sm_occupancy=14.1)


def test_gpm_metric_ids_match_the_installed_nvidia_ml_py() -> None:
    import pynvml

    assert GpmMetric.SM_UTIL == pynvml.NVML_GPM_METRIC_SM_UTIL
    assert GpmMetric.SM_OCCUPANCY == pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
    assert GpmMetric.ANY_TENSOR_UTIL == pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    assert GpmMetric.DRAM_BW_UTIL == pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
    assert pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX == FI_NVLINK_THROUGHPUT_DATA_TX
    assert pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX == FI_NVLINK_THROUGHPUT_DATA_RX


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (NvmlCode.NOT_SUPPORTED, NvmlAbsent),
        (NvmlCode.NOT_FOUND, NvmlAbsent),
        (NvmlCode.FUNCTION_NOT_FOUND, NvmlAbsent),
        (NvmlCode.NO_PERMISSION, NvmlAbsent),
        (NvmlCode.GPU_IS_LOST, NvmlDeviceLost),
        (NvmlCode.UNKNOWN, NvmlDeviceLost),
        (12345, NvmlDeviceLost),
        (NvmlCode.LIBRARY_NOT_FOUND, NvmlLibraryError),
        (NvmlCode.DRIVER_NOT_LOADED, NvmlLibraryError),
    ],
)
def test_error_table(code: int, kind: type[Exception]) -> None:
    error = nvml_error(code, "nvmlDeviceGetFanSpeed")
    assert type(error) is kind
    assert error.code == code
    assert "nvmlDeviceGetFanSpeed" in str(error)


def test_probe_error_codes_map_to_absent() -> None:
    for name in ("fan", "sm_count_attr", "nvlink_state_0", "mig_by_index"):
        assert isinstance(nvml_error(PROBE["errors"][name]["value"], name), NvmlAbsent)
