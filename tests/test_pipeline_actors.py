"""Actors under trio's MockClock: replay → aggregator → decision, in virtual time."""

from __future__ import annotations

import itertools

import anyio
import pytest
from anyio.streams.memory import MemoryObjectSendStream
from trio.testing import MockClock

from keda_gpu_scaler.domain.cooldown import CooldownBook
from keda_gpu_scaler.domain.decision import Decision, TriggerKey, decide
from keda_gpu_scaler.domain.errors import NoData
from keda_gpu_scaler.domain.samples import Sample
from keda_gpu_scaler.domain.trigger import parse_trigger
from keda_gpu_scaler.pipeline.aggregator import Aggregator
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.supervisor import Backoff, supervise
from keda_gpu_scaler.sources.fake import FakeGpuSource
from keda_gpu_scaler.sources.replay import ReplaySampler
from keda_gpu_scaler.testing import open_test_pipeline

TRIGGERS = {
    "training": {"profile": "training", "cooldownSeconds": "0"},
    "triton": {"profile": "triton-inference", "cooldownSeconds": "0"},
    "vllm": {"profile": "vllm-inference", "cooldownSeconds": "0"},
    "sm": {"metricType": "sm_active", "activationThreshold": "5", "cooldownSeconds": "0"},
    "pcie_rx": {
        "metricType": "pcie_rx_kbps",
        "activationThreshold": "1000000",
        "cooldownSeconds": "0",
    },
}


def _decide_all(hub: SnapshotHub) -> dict[str, Decision]:
    now = anyio.current_time()
    return {
        name: decide(parse_trigger(meta), hub.current, None, now) for name, meta in TRIGGERS.items()
    }


@pytest.mark.trio
async def test_replay_drives_decisions_through_every_phase(autojump_clock: MockClock) -> None:
    sampler = ReplaySampler.bundled(loop=False)
    expected = {  # recorded phase at that instant: (active triggers, a value to check)
        2.05: ("idle", set(), ("training", 0.0)),
        12.35: ("compute", {"training", "triton", "sm"}, ("training", 99.0)),
        25.7: ("memory", {"vllm"}, ("vllm", 50.7)),
        36.2: ("light", {"training", "triton", "sm"}, ("sm", 26.0)),
        48.1: ("h2d", {"training", "triton", "pcie_rx"}, ("sm", 0.0)),
        53.7: ("idle", set(), ("triton", 0.0)),
    }
    async with open_test_pipeline(sampler) as pipeline:
        hub = pipeline.hub
        start = anyio.current_time()
        for at, (phase, active, (name, value)) in expected.items():
            await anyio.sleep_until(start + at)
            assert sampler.phase == phase
            decisions = _decide_all(hub)
            assert {n for n, d in decisions.items() if d.active} == active, phase
            assert decisions[name].value == pytest.approx(value, abs=0.1), phase


@pytest.mark.trio
async def test_replay_loops_and_readings_stay_fresh(autojump_clock: MockClock) -> None:
    sampler = ReplaySampler.bundled(loop=True)
    phases: list[str | None] = []
    async with open_test_pipeline(sampler) as pipeline:
        hub = pipeline.hub
        for _ in range(130):  # the 56 s recording twice, then part of a third pass
            await anyio.sleep(1.0)
            assert hub.current.has_fresh_reading(anyio.current_time())
            phases.append(sampler.phase)
    # The recording's compute phase (12 to 25 s in) is entered once in each of three passes.
    entered = [now for before, now in itertools.pairwise(phases) if now != before]
    assert entered.count("compute") == 3


@pytest.mark.trio
async def test_reading_goes_stale_after_three_periods(autojump_clock: MockClock) -> None:
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, gpu_utilization=70.0)
    spec = parse_trigger({"cooldownSeconds": "0"})
    async with open_test_pipeline(source) as pipeline:
        hub = pipeline.hub
        await anyio.sleep(0.5)
        source.pause()
        paused_at = anyio.current_time()
        last_reading_at = paused_at - 0.5
        await anyio.sleep_until(last_reading_at + 3.0)
        assert decide(spec, hub.current, None, anyio.current_time()).value == 70
        await anyio.sleep(0.01)
        with pytest.raises(NoData, match="stale"):
            decide(spec, hub.current, None, anyio.current_time())
        source.resume()
        await anyio.sleep(1.0)
        assert decide(spec, hub.current, None, anyio.current_time()).value == 70


@pytest.mark.trio
async def test_sixty_second_cooldown_in_virtual_time(autojump_clock: MockClock) -> None:
    source = FakeGpuSource(1, period_s=1.0)
    spec = parse_trigger({"cooldownSeconds": "60"})
    book: CooldownBook[TriggerKey] = CooldownBook()
    key = TriggerKey("ns", "so", spec)

    def served() -> float:
        decision = decide(spec, hub.current, book.get(key), anyio.current_time())
        assert decision.cooldown is not None
        book.put(key, decision.cooldown.entry)
        return decision.value

    source.set(0, gpu_utilization=90.0)
    async with open_test_pipeline(source) as pipeline:
        hub = pipeline.hub
        t0 = anyio.current_time()  # cycles at t0, t0 + 1, ...
        await anyio.sleep(0.5)
        assert served() == 90
        source.set(0, gpu_utilization=50.0)
        await anyio.sleep_until(t0 + 5.5)
        assert served() == 50  # the first decrease passes and opens the window
        source.set(0, gpu_utilization=10.0)
        for at in (10.5, 30.5, 65.0):
            await anyio.sleep_until(t0 + at)
            assert served() == 50, at  # held for 60 s after the decrease at 5.5
        await anyio.sleep_until(t0 + 65.6)
        assert served() == 10


@pytest.mark.trio
async def test_lost_gpu_is_unavailable_then_recovers(autojump_clock: MockClock) -> None:
    source = FakeGpuSource(2, period_s=1.0)
    source.set(0, gpu_utilization=10.0)
    source.set(1, gpu_utilization=20.0)
    spec = parse_trigger({"cooldownSeconds": "0"})
    async with open_test_pipeline(source) as pipeline:
        hub = pipeline.hub
        await anyio.sleep(0.5)
        assert decide(spec, hub.current, None, anyio.current_time()).value == 20
        source.lose(1, "GPU has fallen off the bus")
        await anyio.sleep(1.0)
        with pytest.raises(NoData, match=r"GPU 1 .* is lost: GPU has fallen off the bus"):
            decide(spec, hub.current, None, anyio.current_time())
        only_zero = parse_trigger({"gpuIndex": "0", "cooldownSeconds": "0"})
        assert decide(only_zero, hub.current, None, anyio.current_time()).value == 10
        source.restore(1)
        await anyio.sleep(1.0)
        assert decide(spec, hub.current, None, anyio.current_time()).value == 20


@pytest.mark.trio
async def test_supervisor_restarts_a_failed_source_with_backoff(autojump_clock: MockClock) -> None:
    source = FakeGpuSource(1, period_s=1.0)
    source.set(0, gpu_utilization=10.0)
    hub = SnapshotHub()
    send, receive = anyio.create_memory_object_stream[Sample](64)
    backoff = Backoff(initial_s=2.0, factor=2.0, maximum_s=30.0)

    async def start(channel: MemoryObjectSendStream[Sample]) -> None:
        await source.run(channel)

    async with anyio.create_task_group() as tg:
        await tg.start(Aggregator(receive, hub).run)
        tg.start_soon(lambda: supervise("fake", start, send=send, backoff=backoff))
        await anyio.sleep(0.5)
        t0 = anyio.current_time()
        source.crash_next_cycle("driver said no")
        await anyio.sleep(0.6)  # the next cycle, at 1.0, fails
        state = hub.current.sources["fake"]
        assert (state.fault, state.faults) == ("driver said no", 1)
        cycles = source.cycles
        await anyio.sleep_until(t0 + 0.5 + 1.99)
        assert source.cycles == cycles  # still waiting out the 2 s backoff
        await anyio.sleep_until(t0 + 0.5 + 2.01)
        assert source.cycles == cycles + 1
        assert hub.current.sources["fake"].fault is None
        tg.cancel_scope.cancel()


@pytest.mark.trio
async def test_aggregator_folds_one_cycle_into_one_snapshot(autojump_clock: MockClock) -> None:
    source = FakeGpuSource(8, period_s=1.0)
    async with open_test_pipeline(source) as pipeline:
        hub = pipeline.hub
        await anyio.sleep(2.5)
        assert len(hub.current.devices) == 8
        assert hub.current.version == 3  # cycles at 0, 1 and 2


def test_backoff_grows_to_its_maximum() -> None:
    backoff = Backoff(initial_s=0.5, factor=2.0, maximum_s=3.0)
    assert [backoff.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


@pytest.mark.trio
async def test_an_aggregator_with_a_min_interval_folds_what_came_meanwhile_at_once(
    autojump_clock: MockClock,
) -> None:
    from keda_gpu_scaler.domain.samples import SourceFault

    def fault(name: str) -> SourceFault:
        return SourceFault(source=name, key=None, at=anyio.current_time(), reason="x")

    hub = SnapshotHub()
    send, receive = anyio.create_memory_object_stream[Sample](64)
    async with anyio.create_task_group() as tg, send:
        await tg.start(Aggregator(receive, hub, min_interval_s=0.01).run)
        t0 = anyio.current_time()
        await send.send(fault("a"))
        await anyio.sleep(0.001)
        assert hub.current.version == 1  # the first folds at once
        await send.send(fault("b"))
        await anyio.sleep(0.001)
        await send.send(fault("c"))
        await anyio.sleep(0.001)
        assert hub.current.version == 1  # b and c wait out the interval...
        snapshot = await hub.wait_newer(1)
        assert snapshot.version == 2  # ...and fold together, 10 ms after the first
        assert set(snapshot.sources) == {"a", "b", "c"}
        assert snapshot.published_at == pytest.approx(t0 + 0.01)
        tg.cancel_scope.cancel()
    with pytest.raises(ValueError, match="min_interval_s"):
        Aggregator(receive, hub, min_interval_s=-1)
