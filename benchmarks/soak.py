"""Soak: 1000 StreamIsActive streams on one grpcio connection plus 200 unary calls per second.

The scaler runs in a process of its own (``scaler_process.py``, replay source: the bundled
H200 recording at 10 Hz, so a reading is stale after 0.3 s). A grpcio ``aio`` client in this
process opens every stream at once on one channel (the burst), with five distinct metadata
maps over 1000 ScaledObjects as KEDA sends them, while unary GetMetrics and IsActive calls go
out open-loop at ``--rate`` per second. Every ``--report`` seconds it prints errors, streams
alive, unary p50/p99 over that window, messages per stream, server CPU as a share of one
core, the share of the window its loop's thread spent ready but waiting for a core, server
RSS, h2's table of closed streams, the server's longest loop stall, and its
young, middle and full garbage collections with the longest of each. At the end: the burst
figures (slowest unary call while the streams opened, UNAVAILABLE answers) and the totals
after warm-up. With ``SOAK_CENSUS=1`` every line is followed by the number of objects the
server's collector tracks and the most common types among them (the count walks every
object: it stalls the server, so leave it off for figures).

A second client process sends unary calls at 20 per second on a connection of its own for
the whole run: the streams' own connection carries their headers ahead of any call sent after
them, and its client is busy with a thousand streams of its own, so the second client shows
what the server itself adds.

``--baseline TREE`` first runs the same soak against the checkout at TREE (its ``src`` on
PYTHONPATH), so two versions are compared in one run, one after the other. ``--floor`` first
runs it against a server that does no work (``scaler_process.py --source floor``: prebuilt
answers on the scaler's own transport), the part of the figures that the gRPC stack costs
before the scaler adds anything.

Usage: python benchmarks/soak.py [--duration S] [--streams N] [--rate R] [--report S]
                                 [--baseline TREE] [--floor] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from grpc_latency import generate_pb2, load_pb2

ROOT = Path(__file__).resolve().parents[1]
SERVER = Path(__file__).resolve().with_name("scaler_process.py")
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "soak.json"
METADATA = [
    {"profile": "training"},
    {"profile": "triton-inference"},
    {"profile": "vllm-inference"},
    {"metricType": "sm_active", "activationThreshold": "5"},
    {"metricType": "pcie_rx_kbps", "activationThreshold": "1000000"},
]
WARMUP_S = 30.0
CALL_TIMEOUT_S = 5.0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


class Server:
    """The scaler process and its stdin control channel."""

    def __init__(self, tree: Path | None, source: str) -> None:
        env = dict(os.environ)
        if tree is not None:
            env["PYTHONPATH"] = str(tree / "src")
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), "--source", source],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # its warnings would drown the figures
            text=True,
            bufsize=1,
            env=env,
        )
        self.port = int(self._line())

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise SystemExit(f"scaler process exited (status {self.process.wait()})")
        return line.strip()

    def ask(self, command: str) -> str:
        stdin: IO[str] | None = self.process.stdin
        assert stdin is not None
        stdin.write(command + "\n")
        stdin.flush()
        return self._line()

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


@dataclass
class Window:
    at_s: float
    errors: int
    streams_alive: int
    unary_p50_ms: float
    unary_p99_ms: float
    messages_per_stream: float
    cpu_share: float
    waited_share: float
    """Of the window, the time the server's loop thread waited, ready, for a core."""
    rss_mb: float
    h2_closed_streams: int
    h2_walk_ms: float
    """How long counting them took (it blocks the server's loop: in the next window's lag)."""
    loop_blocked_ms: float
    """The longest the server's event loop was late for a 5 ms timer in the window..."""
    longest_gc_ms: float
    """...and its longest garbage collection."""
    collections: tuple[int, int, int]
    """Garbage collections in the window, young, middle and full..."""
    longest_collection_ms: tuple[float, float, float]
    """...and the longest of each."""


@dataclass
class Result:
    name: str
    duration_s: float
    streams: int
    rate: float
    burst_max_unary_ms: float = math.nan
    burst_unavailable: int = 0
    burst_all_streams_s: float = math.nan
    burst_server_stall_ms: float = math.nan
    """The longest the server's event loop was blocked while the streams opened..."""
    burst_server_gc_ms: float = math.nan
    """...and its longest garbage collection in that time."""
    burst_probe_max_ms: float = math.nan
    """Unary calls of a second client on a connection of its own, around the burst."""
    burst_probe_p99_ms: float = math.nan
    probe_p50_ms: float = math.nan
    """The second client's calls after warm-up: latency without the streams' client."""
    probe_p99_ms: float = math.nan
    probe_errors: int = 0
    windows: list[Window] = field(default_factory=list)
    unary_p50_ms: float = math.nan
    unary_p99_ms: float = math.nan
    unary_calls: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    error_reasons: dict[str, str] = field(default_factory=dict)
    streams_alive: int = 0
    messages_per_stream: float = 0.0
    cpu_share: float = math.nan
    waited_share: float = math.nan
    rss_warm_mb: float = math.nan
    rss_end_mb: float = math.nan


class Load:
    def __init__(self, pb2: Any, pb2_grpc: Any, channel: Any, streams: int) -> None:
        self.pb2 = pb2
        self.stub = pb2_grpc.ExternalScalerStub(channel)
        self.refs = [
            pb2.ScaledObjectRef(name=f"so-{i}", namespace="soak", scalerMetadata=METADATA[i % 5])
            for i in range(streams)
        ]
        self.messages = [0] * streams
        self.first_at: list[float | None] = [None] * streams
        self.ended: list[str | None] = [None] * streams
        self.unary: list[tuple[float, float]] = []
        """(sent at, seconds) of every unary call that succeeded."""
        self.errors: dict[str, int] = {}
        self.reasons: dict[str, str] = {}
        """The first message of each error code."""
        self.answered = 0
        self.all_answered = asyncio.Event()

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    async def stream(self, i: int) -> None:
        import grpc

        try:
            async for _ in self.stub.StreamIsActive(self.refs[i]):
                if self.first_at[i] is None:
                    self.first_at[i] = time.monotonic()
                    self.answered += 1
                    if self.answered == len(self.refs):
                        self.all_answered.set()
                self.messages[i] += 1
            self.ended[i] = "OK"
        except grpc.aio.AioRpcError as exc:
            self.ended[i] = exc.code().name
            if exc.code() is not grpc.StatusCode.CANCELLED:
                self.error(f"stream {exc.code().name}")

    async def call(self, n: int) -> None:
        import grpc

        ref = self.refs[n % len(self.refs)]
        sent = time.monotonic()
        try:
            if n % 2:
                request = self.pb2.GetMetricsRequest(scaledObjectRef=ref, metricName="m")
                await self.stub.GetMetrics(request, timeout=CALL_TIMEOUT_S)
            else:
                await self.stub.IsActive(ref, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self.error(f"unary {exc.code().name}")
            self.reasons.setdefault(exc.code().name, exc.details() or "")
            return
        self.unary.append((sent, time.monotonic() - sent))

    async def unary_loop(self, rate: float, until: float) -> None:
        tasks: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        n = 0
        while (now := time.monotonic()) < until:
            due = start + n / rate
            if due > now:
                await asyncio.sleep(due - now)
            task = asyncio.create_task(self.call(n))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        if tasks:
            await asyncio.wait(tasks)


def _mb(text: str) -> float:
    return int(text) / 2**20


PROBE_RATE = 20.0
"""Calls per second of the second client."""


async def probe(port: int, pb2_dir: Path, rate: float, seconds: float) -> None:
    """The second client: unary calls on a connection of its own, latencies printed as JSON."""
    import grpc

    pb2, pb2_grpc = load_pb2(pb2_dir)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        load = Load(pb2, pb2_grpc, channel, 1)
        await channel.channel_ready()
        print("ready", flush=True)
        await load.unary_loop(rate, time.monotonic() + seconds)
    print(json.dumps({"unary": load.unary, "errors": load.errors}))


def _start_probe(port: int, pb2_dir: Path, seconds: float) -> subprocess.Popen[str]:
    command = [sys.executable, __file__, "--probe", str(port), "--pb2-dir", str(pb2_dir)]
    command += ["--rate", str(PROBE_RATE), "--duration", str(seconds)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    process.stdout.readline()  # connected
    return process


def _probe_figures(
    result: Result, process: subprocess.Popen[str], burst: tuple[float, float], warm_from: float
) -> None:
    out, _ = process.communicate(timeout=60)
    answer = json.loads(out.strip().splitlines()[-1])
    during = [s for sent, s in answer["unary"] if burst[0] <= sent <= burst[1]]
    after = [s for sent, s in answer["unary"] if sent >= warm_from]
    result.burst_probe_max_ms = max(during, default=math.nan) * 1000
    result.burst_probe_p99_ms = percentile(during, 99) * 1000
    result.probe_p50_ms = percentile(after, 50) * 1000
    result.probe_p99_ms = percentile(after, 99) * 1000
    result.probe_errors = sum(answer["errors"].values())


async def run_one(
    name: str, tree: Path | None, source: str, args: argparse.Namespace, pb2_dir: Path
) -> Result:
    import grpc

    pb2, pb2_grpc = load_pb2(pb2_dir)
    server = Server(tree, source)
    prober = _start_probe(server.port, pb2_dir, args.duration)
    result = Result(name, args.duration, args.streams, args.rate)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            load = Load(pb2, pb2_grpc, channel, args.streams)
            await channel.channel_ready()
            start = time.monotonic()
            end = start + args.duration
            unary = asyncio.create_task(load.unary_loop(args.rate, end))
            await asyncio.sleep(1.0)  # unary calls flowing before the burst
            server.ask("lag")
            burst_at = time.monotonic()
            streams = [asyncio.create_task(load.stream(i)) for i in range(args.streams)]
            await _until_all_first(load, 60.0)
            burst_done = time.monotonic()
            stall, collection = (float(x) * 1000 for x in server.ask("lag").split())
            result.burst_server_stall_ms, result.burst_server_gc_ms = stall, collection
            _burst(result, load, burst_at, burst_done + 1.0)
            await _report(result, server, load, start, end, args.report)
            await unary
            burst = (burst_at, burst_done + 1.0)
            await asyncio.to_thread(_probe_figures, result, prober, burst, burst_done + 1.0)
            for task in streams:
                task.cancel()
            await asyncio.gather(*streams, return_exceptions=True)
    finally:
        server.close()
    _totals(result, load, burst_done + 1.0)
    return result


async def _until_all_first(load: Load, timeout_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(load.all_answered.wait(), timeout_s)


def _burst(result: Result, load: Load, opened: float, until: float) -> None:
    firsts = [t for t in load.first_at if t is not None]
    result.burst_all_streams_s = (
        (max(firsts) - opened) if len(firsts) == result.streams else math.inf
    )
    # A call answered later than the window still counts if it was sent inside it.
    during = [s for sent, s in load.unary if opened <= sent <= until]
    result.burst_max_unary_ms = max(during, default=math.nan) * 1000
    result.burst_unavailable = load.errors.get("unary UNAVAILABLE", 0)


async def _report(
    result: Result, server: Server, load: Load, start: float, end: float, every: float
) -> None:
    cpu0, t0 = int(server.ask("cpu")), time.monotonic()
    waited0 = int(server.ask("waited"))
    server.ask("lag")  # from here on
    server.ask("collections")
    seen = 0
    while time.monotonic() < end:
        await asyncio.sleep(min(every, max(0.0, end - time.monotonic())))
        cpu1, t1 = int(server.ask("cpu")), time.monotonic()
        waited1 = int(server.ask("waited"))
        calls = load.unary[seen:]
        seen += len(calls)
        blocked, collection = (float(x) * 1000 for x in server.ask("lag").split())
        young, longest_young, middle, longest_middle, full, longest_full = server.ask(
            "collections"
        ).split()
        h2_asked = time.monotonic()
        h2_closed = int(server.ask("h2"))  # a walk of the server's objects, on its loop
        h2_walk_ms = (time.monotonic() - h2_asked) * 1000
        window = Window(
            at_s=round(t1 - start, 1),
            errors=sum(load.errors.values()),
            streams_alive=sum(e is None for e in load.ended),
            unary_p50_ms=percentile([s for _, s in calls], 50) * 1000,
            unary_p99_ms=percentile([s for _, s in calls], 99) * 1000,
            messages_per_stream=sum(load.messages) / len(load.messages),
            cpu_share=(cpu1 - cpu0) / 1e9 / (t1 - t0),
            waited_share=(waited1 - waited0) / 1e9 / (t1 - t0),
            rss_mb=_mb(server.ask("rss")),
            h2_closed_streams=h2_closed,
            h2_walk_ms=h2_walk_ms,
            loop_blocked_ms=blocked,
            longest_gc_ms=collection,
            collections=(int(young), int(middle), int(full)),
            longest_collection_ms=(
                float(longest_young) * 1000,
                float(longest_middle) * 1000,
                float(longest_full) * 1000,
            ),
        )
        cpu0, t0, waited0 = cpu1, t1, waited1
        result.windows.append(window)
        if os.environ.get("SOAK_CENSUS"):
            print(f"  census: {server.ask('census')}", flush=True)
        print(
            f"  {result.name:>9} t={window.at_s:6.0f}s errors={window.errors} "
            f"alive={window.streams_alive} p50={window.unary_p50_ms:.2f}ms "
            f"p99={window.unary_p99_ms:.2f}ms msgs/stream={window.messages_per_stream:.1f} "
            f"cpu={window.cpu_share:.1%} waited={window.waited_share:.1%} "
            f"rss={window.rss_mb:.1f}MB "
            f"h2_closed={window.h2_closed_streams} (counted in {window.h2_walk_ms:.0f}ms) "
            f"blocked={window.loop_blocked_ms:.0f}ms "
            f"gc={window.longest_gc_ms:.0f}ms collections="
            + "/".join(
                f"{n}:{w:.0f}ms"
                for n, w in zip(window.collections, window.longest_collection_ms, strict=True)
            ),
            flush=True,
        )


def _totals(result: Result, load: Load, warm_from: float) -> None:
    after = [s for sent, s in load.unary if sent >= warm_from]
    result.unary_calls = len(load.unary)
    result.unary_p50_ms = percentile(after, 50) * 1000
    result.unary_p99_ms = percentile(after, 99) * 1000
    result.errors = sum(load.errors.values())
    result.error_kinds = dict(load.errors)
    result.error_reasons = dict(load.reasons)
    result.streams_alive = sum(e is None for e in load.ended)  # cancelled by us at the end
    result.messages_per_stream = sum(load.messages) / len(load.messages)
    warm = [w for w in result.windows if w.at_s > WARMUP_S + 1]
    if warm:
        result.cpu_share = sum(w.cpu_share for w in warm) / len(warm)
        result.waited_share = sum(w.waited_share for w in warm) / len(warm)
        result.rss_warm_mb = warm[0].rss_mb
        result.rss_end_mb = warm[-1].rss_mb


def _summary(result: Result) -> str:
    own = (
        # The client opening the streams may be too busy to send a call in the window.
        "none sent on the streams' connection"
        if math.isnan(result.burst_max_unary_ms)
        else f"{result.burst_max_unary_ms:.1f} ms on the streams' connection"
    )
    return (
        f"{result.name}: burst of {result.streams} streams: all answered in "
        f"{result.burst_all_streams_s:.2f} s, server loop blocked "
        f"{result.burst_server_stall_ms:.0f} ms at most (longest garbage collection "
        f"{result.burst_server_gc_ms:.0f} ms), slowest unary {own} and "
        f"{result.burst_probe_max_ms:.1f} ms (p99 {result.burst_probe_p99_ms:.1f} ms) on a "
        "second client's, "
        f"{result.burst_unavailable} UNAVAILABLE\n"
        + "".join(f"{result.name}: first {k}: {v}\n" for k, v in result.error_reasons.items())
        + f"{result.name}: after warm-up: server CPU {result.cpu_share:.1%} of one core (its "
        f"loop's thread waited for a core {result.waited_share:.1%} of the time), unary "
        f"p50 {result.unary_p50_ms:.2f} ms p99 {result.unary_p99_ms:.2f} ms over "
        f"{result.unary_calls} calls (a second client at {PROBE_RATE:g}/s on its own "
        f"connection: p50 {result.probe_p50_ms:.2f} ms p99 {result.probe_p99_ms:.2f} ms, "
        f"{result.probe_errors} errors), errors {result.errors} {result.error_kinds or ''}, "
        f"streams alive at the end {result.streams_alive}/{result.streams}, "
        f"{result.messages_per_stream:.1f} messages per stream, RSS {result.rss_warm_mb:.1f} -> "
        f"{result.rss_end_mb:.1f} MB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds per version")
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0, help="unary calls per second")
    parser.add_argument("--report", type=float, default=30.0, help="seconds between lines")
    parser.add_argument("--baseline", type=Path, help="another checkout to soak first")
    parser.add_argument(
        "--floor", action="store_true", help="first soak a server that does no work"
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--probe", type=int, help=argparse.SUPPRESS)  # the second client
    parser.add_argument("--pb2-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe is not None:
        asyncio.run(probe(args.probe, args.pb2_dir, args.rate, args.duration))
        return
    runs: list[tuple[str, Path | None, str]] = []
    if args.floor:
        runs.append(("floor", None, "floor"))
    if args.baseline:
        runs.append(("baseline", args.baseline, "replay"))
    runs.append(("current", None, "replay"))
    results = []
    with tempfile.TemporaryDirectory() as pb2_dir:
        generate_pb2(Path(pb2_dir))
        for name, tree, source in runs:
            print(f"{name}: {args.streams} streams, {args.rate:g} unary/s, {args.duration:g} s")
            results.append(asyncio.run(run_one(name, tree, source, args, Path(pb2_dir))))
    for result in results:
        print(_summary(result))
    after = results[-1]
    for before in results[:-1]:
        print(
            f"ratio current/{before.name}: CPU {after.cpu_share / before.cpu_share:.2f}, "
            f"unary p99 {after.unary_p99_ms / before.unary_p99_ms:.2f}"
        )
    write_json(args.json, [asdict(r) for r in results])


def write_json(path: Path, results: list[dict[str, Any]]) -> None:
    """The results, with the machine they came from."""
    path.parent.mkdir(parents=True, exist_ok=True)
    machine = {"machine": platform.machine(), "cpus": os.cpu_count(), "python": sys.version}
    path.write_text(json.dumps({"machine": machine, "results": results}, indent=2))


if __name__ == "__main__":
    main()
