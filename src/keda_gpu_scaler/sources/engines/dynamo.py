"""The NVIDIA Dynamo frontend: ``GET /metrics``, prefix ``dynamo_frontend`` unless
``DYN_METRICS_PREFIX`` changes it (the target's ``prefix`` option).

``{prefix}_queued_requests`` counts requests in the frontend's HTTP queue, before their first
response; ``{prefix}_inflight_requests`` those on their way to the engines; both carry the
label ``model``. A trigger may read one model (the ``model`` option); otherwise every model's
series are summed. The frontend creates a model's series with its first request, so a model
without series is named with the models it has, never read as 0. Dynamo's workers pass
their engine's own series through (vLLM, SGLang, TensorRT-LLM): read those with the engine's
own endpoint key.
"""

from __future__ import annotations

import functools

from keda_gpu_scaler.domain.engines import DynamoReading
from keda_gpu_scaler.sources.engines import fields as f
from keda_gpu_scaler.sources.engines import window as w
from keda_gpu_scaler.sources.engines.fields import NO_OPTIONS, Options
from keda_gpu_scaler.sources.engines.promtext import Exposition, Selection
from keda_gpu_scaler.sources.engines.window import Absent, Baseline

DEFAULT_PREFIX = "dynamo_frontend"
QUEUED = "queued_requests"
INFLIGHT = "inflight_requests"
TTFT = "time_to_first_token_seconds"


@functools.lru_cache(maxsize=64)
def selection(prefix: str = DEFAULT_PREFIX) -> Selection:
    return Selection(f"{prefix}_{name}" for name in (QUEUED, INFLIGHT, TTFT))


def extract_dynamo(
    exposition: Exposition,
    *,
    taken_at: float,
    previous: Baseline | None = None,
    options: Options = NO_OPTIONS,
) -> tuple[DynamoReading, Baseline]:
    prefix = options.get("prefix", DEFAULT_PREFIX)
    queued, inflight, ttft = (f"{prefix}_{name}" for name in (QUEUED, INFLIGHT, TTFT))
    model = options.get("model")
    chosen = exposition
    if model is not None:
        kept = f.matching(list(exposition.samples), {"model": model})
        chosen = Exposition(tuple(kept), exposition.declared)
    names = w.histogram_names(ttft)
    window, baseline = f.advance(chosen, names, taken_at, previous)
    hint = f"the frontend writes it from its first request on (metric prefix {prefix})"

    def of_model(name: str, compute: f.Compute) -> f.Compute:
        def run() -> float:
            if model is not None and not chosen.named(name) and exposition.named(name):
                models = ", ".join(sorted({s.label("model") or "" for s in exposition.named(name)}))
                raise Absent(f'{name} has no series of model "{model}" (models: {models})')
            return compute()

        return f.hinted(run, hint)

    reading = f.build(
        DynamoReading,
        taken_at,
        {
            "queued": of_model(queued, lambda: w.gauge_sum(chosen, queued)),
            "inflight": of_model(inflight, lambda: w.gauge_sum(chosen, inflight)),
            "ttft_p95_s": of_model(names[0], lambda: f.quantile(window, ttft)),
        },
    )
    return reading, baseline
