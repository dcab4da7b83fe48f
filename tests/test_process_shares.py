"""``podSelector`` over a device shared with another workload: each workload measures its
own pods' processes (``sharedDevices: processes``), from the real NVML sampler's per-process
readings (fake NVML, fake host /proc) folded with the kubelet's answer and the pod watch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import trio.testing

from keda_gpu_scaler.domain.decision import decide, measure
from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData
from keda_gpu_scaler.domain.samples import (
    POD_RESOURCES_SOURCE,
    PODS_SOURCE,
    DeviceHolder,
    PodInfo,
    PodResourcesReading,
    PodsReading,
    Sample,
)
from keda_gpu_scaler.domain.snapshot import Snapshot
from keda_gpu_scaler.domain.trigger import TriggerSpec, parse_trigger
from keda_gpu_scaler.pipeline.tap import OUTSIDE_ANY_POD, Tap, TapFilter, TapProcesses
from keda_gpu_scaler.sources.nvml.backend import Utilization
from keda_gpu_scaler.sources.nvml.fake_backend import (
    FakeGpu,
    FakeNvml,
    enable_mig,
    h200_gpu,
    mig_instances,
)
from keda_gpu_scaler.sources.nvml.fake_processes import FakeMps, FakeProcess
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler
from keda_gpu_scaler.sources.procfs import ProcessOwners
from keda_gpu_scaler.testing import collect_samples, inline, snapshot_after
from tests.fake_proc import FakeProc, pod_cgroup

GIB = 1 << 30
MIB = 1 << 20
GPU0 = "GPU-fake-h200-0000"
GPU1 = "GPU-fake-h200-0001"
POD = {
    "chat-0": "0c0c0c0c-0000-4000-8000-000000000001",
    "batch-0": "0b0b0b0b-0000-4000-8000-000000000002",
    "train-0": "0e0e0e0e-0000-4000-8000-000000000003",
    "mps-control": "0d0d0d0d-0000-4000-8000-000000000004",
}


def _holder(pod: str, device_id: str) -> DeviceHolder:
    return DeviceHolder(
        namespace="ml", pod=pod, container="main", resource="nvidia.com/gpu", device_id=device_id
    )


def _pods(*extra: PodInfo) -> tuple[PodInfo, ...]:
    base = (
        PodInfo(namespace="ml", name="chat-0", uid=POD["chat-0"], labels={"app": "chat"}),
        PodInfo(namespace="ml", name="batch-0", uid=POD["batch-0"], labels={"app": "batch"}),
        PodInfo(namespace="ml", name="train-0", uid=POD["train-0"], labels={"app": "train"}),
        PodInfo(
            namespace="nvidia", name="mps-control", uid=POD["mps-control"], labels={"app": "mps"}
        ),
    )
    return (*base, *extra)


# chat-0 and batch-0 time-slice GPU 0 (replicas ::0 and ::1); train-0 has GPU 1 alone.
HOLDERS = (
    _holder("chat-0", f"{GPU0}::0"),
    _holder("batch-0", f"{GPU0}::1"),
    _holder("train-0", GPU1),
)


def _node(tmp_path: Path) -> tuple[FakeNvml, FakeProc]:
    gpus = [h200_gpu(i) for i in (1, 2)]
    gpus[0].uuid, gpus[1].uuid = GPU0, GPU1
    nvml = FakeNvml(gpus, clock=anyio.current_time)
    gpus[0].utilization = Utilization(gpu=95, memory=40)
    gpus[0].memory_used = 30 * GIB
    gpus[0].processes = [
        FakeProcess(101, used_memory=20 * GIB, sm=70, memory=30),
        FakeProcess(202, used_memory=6 * GIB, sm=10, memory=4),
        FakeProcess(303, used_memory=1 * GIB, sm=5),  # a host process: nobody's
    ]
    gpus[1].utilization = Utilization(gpu=50, memory=20)
    proc = FakeProc(tmp_path / "proc")
    proc.add(101, pod_cgroup(POD["chat-0"], "1" * 64))
    proc.add(202, pod_cgroup(POD["batch-0"], "2" * 64, qos="besteffort"))
    proc.add(303, "0::/system.slice/profiler.service\n", comm="nsys")
    return nvml, proc


def _spec(selector: str, **metadata: str) -> TriggerSpec:
    return parse_trigger({"podSelector": selector, "cooldownSeconds": "0", **metadata}, "ml")


async def _run(
    nvml: FakeNvml,
    owners: ProcessOwners | None,
    until: float,
    *,
    holders: Sequence[DeviceHolder] = HOLDERS,
    pods: Sequence[PodInfo] = (),
    between: Any = None,
    between_at: float | None = None,
) -> tuple[Snapshot, float, list[Sample]]:
    """The sampler for ``until`` seconds (``between`` called at ``between_at``, half time
    by default), then the kubelet's answer and the pod watch at the end: the snapshot, its
    time and the samples."""
    start = anyio.current_time()
    sampler = NvmlSampler(
        nvml,
        process_owners=owners,
        process_interval_s=1.0,
        pcie_interval_s=None,
        call_in_thread=inline,
    )
    async with collect_samples(sampler) as received:
        if between is not None:
            await anyio.sleep_until(start + (until / 2 if between_at is None else between_at))
            between()
        await anyio.sleep_until(start + until)
    now = start + until
    attribution = PodResourcesReading(
        source=POD_RESOURCES_SOURCE, taken_at=now, period_s=5.0, holders=tuple(holders)
    )
    watched = PodsReading(
        source=PODS_SOURCE, taken_at=now, period_s=10.0, node="n1", pods=tuple(pods) or _pods()
    )
    samples = [*received, attribution, watched]
    return snapshot_after(samples, now), now, samples


@pytest.mark.trio
async def test_two_workloads_time_slicing_one_gpu_each_get_their_own_share(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _node(tmp_path)
    snapshot, now, _ = await _run(nvml, proc.host, 0.5)
    chat, batch = _spec("app=chat"), _spec("app=batch")
    assert measure(chat, snapshot, now).value == 70.0
    assert measure(batch, snapshot, now).value == 10.0  # not the device's 95
    mib = _spec("app=chat", metricType="memory_used_mib")
    assert measure(mib, snapshot, now).value == 20 * 1024
    assert (
        measure(_spec("app=batch", metricType="memory_used_mib"), snapshot, now).value == 6 * 1024
    )
    percent = measure(_spec("app=chat", metricType="memory_used_percent"), snapshot, now)
    assert percent.value == pytest.approx(20 * 1024 / (nvml.gpus[0].memory_total // MIB) * 100)
    assert measure(_spec("app=chat", metricType="memory_utilization"), snapshot, now).value == 30
    # sm_active's share is the processes' SM utilization, GPM or not.
    assert measure(_spec("app=batch", metricType="sm_active"), snapshot, now).value == 10.0
    why = decide(chat, snapshot, None, now).explanation
    assert "GPU 0 (chat-0; shared with ml/batch-0; own processes)=70" in why
    # Whole, on request: the device's number, neighbours included.
    assert measure(_spec("app=batch", sharedDevices="whole"), snapshot, now).value == 95.0


@pytest.mark.trio
async def test_an_exclusive_device_is_measured_whole_as_before(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, _ = _node(tmp_path)
    # Per-process readings off: an exclusive device does not need them.
    snapshot, now, _ = await _run(nvml, None, 0.5)
    assert measure(_spec("app=train"), snapshot, now).value == 50.0
    assert measure(_spec("app=train", metricType="temperature"), snapshot, now).value == 36.0
    # Both time-slicing pods selected: nobody else's load on GPU 0, which counts once, whole.
    both = measure(_spec("app in (chat,batch)"), snapshot, now)
    assert both.value == 95.0


@pytest.mark.trio
async def test_a_process_outside_any_pod_is_in_no_workloads_share_and_the_tap_names_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _node(tmp_path)
    snapshot, now, samples = await _run(nvml, proc.host, 0.5)
    chat = measure(_spec("app=chat"), snapshot, now).value
    batch = measure(_spec("app=batch"), snapshot, now).value
    assert chat + batch == 80.0  # the host process's 5 % is neither's
    tap = Tap()
    with tap.subscribe(TapFilter(device="0")) as subscription:
        tap.folded(samples, snapshot)
        events = [msgspec.json.decode(line) async for line in _drain(subscription)]
    (processes,) = [e for e in events if e["type"] == "processes"]
    assert processes["key"] == GPU0
    assert processes["outside_pods"] == 1
    assert [(p["pid"], p["pod"]) for p in processes["processes"]] == [
        (101, "ml/chat-0"),
        (202, "ml/batch-0"),
        (303, OUTSIDE_ANY_POD),
    ]
    assert TapProcesses.__struct_config__.tag == "processes"


async def _drain(subscription: Any) -> Any:
    subscription.close()
    async for line in subscription:
        yield line


@pytest.mark.trio
async def test_a_process_that_exits_between_samples_leaves_its_workloads_share(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _node(tmp_path)

    def exit_batch() -> None:
        nvml.exit_process(0, 202)
        proc.remove(202)

    snapshot, now, _ = await _run(nvml, proc.host, 1.5, between=exit_batch)
    # batch-0 holds its replica still, with no process: it uses none of the GPU.
    assert measure(_spec("app=batch"), snapshot, now).value == 0.0
    assert measure(_spec("app=batch", metricType="memory_used_mib"), snapshot, now).value == 0.0
    assert measure(_spec("app=chat"), snapshot, now).value == 70.0


@pytest.mark.trio
async def test_a_pid_reused_by_another_pod_is_unavailable_for_one_reading_then_its(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    def reuse(nvml: FakeNvml, proc: FakeProc) -> None:
        # chat-0's process 101 exits; batch-0 starts a process that gets PID 101.
        nvml.exit_process(0, 101)
        nvml.gpus[0].processes.append(FakeProcess(101, used_memory=2 * GIB, sm=25))
        proc.add(101, pod_cgroup(POD["batch-0"], "2" * 64, qos="besteffort"))

    # Read at 0 s and 1 s; the PID changes hands at 0.5 s.
    nvml, proc = _node(tmp_path / "a")
    snapshot, now, _ = await _run(
        nvml, proc.host, 1.5, between=lambda: reuse(nvml, proc), between_at=0.5
    )
    with pytest.raises(NoData) as caught:
        measure(_spec("app=batch"), snapshot, now)
    assert "PID 101 of its pods belonged to another container" in str(caught.value)
    # Its memory is known, and chat-0 has no process any more: none of the samples is its.
    batch_mib = _spec("app=batch", metricType="memory_used_mib")
    assert measure(batch_mib, snapshot, now).value == 8 * 1024
    assert measure(_spec("app=chat"), snapshot, now).value == 0.0
    # The reading at 2 s has the new process's samples alone.
    nvml, proc = _node(tmp_path / "b")
    later, at, _ = await _run(
        nvml, proc.host, 2.5, between=lambda: reuse(nvml, proc), between_at=0.5
    )
    assert measure(_spec("app=batch"), later, at).value == 10.0 + 25.0


def _mps_node(tmp_path: Path, **mps: bool) -> tuple[FakeNvml, FakeProc]:
    nvml, proc = _node(tmp_path)
    gpu = nvml.gpus[0]
    gpu.processes = gpu.processes[:2]  # chat-0 and batch-0 are MPS clients
    gpu.mps = FakeMps(FakeProcess(55, used_memory=GIB // 4), **mps)
    proc.add(55, pod_cgroup(POD["mps-control"], "5" * 64), comm="nvidia-cuda-mps-server")
    return nvml, proc


@pytest.mark.trio
async def test_mps_replicas_share_memory_by_client_and_no_utilization_nvml_gives_the_server(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _mps_node(tmp_path)
    snapshot, now, _ = await _run(nvml, proc.host, 0.5)
    with pytest.raises(NoData) as caught:
        measure(_spec("app=chat"), snapshot, now)
    assert str(caught.value).startswith(
        "GPU 0 is shared with ml/batch-0, and NVML samples the MPS clients' work as the MPS "
        "server's (PID 55) on this device"
    )
    assert "sharedDevices: whole" in str(caught.value)
    assert measure(_spec("app=chat", metricType="memory_used_mib"), snapshot, now).value == 20480
    assert measure(_spec("app=batch", metricType="memory_used_mib"), snapshot, now).value == 6144
    # The MPS server's own memory is no client's, and whole is the device.
    assert measure(_spec("app=chat", sharedDevices="whole"), snapshot, now).value == 95.0


@pytest.mark.trio
async def test_mps_sampled_per_client_gives_each_workload_its_share(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _mps_node(tmp_path, mps_samples_clients=True)
    snapshot, now, _ = await _run(nvml, proc.host, 0.5)
    assert measure(_spec("app=chat"), snapshot, now).value == 70.0
    assert measure(_spec("app=batch"), snapshot, now).value == 10.0


@pytest.mark.trio
async def test_a_shared_mig_instance_is_unavailable_unless_measured_whole(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    gpu = FakeGpu(GPU0)
    instances = mig_instances(0, 2)
    instances[0].memory_used = 9 * GIB
    instances[0].gpm = {2: 64.0}  # SM_UTIL
    instances[0].processes = [
        FakeProcess(101, used_memory=4 * GIB, sm=40),
        FakeProcess(202, used_memory=5 * GIB, sm=20),
    ]
    enable_mig(gpu, instances)
    nvml = FakeNvml([gpu], clock=anyio.current_time)
    proc = FakeProc(tmp_path / "proc")
    proc.add(101, pod_cgroup(POD["chat-0"], "1" * 64))
    proc.add(202, pod_cgroup(POD["batch-0"], "2" * 64))
    # Both pods time-slice MIG instance 7 of GPU 0.
    holders = (_holder("chat-0", "MIG-fake-0-7::0"), _holder("batch-0", "MIG-fake-0-7::1"))
    snapshot, now, _ = await _run(nvml, proc.host, 1.5, holders=holders)
    with pytest.raises(NoData) as caught:
        measure(_spec("app=chat", metricType="sm_active"), snapshot, now)
    message = str(caught.value)
    assert message.startswith("MIG 0:7 is shared with ml/batch-0, and NVML gives no per-process")
    assert "Not Supported" in message
    # Whole: the instance's own GPM reading; memory per process is known on MIG.
    whole = _spec("app=chat", metricType="sm_active", sharedDevices="whole")
    assert measure(whole, snapshot, now).value == 64.0
    assert measure(_spec("app=chat", metricType="memory_used_mib"), snapshot, now).value == 4096


@pytest.mark.trio
async def test_without_per_process_readings_a_shared_device_is_unavailable_naming_why(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, _ = _node(tmp_path)
    snapshot, now, _ = await _run(nvml, None, 0.5)
    with pytest.raises(NoData) as caught:
        measure(_spec("app=chat"), snapshot, now)
    assert str(caught.value) == (
        "GPU 0 is shared with ml/batch-0, and per-process readings are off on this node "
        "(--host-proc is not set); sharedDevices: whole measures the whole device, its "
        "neighbours' load included"
    )
    assert measure(_spec("app=chat", sharedDevices="whole"), snapshot, now).value == 95.0


@pytest.mark.trio
async def test_a_shared_device_metric_nvml_has_no_per_process_reading_of(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _node(tmp_path)
    snapshot, now, _ = await _run(nvml, proc.host, 0.5)
    for metric in ("power_draw", "temperature", "tensor_active", "pcie_rx_kbps"):
        with pytest.raises(NoData, match=f"{metric} has no per-process reading"):
            measure(_spec("app=chat", metricType=metric), snapshot, now)
    power = measure(
        _spec("app=chat", metricType="power_draw", sharedDevices="whole"), snapshot, now
    )
    assert power.value == 123.59
    with pytest.raises(NoData, match="windowSeconds does not apply"):
        measure(_spec("app=chat", windowSeconds="10"), snapshot, now)


@pytest.mark.trio
async def test_a_stale_per_process_reading_is_no_share(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _node(tmp_path)
    snapshot, now, _ = await _run(nvml, proc.host, 0.5)
    later = now + 3.5  # three periods of 1 s, and a half
    spec = _spec("app=chat")
    measured = measure(spec, snapshot, now)
    assert measured.fresh_until == now - 0.5 + 3.0
    stale = msgspec.structs.replace(snapshot, version=2)
    with pytest.raises(NoData, match=r"its per-process reading is stale: 4\.0 s old \(limit 3 s\)"):
        # The device reading is stale too by then: fresh it, to see the processes' rule.
        measure(spec, _fresh_readings(stale, later), later)


def _fresh_readings(snapshot: Snapshot, now: float) -> Snapshot:
    nodes = dict(snapshot.nodes)
    view = nodes[""]
    devices = {
        key: msgspec.structs.replace(
            d,
            reading=None if d.reading is None else msgspec.structs.replace(d.reading, taken_at=now),
        )
        for key, d in view.devices.items()
    }
    attribution = view.attribution
    assert attribution is not None
    nodes[""] = msgspec.structs.replace(
        view, devices=devices, attribution=msgspec.structs.replace(attribution, taken_at=now)
    )
    pods = snapshot.pods
    assert pods is not None
    return msgspec.structs.replace(
        snapshot, nodes=nodes, pods=msgspec.structs.replace(pods, taken_at=now)
    )


@pytest.mark.trio
async def test_a_neighbour_joining_the_selection_makes_the_device_whole_again_at_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    nvml, proc = _node(tmp_path)
    _, now, samples = await _run(nvml, proc.host, 0.5)
    spec = _spec("tier=web")
    web = (
        PodInfo(namespace="ml", name="chat-0", uid=POD["chat-0"], labels={"tier": "web"}),
        PodInfo(namespace="ml", name="batch-0", uid=POD["batch-0"], labels={"tier": "batch"}),
    )
    first = snapshot_after(
        [
            *samples,
            PodsReading(source=PODS_SOURCE, taken_at=now, period_s=10.0, node="n1", pods=web),
        ],
        now,
    )
    measured = measure(spec, first, now)
    assert measured.value == 70.0
    # batch-0 relabelled into the selection: the same node view, another scope. The part
    # measured by process must not be lent to it.
    relabelled = (web[0], msgspec.structs.replace(web[1], labels={"tier": "web"}))
    second = snapshot_after(
        [
            *samples,
            PodsReading(
                source=PODS_SOURCE, taken_at=now, period_s=10.0, node="n1", pods=relabelled
            ),
        ],
        now,
    )
    second = msgspec.structs.replace(second, nodes=first.nodes, pod_nodes=first.pod_nodes)
    assert measure(spec, second, now, previous=measured).value == 95.0


def test_shared_devices_is_checked_and_ignored_without_pod_selector() -> None:
    with pytest.raises(InvalidTrigger) as caught:
        parse_trigger({"podSelector": "app=x", "sharedDevices": "partial"}, "ml")
    assert (caught.value.key, caught.value.value) == ("sharedDevices", "partial")
    assert "processes, whole" in str(caught.value)
    spec = parse_trigger({"sharedDevices": "whole"}, "ml")
    assert spec.warnings == (
        'sharedDevices "whole" is ignored without podSelector (every GPU is measured whole)',
    )
    assert str(parse_trigger({"podSelector": "app=x"}, "ml").shared_devices) == "processes"
