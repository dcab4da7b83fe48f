"""What ``gpu-metrics`` prints: one record per device with the stable snake_case keys
documented in docs/gpu-metrics.md, and the formats that write them (an aligned table, live or
once; the Go project's JSON document; CSV; JSON lines).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from keda_gpu_scaler.app.gpu_metrics import gojson
from keda_gpu_scaler.domain.catalog import CATALOG, Origin
from keda_gpu_scaler.domain.samples import DeviceHolder
from keda_gpu_scaler.domain.snapshot import DeviceState

GPU_METRICS = tuple(info for info in CATALOG.values() if info.origin is Origin.GPU)
FIELDS = (
    "time",
    "node",
    "index",
    "gpu_instance_id",
    "uuid",
    "name",
    "status",
    *(info.type.value for info in GPU_METRICS),
    "memory_total_mib",
)
ATTRIBUTION_FIELDS = ("namespace", "pod", "container")
"""Added to every record when the kubelet PodResources socket answered: who holds the
device (comma-separated when several pods share it; null when nobody does)."""
_ENCODER = msgspec.json.Encoder()


def record(
    device: DeviceState,
    now: float,
    *,
    node: str,
    stamp: str,
    holders: Sequence[DeviceHolder] | None = None,
) -> dict[str, Any]:
    """One device as a flat dict with the documented keys; absent readings are null.

    ``holders`` (None: attribution unavailable) adds namespace, pod and container."""
    reading = device.reading
    status = "lost" if device.is_lost() else "stale" if device.is_stale(now) else "ok"
    row: dict[str, Any] = {
        "time": stamp,
        "node": node,
        "index": device.index,
        "gpu_instance_id": reading.gpu_instance_id if reading else None,
        "uuid": device.key,
        "name": reading.name if reading else None,
        "status": status,
    }
    for info in GPU_METRICS:
        row[info.type.value] = None if reading is None or info.read is None else info.read(reading)
    total = reading.memory_total_bytes if reading else None
    row["memory_total_mib"] = None if total is None else total // (1 << 20)
    if holders is not None:
        row["namespace"] = ",".join(h.namespace for h in holders) or None
        row["pod"] = ",".join(h.pod for h in holders) or None
        row["container"] = ",".join(h.container for h in holders) or None
    return row


def _cell(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


_HEADER = ("GPU", "NAME", "UTIL%", "SM%", "MEM MiB", "MEM%", "TEMP C", "POWER W", "STATUS")
_POD_HEADER = ("NAMESPACE", "POD", "CONTAINER")
# Wide enough for every usual value ("7:14", "100.0", "1000.0", "stale"), so that a live
# table does not shift as the readings change; NAME and MEM MiB are constant per GPU.
_MIN_WIDTHS = (4, 0, 5, 5, 0, 5, 6, 7, 6, 0, 0, 0)
_LEFT = frozenset({1, 8, 9, 10, 11})


def _label(row: dict[str, Any]) -> str:
    """``0`` for GPU 0, ``0:1`` for its MIG GPU instance 1, as nvidia-smi names them."""
    instance = row.get("gpu_instance_id")
    return str(row["index"]) if instance is None else f"{row['index']}:{instance}"


def _memory(row: dict[str, Any]) -> str:
    total = _cell(row["memory_total_mib"])
    return f"{_cell(row['memory_used_mib']):>{len(total)}}/{total}"


def _attributed(rows: list[dict[str, Any]]) -> bool:
    return any("pod" in r for r in rows)


def _table_lines(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    if _attributed(rows):
        plain = _table_lines(
            [{k: v for k, v in r.items() if k not in ATTRIBUTION_FIELDS} for r in rows]
        )
        pods = [tuple(_cell(r.get(f)) for f in ATTRIBUTION_FIELDS) for r in rows]
        return [plain[0] + _POD_HEADER] + [
            line + extra for line, extra in zip(plain[1:], pods, strict=True)
        ]
    return [_HEADER] + [
        (
            _label(r),
            str(r["name"]),
            _cell(r["gpu_utilization"]),
            _cell(r["sm_active"], 1),
            _memory(r),
            _cell(r["memory_used_percent"], 1),
            _cell(r["temperature"]),
            _cell(r["power_draw"], 1),
            r["status"],
        )
        for r in rows
    ]


def column_widths(rows: list[dict[str, Any]], *, at_least: Sequence[int] = ()) -> list[int]:
    """The width of each table column: its widest cell, and never less than ``at_least``."""
    lines = _table_lines(rows)
    columns = len(lines[0])
    floor = list(at_least)[:columns]
    floor += [0] * (columns - len(floor))
    return [
        max(floor[i], _MIN_WIDTHS[i], *(len(line[i]) for line in lines)) for i in range(columns)
    ]


def render_table(rows: list[dict[str, Any]], *, widths: Sequence[int] = ()) -> str:
    """The rows as aligned columns (numbers to the right), at least ``widths`` wide."""
    final = column_widths(rows, at_least=widths)
    return "\n".join(
        "  ".join(
            cell.ljust(width) if i in _LEFT else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, final, strict=True))
        ).rstrip()
        for line in _table_lines(rows)
    )


_CLEAR_SCREEN = "\x1b[H\x1b[2J"
"""Cursor home, then erase the screen (ANSI): a live table redraws in place."""


class Printer:
    """Writes rows in one format; the CSV header is written once per run.

    A live table (``watch``) redraws in place under a title line (node, time, period, how
    to stop), and its columns never narrow, so the figures stay where the eye expects them.
    Into a file or a pipe (``terminal`` false) nothing is redrawn: each table follows the
    last under its title line, with no escape codes for a screen that is not there.
    """

    def __init__(
        self,
        fmt: str,
        *,
        watch: bool,
        out: Callable[[str], None],
        node: str = "",
        interval_s: float | None = None,
        environment: dict[str, Any] | None = None,
        terminal: bool = True,
    ) -> None:
        self._environment = environment or {}
        self._terminal = terminal
        self._fmt = fmt
        self._watch = watch
        self._out = out
        self._node = node
        self._interval_s = interval_s
        self._header_done = False
        self._widths: list[int] = []

    def emit(self, rows: list[dict[str, Any]], *, continuous: bool) -> None:
        if self._fmt == "table":
            if self._watch:
                self._widths = column_widths(rows, at_least=self._widths)
            table = render_table(rows, widths=self._widths)
            if self._watch and self._terminal:
                table = _CLEAR_SCREEN + self._title() + "\n\n" + table
            elif self._watch:
                table = self._title() + "\n" + table + "\n"
            self._out(table + "\n")
        elif self._fmt == "jsonl":
            self._out("".join(_ENCODER.encode(r).decode() + "\n" for r in rows))
        elif self._fmt == "json":
            # The Go project's document; one compact line per reading when continuous.
            document = _ENCODER.encode(gojson.go_document(rows, self._environment))
            text = document if continuous else msgspec.json.format(document, indent=2)
            self._out(text.decode() + "\n")
        else:
            self._out(self._csv(rows))

    def _title(self) -> str:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        every = f"every {self._interval_s:g} s" if self._interval_s else ""
        return "  ".join(p for p in (f"node {self._node}", stamp, every, "Ctrl-C to stop") if p)

    def _csv(self, rows: list[dict[str, Any]]) -> str:
        buffer = io.StringIO()
        fields = FIELDS + ATTRIBUTION_FIELDS if _attributed(rows) else FIELDS
        writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
        if not self._header_done:
            writer.writeheader()
            self._header_done = True
        writer.writerows(rows)
        return buffer.getvalue()
