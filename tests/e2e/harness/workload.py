"""A workload scaled by KEDA: its Deployment and ScaledObject, and the timeline of its
replica count as the KEDA operator and the HPA controller set it."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.e2e.harness.kube import Kube, KubeError


def deployment(name: str, namespace: str, *, replicas: int = 0) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "server", "image": "vllm/vllm-openai"}],
                },
            },
        },
    }


def scaled_object(
    name: str,
    namespace: str,
    *,
    triggers: list[dict[str, Any]],
    spec: Mapping[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"scaleTargetRef": {"name": name}, **spec, "triggers": triggers},
    }


@dataclass
class Point:
    t: float
    replicas: int
    ready: int
    hpa_desired: int | None
    active: bool | None


@dataclass
class Timeline:
    """Every change of a Deployment's replicas (and of what KEDA and the HPA report about
    it), in seconds since ``started`` (a ``time.monotonic()``)."""

    name: str
    namespace: str
    started: float
    points: list[Point] = field(default_factory=list)

    def replicas_at(self, t: float) -> int:
        """The replica count in effect at ``t``: the last change at or before it."""
        value = 0
        for point in self.points:
            if point.t <= t:
                value = point.replicas
        return value

    def first_time(self, replicas: int, *, after: float = 0.0) -> float | None:
        for point in self.points:
            if point.t >= after and point.replicas == replicas:
                return point.t
        return None

    def as_json(self) -> list[dict[str, Any]]:
        return [p.__dict__ for p in self.points]


class Recorder:
    """A thread that samples the workload every ``every_s`` and keeps the changes."""

    def __init__(self, kube: Kube, timelines: list[Timeline], *, every_s: float = 0.25) -> None:
        self._kube = kube
        self._timelines = timelines
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="e2e-recorder", daemon=True)

    def __enter__(self) -> Recorder:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            for timeline in self._timelines:
                # the API restarting: sample again next turn
                with contextlib.suppress(KubeError, OSError):
                    self._sample(timeline)
            self._stop.wait(self._every_s)

    def _sample(self, timeline: Timeline) -> None:
        base = f"/apis/apps/v1/namespaces/{timeline.namespace}/deployments/{timeline.name}"
        deploy = self._kube.get(base)
        hpas = f"/apis/autoscaling/v2/namespaces/{timeline.namespace}/horizontalpodautoscalers"
        hpa_path = f"{hpas}/keda-hpa-{timeline.name}"
        hpa = self._kube.get(hpa_path) if self._kube.exists(hpa_path) else None
        so = self._kube.get(
            f"/apis/keda.sh/v1alpha1/namespaces/{timeline.namespace}/scaledobjects/{timeline.name}"
        )
        active = next(
            (
                c["status"] == "True"
                for c in so.get("status", {}).get("conditions", [])
                if c["type"] == "Active"
            ),
            None,
        )
        point = Point(
            t=round(time.monotonic() - timeline.started, 2),
            replicas=int(deploy["spec"].get("replicas", 1)),
            ready=int(deploy.get("status", {}).get("readyReplicas", 0)),
            hpa_desired=hpa["status"].get("desiredReplicas") if hpa else None,
            active=active,
        )
        last = timeline.points[-1] if timeline.points else None
        key = (point.replicas, point.ready, point.hpa_desired, point.active)
        if last is None or key != (last.replicas, last.ready, last.hpa_desired, last.active):
            timeline.points.append(point)
