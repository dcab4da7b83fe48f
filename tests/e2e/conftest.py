"""The end-to-end suite: the product against real upstream components (``make e2e``).

Every test here is marked ``e2e`` and runs only through ``make e2e`` (``e2e/run.py``), which
builds the components and starts pytest inside a network namespace of its own; ``make test``
deselects them. One control plane serves the whole session; each scenario makes its own
namespaces and processes and removes its processes when it ends.

At the end of the session ``build/e2e/report.json`` holds each component's version (as built,
from ``build/e2e/versions.json``, and as the API server reports itself), each scenario's
outcome and duration, and the timelines scenarios recorded (the replica counts KEDA and the
HPA set, beside the simulator's). Component logs are in ``build/e2e/logs/``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import network
from tests.e2e.harness.chart import VALUES, Helm, Release
from tests.e2e.harness.controlplane import KEDA_NAMESPACE, ControlPlane, Paths
from tests.e2e.harness.scaler import grpcio_modules
from tests.grpcio_client import GrpcioModules

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "e2e"
REPORT = BUILD / "report.json"

_scenarios: dict[str, dict[str, Any]] = {}
_extra: dict[str, Any] = {"timelines": {}, "figures": {}}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "e2e" not in report.keywords:
        return
    entry = _scenarios.setdefault(report.nodeid, {"scenario": report.nodeid, "duration_s": 0.0})
    entry["duration_s"] = round(entry["duration_s"] + report.duration, 2)
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        entry["outcome"] = "error" if report.when == "setup" and report.failed else report.outcome
    if report.when == "teardown" and report.failed and entry.get("outcome") == "passed":
        entry["outcome"] = "error"


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _scenarios:
        return
    versions = BUILD / "versions.json"
    report = {
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "components": json.loads(versions.read_text()).get("components", {})
        if versions.exists()
        else {},
        "running": _extra.get("running", {}),
        "scenarios": list(_scenarios.values()),
        "timelines": _extra["timelines"],
        "figures": _extra["figures"],
        "logs": str((BUILD / "logs").relative_to(ROOT)),
    }
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2) + "\n")


@pytest.fixture(scope="session")
def e2e_report() -> dict[str, Any]:
    """Where scenarios put what the report keeps: ``timelines`` and ``figures``."""
    return _extra


@pytest.fixture(scope="session")
def plane() -> Iterator[ControlPlane]:
    for folder in ("run", "logs"):
        shutil.rmtree(BUILD / folder, ignore_errors=True)
    paths = Paths(bin=BUILD / "bin", work=BUILD / "run", logs=BUILD / "logs")
    control = ControlPlane(paths, crds=(BUILD / "keda-crds", BUILD / "prometheus-operator"))
    try:
        control.start()
        _extra["running"] = control.versions()
        yield control
    finally:
        control.stop()


GPU_NODE_LABELS = {
    "nvidia.com/gpu.present": "true",
    "kubernetes.io/arch": "amd64",
    # what the Go project's values (the chart's ci/go-chart-values.yaml) select
    "node-role.example.com/gpu": "inference",
}


@pytest.fixture(scope="session")
def gpu_nodes(plane: ControlPlane) -> list[str]:
    """Three GPU nodes, registered as their kubelets would register them."""
    names = [f"gpu-node-{n}" for n in (1, 2, 3)]
    for n, name in enumerate(names, start=1):
        plane.add_node(name, labels=GPU_NODE_LABELS, address=f"10.99.2.{n}")
    return names


@pytest.fixture(scope="session")
def keda(plane: ControlPlane) -> ControlPlane:
    """The control plane with the KEDA operator and its metrics server running."""
    if "keda-operator" not in plane.processes:
        plane.start_keda()
    return plane


@pytest.fixture(scope="session")
def grpcio_mods(tmp_path_factory: pytest.TempPathFactory) -> GrpcioModules:
    return grpcio_modules(tmp_path_factory.mktemp("grpcio"))


@pytest.fixture(scope="session")
def helm(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(plane.admin_kubeconfig, tmp_path_factory.mktemp("helm"))


@pytest.fixture(scope="session")
def node_release(plane: ControlPlane, gpu_nodes: list[str], helm: Helm) -> Release:
    """The chart as the README installs it (node agents, pod attribution on) in ``keda``,
    whose ServiceAccount and roles the node agents of the scenarios run with."""
    return helm.install("keda-gpu-scaler", KEDA_NAMESPACE)


CLUSTER_NAMESPACE = "gpu-cluster"


@pytest.fixture(scope="session")
def cluster_release(plane: ControlPlane, gpu_nodes: list[str], helm: Helm) -> Release:
    """The chart in cluster mode (docs/cluster.md) in a namespace of its own: the node agents'
    DaemonSet and headless Service, the cluster scaler's Deployment, each role's account."""
    plane.namespace(CLUSTER_NAMESPACE)
    return helm.install("gpu", CLUSTER_NAMESPACE, values=[VALUES / "cluster-values.yaml"])


@pytest.fixture(scope="session")
def pod_addresses() -> Iterator[str]:
    """Addresses for the pods the harness's kubelets start, unique over the whole run."""
    return network.pod_addresses()
