"""What the commands show a person: log levels, the live table, record progress, the demo."""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from grpclib.client import Channel
from trio.testing import MockClock

from keda_gpu_scaler.app.gpu_metrics.output import FIELDS, Printer
from keda_gpu_scaler.app.gpu_metrics.record import show_progress
from keda_gpu_scaler.app.logs import configure_logging
from keda_gpu_scaler.app.scaler.compose import RunningScaler
from keda_gpu_scaler.app.scaler.demo import DemoTrigger, _poll
from keda_gpu_scaler.serving._proto.externalscaler import ExternalScalerStub
from keda_gpu_scaler.sources.fake import FakeGpuSource


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    names = ("httpx", "httpcore", "hpack", "h2", "grpclib", "asyncio")
    levels = {name: logging.getLogger(name).level for name in names}
    logging.captureWarnings(False)  # configure_logging in an earlier test may have left it on
    yield
    logging.captureWarnings(False)
    root.handlers[:], root.level = saved
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def _logged(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines()]


async def _one_scrape() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="vllm:num_requests_waiting 3\n")

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        await client.get("http://engine.invalid/metrics")


@pytest.mark.anyio
@pytest.mark.usefixtures("restored_logging")
async def test_info_does_not_log_every_engine_scrape(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info")
    await _one_scrape()
    assert _logged(capsys) == []


@pytest.mark.anyio
@pytest.mark.usefixtures("restored_logging")
async def test_debug_shows_a_scrape_in_one_line_and_no_http2_frames(
    capsys: pytest.CaptureFixture[str], scaler: RunningScaler
) -> None:
    configure_logging("debug")
    await _one_scrape()
    async with Channel("127.0.0.1", scaler.port) as channel:  # HTTP/2: h2 and hpack at work
        await _poll(ExternalScalerStub(channel), DemoTrigger("t", {"profile": "training"}))
    loggers = [entry["logger"] for entry in _logged(capsys)]
    assert loggers.count("httpx") == 1
    assert not {"hpack", "h2", "httpcore"} & {name.split(".")[0] for name in loggers}


@pytest.mark.usefixtures("restored_logging")
def test_a_librarys_warning_is_a_json_line_like_every_log(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("info")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a library's deprecation", DeprecationWarning, stacklevel=1)
    (entry,) = _logged(capsys)
    assert entry["logger"] == "py.warnings"
    assert entry["level"] == "warning"
    assert "a library's deprecation" in entry["event"]


def _row(**values: Any) -> dict[str, Any]:
    row = dict.fromkeys(FIELDS)
    row.update({"index": 0, "name": "NVIDIA H200", "status": "ok", "memory_total_mib": 143771})
    row.update(values)
    return row


def test_the_live_table_into_a_file_or_a_pipe_writes_no_escape_codes() -> None:
    frames: list[str] = []
    printer = Printer("table", watch=True, out=frames.append, node="gpu-7", terminal=False)
    for utilization in (5.0, 100.0):
        printer.emit([_row(gpu_utilization=utilization)], continuous=True)
    text = "".join(frames)
    assert "\x1b" not in text
    # Each table under its title line, one after the other, a blank line between.
    first, second, end = text.split("\n\n")
    assert first.startswith("node gpu-7  20") and second.startswith("node gpu-7  20")
    assert first.splitlines()[1].split()[:2] == ["GPU", "NAME"]
    assert end == ""


def test_the_live_table_keeps_its_columns_and_says_where_when_and_how_to_stop() -> None:
    frames: list[str] = []
    printer = Printer("table", watch=True, out=frames.append, node="gpu-7", interval_s=2.0)
    for values in (
        {"gpu_utilization": 5.0, "power_draw": 80.0, "memory_used_mib": 615.0},
        {"gpu_utilization": 100.0, "power_draw": 1002.5, "memory_used_mib": 143000.0},
        {"gpu_utilization": 0.0, "power_draw": None, "memory_used_mib": None, "status": "stale"},
    ):
        printer.emit([_row(**values)], continuous=True)
    titles = [frame.split("\n")[0] for frame in frames]
    assert all(t.startswith("\x1b[H\x1b[2Jnode gpu-7  20") for t in titles)
    assert all(t.endswith("  every 2 s  Ctrl-C to stop") for t in titles)
    tables = [frame.split("\n")[2:4] for frame in frames]
    headers = {header for header, _ in tables}
    assert len(headers) == 1  # the same header, so the same columns, in every frame
    ends = [
        [i for i, c in enumerate(row) if c != " " and (i + 1 == len(row) or row[i + 1] == " ")]
        for _, row in tables
    ]
    assert ends[0][:8] == ends[1][:8] == ends[2][:8]  # numbers end in the same column


def test_a_mig_instance_row_is_labelled_gpu_colon_gi() -> None:
    frames: list[str] = []
    Printer("table", watch=False, out=frames.append).emit(
        [_row(), _row(gpu_instance_id=3, name="MIG 3g.71gb")], continuous=False
    )
    assert [line.split()[0] for line in frames[0].splitlines()] == ["GPU", "0", "0:3"]


@pytest.mark.trio
async def test_record_progress_counts_the_seconds(autojump_clock: MockClock) -> None:
    shown: list[str] = []
    with anyio.move_on_after(2.5):
        await show_progress(Path("gpus.jsonl"), 120.0, shown.append)
    assert shown == [
        f"\rrecording to gpus.jsonl: {n} of 120 s (Ctrl-C to stop)\x1b[K" for n in (0, 1, 2)
    ]


@pytest.mark.anyio
async def test_the_demo_shows_units_and_marks_a_value_held_by_cooldown(
    scaler: RunningScaler, fake_gpus: FakeGpuSource
) -> None:
    power = DemoTrigger("power", {"metricType": "power_draw", "targetValue": "500"})
    busy = DemoTrigger("training", {"profile": "training", "cooldownSeconds": "0"})
    async with Channel("127.0.0.1", scaler.port) as channel:
        stub = ExternalScalerStub(channel)
        before = await _poll(stub, power)
        assert (await _poll(stub, busy)).split()[1:4] == ["87.0", "%", "90"]
        polls = []
        for watts in (200, 120):  # a decrease that goes through, then one inside the cooldown
            fake_gpus.set(0, power_mw=watts * 1000.0)
            fake_gpus.set(1, power_mw=watts * 500.0)
            seen = scaler.hub.current.version
            for _ in range(2):  # a whole new cycle of both GPUs
                seen = (await scaler.hub.wait_newer(seen)).version
            polls.append(await _poll(stub, power))
    assert before.split()[1:5] == ["350.0", "W", "500", "W"]
    assert "held by cooldown" not in before
    held = polls[-1]
    assert float(held.split()[1]) > 120.0
    assert held.endswith("held by cooldown (now 120.0 W)"), polls
