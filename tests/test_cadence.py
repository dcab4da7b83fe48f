"""The samplers' one cadence, in virtual time: on the grid, missed ticks skipped."""

from __future__ import annotations

import anyio
import pytest
import trio.testing

from keda_gpu_scaler.sources.cadence import every, next_tick


@pytest.mark.trio
async def test_ticks_stay_on_the_grid_from_the_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = anyio.current_time()
    ticks = []
    async for now in every(0.5):
        ticks.append(now - start)
        await anyio.sleep(0.2)  # a cycle shorter than the interval does not shift the grid
        if len(ticks) == 4:
            break
    assert ticks == [0.0, 0.5, 1.0, 1.5]


@pytest.mark.trio
async def test_an_overrun_skips_the_missed_ticks_without_bunching(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = anyio.current_time()
    ticks = []
    async for now in every(1.0):
        ticks.append(now - start)
        if len(ticks) == 2:
            await anyio.sleep(2.5)  # the cycle at 1 runs until 3.5: ticks 2 and 3 are lost
        if len(ticks) == 5:
            break
    assert ticks == [0.0, 1.0, 4.0, 5.0, 6.0]


@pytest.mark.trio
async def test_a_tick_due_exactly_when_the_cycle_ends_still_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = anyio.current_time()
    ticks = []
    async for now in every(1.0):
        ticks.append(now - start)
        await anyio.sleep(1.0)
        if len(ticks) == 3:
            break
    assert ticks == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("previous", "now", "expected"),
    [(0.0, 0.3, 1.0), (0.0, 1.0, 1.0), (0.0, 1.01, 2.0), (0.0, 7.0, 7.0), (10.0, 13.5, 14.0)],
)
def test_next_tick(previous: float, now: float, expected: float) -> None:
    assert next_tick(previous, 1.0, now) == expected


def test_a_cadence_needs_a_positive_interval() -> None:
    with pytest.raises(ValueError, match="positive interval"):
        every(0.0)
