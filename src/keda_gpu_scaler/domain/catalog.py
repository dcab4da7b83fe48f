"""The metric catalog: every metric type a trigger can name, its unit, where it comes from,
and the most one device can read of it (its :class:`Bound`)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from keda_gpu_scaler.domain.engines import EngineKind
from keda_gpu_scaler.domain.samples import GpuReading

_MIB = 1 << 20


class MetricType(enum.StrEnum):
    """Trigger ``metricType`` values; the first fourteen keep the Go project's order."""

    GPU_UTILIZATION = "gpu_utilization"
    MEMORY_UTILIZATION = "memory_utilization"
    MEMORY_USED_MIB = "memory_used_mib"
    MEMORY_USED_PERCENT = "memory_used_percent"
    TEMPERATURE = "temperature"
    POWER_DRAW = "power_draw"
    PCIE_TX_KBPS = "pcie_tx_kbps"
    PCIE_RX_KBPS = "pcie_rx_kbps"
    NVLINK_TX_MBPS = "nvlink_tx_mbps"
    NVLINK_RX_MBPS = "nvlink_rx_mbps"
    VLLM_QUEUE_DEPTH = "vllm_queue_depth"
    VLLM_KV_CACHE_USAGE = "vllm_kv_cache_usage"
    TRITON_QUEUE_WAIT_MS = "triton_queue_wait_ms"
    TRITON_REQUEST_RATE = "triton_request_rate"
    SM_ACTIVE = "sm_active"
    SM_OCCUPANCY = "sm_occupancy"
    TENSOR_ACTIVE = "tensor_active"
    DRAM_BW_UTIL = "dram_bw_util"
    VLLM_RUNNING_REQUESTS = "vllm_running_requests"
    VLLM_QUEUE_TIME_MS = "vllm_queue_time_ms"
    VLLM_TTFT_P95_MS = "vllm_ttft_p95_ms"
    VLLM_PREEMPTION_RATE = "vllm_preemption_rate"
    TRITON_PENDING_REQUESTS = "triton_pending_requests"
    TGI_QUEUE_SIZE = "tgi_queue_size"
    TGI_BATCH_SIZE = "tgi_batch_size"
    SGLANG_QUEUE_REQUESTS = "sglang_queue_requests"
    SGLANG_TOKEN_USAGE = "sglang_token_usage"
    VLLM_QUEUE_CAPACITY = "vllm_queue_capacity"
    VLLM_ADMISSION_REJECTION_RATE = "vllm_admission_rejection_rate"
    TRITON_FIRST_RESPONSE_P95_MS = "triton_first_response_p95_ms"
    TRTLLM_QUEUE_DEPTH = "trtllm_queue_depth"
    TRTLLM_RUNNING_REQUESTS = "trtllm_running_requests"
    TRTLLM_KV_CACHE_USAGE = "trtllm_kv_cache_usage"
    TRTLLM_KV_CACHE_HIT_RATE = "trtllm_kv_cache_hit_rate"
    TRTLLM_QUEUE_TIME_MS = "trtllm_queue_time_ms"
    TRTLLM_TTFT_P95_MS = "trtllm_ttft_p95_ms"
    DYNAMO_QUEUED_REQUESTS = "dynamo_queued_requests"
    DYNAMO_INFLIGHT_REQUESTS = "dynamo_inflight_requests"
    DYNAMO_TTFT_P95_MS = "dynamo_ttft_p95_ms"
    LLMD_QUEUE_SIZE = "llmd_queue_size"
    LLMD_AVERAGE_QUEUE_SIZE = "llmd_average_queue_size"
    LLMD_AVERAGE_KV_CACHE_USAGE = "llmd_average_kv_cache_usage"
    LLMD_READY_ENDPOINTS = "llmd_ready_endpoints"


class Origin(enum.StrEnum):
    """Which kind of sampler produces a metric; engine origins are named as EngineKind."""

    GPU = "gpu"
    VLLM = "vllm"
    TRITON = "triton"
    TGI = "tgi"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    DYNAMO = "dynamo"
    LLMD = "llmd"

    @property
    def engine(self) -> EngineKind | None:
        return None if self is Origin.GPU else EngineKind(self.value)


class Bound(enum.StrEnum):
    """The most one device (a GPU, or one engine) can read of a metric.

    A demand above it cannot be served by that device: the device reads the bound and the
    rest waits (what an engine's queue counts). Counts, rates and queues have no bound."""

    PERCENT = "100"
    DEVICE_MEMORY = "the device's memory"
    POWER_LIMIT = "the device's power limit"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class DeviceLimits:
    """What bounds a device's readings: its memory and its power limit (None: unknown)."""

    memory_mib: float | None = None
    power_limit_w: float | None = None

    @classmethod
    def of(cls, reading: GpuReading) -> DeviceLimits:
        memory = None if not reading.memory_total_bytes else reading.memory_total_bytes // _MIB
        power = None if reading.power_limit_mw is None else reading.power_limit_mw / 1000.0
        return cls(None if memory is None else float(memory), power)


@dataclass(frozen=True, slots=True)
class MetricInfo:
    type: MetricType
    unit: str
    origin: Origin
    source: str
    description: str
    read: Callable[[GpuReading], float | None] | None = None
    """How a GPU reading yields this metric; None for engine metrics."""
    per_parent: bool = False
    """A whole-GPU reading that MIG instances carry copies of: count each GPU once."""
    needs: str | None = None
    """What a GPU must have for this metric, said when no GPU reports it."""
    engine_field: str | None = None
    """The engine reading field this metric serves (engine metrics only)."""
    scale: float = 1.0
    """Factor from the reading's unit to this metric's (seconds to ms, say)."""
    bound: Bound = Bound.NONE
    """The most one device reads (every percentage: 100)."""

    def limit(self, device: DeviceLimits) -> float | None:
        """The bound of one device in this metric's unit; None when unbounded or unknown."""
        match self.bound:
            case Bound.PERCENT:
                return 100.0
            case Bound.DEVICE_MEMORY:
                return device.memory_mib
            case Bound.POWER_LIMIT:
                return device.power_limit_w
            case _:
                return None


def _memory_used_mib(r: GpuReading) -> float | None:
    if r.memory_used_bytes is None:
        return None
    return float(r.memory_used_bytes // _MIB)


def _memory_used_percent(r: GpuReading) -> float | None:
    # Computed on whole MiB, as the Go project does, so the same GPU gives the same number.
    if r.memory_used_bytes is None or not r.memory_total_bytes:
        return None
    total_mib = r.memory_total_bytes // _MIB
    if total_mib == 0:
        return None
    return (r.memory_used_bytes // _MIB) / total_mib * 100.0


def _power_w(r: GpuReading) -> float | None:
    return None if r.power_mw is None else r.power_mw / 1000.0


_GPM = "GPM profiling metrics (Hopper or newer, nvmlGpmQueryDeviceSupport)"


def _gpu(
    type_: MetricType,
    unit: str,
    source: str,
    description: str,
    read: Callable[[GpuReading], float | None],
    *,
    per_parent: bool = False,
    needs: str | None = None,
    bound: Bound | None = None,
) -> MetricInfo:
    return MetricInfo(
        type_,
        unit,
        Origin.GPU,
        source,
        description,
        read,
        per_parent,
        needs,
        bound=_bound(unit) if bound is None else bound,
    )


def _engine(
    type_: MetricType,
    unit: str,
    origin: Origin,
    source: str,
    description: str,
    field: str,
    *,
    scale: float = 1.0,
) -> MetricInfo:
    return MetricInfo(
        type_,
        unit,
        origin,
        source,
        description,
        engine_field=field,
        scale=scale,
        bound=_bound(unit),
    )


def _bound(unit: str) -> Bound:
    return Bound.PERCENT if unit == "percent" else Bound.NONE


_ITER_STATS = "; needs enable_iter_perf_stats: true"
_TRTLLM = (
    _engine(
        MetricType.TRTLLM_QUEUE_DEPTH,
        "requests",
        Origin.TRTLLM,
        "trtllm_num_requests_waiting",
        "requests queued, summed" + _ITER_STATS,
        "queue_depth",
    ),
    _engine(
        MetricType.TRTLLM_RUNNING_REQUESTS,
        "requests",
        Origin.TRTLLM,
        "trtllm_num_requests_running",
        "requests active, summed" + _ITER_STATS,
        "running",
    ),
    _engine(
        MetricType.TRTLLM_KV_CACHE_USAGE,
        "percent",
        Origin.TRTLLM,
        "trtllm_kv_cache_utilization",
        "KV cache blocks in use, the highest" + _ITER_STATS,
        "kv_cache_usage_percent",
    ),
    _engine(
        MetricType.TRTLLM_KV_CACHE_HIT_RATE,
        "percent",
        Origin.TRTLLM,
        "trtllm_kv_cache_hit_rate",
        "KV cache hit rate, the highest" + _ITER_STATS,
        "kv_cache_hit_rate_percent",
    ),
    _engine(
        MetricType.TRTLLM_QUEUE_TIME_MS,
        "ms",
        Origin.TRTLLM,
        "trtllm_request_queue_time_seconds (histogram)",
        "mean queue time of requests that finished in the last interval",
        "queue_time_mean_s",
        scale=1000.0,
    ),
    _engine(
        MetricType.TRTLLM_TTFT_P95_MS,
        "ms",
        Origin.TRTLLM,
        "trtllm_time_to_first_token_seconds (histogram)",
        "95th percentile time to first token over the last interval",
        "ttft_p95_s",
        scale=1000.0,
    ),
)
_DYNAMO = (
    _engine(
        MetricType.DYNAMO_QUEUED_REQUESTS,
        "requests",
        Origin.DYNAMO,
        "dynamo_frontend_queued_requests",
        "requests in the frontend's HTTP queue (before their first response), summed over "
        "models or of dynamoModel",
        "queued",
    ),
    _engine(
        MetricType.DYNAMO_INFLIGHT_REQUESTS,
        "requests",
        Origin.DYNAMO,
        "dynamo_frontend_inflight_requests",
        "requests in flight to the engines, summed over models or of dynamoModel",
        "inflight",
    ),
    _engine(
        MetricType.DYNAMO_TTFT_P95_MS,
        "ms",
        Origin.DYNAMO,
        "dynamo_frontend_time_to_first_token_seconds (histogram)",
        "95th percentile time to first token at the frontend over the last interval",
        "ttft_p95_s",
        scale=1000.0,
    ),
)
_LLMD = (
    _engine(
        MetricType.LLMD_QUEUE_SIZE,
        "requests",
        Origin.LLMD,
        "llm_d_epp_flow_control_queue_size",
        "requests the llm-d router holds for the pool (inferencePool) or model "
        "(targetModelName): all of them while it has no endpoint, so it wakes a pool at zero",
        "queue_size",
    ),
    _engine(
        MetricType.LLMD_AVERAGE_QUEUE_SIZE,
        "requests",
        Origin.LLMD,
        "llm_d_epp_average_queue_size",
        "the pool's model servers' mean queue, as the router scrapes them",
        "average_queue_size",
    ),
    _engine(
        MetricType.LLMD_AVERAGE_KV_CACHE_USAGE,
        "percent",
        Origin.LLMD,
        "llm_d_epp_average_kv_cache_utilization",
        "the pool's model servers' mean KV cache use",
        "average_kv_cache_percent",
    ),
    _engine(
        MetricType.LLMD_READY_ENDPOINTS,
        "endpoints",
        Origin.LLMD,
        "llm_d_epp_ready_endpoints",
        "the pool's ready endpoints",
        "ready_endpoints",
    ),
)


CATALOG: dict[MetricType, MetricInfo] = {
    info.type: info
    for info in (
        _gpu(
            MetricType.GPU_UTILIZATION,
            "percent",
            "nvmlDeviceGetUtilizationRates.gpu",
            "share of time one or more kernels ran",
            lambda r: r.gpu_utilization,
        ),
        _gpu(
            MetricType.MEMORY_UTILIZATION,
            "percent",
            "nvmlDeviceGetUtilizationRates.memory",
            "share of time the memory controller was busy (not VRAM use)",
            lambda r: r.memory_utilization,
        ),
        _gpu(
            MetricType.MEMORY_USED_MIB,
            "MiB",
            "nvmlDeviceGetMemoryInfo (v1 used)",
            "VRAM in use, driver-reserved memory included",
            _memory_used_mib,
            bound=Bound.DEVICE_MEMORY,
        ),
        _gpu(
            MetricType.MEMORY_USED_PERCENT,
            "percent",
            "nvmlDeviceGetMemoryInfo (v1 used/total)",
            "VRAM in use as a share of the total, on whole MiB",
            _memory_used_percent,
        ),
        _gpu(
            MetricType.TEMPERATURE,
            "degrees C",
            "nvmlDeviceGetTemperature(GPU)",
            "GPU die temperature",
            lambda r: r.temperature_c,
            per_parent=True,
        ),
        _gpu(
            MetricType.POWER_DRAW,
            "W",
            "nvmlDeviceGetPowerUsage",
            "board power draw",
            _power_w,
            per_parent=True,
            bound=Bound.POWER_LIMIT,
        ),
        _gpu(
            MetricType.PCIE_TX_KBPS,
            "KB/s",
            "nvmlDeviceGetPcieThroughput(TX_BYTES)",
            "PCIe bytes sent by the GPU",
            lambda r: r.pcie_tx_kbps,
            per_parent=True,
        ),
        _gpu(
            MetricType.PCIE_RX_KBPS,
            "KB/s",
            "nvmlDeviceGetPcieThroughput(RX_BYTES)",
            "PCIe bytes received by the GPU",
            lambda r: r.pcie_rx_kbps,
            per_parent=True,
        ),
        _gpu(
            MetricType.NVLINK_TX_MBPS,
            "MB/s",
            "NVLink throughput counters (field values)",
            "NVLink bytes sent, a rate over the sampling interval",
            lambda r: r.nvlink_tx_mbps,
            per_parent=True,
        ),
        _gpu(
            MetricType.NVLINK_RX_MBPS,
            "MB/s",
            "NVLink throughput counters (field values)",
            "NVLink bytes received, a rate over the sampling interval",
            lambda r: r.nvlink_rx_mbps,
            per_parent=True,
        ),
        _engine(
            MetricType.VLLM_QUEUE_DEPTH,
            "requests",
            Origin.VLLM,
            "vllm:num_requests_waiting",
            "requests waiting, summed over engines and models",
            "queue_depth",
        ),
        _engine(
            MetricType.VLLM_KV_CACHE_USAGE,
            "percent",
            Origin.VLLM,
            "vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc before 0.9)",
            "KV cache blocks in use, the hottest engine",
            "kv_cache_usage_percent",
        ),
        _engine(
            MetricType.TRITON_QUEUE_WAIT_MS,
            "ms",
            Origin.TRITON,
            "Δnv_inference_queue_duration_us / Δnv_inference_request_success",
            "mean queue wait per request over the last scrape interval",
            "queue_wait_ms",
        ),
        _engine(
            MetricType.TRITON_REQUEST_RATE,
            "requests/s",
            Origin.TRITON,
            "Δ(nv_inference_request_success + nv_inference_request_failure) / Δt",
            "requests completed per second over the last scrape interval",
            "request_rate",
        ),
        _gpu(
            MetricType.SM_ACTIVE,
            "percent",
            "GPM SM_UTIL (Hopper and newer)",
            "share of SM cycles with at least one warp resident",
            lambda r: r.sm_active,
            needs=_GPM,
        ),
        _gpu(
            MetricType.SM_OCCUPANCY,
            "percent",
            "GPM SM_OCCUPANCY (Hopper and newer)",
            "resident warps as a share of the SMs' maximum",
            lambda r: r.sm_occupancy,
            needs=_GPM,
        ),
        _gpu(
            MetricType.TENSOR_ACTIVE,
            "percent",
            "GPM ANY_TENSOR_UTIL (Hopper and newer)",
            "share of cycles a tensor pipe was busy",
            lambda r: r.tensor_active,
            needs=_GPM,
        ),
        _gpu(
            MetricType.DRAM_BW_UTIL,
            "percent",
            "GPM DRAM_BW_UTIL (Hopper and newer)",
            "DRAM bandwidth used as a share of the peak",
            lambda r: r.dram_bw_util,
            needs=_GPM,
        ),
        _engine(
            MetricType.VLLM_RUNNING_REQUESTS,
            "requests",
            Origin.VLLM,
            "vllm:num_requests_running",
            "requests in the running batch, summed",
            "running",
        ),
        _engine(
            MetricType.VLLM_QUEUE_TIME_MS,
            "ms",
            Origin.VLLM,
            "vllm:request_queue_time_seconds (histogram)",
            "mean queue time of requests that finished in the last interval",
            "queue_time_mean_s",
            scale=1000.0,
        ),
        _engine(
            MetricType.VLLM_TTFT_P95_MS,
            "ms",
            Origin.VLLM,
            "vllm:time_to_first_token_seconds (histogram)",
            "95th percentile time to first token over the last interval",
            "ttft_p95_s",
            scale=1000.0,
        ),
        _engine(
            MetricType.VLLM_PREEMPTION_RATE,
            "preemptions/s",
            Origin.VLLM,
            "vllm:num_preemptions_total",
            "KV-pressure preemptions per second",
            "preemptions_per_s",
        ),
        _engine(
            MetricType.TRITON_PENDING_REQUESTS,
            "requests",
            Origin.TRITON,
            "nv_inference_pending_request_count",
            "requests received and not yet executing",
            "pending_requests",
        ),
        _engine(
            MetricType.TGI_QUEUE_SIZE,
            "requests",
            Origin.TGI,
            "tgi_queue_size",
            "requests waiting",
            "queue_size",
        ),
        _engine(
            MetricType.TGI_BATCH_SIZE,
            "requests",
            Origin.TGI,
            "tgi_batch_current_size",
            "requests in the running batch",
            "batch_size",
        ),
        _engine(
            MetricType.SGLANG_QUEUE_REQUESTS,
            "requests",
            Origin.SGLANG,
            "sglang:num_queue_reqs",
            "requests waiting, summed over data-parallel ranks",
            "queue_requests",
        ),
        _engine(
            MetricType.SGLANG_TOKEN_USAGE,
            "percent",
            Origin.SGLANG,
            "sglang:token_usage",
            "KV token pool in use, the highest rank",
            "token_usage_percent",
        ),
        _engine(
            MetricType.VLLM_QUEUE_CAPACITY,
            "requests",
            Origin.VLLM,
            'vllm:num_requests_waiting_by_reason{reason="capacity"}',
            "requests waiting for scheduling capacity (not those deferred by LoRA budget or "
            "KV transfer), summed",
            "queue_capacity",
        ),
        _engine(
            MetricType.VLLM_ADMISSION_REJECTION_RATE,
            "requests/s",
            Origin.VLLM,
            "vllm:admission_rejections_total",
            "requests refused because a queue limit was full (--max-num-queued-reqs, "
            "--max-num-queued-tokens), per second",
            "admission_rejections_per_s",
        ),
        _engine(
            MetricType.TRITON_FIRST_RESPONSE_P95_MS,
            "ms",
            Origin.TRITON,
            "nv_inference_first_response_histogram_ms",
            "95th percentile time to first response over the last interval (decoupled models, "
            "--metrics-config histogram_latencies=true)",
            "first_response_p95_ms",
        ),
        *_TRTLLM,
        *_DYNAMO,
        *_LLMD,
    )
}


QUEUES = frozenset(
    {
        MetricType.VLLM_QUEUE_DEPTH,
        MetricType.VLLM_QUEUE_CAPACITY,
        MetricType.TRITON_PENDING_REQUESTS,
        MetricType.TGI_QUEUE_SIZE,
        MetricType.SGLANG_QUEUE_REQUESTS,
        MetricType.TRTLLM_QUEUE_DEPTH,
        MetricType.DYNAMO_QUEUED_REQUESTS,
        MetricType.LLMD_QUEUE_SIZE,
        MetricType.LLMD_AVERAGE_QUEUE_SIZE,
    }
)
"""The metrics that count requests waiting: what a demand above the replicas' bound becomes."""
