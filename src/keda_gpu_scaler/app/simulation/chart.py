"""The picture of a simulation, as drawing primitives that the SVG and PNG writers share.

Top: each trigger's value (solid) and target (dashed) over time. Bottom: the replicas after
each step (solid) and the HPA's desired count (dashed). Axes, ticks and a legend for each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from keda_gpu_scaler.app.simulation.runner import HPA, Step
from keda_gpu_scaler.app.simulation.text import num

WIDTH, HEIGHT = 960, 600
INK = "#222222"
GRID = "#dddddd"
PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
REPLICAS = "#111111"
DESIRED = "#ff7f0e"
_LEFT, _RIGHT = 64, WIDTH - 240
_TOP_PANEL = (52, 296)
_BOTTOM_PANEL = (352, HEIGHT - 52)

Point = tuple[float, float]


@dataclass(frozen=True, slots=True)
class Line:
    points: tuple[Point, ...]
    color: str
    width: float = 2.0
    dashed: bool = False


@dataclass(frozen=True, slots=True)
class Box:
    x: float
    y: float
    w: float
    h: float
    fill: str | None = None
    stroke: str | None = None


@dataclass(frozen=True, slots=True)
class Label:
    x: float
    y: float
    """The baseline."""
    text: str
    size: int = 12
    anchor: str = "start"
    """``start``, ``middle`` or ``end``."""
    color: str = INK


Item = Line | Box | Label


@dataclass(frozen=True, slots=True)
class Figure:
    width: int
    height: int
    items: tuple[Item, ...]


def ticks(high: float, *, count: int = 5, whole: bool = False) -> list[float]:
    """Round tick values from 0 to at least ``high``: steps of 1, 2 or 5 × 10^k."""
    high = max(high, 1.0)
    raw = high / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    if whole:
        step = max(1.0, math.ceil(step))
    n = math.ceil(high / step - 1e-9)
    return [i * step for i in range(n + 1)]


@dataclass(frozen=True, slots=True)
class _Axes:
    top: float
    bottom: float
    x_high: float
    y_high: float

    def x(self, t: float) -> float:
        return _LEFT + (_RIGHT - _LEFT) * t / self.x_high

    def y(self, v: float) -> float:
        return self.bottom - (self.bottom - self.top) * v / self.y_high


def chart(title: str, names: Sequence[str], steps: Sequence[Step], duration: float) -> Figure:
    x_ticks = [t for t in ticks(duration, count=8) if t <= duration]
    values = [s.value for step in steps for s in step.triggers if s.value is not None]
    targets = [s.target for s in steps[0].triggers] if steps else []
    y_ticks = ticks(max([*values, *targets, 1.0]) * 1.05)
    counts = [max(s.replicas, s.desired) for s in steps] or [1]
    r_ticks = ticks(max(counts) + 1, count=6, whole=True)
    x_high = max(duration, 1.0)
    top = _Axes(*_TOP_PANEL, x_high, y_ticks[-1])
    bottom = _Axes(*_BOTTOM_PANEL, x_high, r_ticks[-1])
    items: list[Item] = [Label(WIDTH / 2, 28, title, size=13, anchor="middle")]
    items += _frame(top, x_ticks, y_ticks, "value")
    items += _frame(bottom, x_ticks, r_ticks, "replicas")
    items.append(Label((_LEFT + _RIGHT) / 2, HEIGHT - 14, "t (s)", anchor="middle"))
    legend: list[tuple[str, str, bool]] = []
    for i, name in enumerate(names):
        color = PALETTE[i % len(PALETTE)]
        items += _value_lines(top, steps, i, color)
        target = targets[i]
        items.append(
            Line(((top.x(0), top.y(target)), (top.x(duration), top.y(target))), color, 1.5, True)
        )
        legend += [(name, color, False), (f"target {num(target)}", color, True)]
    items += _legend(top, legend)
    items.append(
        Line(_staircase(bottom, [(s.t, s.replicas) for s in steps], duration), REPLICAS, 2.5)
    )
    # KEDA's steps ask for the current count unless they scale: the HPA's line alone reads.
    hpa = [(s.t, s.desired) for s in steps if s.by == HPA]
    items.append(Line(_staircase(bottom, hpa, duration), DESIRED, 1.5, True))
    items += _legend(bottom, [("replicas", REPLICAS, False), ("desired (HPA)", DESIRED, True)])
    return Figure(WIDTH, HEIGHT, tuple(items))


def _frame(axes: _Axes, x_ticks: list[float], y_ticks: list[float], name: str) -> list[Item]:
    items: list[Item] = []
    for v in y_ticks:
        y = axes.y(v)
        items.append(Line(((_LEFT, y), (_RIGHT, y)), GRID, 1.0))
        items.append(Label(_LEFT - 6, y + 4, num(v), size=11, anchor="end"))
    for t in x_ticks:
        x = axes.x(t)
        items.append(Line(((x, axes.bottom), (x, axes.bottom + 4)), INK, 1.0))
        items.append(Label(x, axes.bottom + 17, num(t), size=11, anchor="middle"))
    items.append(Box(_LEFT, axes.top, _RIGHT - _LEFT, axes.bottom - axes.top, stroke=INK))
    items.append(Label(_LEFT, axes.top - 8, name, size=12))
    return items


def _value_lines(axes: _Axes, steps: Sequence[Step], index: int, color: str) -> list[Item]:
    """One line per run of steps with a value: an error leaves a gap."""
    lines: list[Item] = []
    run: list[Point] = []
    for step in steps:
        value = step.triggers[index].value
        if value is None:
            if run:
                lines.append(Line(tuple(run), color))
            run = []
            continue
        run.append((axes.x(step.t), axes.y(value)))
    if run:
        lines.append(Line(tuple(run), color))
    return lines


def _staircase(
    axes: _Axes, counts: Sequence[tuple[int, int]], duration: float
) -> tuple[Point, ...]:
    """A count that holds until the next step changes it."""
    points: list[Point] = []
    for t, n in counts:
        if points:
            points.append((axes.x(t), points[-1][1]))
        points.append((axes.x(t), axes.y(n)))
    if points:
        points.append((axes.x(duration), points[-1][1]))
    return tuple(points)


def _legend(axes: _Axes, entries: Sequence[tuple[str, str, bool]]) -> list[Item]:
    items: list[Item] = []
    x = _RIGHT + 16
    for i, (text, color, dashed) in enumerate(entries):
        y = axes.top + 14 + 18 * i
        items.append(Line(((x, y - 4), (x + 24, y - 4)), color, 2.0, dashed))
        items.append(Label(x + 32, y, text, size=11))
    return items
