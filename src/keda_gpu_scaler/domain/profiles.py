"""The Go project's ten profiles, with identical values, and this product's own.

Only the metric name, metric type, target and activation are applied, as upstream. The
cooldown figure is the one its examples copy into KEDA's ``cooldownPeriod``; it is kept
for the docs and examples, not applied by the scaler.
"""

from __future__ import annotations

from dataclasses import dataclass

from keda_gpu_scaler.domain.catalog import MetricType


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    metric_name: str
    metric_type: MetricType
    target: float
    activation: float
    keda_cooldown_s: int
    description: str


def _profile(
    name: str, metric_type: MetricType, target: float, activation: float, cooldown: int, desc: str
) -> Profile:
    metric_name = "keda_gpu_" + name.replace("-", "_")
    return Profile(name, metric_name, metric_type, float(target), float(activation), cooldown, desc)


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        _profile(
            "distributed-training",
            MetricType.NVLINK_TX_MBPS,
            50000,
            5000,
            300,
            "multi-GPU training, NVLink traffic",
        ),
        _profile(
            "vllm-inference", MetricType.MEMORY_USED_PERCENT, 80, 5, 60, "vLLM serving, VRAM in use"
        ),
        _profile(
            "vllm-queue-depth",
            MetricType.VLLM_QUEUE_DEPTH,
            5,
            1,
            30,
            "vLLM serving, requests waiting",
        ),
        _profile(
            "triton-inference",
            MetricType.GPU_UTILIZATION,
            75,
            10,
            30,
            "Triton serving, GPU utilization",
        ),
        _profile(
            "triton-queue-wait",
            MetricType.TRITON_QUEUE_WAIT_MS,
            50,
            5,
            30,
            "Triton serving, queue wait per request",
        ),
        _profile(
            "triton-request-rate",
            MetricType.TRITON_REQUEST_RATE,
            50,
            1,
            30,
            "Triton serving, requests per second",
        ),
        _profile(
            "training",
            MetricType.GPU_UTILIZATION,
            90,
            0,
            300,
            "single-node training, GPU utilization",
        ),
        _profile("batch", MetricType.MEMORY_USED_PERCENT, 70, 1, 30, "batch jobs, VRAM in use"),
        _profile(
            "ollama", MetricType.MEMORY_USED_PERCENT, 70, 3, 60, "Ollama serving, VRAM in use"
        ),
        _profile(
            "tgi-inference", MetricType.MEMORY_USED_PERCENT, 75, 5, 45, "TGI serving, VRAM in use"
        ),
        # Not upstream's. GPM SM activity is the honest "is the GPU computing" signal: on the
        # measured H200 it read 96 % under a matmul loop, 26 % under a light load and 0 during
        # host-to-device copies, while nvmlDeviceGetUtilizationRates said 99, 53 and up to 100.
        # Hopper and newer only; elsewhere the trigger fails with a clear error, not 0.
        _profile(
            "gpu-busy",
            MetricType.SM_ACTIVE,
            70,
            5,
            60,
            "any GPU workload, GPM SM activity (Hopper and newer)",
        ),
        # Demand signals from the engines: queues are counts, so they compose across
        # replicas under AverageValue and can wake a deployment from zero when the endpoint
        # stays up at zero replicas (a router or gateway in front of the engine pods).
        _profile(
            "triton-pending",
            MetricType.TRITON_PENDING_REQUESTS,
            5,
            1,
            30,
            "Triton serving, requests waiting",
        ),
        _profile("tgi-queue", MetricType.TGI_QUEUE_SIZE, 5, 1, 30, "TGI serving, requests waiting"),
        _profile(
            "sglang-queue",
            MetricType.SGLANG_QUEUE_REQUESTS,
            5,
            1,
            30,
            "SGLang serving, requests waiting",
        ),
        _profile(
            "vllm-ttft",
            MetricType.VLLM_TTFT_P95_MS,
            2000,
            0,
            60,
            "vLLM serving, 95th percentile time to first token",
        ),
        # Requests refused at a full queue are demand already lost: one a second per replica
        # asks for another replica, and any refusal is active.
        _profile(
            "vllm-admission-rejections",
            MetricType.VLLM_ADMISSION_REJECTION_RATE,
            1,
            0,
            60,
            "vLLM serving with a queue limit, requests refused per second",
        ),
        _profile(
            "trtllm-queue-depth",
            MetricType.TRTLLM_QUEUE_DEPTH,
            5,
            1,
            30,
            "TensorRT-LLM serving (trtllm-serve), requests waiting",
        ),
        _profile(
            "dynamo-queue",
            MetricType.DYNAMO_QUEUED_REQUESTS,
            5,
            1,
            30,
            "NVIDIA Dynamo frontend, requests waiting for a first response",
        ),
        # The router's queue exists while the pool has no replica: one request held wakes it
        # (activation 0). The cooldown is llm-d's own sample's.
        _profile(
            "llmd-queue",
            MetricType.LLMD_QUEUE_SIZE,
            5,
            0,
            120,
            "llm-d router, requests held for the pool: scale from zero",
        ),
    )
}
