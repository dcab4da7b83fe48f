"""``gpu-metrics record``: write a replay trace of this node's GPUs from real NVML.

The file replays with ``keda-gpu-scaler serve --source replay:FILE`` and
``gpu-metrics --source replay:FILE``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from keda_gpu_scaler.app.argtypes import positive_float
from keda_gpu_scaler.domain.errors import SourceError
from keda_gpu_scaler.sources.recorder import RecordingSummary, record_trace

EXIT_FAILED = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-metrics record", description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, required=True, help="trace file to write (JSONL)")
    parser.add_argument(
        "--interval", type=positive_float, default=1.0, help="seconds between readings (default 1)"
    )
    parser.add_argument(
        "--duration", type=positive_float, default=60.0, help="seconds to record (default 60)"
    )
    parser.add_argument("--phase", default=None, help="label written into every frame")
    return parser


async def _record(args: argparse.Namespace) -> RecordingSummary:
    from keda_gpu_scaler.sources.nvml.pynvml_backend import open_nvml_backend

    return await record_trace(
        open_nvml_backend(),
        args.output,
        duration_s=args.duration,
        interval_s=args.interval,
        phase=args.phase,
    )


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = anyio.run(_record, args, backend="asyncio")
    except SourceError as exc:
        print(f"gpu-metrics record: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    print(
        f"recorded {summary.frames} frames of {summary.devices} device(s) to {summary.path}"
        + (f" ({summary.faults} faults skipped)" if summary.faults else "")
    )
    return 0
