"""Where ``gpu-metrics`` runs and which GPUs it may show: Kubernetes, Slurm, Flux or a host.

Pure functions of the environment mapping, so every rule is tested without a scheduler.
GPU scoping precedence: ``SLURM_STEP_GPUS`` > ``SLURM_JOB_GPUS`` > ``GPU_DEVICE_ORDINAL`` >
``CUDA_VISIBLE_DEVICES``. Entries are NVML indices, GPU UUIDs (``GPU-…``) or MIG UUIDs
(``MIG-…``).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

GPU_SCOPE_VARIABLES = (
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
    "GPU_DEVICE_ORDINAL",
    "CUDA_VISIBLE_DEVICES",
)


class DeviceFilter(msgspec.Struct, frozen=True):
    """GPUs to show: by NVML index or by UUID; empty means all."""

    indices: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()
    origin: str = "all GPUs"
    none: bool = False
    """True when the scope explicitly grants no GPU (``CUDA_VISIBLE_DEVICES=""``)."""

    def allows(self, index: int, uuid: str) -> bool:
        if self.none:
            return False
        if not self.indices and not self.uuids:
            return True
        return index in self.indices or uuid in self.uuids


class Environment(msgspec.Struct, frozen=True):
    kind: str
    """kubernetes, slurm, flux or host."""
    node: str
    job: str | None = None


@dataclass(frozen=True, slots=True)
class ScopeError(Exception):
    variable: str
    value: str
    reason: str

    def __str__(self) -> str:
        return f'{self.variable}="{self.value}": {self.reason}'


def parse_device_list(text: str, *, origin: str) -> DeviceFilter:
    """``0,1``, ``GPU-…``/``MIG-…`` UUIDs, or a mix; ``NoDevFiles``/empty grants none."""
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if not entries or entries == ["NoDevFiles"]:
        return DeviceFilter(origin=origin, none=True)
    indices, uuids = [], []
    for entry in entries:
        if entry.isdigit():
            indices.append(int(entry))
        elif entry.startswith(("GPU-", "MIG-")):
            uuids.append(entry)
        else:
            raise ScopeError(origin, text, f"{entry!r} is neither a GPU index nor a GPU/MIG UUID")
    return DeviceFilter(tuple(indices), tuple(uuids), origin)


def gpu_scope(env: Mapping[str, str]) -> DeviceFilter:
    for variable in GPU_SCOPE_VARIABLES:
        if variable in env:
            return parse_device_list(env[variable], origin=variable)
    return DeviceFilter()


def detect_environment(env: Mapping[str, str]) -> Environment:
    if "SLURM_JOB_ID" in env:
        node = env.get("SLURMD_NODENAME") or env.get("SLURM_TOPOLOGY_ADDR") or _hostname()
        return Environment("slurm", node, env["SLURM_JOB_ID"])
    if "FLUX_JOB_ID" in env or "FLUX_URI" in env:
        return Environment("flux", _hostname(), env.get("FLUX_JOB_ID"))
    if "KUBERNETES_SERVICE_HOST" in env:
        node = env.get("NODE_NAME") or env.get("KUBERNETES_NODE_NAME") or _hostname()
        return Environment("kubernetes", node, env.get("POD_NAME"))
    return Environment("host", _hostname())


def _hostname() -> str:
    return socket.gethostname()
