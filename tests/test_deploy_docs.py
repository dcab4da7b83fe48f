"""docs/getting-started.md and docs/migration.md: they name what exists and miss nothing."""

from __future__ import annotations

import re
from pathlib import Path

from keda_gpu_scaler.domain.catalog import MetricType
from keda_gpu_scaler.domain.profiles import PROFILES
from keda_gpu_scaler.domain.trigger import TRIGGER_KEYS

ROOT = Path(__file__).resolve().parent.parent
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
MIGRATION = ROOT / "docs" / "migration.md"


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
