"""Agent discovery: a cluster scaler finds node agents through EndpointSlices made by the real
endpointslice controller.

Three node agents listen on their pods' addresses (10.99.1.x, local to the suite's network
namespace), each replaying a GPU at its own utilization. Their pods exist in the API, with the
status a kubelet would write; the agents' headless Service selects them, and the
endpointslice controller of kube-controller-manager publishes their addresses and readiness.
The cluster scaler, given ``--agents endpoints:NAMESPACE/SERVICE:grpc``, must link exactly the
ready agents: an agent whose pod turns not ready, or is deleted, drops out of the answers (a
partial ``avg`` answered from the others, a partial ``sum`` refused), and comes back when its
pod is ready again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.kubelet import ready_status
from tests.e2e.harness.processes import Process, wait_for
from tests.e2e.harness.scaler import Ports, ScalerClient, start_scaler
from tests.e2e.harness.traces import write_trace
from tests.grpcio_client import GrpcioModules

NAMESPACE = "gpu-agents"
SERVICE = "gpu-agents"
UTILIZATION = {1: 10.0, 2: 20.0, 3: 60.0}
AVG = {
    "metricType": "gpu_utilization",
    "aggregation": "avg",
    "minCoverage": "0.5",
    "targetValue": "50",
}
SUM = {"metricType": "gpu_utilization", "aggregation": "sum", "targetValue": "50"}
CLUSTER_PORTS = Ports(grpc=16020, metrics=19020, probes=18020)
AGENT_GRPC = 6000
CHANGE_S = 15.0
"""An endpoint's change reaches the answers within the watch's event plus the staleness of the
dropped agent's readings (three periods, docs/architecture.md)."""


@dataclass
class Agents:
    addresses: dict[int, str]
    processes: dict[int, Process]
    cluster: Process
    client: ScalerClient


def _pod(n: int, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"agent-{n}", "namespace": NAMESPACE, "labels": {"app": "gpu-agent"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "agent",
                    "image": "keda-gpu-scaler",
                    "ports": [{"name": "grpc", "containerPort": AGENT_GRPC}],
                }
            ],
        },
    }


def _set_ready(plane: ControlPlane, n: int, address: str, ready: bool) -> None:
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/agent-{n}"
    current = plane.admin.get(path)
    status = ready_status(current, address)
    if not ready:
        for condition in status["conditions"]:
            if condition["type"] in ("Ready", "ContainersReady"):
                condition["status"] = "False"
        for container in status["containerStatuses"]:
            container["ready"] = False
    plane.admin.put(f"{path}/status", current | {"status": status})


@pytest.fixture
def agents(
    plane: ControlPlane, gpu_nodes: list[str], grpcio_mods: GrpcioModules, tmp_path: Path
) -> Iterator[Agents]:
    plane.namespace(NAMESPACE)
    plane.admin.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": NAMESPACE},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "gpu-agent"},
                "ports": [{"name": "grpc", "port": AGENT_GRPC, "targetPort": "grpc"}],
            },
        }
    )
    addresses = {n: f"10.99.1.{20 + n}" for n in UTILIZATION}
    processes: dict[int, Process] = {}
    try:
        for n, util in UTILIZATION.items():
            trace = write_trace(
                tmp_path / f"agent-{n}.jsonl",
                [(0, util)],
                duration_s=600,
                gpus=[f"GPU-0e2e0000-0000-4000-8000-00000000010{n}"],
            )
            processes[n] = start_scaler(
                f"discovery-agent-{n}",
                [
                    f"--source=replay:{trace}",
                    "--pod-resources-socket=",
                    f"--node-name={gpu_nodes[n - 1]}",
                ],
                logs=plane.paths.logs,
                host=addresses[n],
                ports=Ports(grpc=AGENT_GRPC, metrics=9090, probes=8081),
            )
            plane.admin.post(f"/api/v1/namespaces/{NAMESPACE}/pods", _pod(n, gpu_nodes[n - 1]))
            _set_ready(plane, n, addresses[n], True)
        cluster = start_scaler(
            "discovery-cluster",
            [
                "--source=agents",
                f"--agents=endpoints:{NAMESPACE}/{SERVICE}:grpc",
                "--pod-resources-socket=",
            ],
            logs=plane.paths.logs,
            ports=CLUSTER_PORTS,
            env=dict(os.environ) | {"KUBECONFIG": str(plane.admin_kubeconfig)},
            wait_ready=False,
        )
        client = ScalerClient(grpcio_mods, f"127.0.0.1:{CLUSTER_PORTS.grpc}")
        try:
            yield Agents(addresses, processes, cluster, client)
        finally:
            client.close()
            cluster.stop()
    finally:
        for process in processes.values():
            process.stop()
        for n in UTILIZATION:
            plane.admin.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/agent-{n}", grace_s=0)


def _answers(agents: Agents, metadata: dict[str, str], expected: str | float, what: str) -> None:
    seen: list[str | float] = []

    def answered() -> bool:
        seen.append(agents.client.outcome(metadata, namespace=NAMESPACE))
        return seen[-1] == expected

    try:
        wait_for(what, answered, timeout_s=CHANGE_S, every_s=0.1)
    except Exception as exc:
        raise AssertionError(f"{exc}; last answers {seen[-5:]}") from exc


def _slice_addresses(plane: ControlPlane) -> dict[str, bool]:
    slices = plane.admin.get(
        f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices",
        labelSelector=f"kubernetes.io/service-name={SERVICE}",
    )["items"]
    return {
        address: bool(endpoint.get("conditions", {}).get("ready", True))
        for item in slices
        for endpoint in item.get("endpoints") or []
        for address in endpoint["addresses"]
    }


def test_the_cluster_scaler_links_the_ready_agents_its_service_selects(
    plane: ControlPlane, agents: Agents
) -> None:
    wait_for(
        "the endpointslice controller",
        lambda: _slice_addresses(plane) == dict.fromkeys(agents.addresses.values(), True),
        timeout_s=30,
    )
    _answers(agents, SUM, 90.0, "every agent linked")
    _answers(agents, AVG, 30.0, "the average over three nodes")

    _set_ready(plane, 2, agents.addresses[2], False)
    wait_for(
        "agent-2 not ready in its slice",
        lambda: _slice_addresses(plane).get(agents.addresses[2]) is False,
        timeout_s=30,
    )
    _answers(agents, AVG, 35.0, "agent-2 left out of the average")
    _answers(agents, SUM, "UNAVAILABLE", "a partial sum refused")

    _set_ready(plane, 2, agents.addresses[2], True)
    _answers(agents, SUM, 90.0, "agent-2 linked again")

    plane.admin.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/agent-3", grace_s=0)
    wait_for(
        "agent-3 gone from the slices",
        lambda: agents.addresses[3] not in _slice_addresses(plane),
        timeout_s=30,
    )
    _answers(agents, AVG, 15.0, "agent-3's node missing once its pod is deleted")
