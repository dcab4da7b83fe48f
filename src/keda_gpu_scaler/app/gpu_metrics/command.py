"""``gpu-metrics``: show the GPUs of this node as a table, JSON, CSV or JSON lines.

Works on Kubernetes nodes and HPC hosts (Slurm, Flux): the environment decides the node
name and which GPUs the job may see. Every record has the same stable snake_case keys,
documented in docs/gpu-metrics.md.
"""

from __future__ import annotations

try:
    import argparse
    import os
    import signal
    import sys
    from collections.abc import Sequence
    from datetime import UTC, datetime
    from typing import TYPE_CHECKING, Any

    import anyio
    import msgspec

    from keda_gpu_scaler import __version__
    from keda_gpu_scaler.app import gocli
    from keda_gpu_scaler.app.argtypes import OneLineParser, help_text, positive_int
    from keda_gpu_scaler.app.exits import EXIT_USAGE, exit_status, find_leaf
    from keda_gpu_scaler.app.gpu_metrics import gojson
    from keda_gpu_scaler.app.gpu_metrics.output import Printer, record
    from keda_gpu_scaler.app.gpu_metrics.scope import (
        Device,
        DeviceFilter,
        Environment,
        ScopeError,
        detect_environment,
        gpu_scope,
        parse_device_list,
    )
    from keda_gpu_scaler.app.scaler.serve_flags import DEFAULT_POD_RESOURCES_SOCKET
    from keda_gpu_scaler.domain.attribution import attribute
    from keda_gpu_scaler.domain.snapshot import DeviceState, Snapshot

    if TYPE_CHECKING:
        from keda_gpu_scaler.pipeline.supervisor import Sampler
except KeyboardInterrupt:  # Ctrl-C while the command loads: quiet, like Ctrl-C later
    raise SystemExit(130) from None

# The pipeline (and what it imports) loads inside main(): a Ctrl-C while it loads is then
# handled like any other, quietly with status 130.

FORMATS = ("table", "json", "csv", "jsonl")
FIRST_READING_TIMEOUT_S = 10.0
ATTRIBUTION_TIMEOUT_S = 3.0
"""How long to wait for the kubelet's first answer before showing the GPUs without it."""


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
    from keda_gpu_scaler.app.scaler.compose import (
        AttributionOptions,
        build_attribution,
        open_pipeline,
    )
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
    parser = OneLineParser(
        prog="gpu-metrics",
        usage="%(prog)s [options]\n       %(prog)s record --output FILE [options]",
        description=help_text(__doc__).splitlines()[0],
        epilog="commands:\n  record    write a recording of this node's GPUs from real NVML, for "
        "replay:FILE\n            (gpu-metrics record --help)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
        from keda_gpu_scaler.app.gpu_metrics.record import main as record_main

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
    from keda_gpu_scaler.app.scaler.compose import build_source

    source = build_source(plan.source, interval_s=min(plan.interval_s or 1.0, 1.0))
    printer = Printer(
        plan.format,
        watch=plan.watch,
        out=_write,
        node=plan.environment.node,
        interval_s=plan.interval_s,
        environment=environment,
        terminal=sys.stdout.isatty(),
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
