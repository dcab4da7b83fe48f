"""Which extended resources count as GPUs: a comma-separated list of names and prefixes.

    >>> names = ResourceNames.parse("nvidia.com/gpu, nvidia.com/mig-*")
    >>> names.matches("nvidia.com/mig-1g.10gb"), names.matches("nvidia.com/gpu.shared")
    (True, False)
    >>> str(names)
    'nvidia.com/gpu,nvidia.com/mig-*'

An entry ending in ``*`` is a prefix; any other entry is matched exactly. The NVIDIA device
plugin names whole GPUs and MIG instances of the ``single`` strategy ``nvidia.com/gpu``, MIG
instances of the ``mixed`` strategy ``nvidia.com/mig-<profile>``; a renamed resource (time
slicing often uses ``nvidia.com/gpu.shared``) must be listed.
"""

from __future__ import annotations

from dataclasses import dataclass

from keda_gpu_scaler.domain.names import is_object_name

_WILDCARD = "*"


@dataclass(frozen=True, slots=True)
class ResourceNames:
    """Exact names and prefixes (given with their ``*``), in the order given, no repeats."""

    entries: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.entries:
            raise ValueError("no GPU resource name given")
        for position, entry in enumerate(self.entries, start=1):
            _check(entry, position)

    @classmethod
    def parse(cls, text: str) -> ResourceNames:
        """``"nvidia.com/gpu,nvidia.com/mig-*"``; whitespace around entries is ignored.

        Raises ValueError naming the entry for an empty list, an empty entry, a bare ``*``,
        a ``*`` anywhere but at the end, or whitespace inside a name."""
        if not text.strip():
            raise ValueError(
                f"no GPU resource name given in {text!r}: list names such as nvidia.com/gpu"
            )
        entries = [part.strip() for part in text.split(",")]
        for position, entry in enumerate(entries, start=1):
            _check(entry, position, text)
        return cls(tuple(dict.fromkeys(entries)))

    def matches(self, resource_name: str) -> bool:
        for entry in self.entries:
            if entry.endswith(_WILDCARD):
                if resource_name.startswith(entry[:-1]):
                    return True
            elif resource_name == entry:
                return True
        return False

    def __str__(self) -> str:
        return ",".join(self.entries)

    def __repr__(self) -> str:
        return f"ResourceNames.parse({str(self)!r})"


def _check(entry: str, position: int, text: str | None = None) -> None:
    where = f"entry {position}" + (f" of {text!r}" if text is not None else "")
    if not entry:
        raise ValueError(f"empty GPU resource name ({where}): remove the extra comma")
    if entry == _WILDCARD:
        raise ValueError(
            f"GPU resource name {entry!r} ({where}) would match every resource; "
            "give a prefix such as nvidia.com/mig-*"
        )
    if _WILDCARD in entry[:-1]:
        raise ValueError(
            f"GPU resource name {entry!r} ({where}): '*' may only end a name, as a prefix"
        )
    if any(c.isspace() for c in entry):
        raise ValueError(
            f"GPU resource name {entry!r} ({where}) contains whitespace; separate names with commas"
        )


DEFAULT_RESOURCE_NAMES = ResourceNames.parse("nvidia.com/gpu,nvidia.com/mig-*")
"""Whole GPUs and MIG instances of the NVIDIA device plugin, both MIG strategies."""


@dataclass(frozen=True, slots=True)
class DraDrivers:
    """The DRA drivers whose devices are GPUs (``--dra-drivers``), in the order given.

        >>> DraDrivers.parse("gpu.nvidia.com").is_gpu_driver("gpu.nvidia.com")
        True

    None may be given: a device of another driver is still recognised as a GPU when its
    ResourceSlice names one NVML reports (``domain.dra``), and then it is unidentified."""

    names: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> DraDrivers:
        """``"gpu.nvidia.com,gpu.example.com"``; whitespace around names is ignored, an empty
        text names none. Raises ValueError naming a name that is not a driver's (a DNS
        subdomain, as ResourceSlice's ``spec.driver``)."""
        names = [part.strip() for part in text.split(",")] if text.strip() else []
        for position, name in enumerate(names, start=1):
            if not is_object_name(name):
                raise ValueError(
                    f"DRA driver name {name!r} (entry {position} of {text!r}) is not a DNS "
                    "subdomain such as gpu.nvidia.com"
                )
        return cls(tuple(dict.fromkeys(names)))

    def is_gpu_driver(self, driver: str) -> bool:
        return driver in self.names

    def __str__(self) -> str:
        return ",".join(self.names)


DEFAULT_DRA_DRIVERS = DraDrivers(("gpu.nvidia.com",))
"""NVIDIA's DRA driver for GPUs (kubernetes-sigs/dra-driver-nvidia-gpu)."""
