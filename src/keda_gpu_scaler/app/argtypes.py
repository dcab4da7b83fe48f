"""Command-line value parsers shared by every command: each error names the value."""

from __future__ import annotations

import argparse
import math
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line, naming where the usage is (the
    whole usage above a one-line error buries the error)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def help_text(docstring: str) -> str:
    """A module docstring's first paragraph as help prints it: without the reStructuredText
    backticks that mark code in the source."""
    return docstring.split("\n\n")[0].replace("``", "")


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


_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def boolean(text: str) -> bool:
    """``true`` or ``false``, in the spellings Go's ``strconv.ParseBool`` accepts."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"not true or false: {text!r}")


def port(text: str) -> int:
    return bounded_int(text, low=0, high=65535, meaning="not a TCP port (0-65535)")


def positive_int(text: str) -> int:
    return bounded_int(text, low=1, high=2**63 - 1, meaning="must be a positive integer")


def tap_address(text: str) -> str:
    """``HOST:PORT`` (``[v6]:PORT`` for an IPv6 address) with a TCP port from 1 to 65535."""
    if "://" in text:
        raise argparse.ArgumentTypeError(
            f"{text!r} is a URL: give HOST:PORT of the server's metrics port, where the tap is "
            "(--metrics-port, 9090 by default), as in 127.0.0.1:9090"
        )
    host, sep, number = text.rpartition(":")
    if not sep or not host or host == "[]":
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {text!r}")
    if host.count(":") and not (host.startswith("[") and host.endswith("]")):
        raise argparse.ArgumentTypeError(f"an IPv6 address goes in brackets, [::1]:9090: {text!r}")
    if not number.isdigit() or not 1 <= int(number) <= 65535:
        raise argparse.ArgumentTypeError(f"{number!r} is not a TCP port (1-65535) in {text!r}")
    return text
