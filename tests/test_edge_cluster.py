"""One cluster scaler, three real node agents on loopback, called by grpcio.

Each agent has its own fake GPUs (the same UUIDs on every node: keys carry the node name)
and its own attribution; the cluster scaler links to them (static discovery) and watches
the pods of every node through a local Kubernetes API server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
from anyio.abc import TaskGroup, TaskStatus

from keda_gpu_scaler.app.scaler.compose import AgentsSource, RunningScaler, build_cluster_pods
from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.samples import AgentTarget, DeviceKey, GpuReading
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.state import fold
from keda_gpu_scaler.sources.agents import AgentLink, StaticDiscovery
from keda_gpu_scaler.sources.cadence import every
from keda_gpu_scaler.sources.fake import FakeGpuSource
from tests.fake_agent import (
    FakeAttribution,
    hanging_agent,
    holder,
    identity,
    scripted_agent,
    serve_agent,
)
from tests.fake_kube_api import open_fake_kube_api, write_kubeconfig
from tests.grpcio_client import GrpcioModules, open_streams, watch_node
from tests.loopback import loopback_scaler

pytestmark = pytest.mark.anyio

FAST = Backoff(initial_s=0.05, factor=2.0, maximum_s=0.2)
UTIL = {"node-a": (10.0, 20.0), "node-b": (30.0, 40.0), "node-c": (50.0, 60.0)}
# vllm-0 holds node-a GPU 1, vllm-1 node-b GPU 0, vllm-2 node-c GPU 1; train-0 node-a GPU 0.
HOLDERS = {
    "node-a": [
        holder("vllm-0", "GPU-fake-0001", namespace="serve"),
        holder("train-0", "GPU-fake-0000", namespace="serve"),
    ],
    "node-b": [holder("vllm-1", "GPU-fake-0000", namespace="serve")],
    "node-c": [holder("vllm-2", "GPU-fake-0001", namespace="serve")],
}


@asynccontextmanager
async def _agent(node: str, port: int = 0) -> AsyncIterator[RunningScaler]:
    gpus = FakeGpuSource(2, period_s=0.2)
    for index, util in enumerate(UTIL[node]):
        gpus.set(index, gpu_utilization=util)
    attribution = FakeAttribution(HOLDERS[node], period_s=0.2)
    async with loopback_scaler(gpus, node_name=node, samplers=[attribution], port=port) as agent:
        yield agent


@dataclass
class Cluster:
    tg: TaskGroup
    agents: dict[str, RunningScaler] = field(default_factory=dict)
    scaler: RunningScaler = field(init=False)
    """The cluster scaler, once started."""
    scopes: dict[str, tuple[anyio.CancelScope, anyio.Event]] = field(default_factory=dict)

    async def start(self, node: str, port: int = 0) -> None:
        """The agent of ``node``, in a task of its own (so it can be killed from a test)."""
        self.agents[node] = await self.tg.start(self._run, node, port)

    async def _run(self, node: str, port: int, *, task_status: TaskStatus[RunningScaler]) -> None:
        done = anyio.Event()
        with anyio.CancelScope() as scope:
            self.scopes[node] = (scope, done)
            try:
                async with _agent(node, port) as agent:
                    task_status.started(agent)
                    await anyio.sleep_forever()
            finally:
                done.set()

    async def kill(self, node: str) -> int:
        port = self.agents[node].port
        scope, done = self.scopes.pop(node)
        scope.cancel()
        await done.wait()
        return port


@asynccontextmanager
async def _open_cluster(
    tmp_path: Path, extra: Sequence[AgentTarget] = ()
) -> AsyncIterator[Cluster]:
    """Three real node agents (and ``extra`` targets, linked too) and a cluster scaler."""
    async with open_fake_kube_api() as api, anyio.create_task_group() as tg:
        for name, node in (("vllm-0", "node-a"), ("vllm-1", "node-b"), ("vllm-2", "node-c")):
            api.add_pod("serve", name, node=node, labels={"app": "vllm"})
        api.add_pod("serve", "train-0", node="node-a", labels={"app": "train"})
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        agents = Cluster(tg)
        for node in UTIL:
            await agents.start(node)
        targets = [AgentTarget(host="127.0.0.1", port=a.port) for a in agents.agents.values()]
        source = AgentsSource(
            StaticDiscovery([*targets, *extra]),
            lambda t, gate: AgentLink(t, backoff=FAST, min_idle_s=0.5, gate=gate),
        )
        pods = build_cluster_pods(kubeconfig=str(kubeconfig))
        async with loopback_scaler(source, samplers=pods) as scaler:
            agents.scaler = scaler
            with anyio.fail_after(10):
                while not _whole(scaler):
                    await scaler.hub.wait_newer(scaler.hub.current.version)
            yield agents
        tg.cancel_scope.cancel()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with _open_cluster(tmp_path) as opened:
        yield opened


def _whole(scaler: RunningScaler, devices: int = 6) -> bool:
    snapshot = scaler.hub.current
    return (
        len(snapshot.devices) >= devices
        and len(snapshot.node_attributions) == 3
        and snapshot.pods is not None
        and len(snapshot.pods.pods) == 4
    )


def _call(port: int, request: Any, mods: GrpcioModules) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return mods.pb2_grpc.ExternalScalerStub(channel).GetMetrics(request, timeout=5)


def _spec(port: int, ref: Any, mods: GrpcioModules) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return mods.pb2_grpc.ExternalScalerStub(channel).GetMetricSpec(ref, timeout=5)


async def _value(cluster: Cluster, mods: GrpcioModules, **metadata: str) -> float:
    ref = mods.pb2.ScaledObjectRef(
        name="so", namespace="serve", scalerMetadata={"cooldownSeconds": "0", **metadata}
    )
    request = mods.pb2.GetMetricsRequest(scaledObjectRef=ref)
    answer = await anyio.to_thread.run_sync(partial(_call, cluster.scaler.port, request, mods))
    (value,) = answer.metricValues
    return float(value.metricValueFloat)


async def _unavailable(cluster: Cluster, mods: GrpcioModules, **metadata: str) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        await _value(cluster, mods, **metadata)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()
    return str(caught.value.details())


async def test_a_workload_over_three_nodes_gets_exactly_its_gpus(
    cluster: Cluster, grpcio_modules: GrpcioModules
) -> None:
    mods = grpcio_modules
    assert await _value(cluster, mods) == 60.0  # every GPU of every node
    assert await _value(cluster, mods, aggregation="sum") == 210.0
    assert await _value(cluster, mods, podSelector="app=vllm", aggregation="sum") == 110.0
    assert await _value(cluster, mods, podSelector="app=train") == 10.0
    assert await _value(cluster, mods, nodeName="node-b") == 40.0
    assert await _value(cluster, mods, nodeName="node-b", gpuIndex="0") == 30.0


async def test_the_cluster_scaler_is_no_node_and_serves_no_watch_node(
    cluster: Cluster, grpcio_modules: GrpcioModules
) -> None:
    # Its snapshot is the whole cluster's: streamed as one "node", it would hand a second
    # cluster scaler every device twice over under its own host name.
    with pytest.raises(grpc.RpcError) as caught:
        await anyio.to_thread.run_sync(partial(watch_node, grpcio_modules, cluster.scaler.port, 1))
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert cluster.scaler.node_agent is None
    # Its agents do serve it.
    agent = cluster.agents["node-a"]
    watched = await anyio.to_thread.run_sync(partial(watch_node, grpcio_modules, agent.port, 1))
    assert watched.messages[0].identity.node_name == "node-a"


async def test_gpu_index_without_a_node_is_invalid_argument(
    cluster: Cluster, grpcio_modules: GrpcioModules
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        await _value(cluster, grpcio_modules, gpuIndex="0")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "needs nodeName" in str(caught.value.details())
    # GetMetricSpec too: KEDA learns of the mistake when the ScaledObject is created.
    for metadata in ({"gpuIndex": "0"}, {"migInstance": "0:1"}):
        ref = grpcio_modules.pb2.ScaledObjectRef(
            name="so", namespace="serve", scalerMetadata=metadata
        )
        with pytest.raises(grpc.RpcError) as caught:
            await anyio.to_thread.run_sync(partial(_spec, cluster.scaler.port, ref, grpcio_modules))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        key = next(iter(metadata))
        assert f"{key}" in str(caught.value.details())
        assert "needs nodeName" in str(caught.value.details())


async def test_an_agent_killed_is_a_partial_view_then_recovers(
    cluster: Cluster, grpcio_modules: GrpcioModules
) -> None:
    mods = grpcio_modules
    port = await cluster.kill("node-c")
    with anyio.fail_after(10):
        while True:
            try:
                await _value(cluster, mods)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE
                details = str(error.details())
                break
            await anyio.sleep(0.1)
    assert "coverage 0.67 is below minCoverage 0.75" in details
    assert "node-c GPU" in details
    # Below the threshold with a lower one: answered from the four fresh GPUs.
    assert await _value(cluster, mods, minCoverage="0.5") == 40.0
    assert "sum is never answered from a partial view" in await _unavailable(
        cluster, mods, aggregation="sum", minCoverage="0.1"
    )
    assert _partial_answers(cluster) >= 1
    # vllm-2's GPU is on the dead node: two of three of the workload's GPUs.
    assert await _value(cluster, mods, podSelector="app=vllm", minCoverage="0.6") == 30.0
    await cluster.start("node-c", port)
    with anyio.fail_after(10):
        while True:
            try:
                if await _value(cluster, mods) == 60.0:
                    break
            except grpc.RpcError:
                pass
            await anyio.sleep(0.1)


def _partial_answers(cluster: Cluster) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = cluster.scaler.metrics.render().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "keda_gpu_scaler_partial_answers_total"
    )


@pytest.mark.parametrize("bad", ["garbage", "oversized", "hanging"])
async def test_a_bad_agent_is_dropped_and_the_others_go_on(
    tmp_path: Path, grpcio_modules: GrpcioModules, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with AsyncExitStack() as stack:
        if bad == "hanging":
            agent: Any = await stack.enter_async_context(hanging_agent())
        else:
            junk = b"\xff\x00 not a NodeUpdate" if bad == "garbage" else b"x" * (2 << 20)
            agent = await stack.enter_async_context(
                scripted_agent([identity("node-x"), junk], then_hang=True)
            )
        cluster = await stack.enter_async_context(_open_cluster(tmp_path, [agent.target]))
        with anyio.fail_after(10):
            # The bad link is retried (a second stream, or a second connection)...
            while (agent.accepted if bad == "hanging" else agent.streams) < 2:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        # ...while every other node is answered as before, and node-x is nowhere.
        assert await _value(cluster, grpcio_modules) == 60.0
        nodes = {d.reading.node for d in cluster.scaler.hub.current.devices.values() if d.reading}
        assert nodes == set(UTIL)
    assert any(
        r.name.startswith("keda_gpu_scaler.sources.agents") and r.levelname == "WARNING"
        for r in caplog.records
    )


async def test_an_agent_clock_hours_off_is_as_fresh_as_it_is(
    tmp_path: Path, grpcio_modules: GrpcioModules
) -> None:
    """An agent whose clock runs five hours ahead: freshness comes from the ages it sends."""
    hub = SnapshotHub()
    ahead = 5 * 3600.0
    async with AsyncExitStack() as stack:
        agent = await stack.enter_async_context(
            serve_agent(hub, "node-far", clock=lambda: anyio.current_time() + ahead)
        )

        async def publish() -> None:
            snapshot = hub.current
            async for now in every(0.2):
                reading = GpuReading(
                    source="fake",
                    key=DeviceKey("GPU-far-0"),
                    index=0,
                    uuid="GPU-far-0",
                    name="H200",
                    taken_at=now + ahead,
                    period_s=0.2,
                    gpu_utilization=99.0,
                )
                snapshot = fold(snapshot, [reading], now + ahead)
                hub.publish(snapshot)

        async with anyio.create_task_group() as tg:
            tg.start_soon(publish)
            async with _open_cluster(tmp_path, [agent.target]) as cluster:
                with anyio.fail_after(10):
                    while not _whole(cluster.scaler, devices=7):
                        await cluster.scaler.hub.wait_newer(cluster.scaler.hub.current.version)
                assert await _value(cluster, grpcio_modules) == 99.0
                assert await _value(cluster, grpcio_modules, nodeName="node-far") == 99.0
            tg.cancel_scope.cancel()


async def test_500_streams_while_agents_come_and_go(
    cluster: Cluster, grpcio_modules: GrpcioModules
) -> None:
    async def churn() -> None:
        for node in ("node-b", "node-c"):
            port = await cluster.kill(node)
            await anyio.sleep(0.3)
            await cluster.start(node, port)

    async with anyio.create_task_group() as tg:
        tg.start_soon(churn)
        result = await anyio.to_thread.run_sync(
            partial(
                open_streams,
                grpcio_modules,
                cluster.scaler.port,
                500,
                {"metricType": "gpu_utilization", "minCoverage": "0.5", "cooldownSeconds": "0"},
                unary_calls=20,
            )
        )
    # Every stream got its first message, and no unary call failed, while two agents left
    # and came back (a partial view above minCoverage answers; none ends a stream).
    assert len(result.first_message_s) == 500
    assert result.unary_errors == 0
