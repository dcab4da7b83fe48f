"""``keda-gpu-scaler``: serve KEDA's External Scaler contract, or show a demo.

Every flag of serve can also be set from an environment variable (KEDA_GPU_SCALER_*, and
NODE_NAME), named in its help text; the other commands take flags only.
"""

from __future__ import annotations

try:
    import argparse
    import sys
    from collections.abc import Sequence
    from pathlib import Path

    from keda_gpu_scaler import __version__
    from keda_gpu_scaler.app import gocli
    from keda_gpu_scaler.app.argtypes import (
        OneLineParser,
        help_text,
        positive_float,
        tap_address,
    )
    from keda_gpu_scaler.app.exits import exit_status
    from keda_gpu_scaler.app.logs import configure_logging
    from keda_gpu_scaler.app.scaler.serve_flags import SERVE_FLAGS
except KeyboardInterrupt:  # Ctrl-C while the command loads: quiet, like Ctrl-C later
    raise SystemExit(130) from None

# Heavy modules (grpclib, httpx, the pipeline) load inside main(), so that a Ctrl-C while
# they load is handled like any other: quietly, with status 130.


class _Parser(OneLineParser):
    """Fills in the ``serve`` flags that were not given, once the command line is parsed."""

    serve: argparse.ArgumentParser | None = None

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        if self.serve is not None and getattr(parsed, "command", None) == "serve":
            parsed.from_environment = {}
            parsed.defaulted = set()
            for flag in SERVE_FLAGS:
                flag.fill(parsed, self.serve)
        return parsed, rest


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="keda-gpu-scaler",
        description=help_text(__doc__) + "\n\n" + __doc__.split("\n\n")[1].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the External Scaler gRPC contract")
    for flag in SERVE_FLAGS:
        flag.add_to(serve)
    parser.serve = serve

    tap = commands.add_parser("tap", help="print the live samples and decisions of a server")
    tap.add_argument(
        "--address",
        type=tap_address,
        default="127.0.0.1:9090",
        help="HOST:PORT of the server's metrics port (default 127.0.0.1:9090)",
    )
    tap.add_argument("--source", help="only samples of this source (nvml, replay, ...)")
    tap.add_argument("--device", help="only samples of this GPU index or UUID")
    tap.add_argument("--metric", help="only decisions on this metric name or type")
    tap.add_argument("--trigger", help="only decisions of this trigger (namespace/name)")
    tap.add_argument("--log-level", type=gocli.log_level, default="warning")

    demo = commands.add_parser("demo", help="replay a real H200 recording and query it like KEDA")
    demo.add_argument(
        "--duration",
        type=positive_float,
        default=60.0,
        help="seconds to run (default 60: one pass of the recording)",
    )
    demo.add_argument(
        "--every",
        type=positive_float,
        default=1.0,
        help="seconds between KEDA-style polls (default 1)",
    )
    demo.add_argument(
        "--cluster",
        action="store_true",
        help="three node agents on replays and a cluster scaler, polled for two workloads",
    )
    demo.add_argument("--log-level", type=gocli.log_level, default="warning")

    simulate = commands.add_parser(
        "simulate",
        help="run a ScaledObject through KEDA and the HPA over a trace or a synthetic load, "
        "in virtual time",
    )
    simulate.add_argument(
        "scaledobject",
        type=Path,
        metavar="SCALEDOBJECT.yaml",
        help="a ScaledObject, or a file of several documents (---) with one ScaledObject",
    )
    simulate.add_argument("--name", help="the ScaledObject of that name, when the file has several")
    given = simulate.add_mutually_exclusive_group(required=True)
    given.add_argument(
        "--trace",
        metavar="FILE",
        help="a recording (gpu-metrics record), or 'bundled' for the H200 recording shipped "
        "with the package",
    )
    given.add_argument(
        "--load", type=Path, metavar="LOAD.yaml", help="a synthetic load (docs/simulate.md)"
    )
    simulate.add_argument("--format", default="table", help="table (default) or json")
    simulate.add_argument("--plot", type=Path, metavar="OUT.png|OUT.svg", help="also draw it")
    simulate.add_argument(
        "--created-at",
        default="0",
        metavar="SECONDS",
        help="when the ScaledObject is created, in seconds into the trace or load: KEDA's first "
        "poll and the HPA's first sync (default 0)",
    )
    simulate.add_argument("--log-level", type=gocli.log_level, default="warning")
    return parser


def _run(args: argparse.Namespace) -> int:
    import anyio

    if args.command == "serve":
        from keda_gpu_scaler.app.scaler.serve import run_serve

        return run_serve(args)
    if args.command == "tap":
        from keda_gpu_scaler.app.scaler.tap_client import run_tap

        return run_tap(
            args.address,
            source=args.source,
            device=args.device,
            metric=args.metric,
            trigger=args.trigger,
        )
    if args.command == "simulate":
        from keda_gpu_scaler.app.simulate.command import run_simulate

        return run_simulate(
            args.scaledobject,
            trace=args.trace,
            load=args.load,
            output_format=args.format,
            plot=args.plot,
            name=args.name,
            created_at=args.created_at,
        )
    if args.cluster:
        from keda_gpu_scaler.app.scaler.demo_cluster import run_cluster_demo

        anyio.run(run_cluster_demo, args.duration, args.every, backend="asyncio")
        return 0
    from keda_gpu_scaler.app.scaler.demo import run_demo

    anyio.run(run_demo, args.duration, args.every, backend="asyncio")
    return 0


_BARE_HINT = (
    "; keda-gpu-scaler alone runs serve on this machine's GPUs: keda-gpu-scaler demo runs "
    "without a GPU, keda-gpu-scaler --help lists the commands"
)


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    # The Go binary had no subcommands: `keda-gpu-scaler --port 6000` serves.
    argv = gocli.with_default_command(given, default="serve")
    try:
        args = build_parser().parse_args(argv)
        configure_logging(args.log_level)
        return _run(args)
    except SystemExit:
        raise
    except BaseException as exc:  # sorted by exit_status; anything unexpected re-raised
        # Bare, on a machine without a GPU (a first try): say what else there is.
        hint = _BARE_HINT if not given else ""
        return exit_status(exc, prog="keda-gpu-scaler", source_hint=hint)
