"""Pod labels: a node agent's pod watch against the real API server.

A node agent runs with the token of the chart's ServiceAccount, a scripted GPU (63 %) and the
fake kubelet's PodResources socket saying that pod ``vllm-0`` holds that GPU. The scenario
creates, relabels and deletes the pod through the API and writes its status through the
status subresource, as a kubelet would; a ``podSelector: app=vllm`` trigger must follow
within ``REACTION_S`` (docs/workloads.md: label changes reach triggers as they happen,
through the watch). Then the watch must survive what a long-running cluster does to it: an
etcd compaction past the agent's resourceVersion together with a restart of the API server
(the resumed watch is answered ``410 Gone``, the agent lists again).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness.chart import Release
from tests.e2e.harness.controlplane import KEDA_NAMESPACE, ControlPlane
from tests.e2e.harness.kubelet import ready_status
from tests.e2e.harness.scaler import NodeAgent, Ports, node_agent
from tests.e2e.harness.traces import GPU_UUIDS, write_trace
from tests.fake_kubelet import container, gpus, pod
from tests.grpcio_client import GrpcioModules

NAMESPACE = "pod-labels"
POD = "vllm-0"
UTILIZATION = 63.0
TRIGGER = {
    "metricType": "gpu_utilization",
    "podSelector": "app=vllm",
    "targetValue": "50",
    "cooldownSeconds": "0",  # the raw reaction, no scale-down suppression
}
REACTION_S = 3.0
"""How soon a label change must show in the trigger's answer (the watch's event, one fold)."""
PORTS = Ports(grpc=16010, metrics=19010, probes=18010)


@pytest.fixture
def agent(
    plane: ControlPlane,
    gpu_nodes: list[str],
    node_release: Release,
    grpcio_mods: GrpcioModules,
    tmp_path: Path,
) -> Iterator[NodeAgent]:
    plane.namespace(NAMESPACE)
    trace = write_trace(tmp_path / "trace.jsonl", [(0, UTILIZATION)], duration_s=600)
    with node_agent(
        plane,
        "pod-labels-agent",
        release=node_release,
        node=gpu_nodes[0],
        trace=trace,
        ports=PORTS,
        modules=grpcio_mods,
        folder=tmp_path,
    ) as running:
        holder = pod(NAMESPACE, POD, containers=[container("vllm", devices=[gpus(GPU_UUIDS[0])])])
        running.kubelet.set_pods([holder])
        yield running


def reaches(agent: NodeAgent, expected: str | float, *, within_s: float = REACTION_S) -> float:
    """Seconds until the trigger answers ``expected``; fails past ``within_s``."""
    return agent.client.await_outcome(TRIGGER, expected, namespace=NAMESPACE, timeout_s=within_s)


def _create_pod(
    plane: ControlPlane, node: str, name: str, labels: dict[str, str]
) -> dict[str, Any]:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
    }
    created: dict[str, Any] = plane.admin.post(f"/api/v1/namespaces/{NAMESPACE}/pods", body)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/status"
    result: dict[str, Any] = plane.admin.put(
        path, created | {"status": ready_status(created, "10.99.1.10")}
    )
    return result


def _label(plane: ControlPlane, name: str, app: str) -> None:
    plane.admin.patch(
        f"/api/v1/namespaces/{NAMESPACE}/pods/{name}", {"metadata": {"labels": {"app": app}}}
    )


def test_a_pod_created_relabelled_and_deleted_changes_the_trigger_within_the_bound(
    plane: ControlPlane, gpu_nodes: list[str], agent: NodeAgent, e2e_report: dict[str, Any]
) -> None:
    reaches(agent, 0.0, within_s=30)  # the pod does not exist yet: a workload with no pods
    times = {"created": 0.0, "relabelled away": 0.0, "relabelled back": 0.0, "deleted": 0.0}
    _create_pod(plane, gpu_nodes[0], POD, {"app": "vllm"})
    times["created"] = reaches(agent, UTILIZATION)
    _label(plane, POD, "other")
    times["relabelled away"] = reaches(agent, 0.0)
    _label(plane, POD, "vllm")
    times["relabelled back"] = reaches(agent, UTILIZATION)
    plane.admin.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}", grace_s=0)
    times["deleted"] = reaches(agent, 0.0)
    e2e_report["figures"]["pod label reaction (s)"] = {k: round(v, 3) for k, v in times.items()}


def test_the_watch_survives_an_etcd_compaction_and_an_api_server_restart(
    plane: ControlPlane, gpu_nodes: list[str], agent: NodeAgent, e2e_report: dict[str, Any]
) -> None:
    _create_pod(plane, gpu_nodes[0], POD, {"app": "vllm"})
    reaches(agent, UTILIZATION)
    # Changes the agent's watch does not see (another node's pod) move etcd's revision past
    # the agent's resourceVersion; compacting there and restarting the API server (whose
    # watch cache then starts at the present) makes the agent's resumed watch too old.
    _create_pod(plane, gpu_nodes[1], "elsewhere", {"app": "batch"})
    for n in range(20):
        _label(plane, "elsewhere", f"batch-{n}")
    revision = plane.compact_etcd()
    restarted_at = time.time()
    plane.restart_apiserver()
    _label(plane, POD, "other")
    reaction = reaches(agent, 0.0, within_s=REACTION_S + 35)  # a resumed watch backs off up to 30 s
    _label(plane, POD, "vllm")
    reaches(agent, UTILIZATION)

    user = f"system:serviceaccount:{KEDA_NAMESPACE}:keda-gpu-scaler"
    after = [
        e for e in plane.audit_requests(user, restarted_at) if e["objectRef"]["resource"] == "pods"
    ]
    verbs = [(e["verb"], e.get("responseStatus", {}).get("code")) for e in after]
    assert ("list", 200) in verbs, f"no relist after the restart: {verbs}"
    e2e_report["figures"]["pod watch after compaction"] = {
        "compacted_at_revision": revision,
        "requests_after_restart": verbs[:10],
        "label change seen after restart (s)": round(reaction, 3),
    }
    plane.admin.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}", grace_s=0)
    plane.admin.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/elsewhere", grace_s=0)
