"""Local processes of the end-to-end suite: started with their log in a file, waited for
until ready within a bound, stopped with SIGTERM and, past a bound, SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

STOP_S = 10.0
"""How long a component has to exit after SIGTERM before it is killed."""


class HarnessError(Exception):
    """The harness could not bring something up; the message names it and why."""


def wait_for(
    what: str,
    condition: Callable[[], bool],
    *,
    timeout_s: float,
    every_s: float = 0.2,
    alive: Callable[[], None] | None = None,
) -> None:
    """Poll ``condition`` until it holds; ``alive`` raises when what is awaited has died."""
    deadline = time.monotonic() + timeout_s
    while True:
        if alive:
            alive()
        if condition():
            return
        if time.monotonic() > deadline:
            raise HarnessError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(every_s)


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class Process:
    """One component: its command line, environment and log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str | Path],
        *,
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log = log
        self.env = dict(env) if env is not None else dict(os.environ)
        self.cwd = cwd
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"--- {time.strftime('%H:%M:%S')} start: {' '.join(self.argv)}\n".encode())
            out.flush()
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self._popen is not None
        return self._popen.pid

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def check_alive(self) -> None:
        if self._popen is None:
            raise HarnessError(f"{self.name}: never started")
        code = self._popen.poll()
        if code is not None:
            raise HarnessError(f"{self.name} exited with status {code}:\n{tail(self.log)}")

    def wait_ready(self, condition: Callable[[], bool], *, timeout_s: float) -> Process:
        wait_for(f"{self.name} ready", condition, timeout_s=timeout_s, alive=self.check_alive)
        return self

    def signal(self, signum: signal.Signals) -> None:
        if self.running():
            assert self._popen is not None
            self._popen.send_signal(signum)

    def stop(self, *, timeout_s: float = STOP_S) -> int | None:
        """SIGTERM, then SIGKILL (the whole process group) past ``timeout_s``; the exit status."""
        if self._popen is None:
            return None
        if self._popen.poll() is None:
            self._popen.terminate()
            try:
                self._popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self._popen.pid, signal.SIGKILL)
                self._popen.wait(timeout_s)
        with self.log.open("ab") as out:
            out.write(f"--- {time.strftime('%H:%M:%S')} exit {self._popen.returncode}\n".encode())
        return self._popen.returncode

    def wait(self, timeout_s: float) -> int:
        assert self._popen is not None
        return self._popen.wait(timeout_s)
