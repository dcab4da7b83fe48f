"""SIGTERM with open streams (500 StreamIsActive, or StreamMetricSpec): streams end with status
OK and the process exits in < 2 s."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream
from grpclib.client import Channel

from keda_gpu_scaler.serving._proto.externalscaler import ExternalScalerStub, ScaledObjectRef

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

STREAMS = 500


async def _serving_port(process: Process) -> int:
    assert process.stderr is not None
    buffered = ""
    with anyio.fail_after(20):
        async for chunk in TextReceiveStream(process.stderr):
            buffered += chunk
            for line in buffered.splitlines():
                entry = json.loads(line)
                if entry["event"] == "serving":
                    return int(entry["port"])
    raise AssertionError(f"the server never said it was serving: {buffered}")


Opener = Callable[[ExternalScalerStub, ScaledObjectRef], AsyncIterator[Any]]


async def _sigterm_ends_open_streams(open_stream: Opener, streams: int) -> None:
    """``streams`` streams opened on a served process; SIGTERM: each ends with status OK after
    its first message, and the process exits with 0 in under 2 s."""
    command = [
        sys.executable,
        "-m",
        "keda_gpu_scaler",
        "serve",
        "--source",
        "replay",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--probe-port",
        "0",
    ]
    async with await anyio.open_process(command) as process:
        port = await _serving_port(process)
        ref = ScaledObjectRef(name="so", namespace="ns", scaler_metadata={"profile": "training"})
        first_seen = 0
        ended_ok = 0
        all_open = anyio.Event()
        async with Channel("127.0.0.1", port) as channel:
            stub = ExternalScalerStub(channel)

            async def stream() -> None:
                nonlocal first_seen, ended_ok
                seen = False
                async for _ in open_stream(stub, ref):  # raises on a non-OK status
                    if not seen:
                        seen = True
                        first_seen += 1
                        if first_seen == streams:
                            all_open.set()
                ended_ok += 1

            async with anyio.create_task_group() as tg:
                for _ in range(streams):
                    tg.start_soon(stream)
                with anyio.fail_after(10):
                    await all_open.wait()
                sent = time.perf_counter()
                process.send_signal(signal.SIGTERM)
                with anyio.fail_after(5):
                    returncode = await process.wait()
                exited_after = time.perf_counter() - sent
        assert returncode == 0
        assert exited_after < 2.0
        assert ended_ok == streams


async def test_sigterm_with_500_open_streams_exits_cleanly_within_2_s() -> None:
    await _sigterm_ends_open_streams(lambda stub, ref: stub.stream_is_active(ref), STREAMS)


async def test_sigterm_ends_metric_spec_streams_with_ok_within_2_s() -> None:
    """StreamMetricSpec streams, which have nothing more to send after the first message,
    end with OK too."""
    await _sigterm_ends_open_streams(lambda stub, ref: stub.stream_metric_spec(ref), 50)


async def test_nvml_source_without_nvml_is_one_clear_error() -> None:
    command = [
        *(sys.executable, "-m", "keda_gpu_scaler", "serve", "--source", "nvml"),
        *("--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", "--probe-port", "0"),
    ]
    result = await anyio.run_process(command, check=False)
    assert result.returncode == 2
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1
    assert "NVML" in lines[0]
    assert "libnvidia-ml" in lines[0]
