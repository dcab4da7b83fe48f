"""Agent discovery: the chart's cluster mode, its agents found through EndpointSlices made by
the real endpointslice controller.

The chart is installed with ``role: cluster``. Its DaemonSet controller makes one agent pod
per GPU node; the harness's kubelet binds each and reports it Running and Ready with an
address of its own (10.99.1.x, local to the suite's network namespace), on which a node agent
then listens, replaying a GPU at its own utilization. The endpointslice controller publishes
those pods behind the chart's headless ``-agents`` Service, and a cluster scaler, running with
a token of the chart's cluster ServiceAccount and ``--agents endpoints:NAMESPACE/SERVICE:grpc``
(what the chart's Deployment runs), must link exactly the ready agents: an agent whose pod
turns not ready drops out of the answers (a partial ``avg`` answered from the others, a
partial ``sum`` refused) and comes back when ready; a deleted agent pod is replaced by the
DaemonSet, and the replacement is linked once an agent listens on its address.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness.chart import Release
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.kubelet import Kubelet, ready_status
from tests.e2e.harness.processes import Process, wait_for
from tests.e2e.harness.scaler import Ports, ScalerClient, cluster_scaler, not_json, start_scaler
from tests.e2e.harness.traces import write_trace
from tests.grpcio_client import GrpcioModules

UTILIZATION = {1: 10.0, 2: 20.0, 3: 60.0}
AVG = {
    "metricType": "gpu_utilization",
    "aggregation": "avg",
    "minCoverage": "0.5",
    "targetValue": "50",
}
SUM = {"metricType": "gpu_utilization", "aggregation": "sum", "targetValue": "50"}
CLUSTER_PORTS = Ports(grpc=16020, metrics=19020, probes=18020)
CHANGE_S = 15.0
"""An endpoint's change reaches the answers within the watch's event plus the staleness of the
dropped agent's readings (three periods, docs/architecture.md)."""


@dataclass
class Cluster:
    plane: ControlPlane
    release: Release
    nodes: list[str]
    tmp: Path
    agents: dict[str, Process]
    """The node agent listening on each agent pod's address, by pod name."""
    client: ScalerClient

    def agent_pods(self) -> dict[str, dict[str, Any]]:
        """The running agent pods by node."""
        daemonset = self.release.find("DaemonSet")["metadata"]["name"]
        pods = self.plane.admin.get(f"/api/v1/namespaces/{self.release.namespace}/pods")["items"]
        return {
            p["spec"]["nodeName"]: p
            for p in pods
            if p.get("status", {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
            and any(o["name"] == daemonset for o in p["metadata"].get("ownerReferences", []))
        }

    def start_agent(self, node: str, pod: dict[str, Any]) -> None:
        n = self.nodes.index(node) + 1
        address = pod["status"]["podIP"]
        trace = write_trace(
            self.tmp / f"{pod['metadata']['name']}.jsonl",
            [(0, UTILIZATION[n])],
            duration_s=600,
            gpus=[f"GPU-0e2e0000-0000-4000-8000-00000000010{n}"],
        )
        self.agents[pod["metadata"]["name"]] = start_scaler(
            f"discovery-{pod['metadata']['name']}",
            [f"--source=replay:{trace}", "--pod-resources-socket=", f"--node-name={node}"],
            logs=self.plane.paths.logs,
            host=address,
            ports=Ports(grpc=6000, metrics=9090, probes=8081),
        )

    def set_ready(self, pod: dict[str, Any], ready: bool) -> None:
        path = f"/api/v1/namespaces/{self.release.namespace}/pods/{pod['metadata']['name']}"
        current = self.plane.admin.get(path)
        status = ready_status(current, current["status"]["podIP"])
        for condition in status["conditions"]:
            if condition["type"] in ("Ready", "ContainersReady"):
                condition["status"] = "True" if ready else "False"
        for container in status["containerStatuses"]:
            container["ready"] = ready
        self.plane.admin.put(f"{path}/status", current | {"status": status})

    def slice_addresses(self) -> dict[str, bool]:
        service = f"{self.release.find('DaemonSet')['metadata']['name']}-agents"
        slices = self.plane.admin.get(
            f"/apis/discovery.k8s.io/v1/namespaces/{self.release.namespace}/endpointslices",
            labelSelector=f"kubernetes.io/service-name={service}",
        )["items"]
        return {
            address: bool(endpoint.get("conditions", {}).get("ready", True))
            for item in slices
            for endpoint in item.get("endpoints") or []
            for address in endpoint["addresses"]
        }

    def answers(self, metadata: dict[str, str], expected: str | float) -> None:
        self.client.await_outcome(
            metadata, expected, namespace=self.release.namespace, timeout_s=CHANGE_S, every_s=0.1
        )


@pytest.fixture
def cluster(
    plane: ControlPlane,
    gpu_nodes: list[str],
    cluster_release: Release,
    grpcio_mods: GrpcioModules,
    pod_addresses: Iterator[str],
    tmp_path: Path,
) -> Iterator[Cluster]:
    agents: dict[str, Process] = {}
    with (
        Kubelet(
            plane.admin,
            namespaces=[cluster_release.namespace],
            nodes=gpu_nodes,
            addresses=pod_addresses,
        ),
        cluster_scaler(
            plane,
            "discovery-cluster",
            release=cluster_release,
            ports=CLUSTER_PORTS,
            modules=grpcio_mods,
            folder=tmp_path,
        ) as scaler,
    ):
        found = Cluster(plane, cluster_release, gpu_nodes, tmp_path, agents, scaler.client)
        try:
            wait_for(
                "an agent pod Running on every GPU node",
                lambda: len(found.agent_pods()) == 3,
                timeout_s=60,
            )
            for node, pod in found.agent_pods().items():
                found.start_agent(node, pod)
            yield found
        finally:
            for agent in agents.values():
                agent.stop()
    for agent in agents.values():
        assert not_json(agent.log) == []


def test_the_cluster_scaler_links_the_ready_agents_of_the_charts_service(cluster: Cluster) -> None:
    addresses = {node: pod["status"]["podIP"] for node, pod in cluster.agent_pods().items()}
    wait_for(
        "the endpointslice controller publishing every agent, ready",
        lambda: cluster.slice_addresses() == dict.fromkeys(addresses.values(), True),
        timeout_s=30,
    )
    cluster.answers(SUM, 90.0)  # every agent linked
    cluster.answers(AVG, 30.0)

    second = cluster.agent_pods()[cluster.nodes[1]]
    cluster.set_ready(second, False)
    wait_for(
        "agent 2 not ready in its slice",
        lambda: cluster.slice_addresses().get(addresses[cluster.nodes[1]]) is False,
        timeout_s=30,
    )
    cluster.answers(AVG, 35.0)  # agent 2 left out of the average
    cluster.answers(SUM, "UNAVAILABLE")  # a partial sum refused
    cluster.set_ready(second, True)
    cluster.answers(SUM, 90.0)  # agent 2 linked again

    third = cluster.agent_pods()[cluster.nodes[2]]
    cluster.plane.admin.delete(
        f"/api/v1/namespaces/{cluster.release.namespace}/pods/{third['metadata']['name']}",
        grace_s=0,
    )
    cluster.agents.pop(third["metadata"]["name"]).stop()
    cluster.answers(AVG, 15.0)  # node 3 missing while its agent is replaced
    wait_for(
        "the DaemonSet's replacement Running",
        lambda: (
            cluster.agent_pods().get(cluster.nodes[2], third)["metadata"]["uid"]
            != third["metadata"]["uid"]
        ),
        timeout_s=30,
    )
    cluster.start_agent(cluster.nodes[2], cluster.agent_pods()[cluster.nodes[2]])
    cluster.answers(AVG, 30.0)  # the replacement linked
