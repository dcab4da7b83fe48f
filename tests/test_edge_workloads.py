"""One node agent, three workloads: triggers with ``podSelector`` answer each workload's own
value, over Google's grpcio client.

Everything outside is faked at its protocol edge: NVML by the fake backend (4 GPUs and a
MIG GPU), the kubelet by a real grpclib PodResources server on a unix socket, the Kubernetes
API by a local HTTP server speaking list and watch, reached by kr8s through a kubeconfig.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keda_gpu_scaler.app.scaler.compose import AttributionOptions, RunningScaler, build_attribution
from keda_gpu_scaler.sources.nvml.backend import GpmMetric, Utilization
from keda_gpu_scaler.sources.nvml.fake_backend import FakeNvml, enable_mig, h200_gpu, mig_instances
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler
from keda_gpu_scaler.testing import inline
from tests.fake_kube_api import FakeKubeApi, open_fake_kube_api, write_kubeconfig
from tests.fake_kubelet import FakeKubelet, container, fake_kubelet, gpus, mig_mixed, pod, replicas
from tests.grpcio_client import GrpcioModules
from tests.loopback import loopback_scaler

pytestmark = pytest.mark.anyio

NODE = "gpu-node-1"
MIG_PROFILE = "1g.18gb"


def _node() -> FakeNvml:
    """GPUs 0-3 whole, GPU 4 in MIG mode with GPU instances 7 and 8."""
    whole = [h200_gpu(i) for i in range(4)]
    for gpu, (util, sm) in zip(whole, [(90, 85.0), (70, 65.0), (40, 40.0), (5, 5.0)], strict=True):
        gpu.utilization = Utilization(util, 0)
        gpu.gpm = {GpmMetric.SM_UTIL: sm}
    mig = h200_gpu(4)
    instances = mig_instances(4, 2)
    instances[0].gpm = {GpmMetric.SM_UTIL: 25.0}
    instances[1].gpm = {GpmMetric.SM_UTIL: 15.0}
    enable_mig(mig, instances)
    return FakeNvml([*whole, mig])


NVML = _node()
UUID = [gpu.uuid for gpu in NVML.gpus]
MIG_7, MIG_8 = (i.uuid for i in NVML.gpus[4].instances)

KUBELET_PODS = [
    pod("ml", "train-0", containers=[container("trainer", devices=[gpus(UUID[0], UUID[1])])]),
    # GPU 2 is time-sliced between the two vllm pods; vllm-b also has MIG instance 7.
    pod("serve", "vllm-a", containers=[container("engine", devices=[gpus(*replicas(UUID[2], 0))])]),
    pod(
        "serve",
        "vllm-b",
        containers=[
            container(
                "engine",
                devices=[gpus(*replicas(UUID[2], 1)), mig_mixed(MIG_PROFILE, MIG_7)],
            )
        ],
    ),
    pod(
        "lab",
        "notebook",
        containers=[container("jupyter", devices=[gpus(UUID[3]), mig_mixed(MIG_PROFILE, MIG_8)])],
    ),
]


@dataclass
class Cluster:
    scaler: RunningScaler
    kubelet: FakeKubelet
    api: FakeKubeApi


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with (
        fake_kubelet(tmp_path, pods=KUBELET_PODS) as kubelet,
        open_fake_kube_api() as api,
    ):
        api.add_pod("ml", "train-0", node=NODE, labels={"app": "train"})
        api.add_pod("serve", "vllm-a", node=NODE, labels={"app": "vllm", "tier": "web"})
        api.add_pod("serve", "vllm-b", node=NODE, labels={"app": "vllm", "tier": "batch"})
        api.add_pod("lab", "notebook", node=NODE, labels={"app": "jupyter"})
        api.add_pod("serve", "elsewhere", node="gpu-node-2", labels={"app": "vllm"})
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        samplers = build_attribution(
            AttributionOptions(
                socket_path=kubelet.socket_path,
                interval_s=0.2,
                node_name=NODE,
                kubeconfig=str(kubeconfig),
            )
        )
        source = NvmlSampler(NVML, interval_s=0.1, call_in_thread=inline)
        async with loopback_scaler(source, samplers=samplers) as scaler:
            with anyio.fail_after(10):
                while not _ready(scaler):
                    await scaler.hub.wait_newer(scaler.hub.current.version)
            yield Cluster(scaler, kubelet, api)


def _ready(scaler: RunningScaler) -> bool:
    snapshot = scaler.hub.current
    fresh = [d for d in snapshot.devices.values() if d.reading and d.reading.sm_active is not None]
    return snapshot.attribution is not None and snapshot.pods is not None and len(fresh) >= 6


def _call(port: int, method: str, request: Any, mods: GrpcioModules) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = mods.pb2_grpc.ExternalScalerStub(channel)
        return getattr(stub, method)(request, timeout=5)


def _ref(mods: GrpcioModules, namespace: str, metadata: dict[str, str]) -> Any:
    return mods.pb2.ScaledObjectRef(name="so", namespace=namespace, scalerMetadata=metadata)


async def _metrics(
    scaler: RunningScaler, mods: GrpcioModules, namespace: str, metadata: dict[str, str]
) -> float:
    request = mods.pb2.GetMetricsRequest(
        scaledObjectRef=_ref(mods, namespace, {"cooldownSeconds": "0", **metadata})
    )
    answer = await anyio.to_thread.run_sync(
        partial(_call, scaler.port, "GetMetrics", request, mods)
    )
    (value,) = answer.metricValues
    return float(value.metricValueFloat)


async def _active(
    scaler: RunningScaler, mods: GrpcioModules, namespace: str, metadata: dict[str, str]
) -> bool:
    request = _ref(mods, namespace, {"cooldownSeconds": "0", **metadata})
    answer = await anyio.to_thread.run_sync(partial(_call, scaler.port, "IsActive", request, mods))
    return bool(answer.result)


async def _error(
    scaler: RunningScaler, mods: GrpcioModules, method: str, request: Any
) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        await anyio.to_thread.run_sync(partial(_call, scaler.port, method, request, mods))
    return caught.value


async def test_each_workload_gets_its_own_value(
    cluster: Cluster, grpcio_modules: GrpcioModules
) -> None:
    scaler, mods = cluster.scaler, grpcio_modules
    train = {"podSelector": "app=train", "metricType": "gpu_utilization"}
    vllm = {"podSelector": "app=vllm", "metricType": "sm_active"}
    notebook = {"podSelector": "app=jupyter", "metricType": "sm_active", "aggregation": "avg"}
    assert await _metrics(scaler, mods, "ml", train) == 90.0
    # GPU 2 (shared by its two pods, counted once) at 40 and MIG 4:7 at 25.
    assert await _metrics(scaler, mods, "serve", vllm) == 40.0
    assert await _metrics(scaler, mods, "serve", {**vllm, "aggregation": "sum"}) == 65.0
    # GPU 3 at 5 and MIG 4:8 at 15.
    assert await _metrics(scaler, mods, "lab", notebook) == 10.0
    # Without podSelector: every GPU of the node, as before.
    assert await _metrics(scaler, mods, "serve", {"metricType": "gpu_utilization"}) == 90.0
    # podNamespace reaches another namespace's pods.
    other = {**train, "podNamespace": "ml"}
    assert await _metrics(scaler, mods, "serve", other) == 90.0


async def test_no_pod_is_zero_and_inactive(cluster: Cluster, grpcio_modules: GrpcioModules) -> None:
    scaler, mods = cluster.scaler, grpcio_modules
    nobody = {"podSelector": "app=nothing"}
    assert await _metrics(scaler, mods, "serve", nobody) == 0.0
    assert await _active(scaler, mods, "serve", nobody) is False
    # The vllm pod of another node is not this node's business.
    assert await _metrics(scaler, mods, "lab", {"podSelector": "app=vllm"}) == 0.0


async def test_a_label_change_moves_a_pod_out_of_and_into_a_selector(
    cluster: Cluster, grpcio_modules: GrpcioModules
) -> None:
    scaler, mods = cluster.scaler, grpcio_modules
    # GPU 2 is shared across the tiers; this node agent reads no processes: measured whole.
    web = {"podSelector": "app=vllm,tier=web", "metricType": "sm_active", "sharedDevices": "whole"}
    assert await _metrics(scaler, mods, "serve", web) == 40.0
    version = scaler.hub.current.version
    cluster.api.update_pod("serve", "vllm-a", labels={"app": "vllm", "tier": "batch"})
    cluster.api.update_pod("serve", "vllm-b", labels={"app": "vllm", "tier": "web"})
    with anyio.fail_after(5):
        while await _metrics(scaler, mods, "serve", web) != 40.0 or not _moved(scaler):
            await scaler.hub.wait_newer(version)
            version = scaler.hub.current.version
    # vllm-b is now the web tier: GPU 2 (40) and MIG 4:7 (25), summed.
    assert await _metrics(scaler, mods, "serve", {**web, "aggregation": "sum"}) == 65.0


def _moved(scaler: RunningScaler) -> bool:
    pods = scaler.hub.current.pods
    assert pods is not None
    return any(p.name == "vllm-b" and p.labels.get("tier") == "web" for p in pods.pods)


async def test_a_pod_that_goes_away_stops_counting(
    cluster: Cluster, grpcio_modules: GrpcioModules
) -> None:
    scaler, mods = cluster.scaler, grpcio_modules
    train = {"podSelector": "app=train"}
    assert await _metrics(scaler, mods, "ml", train) == 90.0
    cluster.kubelet.set_pods(KUBELET_PODS[1:])
    with anyio.fail_after(5):
        while await _metrics(scaler, mods, "ml", train) != 0.0:
            await scaler.hub.wait_newer(scaler.hub.current.version)


async def test_bad_selectors_are_invalid_argument_on_every_rpc(
    cluster: Cluster, grpcio_modules: GrpcioModules
) -> None:
    scaler, mods = cluster.scaler, grpcio_modules
    for raw in ("", "app in (a", "app=,=x", "!"):
        request = _ref(mods, "serve", {"podSelector": raw})
        for method, message in (
            ("GetMetricSpec", request),
            ("IsActive", request),
            ("GetMetrics", mods.pb2.GetMetricsRequest(scaledObjectRef=request)),
        ):
            error = await _error(scaler, mods, method, message)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (raw, method)
            assert f"invalid podSelector {json.dumps(raw)}" in error.details()


async def test_attribution_down_is_unavailable_with_the_reason_and_recovers(
    cluster: Cluster, grpcio_modules: GrpcioModules
) -> None:
    scaler, mods = cluster.scaler, grpcio_modules
    vllm = {"podSelector": "app=vllm", "metricType": "sm_active"}
    await cluster.kubelet.stop()  # the socket disappears (a kubelet restart)
    with anyio.fail_after(5):
        while True:
            try:
                await _metrics(scaler, mods, "serve", vllm)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE
                assert "pod attribution is stale" in error.details()
                assert "kubelet PodResources List failed" in error.details()
                break
            await anyio.sleep(0.05)
    # A trigger without podSelector is not affected.
    assert await _metrics(scaler, mods, "serve", {"metricType": "gpu_utilization"}) == 90.0
    await cluster.kubelet.start()
    with anyio.fail_after(5):
        while True:
            try:
                assert await _metrics(scaler, mods, "serve", vllm) == 40.0
                break
            except grpc.RpcError:
                await anyio.sleep(0.05)


async def test_the_api_down_makes_labels_unavailable_after_30_s_only(
    cluster: Cluster, grpcio_modules: GrpcioModules
) -> None:
    # 30 s of real time is too long for a test; the rule itself (three 10 s periods) is
    # tested on snapshots. Here: the API going down does not fail triggers at once.
    scaler, mods = cluster.scaler, grpcio_modules
    await cluster.api.take_down()
    assert await _metrics(scaler, mods, "ml", {"podSelector": "app=train"}) == 90.0


async def test_tap_and_metrics_name_the_pods(
    cluster: Cluster, grpcio_modules: GrpcioModules
) -> None:
    scaler = cluster.scaler
    url = f"http://127.0.0.1:{scaler.metrics_port}"
    async with httpx.AsyncClient(base_url=url) as client:
        text = (await client.get("/metrics")).text
        lines = [
            line for line in text.splitlines() if line.startswith("keda_gpu_scaler_gpu_pod_info")
        ]
        assert len(lines) == 7  # one per holder of a device
        assert any(
            f'uuid="{UUID[2]}"' in line and 'pod="vllm-a"' in line and 'namespace="serve"' in line
            for line in lines
        )
        assert any(f'uuid="{MIG_8}"' in line and 'mig_instance="4:8"' in line for line in lines)
        events: list[dict[str, Any]] = []
        with anyio.fail_after(5):
            async with client.stream("GET", "/debug/tap") as response:
                async for line in response.aiter_lines():
                    event = json.loads(line)
                    if event.get("type") == "attribution":
                        events.append(event)
                        break
    (event,) = events
    held = {d["key"]: d for d in event["devices"]}
    assert [h["pod"] for h in held[UUID[2]]["holders"]] == ["vllm-a", "vllm-b"]
    assert held[MIG_7]["label"] == "MIG 4:7"
    assert event["unmatched"] == []


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(raw=st.text(alphabet=st.sampled_from("ab=!,()inotx- "), max_size=16))
async def test_any_selector_is_a_value_or_invalid_argument(
    cluster: Cluster, grpcio_modules: GrpcioModules, raw: str
) -> None:
    scaler, mods = cluster.scaler, grpcio_modules
    request = mods.pb2.GetMetricsRequest(
        scaledObjectRef=_ref(mods, "serve", {"podSelector": raw, "cooldownSeconds": "0"})
    )
    try:
        answer = await anyio.to_thread.run_sync(
            partial(_call, scaler.port, "GetMetrics", request, mods)
        )
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert "podSelector" in error.details()
    else:
        # In "serve", only the vllm pods hold GPUs: GPU 2 at 40 % (MIG instances have no
        # gpu_utilization); any other selection holds none.
        (value,) = answer.metricValues
        assert value.metricValueFloat in (0.0, 40.0)
