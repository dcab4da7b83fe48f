"""The Go project's ``gpu-metrics --format json`` document, with this product's devices.

pmady/keda-gpu-scaler prints one object: ``environment`` (the orchestrator and the job's
context), ``collected_at`` (RFC 3339, UTC) and ``devices``. Its Flux plugin
(``deploy/flux/gpu-monitor.lua``) and users' scripts read that shape, so it is kept;
each device is this product's record (snake_case keys, docs/gpu-metrics.md) rather than
the Go field names (defect D12).

``environment`` has Go's keys and omits empty ones, as Go's ``omitempty`` does:
``orchestrator`` (k8s, slurm, flux, standalone), ``node``, ``job_id``, ``task_rank``,
``pod_name``, ``namespace``, ``partition``, ``flux_uri``.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

ORCHESTRATORS = ("auto", "k8s", "kubernetes", "slurm", "flux", "standalone")


def detect_orchestrator(env: Mapping[str, str]) -> str:
    """Go's order: Slurm, then Flux, then Kubernetes, else standalone."""
    if "SLURM_JOB_ID" in env:
        return "slurm"
    if "FLUX_JOB_ID" in env:
        return "flux"
    if "KUBERNETES_SERVICE_HOST" in env:
        return "k8s"
    return "standalone"


def _rank(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


def go_environment(env: Mapping[str, str], orchestrator: str = "auto") -> dict[str, Any]:
    kind = {"auto": detect_orchestrator(env), "kubernetes": "k8s"}.get(orchestrator, orchestrator)
    host = socket.gethostname()
    if kind == "slurm":
        context = {
            "node": env.get("SLURMD_NODENAME") or host,
            "job_id": env.get("SLURM_JOB_ID"),
            "task_rank": _rank(env.get("SLURM_PROCID")),
            "partition": env.get("SLURM_JOB_PARTITION"),
        }
    elif kind == "flux":
        context = {
            "job_id": env.get("FLUX_JOB_ID"),
            "task_rank": _rank(env.get("FLUX_TASK_RANK")),
            "flux_uri": env.get("FLUX_URI"),
        }
    elif kind == "k8s":
        context = {
            "node": env.get("NODE_NAME") or host,
            "pod_name": env.get("POD_NAME"),
            "namespace": env.get("POD_NAMESPACE"),
        }
    else:
        context = {"node": host}
    return {"orchestrator": kind} | {k: v for k, v in context.items() if v}


def collected_at(now: datetime | None = None) -> str:
    stamp = (now or datetime.now(UTC)).astimezone(UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def go_document(
    devices: list[dict[str, Any]], environment: Mapping[str, Any], now: datetime | None = None
) -> dict[str, Any]:
    return {"environment": dict(environment), "collected_at": collected_at(now), "devices": devices}
