"""Trigger metadata parsing: the Go project's keys, defaults and precedence, checked strictly.

Parse order (the first error wins): defaults, ``profile``, ``metricName``, ``metricType``,
``targetValue``, ``targetGpuUtilization``, ``targetMemoryUtilization``,
``activationThreshold``, ``gpuIndex``, ``migInstance``, ``aggregation``,
``windowSeconds``, ``windowAggregation``, ``pollIntervalSeconds``, endpoints,
endpoint-required checks, endpoint validation, ``cooldownSeconds``, ``podNamespace``,
``podSelector``, ``nodeName``, ``minCoverage``.

``nodeName`` and ``minCoverage`` (this product's keys) matter on a cluster scaler, which
sees every node (``domain.coverage``).

``windowSeconds`` and ``windowAggregation`` (this product's keys) turn each device's
newest reading into a rolling window of its readings, combined per device before
``aggregation`` combines the devices (``domain.windows``); engine metrics get the same over
their scrapes. ``windowSeconds`` is an integer from 0 (off: the newest reading) to
``MAX_WINDOW_S``; ``windowAggregation`` without a window is ignored with a warning.

``podSelector`` and ``podNamespace`` (this product's keys; ``podSelector`` is the name KEDA's
own ``kubernetes-workload`` scaler uses) narrow a GPU trigger to the devices held by the
matching pods of one namespace (the ScaledObject's, unless ``podNamespace`` names another).
They are parsed last; ``podSelector`` cannot be combined with ``gpuIndex`` or ``migInstance``
(the pods choose the devices) nor with an engine metric type.

``migInstance`` (this product's key, not the Go project's; empty counts as unset) names one
MIG instance: its UUID (``MIG-...``; the older ``MIG-GPU-<uuid>/<gi>/<ci>`` form too) or
``<gpu index>:<GPU instance id>[:<compute instance id>]``. It cannot be combined with a
``gpuIndex`` other than -1.
"""

from __future__ import annotations

import difflib
import enum
import math
import re
from collections.abc import Mapping
from typing import TypeVar

import msgspec

from keda_gpu_scaler.domain.aggregation import Aggregation
from keda_gpu_scaler.domain.catalog import CATALOG, MetricType, Origin
from keda_gpu_scaler.domain.coverage import (
    DEFAULT_MIN_COVERAGE,
    parse_min_coverage,
    parse_node_name,
)
from keda_gpu_scaler.domain.endpoints import endpoint_refusal
from keda_gpu_scaler.domain.engines import Discovery, EngineTarget
from keda_gpu_scaler.domain.errors import InvalidTrigger
from keda_gpu_scaler.domain.names import is_namespace
from keda_gpu_scaler.domain.profiles import PROFILES
from keda_gpu_scaler.domain.samples import GpuReading
from keda_gpu_scaler.domain.selector import LabelSelector, parse_selector
from keda_gpu_scaler.domain.windows import MAX_WINDOW_S, WindowAggregation

_E = TypeVar("_E", bound=enum.StrEnum)

DEFAULT_METRIC_NAME = "keda_gpu_metric"
DEFAULT_TARGET = 80.0
DEFAULT_POLL_INTERVAL_S = 10
DEFAULT_COOLDOWN_S = 60

TRIGGER_KEYS: tuple[str, ...] = (
    "profile",
    "metricName",
    "metricType",
    "targetValue",
    "targetGpuUtilization",
    "targetMemoryUtilization",
    "activationThreshold",
    "gpuIndex",
    "migInstance",
    "aggregation",
    "windowSeconds",
    "windowAggregation",
    "pollIntervalSeconds",
    "vllmEndpoint",
    "tritonEndpoint",
    "tgiEndpoint",
    "sglangEndpoint",
    "endpointDiscovery",
    "cooldownSeconds",
    "podSelector",
    "podNamespace",
    "nodeName",
    "minCoverage",
)
KEDA_KEYS: tuple[str, ...] = ("scalerAddress", "enableTLS", "unsafeSsl")

TRIGGER_KEY_HELP: dict[str, tuple[str, str]] = {
    "profile": ("none", "a named profile: metric name, type, target and activation"),
    "metricName": (
        "`keda_gpu_metric` or the profile's",
        "the HPA metric name; served lowercase, made of `[a-z0-9_-]`",
    ),
    "metricType": ("`gpu_utilization` or the profile's", "what to measure (see metric types)"),
    "targetValue": ("`80` or the profile's", "the HPA target; finite and greater than 0"),
    "targetGpuUtilization": (
        "none",
        "shorthand: sets the target and `metricType: gpu_utilization`",
    ),
    "targetMemoryUtilization": (
        "none",
        "shorthand: sets the target and `metricType: memory_used_percent`",
    ),
    "activationThreshold": (
        "`0` or the profile's",
        "active when the value is strictly above it; finite",
    ),
    "gpuIndex": ("`-1` (all GPUs)", "NVML index of one physical GPU, as `nvidia-smi` numbers them"),
    "migInstance": ("none", "one MIG instance: its `MIG-…` UUID, or `GPU:GI[:CI]` such as `0:7`"),
    "aggregation": ("`max`", "over the selected GPUs: `max`, `min`, `avg`, `sum`, `p95`, `p99`"),
    "windowSeconds": (
        "`0` (the newest reading)",
        "a rolling window over each GPU's (or the endpoint's) readings, in whole seconds, at "
        f"most {MAX_WINDOW_S}; unavailable until the window is covered (see the metric reference)",
    ),
    "windowAggregation": (
        "`avg`",
        "how each GPU's readings in the window combine, before `aggregation`: `avg`, `max`, "
        "`min`, `p95`, `last`",
    ),
    "pollIntervalSeconds": ("`10`", "StreamIsActive heartbeat period; an integer of at least 1"),
    "vllmEndpoint": ("none", "vLLM `/metrics` URL (http or https)"),
    "tritonEndpoint": ("none", "Triton `/metrics` URL (http or https)"),
    "tgiEndpoint": ("none", "Text Generation Inference `/metrics` URL (http or https)"),
    "sglangEndpoint": ("none", "SGLang `/metrics` URL (http or https)"),
    "endpointDiscovery": (
        "`static`",
        "`static`: scrape the URL's host; `dns`: the host is a "
        "headless Service, scrape every pod and combine (queues summed, "
        "cache use the highest)",
    ),
    "cooldownSeconds": ("`60`", "scale-down suppression window in seconds; `0` turns it off"),
    "podSelector": (
        "none (every GPU)",
        "a Kubernetes label selector (`app=vllm`, `tier in (a,b)`, `!canary`): only the GPUs "
        "held by matching pods count",
    ),
    "nodeName": (
        "none (every node)",
        "on a cluster scaler: only this node's GPUs; needed there by `gpuIndex` and `migInstance`",
    ),
    "minCoverage": (
        "`0.75`",
        "on a cluster scaler: the share of selected GPUs that must be fresh for `avg`, `max`, "
        "`min`, `p95`, `p99` to be answered from the fresh ones (`sum` needs them all)",
    ),
    "podNamespace": (
        "the ScaledObject's namespace",
        "the namespace of the pods `podSelector` matches",
    ),
}
"""Default and meaning of every key, for the generated configuration reference."""
_FROM_ENV = "FromEnv"

_FLOAT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_NON_FINITE = re.compile(r"[+-]?(?:inf|infinity|nan)", re.IGNORECASE)
_INT = re.compile(r"[+-]?\d+")
_NAME_BAD_CHARS = re.compile(r"[^a-z0-9_-]")
_MIG_UUID = re.compile(r"MIG-[0-9A-Za-z/-]+")
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


class TriggerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A trigger's metadata, parsed once and validated."""

    metric_name: str = DEFAULT_METRIC_NAME
    metric_type: MetricType = MetricType.GPU_UTILIZATION
    target: float = DEFAULT_TARGET
    activation: float = 0.0
    gpu_index: int = -1
    mig_instance: MigSelector | None = None
    aggregation: Aggregation = Aggregation.MAX
    window_s: int = 0
    """``windowSeconds``: 0 reads the newest reading of each device."""
    window_aggregation: WindowAggregation = WindowAggregation.AVG
    """``windowAggregation``; the default when ``window_s`` is 0, so it never tells two
    specs apart there."""
    poll_interval_s: int = DEFAULT_POLL_INTERVAL_S
    vllm_endpoint: str | None = None
    triton_endpoint: str | None = None
    tgi_endpoint: str | None = None
    sglang_endpoint: str | None = None
    endpoint_discovery: Discovery = Discovery.STATIC
    cooldown_s: int = DEFAULT_COOLDOWN_S
    node_name: str | None = None
    """On a cluster scaler: only this node's devices."""
    min_coverage: float = DEFAULT_MIN_COVERAGE
    pod_selector: LabelSelector | None = None
    pod_namespace: str | None = None
    """Set with ``pod_selector`` only: the namespace its pods are looked up in."""
    profile: str | None = None
    warnings: tuple[str, ...] = ()

    def endpoint_for(self, origin: Origin) -> str | None:
        return {
            Origin.VLLM: self.vllm_endpoint,
            Origin.TRITON: self.triton_endpoint,
            Origin.TGI: self.tgi_endpoint,
            Origin.SGLANG: self.sglang_endpoint,
        }.get(origin)

    @property
    def endpoint(self) -> str | None:
        """The engine endpoint this trigger's metric type reads, if any."""
        return self.endpoint_for(CATALOG[self.metric_type].origin)

    @property
    def engine_target(self) -> EngineTarget | None:
        """The engine sampler this trigger reads, or None for a GPU metric."""
        kind = CATALOG[self.metric_type].origin.engine
        url = self.endpoint
        if kind is None or url is None:
            return None
        return EngineTarget(kind, url, self.endpoint_discovery)


def _parse_float(key: str, raw: str) -> float:
    if _NON_FINITE.fullmatch(raw):
        raise InvalidTrigger(key, raw, "must be a finite number")
    if not _FLOAT.fullmatch(raw):
        raise InvalidTrigger(key, raw, "not a number")
    value = float(raw)
    if not math.isfinite(value):
        raise InvalidTrigger(key, raw, "must be a finite number")
    return value


def _parse_target(key: str, raw: str) -> float:
    value = _parse_float(key, raw)
    if value <= 0:
        raise InvalidTrigger(key, raw, "must be greater than 0")
    return value


def _parse_int(key: str, raw: str, *, minimum: int, meaning: str) -> int:
    if not _INT.fullmatch(raw):
        raise InvalidTrigger(key, raw, "not an integer")
    value = int(raw)
    if value < minimum:
        raise InvalidTrigger(key, raw, meaning)
    return value


def _parse_metric_name(raw: str, warnings: list[str]) -> str:
    name = _NAME_BAD_CHARS.sub("_", raw.strip().lower())
    if not name.strip("_"):
        raise InvalidTrigger("metricName", raw, "must contain a letter or digit")
    if name != raw:
        warnings.append(f'metricName "{raw}" is served as "{name}" (lowercase, [a-z0-9_-])')
    return name


def _lookup(metadata: Mapping[str, str], key: str) -> str | None:
    """A key's value; ``<key>FromEnv`` (resolved by KEDA) stands in when the key is absent."""
    if key in metadata:
        return metadata[key]
    return metadata.get(key + _FROM_ENV)


def _typo_warnings(metadata: Mapping[str, str]) -> list[str]:
    known = TRIGGER_KEYS + KEDA_KEYS
    warnings = []
    for key in metadata:
        base = key.removesuffix(_FROM_ENV)
        if base in known:
            continue
        lowered = {k.lower(): k for k in known}
        match = lowered.get(base.lower()) or next(
            iter(difflib.get_close_matches(base, known, n=1, cutoff=0.8)), None
        )
        if match is not None:
            warnings.append(f'unknown key "{key}" is ignored; did you mean "{match}"?')
    return warnings


def _endpoint(metadata: Mapping[str, str], key: str) -> str | None:
    raw = _lookup(metadata, key)
    return raw if raw else None


def parse_trigger(metadata: Mapping[str, str], namespace: str = "") -> TriggerSpec:
    """Parse trigger metadata, raising :class:`InvalidTrigger` naming the first bad key.

    ``namespace`` is the ScaledObject's, the default of ``podNamespace``."""
    warnings = _typo_warnings(metadata)
    spec = TriggerSpec()
    replace = msgspec.structs.replace

    if (raw := _lookup(metadata, "profile")) is not None:
        profile = PROFILES.get(raw)
        if profile is None:
            available = ", ".join(PROFILES)
            raise InvalidTrigger("profile", raw, f"unknown profile (available: {available})")
        spec = replace(
            spec,
            profile=profile.name,
            metric_name=profile.metric_name,
            metric_type=profile.metric_type,
            target=profile.target,
            activation=profile.activation,
        )
    if (raw := _lookup(metadata, "metricName")) is not None:
        spec = replace(spec, metric_name=_parse_metric_name(raw, warnings))
    if (raw := _lookup(metadata, "metricType")) is not None:
        spec = replace(spec, metric_type=_parse_choice("metricType", raw, MetricType))
    if (raw := _lookup(metadata, "targetValue")) is not None:
        spec = replace(spec, target=_parse_target("targetValue", raw))
    if (raw := _lookup(metadata, "targetGpuUtilization")) is not None:
        target = _parse_target("targetGpuUtilization", raw)
        spec = replace(spec, target=target, metric_type=MetricType.GPU_UTILIZATION)
    if (raw := _lookup(metadata, "targetMemoryUtilization")) is not None:
        target = _parse_target("targetMemoryUtilization", raw)
        spec = replace(spec, target=target, metric_type=MetricType.MEMORY_USED_PERCENT)
    if (raw := _lookup(metadata, "activationThreshold")) is not None:
        spec = replace(spec, activation=_parse_float("activationThreshold", raw))
    if (raw := _lookup(metadata, "gpuIndex")) is not None:
        meaning = "must be -1 (all GPUs) or >= 0"
        spec = replace(spec, gpu_index=_parse_int("gpuIndex", raw, minimum=-1, meaning=meaning))
    if raw := _lookup(metadata, "migInstance"):
        spec = replace(spec, mig_instance=_parse_mig_instance(raw, spec.gpu_index))
    if (raw := _lookup(metadata, "aggregation")) is not None:
        spec = replace(spec, aggregation=_parse_choice("aggregation", raw, Aggregation))
    spec = _parse_window(metadata, spec, warnings)
    if (raw := _lookup(metadata, "pollIntervalSeconds")) is not None:
        meaning = "must be at least 1 second"
        poll = _parse_int("pollIntervalSeconds", raw, minimum=1, meaning=meaning)
        spec = replace(spec, poll_interval_s=poll)

    spec = replace(
        spec,
        vllm_endpoint=_endpoint(metadata, "vllmEndpoint"),
        triton_endpoint=_endpoint(metadata, "tritonEndpoint"),
        tgi_endpoint=_endpoint(metadata, "tgiEndpoint"),
        sglang_endpoint=_endpoint(metadata, "sglangEndpoint"),
    )
    if raw := _lookup(metadata, "endpointDiscovery"):
        spec = replace(spec, endpoint_discovery=_parse_choice("endpointDiscovery", raw, Discovery))
    _check_endpoints(spec)

    if (raw := _lookup(metadata, "cooldownSeconds")) is not None:
        meaning = "must be 0 (off) or a positive number of seconds"
        spec = replace(
            spec, cooldown_s=_parse_int("cooldownSeconds", raw, minimum=0, meaning=meaning)
        )
    spec = _parse_pods(metadata, namespace, spec, warnings)
    if raw := _lookup(metadata, "nodeName"):
        spec = replace(spec, node_name=parse_node_name(raw))
    if (raw := _lookup(metadata, "minCoverage")) is not None:
        spec = replace(spec, min_coverage=parse_min_coverage(raw))
    return replace(spec, warnings=tuple(warnings))


def _parse_window(
    metadata: Mapping[str, str], spec: TriggerSpec, warnings: list[str]
) -> TriggerSpec:
    window_s = 0
    if (raw := _lookup(metadata, "windowSeconds")) is not None:
        meaning = "must be 0 (off) or a positive number of seconds"
        window_s = _parse_int("windowSeconds", raw, minimum=0, meaning=meaning)
        if window_s > MAX_WINDOW_S:
            raise InvalidTrigger(
                "windowSeconds",
                raw,
                f"must be at most {MAX_WINDOW_S} seconds (the longest history kept per GPU)",
            )
    how = WindowAggregation.AVG
    if (raw := _lookup(metadata, "windowAggregation")) is not None:
        how = _parse_choice("windowAggregation", raw, WindowAggregation)
        if window_s == 0:
            warnings.append(
                f'windowAggregation "{raw}" is ignored without windowSeconds '
                "(the newest reading is used)"
            )
            how = WindowAggregation.AVG
    return msgspec.structs.replace(spec, window_s=window_s, window_aggregation=how)


def _parse_pods(
    metadata: Mapping[str, str], namespace: str, spec: TriggerSpec, warnings: list[str]
) -> TriggerSpec:
    raw_namespace = _lookup(metadata, "podNamespace") or None  # empty: the default
    if raw_namespace is not None and not is_namespace(raw_namespace):
        raise InvalidTrigger(
            "podNamespace", raw_namespace, "must be a namespace name (RFC 1123 label)"
        )
    raw = _lookup(metadata, "podSelector")
    if raw is None:
        if raw_namespace is not None:
            warnings.append(f'podNamespace "{raw_namespace}" is ignored without podSelector')
        return spec
    selector = parse_selector(raw, key="podSelector")
    if CATALOG[spec.metric_type].read is None:
        raise InvalidTrigger(
            "podSelector",
            raw,
            f'selects GPUs; metricType "{spec.metric_type}" reads an engine endpoint',
        )
    if spec.gpu_index >= 0:
        raise InvalidTrigger(
            "podSelector", raw, "cannot be combined with gpuIndex: the pods choose the GPUs"
        )
    if spec.mig_instance is not None:
        raise InvalidTrigger(
            "podSelector", raw, "cannot be combined with migInstance: the pods choose the GPUs"
        )
    pod_namespace = raw_namespace or namespace
    if not pod_namespace:
        raise InvalidTrigger(
            "podNamespace", None, "needed with podSelector when the request names no namespace"
        )
    return msgspec.structs.replace(spec, pod_selector=selector, pod_namespace=pod_namespace)


def _parse_mig_instance(raw: str, gpu_index: int) -> MigSelector:
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


def _parse_choice(key: str, raw: str, kind: type[_E]) -> _E:
    try:
        return kind(raw)
    except ValueError:
        raise InvalidTrigger(key, raw, "must be one of " + ", ".join(kind)) from None


def _check_endpoints(spec: TriggerSpec) -> None:
    origin = CATALOG[spec.metric_type].origin
    endpoints = tuple(
        (f"{origin.value}Endpoint", origin, spec.endpoint_for(origin))
        for origin in (Origin.VLLM, Origin.TRITON, Origin.TGI, Origin.SGLANG)
    )
    for key, needed_by, url in endpoints:
        if origin is needed_by and url is None:
            raise InvalidTrigger(key, None, f'metricType "{spec.metric_type}" requires {key}')
    for key, _, url in endpoints:
        if url is not None and (reason := endpoint_refusal(url)) is not None:
            raise InvalidTrigger(key, url, reason)
