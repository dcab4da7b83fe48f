"""A signal at any moment of ``serve``'s start-up ends it, with the status docs/operations.md
documents: 128 + the signal (130 for SIGINT), quietly, while starting; 0 once serving.

In this process, with a real signal sent to it at a chosen moment of start-up (each moment a
seam of this product's own: the flag checks, the source's first cycle, the log line that says
it serves), so every moment is hit every time. tests/test_first_contact.py sends SIGINT from
outside at many delays after launch.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable

import anyio
import pytest
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.app.cli import build_parser
from keda_gpu_scaler.app.scaler import compose, listen, serve
from keda_gpu_scaler.domain.samples import Sample
from keda_gpu_scaler.sources.replay import ReplaySampler

SERVE = ["serve", "--source", "replay", "--host", "127.0.0.1"]
FREE_PORTS = ["--port", "0", "--metrics-port", "0", "--probe-port", "0"]


def _signal_self(signum: int) -> None:
    os.kill(os.getpid(), signum)


class _SignalOnFirstCycle:
    """The bundled replay, which sends this process ``signum`` as it starts."""

    def __init__(self, signum: int) -> None:
        self._replay = ReplaySampler.bundled()
        self.name = self._replay.name
        self._signum = signum

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        _signal_self(self._signum)
        await self._replay.run(send, task_status=task_status)


class _SignalOnServing(logging.Handler):
    def __init__(self, signum: int) -> None:
        super().__init__()
        self._signum = signum

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "serving":
            _signal_self(self._signum)


@pytest.fixture
def events(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "keda_gpu_scaler"]


def _serve() -> int:
    args = build_parser().parse_args([*SERVE, *FREE_PORTS, "--pod-resources-socket", ""])
    return serve.run_serve(args)


def test_sigint_while_the_flags_are_checked_ends_with_130(
    monkeypatch: pytest.MonkeyPatch, events: Callable[[], list[str]]
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        _signal_self(signal.SIGINT)
        listen.check_listen(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(serve, "check_listen", interrupted)
    assert _serve() == 130
    assert events() == []


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_the_source_starts_abandons_start_up(
    monkeypatch: pytest.MonkeyPatch, events: Callable[[], list[str]], signum: int, status: int
) -> None:
    monkeypatch.setattr(compose, "build_source", lambda *a, **k: _SignalOnFirstCycle(signum))
    assert _serve() == status
    assert events() == []  # never "serving": start-up was abandoned, quietly


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_once_serving_stops_cleanly_with_0(
    events: Callable[[], list[str]], signum: int
) -> None:
    handler = _SignalOnServing(signum)
    logging.getLogger("keda_gpu_scaler").addHandler(handler)
    try:
        assert _serve() == 0
    finally:
        logging.getLogger("keda_gpu_scaler").removeHandler(handler)
    assert events() == ["serving", "shutting down", "stopped"]
    # Ctrl-C is Python's own again: serve took SIGINT over only while it ran.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
