"""RBAC for real: the product authorized by the chart's roles and nothing else.

The node agent and the cluster scaler run as local processes with tokens of the chart's own
ServiceAccounts (the TokenRequest API, as the kubelet mounts one), so every request they make
is authorized by the chart's ClusterRoles through the API server's RBAC authorizer. The API
server's audit log records each request with its verb, resource and answer. After each has
done its work (the agent: listed and watched its node's pods and ResourceSlices, answered a
``podSelector`` trigger from them; the cluster scaler: discovered the agents through their
Service's EndpointSlices, watched the pods of the namespace a trigger names):

- no request was refused (a verb missing from the chart would be a 403 here);
- every verb the chart grants was used (a verb the product never uses does not belong in it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.e2e.conftest import CLUSTER_NAMESPACE
from tests.e2e.harness.chart import Release
from tests.e2e.harness.controlplane import KEDA_NAMESPACE, ControlPlane
from tests.e2e.harness.kubelet import ready_status
from tests.e2e.harness.processes import wait_for
from tests.e2e.harness.scaler import KubeletSocket, Ports, ScalerClient, start_scaler
from tests.e2e.harness.traces import GPU_UUIDS, write_trace
from tests.fake_kubelet import container, gpus, pod
from tests.grpcio_client import GrpcioModules

NAMESPACE = "rbac"
PORTS = Ports(grpc=16050, metrics=19050, probes=18050)
CLUSTER_PORTS = Ports(grpc=16051, metrics=19051, probes=18051)
TRIGGER = {"metricType": "gpu_utilization", "podSelector": "app=served", "targetValue": "50"}

Grant = tuple[str, str, str]
"""(API group, resource, verb)."""


def granted(rules: Iterable[dict[str, Any]]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def requests_of(plane: ControlPlane, user: str, since: float) -> list[dict[str, Any]]:
    from tests.e2e.test_pod_labels import _seconds

    return [
        e
        for e in plane.audit_events()
        if e["user"]["username"] == user
        and "objectRef" in e
        and _seconds(e["stageTimestamp"]) >= since
    ]


def test_the_node_agent_needs_exactly_what_the_chart_grants(
    plane: ControlPlane,
    gpu_nodes: list[str],
    node_release: Release,
    grpcio_mods: GrpcioModules,
    tmp_path: Path,
) -> None:
    began = time.time()
    plane.namespace(NAMESPACE)
    account = node_release.find("ServiceAccount")["metadata"]["name"]
    role = node_release.find("ClusterRole")
    kubeconfig = plane.kubeconfig_for(KEDA_NAMESPACE, account, tmp_path / "agent.kubeconfig")
    trace = write_trace(tmp_path / "trace.jsonl", [(0, 42.0)], duration_s=600)
    created = plane.admin.post(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "served-0", "namespace": NAMESPACE, "labels": {"app": "served"}},
            "spec": {
                "nodeName": gpu_nodes[0],
                "containers": [{"name": "server", "image": "server"}],
            },
        },
    )
    plane.admin.put(
        f"/api/v1/namespaces/{NAMESPACE}/pods/served-0/status",
        created | {"status": ready_status(created, "10.99.1.50")},
    )
    socket = Path(f"/tmp/e2e-rbac-{os.getpid()}.sock")
    with KubeletSocket(socket) as kubelet:
        kubelet.set_pods(
            [
                pod(
                    NAMESPACE,
                    "served-0",
                    containers=[container("server", devices=[gpus(GPU_UUIDS[0])])],
                )
            ]
        )
        agent = start_scaler(
            "rbac-agent",
            [
                f"--source=replay:{trace}",
                f"--pod-resources-socket={socket}",
                "--pod-resources-interval=1",
                f"--node-name={gpu_nodes[0]}",
            ],
            logs=plane.paths.logs,
            ports=PORTS,
            env=dict(os.environ) | {"KUBECONFIG": str(kubeconfig)},
        )
        client = ScalerClient(grpcio_mods, f"127.0.0.1:{PORTS.grpc}")
        try:
            wait_for(
                "the podSelector trigger answered from the pod watch",
                lambda: client.outcome(TRIGGER, namespace=NAMESPACE) == 42.0,
                timeout_s=30,
            )
            # Let a watch run and be resumed at least once more than it needed to start.
            plane.admin.patch(
                f"/api/v1/namespaces/{NAMESPACE}/pods/served-0",
                {"metadata": {"labels": {"app": "gone"}}},
            )
            wait_for(
                "the relabel seen",
                lambda: client.outcome(TRIGGER, namespace=NAMESPACE) == 0.0,
                timeout_s=30,
            )
        finally:
            client.close()
            agent.stop()

    user = f"system:serviceaccount:{KEDA_NAMESPACE}:{account}"
    _assert_exactly_granted(plane, user, role, began)


def _assert_exactly_granted(
    plane: ControlPlane, user: str, role: dict[str, Any], since: float
) -> None:
    requests = requests_of(plane, user, since)
    assert requests, f"no request of {user} in the audit log"
    refused = [
        (e["verb"], e["requestURI"]) for e in requests if e["responseStatus"].get("code") == 403
    ]
    assert refused == [], refused
    used = {
        (e["objectRef"].get("apiGroup", ""), e["objectRef"]["resource"], e["verb"])
        for e in requests
    }
    grants = granted(role["rules"])
    assert used <= grants, f"used but not granted: {used - grants}"
    assert grants <= used, f"granted but never used (remove from the chart): {grants - used}"


def test_the_cluster_scaler_needs_exactly_what_the_chart_grants(
    plane: ControlPlane,
    cluster_release: Release,
    grpcio_mods: GrpcioModules,
    tmp_path: Path,
) -> None:
    began = time.time()
    plane.namespace(NAMESPACE)
    deployment = cluster_release.find("Deployment")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    role = next(
        r
        for r in cluster_release.all("ClusterRole")
        if r["metadata"]["name"] == deployment["metadata"]["name"]
    )
    kubeconfig = plane.kubeconfig_for(CLUSTER_NAMESPACE, account, tmp_path / "cluster.kubeconfig")
    service = f"{cluster_release.find('DaemonSet')['metadata']['name']}-agents"
    scaler = start_scaler(
        "rbac-cluster",
        [
            "--source=agents",
            f"--agents=endpoints:{CLUSTER_NAMESPACE}/{service}:grpc",
            "--pod-resources-socket=",
        ],
        logs=plane.paths.logs,
        ports=CLUSTER_PORTS,
        env=dict(os.environ) | {"KUBECONFIG": str(kubeconfig)},
        wait_ready=False,
    )
    client = ScalerClient(grpcio_mods, f"127.0.0.1:{CLUSTER_PORTS.grpc}")
    user = f"system:serviceaccount:{CLUSTER_NAMESPACE}:{account}"
    try:
        # A trigger naming a namespace starts the watch of its pods (--pod-namespaces triggers),
        # asked again until the scaler (not waited for: it has no agent) is listening.
        def watching() -> bool:
            client.outcome(TRIGGER, namespace=NAMESPACE)
            requests = requests_of(plane, user, began)
            return {"pods", "endpointslices"} <= {
                e["objectRef"]["resource"] for e in requests if e["verb"] == "watch"
            }

        wait_for("the cluster scaler watching pods and EndpointSlices", watching, timeout_s=30)
    finally:
        client.close()
        scaler.stop()
    _assert_exactly_granted(plane, user, role, began)
