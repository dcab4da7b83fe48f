"""Where ``gpu-metrics`` runs and which GPUs it may show: Kubernetes, Slurm, Flux or a host.

Pure functions of the environment mapping, so every rule is tested without a scheduler.
GPU scoping precedence: ``SLURM_STEP_GPUS`` > ``SLURM_JOB_GPUS`` > ``GPU_DEVICE_ORDINAL`` >
``CUDA_VISIBLE_DEVICES``. Entries are NVML indices, ``GPU:GI`` labels of MIG instances (GPU
index and GPU instance id, as the table shows them), GPU UUIDs (``GPU-…``) or MIG UUIDs
(``MIG-…``). An entry that matches no device is an error listing the devices there are.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

GPU_SCOPE_VARIABLES = (
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
    "GPU_DEVICE_ORDINAL",
    "CUDA_VISIBLE_DEVICES",
)


class DeviceFilter(msgspec.Struct, frozen=True):
    """GPUs to show: by NVML index, MIG ``GPU:GI`` label or UUID; empty means all."""

    indices: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()
    origin: str = "all GPUs"
    none: bool = False
    """True when the scope explicitly grants no GPU (``CUDA_VISIBLE_DEVICES=""``)."""
    instances: tuple[tuple[int, int], ...] = ()
    """MIG instances as (GPU index, GPU instance id)."""
    given: str = ""
    """The text the filter was parsed from, for messages."""

    def is_everything(self) -> bool:
        return not self.none and not (self.indices or self.uuids or self.instances)

    def allows(self, index: int, uuid: str, instance: int | None = None) -> bool:
        if self.none:
            return False
        if self.is_everything():
            return True
        return (
            index in self.indices
            or uuid in self.uuids
            or (instance is not None and (index, instance) in self.instances)
        )

    def unmatched(self, devices: Sequence[Device]) -> list[str]:
        """The entries that select none of ``devices``, as they were written."""
        missing = [str(i) for i in self.indices if not any(d.index == i for d in devices)]
        missing += [u for u in self.uuids if not any(d.uuid == u for d in devices)]
        missing += [
            f"{g}:{i}"
            for g, i in self.instances
            if not any((d.index, d.instance) == (g, i) for d in devices)
        ]
        return missing

    def check(self, devices: Sequence[Device]) -> None:
        """Raise :class:`ScopeError` naming the devices there are if an entry selects none."""
        missing = self.unmatched(devices)
        if not missing:
            return
        there = ", ".join(f"{d.label} {d.uuid}" for d in devices) or "none"
        verb = "matches" if len(missing) == 1 else "match"
        raise ScopeError(
            self.origin, self.given, f"{', '.join(missing)} {verb} no device; there are: {there}"
        )


@dataclass(frozen=True, slots=True)
class Device:
    """A device as the scope sees it: a GPU, or a MIG instance (``instance`` set)."""

    index: int
    uuid: str
    instance: int | None = None

    @property
    def label(self) -> str:
        """``0`` for GPU 0, ``0:1`` for its MIG GPU instance 1, as nvidia-smi names them."""
        return str(self.index) if self.instance is None else f"{self.index}:{self.instance}"


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
    """``0,1``, ``0:1`` MIG labels, ``GPU-…``/``MIG-…`` UUIDs, or a mix; ``NoDevFiles``/empty
    grants none."""
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if not entries or entries == ["NoDevFiles"]:
        return DeviceFilter(origin=origin, none=True, given=text)
    indices, uuids, instances = [], [], []
    for entry in entries:
        gpu, colon, instance = entry.partition(":")
        if entry.isdigit():
            indices.append(int(entry))
        elif colon and gpu.isdigit() and instance.isdigit():
            instances.append((int(gpu), int(instance)))
        elif entry.startswith(("GPU-", "MIG-")):
            uuids.append(entry)
        else:
            raise ScopeError(
                origin, text, f"{entry!r} is neither a GPU index, a GPU:GI label nor a UUID"
            )
    return DeviceFilter(tuple(indices), tuple(uuids), origin, False, tuple(instances), text)


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
