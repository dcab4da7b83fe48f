"""The trigger metadata keys: their names, defaults and meanings, and how a key is read.

A key set by KEDA from the environment arrives as ``<key>FromEnv``; it stands in for a key
that is absent. A key that is none of these but close to one (its case, a typo) is ignored
with a warning naming the key it resembles.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from keda_gpu_scaler.domain.windows import MAX_WINDOW_S

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
    "trtllmEndpoint",
    "dynamoEndpoint",
    "llmdEndpoint",
    "endpointDiscovery",
    "dynamoMetricsPrefix",
    "dynamoModel",
    "inferencePool",
    "targetModelName",
    "cooldownSeconds",
    "podSelector",
    "podNamespace",
    "sharedDevices",
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
    "trtllmEndpoint": (
        "none",
        "TensorRT-LLM `trtllm-serve` `/prometheus/metrics` URL (http or https)",
    ),
    "dynamoEndpoint": ("none", "NVIDIA Dynamo frontend `/metrics` URL (http or https)"),
    "llmdEndpoint": (
        "none",
        "llm-d router endpoint picker (EPP) `/metrics` URL (http or https)",
    ),
    "dynamoMetricsPrefix": (
        "`dynamo_frontend`",
        "the Dynamo frontend's metric prefix, when `DYN_METRICS_PREFIX` changes it",
    ),
    "dynamoModel": (
        "none (every model)",
        "only the Dynamo frontend's series of this model (label `model`)",
    ),
    "inferencePool": (
        "none (every pool)",
        "only the llm-d router's series of this InferencePool (label `inference_pool`; "
        "`name` on the pool gauges)",
    ),
    "targetModelName": (
        "none (every model)",
        "only the llm-d router's queued requests for this target model (label `target_model_name`)",
    ),
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
    "sharedDevices": (
        "`processes`",
        "with `podSelector`, how a GPU that pods it does not select hold too (time-slicing, "
        "MPS, a shared DRA claim) is measured: `processes`, the selected pods' own processes "
        "(UNAVAILABLE where the node agent has no per-process readings of it); `whole`, the "
        "whole device, neighbours included",
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


def lookup(metadata: Mapping[str, str], key: str) -> str | None:
    """A key's value; ``<key>FromEnv`` (resolved by KEDA) stands in when the key is absent."""
    if key in metadata:
        return metadata[key]
    return metadata.get(key + _FROM_ENV)


def typo_warnings(metadata: Mapping[str, str]) -> list[str]:
    """A warning for each unknown key that looks like a known one (case, a near spelling)."""
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
