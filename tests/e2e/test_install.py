"""Install: the chart, in every variant the docs offer, through real admission.

Each variant goes into a namespace labelled with the Pod Security Standard the docs claim for
it (``docs/getting-started.md``, ``docs/operations.md``: pod attribution needs
``privileged``, without it the pod meets ``restricted``). The API server validates every
object against its schema, the DaemonSet controller then creates the pods, and Pod Security
admission decides on each: a refused pod is a ``FailedCreate`` event on the DaemonSet. A
variant passes when the DaemonSet's pod exists on the GPU node and nothing was refused or
warned about; the default variant in a ``baseline`` namespace must be refused, as the docs
say.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.harness.chart import VALUES, Helm, Release
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.kubelet import Kubelet
from tests.e2e.harness.processes import wait_for

ENFORCE = "pod-security.kubernetes.io/enforce"


@dataclass(frozen=True)
class Variant:
    name: str
    values: tuple[str, ...]
    standard: str
    """The Pod Security Standard the docs claim this variant meets."""
    prepare: Callable[[ControlPlane, str], None] = field(default=lambda plane, ns: None)


def _service_account(name: str) -> Callable[[ControlPlane, str], None]:
    def make(plane: ControlPlane, namespace: str) -> None:
        plane.admin.apply(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": namespace},
            }
        )

    return make


VARIANTS = [
    Variant("default", (), "privileged"),
    Variant("no-pod-attribution", ("no-pod-attribution-values.yaml",), "restricted"),
    Variant("no-gpu-replay", ("no-gpu-replay-values.yaml",), "privileged"),
    Variant("tls", ("tls-values.yaml",), "privileged"),
    Variant("go-chart", ("go-chart-values.yaml",), "privileged"),
    Variant(
        "k0s", ("k0s-pod-attribution-values.yaml",), "privileged", _service_account("gpu-scaler")
    ),
    Variant("prometheus", ("prometheus-values.yaml",), "privileged"),
    Variant("per-process", ("per-process-values.yaml",), "privileged"),
    # The node agents (pod attribution: privileged) and the cluster scaler (restricted).
    Variant("cluster", ("cluster-values.yaml",), "privileged"),
]


def _namespace(plane: ControlPlane, name: str, standard: str) -> None:
    labels = {
        f"pod-security.kubernetes.io/{mode}": standard for mode in ("enforce", "warn", "audit")
    }
    plane.namespace(name, labels)


def _owned_pods(plane: ControlPlane, release: Release, kind: str) -> list[dict[str, Any]]:
    """The pods the release's DaemonSet (or Deployment, through its ReplicaSet) made."""
    pods = plane.admin.get(f"/api/v1/namespaces/{release.namespace}/pods")["items"]
    name = release.find(kind)["metadata"]["name"]
    owner = "DaemonSet" if kind == "DaemonSet" else "ReplicaSet"
    return [
        p
        for p in pods
        if any(
            o["kind"] == owner and o["name"].startswith(name)
            for o in p["metadata"].get("ownerReferences", [])
        )
    ]


def _daemonset_pods(plane: ControlPlane, release: Release) -> list[dict[str, Any]]:
    return _owned_pods(plane, release, "DaemonSet")


def _refusals(plane: ControlPlane, namespace: str) -> list[str]:
    events = plane.admin.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [e["message"] for e in events if e.get("reason") == "FailedCreate"]


def _install(plane: ControlPlane, helm: Helm, variant: Variant, namespace: str) -> Release:
    variant.prepare(plane, namespace)
    return helm.install(
        f"gpu-{variant.name}", namespace, values=[VALUES / v for v in variant.values]
    )


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_each_variant_installs_and_its_pod_is_admitted_at_the_standard_the_docs_claim(
    plane: ControlPlane, gpu_nodes: list[str], helm: Helm, variant: Variant
) -> None:
    namespace = f"install-{variant.name}"
    _namespace(plane, namespace, variant.standard)
    release = _install(plane, helm, variant, namespace)
    try:
        assert "PodSecurity" not in release.warnings, release.warnings
        wait_for(
            f"{variant.name}: the DaemonSet's pod on {gpu_nodes[0]}",
            lambda: bool(_daemonset_pods(plane, release)) or bool(_refusals(plane, namespace)),
            timeout_s=60,
        )
        assert _refusals(plane, namespace) == []
        pods = _daemonset_pods(plane, release)
        assert pods, f"no pod of {variant.name}"
        assert pods[0]["metadata"]["labels"]["app.kubernetes.io/name"] == "keda-gpu-scaler"
        replicas = sum(d["spec"]["replicas"] for d in release.all("Deployment"))
        if replicas:
            wait_for(
                f"{variant.name}: the cluster scaler's pods",
                lambda: (
                    len(_owned_pods(plane, release, "Deployment")) == replicas
                    or bool(_refusals(plane, namespace))
                ),
                timeout_s=60,
            )
            assert _refusals(plane, namespace) == []
    finally:
        helm.uninstall(release.name, namespace)
        plane.admin.delete(f"/api/v1/namespaces/{namespace}")


def test_pod_attribution_is_refused_by_the_baseline_standard_as_the_docs_say(
    plane: ControlPlane, gpu_nodes: list[str], helm: Helm
) -> None:
    namespace = "install-baseline"
    _namespace(plane, namespace, "baseline")
    release = _install(plane, helm, VARIANTS[0], namespace)
    try:
        # helm prints the API server's warning as a log line, its quotes escaped
        assert "would violate PodSecurity" in release.warnings
        assert "baseline:latest" in release.warnings
        assert "hostPath volumes" in release.warnings
        wait_for("a FailedCreate event", lambda: bool(_refusals(plane, namespace)), timeout_s=60)
        assert "violates PodSecurity" in _refusals(plane, namespace)[0]
        assert _daemonset_pods(plane, release) == []
    finally:
        helm.uninstall(release.name, namespace)
        plane.admin.delete(f"/api/v1/namespaces/{namespace}")


def test_helm_upgrade_to_cluster_mode_keeps_the_address_and_rolls_the_agents_one_at_a_time(
    plane: ControlPlane, gpu_nodes: list[str], helm: Helm, pod_addresses: Iterator[str]
) -> None:
    """docs/migration.md: the Service keeps its name and then selects the cluster scaler; the
    agents' pods are replaced one node at a time; ``role=node-agents`` goes back."""
    namespace = "install-upgrade"
    _namespace(plane, namespace, "privileged")
    with Kubelet(plane.admin, namespaces=[namespace], nodes=gpu_nodes, addresses=pod_addresses):
        node = helm.install("upgrade", namespace)
        try:
            service = node.find("Service", node.find("DaemonSet")["metadata"]["name"])
            wait_for("three agents ready", lambda: _ready_agents(plane, node) == 3, timeout_s=60)
            before = {p["metadata"]["uid"] for p in _daemonset_pods(plane, node)}
            cluster = helm.install("upgrade", namespace, set_values=["role=cluster"], upgrade=True)
            unavailable = _watch_rollout(plane, cluster, before)
            moved = cluster.find("Service", service["metadata"]["name"])
            assert moved["spec"]["ports"] == service["spec"]["ports"]
            scaler_labels = cluster.find("Deployment")["spec"]["template"]["metadata"]["labels"]
            assert moved["spec"]["selector"].items() <= scaler_labels.items()
            agent_labels = cluster.find("DaemonSet")["spec"]["template"]["metadata"]["labels"]
            assert not moved["spec"]["selector"].items() <= agent_labels.items()
            assert max(unavailable) <= 1, unavailable  # one node at a time
            back = helm.install("upgrade", namespace, set_values=["role=node-agents"], upgrade=True)
            selector = back.find("Service", service["metadata"]["name"])["spec"]["selector"]
            assert selector == service["spec"]["selector"]
            assert back.all("Deployment") == []
        finally:
            helm.uninstall("upgrade", namespace)
            plane.admin.delete(f"/api/v1/namespaces/{namespace}")


def _ready_agents(plane: ControlPlane, release: Release) -> int:
    name = release.find("DaemonSet")["metadata"]["name"]
    path = f"/apis/apps/v1/namespaces/{release.namespace}/daemonsets/{name}"
    return int(plane.admin.get(path).get("status", {}).get("numberReady", 0))


def _watch_rollout(plane: ControlPlane, release: Release, before: set[str]) -> list[int]:
    """Samples the DaemonSet's unavailable pods until every old agent pod is replaced and
    the new ones are ready; returns the samples."""
    name = release.find("DaemonSet")["metadata"]["name"]
    path = f"/apis/apps/v1/namespaces/{release.namespace}/daemonsets/{name}"
    samples: list[int] = []

    def replaced() -> bool:
        status = plane.admin.get(path).get("status", {})
        samples.append(int(status.get("numberUnavailable", 0)))
        uids = {p["metadata"]["uid"] for p in _daemonset_pods(plane, release)}
        return not uids & before and status.get("numberReady") == 3

    wait_for("the agents rolled to the new template", replaced, timeout_s=120, every_s=0.1)
    return samples
