"""A cluster scaler over three real node agents whose GPUs are shared by two workloads,
called by grpcio: each workload's share comes from its own pods' processes, read on each
node by the real NVML sampler (fake NVML, a fake host /proc per node) and sent in the node
update.

    node-a  GPU 0 time-sliced by chat-0 and batch-0; GPU 1 train-0's alone
    node-b  GPU 0 time-sliced by chat-1 and batch-1
    node-c  MIG instance 0:7 time-sliced by chat-2 and batch-2 (no per-process utilization)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest

from keda_gpu_scaler.app.scaler.compose import AgentsSource, RunningScaler, build_cluster_pods
from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.samples import AgentTarget, DeviceHolder
from keda_gpu_scaler.sources.agents import AgentLink, StaticDiscovery
from keda_gpu_scaler.sources.nvml.backend import GpmMetric, Utilization
from keda_gpu_scaler.sources.nvml.fake_backend import FakeNvml, enable_mig, h200_gpu, mig_instances
from keda_gpu_scaler.sources.nvml.fake_processes import FakeProcess
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler
from keda_gpu_scaler.testing import inline
from tests.fake_agent import FakeAttribution, holder
from tests.fake_kube_api import open_fake_kube_api, write_kubeconfig
from tests.fake_proc import FakeProc, pod_cgroup
from tests.grpcio_client import GrpcioModules
from tests.loopback import loopback_scaler

pytestmark = pytest.mark.anyio

FAST = Backoff(initial_s=0.05, factor=2.0, maximum_s=0.2)
GIB = 1 << 30
NODES = ("node-a", "node-b", "node-c")


def _uid(pod: str) -> str:
    number = int(pod.split("-")[-1]) + 10 * ("batch" in pod) + 20 * ("train" in pod)
    return f"00000000-0000-4000-8000-{number:012d}"


@dataclass(frozen=True)
class _Process:
    pod: str
    pid: int
    sm: int
    memory_gib: int


# The processes on each node's shared device (GPU 0, or node-c's MIG instance 0:7).
PROCESSES = {
    "node-a": (_Process("chat-0", 101, 70, 20), _Process("batch-0", 102, 10, 6)),
    "node-b": (_Process("chat-1", 201, 30, 8), _Process("batch-1", 202, 40, 12)),
    "node-c": (_Process("chat-2", 301, 25, 3), _Process("batch-2", 302, 25, 5)),
}


def _nvml(node: str) -> FakeNvml:
    gpus = [h200_gpu(0), h200_gpu(1)]
    processes = [FakeProcess(p.pid, p.memory_gib * GIB, sm=p.sm) for p in PROCESSES[node]]
    if node == "node-c":
        instances = mig_instances(0, 1)
        instances[0].gpm = {GpmMetric.SM_UTIL: 61.0}
        instances[0].processes = processes
        enable_mig(gpus[0], instances)
    else:
        gpus[0].utilization = Utilization(95, 0)
        gpus[0].processes = processes
    gpus[1].utilization = Utilization(50, 0)
    return FakeNvml(gpus)


def _holders(node: str, nvml: FakeNvml) -> list[DeviceHolder]:
    gpu = nvml.gpus[0]
    shared = gpu.instances[0].uuid if gpu.mig_enabled else gpu.uuid
    held = [
        holder(p.pod, f"{shared}::{n}", namespace="serve") for n, p in enumerate(PROCESSES[node])
    ]
    if node == "node-a":
        held.append(holder("train-0", nvml.gpus[1].uuid, namespace="serve"))
    return held


@asynccontextmanager
async def _agent(node: str, tmp_path: Path) -> AsyncIterator[RunningScaler]:
    nvml = _nvml(node)
    proc = FakeProc(tmp_path / node / "proc")
    for p in PROCESSES[node]:
        proc.add(p.pid, pod_cgroup(_uid(p.pod), f"{p.pid:064x}"))
    source = NvmlSampler(
        nvml,
        interval_s=0.1,
        process_interval_s=0.2,
        pcie_interval_s=None,
        process_owners=proc.host,
        call_in_thread=inline,
    )
    attribution = FakeAttribution(_holders(node, nvml), period_s=0.2)
    async with loopback_scaler(source, node_name=node, samplers=[attribution]) as agent:
        yield agent


@dataclass
class Cluster:
    scaler: RunningScaler
    mods: GrpcioModules

    async def value(self, **metadata: str) -> float:
        answer = await anyio.to_thread.run_sync(partial(self._call, metadata))
        (value,) = answer.metricValues
        return float(value.metricValueFloat)

    async def unavailable(self, **metadata: str) -> str:
        with pytest.raises(grpc.RpcError) as caught:
            await self.value(**metadata)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()
        return str(caught.value.details())

    def _call(self, metadata: dict[str, str]) -> Any:
        ref = self.mods.pb2.ScaledObjectRef(
            name="so", namespace="serve", scalerMetadata={"cooldownSeconds": "0", **metadata}
        )
        request = self.mods.pb2.GetMetricsRequest(scaledObjectRef=ref)
        with grpc.insecure_channel(f"127.0.0.1:{self.scaler.port}") as channel:
            return self.mods.pb2_grpc.ExternalScalerStub(channel).GetMetrics(request, timeout=5)


def _whole(scaler: RunningScaler) -> bool:
    snapshot = scaler.hub.current
    with_processes = [d for d in snapshot.devices.values() if d.processes is not None]
    gpm = [d for d in snapshot.devices.values() if d.reading and d.reading.sm_active is not None]
    return (
        len(with_processes) == 6  # two a node; node-c's MIG instance, not its MIG GPU
        and len(gpm) == 7  # GPM needs two cycles
        and len(snapshot.node_attributions) == 3
        and snapshot.pods is not None
        and len(snapshot.pods.pods) == 7
    )


@pytest.fixture
async def cluster(tmp_path: Path, grpcio_modules: GrpcioModules) -> AsyncIterator[Cluster]:
    async with (
        open_fake_kube_api() as api,
        _agent("node-a", tmp_path) as a,
        _agent("node-b", tmp_path) as b,
        _agent("node-c", tmp_path) as c,
    ):
        for node in NODES:
            for p in PROCESSES[node]:
                app = p.pod.split("-")[0]
                api.add_pod("serve", p.pod, node=node, labels={"app": app}, uid=_uid(p.pod))
        api.add_pod("serve", "train-0", node="node-a", labels={"app": "train"}, uid=_uid("train-0"))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        targets = [AgentTarget(host="127.0.0.1", port=agent.port) for agent in (a, b, c)]
        source = AgentsSource(
            StaticDiscovery(targets),
            lambda t, gate: AgentLink(t, backoff=FAST, min_idle_s=0.5, gate=gate),
        )
        pods = build_cluster_pods(kubeconfig=str(kubeconfig))
        async with loopback_scaler(source, samplers=pods) as scaler:
            with anyio.fail_after(10):
                while not _whole(scaler):
                    await scaler.hub.wait_newer(scaler.hub.current.version)
            yield Cluster(scaler, grpcio_modules)


async def test_each_workload_gets_its_own_share_of_the_gpus_it_shares_on_every_node(
    cluster: Cluster,
) -> None:
    # Memory: each workload's processes on all three nodes, summed.
    memory = {"metricType": "memory_used_mib", "aggregation": "sum"}
    assert await cluster.value(podSelector="app=chat", **memory) == (20 + 8 + 3) * 1024
    assert await cluster.value(podSelector="app=batch", **memory) == (6 + 12 + 5) * 1024
    # Utilization, node by node: its own processes, never the GPU's 95.
    assert await cluster.value(podSelector="app=chat", nodeName="node-a") == 70.0
    assert await cluster.value(podSelector="app=batch", nodeName="node-a") == 10.0
    assert await cluster.value(podSelector="app=chat", nodeName="node-b") == 30.0
    assert await cluster.value(podSelector="app=batch", nodeName="node-b") == 40.0
    # An exclusive GPU is measured whole, as before.
    assert await cluster.value(podSelector="app=train") == 50.0


async def test_a_shared_mig_instance_on_one_node_makes_the_trigger_unavailable_unless_whole(
    cluster: Cluster,
) -> None:
    why = await cluster.unavailable(podSelector="app=chat")
    assert why.startswith("node-c MIG 0:7 is shared with serve/batch-2, and NVML gives no")
    assert "sharedDevices: whole" in why
    # Whole: node-c's instance by its own GPM reading; nodes a and b's GPUs whole too.
    whole = {"metricType": "sm_active", "sharedDevices": "whole", "nodeName": "node-c"}
    assert await cluster.value(podSelector="app=chat", **whole) == 61.0
    assert await cluster.value(podSelector="app=chat", sharedDevices="whole") == 95.0
