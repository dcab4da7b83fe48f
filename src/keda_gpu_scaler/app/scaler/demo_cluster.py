"""``keda-gpu-scaler demo --cluster``: three node agents and a cluster scaler, in one process.

Each node agent replays the bundled H200 recording from its own point in it, with scripted
pod attribution (which pod holds its GPU); the cluster scaler links to the three and has
scripted pod labels, so no Kubernetes is needed. Two workloads' ``podSelector`` triggers
are polled like KEDA, each measured over its own GPUs on several nodes.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass

import anyio
import msgspec
from anyio.abc import TaskStatus
from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from keda_gpu_scaler.app.scaler.compose import AgentsSource, RunningScaler, open_scaler
from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.domain.samples import AgentTarget, DeviceHolder, PodInfo
from keda_gpu_scaler.domain.snapshot import Snapshot
from keda_gpu_scaler.pipeline.tap import TapDecision, TapFilter
from keda_gpu_scaler.serving._proto.externalscaler import (
    ExternalScalerStub,
    GetMetricsRequest,
    ScaledObjectRef,
)
from keda_gpu_scaler.sources.agents import AgentLink, StaticDiscovery
from keda_gpu_scaler.sources.fake import ScriptedAttribution, ScriptedPods
from keda_gpu_scaler.sources.replay import BUNDLED_IDENTITY, ReplaySampler

HOST = "127.0.0.1"
NAMESPACE = "ml"
SCRIPT_PERIOD_S = 1.0
READY_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class DemoNode:
    name: str
    start_at_s: float
    """Where in the recording this node's replay begins, so the nodes differ."""
    pod: str
    """The pod holding the node's one GPU."""
    labels: Mapping[str, str]


CLUSTER_NODES = (
    DemoNode("node-1", 0.0, "vllm-0", {"app": "vllm"}),
    DemoNode("node-2", 12.0, "train-0", {"app": "train"}),
    DemoNode("node-3", 36.0, "vllm-1", {"app": "vllm"}),
)


@dataclass(frozen=True, slots=True)
class ClusterTrigger:
    name: str
    """The ScaledObject's name (in namespace ``ml``)."""
    selector: str
    aggregation: str

    @property
    def metadata(self) -> dict[str, str]:
        return {
            "podSelector": self.selector,
            "metricType": "gpu_utilization",
            "aggregation": self.aggregation,
            "targetValue": "80",
            "activationThreshold": "5",
            "cooldownSeconds": "0",
        }

    @property
    def trigger(self) -> str:
        """As the tap names it: ``namespace/name``."""
        return f"{NAMESPACE}/{self.name}"


CLUSTER_TRIGGERS = (
    ClusterTrigger("vllm-max", "app=vllm", "max"),
    ClusterTrigger("vllm-avg", "app=vllm", "avg"),
    ClusterTrigger("train-max", "app=train", "max"),
    ClusterTrigger("train-avg", "app=train", "avg"),
)


def _holder(node: DemoNode) -> DeviceHolder:
    return DeviceHolder(
        namespace=NAMESPACE,
        pod=node.pod,
        container="main",
        resource="nvidia.com/gpu",
        device_id=BUNDLED_IDENTITY.uuid,
    )


def _pods() -> list[PodInfo]:
    return [
        PodInfo(
            namespace=NAMESPACE,
            name=node.pod,
            labels=dict(node.labels),
            phase="Running",
            node=node.name,
        )
        for node in CLUSTER_NODES
    ]


def _whole(snapshot: Snapshot) -> bool:
    """Every node's GPU, every node's attribution and the pods: ready to answer."""
    return (
        len(snapshot.devices) == len(CLUSTER_NODES)
        and len(snapshot.node_attributions) == len(CLUSTER_NODES)
        and snapshot.pods is not None
    )


_PARTS = re.compile(r"\[(.*)\]")


def gpus_used(explanation: str) -> str:
    """The ``[node-1 GPU 0 (vllm-0)=12, ...]`` of a decision's explanation, or ``-``."""
    found = _PARTS.search(explanation)
    return found.group(1) if found else "-"


class _Explanations:
    """The newest GetMetrics explanation of each demo trigger, from the cluster scaler's tap
    (as ``/debug/tap`` reads it)."""

    def __init__(self) -> None:
        self.latest: dict[str, str] = {}
        self._decoder = msgspec.json.Decoder(TapDecision)

    async def follow(
        self,
        scaler: RunningScaler,
        trigger: str,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        with scaler.tap.subscribe(TapFilter(trigger=trigger)) as subscription:
            task_status.started()
            async for line in subscription:
                decision = self._decoder.decode(line)
                if decision.rpc == "GetMetrics":
                    self.latest[trigger] = decision.why


async def _poll(
    stub: ExternalScalerStub, trigger: ClusterTrigger, explanations: _Explanations
) -> str:
    ref = ScaledObjectRef(name=trigger.name, namespace=NAMESPACE, scaler_metadata=trigger.metadata)
    spec = (await stub.get_metric_spec(ref, timeout=3)).metric_specs[0]
    request = GetMetricsRequest(scaled_object_ref=ref, metric_name=spec.metric_name)
    try:
        value = (await stub.get_metrics(request, timeout=3)).metric_values[0].metric_value_float
        active = (await stub.is_active(ref, timeout=3)).result
    except GRPCError as exc:
        shown, state, used = "-", exc.status.name, exc.message or ""
    else:
        shown, state = f"{value:.1f} %", "ACTIVE" if active else "inactive"
        used = gpus_used(explanations.latest.get(trigger.trigger, ""))
    target = f"{spec.target_size_float:g} %"
    return (
        f"{trigger.selector:<10} {trigger.aggregation:<4} {shown:>8} {target:>7}  "
        f"{state:<8}  {used}"
    )


async def _start_agents(stack: AsyncExitStack) -> tuple[list[ReplaySampler], list[AgentTarget]]:
    replays: list[ReplaySampler] = []
    targets: list[AgentTarget] = []
    for node in CLUSTER_NODES:
        replay = ReplaySampler.bundled(start_at_s=node.start_at_s)
        attribution = ScriptedAttribution([_holder(node)], period_s=SCRIPT_PERIOD_S)
        agent = await stack.enter_async_context(
            open_scaler(replay, host=HOST, port=0, node_name=node.name, samplers=[attribution])
        )
        replays.append(replay)
        targets.append(AgentTarget(host=HOST, port=agent.port))
    return replays, targets


async def _ready(scaler: RunningScaler) -> None:
    with anyio.move_on_after(READY_TIMEOUT_S):
        while not _whole(scaler.hub.current):
            await scaler.hub.wait_newer(scaler.hub.current.version)
        return
    raise SourceUnavailable(
        f"the cluster scaler did not see all {len(CLUSTER_NODES)} node agents "
        f"within {READY_TIMEOUT_S:g} s"
    )


def _header(elapsed: float, replays: list[ReplaySampler]) -> list[str]:
    phases = ", ".join(
        f"{node.name} {replay.phase or '?'}"
        for node, replay in zip(CLUSTER_NODES, replays, strict=True)
    )
    return [
        f"t={elapsed:5.1f}s  recorded phase: {phases}",
        f"{'selector':<10} {'agg':<4} {'value':>8} {'target':>7}  {'activity':<8}  GPUs used",
    ]


async def run_cluster_demo(duration_s: float, every_s: float) -> None:
    tty = sys.stdout.isatty()
    async with AsyncExitStack() as stack:
        replays, targets = await _start_agents(stack)
        source = AgentsSource(
            StaticDiscovery(targets), lambda target, gate: AgentLink(target, gate=gate)
        )
        pods = ScriptedPods(_pods(), period_s=SCRIPT_PERIOD_S)
        scaler = await stack.enter_async_context(
            open_scaler(source, host=HOST, port=0, samplers=[pods])
        )
        agents = ", ".join(
            f"{n.name} :{t.port}" for n, t in zip(CLUSTER_NODES, targets, strict=True)
        )
        print(f"node agents on {HOST} ({agents}), each replaying a real NVIDIA H200")
        print(f"cluster scaler serving on {HOST}:{scaler.port}")
        for node in CLUSTER_NODES:
            labels = ",".join(f"{k}={v}" for k, v in node.labels.items())
            print(f"  {node.name}: GPU 0 held by {NAMESPACE}/{node.pod} ({labels})")
        await _ready(scaler)
        explanations = _Explanations()
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        for trigger in CLUSTER_TRIGGERS:
            await tg.start(explanations.follow, scaler, trigger.trigger)
        channel = await stack.enter_async_context(Channel(HOST, scaler.port))
        stub = ExternalScalerStub(channel)
        started = anyio.current_time()
        lines = 0
        while (elapsed := anyio.current_time() - started) < duration_s:
            rows = _header(elapsed, replays)
            rows += [await _poll(stub, trigger, explanations) for trigger in CLUSTER_TRIGGERS]
            if tty and lines:
                print(f"\x1b[{lines}F\x1b[J", end="")
            print("\n".join(rows), flush=True)
            lines = len(rows)
            await anyio.sleep(every_s)
