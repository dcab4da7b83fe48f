"""Numbers in the simulator's output, as a person writes them."""

from __future__ import annotations


def num(value: float) -> str:
    """80, 2.5, 0.33: at most two decimals, no trailing zeros."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text
