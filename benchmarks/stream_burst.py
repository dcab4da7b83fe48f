"""Stream burst: 1000 StreamIsActive opens at once on one connection, from grpcio and from
grpc-go (KEDA's own stack), against the scaler and against the floor.

For each round, each server (``scaler_process.py --source replay``: the scaler; ``--source
floor``: a servicer that answers prebuilt messages on the same transport, what the gRPC stack
alone costs) and each client:

- **grpcio**: a ``grpc.aio`` client in this process, one channel for the streams and the
  unary calls, a second channel for the probe;
- **grpc-go**: ``build/e2e/bin/scaler-client`` (``e2e/grpcgo``, built by ``make e2e-build``:
  KEDA's generated stubs and the grpc-go release KEDA's go.mod selects), which connects as KEDA
  does, one client connection per address with every stream and call on it.

Unary calls (GetMetrics and IsActive, alternately) go out open-loop at ``--rate`` per second
on the streams' connection and at 20 per second on a second connection (the probe). After one
second the streams open at once; the client waits for every stream's first message, holds
three seconds, and stops. Printed per server and client, the median over ``--rounds``: the time
until every stream had its first message, the first messages' p50 and p99, and the slowest
unary call during the burst on the streams' connection and on the probe's (the stall a KEDA
operator's other calls see).

Usage: python benchmarks/stream_burst.py [--streams N] [--rate R] [--rounds K] [--json PATH]
       (build the grpc-go client first: make e2e-build, or python e2e/build.py --only grpc-go)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from grpc_latency import generate_pb2, load_pb2
from soak import CALL_TIMEOUT_S, METADATA, Load, Server, percentile

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "build" / "e2e" / "bin" / "scaler-client"
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "stream_burst.json"
PROBE_RATE = 20.0
WARMUP_S = 1.0
HOLD_S = 3.0
FIRST_TIMEOUT_S = 60.0


def _figures(
    first_ms: list[float],
    all_first_s: float,
    unary: list[tuple[float, float]],
    probe: list[tuple[float, float]],
    window: tuple[float, float],
    answered: int,
    failures: int,
) -> dict[str, float]:
    during = [ms for sent, ms in unary if window[0] <= sent <= window[1]]
    probe_during = [ms for sent, ms in probe if window[0] <= sent <= window[1]]
    return {
        "streams_answered": answered,
        "failures": failures,
        "all_first_s": all_first_s,
        "first_p50_ms": percentile(first_ms, 50),
        "first_p99_ms": percentile(first_ms, 99),
        "unary_max_ms": max(during, default=math.nan),
        "unary_p99_ms": percentile(during, 99),
        "probe_max_ms": max(probe_during, default=math.nan),
    }


async def _grpcio_burst(port: int, pb2_dir: Path, streams: int, rate: float) -> dict[str, float]:
    import grpc

    pb2, pb2_grpc = load_pb2(pb2_dir)
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as probe_channel,
    ):
        load = Load(pb2, pb2_grpc, channel, streams)
        probe = Load(pb2, pb2_grpc, probe_channel, len(METADATA))
        start = time.monotonic()
        horizon = start + WARMUP_S + FIRST_TIMEOUT_S + HOLD_S
        calls = asyncio.create_task(load.unary_loop(rate, horizon))
        probes = asyncio.create_task(probe.unary_loop(PROBE_RATE, horizon))
        await asyncio.sleep(WARMUP_S)
        opened = time.monotonic()
        tasks = [asyncio.create_task(load.stream(i)) for i in range(streams)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(load.all_answered.wait(), FIRST_TIMEOUT_S)
        all_first = time.monotonic()
        await asyncio.sleep(HOLD_S)
        for task in (calls, probes, *tasks):
            task.cancel()
        await asyncio.gather(calls, probes, *tasks, return_exceptions=True)
    first_ms = [(t - opened) * 1000 for t in load.first_at if t is not None]
    ms = [(sent, s * 1000) for sent, s in load.unary]
    probe_ms = [(sent, s * 1000) for sent, s in probe.unary]
    failures = sum(v for k, v in load.errors.items() if "CANCELLED" not in k)
    failures += sum(v for k, v in probe.errors.items() if "CANCELLED" not in k)
    window = (opened, all_first + 1.0)
    return _figures(first_ms, all_first - opened, ms, probe_ms, window, load.answered, failures)


def _grpc_go_burst(port: int, streams: int, rate: float) -> dict[str, float]:
    done = subprocess.run(
        [
            str(CLIENT),
            f"-address=127.0.0.1:{port}",
            f"-streams={streams}",
            f"-metadata={json.dumps(METADATA)}",
            f"-rate={rate}",
            f"-probe-rate={PROBE_RATE}",
            f"-warmup={WARMUP_S}s",
            f"-hold={HOLD_S}s",
            f"-first-timeout={FIRST_TIMEOUT_S}s",
            f"-call-timeout={CALL_TIMEOUT_S}s",
        ],
        capture_output=True,
        text=True,
        timeout=FIRST_TIMEOUT_S + 60,
        check=True,
    )
    out = json.loads(done.stdout)
    burst = out["burst_at_s"]
    unary = [(c["sent_s"], c["latency_ms"]) for c in out["unary"] if c["code"] == "OK"]
    probe = [(c["sent_s"], c["latency_ms"]) for c in out["probe"] if c["code"] == "OK"]
    failures = sum(c["code"] != "OK" for c in out["unary"] + out["probe"])
    failures += sum(out["stream_errors"].values())
    window = (burst, burst + out["all_first_s"] + 1.0)
    answered = out["streams_answered"]
    figures = _figures([], out["all_first_s"], unary, probe, window, answered, failures)
    # the client measured each stream's first message itself
    figures["first_p50_ms"] = out["first_message"]["p50_ms"] or math.nan
    figures["first_p99_ms"] = out["first_message"]["p99_ms"] or math.nan
    return figures


def _median(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


def _line(server: str, client: str, f: dict[str, float]) -> str:
    return (
        f"{server:>7} {client:>7}: all {f['streams_answered']:.0f} streams answered in "
        f"{f['all_first_s']:.2f} s (first message p50 {f['first_p50_ms']:.0f} ms, p99 "
        f"{f['first_p99_ms']:.0f} ms); slowest unary {f['unary_max_ms']:.1f} ms on the streams' "
        f"connection, {f['probe_max_ms']:.1f} ms on a second one; {f['failures']:.0f} failed"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0, help="unary calls per second")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    if not CLIENT.exists():
        sys.exit(
            f"{CLIENT} is missing: build it with `make e2e-build` (or e2e/build.py --only grpc-go)"
        )
    pb2_dir = Path(tempfile.mkdtemp(prefix="stream-burst-"))
    generate_pb2(pb2_dir)
    results: dict[str, list[dict[str, float]]] = {}
    for n in range(args.rounds):
        for source in ("replay", "floor"):
            server = Server(None, source)
            try:
                for client in ("grpcio", "grpc-go") if n % 2 == 0 else ("grpc-go", "grpcio"):
                    if client == "grpcio":
                        figures = asyncio.run(
                            _grpcio_burst(server.port, pb2_dir, args.streams, args.rate)
                        )
                    else:
                        figures = _grpc_go_burst(server.port, args.streams, args.rate)
                    name = "scaler" if source == "replay" else "floor"
                    results.setdefault(f"{name} {client}", []).append(figures)
                    print(f"round {n + 1}: " + _line(name, client, figures), flush=True)
            finally:
                server.close()
    print("\nmedian over rounds:")
    medians = {key: _median(rounds) for key, rounds in results.items()}
    for key, figures in medians.items():
        server_name, client = key.split()
        print(_line(server_name, client, figures))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "streams": args.streams,
        "rate": args.rate,
        "rounds": results,
        "median": medians,
    }
    args.json.write_text(json.dumps(record, indent=2, allow_nan=True) + "\n")


if __name__ == "__main__":
    main()
