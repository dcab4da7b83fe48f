"""Sans-I/O: per engine, parsed samples (+ the previous scrape's baseline) -> a typed reading.

Each extractor is ``(exposition, *, taken_at, previous, options) -> (reading, baseline)``:
pure, so the caller (one :class:`EngineSampler` per endpoint) owns the only baseline and
callers never disturb each other's rates; ``options`` are the target's (which series it
reads). Aggregation follows the engines' own process model:

- vLLM: one queue per engine (``engine`` label, data parallel) and per model, so queues
  and running batches are **summed**; the hottest engine saturates first, so KV cache usage
  is the **max**. ``vllm:kv_cache_usage_perc`` is read, the old ``gpu_cache_usage_perc``
  only when the new name has no samples (0.9-0.10 expose both: never add them). While an
  engine sleeps (``vllm:engine_sleep_state``) its levels say nothing of demand: no value.
- Triton: Σ pending requests; queue wait per **request** (Δqueue_us / Δrequest_success,
  not / Δinference_count, which counts batch items); request rate = Δ(success + failure)/Δt.
- TGI: the router's queue and running batch (one process, no labels).
- SGLang: ranks of one scheduler (``tp_rank``, ``pp_rank``, ``moe_ep_rank``) repeat one
  queue, so **max** over them; with priority scheduling the total (``priority=""``) counts,
  never its per-priority split beside it; then **Σ** over data-parallel schedulers
  (``dp_rank``); token usage the highest rank (rounded to 0.01 by SGLang itself).

- TensorRT-LLM, the Dynamo frontend and the llm-d router: their own modules
  (``trtllm``, ``dynamo``, ``llmd``).

Fractions (vLLM ``*_perc``, SGLang ``token_usage``) are 0..1 and become percent; a value
above 1 is refused rather than guessed at.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

from keda_gpu_scaler.domain.engines import (
    EngineKind,
    EngineReading,
    SglangReading,
    TgiReading,
    TritonReading,
    VllmReading,
)
from keda_gpu_scaler.sources.engines import dynamo, llmd, trtllm
from keda_gpu_scaler.sources.engines import fields as f
from keda_gpu_scaler.sources.engines import window as w
from keda_gpu_scaler.sources.engines.fields import FIRST_SCRAPE, NO_OPTIONS, Options
from keda_gpu_scaler.sources.engines.promtext import Exposition, Labels, Selection
from keda_gpu_scaler.sources.engines.window import Absent, Baseline, Window


class Extractor(Protocol):
    def __call__(
        self,
        exposition: Exposition,
        *,
        taken_at: float,
        previous: Baseline | None = None,
        options: Options = NO_OPTIONS,
    ) -> tuple[EngineReading, Baseline]: ...


VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_BY_REASON = "vllm:num_requests_waiting_by_reason"
VLLM_ADMISSION = "vllm:admission_rejections"
VLLM_SLEEP = "vllm:engine_sleep_state"
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
TRITON_FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
TRITON_FIRST_RESPONSE_HINT = (
    "Triton writes it for decoupled models only, with --metrics-config histogram_latencies=true"
)

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
_VLLM_COUNTERS = (
    VLLM_PREEMPTIONS,
    VLLM_ADMISSION + "_total",
    *(n for family in _VLLM_HISTOGRAMS for n in w.histogram_names(family)),
)
_VLLM_LEVELS = (VLLM_WAITING, VLLM_BY_REASON, VLLM_RUNNING, VLLM_KV, VLLM_KV_OLD, VLLM_SLEEP)
_TRITON_FAMILIES = (
    TRITON_QUEUE_US,
    TRITON_SUCCESS,
    TRITON_FAILURE,
    TRITON_ITEMS,
    TRITON_FIRST_RESPONSE,
)
_TRITON_COUNTERS = (*_TRITON_FAMILIES[:-1], *w.histogram_names(TRITON_FIRST_RESPONSE))

SELECTIONS: dict[EngineKind, Selection] = {
    EngineKind.VLLM: Selection(
        (*_VLLM_LEVELS, VLLM_PREEMPTIONS, VLLM_ADMISSION, *_VLLM_HISTOGRAMS)
    ),
    EngineKind.TRITON: Selection((TRITON_PENDING, *_TRITON_FAMILIES)),
    EngineKind.TGI: Selection((TGI_QUEUE, TGI_BATCH)),
    EngineKind.SGLANG: Selection((SGLANG_QUEUE, SGLANG_RUNNING, SGLANG_TOKEN_USAGE)),
    EngineKind.TRTLLM: trtllm.SELECTION,
    EngineKind.DYNAMO: dynamo.selection(),
    EngineKind.LLMD: llmd.SELECTION,
}
"""The families each engine's extractor reads: pass to ``parse_exposition`` (a Dynamo
frontend with another prefix: :func:`selection_for`)."""


# --- vLLM ---------------------------------------------------------------------------------


def extract_vllm(
    exposition: Exposition,
    *,
    taken_at: float,
    previous: Baseline | None = None,
    options: Options = NO_OPTIONS,
) -> tuple[VllmReading, Baseline]:
    window, baseline = f.advance(exposition, _VLLM_COUNTERS, taken_at, previous)
    asleep = _vllm_asleep(exposition)

    def awake(compute: f.Compute) -> f.Compute:
        # A sleeping engine's queue and cache read 0: no measure of demand, never "idle".
        return compute if not asleep else lambda: _raise(_asleep_reason(asleep))

    reading = f.build(
        VllmReading,
        taken_at,
        {
            "queue_depth": awake(lambda: w.gauge_sum(exposition, VLLM_WAITING)),
            "queue_capacity": awake(lambda: _vllm_waiting(exposition, "capacity")),
            "queue_deferred": awake(lambda: _vllm_waiting(exposition, "deferred")),
            "running": awake(lambda: w.gauge_sum(exposition, VLLM_RUNNING)),
            "kv_cache_usage_percent": awake(lambda: _vllm_kv_percent(exposition)),
            "queue_time_mean_s": lambda: f.mean(window, VLLM_QUEUE_TIME),
            "queue_time_p95_s": lambda: f.quantile(window, VLLM_QUEUE_TIME),
            "ttft_mean_s": lambda: f.mean(window, VLLM_TTFT),
            "ttft_p95_s": lambda: f.quantile(window, VLLM_TTFT),
            "preemptions_per_s": awake(lambda: f.rate(window, VLLM_PREEMPTIONS)),
            "admission_rejections_per_s": lambda: f.rate(window, VLLM_ADMISSION + "_total"),
            "engines_asleep": lambda: _vllm_engines_asleep(exposition, asleep),
        },
    )
    return reading, baseline


def _raise(reason: str) -> float:
    raise Absent(reason)


def _vllm_kv_percent(exposition: Exposition) -> float:
    # 0.9-0.10 export both names; 0.12 and later only the new one.
    name = f.newer_or_older(exposition, VLLM_KV, VLLM_KV_OLD)
    return w.fraction_percent(w.gauge_max(exposition, name), name)


def _vllm_waiting(exposition: Exposition, reason: str) -> float:
    samples = exposition.named(VLLM_BY_REASON)
    if not samples:
        return w.gauge_sum(exposition, VLLM_BY_REASON)  # raises the precise absence
    chosen = f.matching(samples, {"reason": reason})
    if not chosen:
        raise Absent(f'{VLLM_BY_REASON} has no reason="{reason}" series')
    return w.gauge_sum(Exposition(tuple(chosen), exposition.declared), VLLM_BY_REASON)


def _vllm_asleep(exposition: Exposition) -> list[str]:
    """The engines whose ``vllm:engine_sleep_state{sleep_state="awake"}`` is 0, in words."""
    states: dict[Labels, dict[str, float]] = defaultdict(dict)
    for s in exposition.named(VLLM_SLEEP):
        engine = tuple(p for p in s.labels if p[0] != "sleep_state")
        states[engine][s.label("sleep_state") or ""] = s.value
    asleep = []
    for engine, state in states.items():
        if state.get("awake") != 0.0:
            continue
        labels = dict(engine)
        who = f"engine {labels.get('engine', '0')}"
        if "__address__" in labels:
            who += f" of {labels['__address__']}"
        if state.get("discard_all") == 1.0:
            who += " (level 2: weights and KV cache discarded)"
        elif state.get("weights_offloaded") == 1.0:
            who += " (level 1: weights offloaded)"
        else:
            who += " (KV cache released)"
        asleep.append(who)
    return sorted(asleep)


def _asleep_reason(asleep: list[str]) -> str:
    return (
        f"vLLM is asleep: {', '.join(asleep)}; a sleeping engine's queue and cache say nothing "
        "of demand: wake it (POST /wake_up) or scale on another trigger"
    )


def _vllm_engines_asleep(exposition: Exposition, asleep: list[str]) -> float:
    if not exposition.named(VLLM_SLEEP):
        return w.gauge_sum(exposition, VLLM_SLEEP)  # raises the precise absence
    return float(len(asleep))


# --- Triton -------------------------------------------------------------------------------


def extract_triton(
    exposition: Exposition,
    *,
    taken_at: float,
    previous: Baseline | None = None,
    options: Options = NO_OPTIONS,
) -> tuple[TritonReading, Baseline]:
    window, baseline = f.advance(exposition, _TRITON_COUNTERS, taken_at, previous)
    reading = f.build(
        TritonReading,
        taken_at,
        {
            "pending_requests": lambda: w.gauge_sum(exposition, TRITON_PENDING),
            "queue_wait_ms": lambda: _triton_queue_wait_ms(w.require(window, FIRST_SCRAPE)),
            "request_rate": lambda: _triton_request_rate(w.require(window, FIRST_SCRAPE)),
            "inference_rate": lambda: f.rate(window, TRITON_ITEMS),
            "first_response_p95_ms": f.hinted(
                lambda: f.quantile(window, TRITON_FIRST_RESPONSE), TRITON_FIRST_RESPONSE_HINT
            ),
        },
    )
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
    exposition: Exposition,
    *,
    taken_at: float,
    previous: Baseline | None = None,
    options: Options = NO_OPTIONS,
) -> tuple[TgiReading, Baseline]:
    reading = f.build(
        TgiReading,
        taken_at,
        {
            "queue_size": lambda: w.gauge_sum(exposition, TGI_QUEUE),
            "batch_size": lambda: w.gauge_sum(exposition, TGI_BATCH),
        },
    )
    return reading, Baseline(at=taken_at, values={})


def extract_sglang(
    exposition: Exposition,
    *,
    taken_at: float,
    previous: Baseline | None = None,
    options: Options = NO_OPTIONS,
) -> tuple[SglangReading, Baseline]:
    reading = f.build(
        SglangReading,
        taken_at,
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
        },
    )
    return reading, Baseline(at=taken_at, values={})


EXTRACTORS: dict[EngineKind, Extractor] = {
    EngineKind.VLLM: extract_vllm,
    EngineKind.TRITON: extract_triton,
    EngineKind.TGI: extract_tgi,
    EngineKind.SGLANG: extract_sglang,
    EngineKind.TRTLLM: trtllm.extract_trtllm,
    EngineKind.DYNAMO: dynamo.extract_dynamo,
    EngineKind.LLMD: llmd.extract_llmd,
}


def selection_for(kind: EngineKind, options: Options = NO_OPTIONS) -> Selection:
    """The families ``kind``'s extractor reads from a target with ``options``."""
    if kind is EngineKind.DYNAMO:
        return dynamo.selection(options.get("prefix", dynamo.DEFAULT_PREFIX))
    return SELECTIONS[kind]


def extract(
    kind: EngineKind,
    exposition: Exposition,
    *,
    taken_at: float,
    previous: Baseline | None,
    options: Options = NO_OPTIONS,
) -> tuple[EngineReading, Baseline]:
    """The reading of ``kind`` from one (or a merged, pod-tagged) exposition."""
    return EXTRACTORS[kind](exposition, taken_at=taken_at, previous=previous, options=options)
