"""Self-metrics, probes, gRPC health and the debug tap, over real sockets on 127.0.0.1."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx
import pytest
from grpclib.client import Channel
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from prometheus_client.parser import text_string_to_metric_families

from keda_gpu_scaler.app.cli import build_parser
from keda_gpu_scaler.app.scaler.compose import RunningScaler
from keda_gpu_scaler.app.scaler.serve_flags import pod_resources_socket
from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT
from keda_gpu_scaler.serving._proto.externalscaler import (
    ExternalScalerStub,
    GetMetricsRequest,
    ScaledObjectRef,
)
from keda_gpu_scaler.sources.fake import FakeGpuSource
from keda_gpu_scaler.sources.kubelet import PodResourcesSampler
from tests.loopback import loopback_scaler
from tests.waiting import wait_until

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def _metrics(scaler: RunningScaler) -> Samples:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{scaler.metrics_port}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def _value(samples: Samples, series: str, /, **labels: str) -> float | None:
    return samples.get((series, tuple(sorted(labels.items()))))


GPU0 = {"index": "0", "uuid": "GPU-fake-0000", "name": "Fake GPU", "mig_instance": ""}


async def test_gpu_and_source_series_follow_the_snapshot(
    scaler: RunningScaler, fake_gpus: FakeGpuSource
) -> None:
    samples = await _metrics(scaler)
    assert _value(samples, "keda_gpu_scaler_gpu_utilization", **GPU0) == 87
    assert _value(samples, "keda_gpu_scaler_gpu_power_draw", **GPU0) == 350
    assert _value(samples, "keda_gpu_scaler_gpu_memory_total_bytes", **GPU0) == 80 << 30
    assert _value(samples, "keda_gpu_scaler_gpu_nvlink_tx_mbps", **GPU0) is None  # absent
    assert _value(samples, "keda_gpu_scaler_gpu_device_count") == 2
    assert _value(samples, "keda_gpu_scaler_source_up", source="fake") == 1
    age = _value(samples, "keda_gpu_scaler_source_reading_age_seconds", source="fake")
    assert age is not None
    assert 0 <= age < 1
    cycles = _value(samples, "keda_gpu_scaler_sampler_cycles_total", source="fake")
    assert cycles is not None
    assert cycles >= 1

    fake_gpus.set(0, gpu_utilization=12.0)
    fake_gpus.lose(1, "gone")
    await scaler.hub.wait_newer(scaler.hub.current.version)
    later = await _metrics(scaler)
    assert _value(later, "keda_gpu_scaler_gpu_utilization", **GPU0) == 12
    assert _value(later, "keda_gpu_scaler_gpu_lost", index="1", uuid="GPU-fake-0001") == 1
    assert _value(later, "keda_gpu_scaler_gpu_device_count") == 1
    assert (_value(later, "keda_gpu_scaler_sampler_errors_total", source="fake") or 0) >= 1
    assert (
        _value(
            later,
            "keda_gpu_scaler_gpu_utilization",
            index="1",
            uuid="GPU-fake-0001",
            name="Fake GPU",
            mig_instance="",
        )
        is None
    )  # a lost GPU leaves the gauges


async def test_rpc_and_trigger_series_move_with_calls(scaler: RunningScaler) -> None:
    before = await _metrics(scaler)
    ok = ("keda_gpu_scaler_grpc_requests_total", {"method": "GetMetrics", "code": "OK"})
    assert _value(before, ok[0], **ok[1]) is None
    async with Channel("127.0.0.1", scaler.port) as channel:
        stub = ExternalScalerStub(channel)
        ref = ScaledObjectRef(name="so", namespace="ns", scaler_metadata={"profile": "training"})
        await stub.get_metrics(GetMetricsRequest(scaled_object_ref=ref, metric_name="m"))
        await stub.get_metrics(GetMetricsRequest(scaled_object_ref=ref, metric_name="m"))
        for bad in ({"targetValue": "0"}, {"profile": "distributed-training"}):
            with pytest.raises(GRPCError):
                await stub.is_active(ScaledObjectRef(name="x", namespace="ns", scaler_metadata=bad))
        async for _ in stub.stream_is_active(ref):
            during = await _metrics(scaler)
            break
    after = await _metrics(scaler)
    assert _value(after, ok[0], **ok[1]) == 2
    assert _value(after, ok[0], method="IsActive", code="INVALID_ARGUMENT") == 1
    assert _value(after, ok[0], method="IsActive", code="UNAVAILABLE") == 1
    assert (
        _value(after, "keda_gpu_scaler_grpc_request_duration_seconds_count", method="GetMetrics")
        == 2
    )
    trigger = {"trigger": "ns/so", "metric": "keda_gpu_training"}
    assert _value(after, "keda_gpu_scaler_trigger_value", **trigger) == 87
    assert _value(after, "keda_gpu_scaler_trigger_target", **trigger) == 90
    assert _value(after, "keda_gpu_scaler_trigger_active", **trigger) == 1
    failed = {"trigger": "ns/x", "metric": "keda_gpu_distributed_training"}
    assert _value(after, "keda_gpu_scaler_trigger_target", **failed) == 50000
    assert _value(after, "keda_gpu_scaler_trigger_value", **failed) is None
    assert _value(during, "keda_gpu_scaler_open_streams") == 1


async def test_probes_follow_readiness(fake_gpus: FakeGpuSource) -> None:
    fake_gpus.pause()
    async with loopback_scaler(fake_gpus) as scaler:
        base = f"http://127.0.0.1:{scaler.probe_port}"
        async with httpx.AsyncClient() as client, Channel("127.0.0.1", scaler.port) as channel:
            health = HealthStub(channel)
            assert (await client.get(f"{base}/healthz")).status_code == 200
            unready = await client.get(f"{base}/readyz")
            assert (unready.status_code, unready.text) == (503, "no snapshot yet\n")
            for service in ("", "externalscaler.ExternalScaler"):
                answer = await health.Check(HealthCheckRequest(service=service))
                assert answer.status == HealthCheckResponse.NOT_SERVING
            fake_gpus.resume()
            await scaler.hub.wait_newer(0)
            ready = await client.get(f"{base}/readyz")
            assert (ready.status_code, ready.text) == (200, "2 of 2 device(s) fresh\n")
            answer = await health.Check(HealthCheckRequest(service=""))
            assert answer.status == HealthCheckResponse.SERVING
            assert (await client.get(f"{base}/nope")).status_code == 404
            assert (await client.post(f"{base}/readyz")).status_code == 405


async def test_same_port_serves_metrics_and_probes(fake_gpus: FakeGpuSource) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with (
        loopback_scaler(fake_gpus, metrics_port=port, probe_port=port) as scaler,
        httpx.AsyncClient() as client,
    ):
        assert scaler.metrics_port == scaler.probe_port == port
        assert (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
        assert (await client.get(f"http://127.0.0.1:{port}/metrics")).status_code == 200


async def test_tap_streams_samples_and_decisions_with_filters(scaler: RunningScaler) -> None:
    url = f"http://127.0.0.1:{scaler.metrics_port}/debug/tap"
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0)) as client:
        async with client.stream("GET", url, params={"device": "1"}) as samples:
            lines = samples.aiter_lines()
            first = json.loads(await anext(lines))
            assert (first["type"], first["index"], first["gpu_utilization"]) == ("gpu", 1, 3.0)
        async with client.stream("GET", url, params={"trigger": "ns/so"}) as decisions:
            async with Channel("127.0.0.1", scaler.port) as channel:
                stub = ExternalScalerStub(channel)
                ref = ScaledObjectRef(
                    name="so", namespace="ns", scaler_metadata={"profile": "triton-inference"}
                )
                await stub.is_active(ref)
            event = json.loads(await anext(decisions.aiter_lines()))
    assert event["type"] == "decision"
    assert (event["trigger"], event["rpc"], event["active"]) == ("ns/so", "IsActive", True)
    assert (event["value"], event["target"]) == (87.0, 75.0)
    assert event["why"].startswith("gpu_utilization max of [GPU 0=87, GPU 1=3] = 87")
    # Both readers left: their subscriptions are released without another event to send.
    await wait_until(lambda: scaler.tap.subscribers == 0)


async def test_cycle_duration_and_tap_series_move() -> None:
    from keda_gpu_scaler.domain.samples import Batch
    from keda_gpu_scaler.pipeline.hub import SnapshotHub
    from keda_gpu_scaler.pipeline.tap import Tap, TapDecision
    from keda_gpu_scaler.serving.observability import SelfMetrics

    tap = Tap(max_buffer=1)
    metrics = SelfMetrics(tap)
    metrics.read_live(lambda: SnapshotHub().current, lambda: 0)

    def series(name: str, **labels: str) -> float | None:
        samples: Samples = {}
        for family in text_string_to_metric_families(metrics.render().decode()):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return _value(samples, name, **labels)

    assert series("keda_gpu_scaler_sampler_cycle_duration_seconds_count", source="nvml") is None
    metrics.folded([Batch(source="nvml", samples=(), cycle_s=0.0013)], EMPTY_SNAPSHOT)
    assert series("keda_gpu_scaler_sampler_cycle_duration_seconds_count", source="nvml") == 1
    assert (
        series("keda_gpu_scaler_sampler_cycle_duration_seconds_bucket", source="nvml", le="0.0025")
        == 1
    )
    assert series("keda_gpu_scaler_tap_subscribers") == 0
    subscription = tap.subscribe()
    for _ in range(3):
        tap.publish(
            TapDecision(
                trigger="ns/a", metric="m", metric_type="t", rpc="IsActive", at=0.0, why="w"
            )
        )
    assert series("keda_gpu_scaler_tap_subscribers") == 1
    assert series("keda_gpu_scaler_tap_dropped_events") == 2
    subscription.close()
    assert series("keda_gpu_scaler_tap_subscribers") == 0
    assert series("keda_gpu_scaler_tap_dropped_events") == 2  # losses stay counted


# --- pod attribution not configured ---------------------------------------------------------


def _serve_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


@pytest.mark.parametrize(
    ("argv", "socket_exists", "in_a_pod", "read"),
    [
        ((), False, False, False),  # outside Kubernetes: not configured
        ((), True, False, True),  # a kubelet on this machine
        ((), False, True, True),  # a pod without the directory mounted: a mistake, reported
        (("--pod-resources-socket", "{socket}"), False, False, True),  # given: always read
        (("--pod-resources-socket", ""), True, True, False),  # off
    ],
)
def test_pod_attribution_outside_kubernetes_is_not_configured(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: tuple[str, ...],
    socket_exists: bool,
    in_a_pod: bool,
    read: bool,
) -> None:
    monkeypatch.delenv("KEDA_GPU_SCALER_POD_RESOURCES_SOCKET", raising=False)
    socket, account = tmp_path / "kubelet.sock", tmp_path / "serviceaccount"
    if socket_exists:
        socket.touch()
    if in_a_pod:
        account.mkdir()
    args = _serve_args(*(a.format(socket=socket) for a in argv))
    if not argv:  # the default path, here in tmp_path
        args.pod_resources_socket = str(socket)
    chosen = pod_resources_socket(args, account_dir=str(account))
    assert chosen == (str(socket) if read else "")


async def test_without_attribution_pod_resources_is_no_source_and_says_not_configured(
    fake_gpus: FakeGpuSource,
) -> None:
    async with loopback_scaler(fake_gpus, samplers=[]) as scaler:
        samples = await _metrics(scaler)
    assert _value(samples, "keda_gpu_scaler_pod_attribution_configured") == 0
    assert _value(samples, "keda_gpu_scaler_source_up", source="pod-resources") is None
    assert _value(samples, "keda_gpu_scaler_source_up", source="fake") == 1


async def test_with_attribution_the_configured_series_says_so(fake_gpus: FakeGpuSource) -> None:
    # No socket there, as in a pod without the directory mounted: configured, and failing.
    sampler = PodResourcesSampler("/nonexistent/kubelet.sock", interval_s=5.0)
    async with loopback_scaler(fake_gpus, samplers=[sampler]) as scaler:
        samples = await _metrics(scaler)
    assert _value(samples, "keda_gpu_scaler_pod_attribution_configured") == 1
