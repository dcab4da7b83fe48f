"""The Helm chart k8s/helm/keda-gpu-scaler: linted, rendered, validated and refused offline.

helm comes from the test environment (scripts/fetch_helm.py puts it there when .venv is
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
    SCALER_ADDRESS,
    assert_hardened,
    assert_serve_flags,
    container_of,
    daemonset_of,
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
        assert doc["metadata"]["namespace"] == NAMESPACE, doc["kind"]
    assert_hardened(docs)
    assert_serve_flags(docs, monkeypatch)


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
    assert kinds == ["DaemonSet", "Service", "Service", "ServiceAccount"]


# --- what the schema refuses --------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("securityContext.privileged=true", "runtimeClassName: nvidia gives NVML the GPUs"),
        ("securityContext.runAsUser=0", "runs as 65532"),
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
    ],
)
def test_schema_refuses_bad_values(setting: str) -> None:
    assert "schema" in refusal("--set-string" if "=yes" in setting else "--set", setting)


def test_schema_messages_cannot_be_used_as_values() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    role = schema["properties"]["role"]
    (message,) = [v for v in role["enum"] if v != "node-agents"]
    assert "at '/role'" in refusal("--set-string", f"role={message}")


def test_render_is_deterministic() -> None:
    first = helm("template", RELEASE, CHART, "--namespace", NAMESPACE).stdout
    assert first == helm("template", RELEASE, CHART, "--namespace", NAMESPACE).stdout
