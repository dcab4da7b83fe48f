"""Trigger metadata parsing: the Go project's keys, defaults and precedence, checked strictly.

Parse order (the first error wins): defaults, ``profile``, ``metricName``, ``metricType``,
``targetValue``, ``targetGpuUtilization``, ``targetMemoryUtilization``,
``activationThreshold``, ``gpuIndex``, ``migInstance``, ``aggregation``,
``windowSeconds``, ``windowAggregation``, ``pollIntervalSeconds``, endpoints,
endpoint-required checks, endpoint validation, the keys that choose an endpoint's series
(``dynamoMetricsPrefix``, ``dynamoModel``, ``inferencePool``, ``targetModelName``),
``cooldownSeconds``, ``podNamespace``, ``podSelector``, ``sharedDevices``, ``nodeName``,
``minCoverage``.

``nodeName`` and ``minCoverage`` (this product's keys) matter on a cluster scaler, which
sees every node (``domain.coverage`` decides what a partial view answers).

``windowSeconds`` and ``windowAggregation`` (this product's keys) turn each device's
newest reading into a rolling window of its readings, combined per device before
``aggregation`` combines the devices (``domain.windows``); engine metrics get the same over
their scrapes. ``windowSeconds`` is an integer from 0 (off: the newest reading) to
``MAX_WINDOW_S``; ``windowAggregation`` without a window is ignored with a warning.

``podSelector`` and ``podNamespace`` (this product's keys; ``podSelector`` is the name KEDA's
own ``kubernetes-workload`` scaler uses) narrow a GPU trigger to the devices held by the
matching pods of one namespace (the ScaledObject's, unless ``podNamespace`` names another).
They are parsed last; ``podSelector`` cannot be combined with ``gpuIndex`` or ``migInstance``
(the pods choose the devices) nor with an engine metric type. ``sharedDevices`` (this
product's key: ``processes`` or ``whole``) says how such a trigger measures a device that
pods it does not select hold too (``domain.process_share``); without ``podSelector`` it is
ignored with a warning.

``migInstance`` (this product's key, not the Go project's; empty counts as unset) names one
MIG instance: its UUID (``MIG-...``; the older ``MIG-GPU-<uuid>/<gi>/<ci>`` form too) or
``<gpu index>:<GPU instance id>[:<compute instance id>]``. It cannot be combined with a
``gpuIndex`` other than -1.

The keys themselves (names, meanings, ``FromEnv``, typo warnings) are in
``domain.trigger_keys``; the checks of single values in ``domain.trigger_values``.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from keda_gpu_scaler.domain.aggregation import Aggregation
from keda_gpu_scaler.domain.catalog import CATALOG, MetricType, Origin
from keda_gpu_scaler.domain.endpoints import endpoint_refusal
from keda_gpu_scaler.domain.engines import Discovery, EngineKind, EngineTarget
from keda_gpu_scaler.domain.errors import InvalidTrigger
from keda_gpu_scaler.domain.names import is_namespace, is_object_name
from keda_gpu_scaler.domain.process_share import SharedDevices
from keda_gpu_scaler.domain.profiles import PROFILES
from keda_gpu_scaler.domain.selector import LabelSelector, parse_selector
from keda_gpu_scaler.domain.trigger_keys import lookup, typo_warnings
from keda_gpu_scaler.domain.trigger_values import (
    DEFAULT_MIN_COVERAGE,
    MigSelector,
    parse_choice,
    parse_float,
    parse_int,
    parse_label_value,
    parse_metric_name,
    parse_metric_prefix,
    parse_mig_instance,
    parse_min_coverage,
    parse_node_name,
    parse_target,
)
from keda_gpu_scaler.domain.windows import MAX_WINDOW_S, WindowAggregation

DEFAULT_METRIC_NAME = "keda_gpu_metric"
DEFAULT_TARGET = 80.0
DEFAULT_POLL_INTERVAL_S = 10
DEFAULT_COOLDOWN_S = 60
DEFAULT_DYNAMO_PREFIX = "dynamo_frontend"
"""The Dynamo frontend's metric prefix unless ``DYN_METRICS_PREFIX`` changes it."""


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
    trtllm_endpoint: str | None = None
    dynamo_endpoint: str | None = None
    llmd_endpoint: str | None = None
    endpoint_discovery: Discovery = Discovery.STATIC
    dynamo_metrics_prefix: str = DEFAULT_DYNAMO_PREFIX
    """``dynamoMetricsPrefix``: the frontend's ``DYN_METRICS_PREFIX``."""
    dynamo_model: str | None = None
    """``dynamoModel``: only this model's series of the Dynamo frontend."""
    inference_pool: str | None = None
    """``inferencePool``: only the llm-d router's series of this InferencePool."""
    target_model_name: str | None = None
    """``targetModelName``: only the llm-d router's series of this target model."""
    cooldown_s: int = DEFAULT_COOLDOWN_S
    node_name: str | None = None
    """On a cluster scaler: only this node's devices."""
    min_coverage: float = DEFAULT_MIN_COVERAGE
    pod_selector: LabelSelector | None = None
    pod_namespace: str | None = None
    """Set with ``pod_selector`` only: the namespace its pods are looked up in."""
    shared_devices: SharedDevices = SharedDevices.PROCESSES
    """``sharedDevices``: a device other pods hold too is measured by the selected pods'
    processes, or whole; always the default without ``pod_selector``."""
    profile: str | None = None
    warnings: tuple[str, ...] = ()

    def endpoint_for(self, origin: Origin) -> str | None:
        return {
            Origin.VLLM: self.vllm_endpoint,
            Origin.TRITON: self.triton_endpoint,
            Origin.TGI: self.tgi_endpoint,
            Origin.SGLANG: self.sglang_endpoint,
            Origin.TRTLLM: self.trtllm_endpoint,
            Origin.DYNAMO: self.dynamo_endpoint,
            Origin.LLMD: self.llmd_endpoint,
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
        return EngineTarget(kind, url, self.endpoint_discovery, self._options(kind))

    def _options(self, kind: EngineKind) -> tuple[tuple[str, str], ...]:
        chosen: dict[str, str | None] = {}
        if kind is EngineKind.DYNAMO:
            prefix = self.dynamo_metrics_prefix
            chosen = {"model": self.dynamo_model}
            chosen["prefix"] = None if prefix == DEFAULT_DYNAMO_PREFIX else prefix
        elif kind is EngineKind.LLMD:
            chosen = {
                "inference_pool": self.inference_pool,
                "target_model_name": self.target_model_name,
            }
        return tuple(sorted((k, v) for k, v in chosen.items() if v is not None))


def _endpoint(metadata: Mapping[str, str], key: str) -> str | None:
    raw = lookup(metadata, key)
    return raw if raw else None


def parse_trigger(metadata: Mapping[str, str], namespace: str = "") -> TriggerSpec:
    """Parse trigger metadata, raising :class:`InvalidTrigger` naming the first bad key.

    ``namespace`` is the ScaledObject's, the default of ``podNamespace``."""
    warnings = typo_warnings(metadata)
    spec = TriggerSpec()
    replace = msgspec.structs.replace

    if (raw := lookup(metadata, "profile")) is not None:
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
    if (raw := lookup(metadata, "metricName")) is not None:
        spec = replace(spec, metric_name=parse_metric_name(raw, warnings))
    if (raw := lookup(metadata, "metricType")) is not None:
        spec = replace(spec, metric_type=parse_choice("metricType", raw, MetricType))
    if (raw := lookup(metadata, "targetValue")) is not None:
        spec = replace(spec, target=parse_target("targetValue", raw))
    if (raw := lookup(metadata, "targetGpuUtilization")) is not None:
        target = parse_target("targetGpuUtilization", raw)
        spec = replace(spec, target=target, metric_type=MetricType.GPU_UTILIZATION)
    if (raw := lookup(metadata, "targetMemoryUtilization")) is not None:
        target = parse_target("targetMemoryUtilization", raw)
        spec = replace(spec, target=target, metric_type=MetricType.MEMORY_USED_PERCENT)
    if (raw := lookup(metadata, "activationThreshold")) is not None:
        spec = replace(spec, activation=parse_float("activationThreshold", raw))
    if (raw := lookup(metadata, "gpuIndex")) is not None:
        meaning = "must be -1 (all GPUs) or >= 0"
        spec = replace(spec, gpu_index=parse_int("gpuIndex", raw, minimum=-1, meaning=meaning))
    if raw := lookup(metadata, "migInstance"):
        spec = replace(spec, mig_instance=parse_mig_instance(raw, spec.gpu_index))
    if (raw := lookup(metadata, "aggregation")) is not None:
        spec = replace(spec, aggregation=parse_choice("aggregation", raw, Aggregation))
    spec = _parse_window(metadata, spec, warnings)
    if (raw := lookup(metadata, "pollIntervalSeconds")) is not None:
        meaning = "must be at least 1 second"
        poll = parse_int("pollIntervalSeconds", raw, minimum=1, meaning=meaning)
        spec = replace(spec, poll_interval_s=poll)

    spec = replace(
        spec,
        vllm_endpoint=_endpoint(metadata, "vllmEndpoint"),
        triton_endpoint=_endpoint(metadata, "tritonEndpoint"),
        tgi_endpoint=_endpoint(metadata, "tgiEndpoint"),
        sglang_endpoint=_endpoint(metadata, "sglangEndpoint"),
        trtllm_endpoint=_endpoint(metadata, "trtllmEndpoint"),
        dynamo_endpoint=_endpoint(metadata, "dynamoEndpoint"),
        llmd_endpoint=_endpoint(metadata, "llmdEndpoint"),
    )
    if raw := lookup(metadata, "endpointDiscovery"):
        spec = replace(spec, endpoint_discovery=parse_choice("endpointDiscovery", raw, Discovery))
    _check_endpoints(spec)
    spec = _parse_series_keys(metadata, spec, warnings)

    if (raw := lookup(metadata, "cooldownSeconds")) is not None:
        meaning = "must be 0 (off) or a positive number of seconds"
        spec = replace(
            spec, cooldown_s=parse_int("cooldownSeconds", raw, minimum=0, meaning=meaning)
        )
    spec = _parse_pods(metadata, namespace, spec, warnings)
    if raw := lookup(metadata, "nodeName"):
        spec = replace(spec, node_name=parse_node_name(raw))
    if (raw := lookup(metadata, "minCoverage")) is not None:
        spec = replace(spec, min_coverage=parse_min_coverage(raw))
    return replace(spec, warnings=tuple(warnings))


def _parse_window(
    metadata: Mapping[str, str], spec: TriggerSpec, warnings: list[str]
) -> TriggerSpec:
    window_s = 0
    if (raw := lookup(metadata, "windowSeconds")) is not None:
        meaning = "must be 0 (off) or a positive number of seconds"
        window_s = parse_int("windowSeconds", raw, minimum=0, meaning=meaning)
        if window_s > MAX_WINDOW_S:
            raise InvalidTrigger(
                "windowSeconds",
                raw,
                f"must be at most {MAX_WINDOW_S} seconds (the longest history kept per GPU)",
            )
    how = WindowAggregation.AVG
    if (raw := lookup(metadata, "windowAggregation")) is not None:
        how = parse_choice("windowAggregation", raw, WindowAggregation)
        if window_s == 0:
            warnings.append(
                f'windowAggregation "{raw}" is ignored without windowSeconds '
                "(the newest reading is used)"
            )
            how = WindowAggregation.AVG
    return msgspec.structs.replace(spec, window_s=window_s, window_aggregation=how)


_SERIES_KEYS: dict[str, tuple[Origin, str]] = {
    "dynamoMetricsPrefix": (Origin.DYNAMO, "dynamo_metrics_prefix"),
    "dynamoModel": (Origin.DYNAMO, "dynamo_model"),
    "inferencePool": (Origin.LLMD, "inference_pool"),
    "targetModelName": (Origin.LLMD, "target_model_name"),
}
"""The keys that choose which series of an endpoint a trigger reads: the key's engine, and
the spec field it sets."""


def _parse_series_keys(
    metadata: Mapping[str, str], spec: TriggerSpec, warnings: list[str]
) -> TriggerSpec:
    """``dynamoMetricsPrefix``, ``dynamoModel``, ``inferencePool``, ``targetModelName``: empty
    counts as unset; a key of another engine than the metric type's is ignored, with a
    warning."""
    origin = CATALOG[spec.metric_type].origin
    values: dict[str, str] = {}
    for key, (needed_by, field) in _SERIES_KEYS.items():
        raw = lookup(metadata, key)
        if not raw:
            continue
        if needed_by is not origin:
            warnings.append(
                f'{key} "{raw}" is ignored: metricType "{spec.metric_type}" does not read '
                f"{needed_by.value}Endpoint"
            )
            continue
        if key == "dynamoMetricsPrefix":
            values[field] = parse_metric_prefix(key, raw)
        elif key == "inferencePool":
            if not is_object_name(raw):
                raise InvalidTrigger(
                    key, raw, "must be an InferencePool's name (an RFC 1123 subdomain)"
                )
            values[field] = raw
        else:
            values[field] = parse_label_value(key, raw)
    return msgspec.structs.replace(spec, **values)


def _parse_pods(
    metadata: Mapping[str, str], namespace: str, spec: TriggerSpec, warnings: list[str]
) -> TriggerSpec:
    raw_namespace = lookup(metadata, "podNamespace") or None  # empty: the default
    if raw_namespace is not None and not is_namespace(raw_namespace):
        raise InvalidTrigger(
            "podNamespace", raw_namespace, "must be a namespace name (RFC 1123 label)"
        )
    raw_shared = lookup(metadata, "sharedDevices") or None  # empty: the default
    raw = lookup(metadata, "podSelector")
    if raw is None:
        if raw_namespace is not None:
            warnings.append(f'podNamespace "{raw_namespace}" is ignored without podSelector')
        if raw_shared is not None:
            warnings.append(
                f'sharedDevices "{raw_shared}" is ignored without podSelector (every GPU is '
                "measured whole)"
            )
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
    shared = SharedDevices.PROCESSES
    if raw_shared is not None:
        shared = parse_choice("sharedDevices", raw_shared, SharedDevices)
    return msgspec.structs.replace(
        spec, pod_selector=selector, pod_namespace=pod_namespace, shared_devices=shared
    )


def _check_endpoints(spec: TriggerSpec) -> None:
    origin = CATALOG[spec.metric_type].origin
    endpoints = tuple(
        (kind.endpoint_key, Origin(kind.value), spec.endpoint_for(Origin(kind.value)))
        for kind in EngineKind
    )
    for key, needed_by, url in endpoints:
        if origin is needed_by and url is None:
            raise InvalidTrigger(key, None, f'metricType "{spec.metric_type}" requires {key}')
    for key, _, url in endpoints:
        if url is not None and (reason := endpoint_refusal(url)) is not None:
            raise InvalidTrigger(key, url, reason)


def check_cluster_trigger(spec: TriggerSpec) -> None:
    """On a cluster scaler, ``gpuIndex`` and ``migInstance`` name a device of one node:
    without ``nodeName`` they are refused (every node has a GPU 0)."""
    if spec.node_name is not None:
        return
    if spec.gpu_index >= 0:
        raise InvalidTrigger("gpuIndex", str(spec.gpu_index), "needs nodeName on a cluster scaler")
    if spec.mig_instance is not None:
        raise InvalidTrigger(
            "migInstance", str(spec.mig_instance), "needs nodeName on a cluster scaler"
        )
