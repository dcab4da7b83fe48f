"""The fake NVML's MIG layout, changed at runtime as NVML changes it.

What it reproduces of NVML (``nvml.h``, nvidia-ml-py 13.615), as dynamic MIG (NVIDIA's DRA
driver, the MIG manager, ``nvidia-smi mig``) drives it while a reader runs:

- A GPU instance takes memory slices ``[start, start + size)`` of its GPU; instances never
  overlap (``nvmlDeviceCreateGpuInstanceWithPlacement``: InsufficientResources), and none
  can be made while MIG mode is off (NotSupported). Each gets the lowest free id.
- A MIG device is one compute instance inside a GPU instance
  (``nvmlGpuInstanceCreateComputeInstance``); only compute instances are MIG devices, so a
  GPU instance without one is not enumerated by ``nvmlDeviceGetMigDeviceHandleByIndex``.
  A new compute instance has a new UUID, even at a placement an earlier one had.
- ``nvmlComputeInstanceDestroy`` refuses an instance with processes, and
  ``nvmlGpuInstanceDestroy`` one that still has compute instances (InUse). After a destroy
  the MIG device's handle is invalid: every call on it answers InvalidArgument (the fake's
  ``stale_handle_code``; NotFound is the other answer drivers give).
- MIG mode has a current and a pending value (``nvmlDeviceGetMigMode``). Setting it changes
  the pending one; it takes effect at activation (a GPU reset, or at once when the GPU is
  idle), which destroys every GPU and compute instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from keda_gpu_scaler.sources.nvml.backend import GpuInstanceInfo
from keda_gpu_scaler.sources.nvml.errors import NvmlCode, nvml_error
from keda_gpu_scaler.sources.nvml.fake_processes import FakeProcess

MIB = 1 << 20
DEFAULT_MIG_SLOTS = 7
"""``nvmlDeviceGetMaxMigDeviceCount`` of an H100 or H200 in MIG mode."""


@dataclass
class FakeMigInstance:
    """One MIG device (a compute instance inside a GPU instance)."""

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int = 0
    name: str = "NVIDIA H200 MIG 1g.18gb"
    profile_id: int = 19
    """The GPU instance profile (19: 1g on Hopper, one memory slice)."""
    placement_start: int = 0
    placement_size: int = 1
    memory_total: int = 16384 * MIB
    memory_used: int = 0
    memory_reserved: int = 0
    gpm: dict[int, float] = field(default_factory=dict)
    processes: list[FakeProcess] = field(default_factory=list)

    @property
    def info(self) -> GpuInstanceInfo:
        return GpuInstanceInfo(self.profile_id, self.placement_start, self.placement_size)


class MigGpu(Protocol):
    """What a GPU holds of MIG (:class:`~.fake_backend.FakeGpu` has it)."""

    mig_enabled: bool
    """The current MIG mode."""
    mig_pending: bool | None
    """The pending MIG mode, until activation; None: the current one."""
    mig_slots: int
    instances: list[FakeMigInstance]
    """The MIG devices, in NVML's enumeration order."""
    bare_gpu_instances: dict[int, GpuInstanceInfo]
    """GPU instances without a compute instance, by id: not MIG devices (yet)."""


def gpu_instance(gpu: MigGpu, gpu_instance_id: int) -> GpuInstanceInfo | None:
    """GPU instance ``gpu_instance_id``, with compute instances or without; None if none."""
    for instance in gpu.instances if gpu.mig_enabled else ():
        if instance.gpu_instance_id == gpu_instance_id:
            return instance.info
    return gpu.bare_gpu_instances.get(gpu_instance_id) if gpu.mig_enabled else None


def holds(gpu: MigGpu, instance: FakeMigInstance) -> bool:
    """Whether ``instance`` still exists on ``gpu``: whether its handles are valid."""
    return gpu.mig_enabled and any(i is instance for i in gpu.instances)


def create_gpu_instance(
    gpu: MigGpu, profile_id: int, start: int, size: int, gpu_instance_id: int | None
) -> int:
    call = "nvmlDeviceCreateGpuInstanceWithPlacement"
    if not gpu.mig_enabled:
        raise nvml_error(NvmlCode.NOT_SUPPORTED, call)
    if start < 0 or size < 1:
        raise nvml_error(NvmlCode.INVALID_ARGUMENT, call)
    taken = {i.gpu_instance_id: i.info for i in gpu.instances} | gpu.bare_gpu_instances
    if any(_overlap(info, start, size) for info in taken.values()):
        raise nvml_error(NvmlCode.INSUFFICIENT_RESOURCES, call)
    if gpu_instance_id is None:
        gpu_instance_id = next(i for i in range(1, len(taken) + 2) if i not in taken)
    elif gpu_instance_id in taken:
        raise nvml_error(NvmlCode.INSUFFICIENT_RESOURCES, call)
    gpu.bare_gpu_instances[gpu_instance_id] = GpuInstanceInfo(profile_id, start, size)
    return gpu_instance_id


def destroy_gpu_instance(gpu: MigGpu, gpu_instance_id: int) -> None:
    call = "nvmlGpuInstanceDestroy"
    if any(i.gpu_instance_id == gpu_instance_id for i in gpu.instances):
        raise nvml_error(NvmlCode.IN_USE, call)
    if gpu.bare_gpu_instances.pop(gpu_instance_id, None) is None:
        raise nvml_error(NvmlCode.INVALID_ARGUMENT, call)


def create_compute_instance(
    gpu: MigGpu, gpu_instance_id: int, *, uuid: str, name: str
) -> FakeMigInstance:
    info = gpu_instance(gpu, gpu_instance_id)
    if info is None:
        raise nvml_error(NvmlCode.INVALID_ARGUMENT, "nvmlGpuInstanceCreateComputeInstance")
    used = {i.compute_instance_id for i in gpu.instances if i.gpu_instance_id == gpu_instance_id}
    instance = FakeMigInstance(
        uuid=uuid,
        gpu_instance_id=gpu_instance_id,
        compute_instance_id=next(c for c in range(len(used) + 1) if c not in used),
        name=name,
        profile_id=info.profile_id,
        placement_start=info.placement_start,
        placement_size=info.placement_size,
        memory_total=16384 * MIB * info.placement_size,
    )
    gpu.bare_gpu_instances.pop(gpu_instance_id, None)
    gpu.instances.append(instance)
    return instance


def destroy_compute_instance(gpu: MigGpu, gpu_instance_id: int, compute_instance_id: int) -> None:
    call = "nvmlComputeInstanceDestroy"
    ids = (gpu_instance_id, compute_instance_id)
    found = [i for i in gpu.instances if (i.gpu_instance_id, i.compute_instance_id) == ids]
    if not found:
        raise nvml_error(NvmlCode.INVALID_ARGUMENT, call)
    (instance,) = found
    if instance.processes:
        raise nvml_error(NvmlCode.IN_USE, call)
    gpu.instances = [i for i in gpu.instances if i is not instance]
    if not any(i.gpu_instance_id == gpu_instance_id for i in gpu.instances):
        # The GPU instance outlives its last compute instance, until destroyed itself.
        gpu.bare_gpu_instances[gpu_instance_id] = instance.info


def activate_mig_mode(gpu: MigGpu) -> None:
    """The pending MIG mode takes effect (a GPU reset): every GPU and compute instance is
    gone, whichever way the mode went."""
    if gpu.mig_pending is None or gpu.mig_pending == gpu.mig_enabled:
        gpu.mig_pending = None
        return
    gpu.mig_enabled, gpu.mig_pending = gpu.mig_pending, None
    gpu.instances = []
    gpu.bare_gpu_instances.clear()
    if gpu.mig_enabled and not gpu.mig_slots:
        gpu.mig_slots = DEFAULT_MIG_SLOTS


def _overlap(info: GpuInstanceInfo, start: int, size: int) -> bool:
    end = info.placement_start + info.placement_size
    return start < end and info.placement_start < start + size
