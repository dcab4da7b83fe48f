"""The WatchNode stream's ``NodeUpdate`` messages, decoded from protobuf wire bytes.

A cluster scaler decodes one update per node agent per second, and betterproto2's generic
parser spends most of a core on that at a thousand agents. This decoder knows exactly one
schema (``protos/kedagpuscaler/v1/node_agent.proto``), written out as :data:`SCHEMA`, and
builds frozen msgspec structs with the generated classes' attribute names and defaults;
the node agent still encodes with betterproto2, and a test holds :data:`SCHEMA` equal to the
generated classes so that a field added to the proto cannot be missed here.

Proto3 rules, as the generated classes read valid messages; where betterproto2 takes what
comes (a string cut short, a known field with another wire type), this refuses it:

- an absent scalar is its zero value ("", 0, 0.0, False); an absent ``optional`` scalar or
  message field is None; a repeated field is a tuple, empty when absent;
- a singular field sent twice keeps its last value, a message field too (betterproto2
  replaces it rather than merging the two), and the members of a ``oneof`` are decoded
  independently: two of them present are both set, as betterproto2 sets them, and it is
  the stream's rules that refuse such an update;
- unknown field numbers are skipped (varint, 64-bit, length-delimited and 32-bit wire
  types), for a newer agent's sake; groups (wire types 3 and 4), wire types 6 and 7, field
  number 0 and a known field with another wire type than its own are errors;
- int32 and int64 are two's complement (a negative is a 10-byte varint; int32 keeps the
  low 32 bits of a longer one), a varint over 10 bytes is an error, bool is any nonzero
  varint, strings are strict UTF-8, doubles are 8 bytes little-endian; a length or a value
  running past its message is an error.

Every error is a :class:`CodecError` naming the message type, the field number (unless it
is the tag that is broken) and what was wrong.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

__all__ = [
    "SCHEMA",
    "Attribution",
    "CodecError",
    "DeviceHolder",
    "DeviceReading",
    "DraDevice",
    "Field",
    "Heartbeat",
    "LostDevice",
    "NodeIdentity",
    "NodeReadings",
    "NodeUpdate",
    "SourceFault",
    "decode_update",
]


class CodecError(ValueError):
    """Bytes that are not a ``NodeUpdate`` of this schema; the message says where and why."""


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


class Attribution(msgspec.Struct, frozen=True, gc=False):
    age_s: float = 0.0
    period_s: float = 0.0
    same_holders: bool = False
    holders: tuple[DeviceHolder, ...] = ()
    dra: tuple[DraDevice, ...] = ()


class NodeReadings(msgspec.Struct, frozen=True, gc=False):
    devices: tuple[DeviceReading, ...] = ()
    lost: tuple[LostDevice, ...] = ()
    faults: tuple[SourceFault, ...] = ()
    attribution: Attribution | None = None


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
    ),
}
"""Every message of the stream: its struct and its fields, as the proto declares them."""


# --- the decoder ----------------------------------------------------------------------------
#
# Each message is compiled once into a plan: its fields by wire tag (field number << 3 | wire
# type, the tag's varint as it arrives), each with the slot of its struct's positional
# argument and a small integer kind, tested most frequent first (doubles are most of a
# reading). One loop decodes every message; the common cases (1- and 2-byte tags, 1-byte
# lengths and values) are inline, the rest in helpers. Doubles declared one after another
# (most of a reading) are read together as far as they were sent in that order.

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_WIRE_NAMES: Final = {
    0: "varint",
    1: "64-bit",
    2: "length-delimited",
    3: "group start",
    4: "group end",
    5: "32-bit",
    6: "reserved wire type 6",
    7: "reserved wire type 7",
}
_DOUBLE, _STRING, _INT64, _INT32, _BOOL, _MESSAGE, _MESSAGES = range(7)
_KINDS: Final[dict[Kind, tuple[int, int]]] = {
    "double": (_DOUBLE, _FIXED64),
    "string": (_STRING, _LENGTH),
    "int64": (_INT64, _VARINT),
    "int32": (_INT32, _VARINT),
    "bool": (_BOOL, _VARINT),
    "message": (_MESSAGE, _LENGTH),
}
_MASK32, _SIGN32 = 0xFFFF_FFFF, 0x8000_0000
_MASK64, _SIGN64 = 0xFFFF_FFFF_FFFF_FFFF, 0x8000_0000_0000_0000
_INT32_MAX, _INT64_MAX = _SIGN32 - 1, _SIGN64 - 1
_MAX_FIELD_NUMBER = (1 << 29) - 1
_NO_TAG = -1
"""In place of a tag, for an error in reading a tag."""
_unpack_double = struct.Struct("<d").unpack_from


@dataclass(slots=True)
class _Plan:
    name: str
    make: type[msgspec.Struct]
    defaults: list[object]
    """The struct's defaults, in its positional order: copied, then filled in."""
    by_tag: list[tuple[int, int, Any] | None]
    """By wire tag: (slot, kind, the :class:`_Plan` of a message field or the :class:`_Run`
    of a double field, else None), None for an unknown tag; every 1-byte tag has a place.
    (``Any``: the decoder's loop reads it without a cast.)"""
    fields: dict[int, Field]
    repeated: tuple[int, ...]
    """Slots of repeated fields: lists while decoding, tuples in the struct."""


@dataclass(frozen=True, slots=True)
class _Run:
    """The double fields declared after a double field, numbered on from it, in consecutive
    slots: encoded in order (as every encoder does), they are checked and read at once."""

    next_tags: tuple[tuple[int, int], ...]
    """Each next field's tag: its first byte, and its second or -1 for a 1-byte tag."""
    unpack: tuple[Callable[[bytes, int], tuple[float, ...]], ...]
    """``unpack[k]`` reads the first double and ``k`` more, each after its tag."""


def _runs(plan: _Plan, names: tuple[str, ...]) -> None:
    """Gives each double field of ``plan`` followed by another its :class:`_Run`."""
    for tag, entry in enumerate(plan.by_tag):
        if entry is None or entry[1] != _DOUBLE:
            continue
        slot, number = entry[0], tag >> 3
        tags: list[tuple[int, int]] = []
        formats = ["<d"]
        while (f := plan.fields.get(number + len(tags) + 1)) is not None and f.kind == "double":
            if names.index(f.name) != slot + len(tags) + 1:
                break
            encoded = _varint_bytes(f.number << 3 | _FIXED64)
            if len(encoded) > 2:
                break
            tags.append((encoded[0], encoded[1] if len(encoded) == 2 else -1))
            formats.append(formats[-1] + "x" * len(encoded) + "d")
        if tags:
            unpack = tuple(struct.Struct(f).unpack_from for f in formats)
            plan.by_tag[tag] = (slot, _DOUBLE, _Run(tuple(tags), unpack))


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _compile(schema: dict[type[msgspec.Struct], tuple[Field, ...]]) -> dict[type, _Plan]:
    """A plan per message of ``schema``; raises ValueError for a field it cannot decode."""
    plans: dict[type, _Plan] = {}
    for make, fields in schema.items():
        names, defaults = make.__struct_fields__, list(make.__struct_defaults__)
        if sorted(names) != sorted(f.name for f in fields) or len(defaults) != len(names):
            raise ValueError(f"{make.__name__}: its fields {names} are not {fields}, all defaulted")
        by_number = {f.number: f for f in fields}
        plans[make] = _Plan(make.__name__, make, defaults, [None] * 0x80, by_number, ())
    for make, fields in schema.items():
        plan = plans[make]
        names = make.__struct_fields__
        for f in fields:
            kind, wire = _KINDS[f.kind]
            if f.repeated and kind != _MESSAGE:
                raise ValueError(f"{plan.name}.{f.name}: a repeated {f.kind} is not supported")
            if f.repeated:
                kind = _MESSAGES
            sub = plans[f.message] if f.message is not None else None
            tag = f.number << 3 | wire
            plan.by_tag.extend([None] * (tag + 1 - len(plan.by_tag)))
            plan.by_tag[tag] = (names.index(f.name), kind, sub)
        plan.repeated = tuple(names.index(f.name) for f in fields if f.repeated)
        _runs(plan, names)
    return plans


_PLANS: Final = _compile(SCHEMA)
_UPDATE: Final = _PLANS[NodeUpdate]


def decode_update(data: bytes) -> NodeUpdate:
    """The ``NodeUpdate`` in ``data``; raises :class:`CodecError` naming what is wrong."""
    update: NodeUpdate = _decode(_UPDATE, data, 0, len(data))  # by _UPDATE's type
    return update


def _decode(plan: _Plan, data: bytes, pos: int, end: int) -> Any:
    """The message of ``plan`` in ``data[pos:end]``: an instance of ``plan.make``."""
    values = plan.defaults.copy()
    by_tag = plan.by_tag
    unpack_double = _unpack_double
    tag = _NO_TAG
    try:
        while pos < end:
            tag = data[pos]
            pos += 1
            if tag < 0x80:
                entry = by_tag[tag]
            else:
                if pos < end and data[pos] < 0x80:
                    tag = (tag & 0x7F) | data[pos] << 7
                    pos += 1
                else:
                    tag, pos = _varint(plan, _NO_TAG, data, pos - 1, end)
                entry = by_tag[tag] if tag < len(by_tag) else None
            if entry is None:
                pos = _skip(plan, tag, data, pos, end)
                continue
            slot, kind, sub = entry
            if kind == _DOUBLE:
                if pos + 8 > end:
                    raise _error(plan, tag, f"a double with {end - pos} of its 8 bytes")
                if sub is None:
                    values[slot] = unpack_double(data, pos)[0]
                    pos += 8
                    continue
                # The doubles declared next, as far as they follow in order: tags checked
                # one by one, values read at once. Whatever breaks the run (an absent field,
                # another order, a value cut short) is read field by field from there.
                n, after = 0, pos + 8
                for lead, second in sub.next_tags:
                    width = 1 if second < 0 else 2
                    if (
                        after + width + 8 > end
                        or data[after] != lead
                        or (width == 2 and data[after + 1] != second)
                    ):
                        break
                    n += 1
                    after += width + 8
                if n:
                    values[slot : slot + n + 1] = sub.unpack[n](data, pos)
                else:
                    values[slot] = unpack_double(data, pos)[0]
                    after = pos + 8
                pos = after
                continue
            # Every other kind starts with a varint: its length or its value.
            if pos < end and data[pos] < 0x80:
                n = data[pos]
                pos += 1
            else:  # a longer varint (memory sizes, negatives), inline: a call costs more
                start, n, shift = pos, 0, 0
                while pos < end and shift < 70:
                    byte = data[pos]
                    pos += 1
                    n |= (byte & 0x7F) << shift
                    if byte < 0x80:
                        break
                    shift += 7
                else:
                    raise _bad_varint(plan, tag, start, end)
                n &= _MASK64
            if kind == _STRING:
                stop = pos + n
                if stop > end:
                    raise _error(plan, tag, f"a length of {n} bytes with {end - pos} left")
                values[slot] = data[pos:stop].decode()
                pos = stop
            elif kind == _INT64:
                values[slot] = n if n <= _INT64_MAX else (n ^ _SIGN64) - _SIGN64
            elif kind == _INT32:
                values[slot] = n if n <= _INT32_MAX else ((n & _MASK32) ^ _SIGN32) - _SIGN32
            elif kind == _BOOL:
                values[slot] = n != 0
            else:
                stop = pos + n
                if stop > end:
                    raise _error(plan, tag, f"a length of {n} bytes with {end - pos} left")
                assert sub is not None
                item = _decode(sub, data, pos, stop)
                if kind == _MESSAGE:
                    values[slot] = item
                elif isinstance(items := values[slot], list):
                    items.append(item)
                else:
                    values[slot] = [item]
                pos = stop
    except UnicodeDecodeError as exc:
        raise _error(plan, tag, f"a string that is not UTF-8 ({exc.reason})") from None
    for slot in plan.repeated:
        items = values[slot]
        if isinstance(items, list):
            values[slot] = tuple(items)
    return plan.make(*values)


def _varint(plan: _Plan, tag: int, data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` (as unsigned 64 bits) and the position after it; ``tag`` is
    the field it belongs to, :data:`_NO_TAG` for a tag itself."""
    value = shift = 0
    for byte in data[pos : min(pos + 10, end)]:
        if byte < 0x80:
            return (value | byte << shift) & _MASK64, pos + shift // 7 + 1
        value |= (byte & 0x7F) << shift
        shift += 7
    raise _bad_varint(plan, tag, pos, end)


def _bad_varint(plan: _Plan, tag: int, pos: int, end: int) -> CodecError:
    """The error for a varint at ``pos`` that has no last byte within 10 bytes or ``end``."""
    what = "tag" if tag == _NO_TAG else "varint"
    if end - pos >= 10:
        return _error(plan, tag, f"a {what} longer than 10 bytes")
    return _error(plan, tag, f"a {what} cut short by the end of the message")


def _skip(plan: _Plan, tag: int, data: bytes, pos: int, end: int) -> int:
    """The position after the value of an unknown field; raises for a field this schema
    knows with another wire type, for field number 0 and for wire types it cannot skip."""
    number, wire = tag >> 3, tag & 7
    known = plan.fields.get(number)
    if known is not None:
        own = _KINDS[known.kind][1]
        raise _error(
            plan, tag, f"wire type {wire} ({_WIRE_NAMES[wire]}), not {own} ({_WIRE_NAMES[own]})"
        )
    if number == 0 or number > _MAX_FIELD_NUMBER:
        raise _error(plan, tag, "not a valid field number")
    if wire == _VARINT:
        return _varint(plan, tag, data, pos, end)[1]
    if wire == _LENGTH:
        n, pos = _varint(plan, tag, data, pos, end)
    elif wire in (_FIXED64, _FIXED32):
        n = 8 if wire == _FIXED64 else 4
    else:
        raise _error(plan, tag, f"wire type {wire} ({_WIRE_NAMES[wire]}), which is not skipped")
    if pos + n > end:
        raise _error(plan, tag, f"a value of {n} bytes with {end - pos} left")
    return pos + n


def _error(plan: _Plan, tag: int, what: str) -> CodecError:
    if tag == _NO_TAG:
        return CodecError(f"{plan.name}: {what}")
    number = tag >> 3
    known = plan.fields.get(number)
    name = f" ({known.name})" if known is not None else " (unknown)"
    return CodecError(f"{plan.name} field {number}{name}: {what}")
