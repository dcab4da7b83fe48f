"""k8s/: the generated base, its overlays, the examples, the Dockerfile and the dashboard.

Rendered and checked offline with the tools of tests/k8s_tools.py. The base is generated
from the Helm chart (tests/test_chart.py checks that it matches); the overlays are
kustomize on top of it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kubernetes_validate  # type: ignore[import-untyped]

from keda_gpu_scaler import __version__
from keda_gpu_scaler.app.cli import build_parser
from keda_gpu_scaler.app.scaler.serve_flags import SERVE_FLAGS
from keda_gpu_scaler.domain.catalog import CATALOG, MetricType, Origin
from keda_gpu_scaler.domain.profiles import PROFILES
from keda_gpu_scaler.domain.trigger import parse_trigger
from keda_gpu_scaler.domain.trigger_keys import KEDA_KEYS
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.tap import Tap
from keda_gpu_scaler.serving.observability import SelfMetrics
from keda_gpu_scaler.sources.agents import EndpointsAgents, parse_agents
from tests.k8s_tools import (
    KUBERNETES_VERSION,
    Obj,
    crd_validator,
    load_all,
    run_tool,
    scratch,
    tool,
    validate,
)

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "k8s"
OVERLAYS = (
    "base",
    "overlays/tls",
    "overlays/prometheus",
    "overlays/node",
    "overlays/no-pod-attribution",
)
EXAMPLES = sorted((K8S / "examples").glob("*.yaml"))
DASHBOARD = K8S / "grafana" / "keda-gpu-scaler-dashboard.json"
IMAGE = "ghcr.io/keda-gpu-scaler/keda-gpu-scaler"
# The Go project's address: its users' ScaledObjects work unchanged.
NAMESPACE = "keda"
SCALER_ADDRESS = "keda-gpu-scaler.keda.svc.cluster.local:6000"
EXTERNAL = ("external", "external-push")
COUNT_UNITS = {"requests", "requests/s"}
"""Demand that composes over replicas (KEDA contract §11): AverageValue. Levels: Value."""
POD_ENV = {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NODE_NAME", "POD_NAME"}
POD_ENV |= {"POD_NAMESPACE"}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding"}
# What a kubelet gives the Downward API's variables, in the tests that parse them.
DOWNWARD = {"spec.nodeName": "gpu-node-1", "metadata.name": "keda-gpu-scaler-x7k2p"}
DOWNWARD |= {"metadata.namespace": NAMESPACE}
SCALER_UID = 65532
# Pod attribution: the kubelet's PodResources socket (the kubelet's root directory, then
# pod-resources/kubelet.sock) and the only rule the pod watch needs.
SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
POD_READER_RULES = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
SLICE_READER_RULES = [
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices"],
        "verbs": ["list", "watch"],
    }
]
"""The DRA join (podAttribution.draJoin): this node's ResourceSlices, and no ResourceClaim."""


@cache
def render(overlay: str) -> tuple[Obj, ...]:
    result = run_tool([tool("kubectl"), "kustomize", K8S / overlay], scratch())
    assert result.returncode == 0, result.stderr
    return load_all(result.stdout)


@cache
def examples() -> tuple[tuple[str, Obj], ...]:
    docs = []
    for path in EXAMPLES:
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return tuple(docs)


def of_kind(docs: Iterator[Obj] | tuple[Obj, ...], kind: str) -> list[Obj]:
    return [d for d in docs if d["kind"] == kind]


def daemonset_of(docs: tuple[Obj, ...]) -> Obj:
    (ds,) = of_kind(docs, "DaemonSet")
    return ds


def container_of(docs: tuple[Obj, ...]) -> Obj:
    containers: list[Obj] = daemonset_of(docs)["spec"]["template"]["spec"]["containers"]
    (c,) = containers
    return c


def env_of(docs: tuple[Obj, ...]) -> dict[str, Obj]:
    return {e["name"]: e for e in container_of(docs)["env"]}


def attributes_pods(docs: tuple[Obj, ...]) -> bool:
    """Whether the scaler attributes GPUs to pods: it is given a PodResources socket."""
    return bool(env_of(docs)["KEDA_GPU_SCALER_POD_RESOURCES_SOCKET"]["value"])


def daemonset(overlay: str) -> Obj:
    return daemonset_of(render(overlay))


def container(overlay: str) -> Obj:
    return container_of(render(overlay))


def scaled_objects() -> list[tuple[str, Obj]]:
    return [(f, d) for f, d in examples() if d["kind"] == "ScaledObject"]


def external_triggers() -> list[tuple[str, Obj, Obj]]:
    return [
        (f, d, t)
        for f, d in examples()
        if d["kind"] in ("ScaledObject", "ScaledJob")
        for t in d["spec"]["triggers"]
        if t["type"] in EXTERNAL
    ]


def scaler_metadata(trigger: Obj) -> dict[str, str]:
    """What the scaler parses: KEDA's own keys are KEDA's (contract §2)."""
    return {k: v for k, v in trigger["metadata"].items() if k not in KEDA_KEYS}


# --- kustomize and the Kubernetes schemas -------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomize_renders_offline(overlay: str) -> None:
    docs = render(overlay)
    kinds = {d["kind"] for d in docs}
    assert {"ServiceAccount", "DaemonSet", "Service"} <= kinds
    for doc in docs:
        assert doc["metadata"]["name"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "keda-gpu-scaler"
        assert_namespaced(doc)


def assert_namespaced(doc: Obj) -> None:
    """In namespace keda, or cluster-scoped (where a namespace would be an error)."""
    if doc["kind"] in CLUSTER_SCOPED:
        assert "namespace" not in doc["metadata"], doc["kind"]
    else:
        assert doc["metadata"]["namespace"] == NAMESPACE, doc["kind"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_overlay_owns_the_namespace(overlay: str) -> None:
    """Namespace keda is KEDA's: `kubectl delete -k` of one node's overlay (or of the
    base) must remove the scaler's objects, never the namespace and everything in it."""
    assert of_kind(render(overlay), "Namespace") == []


def test_kustomizations_name_files_that_exist() -> None:
    for kustomization in K8S.glob("**/kustomization.yaml"):
        for path in re.findall(r"(?<![\w/.-])(k8s/[\w./-]*\.ya?ml)", kustomization.read_text()):
            assert (ROOT / path).is_file(), f"{kustomization.relative_to(ROOT)}: {path}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_objects_match_the_kubernetes_schemas(overlay: str) -> None:
    checked = sum(validate(doc) for doc in render(overlay))
    assert checked >= 4


def test_strict_validation_catches_a_misspelt_field() -> None:
    ds = json.loads(json.dumps(daemonset("base")))
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True
    with pytest.raises(jsonschema.ValidationError, match="runAsNonroot"):
        kubernetes_validate.validate(ds, KUBERNETES_VERSION, strict=True)


def test_image_is_the_package_version() -> None:
    assert container("base")["image"] == f"{IMAGE}:{__version__}"


# --- the DaemonSet --------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_daemonset_runs_unprivileged_on_gpu_nodes(overlay: str) -> None:
    pod = daemonset(overlay)["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert set(pod["nodeSelector"]) <= {"nvidia.com/gpu.present", "kubernetes.io/hostname"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["terminationGracePeriodSeconds"] <= 10
    assert_hardened(render(overlay))


def assert_hardened(docs: tuple[Obj, ...]) -> None:
    """The pod of the base: unprivileged, no host access but the PodResources directory
    (read-only), no GPU taken; uid 0 without any capability only when it attributes pods."""
    pod = daemonset_of(docs)["spec"]["template"]["spec"]
    c = container_of(docs)
    # hostPID only for per-process readings (podAttribution.perProcess), which say so.
    per_process = any(e["name"] == "KEDA_GPU_SCALER_HOST_PROC" for e in c.get("env", []))
    assert pod.get("hostPID", False) is per_process
    for key in ("hostNetwork", "hostIPC", "hostUsers"):
        assert key not in pod, key  # hostUsers: false would make uid 0 not the socket's owner
    # A Service named keda-gpu-scaler would inject KEDA_GPU_SCALER_PORT=tcp://...
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsGroup"] == SCALER_UID
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not {"supplementalGroups", "sysctls"} & set(pod["securityContext"])
    security = c["securityContext"]
    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert not {"runAsUser", "runAsGroup", "seLinuxOptions", "procMount"} & set(security)
    env = env_of(docs)
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    resources = c["resources"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources[kind]), kind
        assert "nvidia.com/gpu" not in resources[kind], "the scaler must not take a GPU"
    if attributes_pods(docs):
        assert_attribution_on(docs)
    else:
        assert_attribution_off(docs)


def host_paths(pod: Obj) -> list[Obj]:
    return [v for v in pod.get("volumes", []) if "hostPath" in v]


def assert_attribution_on(docs: tuple[Obj, ...]) -> None:
    """The socket's directory read-only, uid 0 with nothing more, a token, this node."""
    pod = daemonset_of(docs)["spec"]["template"]["spec"]
    c = container_of(docs)
    env = env_of(docs)
    socket = Path(env["KEDA_GPU_SCALER_POD_RESOURCES_SOCKET"]["value"])
    assert socket.is_absolute() and socket.name == "kubelet.sock"
    assert socket.parent.name == "pod-resources"
    (volume,) = host_paths(pod)
    assert volume["hostPath"] == {"path": str(socket.parent), "type": "Directory"}
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
    assert mount == {"name": volume["name"], "mountPath": str(socket.parent), "readOnly": True}
    # The owner of the socket, root:root 0755: uid 0, and no capability, no escalation.
    assert pod["securityContext"]["runAsUser"] == 0
    assert pod["securityContext"]["runAsNonRoot"] is False
    assert c["securityContext"]["runAsNonRoot"] is False
    assert pod["automountServiceAccountToken"] is True
    assert env["NODE_NAME"] == {
        "name": "NODE_NAME",
        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }
    assert env["KEDA_GPU_SCALER_POD_RESOURCES_INTERVAL"]["value"]
    assert env["KEDA_GPU_SCALER_GPU_RESOURCE_NAMES"]["value"]
    assert env["KEDA_GPU_SCALER_DRA_JOIN"]["value"] in ("true", "false")
    assert_pod_reader(docs)


def assert_attribution_off(docs: tuple[Obj, ...]) -> None:
    """The locked-down pod: uid 65532, no hostPath, no token, no socket, no RBAC."""
    pod = daemonset_of(docs)["spec"]["template"]["spec"]
    c = container_of(docs)
    env = env_of(docs)
    assert host_paths(pod) == []
    assert pod["securityContext"]["runAsUser"] == SCALER_UID
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    # An empty socket turns attribution off, and the pod watch with it; the node name stays
    # for gpu-metrics.
    assert env["KEDA_GPU_SCALER_POD_RESOURCES_SOCKET"] == {
        "name": "KEDA_GPU_SCALER_POD_RESOURCES_SOCKET",
        "value": "",
    }
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "KEDA_GPU_SCALER_POD_RESOURCES_INTERVAL" not in env
    assert "KEDA_GPU_SCALER_GPU_RESOURCE_NAMES" not in env
    assert "KEDA_GPU_SCALER_DRA_JOIN" not in env
    assert [d["kind"] for d in docs if d["kind"] in CLUSTER_SCOPED] == []
    assert of_kind(docs, "Role") == of_kind(docs, "RoleBinding") == []


def assert_pod_reader(docs: tuple[Obj, ...]) -> None:
    """One ClusterRole, list and watch on pods (and, with the DRA join on, on
    resourceslices) only, bound to the pods' account only."""
    pod = daemonset_of(docs)["spec"]["template"]["spec"]
    (role,) = of_kind(docs, "ClusterRole")
    (binding,) = of_kind(docs, "ClusterRoleBinding")
    joins = env_of(docs)["KEDA_GPU_SCALER_DRA_JOIN"]["value"] == "true"
    assert role["rules"] == POD_READER_RULES + (SLICE_READER_RULES if joins else [])
    assert "aggregationRule" not in role
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
    assert binding["subjects"] == [account]
    for created in of_kind(docs, "ServiceAccount"):
        assert created["metadata"]["name"] == pod["serviceAccountName"]
        # Other pods of the account get no token by default; this pod asks for one.
        assert created["automountServiceAccountToken"] is False
    assert of_kind(docs, "Role") == of_kind(docs, "RoleBinding") == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_daemonset_args_and_env_are_serve_flags(
    overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = assert_serve_flags(render(overlay), monkeypatch)
    assert args.source == "nvml"


def assert_serve_flags(docs: tuple[Obj, ...], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The container's args and KEDA_GPU_SCALER_* variables parse as `serve` parses them."""
    c = container_of(docs)
    variables = {f.variable for f in SERVE_FLAGS}
    flags = {f.name for f in SERVE_FLAGS}
    assert c["args"][0] == "serve"
    for arg in c["args"][1:]:
        assert arg.split("=")[0] in flags, arg
    plain = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    for name in (e["name"] for e in c["env"]):
        if name.startswith("KEDA_GPU_SCALER_"):
            assert name in variables, name
        else:
            assert name in POD_ENV, name
    # The values parse as the server would parse them (flags read their variables), the
    # Downward API's as a kubelet would fill them in.
    for e in c["env"]:
        value = e["value"] if "value" in e else DOWNWARD[e["valueFrom"]["fieldRef"]["fieldPath"]]
        monkeypatch.setenv(e["name"], value)
    args = build_parser().parse_args(c["args"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    wanted = {"grpc": args.port, "metrics": args.metrics_port, "probes": args.probe_port}
    assert ports == {name: port for name, port in wanted.items() if port}
    # Pod attribution is on with a socket (the pod watch needs the node name too), off
    # without; the node name is always there.
    socket = plain["KEDA_GPU_SCALER_POD_RESOURCES_SOCKET"]
    assert args.pod_resources_socket == socket
    assert args.node_name == DOWNWARD["spec.nodeName"]
    return args


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_use_the_probe_port(overlay: str) -> None:
    c = container(overlay)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["probes"] == 8081
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        http = c[probe]["httpGet"]
        assert http["path"] == path
        assert http["port"] in ("probes", 8081)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_reach_the_named_ports(overlay: str) -> None:
    docs = render(overlay)
    ds = daemonset(overlay)
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in container(overlay)["ports"]}
    services = of_kind(docs, "Service")
    assert len(services) == 2
    assert sum(s["spec"].get("type") == "ClusterIP" for s in services) == 1
    assert sum(s["spec"].get("clusterIP") == "None" for s in services) == 1
    for service in services:
        assert service["spec"]["selector"].items() <= pod_labels.items()
        by_name = {p["name"]: p for p in service["spec"]["ports"]}
        assert by_name["grpc"]["port"] == 6000
        assert by_name["metrics"]["port"] == 9090
        for port in by_name.values():
            assert port["targetPort"] in ports


def test_node_overlay_has_its_own_selectors() -> None:
    """Its Service reaches one node's scaler only; the base's selectors miss its pods."""
    pod_labels = daemonset("overlays/node")["spec"]["template"]["metadata"]["labels"]
    pod = daemonset("overlays/node")["spec"]["template"]["spec"]
    node = pod["nodeSelector"]["kubernetes.io/hostname"]
    assert pod_labels["keda-gpu-scaler/node"] == node
    for service in of_kind(render("overlays/node"), "Service"):
        assert service["spec"]["selector"]["keda-gpu-scaler/node"] == node
        assert service["metadata"]["name"].endswith(f"-{node}")
    for base in (daemonset("base"), *of_kind(render("base"), "Service")):
        selector = base["spec"].get("selector", {})
        selector = selector.get("matchLabels", selector)
        assert not selector.items() <= pod_labels.items(), base["metadata"]["name"]


def test_tls_overlay_mounts_the_secret_and_sets_the_flags() -> None:
    pod = daemonset("overlays/tls")["spec"]["template"]["spec"]
    c = container("overlays/tls")
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "keda-gpu-scaler-tls"
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert "subPath" not in mount, "a subPath mount never sees a rotated certificate"
    env = {e["name"]: e.get("value") for e in c["env"]}
    for variable, file in (
        ("KEDA_GPU_SCALER_TLS_CERT", "tls.crt"),
        ("KEDA_GPU_SCALER_TLS_KEY", "tls.key"),
        ("KEDA_GPU_SCALER_TLS_CLIENT_CA", "ca.crt"),
    ):
        assert env[variable] == f"{mount['mountPath']}/{file}"
    assert "KEDA_GPU_SCALER_TLS_CERT" not in {e["name"] for e in container("base")["env"]}


ATTRIBUTING = tuple(o for o in OVERLAYS if o != "overlays/no-pod-attribution")


@pytest.mark.parametrize("overlay", ATTRIBUTING)
def test_pod_attribution_reads_the_kubelet_socket_and_this_nodes_pods(overlay: str) -> None:
    docs = render(overlay)
    env = env_of(docs)
    assert env["KEDA_GPU_SCALER_POD_RESOURCES_SOCKET"]["value"] == SOCKET
    assert env["KEDA_GPU_SCALER_POD_RESOURCES_INTERVAL"]["value"] == "5"
    assert env["KEDA_GPU_SCALER_GPU_RESOURCE_NAMES"]["value"] == "nvidia.com/gpu,nvidia.com/mig-*"
    assert_attribution_on(docs)
    kinds = sorted(d["kind"] for d in docs if d["kind"] in CLUSTER_SCOPED)
    assert kinds == ["ClusterRole", "ClusterRoleBinding"]


def test_no_pod_attribution_overlay_is_the_locked_down_pod() -> None:
    docs = render("overlays/no-pod-attribution")
    assert not attributes_pods(docs)
    assert_attribution_off(docs)
    # Everything else is the base's.
    assert {d["kind"] for d in docs} == {"ServiceAccount", "Service", "DaemonSet"}
    base = {(d["kind"], d["metadata"]["name"]): d for d in render("base")}
    for doc in docs:
        if doc["kind"] != "DaemonSet":
            assert doc == base[(doc["kind"], doc["metadata"]["name"])]


def test_node_overlay_binds_its_own_account() -> None:
    """kustomize's name suffix reaches the binding's role and subject: the node's scaler
    is bound, not the base's account."""
    docs = render("overlays/node")
    (binding,) = of_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "keda-gpu-scaler-gpu-node-1"
    assert binding["subjects"][0]["name"] == "keda-gpu-scaler-gpu-node-1"
    assert_pod_reader(docs)


def widened(docs: tuple[Obj, ...], change: str) -> tuple[Obj, ...]:
    """A copy of the base with one privilege more than it needs."""
    copy: tuple[Obj, ...] = tuple(json.loads(json.dumps(docs)))
    (ds,) = of_kind(copy, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    (role,) = of_kind(copy, "ClusterRole")
    if change == "writable mount":
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == "pod-resources"]
        mount["readOnly"] = False
    elif change == "a capability":
        c["securityContext"]["capabilities"]["add"] = ["DAC_OVERRIDE"]
    elif change == "escalation":
        c["securityContext"]["allowPrivilegeEscalation"] = True
    elif change == "privileged":
        c["securityContext"]["privileged"] = True
    elif change == "host root":
        (volume,) = host_paths(pod)
        volume["hostPath"]["path"] = "/"
    elif change == "user namespace":
        pod["hostUsers"] = False
    elif change == "secrets":
        role["rules"].append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]})
    elif change == "writes pods":
        role["rules"][0]["verbs"].append("patch")
    elif change == "no node name":
        env = {e["name"]: e for e in c["env"]}
        env["NODE_NAME"].pop("valueFrom")
        env["NODE_NAME"]["value"] = ""
    else:
        raise AssertionError(change)
    return copy


@pytest.mark.parametrize(
    "change",
    [
        "writable mount",
        "a capability",
        "escalation",
        "privileged",
        "host root",
        "user namespace",
        "secrets",
        "writes pods",
        "no node name",
    ],
)
def test_hardening_check_refuses_a_widened_pod(change: str) -> None:
    docs = render("base")
    assert_hardened(docs)
    with pytest.raises(AssertionError):
        assert_hardened(widened(docs, change))


def test_service_monitor_scrapes_each_pod_once() -> None:
    docs = render("overlays/prometheus")
    (monitor,) = of_kind(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    wanted = spec["selector"]["matchLabels"]
    selected = [
        s for s in of_kind(docs, "Service") if wanted.items() <= s["metadata"]["labels"].items()
    ]
    assert [s["metadata"]["name"] for s in selected] == ["keda-gpu-scaler-pods"]
    (service,) = selected
    assert spec["endpoints"]
    for endpoint in spec["endpoints"]:
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert endpoint["path"] == "/metrics"


# --- the cluster overlay: node agents and the cluster scaler --------------------------------

CLUSTER = "overlays/cluster"
CLUSTER_SCALER = "keda-gpu-scaler-cluster"
CLUSTER_READER_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    {
        "apiGroups": ["discovery.k8s.io"],
        "resources": ["endpointslices"],
        "verbs": ["list", "watch"],
    },
]
CLUSTER_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service"}
CLUSTER_KINDS |= {"DaemonSet", "Deployment", "NetworkPolicy", "PodDisruptionBudget"}
ROLE_ANNOTATION = "keda-gpu-scaler/role"


def by_name(docs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    (doc,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def cluster_deployment(docs: tuple[Obj, ...]) -> Obj:
    return by_name(docs, "Deployment", CLUSTER_SCALER)


def cluster_container(docs: tuple[Obj, ...]) -> Obj:
    (c,) = cluster_deployment(docs)["spec"]["template"]["spec"]["containers"]
    result: Obj = c
    return result


def pod_labels_of(workload: Obj) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def agents_part(docs: tuple[Obj, ...]) -> tuple[Obj, ...]:
    """The overlay without the cluster scaler's objects: what the node agents are."""
    return tuple(
        d
        for d in docs
        if d["metadata"]["labels"].get("app.kubernetes.io/component") != "cluster-scaler"
        and d["kind"] not in ("Deployment", "NetworkPolicy")
    )


def test_cluster_overlay_renders_and_validates() -> None:
    docs = render(CLUSTER)
    assert {d["kind"] for d in docs} == CLUSTER_KINDS
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "keda-gpu-scaler"
        assert_namespaced(doc)
        assert validate(doc), doc["kind"]
    assert of_kind(docs, "Namespace") == of_kind(docs, "Role") == of_kind(docs, "RoleBinding") == []


def test_cluster_overlay_keeps_the_base_agents() -> None:
    """The node agents are the base's DaemonSet, account and role, unchanged."""
    docs = render(CLUSTER)
    base = {(d["kind"], d["metadata"]["name"]): d for d in render("base")}
    agents = {(d["kind"], d["metadata"]["name"]): d for d in agents_part(docs)}
    # The base's objects but KEDA's Service (the cluster scaler's now), and the agents'
    # discovery Service.
    kedas = ("Service", "keda-gpu-scaler")
    discovery = ("Service", "keda-gpu-scaler-agents")
    assert set(agents) == set(base) - {kedas} | {discovery}
    for key, doc in agents.items():
        if key not in (discovery, ("DaemonSet", "keda-gpu-scaler")):
            assert doc == base[key], key
    # The DaemonSet but the role in its pod template (changing the role restarts the agents,
    # so that KEDA's open connection moves to the cluster scaler).
    agents_daemonset = json.loads(json.dumps(daemonset_of(docs)))
    template = agents_daemonset["spec"]["template"]["metadata"]
    assert template.pop("annotations") == {ROLE_ANNOTATION: "cluster"}
    assert agents_daemonset == daemonset("base")
    assert_hardened(agents_part(docs))


def test_cluster_scaler_survives_a_drain_and_a_node_lost() -> None:
    """Two replicas on different nodes where the cluster allows it, one kept in a drain."""
    docs = render(CLUSTER)
    deployment = cluster_deployment(docs)
    labels = deployment["spec"]["selector"]["matchLabels"]
    (budget,) = of_kind(docs, "PodDisruptionBudget")
    assert budget["spec"] == {"minAvailable": 1, "selector": {"matchLabels": labels}}
    assert selects(labels, pod_labels_of(deployment))
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (preferred,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    term = preferred["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"] == {"matchLabels": labels}
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def assert_cluster_scaler_locked_down(docs: tuple[Obj, ...]) -> None:
    """Two replicas of the DaemonSet's image as the locked-down pod: uid 65532, no host
    access, no GPU, no GPU runtime, a token of its own account."""
    deployment = cluster_deployment(docs)
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    c = cluster_container(docs)
    assert spec["replicas"] == 2
    assert spec["selector"]["matchLabels"].items() <= pod_labels_of(deployment).items()
    assert c["image"] == container_of(docs)["image"] == f"{IMAGE}:{__version__}"
    for key in ("hostNetwork", "hostPID", "hostIPC", "hostUsers", "runtimeClassName"):
        assert key not in pod, key
    assert host_paths(pod) == []
    assert "nvidia.com/gpu.present" not in pod.get("nodeSelector", {})
    assert pod["enableServiceLinks"] is False
    security = pod["securityContext"]
    assert security["runAsUser"] == security["runAsGroup"] == SCALER_UID
    assert security["runAsNonRoot"] is True
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not {"supplementalGroups", "sysctls"} & set(security)
    assert c["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind]), kind
        assert not any(r.startswith("nvidia.com/") for r in c["resources"][kind]), kind
    assert not any(e["name"].startswith("NVIDIA_") for e in c["env"])
    assert pod["automountServiceAccountToken"] is True
    account = by_name(docs, "ServiceAccount", pod["serviceAccountName"])
    assert account["automountServiceAccountToken"] is True
    assert (
        pod["serviceAccountName"]
        != daemonset_of(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    )


def test_cluster_scaler_is_the_locked_down_pod() -> None:
    docs = render(CLUSTER)
    assert_cluster_scaler_locked_down(docs)
    # Its probes are the agents'.
    agent = container_of(docs)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert cluster_container(docs)[probe] == agent[probe], probe


@pytest.mark.parametrize("change", ["uid 0", "a GPU", "hostPath", "GPU runtime", "one replica"])
def test_cluster_scaler_check_refuses_a_widened_pod(change: str) -> None:
    docs: tuple[Obj, ...] = tuple(json.loads(json.dumps(render(CLUSTER))))
    deployment = cluster_deployment(docs)
    pod = deployment["spec"]["template"]["spec"]
    if change == "uid 0":
        pod["securityContext"]["runAsUser"] = 0
    elif change == "a GPU":
        pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 1
    elif change == "hostPath":
        pod["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    elif change == "GPU runtime":
        pod["runtimeClassName"] = "nvidia"
    else:
        deployment["spec"]["replicas"] = 1
    with pytest.raises(AssertionError):
        assert_cluster_scaler_locked_down(docs)


def test_cluster_scaler_args_and_env_are_serve_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve --source agents`, the agents found through the agents' headless Service."""
    docs = render(CLUSTER)
    c = cluster_container(docs)
    flags = {f.name for f in SERVE_FLAGS}
    variables = {f.variable for f in SERVE_FLAGS}
    assert c["args"][0] == "serve"
    for arg in c["args"][1:]:
        assert arg.split("=")[0] in flags, arg
    for e in c["env"]:
        if e["name"].startswith("KEDA_GPU_SCALER_"):
            assert e["name"] in variables, e["name"]
        else:
            assert e["name"] in POD_ENV, e["name"]
        value = e["value"] if "value" in e else DOWNWARD[e["valueFrom"]["fieldRef"]["fieldPath"]]
        monkeypatch.setenv(e["name"], value)
    args = build_parser().parse_args(c["args"])
    assert args.source == "agents"
    # No kubelet and no node of its own: no PodResources socket, no node's pod watch.
    plain = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    assert plain["KEDA_GPU_SCALER_POD_RESOURCES_SOCKET"] == args.pod_resources_socket == ""
    assert args.node_name == ""
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": args.port, "metrics": args.metrics_port, "probes": args.probe_port}
    # --agents names the headless Service of the DaemonSet's pods and its gRPC port.
    spec = parse_agents(args.agents)
    assert isinstance(spec, EndpointsAgents)
    assert spec.namespace == NAMESPACE
    service = by_name(docs, "Service", spec.service)
    assert service["spec"]["clusterIP"] == "None"
    assert "publishNotReadyAddresses" not in service["spec"]
    assert service["spec"].get("ipFamilyPolicy", "SingleStack") == "SingleStack"
    assert selects(service["spec"]["selector"], pod_labels_of(daemonset_of(docs)))
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == spec.port]
    agent_ports = {p["name"]: p["containerPort"] for p in container_of(docs)["ports"]}
    assert port["port"] == 6000
    assert agent_ports[port["targetPort"]] == 6000


def assert_cluster_reader(docs: tuple[Obj, ...]) -> None:
    """The cluster scaler's account: one ClusterRole bound to it, reading pods and
    endpointslices and nothing else; the agents keep the base's pod reader."""
    account = cluster_deployment(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    subject = {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    bindings = [b for b in of_kind(docs, "ClusterRoleBinding") if subject in b["subjects"]]
    assert len(bindings) == 1, [b["metadata"]["name"] for b in bindings]
    (binding,) = bindings
    assert binding["subjects"] == [subject]
    assert binding["roleRef"]["kind"] == "ClusterRole"
    role = by_name(docs, "ClusterRole", binding["roleRef"]["name"])
    assert role["rules"] == CLUSTER_READER_RULES
    assert "aggregationRule" not in role
    assert_pod_reader(agents_part(docs))
    assert len(of_kind(docs, "ClusterRole")) == len(of_kind(docs, "ClusterRoleBinding")) == 2


def test_cluster_scaler_reads_pods_and_endpointslices_only() -> None:
    assert_cluster_reader(render(CLUSTER))


@pytest.mark.parametrize("change", ["secrets", "writes pods", "agents' role"])
def test_cluster_reader_check_refuses_a_widened_role(change: str) -> None:
    docs: tuple[Obj, ...] = tuple(json.loads(json.dumps(render(CLUSTER))))
    cluster_role = by_name(docs, "ClusterRole", CLUSTER_SCALER)
    if change == "secrets":
        cluster_role["rules"].append(
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
        )
    elif change == "writes pods":
        cluster_role["rules"][0]["verbs"].append("patch")
    else:
        by_name(docs, "ClusterRoleBinding", "keda-gpu-scaler")["subjects"].append(
            {"kind": "ServiceAccount", "name": CLUSTER_SCALER, "namespace": NAMESPACE}
        )
    with pytest.raises(AssertionError):
        assert_cluster_reader(docs)


def test_kedas_address_selects_the_cluster_scaler() -> None:
    """keda-gpu-scaler.keda.svc:6000 reaches the cluster scaler's pods, never an agent;
    the agents are reached through their headless Service only."""
    docs = render(CLUSTER)
    cluster_labels = pod_labels_of(cluster_deployment(docs))
    agent_labels = pod_labels_of(daemonset_of(docs))
    service = by_name(docs, "Service", "keda-gpu-scaler")
    assert service["spec"]["type"] == "ClusterIP"
    assert selects(service["spec"]["selector"], cluster_labels)
    assert not selects(service["spec"]["selector"], agent_labels)
    (grpc,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    address = f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{grpc['port']}"
    assert address == SCALER_ADDRESS
    ports = {p["name"] for p in cluster_container(docs)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    for other in of_kind(docs, "Service"):
        if other is not service:
            assert other["spec"]["clusterIP"] == "None", other["metadata"]["name"]
            assert not selects(other["spec"]["selector"], cluster_labels)
    # Neither workload's selector takes the other's pods.
    assert not selects(daemonset_of(docs)["spec"]["selector"]["matchLabels"], cluster_labels)
    selector = cluster_deployment(docs)["spec"]["selector"]["matchLabels"]
    assert not selects(selector, agent_labels)


def admits(
    policy: Obj, target: dict[str, str], source: dict[str, str], port: int, ports: dict[str, int]
) -> bool:
    """Whether ``policy`` (in namespace keda) lets a pod of keda labelled ``source`` reach
    ``port`` of a pod labelled ``target``; ``ports`` resolves named ports. A policy that
    does not select the target admits everything (no other policy exists here)."""
    spec = policy["spec"]
    assert set(spec["podSelector"]) == {"matchLabels"}, "only matchLabels is read here"
    if not selects(spec["podSelector"]["matchLabels"], target):
        return True
    assert "Ingress" in spec["policyTypes"]
    for rule in spec.get("ingress", []):
        rule_ports = [ports.get(p["port"], p["port"]) for p in rule.get("ports", [])]
        assert all(
            p.get("protocol", "TCP") == "TCP" and "endPort" not in p for p in rule.get("ports", [])
        )
        if rule_ports and port not in rule_ports:
            continue
        peers = rule.get("from", [])
        if not peers:
            return True
        for peer in peers:
            assert set(peer) == {"podSelector"}, "only same-namespace pod peers are read here"
            assert set(peer["podSelector"]) == {"matchLabels"}
            if selects(peer["podSelector"]["matchLabels"], source):
                return True
    return False


def test_network_policy_admits_only_the_cluster_scaler_to_the_agents_grpc() -> None:
    docs = render(CLUSTER)
    (policy,) = of_kind(docs, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    agent = pod_labels_of(daemonset_of(docs))
    cluster = pod_labels_of(cluster_deployment(docs))
    ports = {p["name"]: p["containerPort"] for p in container_of(docs)["ports"]}
    assert ports == {"grpc": 6000, "metrics": 9090, "probes": 8081}
    keda = {"app": "keda-operator", "app.kubernetes.io/name": "keda-operator"}
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    assert admits(policy, agent, cluster, 6000, ports)
    for other in (keda, prometheus, agent, {}):
        assert not admits(policy, agent, other, 6000, ports), other
    for port in (9090, 8081):
        for source in (keda, prometheus, cluster, {}):
            assert admits(policy, agent, source, port, ports), (source, port)
    # The cluster scaler's own pods are not restricted: KEDA reaches them.
    assert admits(policy, cluster, keda, 6000, ports)
    # The check can fail: without its `from`, the gRPC rule admits KEDA too.
    opened = json.loads(json.dumps(policy))
    del opened["spec"]["ingress"][0]["from"]
    assert admits(opened, agent, keda, 6000, ports)


# --- Dockerfile ---------------------------------------------------------------------------


def test_dockerfile_lints_clean_with_hadolint(tmp_path: Path) -> None:
    result = run_tool(
        [tool("hadolint"), "--disable-ignore-pragma", "--format", "json", ROOT / "Dockerfile"],
        tmp_path,
    )
    findings = json.loads(result.stdout)
    serious = [f for f in findings if f["level"] in ("error", "warning")]
    assert serious == [], serious
    assert result.returncode == 0, result.stderr


def test_dockerfile_final_stage() -> None:
    lines = [
        line.strip()
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    froms = [line for line in lines if line.startswith("FROM ")]
    assert len(froms) >= 2, "multi-stage"
    assert froms == ["FROM ${BASE} AS builder", "FROM ${BASE}"]
    # The default base is the official image pinned by digest; scripts/build_image.sh gives
    # one made here with --build-arg BASE.
    (base,) = [line for line in lines if line.startswith("ARG BASE=")]
    assert re.fullmatch(
        r"ARG BASE=docker\.io/library/python:3\.12-slim-bookworm@sha256:[0-9a-f]{64}", base
    )
    final = lines[lines.index(froms[-1]) :]
    assert "USER 65532:65532" in final
    assert 'ENTRYPOINT ["keda-gpu-scaler"]' in final
    assert 'CMD ["serve"]' in final
    defaults = {f.name: f.default for f in SERVE_FLAGS}
    exposed = next(line for line in final if line.startswith("EXPOSE ")).split()[1:]
    assert exposed == [defaults["--port"], defaults["--metrics-port"], defaults["--probe-port"]]
    assert not any(line.startswith("HEALTHCHECK") and "NONE" not in line for line in final)
    assert not any(re.search(r"\b(apt-get|gcc|build-essential)\b", line) for line in final)
    assert (ROOT / ".dockerignore").is_file()


# --- KEDA objects against the CRDs --------------------------------------------------------


def test_examples_exist_and_load() -> None:
    assert len(EXAMPLES) >= len(PROFILES)
    kinds = {d["kind"] for _, d in examples()}
    assert {"ScaledObject", "ScaledJob", "TriggerAuthentication"} <= kinds


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_objects_match_their_schemas(path: Path) -> None:
    for doc in load_all(path.read_text()):
        assert validate(doc), doc["kind"]


def test_crd_schema_refuses_a_misspelt_field() -> None:
    _, doc = scaled_objects()[0]
    bad = json.loads(json.dumps(doc))
    bad["spec"]["cooldownPeriode"] = 30
    assert not crd_validator("ScaledObject").is_valid(bad)


def test_min_replicas_at_most_max() -> None:
    # The CRD's x-kubernetes-validations rule, which JSON Schema cannot express.
    for _, doc in examples():
        if doc["kind"] in ("ScaledObject", "ScaledJob"):
            spec = doc["spec"]
            assert spec.get("minReplicaCount", 0) <= spec.get("maxReplicaCount", 100)


# --- what the examples ask of the scaler --------------------------------------------------


def test_every_profile_has_an_example() -> None:
    used = {t["metadata"].get("profile") for _, _, t in external_triggers()}
    assert set(PROFILES) - used == set()


@pytest.mark.parametrize(
    ("name", "trigger"),
    [(f"{f}:{d['metadata']['name']}", t) for f, d, t in external_triggers()],
)
def test_example_trigger_metadata_parses(name: str, trigger: Obj) -> None:
    metadata = trigger["metadata"]
    assert all(isinstance(v, str) for v in metadata.values()), "metadata values are strings"
    spec = parse_trigger(scaler_metadata(trigger))
    assert spec.warnings == ()


def test_examples_point_at_the_service() -> None:
    (service,) = [
        s for s in of_kind(render("base"), "Service") if s["metadata"]["name"] == "keda-gpu-scaler"
    ]
    (grpc,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    address = f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{grpc['port']}"
    assert address == SCALER_ADDRESS
    for _, _, trigger in external_triggers():
        assert trigger["metadata"]["scalerAddress"] == address


def test_example_metric_types_fit_the_hpa_arithmetic() -> None:
    for name, doc in scaled_objects():
        for trigger in doc["spec"]["triggers"]:
            info = CATALOG[parse_trigger(scaler_metadata(trigger)).metric_type]
            expected = "AverageValue" if info.unit in COUNT_UNITS else "Value"
            # Explicit, never KEDA's default (AverageValue), which caps percentages.
            assert trigger.get("metricType") == expected, (name, info.type)


def test_example_cooldown_is_the_profiles() -> None:
    for name, doc in scaled_objects():
        for trigger in doc["spec"]["triggers"]:
            profile = trigger["metadata"].get("profile")
            if profile is not None:
                assert doc["spec"]["cooldownPeriod"] == PROFILES[profile].keda_cooldown_s, name


def test_examples_scale_from_zero_only_on_a_queue() -> None:
    """Only demand that exists at zero replicas can wake a deployment (contract §5)."""
    for name, doc in examples():
        if doc["kind"] not in ("ScaledObject", "ScaledJob"):
            continue
        spec = doc["spec"]
        types = [
            parse_trigger(scaler_metadata(t)).metric_type
            for t in spec["triggers"]
            if t["type"] in EXTERNAL
        ]
        if spec.get("minReplicaCount", 0) == 0:  # KEDA's default is 0: it must be explicit
            assert "minReplicaCount" in spec, name
            assert any(
                CATALOG[t].origin is not Origin.GPU and CATALOG[t].unit in COUNT_UNITS
                for t in types
            ), name
        if MetricType.MEMORY_USED_PERCENT in types:
            assert spec["minReplicaCount"] >= 1, name


def test_mtls_example_uses_a_trigger_authentication() -> None:
    auths = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d
        for _, d in examples()
        if d["kind"] == "TriggerAuthentication"
    }
    users = [
        (d, t)
        for _, d, t in external_triggers()
        if t["metadata"].get("enableTLS") == "true" and "authenticationRef" in t
    ]
    assert users
    for doc, trigger in users:
        auth = auths[(doc["metadata"]["namespace"], trigger["authenticationRef"]["name"])]
        refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
        assert set(refs) == {"caCert", "tlsClientCert", "tlsClientKey"}
        assert len({r["name"] for r in refs.values()}) == 1
        assert "unsafeSsl" not in trigger["metadata"]


# --- the Grafana dashboard ----------------------------------------------------------------


def exported_series() -> set[str]:
    """Every series name a live SelfMetrics registry exports, suffixes included."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("_count", "_sum", "_created"),
    }

    async def collect() -> set[str]:
        tap = Tap()
        metrics = SelfMetrics(tap)
        metrics.read_live(lambda: SnapshotHub().current, lambda: 0)
        names = set()
        for family in metrics.registry.collect():
            names |= {family.name + s for s in suffixes.get(family.type, ("",))}
        return names

    return anyio.run(collect)


def dashboard_expressions() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [
        v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        for v in board["templating"]["list"]
        if v["type"] == "query"
    ]
    return exprs


def test_dashboard_uses_only_exported_series() -> None:
    exported = exported_series()
    assert "keda_gpu_scaler_grpc_requests_total" in exported  # the registry is really read
    used: set[str] = set()
    for expr in dashboard_expressions():
        names = set(re.findall(r"\bkeda_gpu_scaler_[a-z0-9_]+", expr))
        assert names, expr
        used |= names
    assert used - exported == set()
    for wanted in (
        "keda_gpu_scaler_gpu_utilization",
        "keda_gpu_scaler_gpu_sm_active",
        "keda_gpu_scaler_grpc_requests_total",
        "keda_gpu_scaler_grpc_request_duration_seconds_bucket",
        "keda_gpu_scaler_trigger_value",
        "keda_gpu_scaler_trigger_target",
        "keda_gpu_scaler_trigger_active",
        "keda_gpu_scaler_source_reading_age_seconds",
        "keda_gpu_scaler_open_streams",
        "keda_gpu_scaler_tap_dropped_events",
    ):
        assert wanted in used, wanted


def test_dashboard_is_well_formed() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"])
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
            assert panel["targets"], panel["title"]


# --- the image build and the release workflow ------------------------------------------------


def test_ci_builds_and_runs_the_image_after_the_tests() -> None:
    steps = [
        line.removeprefix("exec ")
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.startswith(("make ", "exec make "))
    ]
    assert steps[0] == "make test"
    assert "make image" in steps[1:]
    makefile = (ROOT / "Makefile").read_text()
    assert (
        "\nimage: $(VENV)/.installed\n\tPYTHON=$(BIN)/python scripts/build_image.sh\n" in makefile
    )
    script = (ROOT / "scripts" / "build_image.sh").read_text()
    assert os.access(ROOT / "scripts" / "build_image.sh", os.X_OK)
    # Offline, daemonless: vfs storage, chroot isolation, no network namespace of its own
    # but an empty one, the base made here; the checks run the image as its user, read-only.
    for needed in (
        "--storage-driver vfs",
        "unshare --net buildah",
        "--isolation chroot",
        "--pull=never",
        '--build-arg "BASE=$BASE"',
        "debootstrap --variant=minbase --include=python3,python3-venv",
        "mount -o remount,bind,ro",
        'chroot --userspec="$user"',
        "image --version",
        "image demo",
        "in_image gpu-metrics --source replay",
    ):
        assert needed in script, needed


def test_the_image_build_installs_only_from_the_wheelhouse_when_it_has_wheels() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY wheelhouse/ /wheels/" in dockerfile
    assert "--no-index --find-links /wheels" in dockerfile
    assert "!wheelhouse/" in (ROOT / ".dockerignore").read_text()
    assert (ROOT / "wheelhouse" / "README.md").is_file()


RELEASE = ROOT / ".github" / "workflows" / "release.yml"


def test_the_release_workflow_pushes_a_multi_platform_image_of_the_charts_name() -> None:
    workflow = yaml.safe_load(RELEASE.read_text())
    assert workflow[True] == {"push": {"tags": ["v*.*.*"]}}  # YAML 1.1 reads "on" as True
    (job,) = workflow["jobs"].values()
    assert job["permissions"] == {"contents": "read", "packages": "write"}
    (build,) = [s for s in job["steps"] if s.get("uses", "").startswith("docker/build-push")]
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert build["with"]["push"] is True
    values = yaml.safe_load((ROOT / "k8s/helm/keda-gpu-scaler/values.yaml").read_text())
    tags = build["with"]["tags"].splitlines()
    repository = values["image"]["repository"]
    assert tags == [
        f"{repository}:${{{{ steps.version.outputs.version }}}}",
        f"{repository}:${{{{ steps.version.outputs.minor }}}}",
    ]
    # Every action pinned to a major version at least.
    for step in job["steps"]:
        if "uses" in step:
            assert re.fullmatch(r"[\w-]+/[\w-]+@v\d+", step["uses"]), step["uses"]


# --- the oldest kustomize the docs support -------------------------------------------------

KUSTOMIZATIONS = sorted(
    str(p.parent.relative_to(K8S)) for p in K8S.glob("overlays/*/kustomization.yaml")
)


@pytest.mark.parametrize("overlay", ["base", *KUSTOMIZATIONS])
def test_kubectl_1_32_renders_every_overlay_as_the_current_one_does(overlay: str) -> None:
    """kubectl 1.32 embeds kustomize v5.5, which panicked on a file of several delete patches."""
    result = run_tool([tool("kubectl-1.32"), "kustomize", K8S / overlay], scratch())
    assert result.returncode == 0, result.stderr[:2000]
    assert load_all(result.stdout) == render(overlay)
