"""DRA devices joined to NVML's: which GPU a device of a ResourceClaim is.

The kubelet lists a container's DRA devices as ``(driver, pool, device)``, such as
``(gpu.nvidia.com, node-a, gpu-0)``: names the driver chose, no UUID. The driver publishes
what each name is in the ResourceSlices of its pool (``resource.k8s.io/v1``), and NVIDIA's
driver (``gpu.nvidia.com``, one pool per node, named after it) writes there:

    gpu-<minor>                                   type gpu, uuid GPU-...
    gpu-<minor>-mig-<profile>-<profileId>-<start> type mig, parentUUID GPU-..., profile 1g.10gb,
                                                  uuid MIG-... (only for a MIG device that
                                                  exists: not under dynamic MIG, where it is
                                                  made at allocation)
    gpu-<minor>-mig-<profileId>-<start>-<size>    the same, as releases before 2025 named it

An attribute without a domain belongs to the driver's (``uuid`` is ``gpu.nvidia.com/uuid``).
The minor in a name is not NVML's index, so a name alone never identifies a GPU.

**Pools** (:func:`pools_of`): a pool may span several slices; only the slices of its
latest ``generation`` count, and only when all ``resourceSliceCount`` of them are there, as
the scheduler's own rule is. A pool missing a slice is incomplete; one listing a device
twice is invalid. Neither is used.

**The join** (:func:`join_devices`), one device at a time, first rule that applies:

    outcome               when                                                    the device is
    slices_unavailable    no ResourceSlice of this node can be used (none read,   unidentified
                          the API refused or went silent, stale)
    pool_missing          no slice of the device's pool on this node             unidentified
    pool_incomplete       the pool's latest generation lacks a slice             unidentified
    pool_invalid          the pool lists a device twice                          unidentified
    device_missing        the pool has no device by that name                    unidentified
    uuid                  its ``uuid`` names a device NVML reports               joined
    uuid_unknown          its ``uuid`` (or ``parentUUID``) names none            unidentified
    placement             no ``uuid``, a MIG name and ``parentUUID``: the one    joined
                          MIG instance of that GPU NVML reports at that
                          placement start (and profile, or slice count)
    placement_unmatched   no instance, or several, or NVML gives no placements   unidentified
    no_identity           neither a ``uuid`` nor a MIG name with ``parentUUID``  unidentified

That is for a device of a GPU driver (``--dra-drivers``). A device of another driver is
``not_a_gpu`` (a NIC, a channel) unless its slice names a device NVML reports: then it is
``unknown_driver``, a GPU whose driver this node agent was not told to join, unidentified.

An unidentified device is never counted as no GPU: a ``podSelector`` trigger selecting its
pod is UNAVAILABLE, naming the pod, the claim and the outcome's words, until the join
succeeds. Nothing is guessed: a name is never parsed for an index, and a placement that
matches two instances matches none.
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import msgspec

from keda_gpu_scaler.domain.samples import (
    DeviceKey,
    DraDevice,
    DraPool,
    GpuReading,
    ResourceSliceInfo,
    ResourceSlicesReading,
    SliceDevice,
)
from keda_gpu_scaler.domain.snapshot import DeviceState


class Outcome(enum.StrEnum):
    """How a DRA device was joined to NVML, or why it was not (the module docstring)."""

    UUID = "uuid"
    PLACEMENT = "placement"
    NOT_A_GPU = "not_a_gpu"
    SLICES_UNAVAILABLE = "slices_unavailable"
    POOL_MISSING = "pool_missing"
    POOL_INCOMPLETE = "pool_incomplete"
    POOL_INVALID = "pool_invalid"
    DEVICE_MISSING = "device_missing"
    UUID_UNKNOWN = "uuid_unknown"
    PLACEMENT_UNMATCHED = "placement_unmatched"
    NO_IDENTITY = "no_identity"
    UNKNOWN_DRIVER = "unknown_driver"


JOINED = frozenset({Outcome.UUID, Outcome.PLACEMENT})
"""Outcomes of a device that is an NVML device (its ``key``)."""
_COUNTED_OUT = JOINED | {Outcome.NOT_A_GPU}


def is_joined(device: DraDevice) -> bool:
    return device.outcome in JOINED and device.key is not None


def is_unidentified(device: DraDevice) -> bool:
    """A GPU (or a device of another driver that is one) the join could not identify: a
    trigger over its pod has no value. A device the join has not seen counts too."""
    return device.outcome not in _COUNTED_OUT


# -- pools ---------------------------------------------------------------------------


def pools_of(slices: Iterable[ResourceSliceInfo]) -> tuple[DraPool, ...]:
    """The pools ``slices`` make up, by driver then name; each with the devices of its
    latest generation, and ``problem`` set when it is incomplete or invalid."""
    latest: dict[tuple[str, str], list[ResourceSliceInfo]] = {}
    for s in slices:
        kept = latest.setdefault((s.driver, s.pool), [])
        if kept and s.generation < kept[0].generation:
            continue  # out of date
        if kept and s.generation > kept[0].generation:
            kept.clear()  # a newer generation replaces every older slice
        kept.append(s)
    return tuple(_pool(driver, name, latest[driver, name]) for driver, name in sorted(latest))


def _pool(driver: str, name: str, slices: list[ResourceSliceInfo]) -> DraPool:
    slices.sort(key=lambda s: s.name)
    generation, count = slices[0].generation, slices[0].slice_count
    devices = tuple(d for s in slices for d in s.devices)
    problem = None
    if len(slices) != count:
        problem = (
            f"pool {name} of {driver} is incomplete: {len(slices)} of its {count} "
            f"ResourceSlices of generation {generation} seen"
        )
    else:
        counts = Counter(d.name for d in devices)
        twice = sorted(name for name, n in counts.items() if n > 1)
        if twice:
            problem = f"pool {name} of {driver} is invalid: it lists {', '.join(twice)} twice"
    return DraPool(
        driver=driver,
        name=name,
        generation=generation,
        slices=len(slices),
        slice_count=count,
        devices=devices,
        problem=problem,
    )


# -- what the join reads -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Slices:
    """This node's ResourceSlices as the join reads them: the pools by (driver, name), or
    why none can be used (``unavailable``)."""

    pools: Mapping[tuple[str, str], DraPool]
    unavailable: str | None = None

    @classmethod
    def of(cls, reading: ResourceSlicesReading | None, unavailable: str | None) -> Slices:
        if unavailable is not None or reading is None:
            reason = unavailable or "no ResourceSlice of this node has been read"
            return cls(MappingProxyType({}), reason)
        return cls(MappingProxyType({(p.driver, p.name): p for p in reading.pools}))


@dataclass(frozen=True, slots=True)
class _Nvml:
    """NVML's devices as the join looks them up."""

    prefix: str
    devices: Mapping[DeviceKey, DeviceState]
    parents: frozenset[str]
    """UUIDs of the GPUs (not instances) NVML reports."""
    placed: Mapping[tuple[str, int], tuple[GpuReading, ...]]
    """MIG instances by their GPU's UUID and placement start."""
    unplaced: frozenset[str]
    """GPUs with a MIG instance whose placement NVML did not give."""

    def has(self, uuid: str) -> bool:
        return DeviceKey(self.prefix + uuid) in self.devices or uuid in self.parents


def _nvml(devices: Mapping[DeviceKey, DeviceState], prefix: str) -> _Nvml:
    parents: set[str] = set()
    placed: dict[tuple[str, int], list[GpuReading]] = {}
    unplaced: set[str] = set()
    for state in devices.values():
        r = state.reading
        if r is None:
            continue
        if r.parent_uuid is None:
            parents.add(r.uuid)
        elif r.placement_start is None:
            unplaced.add(r.parent_uuid)
        else:
            placed.setdefault((r.parent_uuid, r.placement_start), []).append(r)
    return _Nvml(
        prefix,
        devices,
        frozenset(parents),
        MappingProxyType({k: tuple(v) for k, v in placed.items()}),
        frozenset(unplaced),
    )


# -- the join ------------------------------------------------------------------------


def join_devices(
    devices: tuple[DraDevice, ...],
    slices: Slices,
    nvml: Mapping[DeviceKey, DeviceState],
    *,
    prefix: str = "",
) -> tuple[DraDevice, ...]:
    """Each of ``devices`` with its outcome, key and words; ``nvml`` keyed by ``prefix``
    plus UUID (a cluster scaler's ``<node>/``). A device already joined (a node agent's
    answer, on a cluster scaler) is kept as it is."""
    if all(d.outcome for d in devices):
        return devices
    index: _Nvml | None = None
    joined: list[DraDevice] = []
    for device in devices:
        if device.outcome:
            joined.append(device)
            continue
        index = index or _nvml(nvml, prefix)
        outcome, key, detail = _join(device, slices, index)
        joined.append(msgspec.structs.replace(device, outcome=outcome, key=key, detail=detail))
    return tuple(joined)


_Result = tuple[Outcome, str | None, str]


def _join(device: DraDevice, slices: Slices, nvml: _Nvml) -> _Result:
    if not device.gpu:
        return _other_driver(device, slices, nvml)
    if slices.unavailable is not None:
        return Outcome.SLICES_UNAVAILABLE, None, slices.unavailable
    found = _find(device, slices)
    if isinstance(found, tuple):
        return found
    if found.uuid is not None:
        if DeviceKey(nvml.prefix + found.uuid) in nvml.devices:
            return Outcome.UUID, found.uuid, f"{found.uuid}, by its ResourceSlice's uuid"
        return (
            Outcome.UUID_UNKNOWN,
            None,
            f"its ResourceSlice names {found.uuid}, which is no device NVML reports on this "
            "node (not guessed)",
        )
    return _by_placement(device, found, nvml)


def _find(device: DraDevice, slices: Slices) -> SliceDevice | _Result:
    """The slice device ``device`` names, or the outcome that says why there is none."""
    pool = slices.pools.get((device.driver, device.pool))
    if pool is None:
        return (
            Outcome.POOL_MISSING,
            None,
            f"no ResourceSlice of driver {device.driver} on this node is of pool {device.pool}",
        )
    if pool.problem is not None:
        outcome = (
            Outcome.POOL_INCOMPLETE if pool.slices != pool.slice_count else Outcome.POOL_INVALID
        )
        return outcome, None, pool.problem
    found = next((d for d in pool.devices if d.name == device.device), None)
    if found is None:
        return (
            Outcome.DEVICE_MISSING,
            None,
            f"pool {pool.name} of {pool.driver} (generation {pool.generation}) has no device "
            f"{device.device}",
        )
    return found


_MIG_NAME = re.compile(r"gpu-(\d+)-mig-(.+)-(\d+)-(\d+)")


@dataclass(frozen=True, slots=True)
class MigName:
    """What a MIG device's name says of its GPU instance."""

    profile_id: int
    start: int
    size: int | None = None
    """Only the older names carry the slice count."""


def parse_mig_name(name: str) -> MigName | None:
    """``gpu-0-mig-1g10gb-19-3`` (profile 19, start 3), or the older ``gpu-0-mig-19-3-1``
    (profile 19, start 3, size 1); None for any other name."""
    found = _MIG_NAME.fullmatch(name)
    if found is None:
        return None
    _, middle, third, last = found.groups()
    if middle.isdigit():  # gpu-<minor>-mig-<profileId>-<start>-<size>
        return MigName(profile_id=int(middle), start=int(third), size=int(last))
    return MigName(profile_id=int(third), start=int(last))


def _by_placement(device: DraDevice, found: SliceDevice, nvml: _Nvml) -> _Result:
    mig = parse_mig_name(found.name)
    parent = found.parent_uuid
    if mig is None or parent is None:
        return (
            Outcome.NO_IDENTITY,
            None,
            f"device {found.name} of pool {device.pool} has no uuid attribute, and no MIG "
            "name with a parentUUID to find it by",
        )
    if parent not in nvml.parents:
        return (
            Outcome.UUID_UNKNOWN,
            None,
            f"its ResourceSlice names parent GPU {parent}, which NVML does not report on this "
            "node (not guessed)",
        )
    at = f"placement start {mig.start} (profile {mig.profile_id}) on {parent}"
    candidates = [
        r
        for r in nvml.placed.get((parent, mig.start), ())
        if r.gpu_instance_profile_id in (None, mig.profile_id)
        and (mig.size is None or r.placement_size in (None, mig.size))
    ]
    if len(candidates) == 1:
        (instance,) = candidates
        return Outcome.PLACEMENT, instance.uuid, f"{instance.uuid}, by its {at}"
    if len(candidates) > 1:
        why = f"{len(candidates)} MIG instances NVML reports are at {at}: not guessed"
    elif parent in nvml.unplaced:
        why = f"NVML does not give the placement of the MIG instances of {parent}"
    else:
        why = f"no MIG instance NVML reports is at {at} (not created yet, or another layout)"
    return Outcome.PLACEMENT_UNMATCHED, None, why


def _other_driver(device: DraDevice, slices: Slices, nvml: _Nvml) -> _Result:
    """A driver not among ``--dra-drivers``: a GPU only when its slice names one NVML
    reports."""
    found = None if slices.unavailable is not None else _find(device, slices)
    if isinstance(found, SliceDevice):
        named = [u for u in (found.uuid, found.parent_uuid) if u is not None and nvml.has(u)]
        if named:
            return (
                Outcome.UNKNOWN_DRIVER,
                None,
                f"its ResourceSlice names {named[0]}, a device NVML reports, but driver "
                f"{device.driver} is not among --dra-drivers: add it to join its devices",
            )
        return (
            Outcome.NOT_A_GPU,
            None,
            f"driver {device.driver} is not among --dra-drivers, and its ResourceSlice names "
            "no device NVML reports",
        )
    return (
        Outcome.NOT_A_GPU,
        None,
        f"driver {device.driver} is not among --dra-drivers, and no ResourceSlice shows the "
        "device as a GPU",
    )
