"""The Go project's command lines, accepted as they are.

Scripts, Helm values and Flux plugins written for pmady/keda-gpu-scaler run its binaries
with Go ``flag`` syntax: ``keda-gpu-scaler --port 6000 --log-level warn`` (no
subcommand), durations with units (``--interval 5s``), ``gpu-metrics --device -1`` for
every GPU and ``--interval 0`` for one reading. These parsers translate them; each error
names the value, like the other argument parsers (app/argtypes.py).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Sequence

from keda_gpu_scaler.app.logs import LEVELS

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0}
_UNITS |= {"m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_ALIASES = {"warn": "warning"}
_OPTIONS_OF_THE_TOP_PARSER = {"-h", "--help", "--version"}


def duration_seconds(text: str) -> float:
    """Seconds from a plain number (``30``, ``0.5``) or a Go duration (``30s``, ``1m30s``)."""
    try:
        return float(text) if not text.strip().endswith(tuple(_UNITS)) else _go(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration (seconds, or a Go duration such as 30s, 1m, 500ms): {text!r}"
        ) from None


def _go(text: str) -> float:
    if not text or _PART.sub("", text) != "":
        raise ValueError(text)
    return sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(text))


def positive_duration(text: str) -> float:
    value = duration_seconds(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive duration: {text!r}")
    return value


def interval_or_once(text: str) -> float | None:
    """Go's ``--interval``: 0 (or ``0s``) means one reading, None here."""
    value = duration_seconds(text)
    if value == 0:
        return None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be 0 (once) or a positive duration: {text!r}")
    return value


def log_level(text: str) -> str:
    """debug, info, warning (Go's ``warn`` too) or error."""
    level = _ALIASES.get(text, text)
    if level not in LEVELS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LEVELS)}, warn: {text!r}")
    return level


def with_default_command(argv: Sequence[str], *, default: str) -> list[str]:
    """The Go binary had no subcommands: bare flags (or none at all) mean ``default``."""
    argv = list(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in _OPTIONS_OF_THE_TOP_PARSER):
        return [default, *argv]
    return argv


def all_devices(device: str | None) -> str | None:
    """``--device -1`` is the Go default, every GPU: the same as no ``--device``."""
    return None if device is not None and device.strip() == "-1" else device
