"""NodeAgent.WatchNode: this node agent's snapshots, streamed to a cluster scaler.

A stream sends the agent's identity, then one ``NodeReadings`` per change of what it carries
(a reading, a device lost or found, a source fault, a kubelet answer), and a heartbeat when
nothing changed for :func:`heartbeat_s`. The servicer reads the :class:`SnapshotHub` only.

- **Coalescing.** A stream waits for the hub's newest snapshot after each message it sent,
  and sends nothing else in between: a cluster scaler that reads slowly (HTTP/2 flow control
  holds the send) gets the newest state when it reads again, never a backlog, so it costs the
  agent one message per stream whatever it falls behind.
- **Ages, not timestamps.** Each reading's ``age_s`` is the agent's clock at the moment the
  message is made minus the reading's ``taken_at``; the cluster dates it on its own clock.
- **Attribution once per kubelet answer.** Who holds which device is the largest part of an
  update and changes rarely: it goes out once per kubelet answer (every few seconds) and
  once per change of the DRA join (its DRA devices are sent joined: the cluster scaler reads
  no ResourceSlice), its lists only when they changed (``same_holders`` otherwise). At a
  thousand agents at 1 Hz that keeps the cluster scaler's decoding to the readings.
- **Every device, so that a device forgotten is forgotten there too.** A message names
  every device the agent has, read or lost, and says so (``lists_every_device``): a device
  the agent forgot (a MIG instance destroyed) is left out, and the cluster scaler forgets it
  at once, as it forgets any device kept from an earlier stream that the first message of a
  new one leaves out.
- **Per-process readings when new.** Each device's per-process reading is read every few
  seconds and goes out once, in the first message after it was taken (every device's in a
  stream's first): the cluster scaler keeps it until a newer one comes.
- **Shutdown** (:meth:`NodeAgentService.begin_shutdown`): every stream ends with status OK, so
  a cluster scaler reconnects, as StreamIsActive streams do.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec

from keda_gpu_scaler import __version__
from keda_gpu_scaler._proto_agent.kedagpuscaler.v1 import (
    Attribution,
    DeviceHolder,
    DeviceProcesses,
    DeviceReading,
    DraDevice,
    Heartbeat,
    LostDevice,
    NodeAgentBase,
    NodeIdentity,
    NodeReadings,
    NodeUpdate,
    ProcessUse,
    SourceFault,
    WatchNodeRequest,
)
from keda_gpu_scaler.domain import samples as domain
from keda_gpu_scaler.domain.samples import OPTIONAL_READINGS, GpuReading, PodResourcesReading
from keda_gpu_scaler.domain.snapshot import (
    LOCAL_NODE,
    DeviceState,
    NodeView,
    Snapshot,
    SourceState,
)
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.serving.status import streaming
from keda_gpu_scaler.serving.telemetry import Telemetry

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SAMPLE_PERIOD_S",
    "MIN_HEARTBEAT_S",
    "NodeAgentService",
    "UpdateBuilder",
    "heartbeat_s",
    "sample_period_s",
]

RPC = "WatchNode"
DEFAULT_SAMPLE_PERIOD_S = 1.0
"""The period an identity names before the agent has any reading."""
MIN_HEARTBEAT_S = 1.0


def sample_period_s(snapshot: Snapshot) -> float:
    """The shortest period of the readings the agent has (its GPU sampler's), or the default."""
    periods = [d.reading.period_s for d in snapshot.devices.values() if d.reading is not None]
    return min(periods, default=DEFAULT_SAMPLE_PERIOD_S)


def heartbeat_s(period_s: float, minimum_s: float = MIN_HEARTBEAT_S) -> float:
    """Silence after which a stream sends a heartbeat: the promise its identity makes."""
    return max(period_s, minimum_s)


def device_reading(reading: GpuReading, now: float) -> DeviceReading:
    optional: dict[str, Any] = {name: getattr(reading, name) for name in OPTIONAL_READINGS}
    return DeviceReading(
        key=reading.key,
        index=reading.index,
        uuid=reading.uuid,
        name=reading.name,
        age_s=now - reading.taken_at,
        period_s=reading.period_s,
        mig_enabled=reading.mig_enabled,
        **optional,
    )


def device_processes(reading: domain.DeviceProcesses, now: float) -> DeviceProcesses:
    return DeviceProcesses(
        key=reading.key,
        index=reading.index,
        age_s=now - reading.taken_at,
        period_s=reading.period_s,
        # The proto message has the domain struct's fields, by name.
        processes=[ProcessUse(**msgspec.structs.asdict(p)) for p in reading.processes],
        memory_unsupported=reading.memory_unsupported,
        utilization_unsupported=reading.utilization_unsupported,
    )


def attribution_lists(
    reading: PodResourcesReading, dra: tuple[domain.DraDevice, ...] | None = None
) -> tuple[list[DeviceHolder], list[DraDevice]]:
    """``reading``'s holders, and ``dra``: its DRA devices as the agent joined them (the
    reading's own when None)."""
    # The proto messages have the domain structs' fields, by name.
    holders = [DeviceHolder(**msgspec.structs.asdict(h)) for h in reading.holders]
    joined = reading.dra if dra is None else dra
    return holders, [DraDevice(**msgspec.structs.asdict(d)) for d in joined]


_Carried = tuple[object, ...]


def _faulted(snapshot: Snapshot) -> list[tuple[str, SourceState]]:
    """The sources whose last word was a failure, by name; engines' are not the node's."""
    return [
        (name, s)
        for name, s in sorted(snapshot.sources.items())
        if s.fault is not None and name not in snapshot.engines
    ]


def _carried(devices: list[DeviceState], faulted: list[tuple[str, SourceState]]) -> _Carried:
    """What a NodeReadings says, minus the ages: equal means there is nothing new to send."""
    return (
        tuple((d.key, d.reading, d.lost_reason, d.processes) for d in devices),
        tuple((name, s.fault, s.fault_at) for name, s in faulted),
    )


@dataclass(slots=True)
class UpdateBuilder:
    """One stream's memory of what it sent; pure, the caller owns the clock."""

    _carried: _Carried | None = None
    _attribution: tuple[object, ...] | None = None
    _lists: tuple[object, ...] | None = None
    _processes: dict[domain.DeviceKey, domain.DeviceProcesses] = field(default_factory=dict)
    """Each device's per-process reading last sent."""

    def update(self, snapshot: Snapshot, now: float) -> NodeReadings | None:
        """The message for ``snapshot`` at ``now``, or None when it would say nothing new."""
        devices, faulted = snapshot.ordered_devices(), _faulted(snapshot)
        carried = _carried(devices, faulted)
        local = snapshot.nodes.get(LOCAL_NODE)
        attribution = self._new_attribution(local, now)
        if carried == self._carried and attribution is None:
            return None
        self._carried = carried
        return NodeReadings(
            processes=self._new_processes(devices, now),
            devices=[
                device_reading(d.reading, now)
                for d in devices
                if d.reading is not None and not d.is_lost()
            ],
            lost=[
                LostDevice(
                    key=d.key,
                    index=d.index,
                    reason=d.lost_reason or "",
                    lost_for_s=now - (now if d.lost_since is None else d.lost_since),
                )
                for d in devices
                if d.is_lost()
            ],
            faults=[
                SourceFault(source=name, reason=s.fault or "", age_s=now - (s.fault_at or now))
                for name, s in faulted
            ],
            attribution=attribution,
            lists_every_device=True,
        )

    def _new_processes(self, devices: list[DeviceState], now: float) -> list[DeviceProcesses]:
        """The per-process readings taken since the last message, of the devices not lost."""
        current = {
            d.key: d.processes for d in devices if d.processes is not None and not d.is_lost()
        }
        new = [p for key, p in current.items() if self._processes.get(key) is not p]
        self._processes = current
        return [device_processes(p, now) for p in new]

    def _new_attribution(self, view: NodeView | None, now: float) -> Attribution | None:
        """The kubelet's answer, once per answer and once per change of the DRA join."""
        reading = None if view is None else view.attribution
        if view is None or reading is None:
            return None
        sent = (reading.source, reading.taken_at, view.dra)
        if sent == self._attribution:
            return None
        self._attribution = sent
        lists = (reading.holders, view.dra)
        same = lists == self._lists
        self._lists = lists
        holders, dra = ([], []) if same else attribution_lists(reading, view.dra)
        return Attribution(
            age_s=now - reading.taken_at,
            period_s=reading.period_s,
            same_holders=same,
            holders=holders,
            dra=dra,
        )


class NodeAgentService(NodeAgentBase):
    """``WatchNode`` from ``hub``; ``clock`` dates the ages (the agent's own clock), and a
    stream sends a heartbeat after ``max(sample period, min_heartbeat_s)`` of silence."""

    def __init__(
        self,
        hub: SnapshotHub,
        node_name: str,
        *,
        telemetry: Telemetry,
        agent_version: str = __version__,
        clock: Callable[[], float] = anyio.current_time,
        min_heartbeat_s: float = MIN_HEARTBEAT_S,
    ) -> None:
        if not node_name:
            raise ValueError("a node agent needs its node's name")
        if not min_heartbeat_s > 0:
            raise ValueError(f"min_heartbeat_s must be positive, not {min_heartbeat_s!r}")
        self.min_heartbeat_s = min_heartbeat_s
        self._hub = hub
        self.node_name = node_name
        self.agent_version = agent_version
        self.telemetry = telemetry
        self._clock = clock
        self._waiting: set[anyio.CancelScope] = set()
        self._open = 0
        self._closing = False
        self._ended = anyio.Event()

    @property
    def open_streams(self) -> int:
        return self._open

    @streaming(RPC)
    async def watch_node(self, message: WatchNodeRequest) -> AsyncIterator[NodeUpdate]:
        if self._closing:
            return
        self._open += 1
        try:
            period = sample_period_s(self._hub.current)
            heartbeat = heartbeat_s(period, self.min_heartbeat_s)
            yield NodeUpdate(
                identity=NodeIdentity(
                    node_name=self.node_name,
                    agent_version=self.agent_version,
                    sample_period_s=period,
                    heartbeat_s=heartbeat,
                )
            )
            builder = UpdateBuilder()
            version = 0
            due = anyio.current_time() + heartbeat
            while not self._closing:
                snapshot = await self._newer(version, due)
                if self._closing:
                    return
                if snapshot is None:
                    due = anyio.current_time() + heartbeat
                    yield NodeUpdate(heartbeat=Heartbeat())
                    continue
                version = snapshot.version
                readings = builder.update(snapshot, self._clock())
                if readings is not None:
                    due = anyio.current_time() + heartbeat
                    yield NodeUpdate(readings=readings)
        finally:
            self._open -= 1
            if self._closing and not self._open:
                self._ended.set()

    async def _newer(self, version: int, due: float) -> Snapshot | None:
        """The hub's newest snapshot once it is above ``version``; None at ``due`` or on
        shutdown."""
        with anyio.CancelScope(deadline=due) as scope:
            self._waiting.add(scope)
            try:
                await self._hub.wait_newer(version)
                return self._hub.current
            finally:
                self._waiting.discard(scope)
        return None

    def begin_shutdown(self) -> None:
        """End every open stream with status OK (a cluster scaler reconnects)."""
        self._closing = True
        if not self._open:
            self._ended.set()
        for scope in list(self._waiting):
            scope.cancel()

    async def wait_streams_ended(self) -> None:
        """After :meth:`begin_shutdown`, until every stream handler has returned."""
        if self._closing:
            await self._ended.wait()
