"""The one cadence every sampler keeps: ticks on a fixed grid, missed ticks skipped.

    async for now in every(1.0):
        ...  # one cycle; a cycle that overruns skips the ticks it missed

The grid starts when the loop first asks for a tick, and stays on ``start + n * interval``:
a slow cycle neither shifts the later ticks (as restarting from "now" would) nor makes the
next ones fire back to back to catch up (as ``next += interval`` would). Time is anyio's
clock only, so a fake clock drives it in tests.
"""

from __future__ import annotations

import math

import anyio


def next_tick(previous: float, interval_s: float, now: float) -> float:
    """The first tick after ``previous`` on its grid that is not past: a tick due exactly
    ``now`` still runs; ticks already past are skipped."""
    following = previous + interval_s
    if following >= now:
        return following
    return following + math.ceil((now - following) / interval_s) * interval_s


class Ticks:
    """The async iterator of :func:`every`; yields the clock at each tick."""

    def __init__(self, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"a cadence needs a positive interval, not {interval_s}")
        self._interval_s = interval_s
        self._tick: float | None = None

    def __aiter__(self) -> Ticks:
        return self

    async def __anext__(self) -> float:
        now = anyio.current_time()
        self._tick = now if self._tick is None else next_tick(self._tick, self._interval_s, now)
        await anyio.sleep_until(self._tick)
        return anyio.current_time()


def every(interval_s: float) -> Ticks:
    """Ticks every ``interval_s`` seconds from now; see the module docstring."""
    return Ticks(interval_s)
