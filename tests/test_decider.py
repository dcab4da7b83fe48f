"""The per-server decider: parse once per map, warn once per ScaledObject, share a
measurement per spec and snapshot version until its readings go stale."""

from __future__ import annotations

import logging

import anyio
import pytest
from trio.testing import MockClock

from keda_gpu_scaler.domain.decision import TriggerKey
from keda_gpu_scaler.domain.errors import NoData
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.state import fold
from keda_gpu_scaler.serving.decider import Decider
from keda_gpu_scaler.sources.fake import FakeGpuSource
from keda_gpu_scaler.testing import CountingMeasure

TYPO = {"metricType": "power_draw", "activationTreshold": "5"}


def _warnings(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [
        (getattr(r, "trigger", ""), getattr(r, "detail", ""))
        for r in caplog.records
        if r.getMessage() == "trigger metadata warning"
    ]


def test_a_typo_is_warned_once_per_scaled_object_naming_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    decider = Decider(SnapshotHub())
    for _ in range(3):
        decider.parse(TYPO, "ns", "a")
    decider.parse(TYPO, "ns", "b")
    warned = _warnings(caplog)
    assert [trigger for trigger, _ in warned] == ["ns/a", "ns/b"]
    assert 'did you mean "activationThreshold"' in warned[0][1]


def test_each_server_keeps_its_own_caches(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    Decider(SnapshotHub()).parse(TYPO, "ns", "a")
    Decider(SnapshotHub()).parse(TYPO, "ns", "a")
    assert len(_warnings(caplog)) == 2  # not once per process


@pytest.mark.trio
async def test_one_measurement_per_spec_and_version_until_its_readings_go_stale(
    autojump_clock: MockClock,
) -> None:
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, power_mw=200_000.0)
    hub = SnapshotHub()
    t0 = anyio.current_time()
    hub.publish(fold(hub.current, source.readings(t0), t0))
    counting = CountingMeasure()
    decider = Decider(hub, measure=counting)
    spec = decider.parse({"metricType": "power_draw", "cooldownSeconds": "0"}, "ns", "a")
    for name in ("a", "b", "c"):  # three ScaledObjects, one spec: one measurement
        decision = decider.decide(TriggerKey("ns", name, spec), hub.current, "GetMetrics")
        assert decision.value == 200.0
    await anyio.sleep(3.0)  # still fresh: three sample periods
    decider.decide(TriggerKey("ns", "a", spec), hub.current, "GetMetrics")
    assert len(counting.calls) == 1
    await anyio.sleep(0.5)  # stale now: measured again, and unavailable
    with pytest.raises(NoData, match="stale"):
        decider.decide(TriggerKey("ns", "a", spec), hub.current, "GetMetrics")
    assert len(counting.calls) == 2
