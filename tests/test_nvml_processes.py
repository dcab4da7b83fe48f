"""Per-process readings of the NVML sampler over the fake NVML and a fake host /proc, in
virtual time: who runs on each device, their memory and utilization, and their pods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import trio.testing

from keda_gpu_scaler.domain.samples import DeviceProcesses, ProcessUse
from keda_gpu_scaler.sources.nvml.errors import NvmlCode
from keda_gpu_scaler.sources.nvml.fake_backend import (
    FakeNvml,
    enable_mig,
    h200_gpu,
    mig_instances,
)
from keda_gpu_scaler.sources.nvml.fake_processes import FakeMps, FakeProcess
from keda_gpu_scaler.sources.nvml.processes import OFF
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler
from keda_gpu_scaler.sources.procfs import ProcessGone, ProcessOwner, ProcessOwners
from keda_gpu_scaler.testing import (
    collect_samples,
    faults,
    inline,
    process_readings,
    readings,
)
from tests.fake_proc import FakeProc, pod_cgroup

GIB = 1 << 30
UID_A = "0a0a0a0a-0000-4000-8000-00000000000a"
UID_B = "0b0b0b0b-0000-4000-8000-00000000000b"
UID_MPS = "0d0d0d0d-0000-4000-8000-00000000000d"
CID_A, CID_B, CID_MPS = "a" * 64, "b" * 64, "d" * 64
HOST_SERVICE = "0::/system.slice/monitoring.service\n"


def _sampler(nvml: FakeNvml, owners: ProcessOwners | None, **options: Any) -> NvmlSampler:
    settings: dict[str, Any] = {"pcie_interval_s": None, "process_interval_s": 1.0, **options}
    return NvmlSampler(nvml, process_owners=owners, call_in_thread=inline, **settings)


async def _read(
    nvml: FakeNvml, owners: ProcessOwners | None, until: float, **options: Any
) -> list[DeviceProcesses]:
    start = anyio.current_time()
    async with collect_samples(_sampler(nvml, owners, **options)) as received:
        await anyio.sleep_until(start + until)
    return process_readings(received)


def _time_sliced(tmp_path: Path) -> tuple[FakeNvml, FakeProc]:
    """One H200, time-sliced: pod A's process busy, pod B's lightly, and a host process."""
    nvml = FakeNvml.h200(clock=anyio.current_time)
    nvml.gpus[0].processes = [
        FakeProcess(101, used_memory=20 * GIB, sm=60, memory=30),
        FakeProcess(202, used_memory=4 * GIB, sm=15, memory=5, decoder=7),
        FakeProcess(303, used_memory=1 * GIB, sm=5),
    ]
    proc = FakeProc(tmp_path / "proc")
    proc.add(101, pod_cgroup(UID_A, CID_A))
    proc.add(202, pod_cgroup(UID_B, CID_B, qos="besteffort"))
    proc.add(303, HOST_SERVICE, comm="dcgm")
    return nvml, proc


def _by_pid(reading: DeviceProcesses) -> dict[int, ProcessUse]:
    return {p.pid: p for p in reading.processes}


@pytest.mark.trio
async def test_each_process_on_a_time_sliced_gpu_has_its_pod_memory_and_utilization(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _time_sliced(tmp_path)
    (first, *_) = await _read(nvml, proc.host, 0.5)
    assert first.key == nvml.gpus[0].uuid
    assert (first.memory_unsupported, first.utilization_unsupported) == (None, None)
    assert first.period_s == 1.0
    by_pid = _by_pid(first)
    assert by_pid[101] == ProcessUse(
        pid=101,
        pod_uid=UID_A,
        container_id=CID_A,
        used_memory_bytes=20 * GIB,
        sm=60.0,
        memory=30.0,
        encoder=0.0,
        decoder=0.0,
    )
    assert (by_pid[202].pod_uid, by_pid[202].sm, by_pid[202].decoder) == (UID_B, 15.0, 7.0)
    # A process outside any pod is kept, with no pod: counted for no workload, not dropped.
    assert (by_pid[303].pod_uid, by_pid[303].container_id, by_pid[303].sm) == ("", "", 5.0)
    # The newest calls the driver has, the last-seen protocol from 0.
    assert nvml.calls["compute_processes_v3"] == 1
    assert nvml.calls["processes_utilization_info"] == 1
    assert nvml.calls["process_utilization"] == 0


@pytest.mark.trio
async def test_processes_are_read_on_their_own_cadence_in_the_cycles_batch(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _time_sliced(tmp_path)
    start = anyio.current_time()
    sampler = _sampler(nvml, proc.host, process_interval_s=3.0)
    async with collect_samples(sampler) as received:
        await anyio.sleep_until(start + 6.5)
    assert [r.taken_at - start for r in process_readings(received)] == [0.0, 3.0, 6.0]
    assert len(readings(received)) == 7
    assert nvml.calls["compute_processes_v3"] == 3
    # In the same batch as the cycle's readings: one snapshot per cycle.
    first = received[0]
    assert [type(s).__name__ for s in first.samples] == ["GpuReading", "DeviceProcesses"]  # type: ignore[union-attr]


@pytest.mark.trio
async def test_an_idle_process_reads_0_and_a_busy_one_only_since_the_last_read(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _time_sliced(tmp_path)
    a, b, host = nvml.gpus[0].processes
    start = anyio.current_time()
    async with collect_samples(_sampler(nvml, proc.host)) as received:
        await anyio.sleep_until(start + 0.5)
        a.sm = 0  # idle from now: NVML lists it no more (not even its earlier samples)
        b.sm, b.memory, b.decoder = 90, 10, 0
        host.sm = 0
        await anyio.sleep_until(start + 1.5)
    first, second = process_readings(received)
    assert [p.sm for p in first.processes] == [60.0, 15.0, 5.0]
    assert [p.sm for p in second.processes] == [0.0, 90.0, 0.0]


@pytest.mark.trio
async def test_per_process_readings_off_say_so_and_make_no_call(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, _ = _time_sliced(tmp_path)
    (first, *_) = await _read(nvml, None, 0.5)
    assert first.processes == ()
    assert first.memory_unsupported == first.utilization_unsupported == OFF
    assert "--host-proc" in OFF
    assert nvml.calls["compute_processes_v3"] == 0
    assert nvml.calls["processes_utilization_info"] == 0


@pytest.mark.trio
async def test_a_recording_reads_no_processes(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _time_sliced(tmp_path)
    assert await _read(nvml, proc.host, 2.5, process_interval_s=None) == []


@pytest.mark.trio
async def test_a_process_that_exits_between_reads_is_counted_no_more(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _time_sliced(tmp_path)
    start = anyio.current_time()
    async with collect_samples(_sampler(nvml, proc.host)) as received:
        await anyio.sleep_until(start + 0.5)
        # Pod B's process exits: NVML still has its last samples, /proc forgets it.
        nvml.exit_process(0, 202)
        proc.remove(202)
        await anyio.sleep_until(start + 1.5)
    _, second = process_readings(received)
    assert sorted(_by_pid(second)) == [101, 303]
    assert second.utilization_unsupported is None


class _ExitsWhileRead:
    """The host /proc, where ``pid`` exits just as it is looked up (after NVML listed it)."""

    def __init__(self, proc: FakeProc, nvml: FakeNvml, pid: int) -> None:
        self._host = proc.host
        self._proc = proc
        self._nvml = nvml
        self.pid = pid

    def owner(self, pid: int) -> ProcessOwner:
        if pid == self.pid:
            self._nvml.exit_process(0, pid)
            self._proc.remove(pid)
            raise ProcessGone(pid)
        return self._host.owner(pid)


@pytest.mark.trio
async def test_a_process_that_exits_while_it_is_mapped_is_dropped(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _time_sliced(tmp_path)
    (first, *_) = await _read(nvml, _ExitsWhileRead(proc, nvml, 202), 0.5)
    assert sorted(_by_pid(first)) == [101, 303]
    assert first.utilization_unsupported is None


@pytest.mark.trio
async def test_pids_this_proc_does_not_have_mean_the_wrong_pid_namespace(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, _ = _time_sliced(tmp_path)
    container_proc = FakeProc(tmp_path / "container-proc")  # the agent's own PIDs only
    container_proc.add(1, "0::/\n", comm="keda-gpu-scaler")
    (first, *_) = await _read(nvml, container_proc.host, 0.5)
    assert first.processes == ()
    assert first.utilization_unsupported == first.memory_unsupported
    assert "NVML lists PID 101" in (first.utilization_unsupported or "")
    assert "hostPID" in (first.utilization_unsupported or "")


@pytest.mark.trio
async def test_an_unreadable_proc_is_unsupported_not_zero(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, _ = _time_sliced(tmp_path)
    missing = FakeProc(tmp_path / "proc").host
    missing.root = tmp_path / "not-mounted"
    (first, *_) = await _read(nvml, missing, 0.5)
    assert first.processes == ()
    assert "not-mounted is not a directory" in (first.memory_unsupported or "")


@pytest.mark.trio
async def test_a_pid_reused_by_another_pod_is_its_and_its_samples_are_not_split(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _time_sliced(tmp_path)
    start = anyio.current_time()
    async with collect_samples(_sampler(nvml, proc.host)) as received:
        await anyio.sleep_until(start + 0.5)
        # Pod A's process 101 exits; a process of pod B gets PID 101 and runs lighter.
        nvml.exit_process(0, 101)
        nvml.gpus[0].processes.append(FakeProcess(101, used_memory=2 * GIB, sm=10))
        proc.add(101, pod_cgroup(UID_B, CID_B, qos="besteffort"))
        await anyio.sleep_until(start + 2.5)
    first, second, third = (_by_pid(r)[101] for r in process_readings(received))
    assert (first.pod_uid, first.sm, first.pid_reused) == (UID_A, 60.0, False)
    # NVML's samples under PID 101 since the last read are both processes': not pod B's.
    assert (second.pod_uid, second.container_id) == (UID_B, CID_B)
    assert second.used_memory_bytes == 2 * GIB
    assert second.pid_reused
    assert (second.sm, second.memory, second.encoder, second.decoder) == (None,) * 4
    # From the next read on, the samples are the new process's alone.
    assert (third.pod_uid, third.sm, third.pid_reused) == (UID_B, 10.0, False)


def _mps(tmp_path: Path, **mps: bool) -> tuple[FakeNvml, FakeProc]:
    """One H200 shared through MPS: pods A and B are clients of the server in the device
    plugin's MPS control daemon pod."""
    nvml = FakeNvml.h200(clock=anyio.current_time)
    gpu = nvml.gpus[0]
    gpu.mps = FakeMps(FakeProcess(55, used_memory=GIB // 2), **mps)
    gpu.processes = [
        FakeProcess(101, used_memory=8 * GIB, sm=40),
        FakeProcess(202, used_memory=3 * GIB, sm=20),
    ]
    proc = FakeProc(tmp_path / "proc")
    proc.add(55, pod_cgroup(UID_MPS, CID_MPS), comm="nvidia-cuda-mps-server")
    proc.add(101, pod_cgroup(UID_A, CID_A))
    proc.add(202, pod_cgroup(UID_B, CID_B))
    return nvml, proc


@pytest.mark.trio
async def test_mps_clients_have_their_memory_but_not_the_servers_utilization(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _mps(tmp_path)
    (first, *_) = await _read(nvml, proc.host, 0.5)
    by_pid = _by_pid(first)
    assert sorted(by_pid) == [55, 101, 202]
    assert by_pid[55].mps_server
    assert (by_pid[101].used_memory_bytes, by_pid[202].used_memory_bytes) == (8 * GIB, 3 * GIB)
    assert first.memory_unsupported is None
    # NVML sampled the clients' 60 % as the server's: no utilization per client.
    assert "as the MPS server's (PID 55)" in (first.utilization_unsupported or "")
    assert {p.sm for p in first.processes} == {None}


@pytest.mark.trio
async def test_mps_stays_unsupported_once_seen_even_when_idle(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _mps(tmp_path)
    start = anyio.current_time()
    async with collect_samples(_sampler(nvml, proc.host)) as received:
        await anyio.sleep_until(start + 0.5)
        for client in nvml.gpus[0].processes:
            client.sm = 0
        await anyio.sleep_until(start + 1.5)
    _, idle = process_readings(received)
    assert "MPS server" in (idle.utilization_unsupported or "")


@pytest.mark.trio
async def test_mps_sampled_per_client_gives_each_client_its_share(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _mps(tmp_path, mps_samples_clients=True)
    (first, *_) = await _read(nvml, proc.host, 0.5)
    assert first.utilization_unsupported is None
    assert {p.pid: p.sm for p in first.processes} == {55: 0.0, 101: 40.0, 202: 20.0}


@pytest.mark.trio
async def test_mps_showing_only_the_server_is_unsupported_for_memory_and_utilization(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _mps(tmp_path, mps_call_supported=False)
    (first, *_) = await _read(nvml, proc.host, 0.5)
    assert "shows the MPS server (PID 55) on this device, not its clients" in (
        first.memory_unsupported or ""
    )
    assert first.utilization_unsupported == first.memory_unsupported
    assert [p.used_memory_bytes for p in first.processes] == [None]


@pytest.mark.trio
async def test_mig_instances_have_their_processes_and_no_per_process_utilization(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    gpu = h200_gpu(0)
    instances = mig_instances(0, 2)
    instances[0].processes = [FakeProcess(101, used_memory=3 * GIB, sm=50)]
    instances[1].processes = [FakeProcess(202, used_memory=5 * GIB, sm=50)]
    enable_mig(gpu, instances)
    nvml = FakeNvml([gpu], clock=anyio.current_time)
    proc = FakeProc(tmp_path / "proc")
    proc.add(101, pod_cgroup(UID_A, CID_A))
    proc.add(202, pod_cgroup(UID_B, CID_B))
    got: dict[str, DeviceProcesses] = {r.key: r for r in await _read(nvml, proc.host, 0.5)}
    assert sorted(got) == ["MIG-fake-0-7", "MIG-fake-0-8"]  # the instances, not the GPU
    i7 = got["MIG-fake-0-7"]
    assert [(p.pid, p.pod_uid, p.used_memory_bytes) for p in i7.processes] == [
        (101, UID_A, 3 * GIB)
    ]
    assert i7.memory_unsupported is None
    assert "no per-process utilization" in (i7.utilization_unsupported or "")
    assert "Not Supported" in (i7.utilization_unsupported or "")
    assert i7.processes[0].sm is None  # unsupported, never 0


@pytest.mark.trio
async def test_an_older_driver_is_read_through_its_older_calls_learned_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _time_sliced(tmp_path)
    nvml.gpus[0].process_call_version = 2
    nvml.gpus[0].process_utilization_call = "legacy"
    got = await _read(nvml, proc.host, 2.5)
    assert [p.sm for p in got[0].processes] == [60.0, 15.0, 5.0]
    assert len(got) == 3
    # Each newer call was tried once, then the older one used every time.
    assert nvml.calls["compute_processes_v3"] == 1
    assert nvml.calls["compute_processes_v2"] == 3
    assert nvml.calls["processes_utilization_info"] == 1
    assert nvml.calls["process_utilization"] == 3


@pytest.mark.trio
async def test_a_gpu_without_per_process_utilization_keeps_its_memory(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _time_sliced(tmp_path)
    nvml.gpus[0].process_utilization_call = "none"  # an older GPU
    (first, *_) = await _read(nvml, proc.host, 0.5)
    assert "Not Supported" in (first.utilization_unsupported or "")
    assert first.memory_unsupported is None
    assert [p.used_memory_bytes for p in first.processes] == [20 * GIB, 4 * GIB, 1 * GIB]
    assert {p.sm for p in first.processes} == {None}


@pytest.mark.trio
async def test_a_lost_gpu_is_lost_by_its_process_calls_too(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _time_sliced(tmp_path)
    nvml.fail("compute_processes_v3", NvmlCode.GPU_IS_LOST, times=1)
    start = anyio.current_time()
    async with collect_samples(_sampler(nvml, proc.host)) as received:
        await anyio.sleep_until(start + 0.5)
    (fault,) = faults(received)
    assert fault.lost
    assert process_readings(received) == []


@pytest.mark.trio
async def test_a_process_starting_between_the_sizing_call_and_the_read_is_read_again(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _time_sliced(tmp_path)
    nvml.fail("processes_utilization_info", NvmlCode.INSUFFICIENT_SIZE, times=1)
    (first, *_) = await _read(nvml, proc.host, 0.5)
    assert first.utilization_unsupported is None
    assert [p.sm for p in first.processes] == [60.0, 15.0, 5.0]
    assert nvml.calls["processes_utilization_info"] == 2
