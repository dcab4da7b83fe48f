"""Reaction: from a sample entering the aggregator to the StreamIsActive message at a client.

The scaler runs in a process of its own (``scaler_process.py --source flip``: one GPU whose
utilization changes on command). A grpcio ``aio`` client in this process holds ``--streams``
StreamIsActive streams on one channel (five metadata maps, activation thresholds 20 to 60 %,
no cooldown), then flips the utilization between 10 % and 90 % ``--flips`` times. For each
flip the server answers the ``time.monotonic()`` at which the reading was handed to the
aggregator's channel (the clock is the machine's, shared by both processes); each stream's
reaction is the arrival of its first message with the new activity, minus that instant.
Printed: median, p99 and maximum over every stream and flip, and the slowest stream of each
flip.

``--baseline TREE`` measures the checkout at TREE first, in the same run.

Usage: python benchmarks/reaction.py [--streams N] [--flips N] [--gap S] [--baseline TREE]
                                     [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grpc_latency import generate_pb2, load_pb2
from soak import Server, percentile, write_json

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "reaction.json"
THRESHOLDS = ("20", "30", "40", "50", "60")
HIGH, LOW = 90.0, 10.0


@dataclass
class Result:
    name: str
    streams: int
    flips: int
    median_ms: float = math.nan
    p99_ms: float = math.nan
    max_ms: float = math.nan
    missed: int = 0
    """Stream-flips with no message of the new activity within the gap."""
    slowest_per_flip_ms: list[float] = field(default_factory=list)


async def run_one(name: str, tree: Path | None, args: argparse.Namespace, pb2_dir: Path) -> Result:
    import grpc

    pb2, pb2_grpc = load_pb2(pb2_dir)
    server = Server(tree, "flip")
    arrivals: list[list[tuple[float, bool]]] = [[] for _ in range(args.streams)]
    result = Result(name, args.streams, args.flips)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb2_grpc.ExternalScalerStub(channel)

            async def stream(i: int) -> None:
                metadata = {
                    "metricType": "gpu_utilization",
                    "activationThreshold": THRESHOLDS[i % len(THRESHOLDS)],
                    "cooldownSeconds": "0",
                }
                ref = pb2.ScaledObjectRef(name=f"so-{i}", namespace="r", scalerMetadata=metadata)
                async for message in stub.StreamIsActive(ref):
                    arrivals[i].append((time.monotonic(), message.result))

            tasks = [asyncio.create_task(stream(i)) for i in range(args.streams)]
            await asyncio.sleep(3.0)  # every stream open and answered
            flips = []
            for n in range(args.flips):
                value = HIGH if n % 2 == 0 else LOW
                sent = float(await asyncio.to_thread(server.ask, f"flip {value}"))
                flips.append((sent, value > float(THRESHOLDS[-1])))
                await asyncio.sleep(args.gap)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        server.close()
    _figures(result, arrivals, flips, args.gap)
    return result


def _figures(
    result: Result,
    arrivals: list[list[tuple[float, bool]]],
    flips: list[tuple[float, bool]],
    gap: float,
) -> None:
    reactions: list[float] = []
    for sent, active in flips:
        slowest = 0.0
        for messages in arrivals:
            first = next((t for t, a in messages if a is active and sent <= t <= sent + gap), None)
            if first is None:
                result.missed += 1
                continue
            reactions.append(first - sent)
            slowest = max(slowest, first - sent)
        result.slowest_per_flip_ms.append(round(slowest * 1000, 1))
    result.median_ms = percentile(reactions, 50) * 1000
    result.p99_ms = percentile(reactions, 99) * 1000
    result.max_ms = max(reactions, default=math.nan) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--flips", type=int, default=20)
    parser.add_argument("--gap", type=float, default=2.0, help="seconds between flips")
    parser.add_argument("--baseline", type=Path, help="another checkout to measure first")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    runs: list[tuple[str, Path | None]] = [("baseline", args.baseline)] if args.baseline else []
    runs.append(("current", None))
    results = []
    with tempfile.TemporaryDirectory() as pb2_dir:
        generate_pb2(Path(pb2_dir))
        for name, tree in runs:
            results.append(asyncio.run(run_one(name, tree, args, Path(pb2_dir))))
    for r in results:
        print(
            f"{r.name}: {r.streams} streams, {r.flips} flips: reaction median "
            f"{r.median_ms:.1f} ms, "
            f"p99 {r.p99_ms:.1f} ms, max {r.max_ms:.1f} ms, missed {r.missed}; slowest stream "
            f"per flip (ms): {r.slowest_per_flip_ms}"
        )
    if len(results) == 2:
        before, after = results
        print(
            f"ratio current/baseline: median {after.median_ms / before.median_ms:.2f}, "
            f"p99 {after.p99_ms / before.p99_ms:.2f}"
        )
    write_json(args.json, [asdict(r) for r in results])


if __name__ == "__main__":
    main()
