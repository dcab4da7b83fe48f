"""Dynamic MIG over real sockets: a node agent (the real NVML sampler over the fake NVML)
whose MIG instances are destroyed and made while it runs, and a cluster scaler linked to it.

A destroyed instance leaves the agent's snapshot and ``/metrics`` at the next cycle, and the
cluster scaler's view and ``/metrics`` with the agent's next update; one destroyed while the
agent was down is forgotten by the cluster scaler when the restarted agent's stream begins.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import httpx
import pytest
from anyio.abc import TaskGroup, TaskStatus

from keda_gpu_scaler.app.scaler.compose import AgentsSource, RunningScaler
from keda_gpu_scaler.domain.backoff import Backoff
from keda_gpu_scaler.domain.decision import measure
from keda_gpu_scaler.domain.samples import AgentTarget, DeviceKey
from keda_gpu_scaler.domain.trigger import parse_trigger
from keda_gpu_scaler.sources.agents import AgentLink, StaticDiscovery
from keda_gpu_scaler.sources.nvml.backend import GpmMetric
from keda_gpu_scaler.sources.nvml.fake_backend import FakeNvml, enable_mig, h200_gpu
from keda_gpu_scaler.sources.nvml.fake_mig import FakeMigInstance
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler
from keda_gpu_scaler.testing import inline
from tests.loopback import loopback_scaler

pytestmark = pytest.mark.anyio

NODE = "gpu-node-1"
FAST = Backoff(initial_s=0.05, factor=2.0, maximum_s=0.2)
WAIT_S = 10.0
SM_MAX = {"metricType": "sm_active", "aggregation": "max", "nodeName": NODE}


def _nvml() -> FakeNvml:
    """GPU 0 in MIG mode: GI 7 (40 % of its SMs busy) at slice 0, GI 8 (60 %) at slice 1."""
    gpu = h200_gpu(0)
    enable_mig(
        gpu,
        [
            FakeMigInstance(uuid="MIG-seven", gpu_instance_id=7, placement_start=0),
            FakeMigInstance(uuid="MIG-eight", gpu_instance_id=8, placement_start=1),
        ],
    )
    for instance, busy in zip(gpu.instances, (40.0, 60.0), strict=True):
        instance.gpm = {GpmMetric.SM_UTIL: busy}
    return FakeNvml([gpu])


@dataclass
class Node:
    """The node agent, which a test can stop and start again on its port."""

    nvml: FakeNvml
    tg: TaskGroup
    port: int = 0
    agent: RunningScaler | None = None
    _scope: anyio.CancelScope | None = None
    _done: anyio.Event | None = None

    async def start(self) -> RunningScaler:
        self.agent = await self.tg.start(self._run)
        self.port = self.agent.port
        return self.agent

    async def stop(self) -> None:
        assert self._scope is not None and self._done is not None
        self._scope.cancel()
        await self._done.wait()

    async def _run(self, *, task_status: TaskStatus[RunningScaler]) -> None:
        self._done = anyio.Event()
        source = NvmlSampler(
            self.nvml,
            interval_s=0.1,
            pcie_interval_s=None,
            mig_layout_interval_s=0.3,
            call_in_thread=inline,
        )
        with anyio.CancelScope() as self._scope:
            try:
                async with loopback_scaler(source, node_name=NODE, port=self.port) as agent:
                    task_status.started(agent)
                    await anyio.sleep_forever()
            finally:
                self._done.set()


@asynccontextmanager
async def _cluster() -> AsyncIterator[tuple[Node, RunningScaler]]:
    async with anyio.create_task_group() as tg:
        node = Node(_nvml(), tg)
        agent = await node.start()
        source = AgentsSource(
            StaticDiscovery([AgentTarget(host="127.0.0.1", port=agent.port)]),
            lambda t, gate: AgentLink(t, backoff=FAST, min_idle_s=0.5, gate=gate),
        )
        async with loopback_scaler(source) as scaler:
            await _until(scaler, lambda uuids: {"MIG-seven", "MIG-eight"} <= uuids, gpm=True)
            yield node, scaler
        tg.cancel_scope.cancel()


def _uuids(scaler: RunningScaler, *, gpm: bool = False) -> set[str]:
    """The UUIDs of the devices with a reading (each instance with a GPM one, for ``gpm``)."""
    return {
        d.reading.uuid
        for d in scaler.hub.current.devices.values()
        if d.reading is not None and (not gpm or d.reading.sm_active is not None)
    }


async def _until(
    scaler: RunningScaler, holds: Callable[[set[str]], bool], *, gpm: bool = False
) -> None:
    """Until ``holds`` of the UUIDs the scaler has (each new snapshot, at most WAIT_S)."""
    with anyio.fail_after(WAIT_S):
        while not holds(_uuids(scaler, gpm=gpm)):
            await scaler.hub.wait_newer(scaler.hub.current.version)


async def _metrics_text(scaler: RunningScaler) -> str:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{scaler.metrics_port}/metrics")
    assert response.status_code == 200
    return response.text


def _sm_max(scaler: RunningScaler) -> tuple[float, tuple[str, ...], str]:
    """The value of "sm_active, max over every GPU of the node", what it read, and who is
    missing from the view (empty: nobody)."""
    now = anyio.current_time()
    measurement = measure(parse_trigger(SM_MAX), scaler.hub.current, now)
    return measurement.value, measurement.labels, measurement.coverage


async def test_a_destroyed_instance_leaves_the_agent_and_the_cluster_and_their_metrics() -> None:
    async with _cluster() as (node, scaler):
        agent = node.agent
        assert agent is not None
        assert _sm_max(scaler)[0] == 60.0
        assert "MIG-eight" in await _metrics_text(agent)
        assert "MIG-eight" in await _metrics_text(scaler)
        node.nvml.destroy_mig_device(0, "MIG-eight")
        await _until(agent, lambda keys: "MIG-eight" not in keys)
        await _until(scaler, lambda keys: "MIG-eight" not in keys)
        # Forgotten, not stale: no series names it, and "every GPU" of the node is whole.
        assert "MIG-eight" not in await _metrics_text(agent)
        assert "MIG-eight" not in await _metrics_text(scaler)
        assert _sm_max(scaler) == (40.0, (f"{NODE} MIG 0:7",), "")
        assert DeviceKey(f"{NODE}/MIG-eight") not in scaler.hub.current.devices


async def test_an_instance_destroyed_while_the_agent_was_down_is_forgotten_when_it_returns() -> (
    None
):
    async with _cluster() as (node, scaler):
        await node.stop()
        # While the agent is down (an operator re-partitions the GPU, the MIG manager
        # restarts the GPU clients), GI 8 is destroyed and a 2g instance made at slices 2-3.
        node.nvml.destroy_mig_device(0, "MIG-eight")
        made = node.nvml.create_mig_device(0, start=2, size=2, uuid="MIG-two-slices")
        made.gpm = {GpmMetric.SM_UTIL: 20.0}
        assert "MIG-eight" in _uuids(scaler)  # kept, going stale: the agent cannot say yet
        await node.start()
        await _until(scaler, lambda keys: "MIG-two-slices" in keys and "MIG-eight" not in keys)
        assert {k.removeprefix(f"{NODE}/") for k in scaler.hub.current.devices} == {
            node.nvml.gpus[0].uuid,
            "MIG-seven",
            "MIG-two-slices",
        }
