"""The tap client: says when it is connected, warns when a filter matches nothing for a while,
and ends quietly when its reader goes away. The server side is httpx's MockTransport, in
trio's virtual time."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
from trio.testing import MockClock

from keda_gpu_scaler.app.scaler.compose import RunningScaler
from keda_gpu_scaler.app.scaler.tap_client import QUIET_WARNING_S, follow

URL = "http://127.0.0.1:9/debug/tap"


def _tap_server(schedule: list[tuple[float, str]]) -> httpx.MockTransport:
    """Answers the tap with ``schedule``: (seconds to wait, line) pairs, then ends."""

    async def body() -> AsyncIterator[bytes]:
        for wait_s, line in schedule:
            await anyio.sleep(wait_s)
            yield line.encode() + b"\n"

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body())

    return httpx.MockTransport(handler)


async def _follow(
    schedule: list[tuple[float, str]], params: dict[str, str]
) -> tuple[list[str], list[tuple[float, str]]]:
    out: list[str] = []
    err: list[tuple[float, str]] = []
    start = anyio.current_time()
    async with httpx.AsyncClient(transport=_tap_server(schedule)) as client:
        await follow(
            client,
            URL,
            params,
            out=out.append,
            err=lambda text: err.append((anyio.current_time() - start, text)),
        )
    return out, err


@pytest.mark.trio
async def test_it_says_when_it_is_connected(autojump_clock: MockClock) -> None:
    out, err = await _follow([(0.5, '{"type":"gpu"}')], {})
    assert out == ['{"type":"gpu"}\n']
    assert err == [(0.0, f"keda-gpu-scaler tap: connected to {URL}\n")]


@pytest.mark.trio
async def test_a_filter_that_matches_nothing_for_a_while_is_warned_about_once(
    autojump_clock: MockClock,
) -> None:
    # Nothing for 35 s, then one event, then quiet again for 12 s.
    schedule = [(35.0, '{"type":"gpu","index":7}'), (12.0, '{"type":"gpu","index":7}')]
    _, err = await _follow(schedule, {"device": "7"})
    assert [(at, text.split(":")[0]) for at, text in err] == [
        (0.0, "keda-gpu-scaler tap"),
        (QUIET_WARNING_S, "keda-gpu-scaler tap"),  # once, not at 20 s and 30 s again
        (35.0 + QUIET_WARNING_S, "keda-gpu-scaler tap"),  # a new quiet spell
    ]
    assert err[0][1].endswith("(--device 7)\n")
    assert err[1][1].startswith("keda-gpu-scaler tap: no event matched --device 7 in 10 s")


@pytest.mark.trio
async def test_without_a_filter_a_quiet_tap_is_not_warned_about(autojump_clock: MockClock) -> None:
    _, err = await _follow([(60.0, "{}")], {})
    assert len(err) == 1  # "connected" only


def _read_one_line_then_close(command: list[str]) -> tuple[int, str, str]:
    """``command | head -1``: blocking, run it in a thread."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout is not None and process.stderr is not None
        first = process.stdout.readline().decode()
        process.stdout.close()
        status = process.wait(timeout=20)
        return status, first, process.stderr.read().decode()


@pytest.mark.slow
@pytest.mark.anyio
async def test_tap_into_a_closed_pipe_ends_quietly(scaler: RunningScaler) -> None:
    command = [
        *(sys.executable, "-m", "keda_gpu_scaler", "tap"),
        *("--address", f"127.0.0.1:{scaler.metrics_port}"),
    ]
    status, first, err = await anyio.to_thread.run_sync(_read_one_line_then_close, command)
    assert json.loads(first)["type"] == "gpu"
    assert status == 0, err
    assert err.splitlines() == [
        f"keda-gpu-scaler tap: connected to http://127.0.0.1:{scaler.metrics_port}/debug/tap"
    ]
