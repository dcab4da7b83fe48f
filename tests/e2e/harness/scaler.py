"""The product as it is deployed: ``keda-gpu-scaler serve`` in a process of its own, and a
grpcio client of KEDA's contract to ask it what KEDA would."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from keda_gpu_scaler.sources.kubelet._proto.v1 import PodResources
from tests.e2e.harness.chart import Release
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.processes import HarnessError, Process, wait_for
from tests.fake_kubelet import FakeKubelet
from tests.grpcio_client import GrpcioModules, generate

SCALER = Path(sys.executable).with_name("keda-gpu-scaler")


@dataclass(frozen=True)
class Ports:
    grpc: int = 6000
    metrics: int = 9090
    probes: int = 8081


def start_scaler(
    name: str,
    args: Sequence[str],
    *,
    logs: Path,
    host: str = "127.0.0.1",
    ports: Ports = Ports(),
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 60.0,
    wait_ready: bool = True,
) -> Process:
    """``keda-gpu-scaler serve`` on ``host``; ready once its /readyz answers 200."""
    argv = [
        str(SCALER),
        "serve",
        f"--host={host}",
        f"--port={ports.grpc}",
        f"--metrics-port={ports.metrics}",
        f"--probe-port={ports.probes}",
        *args,
    ]
    process = Process(name, argv, log=logs / f"{name}.log", env=env).start()
    if wait_ready:
        process.wait_ready(
            lambda: http_status(f"http://{host}:{ports.probes}/readyz") == 200,
            timeout_s=ready_timeout_s,
        )
    return process


def not_json(log: Path) -> list[str]:
    """The lines of a scaler's log that are not JSON objects (the harness's own ``---``
    lines aside): the product promises one JSON object per line on standard error."""
    bad = []
    for line in log.read_text(errors="replace").splitlines():
        if not line.strip() or line.startswith("--- "):
            continue
        try:
            json.loads(line)
        except ValueError:
            bad.append(line)
    return bad


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """One sample of a Prometheus text exposition, by name and labels (a subset)."""
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


class ScalerClient:
    """KEDA's four calls over grpcio, synchronously: what the scenarios ask the scaler."""

    def __init__(self, modules: GrpcioModules, address: str) -> None:
        self._mods = modules
        self._channel = grpc.insecure_channel(address)
        self._stub = modules.pb2_grpc.ExternalScalerStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def ref(
        self, metadata: Mapping[str, str], *, name: str = "so", namespace: str = "default"
    ) -> Any:
        return self._mods.pb2.ScaledObjectRef(
            name=name, namespace=namespace, scalerMetadata=dict(metadata)
        )

    def metric(self, metadata: Mapping[str, str], *, namespace: str = "default") -> float:
        """GetMetricSpec then GetMetrics; raises grpc.RpcError with the scaler's status."""
        ref = self.ref(metadata, namespace=namespace)
        spec = self._stub.GetMetricSpec(ref, timeout=5)
        name = spec.metricSpecs[0].metricName
        request = self._mods.pb2.GetMetricsRequest(scaledObjectRef=ref, metricName=name)
        answer = self._stub.GetMetrics(request, timeout=5)
        return float(answer.metricValues[0].metricValueFloat)

    def outcome(self, metadata: Mapping[str, str], *, namespace: str = "default") -> str | float:
        """The metric's value, or the name of the gRPC status it failed with."""
        try:
            return self.metric(metadata, namespace=namespace)
        except grpc.RpcError as exc:
            return str(exc.code().name)

    def await_outcome(
        self,
        metadata: Mapping[str, str],
        expected: str | float,
        *,
        namespace: str = "default",
        timeout_s: float,
        every_s: float = 0.05,
    ) -> float:
        """Seconds until :meth:`outcome` is ``expected``; an AssertionError past
        ``timeout_s``, with the last answers seen."""
        began = time.monotonic()
        seen: list[str | float] = []

        def answered() -> bool:
            seen.append(self.outcome(metadata, namespace=namespace))
            return seen[-1] == expected

        try:
            wait_for(
                f"{dict(metadata)} answering {expected}",
                answered,
                timeout_s=timeout_s,
                every_s=every_s,
            )
        except HarnessError as exc:
            raise AssertionError(f"{exc}; last answers {seen[-5:]}") from exc
        return time.monotonic() - began

    def details(self, metadata: Mapping[str, str], *, namespace: str = "default") -> str:
        try:
            self.metric(metadata, namespace=namespace)
        except grpc.RpcError as exc:
            return str(exc.details())
        return ""


@dataclass
class Scaler:
    """A product process and a client of its gRPC port."""

    process: Process
    client: ScalerClient


@dataclass
class NodeAgent(Scaler):
    kubelet: KubeletSocket
    """The fake kubelet whose PodResources socket the agent reads."""


def account_of(release: Release, kind: str = "DaemonSet") -> str:
    """The ServiceAccount the release's DaemonSet (or Deployment) runs its pods with."""
    return str(release.find(kind)["spec"]["template"]["spec"]["serviceAccountName"])


@contextmanager
def node_agent(
    plane: ControlPlane,
    name: str,
    *,
    release: Release,
    node: str,
    trace: Path,
    ports: Ports,
    modules: GrpcioModules,
    folder: Path,
) -> Iterator[NodeAgent]:
    """A node agent as the chart runs one: its ServiceAccount's token, its node's name, the
    (fake) kubelet's PodResources socket, readings replayed from ``trace``. Its log must be
    JSON lines throughout."""
    kubeconfig = plane.kubeconfig_for(
        release.namespace, account_of(release), folder / f"{name}.kubeconfig"
    )
    socket = Path(f"/tmp/e2e-{name}-{os.getpid()}.sock")  # short: a unix socket path
    with KubeletSocket(socket) as kubelet:
        args = [
            f"--source=replay:{trace}",
            f"--pod-resources-socket={socket}",
            "--pod-resources-interval=1",
            f"--node-name={node}",
        ]
        env = dict(os.environ) | {"KUBECONFIG": str(kubeconfig)}
        process = start_scaler(name, args, logs=plane.paths.logs, ports=ports, env=env)
        client = ScalerClient(modules, f"127.0.0.1:{ports.grpc}")
        try:
            yield NodeAgent(process, client, kubelet)
        finally:
            client.close()
            process.stop()
    assert not_json(process.log) == []


@contextmanager
def cluster_scaler(
    plane: ControlPlane,
    name: str,
    *,
    release: Release,
    ports: Ports,
    modules: GrpcioModules,
    folder: Path,
) -> Iterator[Scaler]:
    """A cluster scaler as the chart's Deployment runs one: its ServiceAccount's token, the
    agents found through the release's ``-agents`` Service. Not waited for: without agents it
    is not ready."""
    kubeconfig = plane.kubeconfig_for(
        release.namespace, account_of(release, "Deployment"), folder / f"{name}.kubeconfig"
    )
    service = f"{release.find('DaemonSet')['metadata']['name']}-agents"
    args = [
        "--source=agents",
        f"--agents=endpoints:{release.namespace}/{service}:grpc",
        "--pod-resources-socket=",
    ]
    env = dict(os.environ) | {"KUBECONFIG": str(kubeconfig)}
    process = start_scaler(
        name, args, logs=plane.paths.logs, ports=ports, env=env, wait_ready=False
    )
    client = ScalerClient(modules, f"127.0.0.1:{ports.grpc}")
    try:
        yield Scaler(process, client)
    finally:
        client.close()
        process.stop()
    assert not_json(process.log) == []


def grpcio_modules(folder: Path) -> GrpcioModules:
    folder.mkdir(parents=True, exist_ok=True)
    return generate(folder)


class KubeletSocket:
    """The fake PodResources server (tests/fake_kubelet.py) on a thread with its own loop."""

    def __init__(self, socket_path: Path) -> None:
        self.fake = FakeKubelet(str(socket_path))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fake-kubelet", daemon=True
        )

    def __enter__(self) -> KubeletSocket:
        self._thread.start()
        self._call(self.fake.start())
        return self

    def __exit__(self, *_: object) -> None:
        self._call(self.fake.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _call(self, coroutine: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(30)

    def set_pods(self, pods: Iterable[PodResources]) -> None:
        listed = list(pods)
        self._loop.call_soon_threadsafe(self.fake.set_pods, listed)


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
