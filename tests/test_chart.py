"""The Helm chart k8s/helm/keda-gpu-scaler: linted, rendered, validated and refused offline.

helm comes from the test environment (scripts/fetch_tools.py puts it there when .venv is
built); no cluster and no network are used. Every rendered set is validated like the
kustomize renders (tests/k8s_tools.py), and the committed k8s/base and
k8s/keda-gpu-scaler.yaml must be exactly what the chart renders.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from keda_gpu_scaler import __version__
from tests.k8s_tools import Obj, load_all, run_tool, scratch, tool, validate
from tests.test_manifests import (
    CLUSTER_SCOPED,
    SCALER_ADDRESS,
    SCALER_UID,
    SOCKET,
    agents_part,
    assert_attribution_off,
    assert_attribution_on,
    assert_cluster_scaler_locked_down,
    assert_hardened,
    assert_namespaced,
    assert_pod_reader,
    assert_serve_flags,
    container_of,
    daemonset_of,
    env_of,
    of_kind,
    render,
)

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "k8s" / "helm" / "keda-gpu-scaler"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
RELEASE = "keda-gpu-scaler"
NAMESPACE = "keda"
GO_SELECTOR = {"app.kubernetes.io/name": RELEASE, "app.kubernetes.io/instance": RELEASE}


def helm(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_tool([tool("helm"), *args], scratch())


@cache
def template(values: Path | None = None, *sets: str) -> tuple[Obj, ...]:
    args: list[str | Path] = ["template", RELEASE, CHART, "--namespace", NAMESPACE]
    args += ["--values", values] if values else []
    for item in sets:
        args += ["--set", item]
    result = helm(*args)
    assert result.returncode == 0, result.stderr
    return load_all(result.stdout)


def refusal(*args: str) -> str:
    result = helm("template", RELEASE, CHART, "--namespace", NAMESPACE, *args)
    assert result.returncode != 0, f"accepted: {args}"
    return result.stderr


# --- lint and render ----------------------------------------------------------------------


def test_chart_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"  # Helm 3 and Helm 4
    assert chart["version"] == chart["appVersion"] == __version__


def test_helm_is_the_pinned_one() -> None:
    result = helm("version", "--short")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("v4."), result.stdout


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda p: p.name if p else "defaults")
def test_helm_lint_strict(values: Path | None) -> None:
    extra: list[str | Path] = ["--values", values] if values else []
    result = helm("lint", "--strict", CHART, *extra)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda p: p.name if p else "defaults")
def test_rendered_objects_match_their_schemas(
    values: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = template(values)
    assert sum(validate(doc) for doc in docs) >= 4
    for doc in docs:
        assert_namespaced(doc)
    if of_kind(docs, "Deployment"):  # role: cluster
        assert_cluster_scaler_locked_down(docs)
    assert_hardened(agents_part(docs))
    assert_serve_flags(agents_part(docs), monkeypatch)


# --- the Go project's address and release -------------------------------------------------


def test_defaults_give_the_go_projects_address() -> None:
    (service,) = [s for s in of_kind(template(), "Service") if s["spec"].get("type")]
    assert service["metadata"]["name"] == RELEASE
    assert service["spec"]["type"] == "ClusterIP"
    (grpc,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    assert grpc["port"] == 6000
    name = service["metadata"]["name"]
    assert f"{name}.{service['metadata']['namespace']}.svc.cluster.local:6000" == SCALER_ADDRESS
    pod_labels = daemonset_of(template())["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_daemonset_keeps_the_go_charts_name_and_selector() -> None:
    """`helm upgrade` of a Go-chart release: a DaemonSet's selector cannot change."""
    ds = daemonset_of(template())
    assert ds["metadata"]["name"] == RELEASE
    assert ds["spec"]["selector"] == {"matchLabels": GO_SELECTOR}
    (account,) = of_kind(template(), "ServiceAccount")
    assert account["metadata"]["name"] == RELEASE


def test_defaults_are_the_hardened_daemonset_of_the_base() -> None:
    assert daemonset_of(template()) == daemonset_of(render("base"))
    pod = daemonset_of(template())["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def by_name(ds: Obj) -> Obj:
    """A DaemonSet with its named lists sorted (a kustomize patch prepends its entries)."""
    copy: Obj = json.loads(json.dumps(ds))
    pod = copy["spec"]["template"]["spec"]
    pod["volumes"].sort(key=lambda v: v["name"])
    for c in pod["containers"]:
        c["env"].sort(key=lambda e: e["name"])
        c["volumeMounts"].sort(key=lambda m: m["name"])
    return copy


def test_tls_values_render_the_tls_overlay() -> None:
    docs = template(CHART / "ci" / "tls-values.yaml")
    assert by_name(daemonset_of(docs)) == by_name(daemonset_of(render("overlays/tls")))


def test_prometheus_values_render_the_prometheus_overlay() -> None:
    (chart,) = of_kind(template(CHART / "ci" / "prometheus-values.yaml"), "ServiceMonitor")
    (overlay,) = of_kind(render("overlays/prometheus"), "ServiceMonitor")
    assert chart == overlay


def test_go_chart_values_are_honoured() -> None:
    docs = template(CHART / "ci" / "go-chart-values.yaml")
    pod = daemonset_of(docs)["spec"]["template"]
    c = container_of(docs)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert c["image"] == "registry.example.com/keda-gpu-scaler:0.1.0"
    assert c["imagePullPolicy"] == "Always"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["spec"]["priorityClassName"] == "system-node-critical"
    assert pod["spec"]["affinity"]["nodeAffinity"]
    assert len(pod["spec"]["tolerations"]) == 2
    assert pod["metadata"]["labels"]["example.com/scrape"] == "true"
    assert pod["metadata"]["annotations"] == {"example.com/team": "ml-platform"}
    assert env["KEDA_GPU_SCALER_LOG_LEVEL"] == "warn"
    assert env["KEDA_GPU_SCALER_HEALTH_CHECK_INTERVAL"] == "30s"
    assert env["KEDA_GPU_SCALER_METRICS_PORT"] == "9100"
    assert env["KEDA_GPU_SCALER_PROBE_PORT"] == "8082"
    assert env["KEDA_GPU_SCALER_ENGINE_ALLOWED_NETWORKS"] == "10.0.0.0/8"
    assert c["readinessProbe"]["failureThreshold"] == 6
    assert c["resources"]["limits"] == {"cpu": "200m", "memory": "256Mi"}
    for doc in docs:
        assert doc["metadata"]["labels"]["example.com/cost-center"] == "gpu", doc["kind"]


def test_disabled_ports_leave_no_trace() -> None:
    docs = template(CHART / "ci" / "no-gpu-replay-values.yaml")
    c = container_of(docs)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KEDA_GPU_SCALER_METRICS_PORT"] == env["KEDA_GPU_SCALER_PROBE_PORT"] == "0"
    assert [p["name"] for p in c["ports"]] == ["grpc"]
    assert not {"livenessProbe", "readinessProbe", "startupProbe"} & set(c)
    for service in of_kind(docs, "Service"):
        assert [p["name"] for p in service["spec"]["ports"]] == ["grpc"]
    pod = daemonset_of(docs)["spec"]["template"]["spec"]
    assert "runtimeClassName" not in pod and "nodeSelector" not in pod


# --- pod attribution ----------------------------------------------------------------------

NO_ATTRIBUTION = CHART / "ci" / "no-pod-attribution-values.yaml"
K0S = CHART / "ci" / "k0s-pod-attribution-values.yaml"


def test_pod_attribution_is_on_by_default() -> None:
    docs = template()
    assert env_of(docs)["KEDA_GPU_SCALER_POD_RESOURCES_SOCKET"]["value"] == SOCKET
    assert_attribution_on(docs)


def test_no_pod_attribution_values_render_the_overlay() -> None:
    docs = template(NO_ATTRIBUTION)
    assert_attribution_off(docs)
    overlay = render("overlays/no-pod-attribution")
    assert by_name(daemonset_of(docs)) == by_name(daemonset_of(overlay))
    assert sorted(d["kind"] for d in docs) == sorted(d["kind"] for d in overlay)


def test_disabled_pod_attribution_is_the_pod_without_it() -> None:
    """Off, the pod is the locked-down one, with the TLS group and nothing of attribution."""
    docs = template(NO_ATTRIBUTION, "tls.enabled=true")
    pod = daemonset_of(docs)["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": SCALER_UID,
        "runAsGroup": SCALER_UID,
        "fsGroup": SCALER_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    mounts = {m["name"] for m in container_of(docs)["volumeMounts"]}
    assert mounts == {"tmp", "tls"}
    assert {v["name"] for v in pod["volumes"]} == {"tmp", "tls"}


def test_pod_attribution_follows_a_moved_kubelet_root() -> None:
    docs = template(K0S)
    pod = daemonset_of(docs)["spec"]["template"]["spec"]
    env = env_of(docs)
    directory = "/var/lib/k0s/kubelet/pod-resources"
    assert env["KEDA_GPU_SCALER_POD_RESOURCES_SOCKET"]["value"] == f"{directory}/kubelet.sock"
    assert env["KEDA_GPU_SCALER_POD_RESOURCES_INTERVAL"]["value"] == "10s"
    resource_names = "nvidia.com/gpu,nvidia.com/gpu.shared,nvidia.com/mig-*"
    assert env["KEDA_GPU_SCALER_GPU_RESOURCE_NAMES"]["value"] == resource_names
    (volume,) = [v for v in pod["volumes"] if "hostPath" in v]
    assert volume["hostPath"]["path"] == directory
    assert_attribution_on(docs)
    # The account the chart does not create is the one bound.
    assert of_kind(docs, "ServiceAccount") == []
    assert pod["serviceAccountName"] == "gpu-scaler"
    (binding,) = of_kind(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-scaler", "namespace": NAMESPACE}
    ]


def test_root_reads_the_tls_secret_as_its_owner_and_by_group() -> None:
    """uid 0 without CAP_DAC_OVERRIDE reads a 0440 file only as its owner or its group:
    the kubelet writes the Secret's files as root, and the process's group is fsGroup."""
    docs = template(CHART / "ci" / "tls-values.yaml")
    pod = daemonset_of(docs)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 0
    assert pod["securityContext"]["runAsGroup"] == pod["securityContext"]["fsGroup"] == SCALER_UID
    (tls,) = [v for v in pod["volumes"] if "secret" in v]
    assert tls["secret"]["defaultMode"] == 0o440


def test_rbac_create_false_leaves_the_binding_to_the_installer() -> None:
    docs = template(None, "rbac.create=false")
    assert [d for d in docs if d["kind"] in CLUSTER_SCOPED] == []
    # The pod still attributes: the token is mounted for a role someone else binds.
    pod = daemonset_of(docs)["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    assert_pod_reader(template())


def test_the_dra_join_reads_resourceslices_and_its_value_turns_both_off() -> None:
    on = template()
    assert env_of(on)["KEDA_GPU_SCALER_DRA_JOIN"]["value"] == "true"
    (role,) = of_kind(on, "ClusterRole")
    slices = {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"]}
    assert {**slices, "verbs": ["list", "watch"]} in role["rules"]
    assert not any("resourceclaims" in rule["resources"] for rule in role["rules"])
    off = template(None, "podAttribution.draJoin=false")
    assert env_of(off)["KEDA_GPU_SCALER_DRA_JOIN"]["value"] == "false"
    (role,) = of_kind(off, "ClusterRole")
    assert [rule["resources"] for rule in role["rules"]] == [["pods"]]
    assert_attribution_on(off)


def test_per_process_readings_add_host_pid_and_the_hosts_proc_and_nothing_else() -> None:
    off = template()
    assert "hostPID" not in daemonset_of(off)["spec"]["template"]["spec"]
    assert "KEDA_GPU_SCALER_HOST_PROC" not in env_of(off)
    on = template(None, "podAttribution.perProcess=true")
    pod = daemonset_of(on)["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert env_of(on)["KEDA_GPU_SCALER_HOST_PROC"]["value"] == "/proc"
    # No hostPath of /proc, no capability: the pod of pod attribution, plus hostPID.
    assert {v["name"] for v in pod["volumes"]} == {
        v["name"] for v in daemonset_of(off)["spec"]["template"]["spec"]["volumes"]
    }
    # Otherwise the hardened pod of pod attribution (which allows hostPID only with the
    # host's /proc given to the scaler).
    assert_hardened(on)
    assert "hostPID" in notes("podAttribution.perProcess=true")
    assert "hostPID" not in notes()
    stderr = refusal(
        "--set", "podAttribution.perProcess=true", "--set", "podAttribution.enabled=false"
    )
    assert "podAttribution.perProcess needs podAttribution.enabled" in stderr
    assert "at '/podAttribution/perProcess'" in refusal(
        "--set-string", "podAttribution.perProcess=yes"
    )


def test_pod_reader_is_never_bound_to_the_default_account() -> None:
    stderr = refusal("--set", "serviceAccount.create=false")
    assert "needs serviceAccount.name" in stderr
    assert "default ServiceAccount" in stderr


def test_release_names_the_cluster_objects() -> None:
    docs = template(None, "fullnameOverride=gpu-scaler")
    for doc in docs:
        assert doc["metadata"]["name"] == "gpu-scaler" or doc["kind"] == "Service", doc["kind"]
    (binding,) = of_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "gpu-scaler"
    assert binding["subjects"][0]["name"] == "gpu-scaler"


def notes(*sets: str) -> str:
    """The NOTES an install prints (a client-side dry run: no cluster)."""
    args: list[str | Path] = ["install", RELEASE, CHART, "--namespace", NAMESPACE]
    args.append("--dry-run=client")
    for item in sets:
        args += ["--set", item]
    result = helm(*args)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\nNOTES:\n", 1)[1]


def test_notes_say_what_pod_attribution_takes() -> None:
    on = notes()
    assert SOCKET in on
    assert "uid 0 without any capability" in on
    assert f"ClusterRole {RELEASE} grants list and watch on pods" in on
    assert "and on\nresourceslices (resource.k8s.io) to join GPUs allocated through DRA" in on
    assert "resourceslices" not in notes("podAttribution.draJoin=false")
    assert "privileged-level pods" in on
    unbound = notes("rbac.create=false")
    assert f"bind ServiceAccount {RELEASE} to a role" in unbound
    assert "ClusterRole" not in unbound
    off = notes("podAttribution.enabled=false")
    assert "Pod attribution is off" in off
    assert SOCKET not in off and "uid 65532" in off


# --- one source of truth ------------------------------------------------------------------


def test_generated_manifests_match_the_chart() -> None:
    result = subprocess.run(
        [sys.executable, ROOT / "scripts" / "generate_manifests.py", tool("helm"), "--check"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_single_file_is_the_whole_chart() -> None:
    single = load_all((ROOT / "k8s" / "keda-gpu-scaler.yaml").read_text())
    assert single == template()
    kinds = sorted(d["kind"] for d in single)
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "Service",
        "Service",
        "ServiceAccount",
    ]


# --- what the schema refuses --------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("securityContext.privileged=true", "runtimeClassName: nvidia gives NVML the GPUs"),
        ("securityContext.runAsUser=0", "runs as 65532, or as uid 0 without any capability"),
        ("nvmlHostMounts.enabled=true", "NVIDIA container runtime"),
        ("mock.enabled=true", "use source: replay"),
        ("role=node-agents-and-cluster-scaler", "cluster scaler"),
        ("replicaCount=2", "one scaler per GPU node"),
        ("resources.limits.nvidia\\.com/gpu=1", "must not take one away"),
    ],
)
def test_schema_refuses_go_values_that_mean_nothing_here(setting: str, says: str) -> None:
    stderr = refusal("--set", setting)
    assert "values don't meet the specifications of the schema" in stderr
    assert says in stderr
    assert "docs/migration.md" in stderr or "cluster scaler" in stderr or "GPU" in stderr


@pytest.mark.parametrize(
    "setting",
    [
        "logLevel=verbose",
        "image.pullPolicy=Sometimes",
        "grpc.port=70000",
        "source=mock",
        "healthCheck.interval=soon",
        "replicas=1",  # a typo of any kind is an error, not silently ignored
        "tls.enabled=yes",
        "podAttribution.enabled=yes",
        "rbac.create=yes",
        "podAttribution.socket=/var/lib/kubelet/pod-resources/kubelet.sock",
        "rbac.namespaced=true",
        "podAttribution=null",
        "rbac=null",
    ],
)
def test_schema_refuses_bad_values(setting: str) -> None:
    assert "schema" in refusal("--set-string" if "=yes" in setting else "--set", setting)


@pytest.mark.parametrize(
    ("setting", "why"),
    [
        ("podAttribution.socketDir=var/lib/kubelet/pod-resources", "relative"),
        ("podAttribution.socketDir=/var/lib/kubelet/pod-resources/", "trailing slash"),
        ("podAttribution.socketDir=/var/lib/kubelet", "not the kubelet's pod-resources"),
        ("podAttribution.socketDir=/", "the host's root"),
        ("podAttribution.socketDir=/etc", "not the kubelet's pod-resources"),
        ("podAttribution.socketDir=/var/lib/../../pod-resources", "a .. segment"),
        ("podAttribution.socketDir=/var//pod-resources", "an empty segment"),
        ("podAttribution.socketDir=/var/lib/kubelet/pod-resources/kubelet.sock", "the socket"),
        ("podAttribution.socketDir=", "empty"),
        ("podAttribution.draJoin=yes", "not a boolean"),
        ("podAttribution.interval=0", "zero"),
        ("podAttribution.interval=-5", "negative"),
        ("podAttribution.interval=soon", "not a duration"),
        ("podAttribution.gpuResourceNames=null", "null"),
        ("podAttribution.gpuResourceNames={}", "empty"),
        ("podAttribution.gpuResourceNames={gpu}", "no domain"),
        ("podAttribution.gpuResourceNames={nvidia.com/}", "no name"),
        ("podAttribution.gpuResourceNames={nvidia.com/gpu,nvidia.com/gpu}", "twice"),
        ("podAttribution.gpuResourceNames={nvidia.com/gpu\\,amd.com/gpu}", "a comma"),
        ("podAttribution.gpuResourceNames={nvidia.com/*gpu}", "a star inside"),
        ("podAttribution.gpuResourceNames={Nvidia.com/gpu}", "an upper-case domain"),
    ],
)
def test_schema_refuses_bad_pod_attribution_values(setting: str, why: str) -> None:
    block, key = setting.split("=")[0].split(".")
    stderr = refusal("--set", setting)
    assert "values don't meet the specifications of the schema" in stderr, why
    # The error names the key: at '/podAttribution/socketDir', or its absence.
    assert f"at '/{block}/{key}" in stderr or f"missing property '{key}'" in stderr, why


@pytest.mark.parametrize(
    "setting",
    [
        "podAttribution.socketDir=/var/snap/microk8s/common/var/lib/kubelet/pod-resources",
        "podAttribution.socketDir=/var/lib/k0s/kubelet/pod-resources",
        "podAttribution.interval=0.5",
        "podAttribution.interval=1m",
        "podAttribution.gpuResourceNames={nvidia.com/*}",
        "podAttribution.gpuResourceNames={gpu.intel.com/i915,amd.com/gpu}",
    ],
)
def test_schema_accepts_pod_attribution_values(setting: str) -> None:
    assert_attribution_on(template(None, setting))


def test_schema_messages_cannot_be_used_as_values() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    role = schema["properties"]["role"]
    (message,) = [v for v in role["enum"] if v not in ("node-agents", "cluster")]
    assert "at '/role'" in refusal("--set-string", f"role={message}")


def test_render_is_deterministic() -> None:
    first = helm("template", RELEASE, CHART, "--namespace", NAMESPACE).stdout
    assert first == helm("template", RELEASE, CHART, "--namespace", NAMESPACE).stdout


# --- role: cluster ------------------------------------------------------------------------

CLUSTER_SCALER = f"{RELEASE}-cluster"


def _by(docs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    (doc,) = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    return doc


def test_cluster_mode_renders_and_validates_strictly() -> None:
    docs = template(None, "role=cluster")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        [
            *("ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding"),
            *("DaemonSet", "Deployment", "NetworkPolicy", "PodDisruptionBudget"),
            *("Service", "Service", "Service", "ServiceAccount", "ServiceAccount"),
        ]
    )
    for doc in docs:
        assert validate(doc), doc["kind"]
        assert_namespaced(doc)
    result = helm("lint", "--strict", CHART, "--set", "role=cluster")
    assert result.returncode == 0, result.stdout + result.stderr


def test_cluster_mode_is_the_committed_cluster_overlay() -> None:
    overlay = ROOT / "k8s" / "overlays" / "cluster"
    rendered = render("overlays/cluster")
    assert sorted(map(_key, rendered)) == sorted(map(_key, template(None, "role=cluster")))
    for doc in template(None, "role=cluster"):
        (same,) = [d for d in rendered if _key(d) == _key(doc)]
        assert same == doc, _key(doc)
    assert "--set role=cluster" in (overlay / "kustomization.yaml").read_text()


def _key(doc: Obj) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def test_cluster_mode_keeps_kedas_address_and_moves_it_to_the_cluster_scaler() -> None:
    """helm upgrade --set role=cluster: the same Service (name, namespace, port) selecting
    the cluster scaler; the DaemonSet's selector (immutable) unchanged and its pod template
    changed, so that the agents restart and end KEDA's open streams with OK."""
    node, cluster = template(), template(None, "role=cluster")
    kedas_node, kedas_cluster = _by(node, "Service", RELEASE), _by(cluster, "Service", RELEASE)
    address = f"{RELEASE}.{NAMESPACE}.svc.cluster.local:{kedas_cluster['spec']['ports'][0]['port']}"
    assert address == SCALER_ADDRESS
    assert kedas_node["spec"]["ports"] == kedas_cluster["spec"]["ports"]
    deployment = _by(cluster, "Deployment", CLUSTER_SCALER)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert kedas_cluster["spec"]["selector"].items() <= pod_labels.items()
    agents = daemonset_of(cluster)
    assert (
        not kedas_cluster["spec"]["selector"].items()
        <= agents["spec"]["template"]["metadata"]["labels"].items()
    )
    assert agents["spec"]["selector"] == daemonset_of(node)["spec"]["selector"]
    assert agents["spec"]["template"] != daemonset_of(node)["spec"]["template"]
    assert "ends the streams KEDA opened to it with status OK" in notes("role=cluster")


def test_cluster_scaler_finds_the_agents_and_reads_only_what_it_needs() -> None:
    docs = template(None, "role=cluster", "cluster.podNamespaces=ml\\,serving")
    deployment = _by(docs, "Deployment", CLUSTER_SCALER)
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KEDA_GPU_SCALER_SOURCE"] == "agents"
    assert env["KEDA_GPU_SCALER_AGENTS"] == f"endpoints:{NAMESPACE}/{RELEASE}-agents:grpc"
    assert env["KEDA_GPU_SCALER_POD_NAMESPACES"] == "ml,serving"
    assert env["KEDA_GPU_SCALER_POD_RESOURCES_SOCKET"] == ""
    discovery = _by(docs, "Service", f"{RELEASE}-agents")
    assert discovery["spec"]["clusterIP"] == "None"
    assert discovery["spec"]["selector"].items() <= pod_labels_of_daemonset(docs).items()
    role = _by(docs, "ClusterRole", CLUSTER_SCALER)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["list", "watch"],
        },
    ]
    # The agents keep their own account and pod reader (their node's pods).
    agents = tuple(
        d
        for d in docs
        if d["metadata"]["labels"]["app.kubernetes.io/component"] != "cluster-scaler"
    )
    assert_pod_reader(agents)
    policy = _by(docs, "NetworkPolicy", f"{RELEASE}-agents")
    (grpc_rule, open_rule) = policy["spec"]["ingress"]
    assert grpc_rule["ports"] == [{"protocol": "TCP", "port": 6000}]
    (source,) = grpc_rule["from"]
    assert source["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert {p["port"] for p in open_rule["ports"]} == {9090, 8081}


def pod_labels_of_daemonset(docs: tuple[Obj, ...]) -> dict[str, str]:
    labels: dict[str, str] = daemonset_of(docs)["spec"]["template"]["metadata"]["labels"]
    return labels


def test_one_cluster_scaler_replica_has_no_disruption_budget() -> None:
    docs = template(None, "role=cluster", "cluster.replicas=1")
    assert of_kind(docs, "PodDisruptionBudget") == []
    assert _by(docs, "Deployment", CLUSTER_SCALER)["spec"]["replicas"] == 1


@pytest.mark.parametrize(
    ("setting", "where"),
    [
        ("role=cluster-scaler", "at '/role'"),
        ("cluster.replicas=0", "at '/cluster/replicas'"),
        ("cluster.podNamespaces=Not_A_Namespace", "at '/cluster/podNamespaces'"),
        ("cluster.replica=2", "additional properties 'replica'"),
    ],
)
def test_schema_refuses_bad_cluster_values(setting: str, where: str) -> None:
    assert where in refusal("--set", setting)


def test_tls_with_role_cluster_is_refused_with_the_reason() -> None:
    stderr = refusal("--set", "role=cluster", "--set", "tls.enabled=true")
    assert "tls.enabled with role cluster is not rendered yet" in stderr


def test_node_mode_has_no_cluster_objects() -> None:
    docs = template()
    assert of_kind(docs, "Deployment") == of_kind(docs, "NetworkPolicy") == []
    assert of_kind(docs, "PodDisruptionBudget") == []
    assert "annotations" not in daemonset_of(docs)["spec"]["template"]["metadata"]
