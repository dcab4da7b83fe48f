"""A cluster scaler whose pod watch follows the namespaces triggers name, end to end: a
real node agent on loopback, a local Kubernetes API server, and KEDA's calls by grpcio.

The node agent's GPU 0 (10 %) is held by late/vllm-0, GPU 1 (20 %) by serve/web-0; no
namespace is watched until a trigger names it.
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
from keda_gpu_scaler.domain.samples import AgentTarget, PodsReading
from keda_gpu_scaler.pipeline.podnamespaces import PodNamespaces
from keda_gpu_scaler.sources.agents import AgentLink, StaticDiscovery
from keda_gpu_scaler.sources.fake import FakeGpuSource
from tests.fake_agent import FakeAttribution, holder
from tests.fake_kube_api import FakeKubeApi, open_fake_kube_api, write_kubeconfig
from tests.grpcio_client import GrpcioModules
from tests.loopback import loopback_scaler

pytestmark = pytest.mark.anyio

FAST = Backoff(initial_s=0.05, factor=2.0, maximum_s=0.2)
HOLDERS = [
    holder("vllm-0", "GPU-fake-0000", namespace="late"),
    holder("web-0", "GPU-fake-0001", namespace="serve"),
]


@dataclass
class Cluster:
    api: FakeKubeApi
    scaler: RunningScaler
    namespaces: PodNamespaces


@asynccontextmanager
async def _open_cluster(tmp_path: Path, namespaces: PodNamespaces) -> AsyncIterator[Cluster]:
    gpus = FakeGpuSource(2, period_s=0.2)
    gpus.set(0, gpu_utilization=10.0)
    gpus.set(1, gpu_utilization=20.0)
    attribution = FakeAttribution(HOLDERS, period_s=0.2)
    async with (
        open_fake_kube_api() as api,
        loopback_scaler(gpus, node_name="node-a", samplers=[attribution]) as agent,
    ):
        api.add_pod("late", "vllm-0", node="node-a", labels={"app": "vllm"})
        api.add_pod("serve", "web-0", node="node-a", labels={"app": "web"})
        api.add_pod("forbidden", "x-0", node="node-a", labels={"app": "vllm"})
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        source = AgentsSource(
            StaticDiscovery([AgentTarget(host="127.0.0.1", port=agent.port)]),
            lambda t, gate: AgentLink(t, backoff=FAST, min_idle_s=0.5, gate=gate),
        )
        pods = build_cluster_pods(namespaces, kubeconfig=str(kubeconfig))
        async with loopback_scaler(source, samplers=pods, pod_namespaces=namespaces) as scaler:
            with anyio.fail_after(10):
                while len(scaler.hub.current.node_attributions) < 1:
                    await scaler.hub.wait_newer(scaler.hub.current.version)
            yield Cluster(api, scaler, namespaces)


def _covers(pods: PodsReading | None, namespace: str) -> bool:
    return pods is not None and namespace in (pods.namespaces or ())


def _call(port: int, request: Any, mods: GrpcioModules) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return mods.pb2_grpc.ExternalScalerStub(channel).GetMetrics(request, timeout=5)


async def _value(cluster: Cluster, mods: GrpcioModules, namespace: str, selector: str) -> float:
    ref = mods.pb2.ScaledObjectRef(
        name="so",
        namespace=namespace,
        scalerMetadata={"podSelector": selector, "cooldownSeconds": "0"},
    )
    request = mods.pb2.GetMetricsRequest(scaledObjectRef=ref)
    answer = await anyio.to_thread.run_sync(partial(_call, cluster.scaler.port, request, mods))
    (value,) = answer.metricValues
    return float(value.metricValueFloat)


async def _unavailable(cluster: Cluster, mods: GrpcioModules, namespace: str, selector: str) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        await _value(cluster, mods, namespace, selector)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()
    return str(caught.value.details())


async def test_a_namespace_never_watched_before_is_answered_within_the_wait(
    tmp_path: Path, grpcio_modules: GrpcioModules
) -> None:
    async with _open_cluster(tmp_path, PodNamespaces.triggers()) as cluster:
        assert cluster.api.pod_requests() == []  # no trigger yet: nothing watched
        # The first call names late: its pods are listed while the call waits.
        assert await _value(cluster, grpcio_modules, "late", "app=vllm") == 10.0
        assert await _value(cluster, grpcio_modules, "serve", "app=web") == 20.0
        watched = {r.namespace for r in cluster.api.pod_requests()}
        assert cluster.namespaces.names == frozenset({"late", "serve"})
    assert watched == frozenset({"late", "serve"})


async def test_a_namespace_the_api_never_lists_is_unavailable_never_0(
    tmp_path: Path, grpcio_modules: GrpcioModules
) -> None:
    message = 'pods is forbidden: User "system:serviceaccount:keda:scaler" cannot list "pods"'
    async with _open_cluster(tmp_path, PodNamespaces.triggers()) as cluster:
        cluster.api.fail(403, message, on="list", namespace="forbidden")
        assert await _value(cluster, grpcio_modules, "late", "app=vllm") == 10.0
        details = await _unavailable(cluster, grpcio_modules, "forbidden", "app=vllm")
        # The other namespaces are answered meanwhile, and so is forbidden once it lists.
        assert await _value(cluster, grpcio_modules, "late", "app=vllm") == 10.0
        again = await _unavailable(cluster, grpcio_modules, "forbidden", "app=vllm")
        cluster.api.heal()
        hub = cluster.scaler.hub
        with anyio.fail_after(10):
            while not _covers(hub.current.pods, "forbidden"):
                await hub.wait_newer(hub.current.version)
        # x-0 matches and holds no GPU: 0, now that the namespace's pods are known.
        assert await _value(cluster, grpcio_modules, "forbidden", "app=vllm") == 0.0
    assert details.startswith("pods of namespace forbidden are not watched yet")
    assert again == details


async def test_a_fixed_list_names_the_flag(tmp_path: Path, grpcio_modules: GrpcioModules) -> None:
    async with _open_cluster(tmp_path, PodNamespaces.listed(["serve"])) as cluster:
        with anyio.fail_after(10):
            while cluster.scaler.hub.current.pods is None:
                await cluster.scaler.hub.wait_newer(cluster.scaler.hub.current.version)
        assert await _value(cluster, grpcio_modules, "serve", "app=web") == 20.0
        details = await _unavailable(cluster, grpcio_modules, "late", "app=vllm")
        watched = {r.namespace for r in cluster.api.pod_requests()}
    assert details == "pods of namespace late are not watched: not among --pod-namespaces serve"
    assert watched == {"serve"}
