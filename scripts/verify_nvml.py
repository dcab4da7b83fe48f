#!/usr/bin/env python3
"""Check the NVML sampler against nvidia-smi on a real GPU host (under 60 s).

    pip install nvidia-ml-py anyio msgspec      # nothing else is needed
    PYTHONPATH=src python scripts/verify_nvml.py [--seconds 8] [--no-load]
        [--load-python /path/to/python-with-torch]

If PyTorch is importable, a bf16 matmul loop runs on CUDA device 0 in a subprocess while
the sampler reads every GPU at 0.5 s. After each cycle nvidia-smi is queried
(``--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,
power.draw,clocks.sm``) and paired with the newest reading of the same UUID. Readings move
between the two reads, so each metric is judged on its closest pair of the run, with
these tolerances:

    temperature   +-3 C
    power         +-15 % or +-30 W, whichever is larger
    memory used   +-2 % of total, against v2 ``used`` or v1 ``used`` (drivers differ in
                  which one nvidia-smi shows; the table says which matched)
    SM clock      +-15 % or +-50 MHz, whichever is larger
    utilization   +-25 points (both are coarse windows of different lengths)

Prints a table, the GPM readings (SM activity, occupancy, tensor, DRAM bandwidth), NVLink,
PCIe and MIG instances, and every NVML surprise met on the way. Exit status: 0 agreed,
1 disagreement, 2 NVML unusable, 3 nvidia-smi missing or unreadable.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import select
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from keda_gpu_scaler.domain.errors import ScalerError, SourceUnavailable
from keda_gpu_scaler.domain.samples import Batch, GpuReading, Sample, SourceFault
from keda_gpu_scaler.sources.nvml.backend import Handle, NvmlBackend
from keda_gpu_scaler.sources.nvml.convert import NVLINK_ALL_LINKS, NVLINK_LINK_COUNT
from keda_gpu_scaler.sources.nvml.errors import NvmlError
from keda_gpu_scaler.sources.nvml.pynvml_backend import open_nvml_backend
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler

SMI_FIELDS = (
    "index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw,clocks.sm"
)
LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
(a @ b).sum().item(); print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20): c = a @ b
    torch.cuda.synchronize()
"""
GPM_FIELDS = ("sm_active", "sm_occupancy", "tensor_active", "dram_bw_util")
NOT_COMPARED: set[str] = set()


@dataclass
class Check:
    gpu: int
    metric: str
    ours: float
    smi: float
    tolerance: float
    note: str = ""

    @property
    def diff(self) -> float:
        return abs(self.ours - self.smi)

    @property
    def ok(self) -> bool:
        return self.diff <= self.tolerance


def surprise(what: str, exc: BaseException) -> None:
    print(f"  surprise: {what}: {type(exc).__name__}: {exc}")


def probe(backend: NvmlBackend) -> None:
    """Static facts, each call on its own so one failure does not hide the others."""
    count = backend.device_count()
    print(f"NVML sees {count} GPU(s)")
    for i in range(count):
        try:
            h = backend.device_handle(i)
            print(f"GPU {i}: {backend.name(h)} {backend.uuid(h)}")
        except NvmlError as exc:
            surprise(f"GPU {i} handle", exc)
            continue
        for label, call in _facts(backend, h):
            try:
                print(f"  {label}: {call()}")
            except NvmlError as exc:
                print(f"  {label}: absent ({exc})")


def _facts(backend: NvmlBackend, h: Handle) -> list[tuple[str, Callable[[], object]]]:
    return [
        ("MIG mode (current, pending)", lambda: backend.mig_mode(h)),
        ("GPM supported", lambda: backend.gpm_supported(h)),
        ("memory v2", lambda: backend.memory_v2(h)),
        ("fan %", lambda: backend.fan_speed_percent(h)),
        (
            "NVLink all-links field codes and scopes",
            lambda: [
                (f.return_code, f.scope_id) for f in backend.field_values(h, NVLINK_ALL_LINKS)
            ],
        ),
        (
            "NVLink link count (code, value)",
            lambda: [(f.return_code, f.value) for f in backend.field_values(h, NVLINK_LINK_COUNT)],
        ),
    ]


def start_load(seconds: float, python: str | None) -> subprocess.Popen[str] | None:
    if python is None and importlib.util.find_spec("torch") is None:
        print("PyTorch not found: comparing without load")
        return None
    env = dict(os.environ)
    if python is not None:
        # Another interpreter must not inherit this one's module search settings.
        env.pop("PYTHONHOME", None)
        env.pop("PYTHONPATH", None)
    proc = subprocess.Popen(
        [python or sys.executable, "-c", LOAD, str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    # Wait for CUDA to come up and the first matmul to finish, but not for ever.
    ready, _, _ = select.select([proc.stdout], [], [], 25)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "ready":
        print(f"load did not start (got {line!r}); comparing without load")
        proc.kill()
        return None
    print("load running on CUDA device 0 (bf16 8192x8192 matmul loop)")
    return proc


def nvidia_smi() -> dict[str, list[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines()]
    return {row[1]: row for row in rows if len(row) == 8}


def number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def compare(r: GpuReading, row: list[str]) -> list[Check]:
    smi = [number(c) for c in row]
    checks = []

    def add(
        metric: str, ours: float | None, theirs: float | None, tol: float, note: str = ""
    ) -> None:
        if ours is None or theirs is None:
            NOT_COMPARED.add(f"GPU {r.index} {metric}: ours={ours} nvidia-smi={theirs}")
        else:
            checks.append(Check(r.index, metric, ours, theirs, tol, note))

    add("utilization %", r.gpu_utilization, smi[2], 25.0)
    add("temperature C", r.temperature_c, smi[5], 3.0)
    power = None if r.power_mw is None else r.power_mw / 1000
    add("power W", power, smi[6], max(30.0, 0.15 * (smi[6] or 0)))
    clock = r.sm_clock_mhz
    add("SM clock MHz", clock, smi[7], max(50.0, 0.15 * (smi[7] or 0)))
    if r.memory_used_bytes is not None and smi[3] is not None and smi[4] is not None:
        v1 = r.memory_used_bytes / 2**20
        v2 = v1 - (r.memory_reserved_bytes or 0) / 2**20
        _, note = min((abs(v1 - smi[3]), "v1"), (abs(v2 - smi[3]), "v2"))
        add("memory used MiB", v1 if note == "v1" else v2, smi[3], 0.02 * smi[4], f"matches {note}")
    return checks


async def sample(
    backend: NvmlBackend, seconds: float
) -> tuple[list[Check], list[GpuReading], list[str], list[float | None]]:
    """Compare every cycle with nvidia-smi; also returns how long each cycle took."""
    sampler = NvmlSampler(backend, interval_s=0.5, pcie_interval_s=2.0)
    send, receive = anyio.create_memory_object_stream[Sample](100)
    checks: list[Check] = []
    last: dict[str, GpuReading] = {}
    notes: list[str] = []
    cycles: list[float | None] = []
    async with anyio.create_task_group() as tg, receive:
        await tg.start(sampler.run, send)
        with anyio.move_on_after(seconds):
            async for batch in receive:
                if isinstance(batch, Batch):
                    cycles.append(batch.cycle_s)
                items = batch.samples if isinstance(batch, Batch) else (batch,)
                for s in items:
                    if isinstance(s, GpuReading):
                        last[s.key] = s
                    elif isinstance(s, SourceFault):
                        notes.append(f"fault: {s.reason} (lost={s.lost}, key={s.key})")
                rows = await anyio.to_thread.run_sync(nvidia_smi)
                for r in last.values():
                    if not r.is_mig_instance() and r.uuid in rows:
                        checks.extend(compare(r, rows[r.uuid]))
        tg.cancel_scope.cancel()
    return checks, list(last.values()), notes, cycles


def best_pairs(checks: list[Check]) -> list[Check]:
    best: dict[tuple[int, str], Check] = {}
    for c in checks:
        key = (c.gpu, c.metric)
        if key not in best or c.diff < best[key].diff:
            best[key] = c
    return [best[k] for k in sorted(best)]


def report(checks: list[Check], readings: list[GpuReading]) -> bool:
    head = ("GPU", "metric", "ours", "nvidia-smi", "diff", "tol")
    print("\n{:>3}  {:<16} {:>10} {:>10} {:>8} {:>8}  result".format(*head))
    for c in checks:
        verdict = "ok" if c.ok else "DISAGREE"
        print(
            f"{c.gpu:>3}  {c.metric:<16} {c.ours:>10.1f} {c.smi:>10.1f} {c.diff:>8.1f} "
            f"{c.tolerance:>8.1f}  {verdict} {c.note}"
        )
    print("\nGPM (percent, over the last interval; '-' = no reading) and links:")
    for r in sorted(readings, key=lambda r: (r.index, r.parent_index is not None, r.key)):
        who = (
            f"MIG {r.parent_index}:{r.gpu_instance_id}" if r.is_mig_instance() else f"GPU {r.index}"
        )
        gpm = "  ".join(f"{f}={_fmt(getattr(r, f))}" for f in GPM_FIELDS)
        pcie = f"{_fmt(r.pcie_tx_kbps)}/{_fmt(r.pcie_rx_kbps)}"
        nvlink = f"{_fmt(r.nvlink_tx_mbps)}/{_fmt(r.nvlink_rx_mbps)}"
        links = f"pcie tx/rx KB/s={pcie}  nvlink tx/rx MB/s={nvlink}"
        print(f"  {who:<10} {gpm}  {links}")
    return all(c.ok for c in checks)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="sampling time (default 8)")
    parser.add_argument("--no-load", action="store_true", help="do not start a PyTorch load")
    parser.add_argument(
        "--load-python",
        metavar="PATH",
        help="another interpreter that has PyTorch, for the load (default: this one)",
    )
    args = parser.parse_args()
    try:
        backend = open_nvml_backend()
        probe(backend)
    except (SourceUnavailable, NvmlError) as exc:
        print(f"NVML unusable: {exc}")
        return 2
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi not found on PATH")
        return 3
    load = None if args.no_load else start_load(args.seconds + 10, args.load_python)
    try:
        checks, readings, notes, cycles = anyio.run(sample, backend, args.seconds)
    except subprocess.SubprocessError as exc:
        print(f"nvidia-smi failed: {exc}")
        return 3
    except ScalerError as exc:
        print(f"sampler failed: {exc}")
        return 2
    finally:
        if load is not None:
            load.kill()
    for note in [*notes, *(f"not compared: {n}" for n in sorted(NOT_COMPARED))]:
        print(note)
    faults = sum(note.startswith("fault:") for note in notes)
    took = max((c for c in cycles if c is not None), default=0.0)
    print(f"sampler: {len(cycles)} cycles, {faults} faults, longest cycle {took:.4f} s")
    if not checks:
        print("nothing compared: no reading matched an nvidia-smi row by UUID")
        return 1
    return 0 if report(best_pairs(checks), readings) else 1


if __name__ == "__main__":
    sys.exit(main())
