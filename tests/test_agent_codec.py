"""The cluster scaler's NodeUpdate decoder against betterproto2, the node agent's encoder.

Seeded random messages built with the generated classes decode to the same fields both
ways (NaN as NaN, a present 0.0 as 0.0); hand-made wire bytes pin what the decoder skips,
refuses and keeps; garbage and every truncation of a real message only ever raise
CodecError; and the decoder's schema table equals what the generated classes declare.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import struct
from collections.abc import Callable, Iterator
from typing import Any

import betterproto2
import msgspec
import pytest

from keda_gpu_scaler._proto_agent.kedagpuscaler import v1 as proto
from keda_gpu_scaler.domain.samples import (
    FLOAT_READINGS,
    Batch,
    DeviceHolder,
    DeviceKey,
    GpuReading,
    NodeDevices,
    PodResourcesReading,
)
from keda_gpu_scaler.serving.node_agent import attribution_lists, device_reading
from keda_gpu_scaler.sources.agents import codec, messages
from keda_gpu_scaler.sources.agents.codec import CodecError, decode_update
from keda_gpu_scaler.sources.agents.messages import SCHEMA
from keda_gpu_scaler.sources.agents.updates import BadUpdate, StreamReader

# --- building messages with the generated classes ----------------------------------------------

DOUBLES = [0.0, -0.0, 1.0, -1.5, 0.1, 40.0, 5e-324, 1e-300, 1.7976931348623157e308]
SPECIAL_DOUBLES = [math.nan, math.inf, -math.inf, -math.nan]
INT32S = [0, 1, -1, 127, 128, 300, -300, 2**31 - 1, -(2**31)]
INT64S = [0, 1, -1, 40 << 30, 141 << 30, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63)]
STRINGS = ["", "GPU-a", "MIG-4f1c-1g.18gb", "Ünïcødé ☃ 𝄞", "\x00nul", "x" * 200, "é" * 70]


def _scalar(kind: str, rng: random.Random) -> Any:
    if kind == betterproto2.TYPE_DOUBLE:
        pool = SPECIAL_DOUBLES if rng.random() < 0.15 else DOUBLES
        return rng.choice(pool) if rng.random() < 0.6 else rng.uniform(-1e6, 1e6)
    if kind == betterproto2.TYPE_INT32:
        return rng.choice(INT32S) if rng.random() < 0.6 else rng.randint(-(2**31), 2**31 - 1)
    if kind == betterproto2.TYPE_INT64:
        return rng.choice(INT64S) if rng.random() < 0.6 else rng.randint(-(2**63), 2**63 - 1)
    if kind == betterproto2.TYPE_BOOL:
        return rng.random() < 0.5
    assert kind == betterproto2.TYPE_STRING, kind
    return rng.choice(STRINGS) if rng.random() < 0.7 else f"s-{rng.randrange(10**9)}"


def _count(name: str, rng: random.Random) -> int:
    """How many of a repeated field: many holders and MIG instances at times."""
    if name in ("devices", "holders") and rng.random() < 0.2:
        return rng.choice([56, 64])
    return rng.choice([0, 0, 1, 2, 3, 8])


def _fields(cls: type[betterproto2.Message]) -> Iterator[tuple[str, Any]]:
    assert dataclasses.is_dataclass(cls)
    for f in dataclasses.fields(cls):
        yield f.name, betterproto2.FieldMetadata.get(f)


def _sub(cls: type[betterproto2.Message], name: str) -> type[betterproto2.Message]:
    """The class of message field ``name``, from betterproto2's own table."""
    generated: Any = cls
    sub: type[betterproto2.Message] = generated._betterproto.cls_by_field[name]
    return sub


def random_message(cls: type[betterproto2.Message], rng: random.Random) -> Any:
    """A message of ``cls`` with each field present or not, by its metadata; of a oneof,
    one member (now and then none, or all of them)."""
    values: dict[str, Any] = {}
    oneof = [name for name, meta in _fields(cls) if meta.group]
    chosen = set(oneof)
    if oneof:
        roll = rng.random()
        chosen = set() if roll < 0.05 else set(oneof) if roll < 0.1 else {rng.choice(oneof)}
    for name, meta in _fields(cls):
        if meta.group and name not in chosen:
            continue
        if meta.proto_type == betterproto2.TYPE_MESSAGE:
            if meta.repeated:
                values[name] = [
                    random_message(_sub(cls, name), rng) for _ in range(_count(name, rng))
                ]
            elif meta.group or rng.random() < 0.7:
                values[name] = random_message(_sub(cls, name), rng)
        elif not meta.optional or rng.random() < 0.6:
            values[name] = _scalar(meta.proto_type, rng)
    return cls(**values)


def random_update(seed: int) -> proto.NodeUpdate:
    update: proto.NodeUpdate = random_message(proto.NodeUpdate, random.Random(seed))
    return update


def assert_same(expected: Any, actual: Any, path: str = "NodeUpdate") -> None:
    """Every field of the betterproto2 message ``expected`` equal in ``actual``, by name,
    recursively: the same type of value (a present 0.0 is 0.0, not None), NaN as NaN, and
    the sign of a zero."""
    assert isinstance(expected, betterproto2.Message), path
    assert type(actual).__name__ == type(expected).__name__, path
    for name, meta in _fields(type(expected)):
        want, got = getattr(expected, name), getattr(actual, name)
        where = f"{path}.{name}"
        if meta.repeated:
            assert isinstance(got, tuple), where
            assert len(got) == len(want), where
            for i, (w, g) in enumerate(zip(want, got, strict=True)):
                assert_same(w, g, f"{where}[{i}]")
        elif want is None or isinstance(want, betterproto2.Message):
            if want is None:
                assert got is None, where
            else:
                assert_same(want, got, where)
        else:
            assert type(got) is type(want), (where, want, got)
            if isinstance(want, float) and math.isnan(want):
                assert math.isnan(got), (where, got)
            else:
                assert got == want, (where, want, got)
                if isinstance(want, float):
                    assert math.copysign(1, got) == math.copysign(1, want), where


def real_update(*, gpus: int = 8, mig: bool = False, with_holders: bool = True) -> bytes:
    """What a node agent sends: its readings and attribution made by its own functions."""
    readings = [
        GpuReading(
            source="nvml",
            key=DeviceKey(f"MIG-{g:04d}" if mig else f"GPU-{g:04d}"),
            index=g // 7 if mig else g,
            uuid=f"MIG-{g:04d}" if mig else f"GPU-{g:04d}",
            name="NVIDIA H200",
            taken_at=99.5,
            period_s=1.0,
            gpu_utilization=float(g),
            memory_used_bytes=g << 30,
            memory_total_bytes=141 << 30,
            temperature_c=45.0,
            power_mw=400_000.0,
            sm_active=0.0,
            parent_index=g // 7 if mig else None,
            parent_uuid=f"GPU-{g // 7:04d}" if mig else None,
            gpu_instance_id=g % 7 if mig else None,
            compute_instance_id=0 if mig else None,
            gpu_instance_profile_id=19 if mig else None,
            placement_start=g % 7 if mig else None,
            placement_size=1 if mig else None,
        )
        for g in range(gpus)
    ]
    holders = tuple(
        DeviceHolder(
            namespace="ml",
            pod=f"pod-{g}",
            container="main",
            resource="nvidia.com/mig-1g.18gb" if mig else "nvidia.com/gpu",
            device_id=r.uuid,
        )
        for g, r in enumerate(readings)
    )
    attribution = PodResourcesReading(
        source="pod-resources", taken_at=98.0, period_s=5.0, holders=holders
    )
    lists = attribution_lists(attribution) if with_holders else ([], [])
    message = proto.NodeReadings(
        devices=[device_reading(r, 100.0) for r in readings],
        lost=[proto.LostDevice(key="GPU-9", index=9, reason="fell off the bus", lost_for_s=3.0)],
        faults=[proto.SourceFault(source="pods", reason="watch refused", age_s=1.0)],
        attribution=proto.Attribution(
            age_s=2.0, period_s=5.0, same_holders=False, holders=lists[0], dra=lists[1]
        ),
    )
    return bytes(proto.NodeUpdate(readings=message))


IDENTITY = bytes(proto.NodeUpdate(identity=proto.NodeIdentity("gpu-node-1", "v", 1.0, 1.0)))

# --- the same fields as betterproto2 -----------------------------------------------------------


@pytest.mark.parametrize("block", range(4))
def test_random_updates_decode_as_betterproto2_decodes_them(block: int) -> None:
    for seed in range(block * 100, (block + 1) * 100):
        data = bytes(random_update(seed))
        assert_same(proto.NodeUpdate.parse(data), decode_update(data), f"seed {seed}")


@pytest.mark.parametrize("mig", [False, True])
def test_a_real_update_decodes_as_betterproto2_decodes_it(mig: bool) -> None:
    data = real_update(gpus=56 if mig else 8, mig=mig)
    decoded = decode_update(data)
    assert_same(proto.NodeUpdate.parse(data), decoded)
    assert decoded.readings is not None
    device = decoded.readings.devices[-1]
    assert device.sm_active == 0.0  # present, zero
    assert device.memory_reserved_bytes is None  # absent
    assert (device.parent_index, device.gpu_instance_id) == ((7, 6) if mig else (None, None))


def _samples_or_refusal(data: bytes) -> object:
    """What a reader past the identity makes of ``data``, decoded as a link decodes it."""
    reader = StreamReader()
    reader.receive(decode_update(IDENTITY), 0.0)
    try:
        return reader.receive(decode_update(data), 1000.0)
    except BadUpdate as exc:
        return f"refused: {exc}"


def test_the_stream_reader_reads_or_refuses_every_decoded_update() -> None:
    # Decoding is betterproto2's to the field (above); what the reader makes of it is either
    # samples of this node or a refusal with its reason, never another error.
    made = 0
    for seed in range(300):
        ours = _samples_or_refusal(bytes(random_update(seed)))
        if isinstance(ours, str):
            continue
        made += 1
        assert isinstance(ours, tuple), seed
        for sample in ours:
            assert sample.source.startswith("agent/gpu-node-1"), (seed, sample)
            if isinstance(sample, Batch):
                for s in sample.samples:
                    keys = s.keys if isinstance(s, NodeDevices) else {s.key} - {None}
                    assert all(str(key).startswith("gpu-node-1/") for key in keys), seed
    assert made > 20  # not every update refused


# --- what betterproto2 0.10 does, pinned --------------------------------------------------------


def test_two_members_of_the_oneof_are_both_set_and_the_reader_refuses_the_update() -> None:
    identity = bytes(proto.NodeUpdate(identity=proto.NodeIdentity(node_name="a")))
    heartbeat = bytes(proto.NodeUpdate(heartbeat=proto.Heartbeat()))
    for data in (identity + heartbeat, heartbeat + identity):
        theirs, ours = proto.NodeUpdate.parse(data), decode_update(data)
        assert theirs.identity is not None and theirs.heartbeat is not None
        assert_same(theirs, ours)
        assert ours.identity == messages.NodeIdentity(node_name="a")
        assert ours.heartbeat == messages.Heartbeat()
        with pytest.raises(BadUpdate, match="no known kind of update"):
            StreamReader().receive(ours, 0.0)


def test_a_message_field_sent_twice_is_the_last_one_not_a_merge_of_both() -> None:
    first = bytes(proto.NodeUpdate(identity=proto.NodeIdentity("a", "v1", 1.0)))
    second = bytes(proto.NodeUpdate(identity=proto.NodeIdentity(node_name="b")))
    theirs, ours = proto.NodeUpdate.parse(first + second), decode_update(first + second)
    assert_same(theirs, ours)
    assert ours.identity == messages.NodeIdentity(node_name="b")


def test_a_scalar_sent_twice_keeps_its_last_value() -> None:
    # NodeIdentity: node_name "a", then "b"; sample_period_s 1.0, then 2.0.
    body = b"\x0a\x01a" + b"\x19" + struct.pack("<d", 1.0) + b"\x0a\x01b"
    body += b"\x19" + struct.pack("<d", 2.0)
    data = b"\x0a" + bytes([len(body)]) + body
    assert_same(proto.NodeUpdate.parse(data), decode_update(data))
    assert decode_update(data).identity == messages.NodeIdentity(node_name="b", sample_period_s=2.0)


def _device(body: bytes) -> bytes:
    """A NodeUpdate with readings holding one DeviceReading of ``body``."""
    readings = b"\x0a" + _length(body) + body
    return b"\x12" + _length(readings) + readings


def _length(body: bytes) -> bytes:
    return _varint(len(body))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _decoded_device(data: bytes) -> messages.DeviceReading:
    update = decode_update(data)
    assert update.readings is not None
    [device] = update.readings.devices
    assert_same(proto.NodeUpdate.parse(data), update)
    return device


@pytest.mark.parametrize(
    ("encoded", "index"),
    [
        (b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", -1),  # 10 bytes, as encoders send it
        (b"\xff\xff\xff\xff\x0f", -1),  # 5 bytes: the low 32 bits
        (b"\x80\x80\x80\x80\xf8\xff\xff\xff\xff\x01", -(2**31)),
        (b"\xff\xff\xff\xff\x07", 2**31 - 1),
        (b"\x80\x80\x80\x80\x10", 0),  # 2**32: the low 32 bits are 0
        (b"\x96\x01", 150),
    ],
)
def test_int32_is_the_low_32_bits_twos_complement(encoded: bytes, index: int) -> None:
    assert _decoded_device(_device(b"\x10" + encoded)).index == index


@pytest.mark.parametrize(
    ("encoded", "value"),
    [
        (b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", -1),
        (b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01", -(2**63)),
        (b"\xff\xff\xff\xff\xff\xff\xff\xff\x7f", 2**63 - 1),
        (b"\x80\x80\x80\x80\xb4\x04", 141 << 30),
        (b"\x00", 0),
    ],
)
def test_int64_is_twos_complement(encoded: bytes, value: int) -> None:
    assert _decoded_device(_device(b"\x48" + encoded)).memory_used_bytes == value


@pytest.mark.parametrize("encoded", [b"\x01", b"\x02", b"\xff\x01", b"\x80\x80\x01"])
def test_any_nonzero_bool_is_true(encoded: bytes) -> None:
    # Field 24 has a 2-byte tag: 24 << 3 | 0 = 192.
    assert _decoded_device(_device(b"\xc0\x01" + encoded)).mig_enabled is True


def test_an_explicit_zero_is_kept_and_an_absent_optional_is_none() -> None:
    zero = b"\x39" + struct.pack("<d", 0.0)  # gpu_utilization, present 0.0
    device = _decoded_device(_device(zero + b"\x48\x00"))  # memory_used_bytes, present 0
    assert device.gpu_utilization == 0.0 and type(device.gpu_utilization) is float
    assert device.memory_used_bytes == 0
    assert device.memory_utilization is None
    assert device.parent_uuid is None
    assert (device.key, device.index, device.age_s, device.mig_enabled) == ("", 0, 0.0, False)


def test_nothing_decodes_to_an_update_of_no_kind() -> None:
    assert decode_update(b"") == messages.NodeUpdate()
    with pytest.raises(BadUpdate, match="no known kind of update"):
        StreamReader().receive(decode_update(b""), 0.0)


# --- skipped, refused --------------------------------------------------------------------------


# Unknown to every message (fields 100 and up), each wire type that may be skipped.
UNKNOWN = [
    b"\xa0\x06\x96\x01",  # field 100, varint
    b"\xa0\x06\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # field 100, a 10-byte varint
    b"\xa9\x06" + b"\x01" * 8,  # field 101, 64-bit
    b"\xb2\x06\x03abc",  # field 102, length-delimited
    b"\xb2\x06\x00",  # field 102, empty
    b"\xbd\x06" + b"\x01" * 4,  # field 103, 32-bit
    b"\x80\x80\x80\x01\x01",  # field 2**18, a 4-byte tag
]


@pytest.mark.parametrize(
    "unknown",
    [
        *UNKNOWN,
        b"\x20\x96\x01",  # field 4, varint: a 1-byte tag
        b"\x29" + b"\x01" * 8,  # field 5, 64-bit
        b"\x32\x03abc",  # field 6, length-delimited
        b"\x3d" + b"\x01" * 4,  # field 7, 32-bit
    ],
)
def test_unknown_fields_of_an_update_are_skipped(unknown: bytes) -> None:
    for data in (unknown + IDENTITY, IDENTITY + unknown, unknown + unknown):
        assert_same(proto.NodeUpdate.parse(data), decode_update(data))
    assert decode_update(unknown + IDENTITY) == decode_update(IDENTITY)
    assert decode_update(IDENTITY + unknown) == decode_update(IDENTITY)


@pytest.mark.parametrize("unknown", UNKNOWN)
def test_unknown_fields_inside_a_device_reading_are_skipped(unknown: bytes) -> None:
    device = bytes(proto.DeviceReading(key="GPU-a", sm_active=3.0, parent_uuid="GPU-p"))
    data = _device(unknown + device + unknown)
    assert _decoded_device(data) == messages.DeviceReading(
        key="GPU-a", sm_active=3.0, parent_uuid="GPU-p"
    )


@pytest.mark.parametrize(
    ("tag", "wire"),
    [(b"\x23", "3 (group start)"), (b"\x24", "4 (group end)"), (b"\x26", "6"), (b"\x27", "7")],
)
def test_groups_and_reserved_wire_types_are_refused(tag: bytes, wire: str) -> None:
    expected = f"NodeUpdate field 4 (unknown): wire type {wire}"
    with pytest.raises(CodecError, match=f"^{re.escape(expected)}"):
        decode_update(IDENTITY + tag + b"\x00" * 8)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"\x08\x01", "NodeUpdate field 1 (identity): wire type 0 (varint), not 2"),
        (
            b"\x0a\x02\x18\x01",
            "NodeIdentity field 3 (sample_period_s): wire type 0 (varint), not 1",
        ),
        (
            _device(b"\x09" + b"\x00" * 8),
            "DeviceReading field 1 (key): wire type 1 (64-bit), not 2",
        ),
        (_device(b"\x12\x01a"), "DeviceReading field 2 (index): wire type 2 (length-delimited)"),
        (_device(b"\xc5\x01" + b"\x00" * 4), "DeviceReading field 24 (mig_enabled): wire type 5"),
    ],
)
def test_a_known_field_with_another_wire_type_is_refused(data: bytes, error: str) -> None:
    with pytest.raises(CodecError, match=f"^{re.escape(error)}"):
        decode_update(data)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"\x0a\x05\x0a\x01", "NodeUpdate field 1 (identity): a length of 5 bytes with 2 left"),
        (
            b"\x0a\x02\x0a\x05ab",
            "NodeIdentity field 1 (node_name): a length of 5 bytes with 0 left",
        ),
        (b"\x0a\x03\x19\x00\x00", "NodeIdentity field 3 (sample_period_s): a double with 2 of"),
        (b"\x0a\x80", "NodeUpdate field 1 (identity): a varint cut short"),
        (b"\x0a", "NodeUpdate field 1 (identity): a varint cut short"),
        (b"\x80", "NodeUpdate: a tag cut short"),
        (IDENTITY + b"\x32\x09abc", "NodeUpdate field 6 (unknown): a value of 9 bytes with 3"),
        (IDENTITY + b"\x29\x01", "NodeUpdate field 5 (unknown): a value of 8 bytes with 1 left"),
        (IDENTITY + b"\x20\xff", "NodeUpdate field 4 (unknown): a varint cut short"),
    ],
)
def test_a_length_or_a_value_past_the_end_is_refused(data: bytes, error: str) -> None:
    with pytest.raises(CodecError, match=f"^{re.escape(error)}"):
        decode_update(data)


def test_a_submessage_cannot_read_past_its_own_length() -> None:
    # A NodeIdentity of 2 bytes whose string says 3, with a byte after it in the update.
    with pytest.raises(CodecError, match=r"^NodeIdentity field 1 .*length of 3 bytes with 0 left"):
        decode_update(b"\x0a\x02\x0a\x03" + b"\x0a\x01a")


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (_device(b"\x10" + b"\xff" * 10 + b"\x01"), "DeviceReading field 2 .*longer than 10 bytes"),
        (b"\xff" * 10 + b"\x01", "NodeUpdate: a tag longer than 10 bytes"),
        (b"\x0a" + b"\x80" * 10 + b"\x00", "NodeUpdate field 1 .*varint longer than 10 bytes"),
    ],
)
def test_a_varint_over_10_bytes_is_refused(data: bytes, error: str) -> None:
    with pytest.raises(CodecError, match=error):
        decode_update(data)


@pytest.mark.parametrize(
    "bad", [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"a\x80b", b"\xf4\x90\x80\x80"]
)
def test_strings_are_strict_utf8(bad: bytes) -> None:
    # parent_uuid, field 26: a 2-byte tag (26 << 3 | 2 = 210).
    data = _device(b"\xd2\x01" + _length(bad) + bad)
    with pytest.raises(CodecError, match=r"^DeviceReading field 26 \(parent_uuid\): .*not UTF-8"):
        decode_update(data)


@pytest.mark.parametrize("tag", [b"\x00", b"\x02", b"\x05", b"\x80\x80\x80\x80\x10"])
def test_field_number_zero_and_numbers_past_the_range_are_refused(tag: bytes) -> None:
    with pytest.raises(CodecError, match="not a valid field number"):
        decode_update(IDENTITY + tag + b"\x00" * 8)


# --- garbage only ever raises CodecError -------------------------------------------------------


def _decodes_or_refuses(data: bytes) -> bool:
    """True if ``data`` decodes; CodecError is the only exception allowed."""
    try:
        decode_update(data)
    except CodecError:
        return False
    return True


@pytest.mark.parametrize("mig", [False, True])
def test_every_truncation_of_a_real_update_decodes_or_raises_codec_error(mig: bool) -> None:
    data = real_update(gpus=56 if mig else 8, mig=mig)
    outcomes = [_decodes_or_refuses(data[:cut]) for cut in range(len(data))]
    assert outcomes[0]  # nothing at all is an empty update
    assert not any(outcomes[1:])  # the update's one length prefix covers the rest


def test_every_truncation_inside_a_readings_message_decodes_or_raises_codec_error() -> None:
    update = proto.NodeUpdate.parse(real_update())
    assert update.readings is not None
    data = bytes(update.readings)
    # Each cut of the readings, framed whole: a prefix ending between two fields is valid.
    framed = [b"\x12" + _length(data[:cut]) + data[:cut] for cut in range(len(data))]
    assert sum(map(_decodes_or_refuses, framed)) > 2


def _mutations(data: bytes, rng: random.Random) -> Iterator[bytes]:
    for _ in range(400):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        yield bytes(mutated)


def _garbage(rng: random.Random) -> Iterator[bytes]:
    for _ in range(3000):
        yield rng.randbytes(rng.randint(0, 64))
    for _ in range(500):  # mostly small tags, more likely to reach the fields
        yield bytes(rng.choice([0x0A, 0x12, 0x1A, 0x08, rng.randrange(256)]) for _ in range(40))


@pytest.mark.parametrize(
    "garbage",
    [
        lambda rng: _garbage(rng),
        lambda rng: _mutations(real_update(), rng),
        lambda rng: _mutations(real_update(gpus=56, mig=True), rng),
    ],
    ids=["random bytes", "mutated update", "mutated MIG update"],
)
def test_garbage_only_ever_raises_codec_error(
    garbage: Callable[[random.Random], Iterator[bytes]],
) -> None:
    outcomes = [_decodes_or_refuses(data) for data in garbage(random.Random(20240611))]
    assert not all(outcomes)
    assert any(outcomes)


# --- the schema table against the generated classes --------------------------------------------


def _generated_schema() -> dict[str, list[tuple[object, ...]]]:
    """Every message reachable from NodeUpdate, as betterproto2's metadata declares it."""
    schema: dict[str, list[tuple[object, ...]]] = {}
    todo: list[type[betterproto2.Message]] = [proto.NodeUpdate]
    while todo:
        cls = todo.pop()
        if cls.__name__ in schema:
            continue
        fields = []
        for name, meta in _fields(cls):
            message = None
            if meta.proto_type == betterproto2.TYPE_MESSAGE:
                todo.append(_sub(cls, name))
                message = _sub(cls, name).__name__
            fields.append(
                (meta.number, name, meta.proto_type, meta.optional, meta.repeated, message)
            )
        schema[cls.__name__] = sorted(fields)
    return schema


def _codec_schema() -> dict[str, list[tuple[object, ...]]]:
    return {
        cls.__name__: sorted(
            (
                f.number,
                f.name,
                f.kind,
                f.optional,
                f.repeated,
                None if f.message is None else f.message.__name__,
            )
            for f in fields
        )
        for cls, fields in SCHEMA.items()
    }


def test_the_schema_table_is_what_the_generated_classes_declare() -> None:
    assert _codec_schema() == _generated_schema()


def test_the_structs_have_the_generated_classes_fields_and_defaults() -> None:
    for cls in SCHEMA:
        generated = getattr(proto, cls.__name__)
        assert set(cls.__struct_fields__) == {name for name, _ in _fields(generated)}
        empty = generated()
        for name in cls.__struct_fields__:
            theirs = getattr(empty, name)
            assert getattr(cls(), name) == (tuple(theirs) if isinstance(theirs, list) else theirs)
            assert type(getattr(cls(), name)) is (
                tuple if isinstance(theirs, list) else type(theirs)
            )


class _Pair(msgspec.Struct, frozen=True):
    a: str = ""
    b: str = ""


def test_a_table_that_leaves_out_a_field_or_repeats_a_scalar_is_refused() -> None:
    with pytest.raises(ValueError, match="_Pair: its fields"):
        codec._compile({_Pair: (messages.Field(1, "a", "string"),)})
    repeated = (messages.Field(1, "a", "string"), messages.Field(2, "b", "string", repeated=True))
    with pytest.raises(ValueError, match=r"_Pair\.b: a repeated string is not supported"):
        codec._compile({_Pair: repeated})


# --- runs of doubles, read at once ----------------------------------------------------------------


def _double(number: int, value: float) -> bytes:
    return _varint(number << 3 | 1) + struct.pack("<d", value)


def test_every_reading_present_decodes_as_betterproto2_and_so_does_every_cut() -> None:
    # Fields 5 to 8 and 12 to 23 are runs of doubles (16 on with 2-byte tags), read at once.
    every: dict[str, Any] = {name: 1.5 + i for i, name in enumerate(FLOAT_READINGS)}
    reading = GpuReading(
        source="nvml",
        key=DeviceKey("GPU-0"),
        index=0,
        uuid="GPU-0",
        name="NVIDIA H200",
        taken_at=99.5,
        period_s=1.0,
        memory_used_bytes=1 << 35,
        memory_total_bytes=141 << 30,
        memory_reserved_bytes=1 << 29,
        **every,
    )
    data = bytes(
        proto.NodeUpdate(readings=proto.NodeReadings(devices=[device_reading(reading, 100.0)]))
    )
    theirs = proto.NodeUpdate.parse(data)
    assert_same(theirs, decode_update(data))
    assert theirs.readings is not None
    device = bytes(theirs.readings.devices[0])
    decoded = 0
    for cut in range(len(device)):
        framed = _device(device[:cut])
        try:
            ours = decode_update(framed)
        except CodecError:
            continue
        assert_same(proto.NodeUpdate.parse(framed), ours, f"cut {cut}")
        decoded += 1
    assert decoded > 20  # every cut between two fields


@pytest.mark.parametrize(
    "numbers",
    [
        [15, 14, 13, 12],  # declared order reversed
        [12, 13, 12, 13, 14],  # sent again: the last value is kept
        [12, 14, 15, 16, 17, 23, 22],  # gaps, across the 1- to 2-byte tags
        [5, 6, 7, 8, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23],
    ],
)
def test_doubles_in_any_order_or_sent_twice_decode_as_betterproto2(numbers: list[int]) -> None:
    device = b"\x0a\x01k" + b"".join(_double(n, n + i / 8) for i, n in enumerate(numbers))
    data = _device(device)
    assert_same(proto.NodeUpdate.parse(data), decode_update(data))
