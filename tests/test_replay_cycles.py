"""Replay of a multi-GPU recording: each recorded cycle is one Batch, as NVML sends it.

``fixtures/replay/four-gpus.jsonl`` was written by ``record_trace`` over four fake H200s
(GPU ``i`` at ``10 * (i + 1)`` percent utilization), one cycle every 0.5 s for 2 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import trio.testing

from keda_gpu_scaler.domain.samples import Batch
from keda_gpu_scaler.sources.replay import ReplaySampler
from keda_gpu_scaler.testing import collect_samples, open_test_pipeline, readings

FOUR_GPUS = Path(__file__).parent / "fixtures" / "replay" / "four-gpus.jsonl"


@pytest.mark.trio
async def test_each_recorded_cycle_is_one_batch_of_every_gpu(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sampler = ReplaySampler.from_path(FOUR_GPUS, loop=False)
    start = anyio.current_time()
    async with collect_samples(sampler) as received:
        await anyio.sleep_until(start + 10.0)
    assert all(isinstance(s, Batch) for s in received)
    cycles = [readings([s]) for s in received]
    assert [c[0].taken_at - start for c in cycles] == [0.0, 0.5, 1.0, 1.5]
    for cycle in cycles:
        assert [r.index for r in cycle] == [0, 1, 2, 3]
        assert {r.taken_at for r in cycle} == {cycle[0].taken_at}
    assert len(readings(received)) == 16


@pytest.mark.trio
async def test_every_snapshot_of_a_replay_holds_every_gpu(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_test_pipeline(ReplaySampler.from_path(FOUR_GPUS, loop=True)) as pipeline:
        version = 0
        for _ in range(6):
            snapshot = await pipeline.hub.wait_newer(version)
            version = snapshot.version
            assert sorted(d.index for d in snapshot.devices.values()) == [0, 1, 2, 3]


def _gpu_metrics(*args: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-c",
        "from keda_gpu_scaler.app.gpu_metrics.command import main; raise SystemExit(main())",
        "--source",
        f"replay:{FOUR_GPUS}",
        *args,
    ]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM", "CUDA", "GPU_", "FLUX", "KUBERNETES"))
    }
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, check=False)


@pytest.mark.slow
def test_gpu_metrics_one_shot_shows_every_gpu_of_the_recording() -> None:
    result = _gpu_metrics("--format", "jsonl")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["index"], r["gpu_utilization"]) for r in rows] == [
        (0, 10.0),
        (1, 20.0),
        (2, 30.0),
        (3, 40.0),
    ]


@pytest.mark.slow
def test_gpu_metrics_device_filter_finds_the_recorded_gpu() -> None:
    result = _gpu_metrics("--format", "jsonl", "--device", "3")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["index"], r["status"]) for r in rows] == [(3, "ok")]


@pytest.mark.slow
def test_gpu_metrics_every_sample_has_every_gpu() -> None:
    result = _gpu_metrics("--format", "jsonl", "--interval", "0.1", "--count", "3")
    assert result.returncode == 0, result.stderr
    indexes = [json.loads(line)["index"] for line in result.stdout.splitlines()]
    assert indexes == [0, 1, 2, 3] * 3
