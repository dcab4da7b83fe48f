"""GetMetrics latency: the scaler against constant grpclib and grpcio servers, in one run.

A grpcio client (blocking stub, one channel per server, sequential calls) in this process
sends the same ``GetMetrics`` request to three servers, each in its own process:

- ``product``: the scaler as ``open_scaler`` wires it, fed by a fake GPU whose reading is
  always fresh (``FakeGpuSource`` at a 0.5 s period, 87 % utilization);
- ``grpclib-constant``: a grpclib server on the same generated code that returns a
  prebuilt response, the floor the product stands on;
- ``grpcio-constant``: a grpcio server that returns the same response, for scale.

After a warm-up (200 calls each) the calls are made in rounds (10 by default), round-robin
with a rotating order, so machine noise hits every server alike. Server CPU is each server
process's own CPU time (all threads) over its measured windows, read by the server itself
and sent back on a pipe. The grpcio modules are generated into a temporary directory at
every run. When uvloop is importable (it is not a dependency), the product and the grpclib
server are measured once more on it.

Usage: python benchmarks/grpc_latency.py [--calls N] [--rounds R] [--warmup N] [--pin]
                                         [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO, Any, cast

ROOT = Path(__file__).resolve().parents[1]
PROTO = ROOT / "protos" / "externalscaler.proto"
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "grpc_latency.json"

HOST = "127.0.0.1"
METADATA = {"profile": "training", "cooldownSeconds": "0"}
METRIC_NAME = "keda_gpu_training"
UTILIZATION = 87.0
"""What the fake GPU reads, and so what every server answers."""
CALL_TIMEOUT_S = 5.0
START_TIMEOUT_S = 30.0

PRODUCT = "product"
GRPCLIB = "grpclib-constant"
GRPCIO = "grpcio-constant"
UVLOOP = " (uvloop)"


# -- servers (each runs as ``--serve KIND`` in a process of its own) ---------------------


def _control(stop: Callable[[], object]) -> None:
    """Answer ``cpu`` on stdin with this process's CPU time in ns; call ``stop`` at EOF.

    A thread blocked on a read holds no GIL, so it costs the server nothing between
    the measured windows.
    """
    for line in sys.stdin:
        if line.strip() == "cpu":
            print(time.process_time_ns(), flush=True)
    stop()


def _announce(port: int, stop: Callable[[], object]) -> None:
    print(port, flush=True)
    threading.Thread(target=_control, args=(stop,), daemon=True, name="control").start()


def _serve_grpclib(use_uvloop: bool) -> None:
    import asyncio

    from grpclib.server import Server

    from keda_gpu_scaler.serving._proto.externalscaler import (
        ExternalScalerBase,
        GetMetricsRequest,
        GetMetricsResponse,
        MetricValue,
    )

    response = GetMetricsResponse(
        metric_values=[
            MetricValue(
                metric_name=METRIC_NAME,
                metric_value=round(UTILIZATION),
                metric_value_float=UTILIZATION,
            )
        ]
    )

    class Constant(ExternalScalerBase):
        async def get_metrics(self, message: GetMetricsRequest) -> GetMetricsResponse:
            return response

    async def main() -> None:
        server = Server([Constant()])
        await server.start(HOST, 0)
        listener = cast(asyncio.Server, server._server)
        port = int(listener.sockets[0].getsockname()[1])
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        _announce(port, lambda: loop.call_soon_threadsafe(stopped.set))
        await stopped.wait()
        server.close()
        await server.wait_closed()

    if use_uvloop:
        importlib.import_module("uvloop").run(main())
    else:
        asyncio.run(main())


def _serve_product(use_uvloop: bool) -> None:
    import asyncio

    import anyio

    from keda_gpu_scaler.app.logs import configure_logging
    from keda_gpu_scaler.app.scaler.compose import open_scaler
    from keda_gpu_scaler.sources.fake import FakeGpuSource

    async def main() -> None:
        source = FakeGpuSource(1, period_s=0.5)
        source.set(0, gpu_utilization=UTILIZATION)
        async with open_scaler(source, host=HOST, port=0) as running:
            await running.hub.wait_newer(0)
            stopped = asyncio.Event()
            loop = asyncio.get_running_loop()
            _announce(running.port, lambda: loop.call_soon_threadsafe(stopped.set))
            await stopped.wait()

    configure_logging("info")  # as ``keda-gpu-scaler serve`` does by default
    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": use_uvloop})


def _serve_grpcio(pb2_dir: Path) -> None:
    from concurrent import futures

    import grpc

    pb2, pb2_grpc = load_pb2(pb2_dir)
    response = pb2.GetMetricsResponse(
        metricValues=[
            pb2.MetricValue(
                metricName=METRIC_NAME,
                metricValue=round(UTILIZATION),
                metricValueFloat=UTILIZATION,
            )
        ]
    )

    servicer: Any = pb2_grpc.ExternalScalerServicer

    class Constant(servicer):  # type: ignore[misc]
        def GetMetrics(self, request: Any, context: Any) -> Any:  # noqa: N802
            return response

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb2_grpc.add_ExternalScalerServicer_to_server(Constant(), server)
    port = int(server.add_insecure_port(f"{HOST}:0"))
    server.start()
    _announce(port, lambda: server.stop(0))
    server.wait_for_termination()


# -- grpcio code, generated at run time --------------------------------------------------


def generate_pb2(out: Path) -> None:
    from grpc_tools import protoc

    args = [
        "grpc_tools.protoc",
        f"-I{PROTO.parent}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        str(PROTO),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"grpc_tools.protoc failed on {PROTO}")


def load_pb2(directory: Path) -> tuple[ModuleType, ModuleType]:
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    return (
        importlib.import_module("externalscaler_pb2"),
        importlib.import_module("externalscaler_pb2_grpc"),
    )


# -- the client side ---------------------------------------------------------------------


@dataclass
class Target:
    name: str
    process: subprocess.Popen[str]
    port: int
    stub: Any = None
    channel: Any = None
    latencies_ns: list[int] = field(default_factory=list)
    server_cpu_ns: int = 0
    rounds: list[tuple[float, float]] = field(default_factory=list)
    """Per round: median latency (ns) and server CPU per call (ns)."""

    def server_cpu(self) -> int:
        stdin, stdout = _pipes(self.process)
        stdin.write("cpu\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise SystemExit(f"{self.name}: server exited (exit status {self.process.poll()})")
        return int(line)


def _pipes(process: subprocess.Popen[str]) -> tuple[IO[str], IO[str]]:
    assert process.stdin is not None
    assert process.stdout is not None
    return process.stdin, process.stdout


def _spawn(kind: str, pb2_dir: Path, use_uvloop: bool, cpu: int | None) -> subprocess.Popen[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--serve", kind]
    command += ["--pb2-dir", str(pb2_dir)]
    if use_uvloop:
        command.append("--uvloop")
    if cpu is not None:
        command += ["--cpu", str(cpu)]
    return subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )


def _await_port(name: str, process: subprocess.Popen[str]) -> int:
    _, stdout = _pipes(process)
    line = stdout.readline()
    if not line:
        raise SystemExit(f"{name}: server did not start (exit status {process.wait()})")
    return int(line)


def _percentile(sorted_ns: Sequence[int], q: float) -> float:
    """Nearest-rank percentile."""
    rank = max(1, math.ceil(q / 100 * len(sorted_ns)))
    return float(sorted_ns[rank - 1])


@dataclass(frozen=True)
class Figures:
    median_ms: float
    p99_ms: float
    mean_ms: float
    server_cpu_us_per_call: float
    calls: int


def _figures(target: Target) -> Figures:
    ordered = sorted(target.latencies_ns)
    calls = len(ordered)
    return Figures(
        median_ms=statistics.median(ordered) / 1e6,
        p99_ms=_percentile(ordered, 99) / 1e6,
        mean_ms=statistics.fmean(ordered) / 1e6,
        server_cpu_us_per_call=target.server_cpu_ns / calls / 1e3,
        calls=calls,
    )


def _machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions: dict[str, str] = {}
    for package in ("grpcio", "grpclib", "betterproto2", "h2", "anyio", "protobuf", "uvloop"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[package] = importlib.metadata.version(package)
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "packages": versions,
    }


def _plan(calls: int, rounds: int) -> list[int]:
    base, extra = divmod(calls, rounds)
    return [base + (1 if r < extra else 0) for r in range(rounds)]


def _cpus_for_pinning() -> tuple[int, int] | None:
    """(client CPU, server CPU): the first and the last this process may run on."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    return (allowed[0], allowed[-1]) if len(allowed) >= 2 else None


def _run(calls: int, rounds: int, warmup: int, json_path: Path, pin: bool) -> None:
    pinning = _cpus_for_pinning() if pin else None
    if pinning is not None:
        # Before grpc starts its threads, so they inherit it.
        os.sched_setaffinity(0, {pinning[0]})
    import grpc

    kinds: list[tuple[str, str, bool]] = [
        (PRODUCT, "product", False),
        (GRPCLIB, "grpclib", False),
        (GRPCIO, "grpcio", False),
    ]
    if importlib.util.find_spec("uvloop") is not None:
        kinds += [(PRODUCT + UVLOOP, "product", True), (GRPCLIB + UVLOOP, "grpclib", True)]

    with tempfile.TemporaryDirectory(prefix="grpc-latency-") as tmp:
        pb2_dir = Path(tmp)
        generate_pb2(pb2_dir)
        pb2, pb2_grpc = load_pb2(pb2_dir)
        server_cpu = None if pinning is None else pinning[1]
        processes = [(name, _spawn(kind, pb2_dir, uv, server_cpu)) for name, kind, uv in kinds]
        targets: list[Target] = []
        try:
            for name, process in processes:
                targets.append(Target(name, process, _await_port(name, process)))
            request = pb2.GetMetricsRequest(
                scaledObjectRef=pb2.ScaledObjectRef(
                    name="bench", namespace="default", scalerMetadata=METADATA
                ),
                metricName=METRIC_NAME,
            )
            options = [("grpc.enable_http_proxy", 0)]
            for target in targets:
                target.channel = grpc.insecure_channel(f"{HOST}:{target.port}", options=options)
                grpc.channel_ready_future(target.channel).result(timeout=START_TIMEOUT_S)
                target.stub = pb2_grpc.ExternalScalerStub(target.channel)

            # Warm-up, and a check that all servers give the very same answer.
            answers = set()
            for target in targets:
                for _ in range(warmup):
                    reply = target.stub.GetMetrics(request, timeout=CALL_TIMEOUT_S)
                answers.add(reply.SerializeToString())
            if len(answers) != 1:
                raise SystemExit(f"servers disagree on the answer: {answers}")

            perf = time.perf_counter_ns
            for r, per_target in enumerate(_plan(calls, rounds)):
                shift = r % len(targets)
                for target in targets[shift:] + targets[:shift]:
                    call = target.stub.GetMetrics
                    latencies: list[int] = []
                    cpu_before = target.server_cpu()
                    for _ in range(per_target):
                        start = perf()
                        call(request, timeout=CALL_TIMEOUT_S)
                        latencies.append(perf() - start)
                    cpu = target.server_cpu() - cpu_before
                    target.latencies_ns += latencies
                    target.server_cpu_ns += cpu
                    target.rounds.append((statistics.median(latencies), cpu / per_target))
        finally:
            for target in targets:
                if target.channel is not None:
                    target.channel.close()
            for _, process in processes:
                if process.stdin is not None:
                    process.stdin.close()
            for _, process in processes:
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                if process.stdout is not None:
                    process.stdout.close()

    figures = {t.name: _figures(t) for t in targets}
    ratios = _ratios(figures, {t.name: t.rounds for t in targets})
    machine = _machine()
    placement = (
        "client and servers placed by the scheduler"
        if pinning is None
        else f"client pinned to CPU {pinning[0]}, servers to CPU {pinning[1]}"
    )
    plan = f"{calls} calls per server in {rounds} rounds after {warmup} warm-up calls"
    _print(figures, ratios, machine, plan, placement)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "grpc_latency",
        "calls_per_target": calls,
        "rounds": rounds,
        "warmup_per_target": warmup,
        "placement": placement,
        "request_metadata": METADATA,
        "machine": machine,
        "targets": {name: vars(f) for name, f in figures.items()},
        "ratios": ratios,
    }
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    shown = json_path.resolve()
    with contextlib.suppress(ValueError):
        shown = shown.relative_to(Path.cwd())
    print(f"\nwrote {shown}")


def _ratios(
    figures: dict[str, Figures], rounds: dict[str, list[tuple[float, float]]]
) -> dict[str, dict[str, float]]:
    """Ratios of the pooled figures, and the median over rounds of each round's ratio.

    Each round measures every server within a fraction of a second, so the per-round
    ratios shrug off noise that lasts longer than that.
    """
    pairs = [(PRODUCT, GRPCLIB), (PRODUCT, GRPCIO), (GRPCLIB, GRPCIO)]
    if PRODUCT + UVLOOP in figures:
        pairs += [(PRODUCT + UVLOOP, GRPCLIB + UVLOOP), (GRPCLIB + UVLOOP, GRPCLIB)]
    ratios: dict[str, dict[str, float]] = {}
    for top, bottom in pairs:
        a, b = figures[top], figures[bottom]
        per_round = list(zip(rounds[top], rounds[bottom], strict=True))
        ratios[f"{top} / {bottom}"] = {
            "median": a.median_ms / b.median_ms,
            "p99": a.p99_ms / b.p99_ms,
            "server_cpu": a.server_cpu_us_per_call / b.server_cpu_us_per_call,
            "median_by_round": statistics.median(x[0] / y[0] for x, y in per_round),
            "server_cpu_by_round": statistics.median(x[1] / y[1] for x, y in per_round),
        }
    return ratios


def _print(
    figures: dict[str, Figures],
    ratios: dict[str, dict[str, float]],
    machine: dict[str, Any],
    plan: str,
    placement: str,
) -> None:
    packages = ", ".join(f"{k} {v}" for k, v in machine["packages"].items())
    print(f"GetMetrics, grpcio client, {plan}, {placement}")
    print(f"{machine['cpus']} CPUs, {machine['cpu_model']}, Python {machine['python']}")
    print(f"{packages}\n")
    width = max(len(name) for name in figures)
    print(f"{'server':<{width}}  {'median ms':>9}  {'p99 ms':>7}  {'server CPU µs/call':>18}")
    for name, f in figures.items():
        print(
            f"{name:<{width}}  {f.median_ms:>9.3f}  {f.p99_ms:>7.3f}  "
            f"{f.server_cpu_us_per_call:>18.0f}"
        )
    width = max(len(name) for name in ratios)
    print(
        f"\n{'ratio':<{width}}  {'median':>6}  {'p99':>5}  {'server CPU':>10}"
        f"  {'by round: median':>16}  {'server CPU':>10}"
    )
    for name, r in ratios.items():
        print(
            f"{name:<{width}}  {r['median']:>6.2f}  {r['p99']:>5.2f}  {r['server_cpu']:>10.2f}"
            f"  {r['median_by_round']:>16.2f}  {r['server_cpu_by_round']:>10.2f}"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=2000, help="measured calls per server")
    parser.add_argument("--rounds", type=int, default=10, help="round-robin rounds (default 10)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up calls per server")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write figures")
    parser.add_argument("--serve", choices=("product", "grpclib", "grpcio"), help=argparse.SUPPRESS)
    parser.add_argument("--pb2-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--pin",
        action="store_true",
        help="client on the first CPU, servers on the last: steadier medians and ratios, "
        "but a longer p99 tail (the client's grpc threads share one CPU)",
    )
    parser.add_argument("--uvloop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.serve == "product":
        _serve_product(args.uvloop)
    elif args.serve == "grpclib":
        _serve_grpclib(args.uvloop)
    elif args.serve == "grpcio":
        _serve_grpcio(args.pb2_dir)
    else:
        if args.calls < 1 or args.rounds < 1 or args.warmup < 1:
            parser.error("--calls, --rounds and --warmup must be at least 1")
        _run(args.calls, min(args.rounds, args.calls), args.warmup, args.json, args.pin)


if __name__ == "__main__":
    main()
