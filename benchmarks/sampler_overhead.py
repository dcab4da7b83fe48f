"""CPU cost of the NVML sampler per device-sample, with the fake backend for 8 GPUs.

Runs the real NvmlSampler (conversions, GPM pairs, NVLink rates, Batch per cycle, one
worker-thread hop per cycle) against FakeNvml in trio's virtual time, so a few hundred
cycles take well under a second of wall time; CPU time is the process's (threads
included). The fake answers instantly, so this is the sampler's own overhead; a real
driver adds its call costs (about 10-20 us per GPU per cycle on the H200, plus ~1.7 ms
per GPM read, measured in tests/fixtures/nvml-h200/probe.json).

    python benchmarks/sampler_overhead.py

Prints microseconds per device-sample and percent of one core, and writes
benchmarks/results/sampler_overhead.json. No assertions.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import anyio
import trio
import trio.testing

from keda_gpu_scaler.domain.samples import Sample
from keda_gpu_scaler.sources.nvml.fake_backend import FakeNvlink, FakeNvml
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler

GPUS = 8
CYCLES = 300
RESULTS = Path(__file__).parent / "results" / "sampler_overhead.json"


async def _run(hz: float, cycles: int) -> dict[str, Any]:
    nvml = FakeNvml.h200(GPUS)
    for gpu in nvml.gpus:  # NVLink counters present, so rates are computed too
        gpu.nvlinks = [FakeNvlink() for _ in range(18)]
    sampler = NvmlSampler(nvml, interval_s=1.0 / hz)
    send, receive = anyio.create_memory_object_stream[Sample](64)
    cpu_start = time.process_time()
    done = 0
    async with anyio.create_task_group() as tg, receive:
        await tg.start(sampler.run, send)
        async for _batch in receive:  # one Batch per cycle
            done += 1
            if done >= cycles:
                break
        tg.cancel_scope.cancel()
    cpu_s = time.process_time() - cpu_start
    per_sample_us = cpu_s / (done * GPUS) * 1e6
    return {
        "hz": hz,
        "gpus": GPUS,
        "cycles": done,
        "cpu_s": round(cpu_s, 4),
        "us_per_device_sample": round(per_sample_us, 1),
        "percent_of_one_core": round(per_sample_us * GPUS * hz / 1e6 * 100, 3),
    }


def main() -> None:
    results = []
    for hz in (1.0, 10.0):
        clock = trio.testing.MockClock(autojump_threshold=0)
        results.append(trio.run(_run, hz, CYCLES, clock=clock))
    for r in results:
        print(
            f"{r['gpus']} GPUs at {r['hz']:g} Hz: {r['us_per_device_sample']:.1f} us CPU per "
            f"device-sample, {r['percent_of_one_core']:.3f} % of one core "
            f"({r['cycles']} cycles, {r['cpu_s']:.3f} s CPU)"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {"python": platform.python_version(), "machine": platform.machine(), "runs": results}
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
