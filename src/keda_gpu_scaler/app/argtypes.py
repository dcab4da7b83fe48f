"""Command-line value parsers shared by every command: each error names the value."""

from __future__ import annotations

import argparse
import math


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def bounded_int(text: str, *, low: int, high: int, meaning: str) -> int:
    if not text.isdigit() or not low <= int(text) <= high:
        raise argparse.ArgumentTypeError(f"{meaning}: {text!r}")
    return int(text)


def port(text: str) -> int:
    return bounded_int(text, low=0, high=65535, meaning="not a TCP port (0-65535)")


def positive_int(text: str) -> int:
    return bounded_int(text, low=1, high=2**63 - 1, meaning="must be a positive integer")
