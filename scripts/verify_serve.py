"""End-to-end check of `keda-gpu-scaler serve --source nvml` on a host with an NVIDIA GPU.

Starts the server on loopback, asks it what KEDA would (GetMetricSpec, GetMetrics, IsActive,
StreamIsActive) for a few triggers, compares with `nvidia-smi`, reads /readyz and /metrics,
runs `gpu-metrics`, then sends SIGTERM with streams open and times the exit. Prints a report;
exits non-zero when something that must work did not.

    PYTHONPATH=src python scripts/verify_serve.py [--load-seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from typing import IO, Any

import anyio
from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from keda_gpu_scaler.serving._proto.externalscaler import (
    ExternalScalerStub,
    GetMetricsRequest,
    ScaledObjectRef,
)

TRIGGERS: list[dict[str, str]] = [
    {"profile": "training", "cooldownSeconds": "0"},
    {"profile": "gpu-busy", "cooldownSeconds": "0"},
    {"metricType": "tensor_active", "cooldownSeconds": "0"},
    {"metricType": "memory_used_percent", "cooldownSeconds": "0"},
    {"metricType": "memory_used_mib", "cooldownSeconds": "0"},
    {"metricType": "power_draw", "cooldownSeconds": "0"},
    {"metricType": "temperature", "cooldownSeconds": "0"},
    {"metricType": "pcie_rx_kbps", "cooldownSeconds": "0"},
    {"profile": "distributed-training"},
]
METRICS_PORT, PROBE_PORT = 19090, 18081
LOAD = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + {seconds}
while time.time() < end:
    (a @ a).sum().item()
"""


def _serve(source: str) -> tuple[subprocess.Popen[str], int]:
    command = [
        sys.executable,
        "-m",
        "keda_gpu_scaler",
        "serve",
        "--source",
        source,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--interval",
        "0.5",
        "--metrics-port",
        str(METRICS_PORT),
        "--probe-port",
        str(PROBE_PORT),
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    for line in process.stderr:
        print("server log:", line.rstrip())
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a start-up error is one plain line
        if entry.get("event") == "serving":
            # Keep reading its log, or a full pipe would stall the server.
            threading.Thread(target=_echo, args=(process.stderr,), daemon=True).start()
            return process, int(entry["port"])
    raise SystemExit(f"the server exited: {process.wait()}")


def _echo(stream: IO[str]) -> None:
    for line in stream:
        print("server log:", line.rstrip())


def _nvidia_smi() -> str:
    query = "utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu"
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi not found"
    result = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip()


async def _ask(stub: ExternalScalerStub, metadata: dict[str, str]) -> str:
    ref = ScaledObjectRef(name="verify", namespace="default", scaler_metadata=metadata)
    spec = (await stub.get_metric_spec(ref, timeout=3)).metric_specs[0]
    label = metadata.get("profile") or metadata["metricType"]
    try:
        request = GetMetricsRequest(scaled_object_ref=ref, metric_name=spec.metric_name)
        value = (await stub.get_metrics(request, timeout=3)).metric_values[0]
        active = (await stub.is_active(ref, timeout=3)).result
    except GRPCError as exc:
        return f"{label:<22} target {spec.target_size_float:>8g}  {exc.status.name}: {exc.message}"
    return (
        f"{label:<22} target {spec.target_size_float:>8g}  value {value.metric_value_float:>12.2f}"
        f" (int {value.metric_value})  active {active}"
    )


async def _streams(
    stub: ExternalScalerStub, count: int, opened: list[float], all_open: anyio.Event
) -> None:
    ref = ScaledObjectRef(name="s", namespace="default", scaler_metadata={"profile": "training"})
    start = time.perf_counter()

    async def one() -> None:
        first = True
        async for _ in stub.stream_is_active(ref):
            if first:
                first = False
                opened.append(time.perf_counter() - start)
                if len(opened) == count:
                    all_open.set()
        # the server ended the stream with status OK

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)


def _get(path: str, port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def _check(port: int, process: subprocess.Popen[str]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    async with Channel("127.0.0.1", port) as channel:
        stub = ExternalScalerStub(channel)
        await anyio.sleep(2)  # a few sampler cycles, PCIe included
        print("\nnvidia-smi:\n" + _nvidia_smi())
        print("\nwhat KEDA gets:")
        for metadata in TRIGGERS:
            print("  " + await _ask(stub, metadata))
        status, body = _get("/readyz", PROBE_PORT)
        print(f"\n/readyz: {status} {body.strip()}")
        report["ready"] = status == 200
        metrics = _get("/metrics", METRICS_PORT)[1].splitlines()
        gpu_lines = [m for m in metrics if m.startswith("keda_gpu_scaler_gpu_")]
        print("/metrics (GPU series):\n  " + "\n  ".join(gpu_lines[:14]))
        report["metrics"] = bool(gpu_lines)
        opened: list[float] = []
        all_open = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_streams, stub, 200, opened, all_open)
            with anyio.fail_after(10):
                await all_open.wait()
            print(
                f"\n200 StreamIsActive on one connection: all answered, slowest first "
                f"message {max(opened) * 1000:.0f} ms"
            )
            sent = time.perf_counter()
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(10):
                code = await anyio.to_thread.run_sync(process.wait)
            report["sigterm_s"] = time.perf_counter() - sent
            report["exit"] = code
        print(
            f"SIGTERM with 200 open streams: exit {code} after {report['sigterm_s']:.2f} s, "
            "every stream ended cleanly"
        )
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-seconds", type=float, default=20.0)
    parser.add_argument("--source", default="nvml", help="nvml, or replay for a dry run")
    args = parser.parse_args()
    load = None
    if args.load_seconds > 0:
        load = subprocess.Popen([sys.executable, "-c", LOAD.format(seconds=args.load_seconds)])
        time.sleep(4)  # let the load reach the GPU
    process, port = _serve(args.source)
    try:
        report = anyio.run(_check, port, process, backend="asyncio")
    finally:
        if process.poll() is None:
            process.kill()
    print("\ngpu-metrics --format jsonl --count 2 --interval 0.5:")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from keda_gpu_scaler.app.gpu_metrics.command import main; raise SystemExit(main())",
            "--format",
            "jsonl",
            "--interval",
            "0.5",
            "--count",
            "2",
            "--source",
            args.source,
        ],
        capture_output=True,
        text=True,
        check=False,
        env=os.environ,
    )
    print(result.stdout.strip() or result.stderr.strip())
    print("\ngpu-metrics (table):")
    table = subprocess.run(
        [
            sys.executable,
            "-c",
            "from keda_gpu_scaler.app.gpu_metrics.command import main; raise SystemExit(main())",
            "--source",
            args.source,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    print(table.stdout.strip() or table.stderr.strip())
    if load is not None:
        load.kill()
    ok = (
        report["ready"]
        and report["metrics"]
        and report["exit"] == 0
        and report["sigterm_s"] < 2
        and result.returncode == 0
    )
    print("\nresult:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
