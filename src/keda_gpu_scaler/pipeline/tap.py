"""The debug tap: a broadcast of every sample and decision to whoever listens.

Publishing never waits: each subscriber has a bounded buffer, and a subscriber that falls
behind loses the newest events and has them counted, so a slow or stuck reader can never
slow the pipeline or KEDA's answers. With no subscriber, publishing costs one check.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import msgspec

from keda_gpu_scaler.domain.attribution import attribute
from keda_gpu_scaler.domain.engines import EngineSample
from keda_gpu_scaler.domain.samples import (
    AgentsReading,
    DeviceGone,
    DeviceHolder,
    DeviceKey,
    DeviceProcesses,
    DraDevice,
    GpuReading,
    NodeDevices,
    PodInfo,
    PodResourcesReading,
    PodsReading,
    ProcessUse,
    ResourceSlicesReading,
    Sample,
    SourceFault,
    SourceStopped,
    unbatch,
)
from keda_gpu_scaler.domain.snapshot import Snapshot


class TapDecision(msgspec.Struct, frozen=True, kw_only=True, tag="decision"):
    trigger: str
    """``namespace/name``, as KEDA sent it."""
    metric: str
    metric_type: str
    rpc: str
    at: float
    value: float | None = None
    target: float | None = None
    active: bool | None = None
    why: str
    error: str | None = None


class TapHeldDevice(msgspec.Struct, frozen=True, kw_only=True):
    key: DeviceKey
    index: int
    label: str
    """``GPU 0`` or ``MIG 0:7``, as decision explanations name it."""
    holders: tuple[DeviceHolder, ...]
    """Every pod and container holding it: more than one when it is shared."""


class TapAttribution(msgspec.Struct, frozen=True, kw_only=True, tag="attribution"):
    """Each kubelet PodResources answer, joined with NVML's devices: who holds which device
    (a DRA device joined to one among its holders), which device IDs match no device NVML
    reports (never guessed), and every DRA device with its join: the NVML device it is
    (``key``), or why that is not known (``outcome``, ``detail``), and its ``share_id``."""

    source: str
    at: float
    devices: tuple[TapHeldDevice, ...]
    unmatched: tuple[DeviceHolder, ...] = ()
    dra: tuple[DraDevice, ...] = ()


OUTSIDE_ANY_POD = "outside any pod"


class TapProcess(ProcessUse, frozen=True, kw_only=True, omit_defaults=True):
    """One process on a device, joined to the pod it runs in."""

    pod: str
    """``namespace/name``; ``outside any pod`` (a host process); or ``pod <uid> (not among
    the pods watched)`` for a pod UID the pod watch does not know."""


class TapProcesses(msgspec.Struct, frozen=True, kw_only=True, tag="processes"):
    """A device's per-process reading: every process with its pod, and what NVML could not
    say on the device (per-process memory or utilization unsupported, and why)."""

    source: str
    key: DeviceKey
    index: int
    label: str
    at: float
    processes: tuple[TapProcess, ...]
    outside_pods: int
    """Processes outside any pod: counted here, in no workload's share."""
    memory_unsupported: str | None = None
    utilization_unsupported: str | None = None


TapEvent = (
    GpuReading
    | TapProcesses
    | SourceFault
    | DeviceGone
    | EngineSample
    | PodsReading
    | ResourceSlicesReading
    | AgentsReading
    | TapAttribution
    | TapDecision
)


def tap_attribution(reading: PodResourcesReading, snapshot: Snapshot) -> TapAttribution:
    """The devices that ``reading``'s kubelet answer attributes, joined with the snapshot:
    those of its node only (a node agent's own, ``LOCAL_NODE``), not the whole cluster's
    once per answer."""
    joined = attribute(snapshot, node=reading.node)
    view = snapshot.nodes.get(reading.node)
    held: list[TapHeldDevice] = []
    if joined is not None:
        for key, holders in joined.by_device.items():
            device = snapshot.devices[key]
            held.append(
                TapHeldDevice(key=key, index=device.index, label=device.label, holders=holders)
            )
    held.sort(key=lambda d: (d.index, d.key))
    return TapAttribution(
        source=reading.source,
        at=reading.taken_at,
        devices=tuple(held),
        unmatched=() if joined is None else joined.unmatched,
        dra=reading.dra if view is None else view.dra,
    )


def tap_processes(
    reading: DeviceProcesses, snapshot: Snapshot, pods: dict[str, PodInfo]
) -> TapProcesses:
    """``reading`` with each process's pod named (``pods``: the watched pods by UID)."""
    device = snapshot.devices.get(reading.key)
    processes = tuple(
        TapProcess(**msgspec.structs.asdict(p), pod=_pod_name(p.pod_uid, pods))
        for p in reading.processes
    )
    return TapProcesses(
        source=reading.source,
        key=reading.key,
        index=reading.index,
        label=f"GPU {reading.index}" if device is None else device.label,
        at=reading.taken_at,
        processes=processes,
        outside_pods=sum(1 for p in reading.processes if not p.pod_uid),
        memory_unsupported=reading.memory_unsupported,
        utilization_unsupported=reading.utilization_unsupported,
    )


def _pod_name(uid: str, pods: dict[str, PodInfo]) -> str:
    if not uid:
        return OUTSIDE_ANY_POD
    pod = pods.get(uid)
    if pod is None:
        return f"pod {uid} (not among the pods watched)"
    return f"{pod.namespace}/{pod.name}"


def pods_by_uid(snapshot: Snapshot) -> dict[str, PodInfo]:
    return {} if snapshot.pods is None else {p.uid: p for p in snapshot.pods.pods if p.uid}


_ENCODER = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class TapFilter:
    source: str | None = None
    device: str | None = None
    """A GPU index or a device UUID."""
    metric: str | None = None
    trigger: str | None = None

    def accepts(self, event: TapEvent) -> bool:
        if isinstance(event, TapDecision):
            return (
                self.source is None
                and self.device is None
                and self.metric in (None, event.metric, event.metric_type)
                and self.trigger in (None, event.trigger)
            )
        if self.metric is not None or self.trigger is not None:
            return False
        if self.source is not None and event.source != self.source:
            return False
        if isinstance(event, EngineSample | PodsReading | ResourceSlicesReading | AgentsReading):
            return self.device is None
        if isinstance(event, TapAttribution):
            return self.device is None or any(
                self.device in (str(d.index), d.key) for d in event.devices
            )
        return self.device is None or self.device in (str(event.index), event.key)


class TapSubscription:
    def __init__(
        self, max_buffer: int, tap_filter: TapFilter, on_close: Callable[[TapSubscription], None]
    ) -> None:
        self._buffer: deque[bytes] = deque()
        self._max_buffer = max_buffer
        self._filter = tap_filter
        self._on_close = on_close
        self._ready = anyio.Event()
        self._closed = False
        self.dropped = 0
        self.delivered = 0

    def offer(self, event: TapEvent, encoded: Callable[[], bytes]) -> None:
        if not self._filter.accepts(event):
            return
        if len(self._buffer) >= self._max_buffer:
            self.dropped += 1
            return
        self._buffer.append(encoded())
        self._ready.set()

    def __aiter__(self) -> TapSubscription:
        return self

    async def __anext__(self) -> bytes:
        """The next JSON line, waiting for one; ends once the subscription is closed."""
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            await self._ready.wait()
            self._ready = anyio.Event()
        self.delivered += 1
        return self._buffer.popleft()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._ready.set()
            self._on_close(self)

    def __enter__(self) -> TapSubscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Tap:
    def __init__(self, *, max_buffer: int = 1000) -> None:
        self._subscribers: set[TapSubscription] = set()
        self._max_buffer = max_buffer
        self._dropped_closed = 0

    @property
    def listening(self) -> bool:
        return bool(self._subscribers)

    def subscribe(self, tap_filter: TapFilter = TapFilter()) -> TapSubscription:
        subscription = TapSubscription(self._max_buffer, tap_filter, self._unsubscribe)
        self._subscribers.add(subscription)
        return subscription

    def _unsubscribe(self, subscription: TapSubscription) -> None:
        self._subscribers.discard(subscription)
        self._dropped_closed += subscription.dropped

    def folded(self, samples: list[Sample], snapshot: Snapshot) -> None:
        """Every sample of a folded batch (the aggregator's observer); a PodResources
        answer is shown joined with the snapshot's devices."""
        if not self._subscribers:
            return
        pods: dict[str, PodInfo] | None = None
        for sample in unbatch(samples):
            if isinstance(sample, DeviceProcesses):
                pods = pods_by_uid(snapshot) if pods is None else pods
                self.publish(tap_processes(sample, snapshot, pods))
            elif isinstance(sample, PodResourcesReading):
                self.publish(tap_attribution(sample, snapshot))
            elif not isinstance(sample, SourceStopped | NodeDevices):
                self.publish(sample)

    def publish(self, event: TapEvent) -> None:
        if not self._subscribers:
            return
        cache: list[bytes] = []

        def encoded() -> bytes:
            if not cache:
                cache.append(_ENCODER.encode(event) + b"\n")
            return cache[0]

        for subscription in list(self._subscribers):
            subscription.offer(event, encoded)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    @property
    def dropped(self) -> int:
        """Events dropped so far for slow readers, closed subscriptions included."""
        return self._dropped_closed + sum(s.dropped for s in self._subscribers)
