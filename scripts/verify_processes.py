#!/usr/bin/env python3
"""Check the NVML sampler's per-process readings against ``nvidia-smi pmon`` on a real GPU
(under 90 s; root, for the cgroups).

    pip install nvidia-ml-py anyio msgspec torch
    sudo PYTHONPATH=src python scripts/verify_processes.py [--seconds 20] [--gpu 0]
        [--load-python /path/to/python-with-torch]

Two PyTorch processes run on one GPU, each in a cgroup named as the kubelet names a
container's under the systemd driver (cgroup v2:
``/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
cri-containerd-<id>.scope``), so that the node agent's own mapping (``/proc/<pid>/cgroup``)
finds two pods: "heavy" (a bf16 matmul loop, about 3 GiB) and "light" (a smaller matmul,
then a sleep, in a loop; about 1 GiB). Where cgroups cannot be made (no root, a read-only
cgroup file system), the PIDs are mapped through a copy of /proc with those cgroup lines,
and the script says so: the NVML side is real either way.

The sampler runs with per-process readings every second while ``nvidia-smi pmon -s um``
prints each process's SM %, memory % and framebuffer MiB every second. Compared per PID,
over the run:

    SM %          the means agree within 20 points (pmon and the sampler average different
                  windows of the driver's samples)
    memory MiB    the sampler's newest agrees with pmon's newest within 5 % or 64 MiB
    pod           each PID maps to the pod its cgroup names; the GPU's other processes
                  (if any) are outside any pod

It prints the raw NVML process lists and utilization samples, the comparison table, each
pod's share as a podSelector trigger would compute it beside the GPU's gpu_utilization, and
what the device said it could not give (MIG, MPS). Exit status: 0 agreed, 1 disagreement,
2 NVML unusable, 3 nvidia-smi or PyTorch missing, 4 the loads did not start.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from keda_gpu_scaler.domain.catalog import MetricType
from keda_gpu_scaler.domain.errors import ScalerError, SourceUnavailable
from keda_gpu_scaler.domain.process_share import Shares, process_share
from keda_gpu_scaler.domain.samples import (
    Batch,
    DeviceKey,
    DeviceProcesses,
    GpuReading,
    Sample,
)
from keda_gpu_scaler.domain.snapshot import DeviceState
from keda_gpu_scaler.sources.nvml.backend import NvmlBackend
from keda_gpu_scaler.sources.nvml.errors import NvmlError
from keda_gpu_scaler.sources.nvml.pynvml_backend import open_nvml_backend
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler
from keda_gpu_scaler.sources.procfs import HostProc

CGROUP_ROOT = Path("/sys/fs/cgroup")
LOAD = """
import os, sys, time, torch
size, gib, pause = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
torch.cuda.set_device(int(sys.argv[4]))
held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
(a @ b).sum().item(); print("ready", os.getpid(), flush=True)
sys.stdin.readline()  # go
end = time.time() + float(sys.argv[5])
while time.time() < end:
    for _ in range(10): c = a @ b
    torch.cuda.synchronize()
    if pause: time.sleep(pause)
"""
SM_TOLERANCE = 20.0


@dataclass
class Load:
    name: str
    size: int
    gib: float
    pause: float
    pod_uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    container_id: str = field(default_factory=lambda: uuid.uuid4().hex + uuid.uuid4().hex)
    proc: subprocess.Popen[str] | None = None
    pid: int = 0
    cgroup: Path | None = None


LOADS = (Load("heavy", 8192, 3.0, 0.0), Load("light", 4096, 1.0, 0.05))


def systemd_path(load: Load) -> str:
    slice_ = f"kubepods-burstable-pod{load.pod_uid.replace('-', '_')}.slice"
    return (
        f"/kubepods.slice/kubepods-burstable.slice/{slice_}/"
        f"cri-containerd-{load.container_id}.scope"
    )


def start(load: Load, gpu: int, seconds: float, python: str | None) -> bool:
    env = dict(os.environ)
    if python is not None:
        env.pop("PYTHONHOME", None)
        env.pop("PYTHONPATH", None)
    load.proc = subprocess.Popen(
        [
            python or sys.executable,
            "-c",
            LOAD,
            str(load.size),
            str(load.gib),
            str(load.pause),
            str(gpu),
            str(seconds),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert load.proc.stdout is not None
    ready, _, _ = select.select([load.proc.stdout], [], [], 40)
    line = load.proc.stdout.readline() if ready else ""
    if not line.startswith("ready"):
        print(f"load {load.name} did not start (got {line!r})")
        return False
    load.pid = int(line.split()[1])
    return True


def go(loads: tuple[Load, ...]) -> None:
    for load in loads:
        assert load.proc is not None
        assert load.proc.stdin is not None
        load.proc.stdin.write("\n")
        load.proc.stdin.flush()


def into_cgroups(loads: tuple[Load, ...]) -> str | None:
    """Each load in its kubelet-like cgroup; why not, if it cannot be done."""
    try:
        if not (CGROUP_ROOT / "cgroup.controllers").exists():
            return f"{CGROUP_ROOT} is not a cgroup v2 mount"
        for load in loads:
            path = CGROUP_ROOT / systemd_path(load).lstrip("/")
            path.mkdir(parents=True, exist_ok=True)
            (path / "cgroup.procs").write_text(f"{load.pid}\n")
            load.cgroup = path
    except OSError as exc:
        return f"cannot make the cgroups: {exc}"
    return None


def mapped_proc(loads: tuple[Load, ...], others: list[int]) -> Path:
    """A copy of /proc for the GPU's PIDs: the loads' cgroups as the kubelet would make
    them, the rest as they are."""
    root = Path(tempfile.mkdtemp(prefix="proc-"))
    for load in loads:
        (root / str(load.pid)).mkdir()
        (root / str(load.pid) / "cgroup").write_text(f"0::{systemd_path(load)}\n")
        (root / str(load.pid) / "comm").write_text("python3\n")
    for pid in others:
        try:
            cgroup = Path(f"/proc/{pid}/cgroup").read_text()
            comm = Path(f"/proc/{pid}/comm").read_text()
        except OSError:
            continue
        (root / str(pid)).mkdir(exist_ok=True)
        (root / str(pid) / "cgroup").write_text(cgroup)
        (root / str(pid) / "comm").write_text(comm)
    return root


def cleanup(loads: tuple[Load, ...]) -> None:
    for load in loads:
        if load.proc is not None:
            load.proc.kill()
            load.proc.wait()
    for load in loads:  # empty now; the scope, then the slices the script made
        path = load.cgroup
        while path is not None and path != CGROUP_ROOT and path.name != "kubepods.slice":
            try:
                path.rmdir()
            except OSError:
                break
            path = path.parent


@dataclass
class Pmon:
    sm: dict[int, list[float]] = field(default_factory=dict)
    fb_mib: dict[int, float] = field(default_factory=dict)
    header: list[str] = field(default_factory=list)


def parse_pmon(text: str, gpu: int) -> Pmon:
    """``nvidia-smi pmon -s um`` output: a ``# gpu pid type sm mem ... fb ... command``
    header (the columns differ by driver), then one row per process and second; ``-``
    where nothing was sampled."""
    out = Pmon()
    for line in text.splitlines():
        if line.startswith("#"):
            names = line.lstrip("#").split()
            if "pid" in names:
                out.header = names
            continue
        cells = line.split()
        if not out.header or len(cells) < len(out.header) - 1:
            continue
        row = dict(zip(out.header, cells, strict=False))
        if row.get("gpu") != str(gpu) or not row.get("pid", "").isdigit():
            continue
        pid = int(row["pid"])
        sm = row.get("sm", "-")
        out.sm.setdefault(pid, []).append(float(sm) if re.fullmatch(r"\d+", sm) else 0.0)
        fb = row.get("fb") or row.get("mem_fb") or "-"
        if re.fullmatch(r"\d+", fb):
            out.fb_mib[pid] = float(fb)
    return out


async def run(
    backend: NvmlBackend, owners: HostProc, gpu: int, seconds: float
) -> tuple[list[DeviceProcesses], list[GpuReading], str]:
    sampler = NvmlSampler(
        backend,
        interval_s=0.5,
        pcie_interval_s=None,
        process_interval_s=1.0,
        process_owners=owners,
    )
    pmon = await anyio.open_process(
        ["nvidia-smi", "pmon", "-i", str(gpu), "-s", "um", "-d", "1", "-c", str(int(seconds))]
    )
    send, receive = anyio.create_memory_object_stream[Sample](100)
    processes: list[DeviceProcesses] = []
    readings: list[GpuReading] = []
    async with anyio.create_task_group() as tg, receive, pmon:
        await tg.start(sampler.run, send)
        with anyio.move_on_after(seconds):
            async for batch in receive:
                for s in batch.samples if isinstance(batch, Batch) else (batch,):
                    if isinstance(s, DeviceProcesses) and s.index == gpu:
                        processes.append(s)
                    elif isinstance(s, GpuReading) and s.index == gpu:
                        readings.append(s)
        tg.cancel_scope.cancel()
        assert pmon.stdout is not None
        text = b""
        with anyio.move_on_after(5):
            async for chunk in pmon.stdout:
                text += chunk
    return processes, readings, text.decode(errors="replace")


def raw(backend: NvmlBackend, gpu: int) -> None:
    handle = backend.device_handle(gpu)
    for label, call in (
        ("compute processes (v3)", lambda: backend.compute_processes_v3(handle)),
        ("MPS clients (v3)", lambda: backend.mps_compute_processes_v3(handle)),
        ("utilization info (from 0)", lambda: backend.processes_utilization_info(handle, 0)),
        ("utilization, older call", lambda: backend.process_utilization(handle, 0)),
    ):
        try:
            print(f"  {label}: {call()}")
        except NvmlError as exc:
            print(f"  {label}: {exc}")


def report(
    loads: tuple[Load, ...],
    processes: list[DeviceProcesses],
    readings: list[GpuReading],
    pmon: Pmon,
) -> bool:
    ok = True
    print("\npmon columns:", " ".join(pmon.header) or "(none)")
    head = ("load", "pid", "pod found", "sm ours", "sm pmon", "MiB ours", "MiB pmon", "result")
    print("{:<6} {:>8} {:<9} {:>8} {:>8} {:>9} {:>9}  {}".format(*head))
    last = processes[-1] if processes else None
    for load in loads:
        uses = [p for r in processes for p in r.processes if p.pid == load.pid]
        ours_sm = [p.sm for p in uses if p.sm is not None]
        mine = statistics.fmean(ours_sm) if ours_sm else None
        theirs = statistics.fmean(pmon.sm[load.pid]) if pmon.sm.get(load.pid) else None
        used = uses[-1].used_memory_bytes if uses else None
        ours_mib = None if used is None else used / 2**20
        pmon_mib = pmon.fb_mib.get(load.pid)
        found = bool(uses) and uses[-1].pod_uid == load.pod_uid
        agree = found and _close(mine, theirs, SM_TOLERANCE)
        if ours_mib is not None and pmon_mib is not None:
            agree = agree and _close(ours_mib, pmon_mib, max(64.0, 0.05 * pmon_mib))
        ok = ok and agree
        print(
            f"{load.name:<6} {load.pid:>8} {found!s:<9} {_fmt(mine):>8} {_fmt(theirs):>8} "
            f"{_fmt(ours_mib):>9} {_fmt(pmon_mib):>9}  {'ok' if agree else 'DISAGREE'}"
        )
    if last is not None:
        others = [p.pid for p in last.processes if p.pid not in {ld.pid for ld in loads}]
        print(f"other processes on the GPU: {others or 'none'}")
        print(f"memory unsupported: {last.memory_unsupported}")
        print(f"utilization unsupported: {last.utilization_unsupported}")
        reading = readings[-1] if readings else None
        device = DeviceState(
            key=DeviceKey(last.key), index=last.index, reading=reading, processes=last
        )
        shares = Shares(others={DeviceKey(last.key): "the other load"})
        print(f"GPU gpu_utilization: {_fmt(reading.gpu_utilization if reading else None)}")
        for load in loads:
            mine_only = Shares(shares.others, frozenset({load.pod_uid}))
            for metric in (MetricType.GPU_UTILIZATION, MetricType.MEMORY_USED_MIB):
                share = process_share(metric, device, mine_only, last.taken_at)
                value = share if isinstance(share, str) else f"{share.value:g}"
                print(f"  pod {load.name} {metric}: {value}")
    return ok


def _close(ours: float | None, theirs: float | None, tolerance: float) -> bool:
    return ours is not None and theirs is not None and abs(ours - theirs) <= tolerance


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="sampling time (default 20)")
    parser.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU (default 0)")
    parser.add_argument("--load-python", metavar="PATH", help="an interpreter with PyTorch")
    args = parser.parse_args()
    try:
        backend = open_nvml_backend()
    except (SourceUnavailable, NvmlError) as exc:
        print(f"NVML unusable: {exc}")
        return 2
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi not found on PATH")
        return 3
    if args.load_python is None and importlib.util.find_spec("torch") is None:
        print("PyTorch not found: give --load-python")
        return 3
    try:
        if not all(start(ld, args.gpu, args.seconds + 15, args.load_python) for ld in LOADS):
            return 4
        why = into_cgroups(LOADS)
        root = Path("/proc")
        if why is not None:
            gpu_pids = [
                p.pid for p in backend.compute_processes_v3(backend.device_handle(args.gpu))
            ]
            root = mapped_proc(LOADS, gpu_pids)
            print(f"{why}: the cgroups are simulated in {root} (the NVML side is real)")
        for load in LOADS:
            print(
                f"{load.name}: pid {load.pid}, pod {load.pod_uid}, cgroup 0::{systemd_path(load)}"
            )
        go(LOADS)
        print("raw NVML, before the run:")
        raw(backend, args.gpu)
        processes, readings, text = anyio.run(run, backend, HostProc(root), args.gpu, args.seconds)
        print("raw NVML, after the run:")
        raw(backend, args.gpu)
    except ScalerError as exc:
        print(f"sampler failed: {exc}")
        return 2
    finally:
        cleanup(LOADS)
    print(f"{len(processes)} per-process readings of GPU {args.gpu}")
    return 0 if report(LOADS, processes, readings, parse_pmon(text, args.gpu)) else 1


if __name__ == "__main__":
    sys.exit(main())
