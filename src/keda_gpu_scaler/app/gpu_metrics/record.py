"""``gpu-metrics record``: write a replay trace of this node's GPUs from real NVML.

The file replays with ``keda-gpu-scaler serve --source replay:FILE`` and
``gpu-metrics --source replay:FILE``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from keda_gpu_scaler.app.argtypes import OneLineParser, help_text, positive_float
from keda_gpu_scaler.app.exits import exit_status

if TYPE_CHECKING:
    from keda_gpu_scaler.sources.recorder import RecordingSummary


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="gpu-metrics record", description=help_text(__doc__).splitlines()[0]
    )
    parser.add_argument("--output", type=Path, required=True, help="trace file to write (JSONL)")
    parser.add_argument(
        "--interval", type=positive_float, default=1.0, help="seconds between readings (default 1)"
    )
    parser.add_argument(
        "--duration", type=positive_float, default=60.0, help="seconds to record (default 60)"
    )
    parser.add_argument("--phase", default=None, help="label written into every frame")
    return parser


async def show_progress(
    output: Path, duration_s: float, write: Callable[[str], None], *, every_s: float = 1.0
) -> None:
    """Redraw one status line (elapsed of total seconds) until cancelled; for a terminal."""
    started = anyio.current_time()
    total = math.ceil(duration_s)
    while True:
        elapsed = min(anyio.current_time() - started, duration_s)
        write(f"\rrecording to {output}: {elapsed:.0f} of {total} s (Ctrl-C to stop)\x1b[K")
        await anyio.sleep(every_s)


async def _record(args: argparse.Namespace) -> RecordingSummary:
    from keda_gpu_scaler.sources.nvml.pynvml_backend import open_nvml_backend
    from keda_gpu_scaler.sources.recorder import record_trace

    backend = open_nvml_backend()
    async with anyio.create_task_group() as tg:
        if sys.stderr.isatty():
            tg.start_soon(show_progress, args.output, args.duration, _write_err)
        try:
            summary = await record_trace(
                backend,
                args.output,
                duration_s=args.duration,
                interval_s=args.interval,
                phase=args.phase,
            )
        finally:
            tg.cancel_scope.cancel()
            if sys.stderr.isatty():
                _write_err("\r\x1b[K")
    return summary


def _write_err(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = anyio.run(_record, args, backend="asyncio")
    except SystemExit:
        raise
    except BaseException as exc:  # sorted by exit_status; anything unexpected re-raised
        return exit_status(exc, prog="gpu-metrics record")
    print(
        f"recorded {summary.frames} frames of {summary.devices} device(s) to {summary.path}"
        + (f" ({summary.faults} faults skipped)" if summary.faults else "")
    )
    return 0
