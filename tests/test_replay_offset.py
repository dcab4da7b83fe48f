"""A replay started part-way into its recording (``start_at_s``), and the scripted
attribution and pod samplers of ``demo --cluster``.

``fixtures/replay/four-gpus.jsonl`` holds four cycles, at 0, 0.5, 1.0 and 1.5 s (2 s long);
only the first, at 0, has no PCIe counters.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import trio.testing

from keda_gpu_scaler.domain.samples import (
    POD_RESOURCES_SOURCE,
    PODS_SOURCE,
    DeviceHolder,
    PodInfo,
    PodResourcesReading,
    PodsReading,
)
from keda_gpu_scaler.sources.fake import ScriptedAttribution, ScriptedPods
from keda_gpu_scaler.sources.replay import ReplaySampler
from keda_gpu_scaler.testing import collect_samples, readings

FOUR_GPUS = Path(__file__).parent / "fixtures" / "replay" / "four-gpus.jsonl"


@pytest.mark.trio
async def test_a_replay_begins_at_its_offset_then_loops_from_the_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sampler = ReplaySampler.from_path(FOUR_GPUS, loop=True, start_at_s=1.0)
    start = anyio.current_time()
    async with collect_samples(sampler) as received:
        await anyio.sleep_until(start + 2.9)
    cycles = [readings([s])[0] for s in received]
    assert [c.taken_at - start for c in cycles] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    # Recorded 1.0 and 1.5 at once, then the second pass from recorded 0 (no PCIe).
    assert [c.pcie_tx_kbps is None for c in cycles] == [False, False, True, False, False, False]
    # Both passes were sent whole (the six cycles above): the part from the offset on, then
    # the whole recording.


@pytest.mark.trio
async def test_a_replay_without_loop_plays_only_from_its_offset(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sampler = ReplaySampler.from_path(FOUR_GPUS, loop=False, start_at_s=0.75)
    start = anyio.current_time()
    async with collect_samples(sampler) as received:
        await anyio.sleep(10.0)
    cycles = [readings([s])[0] for s in received]
    # Recorded 1.0 and 1.5: the first 0.25 s after 0.75 in, then 0.5 s later; never 0.
    assert [c.taken_at - start for c in cycles] == [0.25, 0.75]
    assert all(c.pcie_tx_kbps is not None for c in cycles)
    assert len(readings(received)) == 8  # two cycles of four GPUs


@pytest.mark.trio
async def test_the_bundled_recording_at_an_offset_begins_in_another_phase(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sampler = ReplaySampler.bundled(start_at_s=12.0)
    async with collect_samples(sampler) as received:
        await anyio.sleep(0.1)
    (first,) = readings([received[0]])
    # 12 s in, the matmuls of the compute phase run (from the start, the GPU is idle).
    assert first.gpu_utilization is not None and first.gpu_utilization >= 90.0
    assert sampler.phase == "compute"


@pytest.mark.parametrize("bad", [-0.5, 2.0, 7.0, float("nan")])
def test_an_offset_outside_the_recording_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match=r"start_at_s must be from 0 to under the recording's 2 s"):
        ReplaySampler.from_path(FOUR_GPUS, start_at_s=bad)


HOLDER = DeviceHolder(
    namespace="ml", pod="vllm-0", container="main", resource="nvidia.com/gpu", device_id="GPU-x"
)
POD = PodInfo(namespace="ml", name="vllm-0", labels={"app": "vllm"}, phase="Running", node="n1")


@pytest.mark.trio
async def test_scripted_attribution_publishes_its_holders_every_period(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sampler = ScriptedAttribution([HOLDER], period_s=2.0)
    start = anyio.current_time()
    async with collect_samples(sampler) as received:
        await anyio.sleep_until(start + 5.0)
    assert all(isinstance(s, PodResourcesReading) for s in received)
    assert [s.taken_at - start for s in received] == [0.0, 2.0, 4.0]  # type: ignore[union-attr]
    assert {s.holders for s in received} == {(HOLDER,)}  # type: ignore[union-attr]
    assert {s.source for s in received} == {POD_RESOURCES_SOURCE}


@pytest.mark.trio
async def test_scripted_pods_publishes_its_pods_every_period(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sampler = ScriptedPods([POD], period_s=1.5)
    start = anyio.current_time()
    async with collect_samples(sampler) as received:
        await anyio.sleep_until(start + 4.0)
    assert all(isinstance(s, PodsReading) for s in received)
    assert [s.taken_at - start for s in received] == [0.0, 1.5, 3.0]  # type: ignore[union-attr]
    assert [(s.source, s.node, s.pods) for s in received] == [  # type: ignore[union-attr]
        (PODS_SOURCE, "", (POD,))
    ] * 3


@pytest.mark.parametrize("make", [ScriptedAttribution, ScriptedPods])
@pytest.mark.parametrize("period", [0.0, -1.0, float("nan")])
def test_a_scripted_sampler_refuses_a_period_that_is_not_positive(
    make: type[ScriptedAttribution] | type[ScriptedPods], period: float
) -> None:
    with pytest.raises(ValueError, match="period_s must be a positive number of seconds"):
        make(period_s=period)
