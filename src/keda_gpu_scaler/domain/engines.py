"""Typed engine readings and the sample an engine sampler publishes.

Every value is optional: ``None`` means "no reading" and ``reasons[field]`` says why (a
family missing from the payload, the first scrape of a counter, no request finished in the
window, ...). A missing value is never 0: a false 0 lets KEDA scale a busy workload in.

Units: counts in requests, levels in percent (0-100), durations in the unit the field name
ends with (``_s`` seconds, ``_ms`` milliseconds), rates per second.
"""

from __future__ import annotations

import enum

import msgspec


class EngineKind(enum.StrEnum):
    """An engine (or router) whose ``/metrics`` a trigger reads; its endpoint key is the value
    followed by ``Endpoint`` (``vllmEndpoint``, ``llmdEndpoint``)."""

    VLLM = "vllm"
    TRITON = "triton"
    TGI = "tgi"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    """TensorRT-LLM's ``trtllm-serve`` (``/prometheus/metrics``)."""
    DYNAMO = "dynamo"
    """The NVIDIA Dynamo frontend."""
    LLMD = "llmd"
    """The llm-d router's endpoint picker (EPP), whose flow control queues requests."""

    @property
    def endpoint_key(self) -> str:
        return f"{self.value}Endpoint"


class Discovery(enum.StrEnum):
    STATIC = "static"
    """Scrape the URL's host (its first vetted address)."""
    DNS = "dns"
    """The host is a headless Service: scrape every pod it resolves to and combine them."""


class EngineTarget(msgspec.Struct, frozen=True):
    """What one engine sampler scrapes; every trigger naming the same target shares it."""

    kind: EngineKind
    url: str
    discovery: Discovery = Discovery.STATIC
    options: tuple[tuple[str, str], ...] = ()
    """What the kind reads beyond the URL, sorted: a Dynamo frontend's metric ``prefix`` and
    ``model``, a router's ``inference_pool`` and ``target_model_name``. Triggers that differ
    here read different values, so they are different targets."""

    @property
    def source(self) -> str:
        """The sampler's source name, also its key in the snapshot."""
        base = f"{self.kind}:{self.discovery}:{self.url}"
        if not self.options:
            return base
        return base + "[" + ",".join(f"{k}={v}" for k, v in self.options) + "]"


class _Reading(msgspec.Struct, frozen=True, kw_only=True):
    taken_at: float
    """anyio clock seconds when the scrape started."""
    reasons: dict[str, str] = msgspec.field(default_factory=dict)
    """Field name -> why that field is None."""

    def value(self, field: str) -> float | None:
        """The value of a reading field by name (``None`` when absent)."""
        result = getattr(self, field)
        if result is not None and not isinstance(result, float):
            raise TypeError(f"{field} is not a reading field")
        return result

    def why_absent(self, field: str) -> str | None:
        return self.reasons.get(field)


class VllmReading(_Reading, frozen=True, kw_only=True, tag="vllm"):
    queue_depth: float | None = None
    """Σ ``vllm:num_requests_waiting`` over engines and models."""
    queue_capacity: float | None = None
    """Σ ``vllm:num_requests_waiting_by_reason{reason="capacity"}``: waiting for room."""
    queue_deferred: float | None = None
    """Σ ``vllm:num_requests_waiting_by_reason{reason="deferred"}``: held by a transient
    constraint (LoRA budget, KV transfer), not by capacity."""
    running: float | None = None
    """Σ ``vllm:num_requests_running``."""
    kv_cache_usage_percent: float | None = None
    """100 × max over engines of ``vllm:kv_cache_usage_perc`` (old name as a fallback)."""
    queue_time_mean_s: float | None = None
    """Mean scheduler-queue time of requests that finished in the last window."""
    queue_time_p95_s: float | None = None
    ttft_mean_s: float | None = None
    """Mean time to first token of requests that got one in the last window."""
    ttft_p95_s: float | None = None
    preemptions_per_s: float | None = None
    admission_rejections_per_s: float | None = None
    """Δ ``vllm:admission_rejections_total`` / Δt: requests refused because a queue limit
    (``--max-num-queued-reqs``, ``--max-num-queued-tokens``) was full."""
    engines_asleep: float | None = None
    """Engines whose ``vllm:engine_sleep_state{sleep_state="awake"}`` is 0. While one sleeps,
    the levels and the preemption rate have no value: a sleeping engine must not read idle."""


class TritonReading(_Reading, frozen=True, kw_only=True, tag="triton"):
    pending_requests: float | None = None
    """Σ ``nv_inference_pending_request_count``: the queue, leading indicator."""
    queue_wait_ms: float | None = None
    """Δ queue time / Δ successful **requests** over the last window, per request."""
    request_rate: float | None = None
    """(Δ success + Δ failure) / Δt, requests per second."""
    inference_rate: float | None = None
    """Δ ``nv_inference_count`` / Δt: batch **items** per second, not requests."""
    first_response_p95_ms: float | None = None
    """95th percentile of Δ ``nv_inference_first_response_histogram_ms`` (decoupled models,
    ``--metrics-config histogram_latencies=true``)."""


class TgiReading(_Reading, frozen=True, kw_only=True, tag="tgi"):
    queue_size: float | None = None
    """``tgi_queue_size``: requests waiting."""
    batch_size: float | None = None
    """``tgi_batch_current_size``: requests in the running batch."""


class SglangReading(_Reading, frozen=True, kw_only=True, tag="sglang"):
    queue_requests: float | None = None
    """``sglang:num_queue_reqs``: max over tp/pp ranks, Σ over dp ranks."""
    running_requests: float | None = None
    token_usage_percent: float | None = None
    """100 × max over ranks of ``sglang:token_usage`` (a fraction 0..1 of the KV token pool)."""


class TrtllmReading(_Reading, frozen=True, kw_only=True, tag="trtllm"):
    queue_depth: float | None = None
    """Σ ``trtllm_num_requests_waiting`` (iteration stats: ``enable_iter_perf_stats``)."""
    running: float | None = None
    """Σ ``trtllm_num_requests_running``."""
    kv_cache_usage_percent: float | None = None
    """100 × the highest ``trtllm_kv_cache_utilization`` (used / max KV blocks)."""
    kv_cache_hit_rate_percent: float | None = None
    """100 × the highest ``trtllm_kv_cache_hit_rate``."""
    queue_time_mean_s: float | None = None
    ttft_p95_s: float | None = None


class DynamoReading(_Reading, frozen=True, kw_only=True, tag="dynamo"):
    queued: float | None = None
    """Σ ``dynamo_frontend_queued_requests``: requests before their first response."""
    inflight: float | None = None
    """Σ ``dynamo_frontend_inflight_requests``: requests at the engines."""
    ttft_p95_s: float | None = None
    """95th percentile of Δ ``dynamo_frontend_time_to_first_token_seconds``."""


class LlmdReading(_Reading, frozen=True, kw_only=True, tag="llmd"):
    queue_size: float | None = None
    """Σ ``llm_d_epp_flow_control_queue_size`` of the selected pool or model: requests the
    router holds because no endpoint can take them, all of them while the pool has none."""
    average_queue_size: float | None = None
    """``llm_d_epp_average_queue_size`` of the pool: the model servers' mean queue."""
    average_kv_cache_percent: float | None = None
    """100 × ``llm_d_epp_average_kv_cache_utilization`` of the pool."""
    ready_endpoints: float | None = None
    """``llm_d_epp_ready_endpoints`` of the pool."""


EngineReading = (
    VllmReading
    | TritonReading
    | TgiReading
    | SglangReading
    | TrtllmReading
    | DynamoReading
    | LlmdReading
)
READING_TYPES: dict[EngineKind, type[EngineReading]] = {
    EngineKind.VLLM: VllmReading,
    EngineKind.TRITON: TritonReading,
    EngineKind.TGI: TgiReading,
    EngineKind.SGLANG: SglangReading,
    EngineKind.TRTLLM: TrtllmReading,
    EngineKind.DYNAMO: DynamoReading,
    EngineKind.LLMD: LlmdReading,
}


class PodResult(msgspec.Struct, frozen=True, kw_only=True):
    """One pod behind a headless Service (``endpointDiscovery: dns``)."""

    address: str
    reading: EngineReading | None = None
    error: str | None = None
    duration_s: float | None = None


class EngineSample(msgspec.Struct, frozen=True, kw_only=True, tag="engine"):
    """One scrape cycle of one endpoint: a reading, or why there is none (``error``).

    In DNS discovery mode ``reading`` is the deployment aggregate over the pods that
    answered (queues summed, cache usage the highest, rates summed) and ``pods`` has each
    pod's own result; a pod that failed adds nothing to the aggregate.
    """

    source: str
    kind: EngineKind
    endpoint: str
    taken_at: float
    period_s: float = 5.0
    """The sampler's cadence: a sample older than three periods is stale."""
    reading: EngineReading | None = None
    error: str | None = None
    refused: bool = False
    """True when the endpoint is refused by policy (a link-local or metadata address after
    DNS resolution, an address outside the allow-list): a configuration error, not an
    outage."""
    pods: tuple[PodResult, ...] = ()

    def is_failure(self) -> bool:
        return self.reading is None
