"""docs/configuration.md is generated from the code: it must not drift."""

from __future__ import annotations

import re
from pathlib import Path

from keda_gpu_scaler.app.reference import render_configuration
from keda_gpu_scaler.domain.catalog import CATALOG
from keda_gpu_scaler.domain.profiles import PROFILES
from keda_gpu_scaler.domain.trigger_keys import TRIGGER_KEY_HELP, TRIGGER_KEYS
from keda_gpu_scaler.serving.observability import gpu_series_name

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


ROOT = Path(__file__).resolve().parent.parent


def test_configuration_reference_is_up_to_date() -> None:
    assert DOC.read_text() == render_configuration(), "run `make docs` and commit the result"


def test_reference_covers_every_key_type_and_profile() -> None:
    text = render_configuration()
    assert set(TRIGGER_KEY_HELP) == set(TRIGGER_KEYS)
    for name in (*TRIGGER_KEYS, *CATALOG, *PROFILES):
        assert f"`{name}`" in text, name


# Every series the Go project's /metrics had (pkg/metrics), which docs/migration.md maps.
GO_SERIES = (
    "keda_gpu_scaler_gpu_utilization_percent",
    "keda_gpu_scaler_gpu_memory_used_bytes",
    "keda_gpu_scaler_gpu_memory_total_bytes",
    "keda_gpu_scaler_gpu_temperature_celsius",
    "keda_gpu_scaler_gpu_power_draw_watts",
    "keda_gpu_scaler_gpu_pcie_throughput_kbps",
    "keda_gpu_scaler_gpu_nvlink_throughput_mbps",
    "keda_gpu_scaler_gpu_device_count",
    "keda_gpu_scaler_collections_total",
    "keda_gpu_scaler_collection_errors_total",
    "keda_gpu_scaler_collection_duration_seconds",
    "keda_gpu_scaler_scaler_requests_total",
    "keda_gpu_scaler_scaler_request_errors_total",
)


def test_the_migration_guide_maps_every_series_of_the_go_project() -> None:
    doc = (ROOT / "docs" / "migration.md").read_text()
    section = doc.split("## Self-metric names", 1)[1].split("\n## ", 1)[0]
    mapped = {
        re.match(r"`(\w+)", row.split("|")[1].strip()).group(1)  # type: ignore[union-attr]
        for row in section.splitlines()
        if row.startswith("| `keda_gpu_scaler_")
    }
    assert set(GO_SERIES) <= mapped, set(GO_SERIES) - mapped
    served = {gpu_series_name(t) for t in ("pcie_tx_kbps", "pcie_rx_kbps")}
    served |= {gpu_series_name(t) for t in ("nvlink_tx_mbps", "nvlink_rx_mbps")}
    for name in served:  # what the pcie and nvlink rows point at exists here
        assert f"`{name}`" in section, name
