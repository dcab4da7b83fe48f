"""The checks of single trigger metadata values: numbers, targets, integers, choices, the
metric name and ``migInstance``. Each raises :class:`InvalidTrigger` naming the key, the
value and what it must be.
"""

from __future__ import annotations

import enum
import math
import re
from typing import TypeVar

import msgspec

from keda_gpu_scaler.domain.errors import InvalidTrigger
from keda_gpu_scaler.domain.names import is_node_name
from keda_gpu_scaler.domain.samples import GpuReading

_E = TypeVar("_E", bound=enum.StrEnum)

_FLOAT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_NON_FINITE = re.compile(r"[+-]?(?:inf|infinity|nan)", re.IGNORECASE)
_INT = re.compile(r"[+-]?\d+")
_NAME_BAD_CHARS = re.compile(r"[^a-z0-9_-]")
_MIG_UUID = re.compile(r"MIG-[0-9A-Za-z/-]+")
_METRIC_PREFIX = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NOT_IN_PREFIX = re.compile(r"[^a-zA-Z0-9_:]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MIG_IDS = re.compile(r"(\d+):(\d+)(?::(\d+))?")
_MIG_FORMAT = (
    "must be a MIG device UUID (MIG-...) or <gpu index>:<GPU instance id>"
    "[:<compute instance id>], as nvidia-smi -L shows"
)


class MigSelector(msgspec.Struct, frozen=True, kw_only=True):
    """``migInstance``: one MIG instance, by UUID or by (GPU, GPU instance[, compute instance])."""

    uuid: str | None = None
    parent_index: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    def matches(self, reading: GpuReading) -> bool:
        if not reading.is_mig_instance():
            return False
        if self.uuid is not None:
            return reading.uuid == self.uuid
        return (
            reading.parent_index == self.parent_index
            and reading.gpu_instance_id == self.gpu_instance_id
            and self.compute_instance_id in (None, reading.compute_instance_id)
        )

    def __str__(self) -> str:
        if self.uuid is not None:
            return self.uuid
        text = f"{self.parent_index}:{self.gpu_instance_id}"
        return text if self.compute_instance_id is None else f"{text}:{self.compute_instance_id}"


def parse_float(key: str, raw: str) -> float:
    """A finite decimal number (``inf``, ``nan`` and ``1e999`` are refused)."""
    if _NON_FINITE.fullmatch(raw):
        raise InvalidTrigger(key, raw, "must be a finite number")
    if not _FLOAT.fullmatch(raw):
        raise InvalidTrigger(key, raw, "not a number")
    value = float(raw)
    if not math.isfinite(value):
        raise InvalidTrigger(key, raw, "must be a finite number")
    return value


def parse_target(key: str, raw: str) -> float:
    """A finite number greater than 0."""
    value = parse_float(key, raw)
    if value <= 0:
        raise InvalidTrigger(key, raw, "must be greater than 0")
    return value


def parse_int(key: str, raw: str, *, minimum: int, meaning: str) -> int:
    """An integer of at least ``minimum``; ``meaning`` says the range when it is below."""
    if not _INT.fullmatch(raw):
        raise InvalidTrigger(key, raw, "not an integer")
    value = int(raw)
    if value < minimum:
        raise InvalidTrigger(key, raw, meaning)
    return value


def parse_metric_name(raw: str, warnings: list[str]) -> str:
    """``metricName`` as served: lowercase, other characters than ``[a-z0-9_-]`` as ``_``
    (with a warning when that changed it)."""
    name = _NAME_BAD_CHARS.sub("_", raw.strip().lower())
    if not name.strip("_"):
        raise InvalidTrigger("metricName", raw, "must contain a letter or digit")
    if name != raw:
        warnings.append(f'metricName "{raw}" is served as "{name}" (lowercase, [a-z0-9_-])')
    return name


def parse_choice(key: str, raw: str, kind: type[_E]) -> _E:
    """One of the values of ``kind``, spelled exactly."""
    try:
        return kind(raw)
    except ValueError:
        raise InvalidTrigger(key, raw, "must be one of " + ", ".join(kind)) from None


def parse_mig_instance(raw: str, gpu_index: int) -> MigSelector:
    """``migInstance``: a ``MIG-`` UUID or ``GPU:GI[:CI]``, never with a ``gpuIndex``."""
    if gpu_index >= 0:
        raise InvalidTrigger(
            "migInstance", raw, "cannot be combined with gpuIndex: the instance names its GPU"
        )
    if _MIG_UUID.fullmatch(raw):
        return MigSelector(uuid=raw)
    if (match := _MIG_IDS.fullmatch(raw)) is None:
        raise InvalidTrigger("migInstance", raw, _MIG_FORMAT)
    parent, gi, ci = match.groups()
    return MigSelector(
        parent_index=int(parent),
        gpu_instance_id=int(gi),
        compute_instance_id=None if ci is None else int(ci),
    )


def parse_label_value(key: str, raw: str) -> str:
    """A value a series' label must have (a model name): as the engine writes it, so no
    surrounding blanks and no control characters, which no engine writes into a model name."""
    if not raw.strip():
        raise InvalidTrigger(key, raw, "must name a model (it is empty)")
    if raw != raw.strip():
        raise InvalidTrigger(key, raw, "must not start or end with blanks")
    if _CONTROL.search(raw):
        raise InvalidTrigger(key, raw, "must not contain control characters")
    return raw


def parse_metric_prefix(key: str, raw: str) -> str:
    """A Prometheus metric name prefix, as Dynamo's ``DYN_METRICS_PREFIX`` is once it has
    sanitized it: refused rather than guessed at, with the name Dynamo would export."""
    if _METRIC_PREFIX.fullmatch(raw):
        return raw
    sanitized = _NOT_IN_PREFIX.sub("_", raw)
    if sanitized and not re.match(r"[a-zA-Z_:]", sanitized):
        sanitized = "_" + sanitized
    if not sanitized.strip("_"):
        sanitized = "dynamo_frontend"  # Dynamo falls back to its own prefix
    raise InvalidTrigger(
        key,
        raw,
        f"must be a Prometheus metric name prefix ([a-zA-Z_:][a-zA-Z0-9_:]*); for this value "
        f'Dynamo exports "{sanitized}_queued_requests": give "{sanitized}"',
    )


DEFAULT_MIN_COVERAGE = 0.75
"""``minCoverage`` when a trigger does not say: the share of its selected devices that must be
fresh for a partial view to be answered (``domain.coverage``)."""
_COVERAGE = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)")


def parse_min_coverage(raw: str) -> float:
    """``minCoverage``: a number in (0, 1]."""
    value = float(raw) if _COVERAGE.fullmatch(raw) else math.nan
    if not 0 < value <= 1:
        raise InvalidTrigger("minCoverage", raw, "must be a number above 0 and at most 1")
    return value


def parse_node_name(raw: str) -> str:
    """``nodeName``: a Kubernetes node name (RFC 1123 subdomain)."""
    if not is_node_name(raw):
        raise InvalidTrigger("nodeName", raw, "must be a node name (RFC 1123 subdomain)")
    return raw
