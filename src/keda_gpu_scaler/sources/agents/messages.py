"""The WatchNode stream's messages as a cluster scaler reads them, and their schema.

Frozen msgspec structs with the attribute names and defaults of the generated classes
(``protos/kedagpuscaler/v1/node_agent.proto``), which the node agent encodes with, and
:data:`SCHEMA`, the proto's fields for each: what :mod:`.codec` decodes from. A test holds
:data:`SCHEMA` and the structs equal to the generated classes, so that a field added to the
proto cannot be missed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

import msgspec

__all__ = [
    "SCHEMA",
    "Attribution",
    "DeviceHolder",
    "DeviceProcesses",
    "DeviceReading",
    "DraDevice",
    "Field",
    "Heartbeat",
    "Kind",
    "LostDevice",
    "NodeIdentity",
    "NodeReadings",
    "NodeUpdate",
    "ProcessUse",
    "SourceFault",
]


# The decoded messages: frozen, untracked by the garbage collector (an immutable tree of
# strings, numbers and tuples holds no cycle), built positionally in declaration order.


class Heartbeat(msgspec.Struct, frozen=True, gc=False):
    pass


class NodeIdentity(msgspec.Struct, frozen=True, gc=False):
    node_name: str = ""
    agent_version: str = ""
    sample_period_s: float = 0.0
    heartbeat_s: float = 0.0


class DeviceReading(msgspec.Struct, frozen=True, gc=False):
    key: str = ""
    index: int = 0
    uuid: str = ""
    name: str = ""
    age_s: float = 0.0
    period_s: float = 0.0
    gpu_utilization: float | None = None
    memory_utilization: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    temperature_c: float | None = None
    power_mw: float | None = None
    power_limit_mw: float | None = None
    sm_clock_mhz: float | None = None
    pcie_tx_kbps: float | None = None
    pcie_rx_kbps: float | None = None
    nvlink_tx_mbps: float | None = None
    nvlink_rx_mbps: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_bw_util: float | None = None
    mig_enabled: bool = False
    parent_index: int | None = None
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    gpu_instance_profile_id: int | None = None
    placement_start: int | None = None
    placement_size: int | None = None


class LostDevice(msgspec.Struct, frozen=True, gc=False):
    key: str = ""
    index: int = 0
    reason: str = ""
    lost_for_s: float = 0.0


class SourceFault(msgspec.Struct, frozen=True, gc=False):
    source: str = ""
    reason: str = ""
    age_s: float = 0.0


class DeviceHolder(msgspec.Struct, frozen=True, gc=False):
    namespace: str = ""
    pod: str = ""
    container: str = ""
    resource: str = ""
    device_id: str = ""


class DraDevice(msgspec.Struct, frozen=True, gc=False):
    namespace: str = ""
    pod: str = ""
    container: str = ""
    claim_namespace: str = ""
    claim_name: str = ""
    driver: str = ""
    pool: str = ""
    device: str = ""
    share_id: str | None = None
    gpu: bool = False
    key: str | None = None
    outcome: str = ""
    detail: str = ""


class Attribution(msgspec.Struct, frozen=True, gc=False):
    age_s: float = 0.0
    period_s: float = 0.0
    same_holders: bool = False
    holders: tuple[DeviceHolder, ...] = ()
    dra: tuple[DraDevice, ...] = ()


class ProcessUse(msgspec.Struct, frozen=True, gc=False):
    pid: int = 0
    pod_uid: str = ""
    container_id: str = ""
    used_memory_bytes: int | None = None
    sm: float | None = None
    memory: float | None = None
    encoder: float | None = None
    decoder: float | None = None
    mps_server: bool = False
    pid_reused: bool = False


class DeviceProcesses(msgspec.Struct, frozen=True, gc=False):
    key: str = ""
    index: int = 0
    age_s: float = 0.0
    period_s: float = 0.0
    processes: tuple[ProcessUse, ...] = ()
    memory_unsupported: str | None = None
    utilization_unsupported: str | None = None


class NodeReadings(msgspec.Struct, frozen=True, gc=False):
    devices: tuple[DeviceReading, ...] = ()
    lost: tuple[LostDevice, ...] = ()
    faults: tuple[SourceFault, ...] = ()
    attribution: Attribution | None = None
    processes: tuple[DeviceProcesses, ...] = ()
    lists_every_device: bool = False


class NodeUpdate(msgspec.Struct, frozen=True, gc=False):
    identity: NodeIdentity | None = None
    readings: NodeReadings | None = None
    heartbeat: Heartbeat | None = None


Kind = Literal["string", "double", "int32", "int64", "bool", "message"]
"""A field's proto type, spelt as protobuf (and betterproto2) spell it."""


@dataclass(frozen=True, slots=True)
class Field:
    """One field of :data:`SCHEMA`: what the proto declares, in the proto's words."""

    number: int
    name: str
    kind: Kind
    optional: bool = False
    """Absent is None: a proto3 ``optional`` scalar, or any singular message field."""
    repeated: bool = False
    message: type[msgspec.Struct] | None = None
    """The type of a message field."""


def _message(number: int, name: str, message: type[msgspec.Struct]) -> Field:
    return Field(number, name, "message", optional=True, message=message)


def _messages(number: int, name: str, message: type[msgspec.Struct]) -> Field:
    return Field(number, name, "message", repeated=True, message=message)


def _reading(number: int, name: str, kind: Kind) -> Field:
    return Field(number, name, kind, optional=True)


SCHEMA: Final[dict[type[msgspec.Struct], tuple[Field, ...]]] = {
    NodeUpdate: (
        _message(1, "identity", NodeIdentity),
        _message(2, "readings", NodeReadings),
        _message(3, "heartbeat", Heartbeat),
    ),
    NodeIdentity: (
        Field(1, "node_name", "string"),
        Field(2, "agent_version", "string"),
        Field(3, "sample_period_s", "double"),
        Field(4, "heartbeat_s", "double"),
    ),
    Heartbeat: (),
    NodeReadings: (
        _messages(1, "devices", DeviceReading),
        _messages(2, "lost", LostDevice),
        _messages(3, "faults", SourceFault),
        _message(4, "attribution", Attribution),
        _messages(5, "processes", DeviceProcesses),
        Field(6, "lists_every_device", "bool"),
    ),
    DeviceProcesses: (
        Field(1, "key", "string"),
        Field(2, "index", "int32"),
        Field(3, "age_s", "double"),
        Field(4, "period_s", "double"),
        _messages(5, "processes", ProcessUse),
        Field(6, "memory_unsupported", "string", optional=True),
        Field(7, "utilization_unsupported", "string", optional=True),
    ),
    ProcessUse: (
        Field(1, "pid", "int32"),
        Field(2, "pod_uid", "string"),
        Field(3, "container_id", "string"),
        _reading(4, "used_memory_bytes", "int64"),
        _reading(5, "sm", "double"),
        _reading(6, "memory", "double"),
        _reading(7, "encoder", "double"),
        _reading(8, "decoder", "double"),
        Field(9, "mps_server", "bool"),
        Field(10, "pid_reused", "bool"),
    ),
    DeviceReading: (
        Field(1, "key", "string"),
        Field(2, "index", "int32"),
        Field(3, "uuid", "string"),
        Field(4, "name", "string"),
        Field(5, "age_s", "double"),
        Field(6, "period_s", "double"),
        _reading(7, "gpu_utilization", "double"),
        _reading(8, "memory_utilization", "double"),
        _reading(9, "memory_used_bytes", "int64"),
        _reading(10, "memory_total_bytes", "int64"),
        _reading(11, "memory_reserved_bytes", "int64"),
        _reading(12, "temperature_c", "double"),
        _reading(13, "power_mw", "double"),
        _reading(14, "power_limit_mw", "double"),
        _reading(15, "sm_clock_mhz", "double"),
        _reading(16, "pcie_tx_kbps", "double"),
        _reading(17, "pcie_rx_kbps", "double"),
        _reading(18, "nvlink_tx_mbps", "double"),
        _reading(19, "nvlink_rx_mbps", "double"),
        _reading(20, "sm_active", "double"),
        _reading(21, "sm_occupancy", "double"),
        _reading(22, "tensor_active", "double"),
        _reading(23, "dram_bw_util", "double"),
        Field(24, "mig_enabled", "bool"),
        _reading(25, "parent_index", "int32"),
        _reading(26, "parent_uuid", "string"),
        _reading(27, "gpu_instance_id", "int32"),
        _reading(28, "compute_instance_id", "int32"),
        _reading(29, "gpu_instance_profile_id", "int32"),
        _reading(30, "placement_start", "int32"),
        _reading(31, "placement_size", "int32"),
    ),
    LostDevice: (
        Field(1, "key", "string"),
        Field(2, "index", "int32"),
        Field(3, "reason", "string"),
        Field(4, "lost_for_s", "double"),
    ),
    SourceFault: (
        Field(1, "source", "string"),
        Field(2, "reason", "string"),
        Field(3, "age_s", "double"),
    ),
    Attribution: (
        Field(1, "age_s", "double"),
        Field(2, "period_s", "double"),
        Field(3, "same_holders", "bool"),
        _messages(4, "holders", DeviceHolder),
        _messages(5, "dra", DraDevice),
    ),
    DeviceHolder: (
        Field(1, "namespace", "string"),
        Field(2, "pod", "string"),
        Field(3, "container", "string"),
        Field(4, "resource", "string"),
        Field(5, "device_id", "string"),
    ),
    DraDevice: (
        Field(1, "namespace", "string"),
        Field(2, "pod", "string"),
        Field(3, "container", "string"),
        Field(4, "claim_namespace", "string"),
        Field(5, "claim_name", "string"),
        Field(6, "driver", "string"),
        Field(7, "pool", "string"),
        Field(8, "device", "string"),
        Field(9, "share_id", "string", optional=True),
        Field(10, "gpu", "bool"),
        Field(11, "key", "string", optional=True),
        Field(12, "outcome", "string"),
        Field(13, "detail", "string"),
    ),
}
"""Every message of the stream: its struct and its fields, as the proto declares them."""
