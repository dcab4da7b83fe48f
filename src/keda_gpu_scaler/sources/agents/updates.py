"""One WatchNode stream, received: the rules it must keep, and its updates as samples.

Sans-I/O: :class:`StreamReader` takes each ``NodeUpdate`` as the link's codec decodes it (the
frozen structs of :mod:`.messages`) with the cluster's clock at receipt and returns the samples to
publish, or raises :class:`BadUpdate` naming what the agent got wrong. The rules:

- the first message is the agent's identity, and the only one: a second identity (the same
  name or another) is refused, as is one naming another node than discovery found;
- every message has exactly one kind (identity, readings, heartbeat): an empty message is
  what garbage decodes to, and a newer agent sends new kinds only to a client that asks;
- ages and periods are finite, ages not negative, periods positive; device keys are
  present and unique (in the readings, and apart in the per-process readings); an
  attribution that says "same holders" follows one that had them.

Clocks: a reading's ``taken_at`` is the receipt time minus the age the agent sent, on the
cluster's clock, so an agent whose clock is hours off is read as fresh as it is.

Forgetting: from an agent that lists every device it has (``lists_every_device``), a device
left out since the previous message is gone (:class:`DeviceGone`), and the first message of a
stream lists the node's devices (:class:`NodeDevices`), so that one kept from an earlier
stream and gone meanwhile is forgotten too; both come first in their batch. An older agent's
devices are kept until they go stale.

Names: readings are published as ``agent/<node>`` with keys ``<node>/<agent's key>``; the
attribution as ``agent/<node>/pod-resources``, and the agent's PodResources faults with it;
the faults of the agent's pod watch as ``agent/<node>/pods``, a source that lasts while the
agent reports the fault (a :class:`SourceStopped` ends it when the agent no longer does).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from math import isfinite
from typing import TypeVar

import msgspec
from msgspec.structs import astuple

from keda_gpu_scaler.domain.agents import attribution_source, fault_source, readings_source
from keda_gpu_scaler.domain.errors import SourceFailure
from keda_gpu_scaler.domain.samples import (
    FLOAT_READINGS,
    PODS_SOURCE,
    Batch,
    DeviceGone,
    DeviceHolder,
    DeviceKey,
    DeviceProcesses,
    DraDevice,
    GpuReading,
    NodeDevices,
    PodResourcesReading,
    ProcessUse,
    SourceFault,
    SourceStopped,
    finite_or_none,
)
from keda_gpu_scaler.sources.agents import messages

__all__ = [
    "BadUpdate",
    "StreamReader",
    "attribution_source",
    "readings_source",
]

_FLOATS = frozenset(FLOAT_READINGS)
_MEMORY = ("memory_used_bytes", "memory_total_bytes", "memory_reserved_bytes")
# Kubernetes node names are RFC 1123 subdomains; an agent falling back to its host name may
# send capitals or underscores. Never "/", which separates the node from the key.
_NODE_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,251}[A-Za-z0-9])?")


class BadUpdate(SourceFailure):
    """The agent sent something this link cannot use; the message says what."""


@dataclass(slots=True)
class StreamReader:
    """The receiving end of one stream; ``expected_node`` is discovery's word, "" if none."""

    expected_node: str = ""
    node: str | None = None
    period_s: float | None = None
    """The agent's sample period, once its identity came."""
    heartbeat_s: float | None = None
    """How often at least the agent promises a message, once its identity came."""
    agent_version: str = ""
    _lists: tuple[tuple[DeviceHolder, ...], tuple[DraDevice, ...]] | None = None
    _pods_faulted: bool = False
    """Whether the last readings reported a fault of the agent's pod watch."""
    _listed: dict[str, int] | None = None
    """The devices (agent's key: index) the last readings listed as every device the agent
    has; None before such readings."""

    def receive(
        self, update: messages.NodeUpdate, received_at: float
    ) -> tuple[PodResourcesReading | Batch | SourceStopped, ...]:
        """The samples ``update`` stands for (none for an identity or a heartbeat)."""
        kinds = [
            kind
            for kind, value in (
                ("identity", update.identity),
                ("readings", update.readings),
                ("heartbeat", update.heartbeat),
            )
            if value is not None
        ]
        if len(kinds) != 1:
            raise BadUpdate("a message with no known kind of update in it (garbage?)")
        if update.identity is not None:
            self._identify(update.identity)
            return ()
        if self.node is None:
            raise BadUpdate(f"the first message is {kinds[0]}, not the agent's identity")
        if update.readings is None:
            return ()
        return self._samples(self.node, update.readings, received_at)

    def _identify(self, identity: messages.NodeIdentity) -> None:
        name = identity.node_name
        if self.node is not None:
            if name != self.node:
                raise BadUpdate(f"the node name changed mid-stream, from {self.node} to {name!r}")
            raise BadUpdate("a second identity on one stream")
        if not _NODE_NAME.fullmatch(name):
            raise BadUpdate(f"the identity names no usable node: {name!r}")
        if self.expected_node and name != self.expected_node:
            raise BadUpdate(
                f"the agent says it is node {name}, discovery found it on {self.expected_node}"
            )
        self.period_s = _positive(identity.sample_period_s, "sample_period_s")
        self.heartbeat_s = _positive(identity.heartbeat_s, "heartbeat_s")
        self.node = name
        self.agent_version = identity.agent_version

    def _samples(
        self, node: str, readings: messages.NodeReadings, received_at: float
    ) -> tuple[PodResourcesReading | Batch | SourceStopped, ...]:
        source = readings_source(node)
        samples: list[GpuReading | DeviceProcesses | SourceFault] = []
        seen: set[str] = set()
        for device in readings.devices:
            _check_key(device.key, seen)
            samples.append(_reading(device, node, source, received_at))
        seen_processes: set[str] = set()
        for processes in readings.processes:
            _check_key(processes.key, seen_processes)
            samples.append(_processes(processes, node, source, received_at))
        for lost in readings.lost:
            _check_key(lost.key, seen)
            samples.append(
                SourceFault(
                    source=source,
                    key=DeviceKey(f"{node}/{lost.key}"),
                    at=received_at - _age(lost.lost_for_s, "lost_for_s"),
                    reason=lost.reason,
                    index=lost.index,
                    lost=True,
                )
            )
        attribution_faults: list[SourceFault | GpuReading] = []
        pods_faulted = False
        for fault in readings.faults:
            own = fault_source(node, fault.source)
            pods_faulted |= fault.source == PODS_SOURCE
            kept = samples if own == source else attribution_faults
            kept.append(
                SourceFault(
                    source=own,
                    key=None,
                    at=received_at - _age(fault.age_s, "a fault's age_s"),
                    reason=f"{fault.source} on node {node}: {fault.reason}",
                )
            )
        out: list[PodResourcesReading | Batch | SourceStopped] = []
        if readings.attribution is not None:
            out.append(self._attribution(node, readings.attribution, received_at))
        forgotten = self._forgotten(node, readings, received_at)
        out.append(Batch(source=source, samples=(*forgotten, *samples, *attribution_faults)))
        if self._pods_faulted and not pods_faulted:
            out.append(SourceStopped(source=fault_source(node, PODS_SOURCE)))
        self._pods_faulted = pods_faulted
        return tuple(out)

    def _forgotten(
        self, node: str, readings: messages.NodeReadings, received_at: float
    ) -> list[NodeDevices] | list[DeviceGone]:
        """What the agent no longer has, if it lists every device: anything not listed, in
        a stream's first readings; else each device listed last time and not now."""
        if not readings.lists_every_device:
            return []
        source = readings_source(node)
        listed = {d.key: d.index for d in readings.devices}
        listed.update((d.key, d.index) for d in readings.lost)
        before, self._listed = self._listed, listed
        if before is None:
            keys = frozenset(DeviceKey(f"{node}/{key}") for key in listed)
            return [NodeDevices(source=source, node=node, at=received_at, keys=keys)]
        return [
            DeviceGone(
                source=source,
                key=DeviceKey(f"{node}/{key}"),
                at=received_at,
                reason=f"the node agent of {node} no longer has it: it no longer exists there",
                index=index,
            )
            for key, index in before.items()
            if key not in listed
        ]

    def _attribution(
        self, node: str, attribution: messages.Attribution, received_at: float
    ) -> PodResourcesReading:
        if attribution.same_holders:
            if self._lists is None:
                raise BadUpdate("an attribution with the same holders as none before it")
            holders, dra = self._lists
        else:
            holders, dra = _holders(attribution), _dra(attribution)
            self._lists = (holders, dra)
        return PodResourcesReading(
            source=attribution_source(node),
            node=node,
            taken_at=received_at - _age(attribution.age_s, "the attribution's age_s"),
            period_s=_positive(attribution.period_s, "the attribution's period_s"),
            holders=holders,
            dra=dra,
        )


# A decoded device's values are GpuReading's fields in GpuReading's order, but for the first
# few: the reading is built from them positionally (checked here, once).
_DEVICE_FIELDS = messages.DeviceReading.__struct_fields__
_READINGS = slice(_DEVICE_FIELDS.index("period_s") + 1, None)
"""The readings and the MIG fields."""
_NUMBERS = slice(_READINGS.start, _DEVICE_FIELDS.index("mig_enabled"))
"""The numeric readings: floats, and the memory sizes."""
_POSITIONAL = ("source", *_DEVICE_FIELDS[:4], "taken_at", "period_s")
if GpuReading.__struct_fields__ != (*_POSITIONAL, *_DEVICE_FIELDS[_READINGS], "node") or not (
    set(_DEVICE_FIELDS[_NUMBERS]) <= _FLOATS | set(_MEMORY)
):  # pragma: no cover - a field added to one and not the other
    raise ImportError("GpuReading's fields and the WatchNode DeviceReading's are out of order")


def _reading(
    device: messages.DeviceReading, node: str, source: str, received_at: float
) -> GpuReading:
    # A thousand agents' devices a second go through here. A NaN or an infinity is no reading.
    values = astuple(device)
    readings = values[_READINGS]
    if not isfinite(sum(filter(None, values[_NUMBERS]))):  # one is not finite (or all huge)
        readings = tuple(None if isinstance(v, float) and not isfinite(v) else v for v in readings)
    first = (
        source,
        DeviceKey(f"{node}/{device.key}"),
        device.index,
        device.uuid,
        device.name,
        received_at - _age(device.age_s, "age_s", of=device.key),
        _positive(device.period_s, "period_s", of=device.key),
    )
    return GpuReading(*(first + readings + (node,)))


def _processes(
    device: messages.DeviceProcesses, node: str, source: str, received_at: float
) -> DeviceProcesses:
    return DeviceProcesses(
        source=source,
        key=DeviceKey(f"{node}/{device.key}"),
        index=device.index,
        taken_at=received_at - _age(device.age_s, "processes' age_s", of=device.key),
        period_s=_positive(device.period_s, "processes' period_s", of=device.key),
        processes=tuple(_process(p) for p in device.processes),
        memory_unsupported=device.memory_unsupported,
        utilization_unsupported=device.utilization_unsupported,
        node=node,
    )


_PROCESS_SHARES = ("sm", "memory", "encoder", "decoder")


def _process(process: messages.ProcessUse) -> ProcessUse:
    # The domain struct has the message's fields, by name; a NaN or an infinity is no
    # reading, as in a device's readings.
    values = msgspec.structs.asdict(process)
    for name in _PROCESS_SHARES:
        values[name] = finite_or_none(values[name])
    return ProcessUse(**values)


def _holders(attribution: messages.Attribution) -> tuple[DeviceHolder, ...]:
    return tuple(_as(DeviceHolder, h) for h in attribution.holders)


def _dra(attribution: messages.Attribution) -> tuple[DraDevice, ...]:
    return tuple(_as(DraDevice, d) for d in attribution.dra)


_S = TypeVar("_S", DeviceHolder, DraDevice)


def _as(kind: type[_S], message: object) -> _S:
    """The domain struct of a proto message with its fields, by name."""
    return kind(**{name: getattr(message, name) for name in kind.__struct_fields__})


def _check_key(key: str, seen: set[str]) -> None:
    if not key:
        raise BadUpdate("a device without a key")
    if key in seen:
        raise BadUpdate(f"device {key} twice in one update")
    seen.add(key)


def _age(value: float, what: str, *, of: str = "") -> float:
    """``value`` if it is an age in seconds; ``what`` (of device ``of``) names it otherwise,
    worded only then: every device of every update passes here."""
    if not (math.isfinite(value) and value >= 0):
        raise BadUpdate(f"{_whose(what, of)} {value!r} is not a number of seconds >= 0")
    return value


def _positive(value: float, what: str, *, of: str = "") -> float:
    if not (math.isfinite(value) and value > 0):
        raise BadUpdate(f"{_whose(what, of)} {value!r} is not a positive number of seconds")
    return value


def _whose(what: str, of: str) -> str:
    return f"{of}'s {what}" if of else what
