"""Scripted GPU readings for ``serve --source replay:PATH``: a trace file whose utilization
follows a schedule, so a scenario knows what every GPU reads at every second."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

GPU_UUIDS = (
    "GPU-0e2e0000-0000-4000-8000-000000000001",
    "GPU-0e2e0000-0000-4000-8000-000000000002",
)
MEMORY_TOTAL = 141_000_000_000


def level_at(schedule: Sequence[tuple[float, float]], t: float) -> float:
    """The value in effect at ``t`` of ``[(from_s, value), ...]``, held between steps."""
    value = schedule[0][1]
    for at, step in schedule:
        if at <= t:
            value = step
    return value


def write_trace(
    path: Path,
    schedule: Sequence[tuple[float, float]],
    *,
    duration_s: int,
    gpus: Sequence[str] = GPU_UUIDS[:1],
    period_s: float = 1.0,
) -> Path:
    """One frame per GPU every ``period_s``; every GPU reads the schedule's utilization."""
    lines = []
    steps = int(duration_s / period_s)
    for n in range(steps):
        t = round(n * period_s, 3)
        util = level_at(schedule, t)
        for index, uuid in enumerate(gpus):
            frame = {
                "t": t,
                "index": index,
                "uuid": uuid,
                "name": "NVIDIA H200",
                "util_gpu": util,
                "util_mem": util / 2,
                "mem_used": int(MEMORY_TOTAL * util / 200),
                "mem_total": MEMORY_TOTAL,
                "power_mw": int(100_000 + 6_000 * util),
                "power_limit_mw": 700_000,
                "temp_c": 40,
            }
            lines.append(json.dumps(frame))
    path.write_text("\n".join(lines) + "\n")
    return path
