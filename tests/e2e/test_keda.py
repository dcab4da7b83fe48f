"""KEDA end to end: the KEDA operator, its metrics server and the HPA controller drive
Deployments from the scaler's answers.

The scaler replays a scripted GPU: idle, then busy (90 %), then moderate (30 %), then idle
again. Two Deployments start at 0 replicas, each with a ScaledObject on that GPU (``Value``,
target 40, activation 10): one with an ``external`` trigger, which KEDA polls, one with
``external-push``, whose activity KEDA takes from ``StreamIsActive``. The harness's kubelet
binds the pods the ReplicaSet controller creates and marks them Running and Ready, so the
HPA's ready-pod count (which a ``Value`` metric multiplies) is real. Each Deployment must be
activated from 0 by KEDA once the GPU is busy, grown by the HPA through KEDA's metrics server,
brought down when the load falls, and returned to 0 after ``cooldownPeriod`` once idle. The
timeline of both is kept in the report beside what ``keda-gpu-scaler simulate`` says for the
same ScaledObject and trace.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.harness.controlplane import HPA_SYNC_S, ControlPlane
from tests.e2e.harness.kubelet import Kubelet
from tests.e2e.harness.processes import Process
from tests.e2e.harness.scaler import SCALER, Ports, start_scaler
from tests.e2e.harness.traces import write_trace
from tests.e2e.harness.workload import Recorder, Timeline, deployment, scaled_object

NAMESPACE = "keda-loop"
PORTS = Ports(grpc=16030, metrics=19030, probes=18030)
IDLE, BUSY, MODERATE = 0.0, 90.0, 30.0
SCHEDULE = [(0.0, IDLE), (30.0, BUSY), (120.0, MODERATE), (180.0, IDLE)]
COOLDOWN_S = 20
POLLING_S = 5
END_S = 180 + COOLDOWN_S + 3 * POLLING_S + HPA_SYNC_S
"""Past the last idle phase, its cooldown and a few polls and syncs: both back at 0."""
MAX_REPLICAS = 4
TRIGGER = {
    "metricType": "gpu_utilization",
    "targetValue": "40",
    "activationThreshold": "10",
    "cooldownSeconds": "0",
}
BEHAVIOR = {"scaleDown": {"stabilizationWindowSeconds": 0}}


@dataclass
class Loop:
    scaler: Process
    started: float
    trace: Path
    objects: dict[str, dict[str, Any]]


def _scaled_object(name: str, trigger_type: str) -> dict[str, Any]:
    trigger = {
        "type": trigger_type,
        "metricType": "Value",
        "metadata": {"scalerAddress": f"127.0.0.1:{PORTS.grpc}", **TRIGGER},
    }
    spec = {
        "minReplicaCount": 0,
        "maxReplicaCount": MAX_REPLICAS,
        "pollingInterval": POLLING_S,
        "cooldownPeriod": COOLDOWN_S,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": BEHAVIOR}},
    }
    return scaled_object(name, NAMESPACE, triggers=[trigger], spec=spec)


@pytest.fixture
def loop(
    keda: ControlPlane, gpu_nodes: list[str], pod_addresses: Iterator[str], tmp_path: Path
) -> Iterator[Loop]:
    keda.namespace(NAMESPACE)
    trace = write_trace(tmp_path / "trace.jsonl", SCHEDULE, duration_s=END_S + 120)
    objects = {
        "poll": _scaled_object("poll", "external"),
        "push": _scaled_object("push", "external-push"),
    }
    with Kubelet(keda.admin, namespaces=[NAMESPACE], nodes=gpu_nodes, addresses=pod_addresses):
        for name in objects:
            keda.admin.apply(deployment(name, NAMESPACE))
        # The trace's time 0 is when the replay starts, a little after the process does.
        started = time.monotonic()
        scaler = start_scaler(
            "keda-loop-scaler",
            [f"--source=replay:{trace}", "--pod-resources-socket="],
            logs=keda.paths.logs,
            ports=PORTS,
        )
        try:
            for obj in objects.values():
                keda.admin.apply(obj)
            yield Loop(scaler, started, trace, objects)
        finally:
            for name in objects:
                keda.admin.delete(
                    f"/apis/keda.sh/v1alpha1/namespaces/{NAMESPACE}/scaledobjects/{name}"
                )
                keda.admin.delete(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{name}")
            scaler.stop()


def simulate(obj: dict[str, Any], trace: Path, folder: Path) -> list[dict[str, Any]]:
    """``keda-gpu-scaler simulate`` of the same ScaledObject over the same trace."""
    path = folder / f"{obj['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(obj))
    done = subprocess.run(
        [str(SCALER), "simulate", str(path), "--trace", str(trace), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    steps: list[dict[str, Any]] = json.loads(done.stdout)["steps"]
    return [s for s in steps if s["t"] <= END_S]


def _sync_comparison(real: Timeline, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At each HPA sync of the simulation: its replica count, and the real one then."""
    rows = []
    for step in steps:
        if step["why"].startswith("HPA sync"):
            rows.append(
                {"t": step["t"], "simulate": step["replicas"], "real": real.replicas_at(step["t"])}
            )
    return rows


def test_keda_activates_scales_through_the_hpa_and_returns_to_zero(
    keda: ControlPlane, loop: Loop, tmp_path: Path, e2e_report: dict[str, Any]
) -> None:
    timelines = [Timeline(name, NAMESPACE, loop.started) for name in loop.objects]
    with Recorder(keda.admin, timelines):
        time.sleep(max(0.0, END_S - (time.monotonic() - loop.started)))
    for timeline in timelines:
        steps = simulate(loop.objects[timeline.name], loop.trace, tmp_path)
        e2e_report["timelines"][f"keda-{timeline.name}"] = {
            "real": timeline.as_json(),
            "simulate": [{"t": s["t"], "replicas": s["replicas"], "why": s["why"]} for s in steps],
            "at_hpa_syncs": _sync_comparison(timeline, steps),
        }

    for timeline in timelines:
        points = timeline.points
        assert points, f"{timeline.name}: nothing recorded"
        assert timeline.replicas_at(SCHEDULE[1][0] - 1) == 0, (
            f"{timeline.name} active while idle: {points}"
        )
        activated = timeline.first_time(1, after=0)
        assert activated is not None and activated >= SCHEDULE[1][0], f"{timeline.name}: {points}"
        assert activated <= SCHEDULE[1][0] + POLLING_S + 5, (
            f"{timeline.name} activated late: {points}"
        )
        peak = max(p.replicas for p in points if p.t < SCHEDULE[2][0] + 5)
        assert peak == MAX_REPLICAS, f"{timeline.name} never reached {MAX_REPLICAS}: {points}"
        assert timeline.replicas_at(SCHEDULE[3][0] - 1) < MAX_REPLICAS, (
            f"{timeline.name} not scaled down: {points}"
        )
        assert points[-1].replicas == 0, f"{timeline.name} not back to 0: {points}"
        assert max(p.ready for p in points) == MAX_REPLICAS  # the kubelet made them ready
