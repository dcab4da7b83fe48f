"""Cluster scaler at scale: one cluster scaler fed by 10, 100 or 1000 simulated node agents.

The cluster scaler runs as ``keda-gpu-scaler serve --source agents --agents static:...`` in a
process of its own (``--pod-resources-socket ""``, no HTTP ports), so its CPU share and RSS are
its own. The agents are simulated in one load-generator process (this script with
``--loadgen N``): one grpclib server per agent, each on its own loopback port, serving
``NodeAgent.WatchNode`` with real ``NodeUpdate`` messages made as the real servicer makes them
(its ``device_reading`` and ``attribution_lists``): the identity (sample period 1 s,
heartbeat 1 s), then one ``NodeReadings`` per second with 8 GPUs, and an attribution every
5 s (a kubelet answer; its lists in the stream's first one, ``same_holders`` after). Agents'
ticks are spread over the second. To keep the load generator off the scaler's CPU, a message
is encoded once per 50 ms and sent as bytes by every agent that ticks in that slice (its
readings' ages are up to 50 ms off; the scaler dates them on its own clock anyway).

Attribution: the first 64 agents (all of them when fewer) hold their 8 GPUs in one pod each,
``bench/work-<i>``, labelled ``app=bench-work``; a minimal Kubernetes API in this process
(list and watch of the pods of all namespaces or of one, enough for the cluster pod watch)
serves those pods, reached through a kubeconfig in a temporary directory.

Per agent count, printed side by side and written as JSON:

- **cpu**: the scaler's utime+stime from ``/proc/<pid>/stat`` over ``--seconds`` of steady
  state (every agent streaming, no KEDA call), as a share of one core; **rss** at the end;
- **GetMetrics** median and p99 of sequential grpcio calls with ``podSelector: app=bench-work``
  (512 devices at 64 agents or more), and of calls with no selector (every device);
- **reaction**: one agent's utilization flipped between 10 % and 90 % across a StreamIsActive
  trigger's ``activationThreshold`` (50, ``nodeName`` that agent, no cooldown); reaction is the
  arrival of the stream's message with the new activity at a grpcio client minus the
  ``time.monotonic()`` at which the agent sent the sample (both processes share the clock).
  The sample goes out at the agent's next tick, up to one sample period after the flip; that
  wait is not counted.
- **gc**: the scaler's garbage collections from the start of steady state to the end of the
  GetMetrics calls, per generation (count, median and longest pause, wall-clock, so a pause
  includes any time the process was not scheduled), recorded by a ``gc.callbacks`` probe
  this script puts on the scaler's ``PYTHONPATH`` as ``sitecustomize``.

Before any agent count, **floor**: the same GetMetrics calls (300, 10 ms apart) against the
constant grpclib and grpcio servers of ``grpc_latency.py`` (a prebuilt response, no scaler,
no agents): what this machine and the gRPC stack give before the scaler does any work.

Usage: python benchmarks/cluster_scale.py [--agents 10,100,1000] [--seconds 20] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grpc_latency import METRIC_NAME, _await_port, _spawn, generate_pb2, load_pb2
from soak import percentile, write_json

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "cluster_scale.json"
HOST = "127.0.0.1"
GPUS = 8
WORKLOAD_AGENTS = 64
WORKLOAD = "bench-work"
NAMESPACE = "bench"
PERIOD_S = 1.0
ATTRIBUTION_EVERY = 5
SLICE_S = 0.05
THRESHOLD = 50.0
HIGH, LOW, BASE, WORK = 90.0, 10.0, 30.0, 40.0


def node_name(i: int) -> str:
    return f"node-{i:04d}"


def gpu_uuid(g: int) -> str:
    return f"GPU-bench-{g:04d}"


# -- the load generator (simulated agents) ------------------------------------------------


class _Agents:
    """N simulated node agents in this process, one grpclib server each."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.flip_value: float | None = None
        self.flip_sent: asyncio.Future[float] | None = None
        self._cache: dict[tuple[int, str], bytes] = {}

    def _readings(self, value: float, attribution: Any | None) -> bytes:
        from keda_gpu_scaler._proto_agent.kedagpuscaler.v1 import NodeReadings, NodeUpdate
        from keda_gpu_scaler.domain.samples import DeviceKey, GpuReading
        from keda_gpu_scaler.serving.node_agent import device_reading

        now = time.monotonic()
        devices = [
            device_reading(
                GpuReading(
                    source="nvml",
                    key=DeviceKey(gpu_uuid(g)),
                    index=g,
                    uuid=gpu_uuid(g),
                    name="NVIDIA H200",
                    taken_at=now,
                    period_s=PERIOD_S,
                    gpu_utilization=value,
                    memory_utilization=20.0,
                    memory_used_bytes=40 << 30,
                    memory_total_bytes=141 << 30,
                    temperature_c=45.0,
                    power_mw=400_000.0,
                    power_limit_mw=700_000.0,
                    sm_clock_mhz=1980.0,
                ),
                now,
            )
            for g in range(GPUS)
        ]
        return bytes(NodeUpdate(readings=NodeReadings(devices=devices, attribution=attribution)))

    def _attribution(self, i: int, first: bool) -> Any:
        from keda_gpu_scaler._proto_agent.kedagpuscaler.v1 import Attribution
        from keda_gpu_scaler.domain.samples import (
            POD_RESOURCES_SOURCE,
            DeviceHolder,
            PodResourcesReading,
        )
        from keda_gpu_scaler.serving.node_agent import attribution_lists

        holders = (
            tuple(
                DeviceHolder(
                    namespace=NAMESPACE,
                    pod=f"work-{i}",
                    container="main",
                    resource="nvidia.com/gpu",
                    device_id=gpu_uuid(g),
                )
                for g in range(GPUS)
            )
            if i < WORKLOAD_AGENTS
            else ()
        )
        reading = PodResourcesReading(
            source=POD_RESOURCES_SOURCE,
            taken_at=0.0,
            period_s=PERIOD_S * ATTRIBUTION_EVERY,
            holders=holders,
        )
        lists: tuple[list[Any], list[Any]] = attribution_lists(reading) if first else ([], [])
        return Attribution(
            age_s=0.0,
            period_s=reading.period_s,
            same_holders=not first,
            holders=lists[0],
            dra=lists[1],
        )

    def message(self, i: int, tick: int, first: bool) -> bytes:
        value = WORK if i < WORKLOAD_AGENTS else BASE
        if i == self.count - 1 and self.flip_value is not None:
            value = self.flip_value
        with_attribution = first or tick % ATTRIBUTION_EVERY == 0
        if first:
            return self._readings(value, self._attribution(i, True))
        kind = f"{value}:{with_attribution}"
        key = (int(time.monotonic() / SLICE_S), kind)
        cached = self._cache.get(key)
        if cached is None:
            if len(self._cache) > 64:
                self._cache.clear()
            attribution = self._attribution(i, False) if with_attribution else None
            cached = self._cache[key] = self._readings(value, attribution)
        return cached

    def identity(self, i: int) -> bytes:
        from keda_gpu_scaler._proto_agent.kedagpuscaler.v1 import NodeIdentity, NodeUpdate

        ident = NodeIdentity(
            node_name=node_name(i),
            agent_version="bench",
            sample_period_s=PERIOD_S,
            heartbeat_s=PERIOD_S,
        )
        return bytes(NodeUpdate(identity=ident))

    def handler(self, i: int) -> Any:
        from grpclib.const import Cardinality, Handler

        agents = self

        class Watch:
            async def watch(self, stream: Any) -> None:
                await stream.recv_message()
                await stream.send_message(agents.identity(i))
                loop = asyncio.get_running_loop()
                due = loop.time() + PERIOD_S * i / agents.count
                tick, first = 0, True
                while True:
                    await asyncio.sleep(max(0.0, due - loop.time()))
                    flipping = i == agents.count - 1 and agents.flip_sent is not None
                    await stream.send_message(agents.message(i, tick, first))
                    if flipping and agents.flip_sent is not None:
                        if not agents.flip_sent.done():
                            agents.flip_sent.set_result(time.monotonic())
                        agents.flip_sent = None
                    first = False
                    tick += 1
                    due += PERIOD_S

            def __mapping__(self) -> dict[str, Handler]:
                path = "/kedagpuscaler.v1.NodeAgent/WatchNode"
                return {path: Handler(self.watch, Cardinality.UNARY_STREAM, bytes, bytes)}

        return Watch()


class _RawCodec:
    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


async def _loadgen(count: int) -> None:
    from grpclib.server import Server

    agents = _Agents(count)
    ports = []
    servers = []
    for i in range(count):
        server = Server([agents.handler(i)], codec=_RawCodec())  # type: ignore[arg-type]
        await server.start(HOST, 0)
        listener: Any = server._server
        ports.append(int(listener.sockets[0].getsockname()[1]))
        servers.append(server)
    print(",".join(map(str, ports)), flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode():
        words = line.split()
        if words[:1] == ["flip"]:
            agents.flip_sent = loop.create_future()
            agents.flip_value = float(words[1])
            print(await agents.flip_sent, flush=True)
        elif words[:1] == ["cpu"]:
            print(time.process_time(), flush=True)


# -- a minimal Kubernetes API (the pods of every node) -------------------------------------


class KubeApi:
    """``GET /api/v1/pods`` and ``/api/v1/namespaces/<ns>/pods`` (list, and watch held open
    until ``timeoutSeconds``) and the
    discovery documents a client asks for, over HTTP/1.1 on loopback, in a thread."""

    def __init__(self, pods: Sequence[dict[str, Any]]) -> None:
        self.pods = list(pods)
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        threading.Thread(target=self._run, daemon=True, name="kube-api").start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        server = await asyncio.start_server(self._serve, HOST, 0)
        self.port = int(server.sockets[0].getsockname()[1])
        self._loop = asyncio.get_running_loop()
        self._ready.set()
        async with server:
            await server.serve_forever()

    def _document(self, path: str) -> dict[str, Any] | None:
        if path == "/version":
            return {"major": "1", "minor": "31", "gitVersion": "v1.31.0", "platform": "linux"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"]}
        if path == "/api/v1":
            resource = {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod"}
            verbs = {"verbs": ["get", "list", "watch"], "shortNames": ["po"]}
            return {
                "kind": "APIResourceList",
                "groupVersion": "v1",
                "resources": [{**resource, **verbs}],
            }
        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
        namespace = _pods_namespace(path)
        if namespace is not None:
            items = [p for p in self.pods if namespace in ("*", p["metadata"]["namespace"])]
            metadata = {"resourceVersion": "1"}
            return {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items}
        return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from urllib.parse import parse_qs, urlsplit

        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                target = head.split(b" ", 2)[1].decode()
                url = urlsplit(target)
                query = parse_qs(url.query)
                path = url.path.rstrip("/") or "/"
                if _pods_namespace(path) is not None and query.get("watch") == ["true"]:
                    timeout = float(query.get("timeoutSeconds", ["300"])[0])
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n"
                    )
                    await writer.drain()
                    await asyncio.sleep(timeout)
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                    continue
                document = self._document(path)
                status = b"200 OK" if document is not None else b"404 Not Found"
                body = json.dumps(document or {"kind": "Status", "code": 404}).encode()
                writer.write(
                    b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _pods_namespace(path: str) -> str | None:
    """``*`` for ``/api/v1/pods``, the namespace of ``/api/v1/namespaces/<ns>/pods``, else
    None."""
    if path == "/api/v1/pods":
        return "*"
    parts = path.split("/")
    if len(parts) == 6 and parts[1:4] == ["api", "v1", "namespaces"] and parts[5] == "pods":
        return parts[4]
    return None


def _pods(count: int) -> list[dict[str, Any]]:
    return [
        {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": f"work-{i}",
                "namespace": NAMESPACE,
                "uid": f"uid-{i}",
                "resourceVersion": "1",
                "labels": {"app": WORKLOAD},
            },
            "spec": {"nodeName": node_name(i), "containers": [{"name": "main"}]},
            "status": {"phase": "Running"},
        }
        for i in range(min(count, WORKLOAD_AGENTS))
    ]


def _kubeconfig(path: Path, port: int) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "bench", "cluster": {"server": f"http://{HOST}:{port}"}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
        "current-context": "bench",
    }
    path.write_text(json.dumps(config))


# -- the run ------------------------------------------------------------------------------


@dataclass
class Result:
    agents: int
    devices: int = 0
    selected_devices: int = 0
    ready_s: float = math.nan
    """From the scaler's start to every device and the workload answered."""
    cpu_share: float = math.nan
    rss_mb: float = math.nan
    loadgen_cpu_share: float = math.nan
    getmetrics_selector_ms: dict[str, float] = field(default_factory=dict)
    getmetrics_all_ms: dict[str, float] = field(default_factory=dict)
    getmetrics_errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    reaction_ms: dict[str, float] = field(default_factory=dict)
    reaction_missed: int = 0
    gc_pauses: dict[str, dict[str, float]] = field(default_factory=dict)
    """The scaler's garbage collections from steady state to the end of the GetMetrics
    calls, per generation: count, median and max wall ms (a pause includes any time the
    process was not scheduled)."""
    note: str = ""


_GC_PROBE = """
import gc, json, os, time
_out = os.environ.get("CLUSTER_SCALE_GC_OUT")
if _out:
    _log, _start, _dumped = [], [0.0], [0.0]
    def _probe(phase, info):
        now = time.monotonic()
        if phase == "start":
            _start[0] = now
            return
        _log.append((now, info["generation"], (now - _start[0]) * 1e3))
        if now - _dumped[0] > 0.5:
            _dumped[0] = now
            with open(_out + ".tmp", "w") as f:
                json.dump(_log, f)
            os.replace(_out + ".tmp", _out)
    gc.callbacks.append(_probe)
"""


def _gc_probe(workdir: Path) -> Path:
    """A ``sitecustomize`` that records the scaler's collections (``gc.callbacks``), for the
    scaler's PYTHONPATH; it records only where ``CLUSTER_SCALE_GC_OUT`` names a file."""
    folder = workdir / "gcprobe"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(_GC_PROBE)
    return folder


def _gc_summary(path: Path, start: float, end: float) -> dict[str, dict[str, float]]:
    try:
        log = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    pauses: dict[str, list[float]] = {}
    for at, generation, ms in log:
        if start <= at <= end:
            pauses.setdefault(f"gen{generation}", []).append(ms)
    summary = {}
    for generation, values in sorted(pauses.items()):
        values.sort()
        summary[generation] = {
            "n": len(values),
            "median_ms": round(values[len(values) // 2], 2),
            "max_ms": round(values[-1], 2),
        }
    return summary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(percentile(values, 50) * 1000, 3),
        "p99": round(percentile(values, 99) * 1000, 3),
        "max": round(max(values, default=math.nan) * 1000, 3),
        "n": len(values),
    }


CALLS = 300
CALL_GAP_S = 0.01


def _timed_calls(stub: Any, request: Any, seconds: float, result: Result) -> list[float]:
    """Up to ``CALLS`` sequential GetMetrics calls, ``CALL_GAP_S`` apart, for ``seconds`` at
    most: their latencies (s); a failed call is counted in ``result``."""
    import grpc

    latencies: list[float] = []
    ends = time.monotonic() + seconds
    while len(latencies) < CALLS and time.monotonic() < ends:
        before = time.perf_counter()
        try:
            stub.GetMetrics(request, timeout=5)
            latencies.append(time.perf_counter() - before)
        except grpc.RpcError as error:
            result.getmetrics_errors += 1
            if len(result.error_samples) < 3:
                result.error_samples.append(f"{error.code()}: {error.details()}"[:300])
        time.sleep(CALL_GAP_S)
    return latencies


def floor(pb2_dir: Path, seconds: float) -> dict[str, dict[str, float]]:
    """The same GetMetrics calls against servers that answer a prebuilt response at once
    (``grpc_latency.py``'s grpclib and grpcio servers), with no agent and no scaler running:
    what this machine and the gRPC stack give before the scaler does any work."""
    import grpc

    pb2, pb2_grpc = load_pb2(pb2_dir)
    ref = pb2.ScaledObjectRef(name="so", namespace=NAMESPACE, scalerMetadata={"x": "y"})
    request = pb2.GetMetricsRequest(scaledObjectRef=ref, metricName=METRIC_NAME)
    figures: dict[str, dict[str, float]] = {}
    for kind in ("grpclib", "grpcio"):
        server = _spawn(kind, pb2_dir, use_uvloop=False, cpu=None)
        try:
            port = _await_port(kind, server)
            with grpc.insecure_channel(f"{HOST}:{port}") as channel:
                stub = pb2_grpc.ExternalScalerStub(channel)
                for _ in range(50):  # warm up
                    stub.GetMetrics(request, timeout=5)
                failed = Result(0)
                figures[kind] = _summary(_timed_calls(stub, request, seconds, failed))
                if failed.getmetrics_errors:
                    raise SystemExit(f"floor: the {kind} server failed: {failed.error_samples}")
        finally:
            server.stdin.close()  # type: ignore[union-attr]
            server.wait(10)
    return figures


def run_one(count: int, seconds: float, pb2_dir: Path, workdir: Path) -> Result:
    import grpc

    pb2, pb2_grpc = load_pb2(pb2_dir)
    result = Result(count)
    api = KubeApi(_pods(count))
    kubeconfig = workdir / f"kubeconfig-{count}"
    _kubeconfig(kubeconfig, api.port)
    loadgen = subprocess.Popen(
        [sys.executable, __file__, "--loadgen", str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    to_loadgen, from_loadgen = loadgen.stdin, loadgen.stdout
    if to_loadgen is None or from_loadgen is None:
        raise SystemExit("the load generator's pipes did not open")

    def ask(line: str) -> str:
        to_loadgen.write(line + "\n")
        to_loadgen.flush()
        return from_loadgen.readline().strip()

    ports = from_loadgen.readline().strip().split(",")
    port = _free_port()
    gc_out = workdir / f"gc-{count}.json"
    path = os.pathsep.join(p for p in (str(_gc_probe(workdir)), os.environ.get("PYTHONPATH")) if p)
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PYTHONPATH": path,
        "CLUSTER_SCALE_GC_OUT": str(gc_out),
    }
    log = (workdir / f"scaler-{count}.log").open("w")
    started = time.monotonic()
    scaler = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "keda-gpu-scaler"),
            "serve",
            "--source",
            "agents",
            "--agents",
            "static:" + ",".join(f"{HOST}:{p}" for p in ports),
            "--pod-resources-socket",
            "",
            "--host",
            HOST,
            "--port",
            str(port),
            "--metrics-port",
            "0",
            "--probe-port",
            "0",
            "--log-level",
            "warning",
        ],
        env=env,
        stderr=log,
    )
    flip_node = node_name(count - 1)
    try:
        channel = grpc.insecure_channel(f"{HOST}:{port}")
        stub = pb2_grpc.ExternalScalerStub(channel)

        def request(**metadata: str) -> Any:
            ref = pb2.ScaledObjectRef(
                name="so", namespace=NAMESPACE, scalerMetadata={"cooldownSeconds": "0", **metadata}
            )
            return pb2.GetMetricsRequest(scaledObjectRef=ref)

        selected = request(podSelector=f"app={WORKLOAD}", aggregation="avg")
        everything = request(aggregation="avg", minCoverage="1")
        deadline = time.monotonic() + 120
        last = "none"
        while True:
            try:
                value = stub.GetMetrics(everything, timeout=5).metricValues[0].metricValueFloat
                work = stub.GetMetrics(selected, timeout=5).metricValues[0].metricValueFloat
                if abs(work - WORK) < 1e-6 and value > 0:
                    break
            except grpc.RpcError as error:
                last = f"{error.code()}: {error.details()}"
            if time.monotonic() > deadline:
                result.note = f"not whole within 120 s (last answer {last})"
                cpu0, wall0 = _proc_cpu_s(scaler.pid), time.monotonic()
                time.sleep(seconds)
                result.cpu_share = round(
                    (_proc_cpu_s(scaler.pid) - cpu0) / (time.monotonic() - wall0), 4
                )
                result.rss_mb = round(_proc_rss_mb(scaler.pid), 1)
                return result
            time.sleep(0.5)
        result.ready_s = round(time.monotonic() - started, 2)
        print(f"{count} agents: whole after {result.ready_s} s", flush=True)
        result.devices = count * GPUS
        result.selected_devices = min(count, WORKLOAD_AGENTS) * GPUS
        time.sleep(3.0)  # settle after start-up
        cpu0, load0, wall0 = _proc_cpu_s(scaler.pid), float(ask("cpu")), time.monotonic()
        steady_from = wall0
        time.sleep(seconds)
        cpu1, load1, wall1 = _proc_cpu_s(scaler.pid), float(ask("cpu")), time.monotonic()
        result.cpu_share = round((cpu1 - cpu0) / (wall1 - wall0), 4)
        result.loadgen_cpu_share = round((load1 - load0) / (wall1 - wall0), 4)
        result.rss_mb = round(_proc_rss_mb(scaler.pid), 1)
        print(
            f"{count} agents: cpu {result.cpu_share:.3f} core, rss {result.rss_mb} MB", flush=True
        )
        for name, req in (("selector", selected), ("all", everything)):
            latencies = _timed_calls(stub, req, seconds, result)
            if name == "selector":
                result.getmetrics_selector_ms = _summary(latencies)
            else:
                result.getmetrics_all_ms = _summary(latencies)
            print(f"{count} agents: GetMetrics {name} {_summary(latencies)}", flush=True)
        time.sleep(1.0)  # the probe writes its record twice a second
        result.gc_pauses = _gc_summary(gc_out, steady_from, time.monotonic() - 1.0)
        print(f"{count} agents: gc pauses {result.gc_pauses}", flush=True)
        result.reaction_ms, result.reaction_missed = _reaction(pb2, stub, ask, flip_node)
        channel.close()
    finally:
        scaler.terminate()
        try:
            scaler.wait(10)
        except subprocess.TimeoutExpired:
            scaler.kill()
        to_loadgen.close()
        loadgen.terminate()
        loadgen.wait(10)
        log.close()
    return result


def _reaction(pb2: Any, stub: Any, ask: Any, node: str) -> tuple[dict[str, float], int]:
    metadata = {
        "metricType": "gpu_utilization",
        "activationThreshold": str(THRESHOLD),
        "cooldownSeconds": "0",
        "nodeName": node,
    }
    ref = pb2.ScaledObjectRef(name="react", namespace=NAMESPACE, scalerMetadata=metadata)
    arrivals: list[tuple[float, bool]] = []
    call = stub.StreamIsActive(ref)

    def read() -> None:
        try:
            for message in call:
                arrivals.append((time.monotonic(), bool(message.result)))
        except Exception:  # the call cancelled at the end
            pass

    threading.Thread(target=read, daemon=True).start()
    time.sleep(2.0)
    flips: list[tuple[float, bool]] = []
    for n in range(12):
        value = HIGH if n % 2 == 0 else LOW
        sent = float(ask(f"flip {value}"))
        flips.append((sent, value > THRESHOLD))
        time.sleep(1.5)
    call.cancel()
    reactions: list[float] = []
    missed = 0
    for sent, active in flips:
        first = next((t for t, a in arrivals if a is active and sent <= t <= sent + 1.5), None)
        if first is None:
            missed += 1
        else:
            reactions.append(first - sent)
    return _summary(reactions), missed


def _gc(result: Result, generation: str) -> str:
    pause = result.gc_pauses.get(generation)
    if pause is None:
        return "-"
    return f"{pause['n']:.0f} / {pause['median_ms']:.1f} / {pause['max_ms']:.0f} ms"


def _table(results: list[Result]) -> str:
    def ms(d: dict[str, float], key: str) -> str:
        return f"{d[key]:.2f} ms" if key in d else "-"

    rows = [
        ("agents (GPUs)", [f"{r.agents} ({r.devices})" for r in results]),
        ("ready after", [f"{r.ready_s} s" for r in results]),
        ("scaler CPU, share of a core", [f"{r.cpu_share * 100:.1f} %" for r in results]),
        ("scaler RSS", [f"{r.rss_mb} MB" for r in results]),
        ("load generator CPU", [f"{r.loadgen_cpu_share * 100:.1f} %" for r in results]),
        ("selected GPUs (podSelector)", [str(r.selected_devices) for r in results]),
        ("GetMetrics podSelector p50", [ms(r.getmetrics_selector_ms, "median") for r in results]),
        ("GetMetrics podSelector p99", [ms(r.getmetrics_selector_ms, "p99") for r in results]),
        ("GetMetrics all GPUs p50", [ms(r.getmetrics_all_ms, "median") for r in results]),
        ("GetMetrics all GPUs p99", [ms(r.getmetrics_all_ms, "p99") for r in results]),
        ("GetMetrics errors", [str(r.getmetrics_errors) for r in results]),
        ("reaction p50", [ms(r.reaction_ms, "median") for r in results]),
        ("reaction p99", [ms(r.reaction_ms, "p99") for r in results]),
        ("reaction max", [ms(r.reaction_ms, "max") for r in results]),
        ("reaction missed", [str(r.reaction_missed) for r in results]),
        *(
            (f"gc {g} n / median / max", [_gc(r, g) for r in results])
            for g in ("gen0", "gen1", "gen2")
        ),
    ]
    lines = [f"{name:30}" + "".join(f"{v:>20}" for v in values) for name, values in rows]
    lines += [f"note ({r.agents} agents): {r.note}" for r in results if r.note]
    return "\n".join(lines)


def _floor_table(floors: dict[str, dict[str, float]]) -> str:
    lines = ["floor: the same GetMetrics calls to a server answering a prebuilt response"]
    for kind, figures in floors.items():
        lines.append(
            f"  {kind + ' constant server':28} p50 {figures['median']:.2f} ms   "
            f"p99 {figures['p99']:.2f} ms   max {figures['max']:.2f} ms"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="10,100,1000", help="agent counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="steady CPU window")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--loadgen", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loadgen:
        asyncio.run(_loadgen(args.loadgen))
        return
    counts = [int(c) for c in args.agents.split(",")]
    if any(c < 1 for c in counts):
        raise SystemExit(f"--agents: counts must be positive, not {args.agents!r}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        generate_pb2(Path(tmp))
        floors = floor(Path(tmp), args.seconds)
        print(f"floor: {json.dumps(floors)}", flush=True)
        for count in counts:
            result = run_one(count, args.seconds, Path(tmp), Path(tmp))
            print(f"{count} agents: {json.dumps(asdict(result))}", flush=True)
            results.append(result)
    print(_table(results))
    print(_floor_table(floors))
    write_json(args.json, [{"floor": floors}, *(asdict(r) for r in results)])


if __name__ == "__main__":
    main()
