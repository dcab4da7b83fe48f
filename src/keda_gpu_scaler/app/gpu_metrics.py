"""``gpu-metrics``: show the GPUs of this node as a table, JSON, CSV or JSON lines.

Works on Kubernetes nodes and HPC hosts (Slurm, Flux): the environment decides the node
name and which GPUs the job may see. Every record has the same stable snake_case keys,
documented in docs/gpu-metrics.md.
"""

from __future__ import annotations

try:
    import argparse
    import csv
    import io
    import os
    import signal
    import sys
    from collections.abc import Callable, Sequence
    from datetime import UTC, datetime
    from typing import TYPE_CHECKING, Any

    import anyio
    import msgspec

    from keda_gpu_scaler import __version__
    from keda_gpu_scaler.app import gocli, gojson
    from keda_gpu_scaler.app.argtypes import positive_int
    from keda_gpu_scaler.app.exits import EXIT_USAGE, exit_status, find_leaf
    from keda_gpu_scaler.app.scope import (
        Device,
        DeviceFilter,
        Environment,
        ScopeError,
        detect_environment,
        gpu_scope,
        parse_device_list,
    )
    from keda_gpu_scaler.domain.attribution import attribute
    from keda_gpu_scaler.domain.catalog import CATALOG, Origin
    from keda_gpu_scaler.domain.samples import DeviceHolder
    from keda_gpu_scaler.domain.snapshot import DeviceState, Snapshot

    if TYPE_CHECKING:
        from keda_gpu_scaler.pipeline.supervisor import Sampler
except KeyboardInterrupt:  # Ctrl-C while the command loads: quiet, like Ctrl-C later
    raise SystemExit(130) from None

# The pipeline (and what it imports) loads inside main(): a Ctrl-C while it loads is then
# handled like any other, quietly with status 130.

FORMATS = ("table", "json", "csv", "jsonl")
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
FIRST_READING_TIMEOUT_S = 10.0
ATTRIBUTION_TIMEOUT_S = 3.0
"""How long to wait for the kubelet's first answer before showing the GPUs without it."""
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
_ENCODER = msgspec.json.Encoder()


class Plan(msgspec.Struct, frozen=True):
    """What a run will do, printed by ``--dry-run`` without touching NVML."""

    source: str
    format: str
    interval_s: float | None
    watch: bool
    count: int | None
    environment: Environment
    devices: DeviceFilter
    pod_resources_socket: str = ""
    """Read for the namespace, pod and container of each device; empty: not read."""
    gpu_resource_names: str = "nvidia.com/gpu,nvidia.com/mig-*"


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


class Printer:
    """Writes rows in one format; the CSV header is written once per run.

    A live table (``watch``) redraws in place under a title line (node, time, period, how
    to stop), and its columns never narrow, so the figures stay where the eye expects them.
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
    ) -> None:
        self._environment = environment or {}
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
            if self._watch:
                table = "\x1b[H\x1b[2J" + self._title() + "\n\n" + table
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


def _rows(snapshot: Snapshot, plan: Plan, now: float) -> list[dict[str, Any]]:
    stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    joined = attribute(snapshot)
    return [
        record(
            d,
            now,
            node=plan.environment.node,
            stamp=stamp,
            holders=None if joined is None else joined.holders(d.key),
        )
        for d in snapshot.ordered_devices()
        if plan.devices.allows(d.index, d.key, _instance(d))
    ]


def _instance(device: DeviceState) -> int | None:
    return device.reading.gpu_instance_id if device.reading else None


def _check_scope(snapshot: Snapshot, scope: DeviceFilter) -> None:
    """Every entry of ``--device`` (or the scope variable) must select a device."""
    devices = [Device(d.index, d.key, _instance(d)) for d in snapshot.ordered_devices()]
    scope.check(devices)
    if scope.none:
        print(f'gpu-metrics: {scope.origin}="{scope.given}" grants no GPU', file=sys.stderr)


async def _show(plan: Plan, source: Sampler, printer: Printer) -> None:
    from keda_gpu_scaler.app.compose import AttributionOptions, build_attribution, open_pipeline
    from keda_gpu_scaler.sources.kubelet import ResourceNames

    samplers = build_attribution(
        AttributionOptions(
            socket_path=plan.pod_resources_socket,
            resource_names=ResourceNames.parse(plan.gpu_resource_names),
        )
    )
    async with open_pipeline(source, samplers=samplers) as pipeline:
        with anyio.fail_after(FIRST_READING_TIMEOUT_S):
            first = await pipeline.hub.wait_newer(0)
            # GPM metrics are computed between two samples and PCIe is read beside the
            # cycle: the first cycle lacks them, so show the second.
            await pipeline.hub.wait_newer(first.version)
        if samplers:
            with anyio.move_on_after(ATTRIBUTION_TIMEOUT_S):
                while pipeline.hub.current.attribution is None:
                    await pipeline.hub.wait_newer(pipeline.hub.current.version)
        _check_scope(pipeline.hub.current, plan.devices)
        if plan.interval_s is None:
            printer.emit(_rows(pipeline.hub.current, plan, anyio.current_time()), continuous=False)
            return
        from keda_gpu_scaler.sources.cadence import every

        shown = 0
        # A slow terminal skips the ticks it missed instead of printing them back to back.
        async for now in every(plan.interval_s):
            printer.emit(_rows(pipeline.hub.current, plan, now), continuous=True)
            shown += 1
            if plan.count is not None and shown >= plan.count:
                return


async def _run(plan: Plan, source: Sampler, printer: Printer) -> None:
    async with anyio.create_task_group() as tg:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(stop_on_signal)
        await _show(plan, source, printer)
        tg.cancel_scope.cancel()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-metrics", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--format", choices=FORMATS, default="table")
    parser.add_argument(
        "--interval",
        type=gocli.interval_or_once,
        default=None,
        help="print every INTERVAL (seconds, or 5s, 1m) until interrupted; 0 once (default:"
        " once; 1 with --count or --watch)",
    )
    parser.add_argument(
        "--env",
        choices=gojson.ORCHESTRATORS,
        default="auto",
        help="orchestrator named in the JSON document's environment (default: detected)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="accepted for the Go command line; logs go nowhere"
    )
    parser.add_argument(
        "--count",
        type=positive_int,
        default=None,
        help="stop after COUNT samples, taken every --interval seconds (default 1)",
    )
    parser.add_argument(
        "--watch",
        action="store_true",
        help="live-updating table (implies --interval 1 unless given)",
    )
    parser.add_argument(
        "--device",
        default=None,
        help="GPUs to show: indices, GPU:GI labels of MIG instances or UUIDs, comma-separated; "
        "-1 all (default: what the job's environment grants)",
    )
    parser.add_argument(
        "--source",
        default=os.environ.get("GPU_METRICS_SOURCE", "nvml"),
        help="nvml (default), replay or replay:PATH",
    )
    parser.add_argument(
        "--pod-resources-socket",
        default=os.environ.get("KEDA_GPU_SCALER_POD_RESOURCES_SOCKET"),
        help="kubelet PodResources socket, read for the namespace, pod and container of each "
        f"GPU; empty: not read (default: {DEFAULT_POD_RESOURCES_SOCKET} when it exists)",
    )
    parser.add_argument(
        "--gpu-resource-names",
        default=os.environ.get(
            "KEDA_GPU_SCALER_GPU_RESOURCE_NAMES", "nvidia.com/gpu,nvidia.com/mig-*"
        ),
        help="comma-separated resource names that are GPUs; an entry ending in * is a prefix",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved plan as JSON without reading any GPU",
    )
    return parser


def make_plan(args: argparse.Namespace, env: dict[str, str]) -> Plan:
    device = gocli.all_devices(args.device)
    devices = parse_device_list(device, origin="--device") if device is not None else gpu_scope(env)
    repeats = args.watch or args.count is not None
    interval = args.interval if args.interval is not None else (1.0 if repeats else None)
    socket = args.pod_resources_socket
    if socket is None:
        socket = (
            DEFAULT_POD_RESOURCES_SOCKET if os.path.exists(DEFAULT_POD_RESOURCES_SOCKET) else ""
        )
    return Plan(
        args.source,
        args.format,
        interval,
        args.watch,
        args.count,
        detect_environment(env),
        devices,
        pod_resources_socket=socket,
        gpu_resource_names=args.gpu_resource_names,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["record"]:
        from keda_gpu_scaler.app.record import main as record_main

        return record_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.watch and args.format != "table":
        parser.error("--watch shows a table; use --interval with other formats")
    from keda_gpu_scaler.sources.kubelet import ResourceNames

    try:
        ResourceNames.parse(args.gpu_resource_names)
    except ValueError as exc:
        parser.error(f"argument --gpu-resource-names: {exc}")
    try:
        plan = make_plan(args, dict(os.environ))
    except ScopeError as exc:
        print(f"gpu-metrics: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        print(msgspec.json.format(msgspec.json.encode(plan), indent=2).decode())
        return 0
    try:
        return _measure(plan, gojson.go_environment(os.environ, args.env))
    except SystemExit:
        raise
    except BaseException as exc:  # sorted by exit_status; anything unexpected re-raised
        return exit_status(exc, prog="gpu-metrics")


def _measure(plan: Plan, environment: dict[str, Any]) -> int:
    from keda_gpu_scaler.app.compose import build_source

    source = build_source(plan.source, interval_s=min(plan.interval_s or 1.0, 1.0))
    printer = Printer(
        plan.format,
        watch=plan.watch,
        out=_write,
        node=plan.environment.node,
        interval_s=plan.interval_s,
        environment=environment,
    )
    try:
        anyio.run(_run, plan, source, printer, backend="asyncio")
    except Exception as exc:
        if (scope := find_leaf(exc, ScopeError)) is not None:
            print(f"gpu-metrics: {scope}", file=sys.stderr)
            return EXIT_USAGE
        if find_leaf(exc, TimeoutError) is not None:
            print(f"gpu-metrics: no reading within {FIRST_READING_TIMEOUT_S:g} s", file=sys.stderr)
            return 1
        raise
    return 0


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
