"""The WatchNode stream's ``NodeUpdate`` messages, decoded from protobuf wire bytes.

A cluster scaler decodes one update per node agent per second, and betterproto2's generic
parser spends most of a core on that at a thousand agents. This decoder knows exactly one
schema (``protos/kedagpuscaler/v1/node_agent.proto``), written out as
:data:`~.messages.SCHEMA`, and builds the frozen structs of :mod:`.messages`; the node agent
still encodes with betterproto2.

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
from typing import Any, Final

import msgspec

from keda_gpu_scaler.sources.agents.messages import SCHEMA, Field, Kind, NodeUpdate

__all__ = ["CodecError", "decode_update"]


class CodecError(ValueError):
    """Bytes that are not a ``NodeUpdate`` of this schema; the message says where and why."""


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
            next_tag = f.number << 3 | _FIXED64
            if next_tag >= 1 << 14:  # a 3-byte tag: not in a run
                break
            if next_tag < 0x80:
                tags.append((next_tag, -1))
            else:
                tags.append((next_tag & 0x7F | 0x80, next_tag >> 7))
            formats.append(formats[-1] + ("x" if next_tag < 0x80 else "xx") + "d")
        if tags:
            unpack = tuple(struct.Struct(f).unpack_from for f in formats)
            plan.by_tag[tag] = (slot, _DOUBLE, _Run(tuple(tags), unpack))


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
