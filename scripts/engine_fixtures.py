"""Render the engine payloads of tests/fixtures/engines/ that are built from an engine's own
metric declarations rather than copied from a capture.

Each payload declares the families exactly as the engine's source does at the release or
commit named in tests/fixtures/engines/README.md (name, type, HELP text, label names and their
order, prometheus_client's multiprocess mode where the engine uses it) and renders them the way
the engine's exporter does: prometheus_client for vLLM, SGLang and TensorRT-LLM (in
multiprocess mode where the engine sets ``PROMETHEUS_MULTIPROC_DIR``), the text formats of the
Rust ``prometheus`` crate (NVIDIA Dynamo) and of Go's client_golang (the llm-d router) for the
others. The values are chosen to exercise the scaler's rules; they were not captured.

    .venv/bin/python scripts/engine_fixtures.py        # rewrites the files

Needs prometheus-client (a test extra). The ``_created`` samples of the single-process
payloads carry the time of rendering.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "engines"

# --- SGLang 0.5.23 (sglang/srt/observability/metrics_collector.py) ---------------------------

SGLANG_MODEL = "Qwen/Qwen3-30B-A3B"
# --dp-size 2 --tp-size 2 --ep-size 2 --enable-priority-scheduling
# --enable-metrics-for-all-schedulers: every scheduler (dp_rank, tp_rank) reports, moe_ep_rank
# follows tp_rank, and each queue is written as a total (priority="") and per priority.
SGLANG_SCHEDULERS = {
    # dp_rank: (queue by priority, running by priority, token_usage, full_token_usage)
    0: ({0: 4, 5: 3}, {0: 16, 5: 0}, 0.47, 0.4713),
    1: ({0: 2, 5: 0}, {0: 9, 5: 0}, 0.31, 0.3088),
}


def sglang(registry: Any) -> None:
    from prometheus_client import Counter, Gauge

    names = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "priority"]
    names.append("dp_rank")

    def gauge(name: str, help_text: str) -> Any:
        return Gauge(name, help_text, names, multiprocess_mode="mostrecent", registry=registry)

    running = gauge("sglang:num_running_reqs", "The number of running requests.")
    queue = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
    grammar = gauge(
        "sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue."
    )
    usage = gauge("sglang:token_usage", "The token usage.")
    full = gauge("sglang:full_token_usage", "The token usage for full attention layers.")
    used = gauge("sglang:num_used_tokens", "The number of used tokens.")
    for dp_rank, (queued, runs, token_usage, full_usage) in SGLANG_SCHEDULERS.items():
        for tp_rank in (0, 1):
            base = {
                "model_name": SGLANG_MODEL,
                "engine_type": "unified",
                "tp_rank": str(tp_rank),
                "pp_rank": "0",
                "moe_ep_rank": str(tp_rank),
                "priority": "",
                "dp_rank": str(dp_rank),
            }
            for metric, split in ((queue, queued), (running, runs)):
                metric.labels(**base).set(sum(split.values()))
                for priority, value in split.items():
                    metric.labels(**(base | {"priority": str(priority)})).set(value)
            grammar.labels(**base).set(0)
            usage.labels(**base).set(token_usage)
            full.labels(**base).set(full_usage)
            used.labels(**base).set(round(full_usage * 262144))
    requests = Counter(
        "sglang:num_requests_total",
        "Number of requests processed.",
        ["model_name", "engine_type", "priority", "is_streaming"],
        registry=registry,
    )
    for priority, count in (("0", 812), ("5", 97)):
        labels = {"model_name": SGLANG_MODEL, "engine_type": "unified", "priority": priority}
        requests.labels(**labels, is_streaming="true").inc(count)


# --- vLLM 0.34.0 (vllm/v1/metrics/loggers.py, buckets.py) ------------------------------------

VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5)
TTFT_BUCKETS += (5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0)
LATENCY_BUCKETS += (60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# engine: (running, waiting capacity, waiting deferred, kv usage, ttft observations)
VLLM_ENGINES = {
    0: (48, 5, 1, 0.912, (0.08, 0.2, 0.31, 1.7)),
    1: (41, 2, 0, 0.637, (0.05, 0.09, 0.6)),
}


def vllm_awake(registry: Any) -> None:
    _vllm(registry, sleep=0, level=0)


def vllm_asleep(registry: Any) -> None:
    _vllm(registry, sleep=1, level=1)


def _vllm(registry: Any, *, sleep: int, level: int) -> None:
    from prometheus_client import Counter, Gauge, Histogram

    names = ["model_name", "engine"]

    def gauge(name: str, help_text: str, extra: Iterable[str] = ()) -> Any:
        labelnames = [*names, *extra]
        return Gauge(name, help_text, labelnames, multiprocess_mode="mostrecent", registry=registry)

    running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
    waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
    by_reason = gauge(
        "vllm:num_requests_waiting_by_reason",
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
        "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
        "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
        ["reason"],
    )
    sleep_state = gauge(
        "vllm:engine_sleep_state",
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
        "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        ["sleep_state"],
    )
    kv = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
    preemptions = Counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        names,
        registry=registry,
    )
    rejections = Counter(
        "vllm:admission_rejections",
        "Number of admission attempts rejected by a queue limit, by reason.",
        ["model_name", "reason"],
        registry=registry,
    )
    ttft = Histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        names,
        buckets=TTFT_BUCKETS,
        registry=registry,
    )
    queue_time = Histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        names,
        buckets=LATENCY_BUCKETS,
        registry=registry,
    )
    asleep = sleep == 1
    for engine, (runs, capacity, deferred, usage, firsts) in VLLM_ENGINES.items():
        labels = {"model_name": VLLM_MODEL, "engine": str(engine)}
        running.labels(**labels).set(0 if asleep else runs)
        waiting.labels(**labels).set(0 if asleep else capacity + deferred)
        by_reason.labels(**labels, reason="capacity").set(0 if asleep else capacity)
        by_reason.labels(**labels, reason="deferred").set(0 if asleep else deferred)
        states = {
            "discard_all": int(asleep and level == 2),
            "weights_offloaded": int(asleep and level == 1),
            "awake": int(not asleep),
        }
        for state, value in states.items():
            sleep_state.labels(**labels, sleep_state=state).set(value)
        kv.labels(**labels).set(0.0 if asleep else usage)
        preemptions.labels(**labels).inc(3 * engine)
        for seconds in firsts:
            ttft.labels(**labels).observe(seconds)
            queue_time.labels(**labels).observe(seconds / 2)
    rejections.labels(model_name=VLLM_MODEL, reason="max_num_queued_reqs").inc(17)
    rejections.labels(model_name=VLLM_MODEL, reason="max_num_queued_tokens")


# --- TensorRT-LLM (tensorrt_llm/metrics/collector.py, serve/openai_server.py) ----------------

TRTLLM_LABELS = {"model_name": "undefined", "engine_type": "undefined"}
TRTLLM_TTFT_BUCKETS = TTFT_BUCKETS


def trtllm_iter_stats(registry: Any) -> None:
    _trtllm(registry, iteration_stats=True)


def trtllm_no_iter_stats(registry: Any) -> None:
    _trtllm(registry, iteration_stats=False)


def _trtllm(registry: Any, *, iteration_stats: bool) -> None:
    from prometheus_client import Counter, Gauge, Histogram

    names = list(TRTLLM_LABELS)

    def gauge(name: str, help_text: str) -> Any:
        return Gauge("trtllm_" + name, help_text, names, registry=registry)

    success = Counter(
        "trtllm_request_success_total",
        "Count of successfully processed requests.",
        [*names, "finished_reason"],
        registry=registry,
    )
    ttft = Histogram(
        "trtllm_time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        names,
        buckets=TRTLLM_TTFT_BUCKETS,
        registry=registry,
    )
    queue_time = Histogram(
        "trtllm_request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        names,
        buckets=LATENCY_BUCKETS,
        registry=registry,
    )
    cached = Counter(
        "trtllm_prompt_cached_tokens_total",
        "Process-lifetime total prompt tokens served from KV cache. Resets only when the "
        "serving process restarts, not when the KV cache is flushed or evicted.",
        names,
        registry=registry,
    )
    hit_rate = gauge("kv_cache_hit_rate", "KV cache hit rate")
    utilization = gauge("kv_cache_utilization", "KV cache utilization")
    running = gauge("num_requests_running", "Number of active requests")
    waiting = gauge("num_requests_waiting", "Number of queued requests")
    cached.labels(**TRTLLM_LABELS)  # created at construction, as the collector does
    success.labels(**TRTLLM_LABELS, finished_reason="stop").inc(211)
    success.labels(**TRTLLM_LABELS, finished_reason="length").inc(14)
    for seconds in (0.04, 0.09, 0.11, 0.3, 0.7):
        ttft.labels(**TRTLLM_LABELS).observe(seconds)
        queue_time.labels(**TRTLLM_LABELS).observe(seconds / 4)
    cached.labels(**TRTLLM_LABELS).inc(30_720)
    if iteration_stats:
        running.labels(**TRTLLM_LABELS).set(64)
        waiting.labels(**TRTLLM_LABELS).set(11)
        utilization.labels(**TRTLLM_LABELS).set(0.8125)
        hit_rate.labels(**TRTLLM_LABELS).set(0.42)


# --- NVIDIA Dynamo frontend (lib/llm/src/http/service/metrics.rs) ----------------------------

DYNAMO_MODELS = {"Qwen/Qwen3-0.6B": (3, 12, (0.05, 0.2, 0.2, 1.1)), "llama-3-8b": (0, 2, (0.3,))}


def dynamo_frontend() -> str:
    """The frontend's families in the Rust prometheus crate's text format."""
    ttft_bounds = _dynamo_log_buckets(0.001, 480.0, 18)
    lines: list[str] = []
    _family(lines, "requests_total", "counter", "Total number of LLM requests processed")
    for model, (_, inflight, firsts) in DYNAMO_MODELS.items():
        labels = {
            "model": model,
            "endpoint": "chat_completions",
            "request_type": "stream",
            "status": "success",
            "error_type": "",
        }
        total = len(firsts) + inflight
        lines.append(f"dynamo_frontend_requests_total{_rust_labels(labels)} {total}")
    _family(lines, "inflight_requests", "gauge", "Number of inflight requests")
    for model, (_, inflight, _firsts) in DYNAMO_MODELS.items():
        model_label = _rust_labels({"model": model})
        lines.append(f"dynamo_frontend_inflight_requests{model_label} {inflight}")
    _family(lines, "queued_requests", "gauge", "Number of requests in HTTP processing queue")
    for model, (queued, _, _firsts) in DYNAMO_MODELS.items():
        lines.append(f"dynamo_frontend_queued_requests{_rust_labels({'model': model})} {queued}")
    _family(lines, "disconnected_clients", "gauge", "Number of disconnected clients")
    lines.append("dynamo_frontend_disconnected_clients 1")
    _family(lines, "time_to_first_token_seconds", "histogram", "Time to first token in seconds")
    for model, (_, _, firsts) in DYNAMO_MODELS.items():
        name = "dynamo_frontend_time_to_first_token_seconds"
        for bound in [*ttft_bounds, math.inf]:
            count = sum(1 for f in firsts if f <= bound)
            le = "+Inf" if math.isinf(bound) else _rust_float(bound)
            lines.append(f"{name}_bucket{_rust_labels({'model': model, 'le': le})} {count}")
        lines.append(f"{name}_sum{_rust_labels({'model': model})} {_rust_float(sum(firsts))}")
        lines.append(f"{name}_count{_rust_labels({'model': model})} {len(firsts)}")
    return "\n".join(lines) + "\n"


def _family(lines: list[str], suffix: str, kind: str, help_text: str) -> None:
    lines.append(f"# HELP dynamo_frontend_{suffix} {help_text}")
    lines.append(f"# TYPE dynamo_frontend_{suffix} {kind}")


def _dynamo_log_buckets(low: float, high: float, count: int) -> list[float]:
    # generate_log_buckets: 0, then log-spaced values rounded to 2 significant figures.
    bounds = [0.0]
    for i in range(1, count):
        value = math.exp(math.log(low) + (math.log(high) - math.log(low)) * i / (count - 1))
        bounds.append(_round_sig(value, 2))
    return [b for i, b in enumerate(bounds) if i == 0 or b != bounds[i - 1]]


def _round_sig(value: float, digits: int) -> float:
    scale = 10 ** (digits - 1 - math.floor(math.log10(abs(value))))
    return float(round(value * scale) / scale)


def _rust_float(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def _rust_labels(labels: dict[str, str]) -> str:
    # The crate keeps a metric's label pairs sorted by name; a histogram's le comes last.
    pairs = sorted((k, v) for k, v in labels.items() if k != "le")
    pairs += [("le", labels["le"])] if "le" in labels else []
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"


# --- llm-d router EPP (pkg/epp/metrics/llm_d_router_metrics.go, metrics.go) ------------------

LLMD_POOL = "qwen-pool"
LLMD_QUEUED = {("tenant-a", "0"): 3, ("tenant-b", "10"): 1}


def llmd_router() -> str:
    """The EPP's flow-control and pool gauges in client_golang's text format: families sorted
    by name, label pairs by name, shortest float formatting. The EPP writes each deprecated
    ``inference_extension_``/``inference_pool_`` family with the same values as its
    ``llm_d_epp_`` successor."""
    alpha = "[ALPHA] "
    families: list[tuple[str, str, list[tuple[dict[str, str], float]]]] = []
    queue_help = "Current number of requests actively held in the Flow Control queue."
    queue = [
        (
            {
                "fairness_id": fairness,
                "priority": priority,
                "inference_pool": LLMD_POOL,
                "model_name": "qwen3",
                "target_model_name": "Qwen/Qwen3-8B",
            },
            float(count),
        )
        for (fairness, priority), count in LLMD_QUEUED.items()
    ]
    pool = {"name": LLMD_POOL}
    families += [
        ("llm_d_epp_flow_control_queue_size", alpha + queue_help, queue),
        (
            "inference_extension_flow_control_queue_size",
            alpha + "[Deprecated: Use llm_d_epp_flow_control_queue_size] " + queue_help,
            queue,
        ),
        (
            "llm_d_epp_flow_control_pool_saturation",
            alpha
            + "Pool saturation signal gating Flow Control dispatch. The stage label partitions "
            "by pipeline role: 'prefill' and 'decode' are per-stage signals, 'effective' is "
            "max(prefill, decode) and is the value used for gating. 1.0 is the gating set "
            "point; values above 1.0 indicate the magnitude of oversubscription past it. An "
            "empty pool reads as 1.0. With the default utilization detector, endpoints with "
            "missing or stale metrics score as fully saturated (fail-closed; see "
            "flow_control_stale_endpoints).",
            [({"inference_pool": LLMD_POOL, "stage": "effective"}, 1.0)],
        ),
    ]
    queue_avg = "The average number of requests pending in the model server queue."
    kv_avg = "The average kv cache utilization for an inference server pool."
    deprecated = alpha + "[Deprecated: Use llm_d_epp_{}] {}"
    families += [
        ("llm_d_epp_average_queue_size", alpha + queue_avg, [(pool, 0.0)]),
        (
            "inference_pool_average_queue_size",
            deprecated.format("average_queue_size", queue_avg),
            [(pool, 0.0)],
        ),
        ("llm_d_epp_average_kv_cache_utilization", alpha + kv_avg, [(pool, 0.0)]),
        (
            "inference_pool_average_kv_cache_utilization",
            deprecated.format("average_kv_cache_utilization", kv_avg),
            [(pool, 0.0)],
        ),
        (
            "llm_d_epp_ready_endpoints",
            alpha + "The number of ready endpoints in the inference server pool.",
            [(pool, 0.0)],
        ),
        (
            "inference_pool_ready_pods",
            alpha
            + "[Deprecated: Use llm_d_epp_ready_endpoints] "
            + "The number of ready pods in the inference server pool.",
            [(pool, 0.0)],
        ),
    ]
    lines: list[str] = []
    for name, help_text, samples in sorted(families):
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for labels, value in samples:
            pairs = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            lines.append(f"{name}{{{pairs}}} {_go_float(value)}")
    return "\n".join(lines) + "\n"


def _go_float(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


# --- rendering --------------------------------------------------------------------------------

RENDERED: dict[str, tuple[Callable[[Any], None], bool]] = {
    # file: (declarations, multiprocess mode as the engine runs it)
    "sglang-0.5.23-dp2-tp2-ep2-priority.txt": (sglang, True),
    "vllm-0.34.0-dp2.txt": (vllm_awake, False),
    "vllm-0.34.0-dp2-asleep.txt": (vllm_asleep, False),
    "trtllm-serve-iter-stats.txt": (trtllm_iter_stats, True),
    "trtllm-serve-no-iter-stats.txt": (trtllm_no_iter_stats, True),
}
WRITTEN: dict[str, Callable[[], str]] = {
    "dynamo-frontend.txt": dynamo_frontend,
    "llmd-router-epp.txt": llmd_router,
}


def render(name: str) -> str:
    """One payload; a multiprocess one in a child process with its own directory."""
    declare, multiprocess = RENDERED[name]
    if not multiprocess:
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry()
        declare(registry)
        return generate_latest(registry).decode()
    with tempfile.TemporaryDirectory() as directory:
        env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": directory}
        child = [sys.executable, __file__, "--child", name]
        return subprocess.run(child, env=env, check=True, capture_output=True, text=True).stdout


def _child(name: str) -> None:
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    declare, _ = RENDERED[name]
    declare(None)  # multiprocess values live in PROMETHEUS_MULTIPROC_DIR, not in a registry
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    sys.stdout.write(generate_latest(registry).decode())


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2])
        return
    for name in RENDERED:
        (FIXTURES / name).write_text(render(name))
    for name, write in WRITTEN.items():
        (FIXTURES / name).write_text(write())
    print(f"wrote {len(RENDERED) + len(WRITTEN)} payloads to {FIXTURES}")


if __name__ == "__main__":
    main()
