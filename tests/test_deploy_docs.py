"""docs/getting-started.md, docs/migration.md and docs/operations.md: they name what exists
and miss nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from keda_gpu_scaler.app.scaler.serve_flags import SERVE_FLAGS
from keda_gpu_scaler.domain.catalog import MetricType
from keda_gpu_scaler.domain.profiles import PROFILES
from keda_gpu_scaler.domain.trigger_keys import TRIGGER_KEYS

ROOT = Path(__file__).resolve().parent.parent
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
MIGRATION = ROOT / "docs" / "migration.md"
OPERATIONS = ROOT / "docs" / "operations.md"
CHART = ROOT / "k8s" / "helm" / "keda-gpu-scaler"
POD_ATTRIBUTION = "## Pod attribution: what the node agent needs"


def test_getting_started_names_only_files_that_exist() -> None:
    text = GETTING_STARTED.read_text()
    paths = set(re.findall(r"(?<![\w/.-])((?:k8s|docs)/[\w./-]*[\w/])", text))
    paths |= {"Dockerfile"} if "`Dockerfile`" in text else set()
    assert "k8s/base" in paths
    assert "k8s/examples/getting-started.yaml" in paths
    for path in paths:
        assert (ROOT / path).exists(), path


def test_getting_started_applies_the_base_and_the_sample() -> None:
    text = GETTING_STARTED.read_text()
    for command in (
        "helm install keda-gpu-scaler k8s/helm/keda-gpu-scaler --namespace keda",
        "kubectl apply -k k8s/base",
        "kubectl apply -f k8s/examples/getting-started.yaml",
        "helm install gpu-operator nvidia/gpu-operator",
        "helm install keda kedacore/keda",
        "get hpa",
        "keda-gpu-scaler tap",
        "port-forward",
    ):
        assert command in text, command


def test_migration_covers_every_defect_and_every_name() -> None:
    text = MIGRATION.read_text()
    for n in range(1, 16):
        assert re.search(rf"\*\*D{n},", text), f"D{n}"
    for name in (*TRIGGER_KEYS, *PROFILES, *(t.value for t in MetricType)):
        assert f"`{name}`" in text, name


def test_docs_use_the_go_projects_address() -> None:
    """One address everywhere: the chart's default, which is the Go project's."""
    texts = {p: p.read_text() for p in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))}
    for path, text in texts.items():
        assert "keda-gpu-scaler.keda-gpu-scaler" not in text, path.name
        assert "-n keda-gpu-scaler " not in text, path.name
    for path in (ROOT / "README.md", GETTING_STARTED, MIGRATION):
        assert "keda-gpu-scaler.keda.svc.cluster.local:6000" in texts[path], path.name


def section(text: str, title: str) -> str:
    """From the heading ``title`` to the next heading of its level."""
    level = title.split(" ")[0] + " "
    start = text.index(title + "\n")
    following = [m.start() for m in re.finditer(f"^{level}", text, re.MULTILINE)]
    return text[start : min([i for i in following if i > start], default=len(text))]


def test_operations_says_what_pod_attribution_needs() -> None:
    text = " ".join(section(OPERATIONS.read_text(), POD_ATTRIBUTION).split())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in values["podAttribution"]:
        assert f"`podAttribution.{key}" in text, key
    assert "rbac.create" in text
    assert f"`{values['podAttribution']['socketDir']}`" in text
    variables = {f.variable for f in SERVE_FLAGS}
    for variable in (
        "KEDA_GPU_SCALER_POD_RESOURCES_SOCKET",
        "KEDA_GPU_SCALER_POD_RESOURCES_INTERVAL",
        "KEDA_GPU_SCALER_GPU_RESOURCE_NAMES",
        "NODE_NAME",
    ):
        assert variable in variables, variable  # a variable `serve` reads
        assert f"`{variable}" in text, variable
    for words in (
        "--set podAttribution.enabled=false",
        "kubectl apply -k k8s/overlays/no-pod-attribution",
        "`list` and `watch` on `pods`",
        "CAP_DAC_OVERRIDE",
        "`hostUsers: false`",
        "`fsGroup`",
        "`privileged`-level pods",
    ):
        assert words in text, words


def test_operations_lists_the_kubelet_roots_the_chart_names() -> None:
    """Every socket directory the docs and the values' comment give passes the schema, and
    the two give the same ones."""
    text = section(OPERATIONS.read_text(), POD_ATTRIBUTION)
    schema = json.loads((CHART / "values.schema.json").read_text())
    pattern = schema["properties"]["podAttribution"]["properties"]["socketDir"]["pattern"]
    documented = set(re.findall(r"`(/[^`\s]*/pod-resources)`", text))
    commented = set(re.findall(r"(/\S*/pod-resources)\b", (CHART / "values.yaml").read_text()))
    assert len(documented) >= 3
    assert documented == commented
    for directory in documented:
        assert re.fullmatch(pattern, directory), directory
