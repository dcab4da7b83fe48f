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

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.e2e.harness.chart import Release
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.kubelet import ready_status
from tests.e2e.harness.processes import wait_for
from tests.e2e.harness.scaler import Ports, account_of, cluster_scaler, node_agent
from tests.e2e.harness.traces import GPU_UUIDS, write_trace
from tests.fake_kubelet import container, gpus, pod
from tests.grpcio_client import GrpcioModules

NAMESPACE = "rbac"
PORTS = Ports(grpc=16050, metrics=19050, probes=18050)
CLUSTER_PORTS = Ports(grpc=16051, metrics=19051, probes=18051)
TRIGGER = {"metricType": "gpu_utilization", "podSelector": "app=served", "cooldownSeconds": "0"}

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


def assert_exactly_granted(
    plane: ControlPlane, user: str, role: dict[str, Any], since: float
) -> None:
    requests = plane.audit_requests(user, since)
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


def _role_of(release: Release, kind: str) -> dict[str, Any]:
    """The ClusterRole bound to the account the release's ``kind`` runs its pods with."""
    account = account_of(release, kind)
    binding = next(
        b
        for b in release.all("ClusterRoleBinding")
        if any(s["name"] == account for s in b["subjects"])
    )
    return release.find("ClusterRole", binding["roleRef"]["name"])


def _served_pod(plane: ControlPlane, node: str) -> None:
    created = plane.admin.post(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "served-0", "namespace": NAMESPACE, "labels": {"app": "served"}},
            "spec": {"nodeName": node, "containers": [{"name": "server", "image": "server"}]},
        },
    )
    plane.admin.put(
        f"/api/v1/namespaces/{NAMESPACE}/pods/served-0/status",
        created | {"status": ready_status(created, "10.99.1.50")},
    )


def test_the_node_agent_needs_exactly_what_the_chart_grants(
    plane: ControlPlane,
    gpu_nodes: list[str],
    node_release: Release,
    grpcio_mods: GrpcioModules,
    tmp_path: Path,
) -> None:
    began = time.time()
    plane.namespace(NAMESPACE)
    _served_pod(plane, gpu_nodes[0])
    trace = write_trace(tmp_path / "trace.jsonl", [(0, 42.0)], duration_s=600)
    with node_agent(
        plane,
        "rbac-agent",
        release=node_release,
        node=gpu_nodes[0],
        trace=trace,
        ports=PORTS,
        modules=grpcio_mods,
        folder=tmp_path,
    ) as agent:
        holder = pod(
            NAMESPACE, "served-0", containers=[container("server", devices=[gpus(GPU_UUIDS[0])])]
        )
        agent.kubelet.set_pods([holder])
        agent.client.await_outcome(TRIGGER, 42.0, namespace=NAMESPACE, timeout_s=30)
        # A change, so that the watch delivers an event besides its list.
        labels = {"metadata": {"labels": {"app": "gone"}}}
        plane.admin.patch(f"/api/v1/namespaces/{NAMESPACE}/pods/served-0", labels)
        agent.client.await_outcome(TRIGGER, 0.0, namespace=NAMESPACE, timeout_s=30)
    user = f"system:serviceaccount:{node_release.namespace}:{account_of(node_release)}"
    assert_exactly_granted(plane, user, _role_of(node_release, "DaemonSet"), began)


def test_the_cluster_scaler_needs_exactly_what_the_chart_grants(
    plane: ControlPlane,
    cluster_release: Release,
    grpcio_mods: GrpcioModules,
    tmp_path: Path,
) -> None:
    began = time.time()
    plane.namespace(NAMESPACE)
    account = account_of(cluster_release, "Deployment")
    user = f"system:serviceaccount:{cluster_release.namespace}:{account}"
    with cluster_scaler(
        plane,
        "rbac-cluster",
        release=cluster_release,
        ports=CLUSTER_PORTS,
        modules=grpcio_mods,
        folder=tmp_path,
    ) as scaler:
        # A trigger naming a namespace starts the watch of its pods (--pod-namespaces triggers),
        # asked again until the scaler (not waited for: it has no agent) is listening.
        def watching() -> bool:
            scaler.client.outcome(TRIGGER, namespace=NAMESPACE)
            watched = {
                e["objectRef"]["resource"]
                for e in plane.audit_requests(user, began)
                if e["verb"] == "watch"
            }
            return {"pods", "endpointslices"} <= watched

        wait_for("the cluster scaler watching pods and EndpointSlices", watching, timeout_s=30)
    assert_exactly_granted(plane, user, _role_of(cluster_release, "Deployment"), began)
