"""Immutable, versioned views of everything the sources reported.

The aggregator builds a new :class:`Snapshot` per change; readers never see it move.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import msgspec

from keda_gpu_scaler.domain.engines import EngineSample
from keda_gpu_scaler.domain.history import EMPTY_HISTORY, History
from keda_gpu_scaler.domain.samples import (
    DeviceKey,
    GpuReading,
    PodResourcesReading,
    PodsReading,
)

STALE_AFTER_PERIODS = 3
"""A reading older than this many sample periods of its source is stale..."""
MIN_STALE_AFTER_S = 1.0
"""...and never sooner than this: at 10 Hz three periods are 0.3 s, which a garbage
collection or a burst of new streams can take from this process without anything being
wrong with the source."""


def stale_limit_s(period_s: float) -> float:
    """How old a reading of a source sampling every ``period_s`` may be and still count."""
    return max(STALE_AFTER_PERIODS * period_s, MIN_STALE_AFTER_S)


class DeviceState(msgspec.Struct, frozen=True, kw_only=True):
    """The last word on one device: its newest reading, whether it is lost, and the recent
    values windows read (empty unless a trigger asks for a window)."""

    key: DeviceKey
    index: int
    reading: GpuReading | None = None
    lost_reason: str | None = None
    lost_since: float | None = None
    history: History = EMPTY_HISTORY

    def is_lost(self) -> bool:
        return self.lost_reason is not None

    @property
    def label(self) -> str:
        """``GPU 0``, or ``MIG 0:7`` for GPU 0's GPU instance 7: how explanations name it."""
        r = self.reading
        node = f"{r.node} " if r is not None and r.node else ""
        if r is None or not r.is_mig_instance():
            return f"{node}GPU {self.index}"
        return f"{node}MIG {r.parent_index}:{r.gpu_instance_id}"

    def age(self, now: float) -> float | None:
        return None if self.reading is None else now - self.reading.taken_at

    def is_stale(self, now: float) -> bool:
        if self.reading is None:
            return True
        return now - self.reading.taken_at > stale_limit_s(self.reading.period_s)


class SourceState(msgspec.Struct, frozen=True, kw_only=True):
    """Health of one source as the aggregator last heard it.

    ``fault`` is the last whole-source failure, cleared by the next reading; device faults
    live on their :class:`DeviceState` and only count in ``faults``.
    """

    name: str
    last_sample_at: float | None = None
    fault: str | None = None
    fault_at: float | None = None
    cycles: int = 0
    """Sampler cycles folded: a batch, or a reading sent alone."""
    samples: int = 0
    faults: int = 0


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    published_at: float
    devices: Mapping[DeviceKey, DeviceState] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    sources: Mapping[str, SourceState] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    engines: Mapping[str, EngineSample] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    """Newest sample of each engine sampler, by its source name (``EngineTarget.source``)."""
    engine_history: Mapping[str, History] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    """Recent values of each engine sampler that windows read, by source name."""
    attribution: PodResourcesReading | None = None
    """The newest good ``List`` of the kubelet PodResources API: who holds which device."""
    node_attributions: Mapping[str, PodResourcesReading] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    """On a cluster scaler: each node agent's newest attribution, by node name."""
    pods: PodsReading | None = None
    """This node's pods (labels, phase) as the Kubernetes API last showed them."""

    def ordered_devices(self) -> list[DeviceState]:
        """Devices by NVML index, the order nvidia-smi shows."""
        return sorted(self.devices.values(), key=lambda d: (d.index, d.key))

    def readiness(self, now: float) -> tuple[bool, str]:
        """Ready while at least one device has a fresh reading; the reason says why not."""
        if self.version == 0:
            return False, "no snapshot yet"
        devices = self.ordered_devices()
        fresh = [d for d in devices if not d.is_lost() and not d.is_stale(now)]
        if fresh:
            return True, f"{len(fresh)} of {len(devices)} device(s) fresh"
        faults = [f"{s.name}: {s.fault}" for s in self.sources.values() if s.fault]
        if faults:
            return False, "source failing: " + "; ".join(faults)
        if not devices:
            return False, "no device reported yet"
        return False, f"no fresh reading: {len(devices)} device(s) lost or stale"

    def has_fresh_reading(self, now: float) -> bool:
        return any(not d.is_lost() and not d.is_stale(now) for d in self.devices.values())


EMPTY_SNAPSHOT = Snapshot(version=0, published_at=0.0)
