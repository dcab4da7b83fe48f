"""``keda-gpu-scaler``: serve KEDA's External Scaler contract, or show a demo.

Every flag can also be set from an environment variable, named in its help text.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence

import anyio

from keda_gpu_scaler import __version__
from keda_gpu_scaler.app.compose import build_source, open_scaler
from keda_gpu_scaler.app.logs import LEVELS, configure_logging
from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.serving.server import DEFAULT_MAX_CONCURRENT_STREAMS

log = logging.getLogger("keda_gpu_scaler")

ENV_PREFIX = "KEDA_GPU_SCALER_"
EXIT_SOURCE_UNAVAILABLE = 2


def _env(name: str, default: str) -> str:
    return os.environ.get(ENV_PREFIX + name, default)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port (0-65535): {text!r}")
    return int(text)


def _stream_limit(text: str) -> int:
    if not text.isdigit() or not 100 <= int(text) <= 2**31 - 1:
        raise argparse.ArgumentTypeError(f"must be an integer of at least 100: {text!r}")
    return int(text)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        choices=LEVELS,
        default=_env("LOG_LEVEL", "info"),
        help="log level (env KEDA_GPU_SCALER_LOG_LEVEL; default info)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="keda-gpu-scaler", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the External Scaler gRPC contract")
    serve.add_argument(
        "--host",
        default=_env("HOST", "0.0.0.0"),
        help="address to listen on (env KEDA_GPU_SCALER_HOST; default 0.0.0.0)",
    )
    serve.add_argument(
        "--port",
        type=_port,
        default=_env("PORT", "6000"),
        help="gRPC port (env KEDA_GPU_SCALER_PORT; default 6000; 0 picks one)",
    )
    serve.add_argument(
        "--source",
        default=_env("SOURCE", "nvml"),
        help="nvml, replay (bundled H200 trace) or replay:PATH "
        "(env KEDA_GPU_SCALER_SOURCE; default nvml)",
    )
    serve.add_argument(
        "--interval",
        type=_positive_float,
        default=_env("INTERVAL", "1.0"),
        help="NVML sampling period in seconds (env KEDA_GPU_SCALER_INTERVAL)",
    )
    serve.add_argument(
        "--max-concurrent-streams",
        type=_stream_limit,
        default=_env("MAX_CONCURRENT_STREAMS", str(DEFAULT_MAX_CONCURRENT_STREAMS)),
        help="HTTP/2 streams per connection (env KEDA_GPU_SCALER_MAX_CONCURRENT_STREAMS)",
    )
    _add_common(serve)

    tap = commands.add_parser("tap", help="print the live samples and decisions of a server")
    tap.add_argument(
        "--address",
        default="127.0.0.1:9090",
        help="HOST:PORT of the server's metrics port (default 127.0.0.1:9090)",
    )
    tap.add_argument("--source", help="only samples of this source (nvml, replay, ...)")
    tap.add_argument("--device", help="only samples of this GPU index or UUID")
    tap.add_argument("--metric", help="only decisions on this metric name or type")
    tap.add_argument("--trigger", help="only decisions of this trigger (namespace/name)")

    demo = commands.add_parser("demo", help="replay a real H200 recording and query it like KEDA")
    demo.add_argument(
        "--duration",
        type=_positive_float,
        default=60.0,
        help="seconds to run (default 60: one pass of the recording)",
    )
    demo.add_argument(
        "--every",
        type=_positive_float,
        default=1.0,
        help="seconds between KEDA-style polls (default 1)",
    )
    demo.add_argument("--log-level", choices=LEVELS, default="warning")
    return parser


async def _serve(args: argparse.Namespace) -> None:
    source = build_source(args.source, interval_s=args.interval)
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with open_scaler(
            source,
            host=args.host,
            port=args.port,
            max_concurrent_streams=args.max_concurrent_streams,
        ) as running:
            log.info(
                "serving", extra={"host": args.host, "port": running.port, "source": source.name}
            )
            async for signum in signals:
                log.info("shutting down", extra={"signal": signal.Signals(signum).name})
                break
    log.info("stopped")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    try:
        if args.command == "serve":
            anyio.run(_serve, args, backend="asyncio")
        elif args.command == "tap":
            from keda_gpu_scaler.app.tap_client import run_tap

            return run_tap(
                args.address,
                source=args.source,
                device=args.device,
                metric=args.metric,
                trigger=args.trigger,
            )
        else:
            from keda_gpu_scaler.app.demo import run_demo

            anyio.run(run_demo, args.duration, args.every, backend="asyncio")
    except SourceUnavailable as exc:
        print(f"keda-gpu-scaler: {exc}", file=sys.stderr)
        return EXIT_SOURCE_UNAVAILABLE
    except KeyboardInterrupt:
        return 130
    return 0
