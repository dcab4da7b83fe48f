"""The llm-d router's endpoint picker (EPP): ``GET /metrics`` on its metrics port.

With flow control on, the EPP holds requests that no endpoint of the pool can take in its
flow-control queue, ``llm_d_epp_flow_control_queue_size{fairness_id, priority,
inference_pool, model_name, target_model_name}``: all of them while the pool has no endpoint,
which makes it the signal that exists at zero replicas. A trigger reads the series of one
pool (``inference_pool``) and/or one target model (``target_model_name``), summed over
fairness and priority bands.

The queue's series of a band appear with its first queued request and stay (at 0) after, so
a pool that the EPP knows (by its saturation, ready-endpoint or average gauges, or other
queue series) but that holds nothing has no series: that is a real 0. A pool the EPP does
not know, or a payload without any flow-control family (flow control off, or nothing held
since the EPP started), has no value: never a 0 that would keep a pool at zero for good.

The pool gauges (``llm_d_epp_average_queue_size``, ``_average_kv_cache_utilization``,
``_ready_endpoints``) name the pool in ``name``. Each ``llm_d_epp_`` family is read under
its deprecated name (``inference_extension_``, ``inference_pool_``) only when the new one
has no samples: the EPP writes both with the same values.
"""

from __future__ import annotations

import math

from keda_gpu_scaler.domain.engines import LlmdReading
from keda_gpu_scaler.sources.engines import fields as f
from keda_gpu_scaler.sources.engines import window as w
from keda_gpu_scaler.sources.engines.fields import NO_OPTIONS, Options
from keda_gpu_scaler.sources.engines.promtext import Exposition, PromSample, Selection
from keda_gpu_scaler.sources.engines.window import Absent, Baseline

QUEUE = ("llm_d_epp_flow_control_queue_size", "inference_extension_flow_control_queue_size")
SATURATION = (
    "llm_d_epp_flow_control_pool_saturation",
    "inference_extension_flow_control_pool_saturation",
)
AVERAGE_QUEUE = ("llm_d_epp_average_queue_size", "inference_pool_average_queue_size")
AVERAGE_KV = (
    "llm_d_epp_average_kv_cache_utilization",
    "inference_pool_average_kv_cache_utilization",
)
READY = ("llm_d_epp_ready_endpoints", "inference_pool_ready_pods")
POOL_GAUGES = (AVERAGE_QUEUE, AVERAGE_KV, READY)
SELECTION = Selection(name for pair in (QUEUE, SATURATION, *POOL_GAUGES) for name in pair)
FLOW_CONTROL = "the EPP writes it once flow control has held a request (is flow control enabled?)"


def extract_llmd(
    exposition: Exposition,
    *,
    taken_at: float,
    previous: Baseline | None = None,
    options: Options = NO_OPTIONS,
) -> tuple[LlmdReading, Baseline]:
    def pool_gauge(pair: tuple[str, str]) -> f.Compute:
        return lambda: _pool_gauge(exposition, pair, options.get("inference_pool"))

    def kv_percent() -> float:
        return w.fraction_percent(pool_gauge(AVERAGE_KV)(), AVERAGE_KV[0])

    reading = f.build(
        LlmdReading,
        taken_at,
        {
            "queue_size": f.hinted(lambda: _queue_size(exposition, options), FLOW_CONTROL),
            "average_queue_size": pool_gauge(AVERAGE_QUEUE),
            "average_kv_cache_percent": kv_percent,
            "ready_endpoints": pool_gauge(READY),
        },
    )
    return reading, Baseline(at=taken_at, values={})


def _named(exposition: Exposition, pair: tuple[str, str]) -> tuple[str, list[PromSample]]:
    name = f.newer_or_older(exposition, *pair)
    return name, exposition.named(name)


def _queue_size(exposition: Exposition, options: Options) -> float:
    name, samples = _named(exposition, QUEUE)
    chosen = f.matching(samples, options)
    if chosen:
        return w.gauge_sum(Exposition(tuple(chosen), exposition.declared), name)
    if not samples and not _named(exposition, SATURATION)[1]:
        return w.gauge_sum(exposition, name)  # raises: the family is missing
    pool = options.get("inference_pool")
    if pool is not None and pool not in (known := _pools(exposition)):
        raise Absent(
            f'the router knows no InferencePool "{pool}" (pools: {", ".join(sorted(known))})'
        )
    return 0.0  # flow control runs and holds nothing for this pool or model


def _pools(exposition: Exposition) -> set[str]:
    pools = {
        s.label("inference_pool")
        for pair in (QUEUE, SATURATION)
        for s in _named(exposition, pair)[1]
    }
    pools |= {s.label("name") for pair in POOL_GAUGES for s in _named(exposition, pair)[1]}
    return {p for p in pools if p}


def _pool_gauge(exposition: Exposition, pair: tuple[str, str], pool: str | None) -> float:
    name, samples = _named(exposition, pair)
    if not samples:
        return w.gauge_sum(exposition, name)  # raises: the family is missing
    pools = sorted({s.label("name") or "" for s in samples})
    if pool is None and len(pools) > 1:
        raise Absent(
            f"{name} has several pools ({', '.join(pools)}): choose one with inferencePool"
        )
    chosen = samples if pool is None else f.matching(samples, {"name": pool})
    if not chosen:
        raise Absent(f'{name} has no series of pool "{pool}" (pools: {", ".join(pools)})')
    value = math.fsum(s.value for s in chosen)
    if not math.isfinite(value) or value < 0:
        raise Absent(f"{name} of pool {pools[0] if pool is None else pool} is {value!r}")
    return value
