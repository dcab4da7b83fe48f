"""Parse time of a large vLLM payload: the targeted parser against prometheus_client's.

Builds a payload like a real data-parallel vLLM server's (the recorded V0 fixture with every
``vllm:`` series repeated for ``engine="0"`` .. ``engine="N-1"`` until it is about 80 KB;
python/process families once), then times, in one run and alternating, prometheus_client's
``text_string_to_metric_families`` (fully consumed), our parser with the vLLM selection
(what the sampler runs), and our parser with every family. Medians of many iterations.

    python benchmarks/parse_engines.py

Needs ``prometheus-client`` (the test extra). Writes benchmarks/results/parse_engines.json.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from keda_gpu_scaler.domain.engines import EngineKind
from keda_gpu_scaler.sources.engines.extract import SELECTIONS, extract
from keda_gpu_scaler.sources.engines.promtext import Selection, parse_exposition

ROOT = Path(__file__).parent
FIXTURE = ROOT.parent / "tests" / "fixtures" / "engines" / "vllm-v0-datadog-integrations-core.txt"
RESULTS = ROOT / "results" / "parse_engines.json"
TARGET_BYTES = 80_000
ROUNDS = 60


def build_payload(target_bytes: int = TARGET_BYTES) -> tuple[str, int]:
    """The fixture with each ``vllm:`` sample line repeated per engine; (text, engines)."""
    lines = FIXTURE.read_text(encoding="utf-8").splitlines()
    engines = 1
    while True:
        text = "\n".join(_replicate(lines, engines)) + "\n"
        if len(text.encode()) >= target_bytes:
            return text, engines
        engines += 1


def _replicate(lines: list[str], engines: int) -> list[str]:
    out: list[str] = []
    for line in lines:
        if line.startswith("vllm:") and 'model_name="' in line:
            for engine in range(engines):
                out.append(line.replace('model_name="', f'engine="{engine}",model_name="', 1))
        else:
            out.append(line)
    return out


def _time_once_ms(func: Callable[[], object], samples: list[float]) -> None:
    start = time.perf_counter()
    func()
    samples.append((time.perf_counter() - start) * 1000)


def measure(text: str, rounds: int = ROUNDS) -> dict[str, float]:
    wanted = SELECTIONS[EngineKind.VLLM]
    everything = Selection.everything()
    runs: dict[str, tuple[Callable[[], object], list[float]]] = {
        "prometheus_client_ms": (lambda: list(text_string_to_metric_families(text)), []),
        "targeted_vllm_selection_ms": (lambda: parse_exposition(text, wanted), []),
        "targeted_plus_extract_ms": (
            lambda: extract(
                EngineKind.VLLM, parse_exposition(text, wanted), taken_at=1.0, previous=None
            ),
            [],
        ),
        "targeted_everything_ms": (lambda: parse_exposition(text, everything), []),
    }
    for _ in range(rounds):  # interleaved, so a noisy neighbour hits every parser alike
        for func, samples in runs.values():
            for _ in range(5):
                _time_once_ms(func, samples)
    return {name: round(statistics.median(samples), 4) for name, (_, samples) in runs.items()}


def main() -> None:
    text, engines = build_payload()
    medians = measure(text)
    ratio = medians["prometheus_client_ms"] / medians["targeted_vllm_selection_ms"]
    ratio_all = medians["prometheus_client_ms"] / medians["targeted_everything_ms"]
    wanted = len(parse_exposition(text, SELECTIONS[EngineKind.VLLM]).samples)
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "payload_bytes": len(text.encode()),
        "payload_lines": text.count("\n"),
        "engines": engines,
        "wanted_samples": wanted,
        "iterations_each": ROUNDS * 5,
        **medians,
        "speedup_vllm_selection": round(ratio, 1),
        "speedup_everything": round(ratio_all, 1),
    }
    print(
        f"payload {report['payload_bytes']} bytes, {report['payload_lines']} lines, "
        f"{engines} engines, {wanted} wanted samples; medians of {ROUNDS * 5} runs:"
    )
    for name, value in medians.items():
        print(f"  {name:28s} {value:9.3f} ms")
    print(f"  speedup (vLLM selection)     {ratio:9.1f} x")
    print(f"  speedup (every family)       {ratio_all:9.1f} x")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
