"""Waiting for a condition in edge tests without sleeping: yield to the event loop (which
polls sockets) until the condition holds, bounded in time."""

from __future__ import annotations

from collections.abc import Callable

import anyio
from anyio.lowlevel import checkpoint


async def wait_until(condition: Callable[[], bool], *, timeout_s: float = 5.0) -> None:
    with anyio.fail_after(timeout_s):
        while not condition():
            await checkpoint()
