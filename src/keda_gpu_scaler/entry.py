"""The console commands' entry points: Ctrl-C is held while a command loads.

A KeyboardInterrupt raised while an extension module initialises can crash the interpreter
(a Ctrl-C a few tens of milliseconds into ``serve`` once ended in SIGSEGV). So until the
command and everything it will import have loaded, SIGINT only sets a flag; a Ctrl-C in that
time then ends the command quietly with status 130, as one at any later moment does. This
module sits outside ``keda_gpu_scaler.app`` and imports only the standard library, so the
hold is in place before any module of the commands starts to load.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType

EXIT_INTERRUPTED = 130

_SCALER_MODULES = (
    "keda_gpu_scaler.app.cli",
    "keda_gpu_scaler.app.scaler.compose",
    "keda_gpu_scaler.app.scaler.demo",
    "keda_gpu_scaler.app.scaler.serve",
    "keda_gpu_scaler.app.simulate.command",
    "keda_gpu_scaler.app.scaler.tap_client",
    "keda_gpu_scaler.serving.tls",
    "keda_gpu_scaler.sources.kubelet",
    "keda_gpu_scaler.sources.nvml",
    "anyio._backends._asyncio",
)
_GPU_METRICS_MODULES = (
    "keda_gpu_scaler.app.gpu_metrics.command",
    "keda_gpu_scaler.app.scaler.compose",
    "keda_gpu_scaler.sources.kubelet",
    "keda_gpu_scaler.sources.nvml",
    "anyio._backends._asyncio",
)


def keda_gpu_scaler() -> int:
    """``keda-gpu-scaler``."""
    return _run(_SCALER_MODULES)


def gpu_metrics() -> int:
    """``gpu-metrics``."""
    return _run(_GPU_METRICS_MODULES)


def _run(modules: Sequence[str]) -> int:
    """Load ``modules`` with Ctrl-C held, then run the first one's ``main()``."""
    interrupted: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        interrupted.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        for name in modules:
            __import__(name)  # the import statement's own path, as `-X importtime` reports
        main: Callable[[], int] = sys.modules[modules[0]].main
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        return EXIT_INTERRUPTED
    return main()
