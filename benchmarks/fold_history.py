"""What rolling windows cost the aggregator: ``fold`` with and without a 600 s history.

Eight GPUs read at 10 Hz (a Batch of eight H200-like readings per cycle, every field the NVML
sampler fills). Each scenario first folds 600 s of cycles so the history is full, then times
``fold`` over a further 3000 cycles, in rounds, with the scenarios interleaved so machine
noise hits them alike. Scenarios: no window (the default; nothing kept), a 600 s window over
one metric, and over three. Also timed: one ``measure`` of a 600 s ``avg`` window over the
eight GPUs (6000 readings each) against one of the newest reading, and the memory the
history holds at the end (tracemalloc, in a separate pass).

    python benchmarks/fold_history.py [--rounds N] [--json PATH]

Prints microseconds per fold and the ratios, and writes benchmarks/results/fold_history.json.
No assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any

from keda_gpu_scaler.domain.catalog import MetricType
from keda_gpu_scaler.domain.decision import measure
from keda_gpu_scaler.domain.history import NO_HISTORY, HistoryPlan
from keda_gpu_scaler.domain.samples import Batch, DeviceKey, GpuReading
from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT, Snapshot
from keda_gpu_scaler.domain.trigger import parse_trigger
from keda_gpu_scaler.pipeline.state import fold

GPUS = 8
HZ = 10
WINDOW_S = 600
TIMED_CYCLES = 3000
RESULTS = Path(__file__).parent / "results" / "fold_history.json"
SCENARIOS = {
    "no window": NO_HISTORY,
    "600 s, 1 metric": HistoryPlan(
        seconds=WINDOW_S, metrics=frozenset({MetricType.GPU_UTILIZATION})
    ),
    "600 s, 3 metrics": HistoryPlan(
        seconds=WINDOW_S,
        metrics=frozenset(
            {MetricType.GPU_UTILIZATION, MetricType.SM_ACTIVE, MetricType.MEMORY_USED_PERCENT}
        ),
    ),
}


def _batch(cycle: int) -> Batch:
    t = cycle / HZ
    readings = tuple(
        GpuReading(
            source="nvml",
            key=DeviceKey(f"GPU-{i:08x}-bench"),
            index=i,
            uuid=f"GPU-{i:08x}-bench",
            name="NVIDIA H200",
            taken_at=t,
            period_s=1 / HZ,
            gpu_utilization=float((cycle + i) % 100),
            memory_utilization=12.0,
            memory_used_bytes=(40 << 30) + cycle,
            memory_total_bytes=143_771_336_704,
            memory_reserved_bytes=1 << 29,
            temperature_c=41.0,
            power_mw=310_000.0 + cycle % 7,
            power_limit_mw=700_000.0,
            sm_clock_mhz=1980.0,
            pcie_tx_kbps=1200.0,
            pcie_rx_kbps=900.0,
            sm_active=float((cycle * 3 + i) % 100),
            sm_occupancy=30.0,
            tensor_active=20.0,
            dram_bw_util=15.0,
        )
        for i in range(GPUS)
    )
    return Batch(source="nvml", samples=readings)


def _taken_at(batch: Batch) -> float:
    reading = batch.samples[0]
    assert isinstance(reading, GpuReading)
    return reading.taken_at


def _warm(plan: HistoryPlan, batches: list[Batch]) -> Snapshot:
    snapshot = EMPTY_SNAPSHOT
    for batch in batches:
        snapshot = fold(snapshot, [batch], _taken_at(batch), plan=plan)
    return snapshot


def _timed(plan: HistoryPlan, snapshot: Snapshot, batches: list[Batch]) -> tuple[float, Snapshot]:
    cycles = [(batch, _taken_at(batch)) for batch in batches]
    start = time.perf_counter()
    for batch, now in cycles:
        snapshot = fold(snapshot, [batch], now, plan=plan)
    return (time.perf_counter() - start) / len(batches), snapshot


def _measure_us(snapshot: Snapshot, metadata: dict[str, str], repeat: int = 200) -> float:
    spec = parse_trigger(metadata)
    now = snapshot.published_at
    measure(spec, snapshot, now)
    start = time.perf_counter()
    for _ in range(repeat):
        measure(spec, snapshot, now)
    return (time.perf_counter() - start) / repeat * 1e6


def _history_bytes(plan: HistoryPlan, batches: list[Batch]) -> int:
    tracemalloc.start()
    baseline = _warm(NO_HISTORY, batches[-2:])  # the newest readings, held either way
    before = tracemalloc.get_traced_memory()[0]
    kept = _warm(plan, batches)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del baseline, kept
    return after - before


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()

    warm_cycles = WINDOW_S * HZ
    batches = [_batch(n) for n in range(warm_cycles + TIMED_CYCLES * args.rounds)]
    warm, rest = batches[:warm_cycles], batches[warm_cycles:]
    snapshots = {name: _warm(plan, warm) for name, plan in SCENARIOS.items()}
    per_fold: dict[str, list[float]] = {name: [] for name in SCENARIOS}
    for r in range(args.rounds):
        chunk = rest[r * TIMED_CYCLES : (r + 1) * TIMED_CYCLES]
        names = list(SCENARIOS)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            seconds, snapshots[name] = _timed(SCENARIOS[name], snapshots[name], chunk)
            per_fold[name].append(seconds * 1e6)

    full = snapshots["600 s, 1 metric"]
    results: dict[str, Any] = {
        "gpus": GPUS,
        "hz": HZ,
        "window_s": WINDOW_S,
        "timed_cycles_per_round": TIMED_CYCLES,
        "rounds": args.rounds,
        "fold_us": {name: round(statistics.median(v), 2) for name, v in per_fold.items()},
        "readings_kept_per_gpu": len(next(iter(full.devices.values())).history),
        "measure_us": {
            "newest reading": round(_measure_us(full, {"aggregation": "avg"}), 1),
            "600 s avg window": round(
                _measure_us(full, {"aggregation": "avg", "windowSeconds": str(WINDOW_S)}), 1
            ),
            "600 s p95 window": round(
                _measure_us(
                    full,
                    {"windowSeconds": str(WINDOW_S), "windowAggregation": "p95"},
                ),
                1,
            ),
        },
        "history_mib": {
            name: round(_history_bytes(plan, warm) / 2**20, 2)
            for name, plan in SCENARIOS.items()
            if plan.keeps_any()
        },
        "machine": {
            "nproc": os.cpu_count(),
            "cpu": _cpu_model(),
            "python": platform.python_version(),
        },
    }
    base = results["fold_us"]["no window"]
    results["ratio"] = {
        name: round(us / base, 2) for name, us in results["fold_us"].items() if name != "no window"
    }
    print(f"fold of {GPUS} GPUs at {HZ} Hz, median of {args.rounds} rounds of {TIMED_CYCLES}")
    for name, us in results["fold_us"].items():
        ratio = results["ratio"].get(name, 1.0)
        print(f"  {name:18} {us:8.2f} us/fold  x{ratio:.2f}  ({us * HZ / 1e4:.3f} % of a core)")
    print(f"readings kept per GPU: {results['readings_kept_per_gpu']}")
    for name, us in results["measure_us"].items():
        print(f"  measure, {name:18} {us:8.1f} us")
    for name, mib in results["history_mib"].items():
        print(f"  history held, {name:18} {mib:6.2f} MiB")
    print(f"machine: {results['machine']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
