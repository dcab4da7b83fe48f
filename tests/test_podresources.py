"""The kubelet PodResources sampler against a fake kubelet on a real unix socket.

grpclib runs on asyncio only, so these tests run there in real time: most drive one
``List`` at a time with ``sample()``; the cadence tests run ``run()`` with intervals of
tens of milliseconds and check lower bounds only (a call never comes before its tick),
which a loaded machine cannot break.
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream
from hypothesis import given, settings
from hypothesis import strategies as st

from keda_gpu_scaler.domain.samples import (
    POD_RESOURCES_SOURCE,
    DeviceHolder,
    DraDevice,
    PodResourcesReading,
    SourceFault,
)
from keda_gpu_scaler.pipeline.supervisor import Sampler
from keda_gpu_scaler.sources.kubelet import (
    DEFAULT_RESOURCE_NAMES,
    PodResourcesSampler,
    ResourceNames,
    default_timeout_s,
    holders_of,
)
from tests.fake_kubelet import (
    GPU,
    FakeKubelet,
    claim,
    container,
    dra_device,
    fake_kubelet,
    gpus,
    listing,
    mig_mixed,
    pod,
    replicas,
)
from tests.waiting import wait_until

# In sorting order: readings list holders sorted.
UUID_A = "GPU-0b3c2d1e-1111-2222-3333-444455556666"
UUID_B = "GPU-4f60bdab-7290-5bab-ee63-d697ab1e6349"
MIG_A = "MIG-1f2e3d4c-0000-1111-2222-333344445555"
MIG_B = "MIG-9a8b7c6d-aaaa-bbbb-cccc-ddddeeeeffff"

Samples = PodResourcesReading | SourceFault


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[FakeKubelet]:
    async with fake_kubelet(tmp_path) as running:
        yield running


def _holder(namespace: str, name: str, ctr: str, resource: str, device: str) -> DeviceHolder:
    return DeviceHolder(
        namespace=namespace, pod=name, container=ctr, resource=resource, device_id=device
    )


async def _reading(sampler: PodResourcesSampler) -> PodResourcesReading:
    sample = await sampler.sample()
    assert isinstance(sample, PodResourcesReading), sample
    return sample


async def _fault(sampler: PodResourcesSampler) -> SourceFault:
    sample = await sampler.sample()
    assert isinstance(sample, SourceFault), sample
    return sample


# ResourceNames


def test_resource_names_parse_prefixes_and_exact_names() -> None:
    names = ResourceNames.parse(" nvidia.com/gpu , nvidia.com/mig-* ,nvidia.com/gpu")
    assert str(names) == "nvidia.com/gpu,nvidia.com/mig-*"
    assert names.entries == ("nvidia.com/gpu", "nvidia.com/mig-*")
    assert names.matches("nvidia.com/gpu")
    assert names.matches("nvidia.com/mig-1g.10gb")
    assert names.matches("nvidia.com/mig-")
    assert not names.matches("nvidia.com/gpu.shared")
    assert not names.matches("nvidia.com/mig")
    assert not names.matches("example.com/nvidia.com/gpu")
    assert repr(names) == "ResourceNames.parse('nvidia.com/gpu,nvidia.com/mig-*')"


def test_default_resource_names_are_whole_gpus_and_mig_of_both_strategies() -> None:
    assert str(DEFAULT_RESOURCE_NAMES) == "nvidia.com/gpu,nvidia.com/mig-*"
    assert DEFAULT_RESOURCE_NAMES.matches(GPU)
    assert DEFAULT_RESOURCE_NAMES.matches("nvidia.com/mig-3g.40gb")
    for other in ("nvidia.com/gpu.shared", "example.com/foo", "hugepages-2Mi", "amd.com/gpu"):
        assert not DEFAULT_RESOURCE_NAMES.matches(other), other


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "no GPU resource name given in ''"),
        ("  ", "no GPU resource name given in '  '"),
        ("nvidia.com/gpu,,nvidia.com/mig-*", "empty GPU resource name (entry 2 of"),
        ("nvidia.com/gpu,", "empty GPU resource name (entry 2 of 'nvidia.com/gpu,')"),
        ("nvidia.com/gpu, *", "GPU resource name '*' (entry 2 of 'nvidia.com/gpu, *')"),
        ("nvidia.com/*gpu", "GPU resource name 'nvidia.com/*gpu' (entry 1 of"),
        ("nvidia.com/gpu nvidia.com/mig-*", "'nvidia.com/gpu nvidia.com/mig-*' (entry 1 of"),
    ],
)
def test_resource_names_errors_name_the_entry(text: str, named: str) -> None:
    with pytest.raises(ValueError, match="resource name") as caught:
        ResourceNames.parse(text)
    assert named in str(caught.value)


def test_resource_names_errors_say_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"would match every resource; give a prefix"):
        ResourceNames.parse("*")
    with pytest.raises(ValueError, match="separate names with commas"):
        ResourceNames.parse("nvidia.com/gpu nvidia.com/mig-*")
    with pytest.raises(ValueError, match=r"'\*' may only end a name"):
        ResourceNames.parse("nvidia.com/mig-*-10gb")
    with pytest.raises(ValueError, match="no GPU resource name given"):
        ResourceNames(())


_PART = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789.-", min_size=1, max_size=12)
_NAME = st.builds(
    lambda domain, name, prefix: f"{domain}/{name}{'*' if prefix else ''}",
    _PART,
    _PART,
    st.booleans(),
)


@settings(deadline=None)
@given(st.lists(_NAME, min_size=1, max_size=5))
def test_resource_names_round_trip_through_their_text(entries: list[str]) -> None:
    names = ResourceNames.parse(",".join(entries))
    assert ResourceNames.parse(str(names)) == names
    assert names.entries == tuple(dict.fromkeys(entries))
    for entry in entries:
        assert names.matches(entry.rstrip("*"))


# Sampler options


def test_default_timeout_is_under_the_interval_and_a_few_seconds_at_most() -> None:
    assert default_timeout_s(5.0) == 2.0
    assert default_timeout_s(1.0) == pytest.approx(0.8)
    sampler = PodResourcesSampler("/run/kubelet.sock")
    assert (sampler.name, sampler.interval_s, sampler.timeout_s) == (POD_RESOURCES_SOURCE, 5.0, 2.0)
    assert sampler.resource_names == DEFAULT_RESOURCE_NAMES


@pytest.mark.parametrize(
    ("interval_s", "timeout_s", "message"),
    [
        (0.0, None, "interval must be a positive number of seconds, not 0.0"),
        (math.nan, None, "interval must be a positive number of seconds, not nan"),
        (1.0, 1.5, "at most the interval (1 s), not 1.5"),
        (5.0, 0.0, "timeout must be positive and at most the interval (5 s), not 0.0"),
    ],
)
def test_bad_options_are_refused_by_name(
    interval_s: float, timeout_s: float | None, message: str
) -> None:
    with pytest.raises(ValueError, match="PodResources") as caught:
        PodResourcesSampler("/run/kubelet.sock", interval_s=interval_s, timeout_s=timeout_s)
    assert message in str(caught.value)


def test_the_sampler_fits_the_supervisors_protocol() -> None:
    sampler: Sampler = PodResourcesSampler("/run/kubelet.sock")  # checked by mypy
    assert sampler.name == POD_RESOURCES_SOURCE == "pod-resources"


def test_an_empty_socket_path_is_refused() -> None:
    with pytest.raises(ValueError, match="socket path is empty"):
        PodResourcesSampler("")


# Conversion, sans-I/O


def test_listing_order_does_not_change_the_reading() -> None:
    a = pod("ml", "a", containers=[container("c", devices=[gpus(UUID_B, UUID_A)])])
    b = pod("ml", "b", containers=[container("c", devices=[gpus(MIG_A)])])
    first = holders_of(listing(a, b), DEFAULT_RESOURCE_NAMES)
    assert first == holders_of(listing(b, a), DEFAULT_RESOURCE_NAMES)
    assert [h.device_id for h in first[0]] == [UUID_A, UUID_B, MIG_A]


# One List at a time, over the socket


@pytest.mark.anyio
async def test_whole_gpus_one_holder_per_device_id(kubelet: FakeKubelet) -> None:
    kubelet.set_pods(
        [pod("ml", "llm-0", containers=[container("vllm", devices=[gpus(UUID_A, UUID_B)])])]
    )
    sampler = PodResourcesSampler(kubelet.socket_path, interval_s=0.5)
    try:
        before = anyio.current_time()
        reading = await _reading(sampler)
        after = anyio.current_time()
    finally:
        sampler.close()
    assert reading.source == POD_RESOURCES_SOURCE
    assert reading.period_s == 0.5
    assert before <= reading.taken_at <= after
    assert reading.holders == (
        _holder("ml", "llm-0", "vllm", GPU, UUID_A),
        _holder("ml", "llm-0", "vllm", GPU, UUID_B),
    )
    assert reading.dra == ()
    assert len(kubelet.list_calls) == 1


@pytest.mark.anyio
async def test_mig_instances_of_the_single_and_mixed_strategies(kubelet: FakeKubelet) -> None:
    kubelet.set_pods(
        [
            pod("ml", "single", containers=[container("c", devices=[gpus(MIG_A)])]),
            pod("ml", "mixed", containers=[container("c", devices=[mig_mixed("1g.10gb", MIG_B)])]),
        ]
    )
    sampler = PodResourcesSampler(kubelet.socket_path)
    try:
        reading = await _reading(sampler)
    finally:
        sampler.close()
    assert reading.holders == (
        _holder("ml", "mixed", "c", "nvidia.com/mig-1g.10gb", MIG_B),
        _holder("ml", "single", "c", GPU, MIG_A),
    )


@pytest.mark.anyio
async def test_replicas_shared_by_two_pods_give_each_pod_a_holder(kubelet: FakeKubelet) -> None:
    kubelet.set_pods(
        [
            pod("a", "one", containers=[container("c", devices=[gpus(*replicas(UUID_A, 0))])]),
            pod("b", "two", containers=[container("c", devices=[gpus(*replicas(UUID_A, 3))])]),
        ]
    )
    sampler = PodResourcesSampler(kubelet.socket_path)
    try:
        reading = await _reading(sampler)
    finally:
        sampler.close()
    assert reading.holders == (
        _holder("a", "one", "c", GPU, f"{UUID_A}::0"),
        _holder("b", "two", "c", GPU, f"{UUID_A}::3"),
    )


@pytest.mark.anyio
async def test_a_renamed_resource_counts_only_when_configured(kubelet: FakeKubelet) -> None:
    shared = "nvidia.com/gpu.shared"
    kubelet.set_pods(
        [
            pod(
                "ml",
                "p",
                containers=[container("c", devices=[gpus(f"{UUID_A}::1", resource=shared)])],
            )
        ]
    )
    renamed = PodResourcesSampler(kubelet.socket_path, resource_names=ResourceNames.parse(shared))
    default = PodResourcesSampler(kubelet.socket_path)
    try:
        assert (await _reading(renamed)).holders == (
            _holder("ml", "p", "c", shared, f"{UUID_A}::1"),
        )
        assert (await _reading(default)).holders == ()
    finally:
        renamed.close()
        default.close()


def _sampler_logs(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("keda_gpu_scaler.sources.kubelet")]


@pytest.mark.anyio
async def test_devices_of_other_resources_are_dropped(
    kubelet: FakeKubelet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.sources.kubelet")
    kubelet.set_pods(
        [
            pod(
                "ml",
                "p",
                containers=[
                    container(
                        "c",
                        devices=[
                            gpus("foo-0", "foo-1", resource="example.com/foo"),
                            gpus("hp-0", resource="hugepages-2Mi"),
                            gpus(UUID_A),
                        ],
                        cpu_ids=[2, 3],
                    ),
                    container("sidecar", devices=[gpus("nic-0", resource="example.com/nic")]),
                ],
            ),
            pod("web", "nginx", containers=[container("nginx")]),
        ]
    )
    sampler = PodResourcesSampler(kubelet.socket_path)
    try:
        reading = await _reading(sampler)
    finally:
        sampler.close()
    assert reading.holders == (_holder("ml", "p", "c", GPU, UUID_A),)
    [answering] = _sampler_logs(caplog)
    assert (answering.__dict__["pods"], answering.__dict__["gpu_devices_held"]) == (2, 1)


@pytest.mark.anyio
async def test_dra_devices_are_mapped_whatever_the_driver_gpus_marked_by_theirs(
    kubelet: FakeKubelet,
) -> None:
    gpu_claim = claim(
        "ml",
        "llm-gpu",
        dra_device("gpu.nvidia.com", "node-1", "gpu-0", cdi=["k8s.gpu.nvidia.com/device=gpu-0"]),
        dra_device("gpu.nvidia.com", "node-1", "gpu-1", share_id="7f3c"),
    )
    nic_claim = claim("net", "rdma", dra_device("rdma.example.com", "node-1", "mlx5-0"))
    kubelet.set_pods(
        [pod("ml", "llm-0", containers=[container("vllm", dra=[gpu_claim, nic_claim])])]
    )
    sampler = PodResourcesSampler(kubelet.socket_path)
    try:
        reading = await _reading(sampler)
    finally:
        sampler.close()
    common: dict[str, Any] = {"namespace": "ml", "pod": "llm-0", "container": "vllm"}
    assert reading.holders == ()
    assert reading.dra == (
        DraDevice(
            **common,
            claim_namespace="ml",
            claim_name="llm-gpu",
            driver="gpu.nvidia.com",
            pool="node-1",
            device="gpu-0",
            gpu=True,
        ),
        DraDevice(
            **common,
            claim_namespace="ml",
            claim_name="llm-gpu",
            driver="gpu.nvidia.com",
            pool="node-1",
            device="gpu-1",
            share_id="7f3c",
            gpu=True,
        ),
        DraDevice(
            **common,
            claim_namespace="net",
            claim_name="rdma",
            driver="rdma.example.com",
            pool="node-1",
            device="mlx5-0",
        ),
    )


@pytest.mark.anyio
async def test_a_pod_that_goes_away_is_missing_from_the_next_reading(
    kubelet: FakeKubelet,
) -> None:
    stays = pod("ml", "stays", containers=[container("c", devices=[gpus(UUID_A)])])
    leaves = pod("ml", "leaves", containers=[container("c", devices=[gpus(UUID_B)])])
    kubelet.set_pods([stays, leaves])
    sampler = PodResourcesSampler(kubelet.socket_path)
    try:
        assert [h.pod for h in (await _reading(sampler)).holders] == ["leaves", "stays"]
        kubelet.set_pods([stays])
        assert [h.pod for h in (await _reading(sampler)).holders] == ["stays"]
    finally:
        sampler.close()


@pytest.mark.anyio
async def test_a_socket_that_disappears_is_a_fault_until_it_comes_back(
    kubelet: FakeKubelet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.sources.kubelet")
    kubelet.set_pods([pod("ml", "p", containers=[container("c", devices=[gpus(UUID_A)])])])
    sampler = PodResourcesSampler(kubelet.socket_path)
    try:
        await _reading(sampler)
        await kubelet.stop()
        assert not await anyio.Path(kubelet.socket_path).exists()
        before = anyio.current_time()
        fault = await _fault(sampler)
        assert (fault.source, fault.key) == (POD_RESOURCES_SOURCE, None)
        assert fault.at >= before
        assert fault.reason == (
            f"kubelet PodResources List failed: {kubelet.socket_path}: no socket there: mount "
            "the kubelet's pod-resources directory into this pod (read-only is enough), or "
            "the kubelet is restarting"
        )
        await _fault(sampler)
        # An answer, then two failures logged once, with the cause.
        logged = [(r.getMessage(), getattr(r, "error", None)) for r in _sampler_logs(caplog)]
        assert [message for message, _ in logged] == [
            "kubelet PodResources List answering",
            "kubelet PodResources List failing",
        ]
        assert "no socket there" in str(logged[1][1])
        await kubelet.start()
        reading = await _reading(sampler)
        assert reading.holders == (_holder("ml", "p", "c", GPU, UUID_A),)
        assert kubelet.connections_accepted == 2  # a new connection to the new kubelet
        # Answering again, and said so.
        assert _sampler_logs(caplog)[-1].getMessage() == "kubelet PodResources List answering"
        assert len(_sampler_logs(caplog)) == 3
    finally:
        sampler.close()


@pytest.mark.anyio
async def test_a_socket_nobody_listens_on_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "kubelet.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(path))  # a socket file left by a kubelet that died: nobody listens
    sampler = PodResourcesSampler(str(path))
    try:
        fault = await _fault(sampler)
    finally:
        sampler.close()
    assert fault.reason == (
        f"kubelet PodResources List failed: {path}: connection refused: the kubelet is not "
        "listening (restarting?)"
    )


@pytest.mark.anyio
async def test_rate_limited_calls_are_faults_that_say_so(kubelet: FakeKubelet) -> None:
    kubelet.set_pods([pod("ml", "p", containers=[container("c", devices=[gpus(UUID_A)])])])
    kubelet.exhaust(times=2)
    sampler = PodResourcesSampler(kubelet.socket_path)
    try:
        faults = [await _fault(sampler), await _fault(sampler)]
        reading = await _reading(sampler)
    finally:
        sampler.close()
    expected = (
        f"kubelet PodResources List failed: the kubelet rate-limited the socket "
        f"{kubelet.socket_path} (RESOURCE_EXHAUSTED: rejected by rate limit); another client "
        "may be calling it too often"
    )
    assert [f.reason for f in faults] == [expected, expected]
    assert reading.holders == (_holder("ml", "p", "c", GPU, UUID_A),)
    assert len(kubelet.list_calls) == 3
    # A rate-limited call is an answer: the connection is kept, not reopened.
    assert kubelet.connections_accepted == 1


@pytest.mark.anyio
async def test_a_kubelet_that_does_not_answer_in_time_is_a_fault(kubelet: FakeKubelet) -> None:
    kubelet.hold(seconds=5.0)
    sampler = PodResourcesSampler(kubelet.socket_path, interval_s=0.1, timeout_s=0.05)
    try:
        started = anyio.current_time()
        fault = await _fault(sampler)
        assert anyio.current_time() - started < 1.0
        assert fault.reason == (
            f"kubelet PodResources List failed: {kubelet.socket_path} did not answer within 0.05 s"
        )
        kubelet.hold(0)
        await _reading(sampler)
    finally:
        sampler.close()


# The actor


async def _next(receive: MemoryObjectReceiveStream[Samples]) -> Samples:
    with anyio.fail_after(2):
        return await receive.receive()


@pytest.mark.anyio
async def test_run_calls_list_once_per_interval_and_never_ahead_of_its_tick(
    kubelet: FakeKubelet,
) -> None:
    interval = 0.04
    sampler = PodResourcesSampler(kubelet.socket_path, interval_s=interval)
    send, receive = anyio.create_memory_object_stream[Samples](10)
    async with receive, anyio.create_task_group() as tg:
        began = anyio.current_time()
        await tg.start(sampler.run, send)
        samples = [await _next(receive) for _ in range(4)]
        tg.cancel_scope.cancel()
    assert all(isinstance(s, PodResourcesReading) for s in samples)
    calls = kubelet.list_calls
    assert len(calls) >= 4
    # Tick k is due at start + k * interval; no call may come before it.
    for k, at in enumerate(calls):
        assert at - began >= k * interval - 1e-6, (k, at - began)


@pytest.mark.anyio
async def test_run_is_ready_at_once_keeps_going_through_faults_and_recovers(
    kubelet: FakeKubelet,
) -> None:
    kubelet.set_pods([pod("ml", "p", containers=[container("c", devices=[gpus(UUID_A)])])])
    await kubelet.stop()
    sampler = PodResourcesSampler(kubelet.socket_path, interval_s=0.02)
    send, receive = anyio.create_memory_object_stream[Samples](10)
    async with receive, anyio.create_task_group() as tg:
        await tg.start(sampler.run, send)  # no socket yet: ready all the same
        assert isinstance(await _next(receive), SourceFault)
        assert isinstance(await _next(receive), SourceFault)
        await kubelet.start()
        sample = await _next(receive)
        while isinstance(sample, SourceFault):  # a tick may have fallen between the two
            sample = await _next(receive)
        assert sample.holders == (_holder("ml", "p", "c", GPU, UUID_A),)
        await kubelet.stop()
        assert isinstance(await _next(receive), SourceFault)
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_run_goes_on_after_calls_that_time_out(kubelet: FakeKubelet) -> None:
    # grpclib ends a late call by cancelling the task itself: the actor's own cancel
    # scopes must still work afterwards (the next ticks, and the cancellation at the end).
    kubelet.hold(seconds=5.0)
    sampler = PodResourcesSampler(kubelet.socket_path, interval_s=0.04, timeout_s=0.02)
    send, receive = anyio.create_memory_object_stream[Samples](10)
    async with receive, anyio.create_task_group() as tg:
        await tg.start(sampler.run, send)
        for _ in range(2):
            fault = await _next(receive)
            assert isinstance(fault, SourceFault)
            assert "did not answer within 0.02 s" in fault.reason
        kubelet.hold(0)
        sample = await _next(receive)
        while isinstance(sample, SourceFault):  # a call may have been on its way
            sample = await _next(receive)
        tg.cancel_scope.cancel()
    assert isinstance(sample, PodResourcesReading)  # an answer after the late calls


@pytest.mark.anyio
async def test_run_closes_its_connection_and_channel_on_the_way_out(
    kubelet: FakeKubelet,
) -> None:
    sampler = PodResourcesSampler(kubelet.socket_path, interval_s=0.02)
    send, receive = anyio.create_memory_object_stream[Samples](10)
    with receive:
        async with anyio.create_task_group() as tg:
            await tg.start(sampler.run, send)
            await _next(receive)
            assert kubelet.connections() == 1
            tg.cancel_scope.cancel()
        await wait_until(lambda: kubelet.connections() == 0, timeout_s=1.0)
        while True:  # what was sent before the end, then the end: run() closed its send end
            try:
                receive.receive_nowait()
            except anyio.EndOfStream:
                break


@pytest.mark.anyio
async def test_failures_are_logged_when_they_start_and_change_and_recovery_once(
    kubelet: FakeKubelet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.sources.kubelet")
    sampler = PodResourcesSampler(kubelet.socket_path)
    try:
        await _reading(sampler)
        kubelet.exhaust(times=2)
        await _fault(sampler)
        await _fault(sampler)
        await kubelet.stop()
        await _fault(sampler)
        await kubelet.start()
        await _reading(sampler)
        await _reading(sampler)
    finally:
        sampler.close()
    records = [
        (r.levelname, r.getMessage(), getattr(r, "error", None))
        for r in caplog.records
        if r.name.startswith("keda_gpu_scaler.sources.kubelet")
    ]
    assert [(level, message) for level, message, _ in records] == [
        ("INFO", "kubelet PodResources List answering"),
        ("WARNING", "kubelet PodResources List failing"),
        ("WARNING", "kubelet PodResources List failing"),
        ("INFO", "kubelet PodResources List answering"),
    ]
    assert "rate-limited" in str(records[1][2])
    assert "no socket there" in str(records[2][2])
