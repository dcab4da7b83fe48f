"""Sans-I/O: per engine, parsed samples (+ the previous scrape's baseline) -> a typed reading.

Each extractor is ``(exposition, *, taken_at, previous) -> (reading, baseline)``: pure, so
the caller (one :class:`EngineSampler` per endpoint) owns the only baseline and callers
never disturb each other's rates. Aggregation follows the engines' own process model:

- vLLM: one queue per engine (``engine`` label, data parallel) and per model, so queues
  and running batches are **summed**; the hottest engine saturates first, so KV cache usage
  is the **max**. ``vllm:kv_cache_usage_perc`` is read, the old ``gpu_cache_usage_perc``
  only when the new name has no samples (0.9-0.10 expose both: never add them).
- Triton: Σ pending requests; queue wait per **request** (Δqueue_us / Δrequest_success,
  not / Δinference_count, which counts batch items); request rate = Δ(success + failure)/Δt.
- TGI: the router's queue and running batch (one process, no labels).
- SGLang: ranks of one scheduler (``tp_rank``, ``pp_rank``, ``moe_ep_rank``) repeat one
  queue, so **max** over them; with priority scheduling the total (``priority=""``) counts,
  never its per-priority split beside it; then **Σ** over data-parallel schedulers
  (``dp_rank``); token usage the highest rank (rounded to 0.01 by SGLang itself).

Fractions (vLLM ``*_perc``, SGLang ``token_usage``) are 0..1 and become percent; a value
above 1 is refused rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from keda_gpu_scaler.domain.engines import (
    EngineKind,
    EngineReading,
    SglangReading,
    TgiReading,
    TritonReading,
    VllmReading,
)
from keda_gpu_scaler.sources.engines import window as w
from keda_gpu_scaler.sources.engines.promtext import Exposition, Selection
from keda_gpu_scaler.sources.engines.window import Absent, Baseline, Window


class Extractor(Protocol):
    def __call__(
        self, exposition: Exposition, *, taken_at: float, previous: Baseline | None = None
    ) -> tuple[EngineReading, Baseline]: ...


QUANTILE = 0.95
"""The quantile of vLLM latency histograms (p95, as the reference dashboards use)."""
FIRST_SCRAPE = "first scrape: a rate needs two scrapes"

VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_KV = "vllm:kv_cache_usage_perc"
VLLM_KV_OLD = "vllm:gpu_cache_usage_perc"
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"
VLLM_QUEUE_TIME = "vllm:request_queue_time_seconds"
VLLM_TTFT = "vllm:time_to_first_token_seconds"

TRITON_PENDING = "nv_inference_pending_request_count"
TRITON_QUEUE_US = "nv_inference_queue_duration_us"
TRITON_SUCCESS = "nv_inference_request_success"
TRITON_FAILURE = "nv_inference_request_failure"
TRITON_ITEMS = "nv_inference_count"

TGI_QUEUE = "tgi_queue_size"
TGI_BATCH = "tgi_batch_current_size"

SGLANG_QUEUE = "sglang:num_queue_reqs"
SGLANG_RUNNING = "sglang:num_running_reqs"
SGLANG_TOKEN_USAGE = "sglang:token_usage"
SGLANG_RANKS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank"})
"""Ranks of one scheduler: with ``--enable-metrics-for-all-schedulers`` each reports its queue."""
SGLANG_SPLIT = "priority"
"""Priority scheduling writes each queue's total under ``priority=""`` and a split beside it."""

_VLLM_HISTOGRAMS = (VLLM_QUEUE_TIME, VLLM_TTFT)
_VLLM_COUNTERS = (VLLM_PREEMPTIONS, *(n for f in _VLLM_HISTOGRAMS for n in w.histogram_names(f)))
_TRITON_COUNTERS = (TRITON_QUEUE_US, TRITON_SUCCESS, TRITON_FAILURE, TRITON_ITEMS)

SELECTIONS: dict[EngineKind, Selection] = {
    EngineKind.VLLM: Selection(
        (VLLM_WAITING, VLLM_RUNNING, VLLM_KV, VLLM_KV_OLD, VLLM_PREEMPTIONS, *_VLLM_HISTOGRAMS)
    ),
    EngineKind.TRITON: Selection((TRITON_PENDING, *_TRITON_COUNTERS)),
    EngineKind.TGI: Selection((TGI_QUEUE, TGI_BATCH)),
    EngineKind.SGLANG: Selection((SGLANG_QUEUE, SGLANG_RUNNING, SGLANG_TOKEN_USAGE)),
}
"""The families each engine's extractor reads: pass to ``parse_exposition``."""


def _build(cls: type[Any], taken_at: float, results: dict[str, float | str]) -> Any:
    values, reasons = w.split(results)
    return cls(taken_at=taken_at, reasons=reasons, **values)


def _advance(
    exposition: Exposition, names: Iterable[str], taken_at: float, previous: Baseline | None
) -> tuple[Window | None, Baseline]:
    current = w.take_baseline(exposition, names, taken_at)
    return w.window_between(previous, current), current


# --- vLLM ---------------------------------------------------------------------------------


def extract_vllm(
    exposition: Exposition, *, taken_at: float, previous: Baseline | None = None
) -> tuple[VllmReading, Baseline]:
    window, baseline = _advance(exposition, _VLLM_COUNTERS, taken_at, previous)
    results = w.fill(
        {
            "queue_depth": lambda: w.gauge_sum(exposition, VLLM_WAITING),
            "running": lambda: w.gauge_sum(exposition, VLLM_RUNNING),
            "kv_cache_usage_percent": lambda: _vllm_kv_percent(exposition),
            "queue_time_mean_s": lambda: _mean(window, VLLM_QUEUE_TIME),
            "queue_time_p95_s": lambda: _quantile(window, VLLM_QUEUE_TIME),
            "ttft_mean_s": lambda: _mean(window, VLLM_TTFT),
            "ttft_p95_s": lambda: _quantile(window, VLLM_TTFT),
            "preemptions_per_s": lambda: _rate(window, VLLM_PREEMPTIONS),
        }
    )
    reading: VllmReading = _build(VllmReading, taken_at, results)
    return reading, baseline


def _vllm_kv_percent(exposition: Exposition) -> float:
    # Fall back on the old name only when the new one has no samples: 0.9-0.10 export both.
    use_old = not exposition.named(VLLM_KV) and bool(exposition.named(VLLM_KV_OLD))
    name = VLLM_KV_OLD if use_old else VLLM_KV
    return w.fraction_percent(w.gauge_max(exposition, name), name)


def _rate(window: Window | None, name: str) -> float:
    return w.rate(w.require(window, FIRST_SCRAPE), [name])


def _mean(window: Window | None, family: str) -> float:
    hist = w.histogram_delta(w.require(window, FIRST_SCRAPE), family)
    return w.histogram_mean(hist, family)


def _quantile(window: Window | None, family: str) -> float:
    hist = w.histogram_delta(w.require(window, FIRST_SCRAPE), family)
    return w.histogram_quantile(QUANTILE, hist, family)


# --- Triton -------------------------------------------------------------------------------


def extract_triton(
    exposition: Exposition, *, taken_at: float, previous: Baseline | None = None
) -> tuple[TritonReading, Baseline]:
    window, baseline = _advance(exposition, _TRITON_COUNTERS, taken_at, previous)
    results = w.fill(
        {
            "pending_requests": lambda: w.gauge_sum(exposition, TRITON_PENDING),
            "queue_wait_ms": lambda: _triton_queue_wait_ms(w.require(window, FIRST_SCRAPE)),
            "request_rate": lambda: _triton_request_rate(w.require(window, FIRST_SCRAPE)),
            "inference_rate": lambda: _rate(window, TRITON_ITEMS),
        }
    )
    reading: TritonReading = _build(TritonReading, taken_at, results)
    return reading, baseline


def _triton_queue_wait_ms(window: Window) -> float:
    queue_us, requests = w.paired_deltas(window, TRITON_QUEUE_US, TRITON_SUCCESS)
    if requests <= 0:
        raise Absent("no request succeeded in the window: queue wait per request is undefined")
    return queue_us / requests / 1000.0


def _triton_request_rate(window: Window) -> float:
    success = w.counter_delta(window, TRITON_SUCCESS)
    # Failure series come and go with their ``reason`` label; count the ones with a delta.
    failure = sum(d for (name, _), d in window.deltas.items() if name == TRITON_FAILURE)
    return (success + failure) / window.dt


# --- TGI and SGLang (levels only) ---------------------------------------------------------


def extract_tgi(
    exposition: Exposition, *, taken_at: float, previous: Baseline | None = None
) -> tuple[TgiReading, Baseline]:
    results = w.fill(
        {
            "queue_size": lambda: w.gauge_sum(exposition, TGI_QUEUE),
            "batch_size": lambda: w.gauge_sum(exposition, TGI_BATCH),
        }
    )
    reading: TgiReading = _build(TgiReading, taken_at, results)
    return reading, Baseline(at=taken_at, values={})


def extract_sglang(
    exposition: Exposition, *, taken_at: float, previous: Baseline | None = None
) -> tuple[SglangReading, Baseline]:
    results = w.fill(
        {
            "queue_requests": lambda: w.gauge_per_scheduler(
                exposition, SGLANG_QUEUE, SGLANG_RANKS, SGLANG_SPLIT
            ),
            "running_requests": lambda: w.gauge_per_scheduler(
                exposition, SGLANG_RUNNING, SGLANG_RANKS, SGLANG_SPLIT
            ),
            "token_usage_percent": lambda: w.fraction_percent(
                w.gauge_max(exposition, SGLANG_TOKEN_USAGE), SGLANG_TOKEN_USAGE
            ),
        }
    )
    reading: SglangReading = _build(SglangReading, taken_at, results)
    return reading, Baseline(at=taken_at, values={})


EXTRACTORS: dict[EngineKind, Extractor] = {
    EngineKind.VLLM: extract_vllm,
    EngineKind.TRITON: extract_triton,
    EngineKind.TGI: extract_tgi,
    EngineKind.SGLANG: extract_sglang,
}


def extract(
    kind: EngineKind, exposition: Exposition, *, taken_at: float, previous: Baseline | None
) -> tuple[EngineReading, Baseline]:
    """The reading of ``kind`` from one (or a merged, pod-tagged) exposition."""
    return EXTRACTORS[kind](exposition, taken_at=taken_at, previous=previous)
