"""TensorRT-LLM's ``trtllm-serve``: ``GET /prometheus/metrics``, prefix ``trtllm_``.

The server mounts the endpoint only with ``return_perf_metrics: true`` and renders it through
prometheus_client's multiprocess collector, so its gauges carry a ``pid`` label. The queue,
running and KV-cache gauges are set from iteration statistics, which it collects only with
``enable_iter_perf_stats: true``: without them the gauges are never written and their
families are missing, which the reading says, rather than 0. Counts are summed over series,
levels the highest; latencies come from the histograms between two scrapes.
"""

from __future__ import annotations

from keda_gpu_scaler.domain.engines import TrtllmReading
from keda_gpu_scaler.sources.engines import fields as f
from keda_gpu_scaler.sources.engines import window as w
from keda_gpu_scaler.sources.engines.fields import NO_OPTIONS, Options
from keda_gpu_scaler.sources.engines.promtext import Exposition, Selection
from keda_gpu_scaler.sources.engines.window import Baseline

WAITING = "trtllm_num_requests_waiting"
RUNNING = "trtllm_num_requests_running"
KV_UTILIZATION = "trtllm_kv_cache_utilization"
KV_HIT_RATE = "trtllm_kv_cache_hit_rate"
QUEUE_TIME = "trtllm_request_queue_time_seconds"
TTFT = "trtllm_time_to_first_token_seconds"
ITER_STATS = "trtllm-serve writes it only with enable_iter_perf_stats: true in its LLM API options"

_HISTOGRAMS = (QUEUE_TIME, TTFT)
SELECTION = Selection((WAITING, RUNNING, KV_UTILIZATION, KV_HIT_RATE, *_HISTOGRAMS))
_COUNTERS = tuple(n for family in _HISTOGRAMS for n in w.histogram_names(family))


def extract_trtllm(
    exposition: Exposition,
    *,
    taken_at: float,
    previous: Baseline | None = None,
    options: Options = NO_OPTIONS,
) -> tuple[TrtllmReading, Baseline]:
    window, baseline = f.advance(exposition, _COUNTERS, taken_at, previous)

    def percent(name: str) -> f.Compute:
        return f.hinted(lambda: w.fraction_percent(w.gauge_max(exposition, name), name), ITER_STATS)

    reading = f.build(
        TrtllmReading,
        taken_at,
        {
            "queue_depth": f.hinted(lambda: w.gauge_sum(exposition, WAITING), ITER_STATS),
            "running": f.hinted(lambda: w.gauge_sum(exposition, RUNNING), ITER_STATS),
            "kv_cache_usage_percent": percent(KV_UTILIZATION),
            "kv_cache_hit_rate_percent": percent(KV_HIT_RATE),
            "queue_time_mean_s": lambda: f.mean(window, QUEUE_TIME),
            "ttft_p95_s": lambda: f.quantile(window, TTFT),
        },
    )
    return reading, baseline
