"""The picture of a simulation, as drawing primitives that the SVG and PNG writers share.

One panel per unit of the triggers' metrics (percent and requests never share an axis), each
trigger's value (solid) and target (dashed) in its unit's panel; then the replicas after each
step (solid) and the HPA's desired count (dashed). Every value is what the scaler served at a
step, held until the next one: a staircase, never a line between two readings that would
suggest a ramp nobody measured. Periods a trigger answered an error, or KEDA served its
fallback instead, are shaded and labelled in its panel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from keda_gpu_scaler.app.simulate.runner import HPA, Step
from keda_gpu_scaler.app.simulate.text import num

WIDTH = 960
INK = "#222222"
GRID = "#dddddd"
PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
REPLICAS = "#111111"
DESIRED = "#ff7f0e"
ERROR_BAND = "#f4c7c3"
FALLBACK_BAND = "#fde2b8"
_LEFT, _RIGHT = 72, WIDTH - 248
_TOP, _PANEL, _GAP, _BOTTOM = 56, 190, 62, 52

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


@dataclass(frozen=True, slots=True)
class Series:
    """One trigger as the picture shows it: its HPA name and its metric's unit."""

    name: str
    unit: str


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
        return self.bottom - (self.bottom - self.top) * min(v, self.y_high) / self.y_high


def chart(title: str, series: Sequence[Series], steps: Sequence[Step], duration: float) -> Figure:
    units = list(dict.fromkeys(s.unit for s in series))
    height = _TOP + (len(units) + 1) * (_PANEL + _GAP) - _GAP + _BOTTOM
    x_high = max(duration, 1.0)
    x_ticks = [t for t in ticks(duration, count=8) if t <= duration]
    items: list[Item] = [Label(WIDTH / 2, 30, title, size=13, anchor="middle")]
    for row, unit in enumerate(units):
        top = _TOP + row * (_PANEL + _GAP)
        members = [i for i, s in enumerate(series) if s.unit == unit]
        items += _value_panel(top, unit, members, series, steps, duration, x_high, x_ticks)
    top = _TOP + len(units) * (_PANEL + _GAP)
    items += _replica_panel(top, steps, duration, x_high, x_ticks)
    items.append(Label((_LEFT + _RIGHT) / 2, height - 16, "t (s)", anchor="middle"))
    return Figure(WIDTH, height, tuple(items))


def _value_panel(
    top: float,
    unit: str,
    members: Sequence[int],
    series: Sequence[Series],
    steps: Sequence[Step],
    duration: float,
    x_high: float,
    x_ticks: list[float],
) -> list[Item]:
    values = [s.triggers[i].value for s in steps for i in members]
    targets = [steps[0].triggers[i].target for i in members] if steps else []
    y_ticks = ticks(max([v for v in values if v is not None] + targets + [1.0]) * 1.05)
    axes = _Axes(top, top + _PANEL, x_high, y_ticks[-1])
    bands: list[Item] = []
    legend: list[tuple[str, str, bool]] = []
    for i in members:
        labelled = sum(isinstance(item, Label) for item in bands)
        bands += _bands(axes, steps, i, duration, series[i].name, labelled)
    # The shading under everything, its labels over everything.
    items: list[Item] = [b for b in bands if isinstance(b, Box)]
    items += _frame(axes, x_ticks, y_ticks, unit)
    for i in members:
        color = PALETTE[i % len(PALETTE)]
        items += _value_steps(axes, steps, i, color, duration)
        target = steps[0].triggers[i].target if steps else 0.0
        left, right = (axes.x(0), axes.y(target)), (axes.x(duration), axes.y(target))
        items.append(Line((left, right), color, 1.5, True))
        legend += [(series[i].name, color, False), (f"target {num(target)}", color, True)]
    if any(b for b in items if isinstance(b, Box) and b.fill == ERROR_BAND):
        legend.append(("error (no value)", ERROR_BAND, False))
    if any(b for b in items if isinstance(b, Box) and b.fill == FALLBACK_BAND):
        legend.append(("fallback value", FALLBACK_BAND, False))
    items += [label for label in bands if isinstance(label, Label)]
    return items + _legend(axes, legend)


def _replica_panel(
    top: float, steps: Sequence[Step], duration: float, x_high: float, x_ticks: list[float]
) -> list[Item]:
    counts = [max(s.replicas, s.desired) for s in steps] or [1]
    r_ticks = ticks(max(counts) + 1, count=6, whole=True)
    axes = _Axes(top, top + _PANEL, x_high, r_ticks[-1])
    items = _frame(axes, x_ticks, r_ticks, "replicas")
    items.append(_staircase(axes, [(s.t, s.replicas) for s in steps], duration, REPLICAS, 2.5))
    # KEDA's steps ask for the current count unless they scale: the HPA's line alone reads.
    hpa = [(s.t, s.desired) for s in steps if s.by == HPA]
    items.append(_staircase(axes, hpa, duration, DESIRED, 1.5, dashed=True))
    return items + _legend(axes, [("replicas", REPLICAS, False), ("desired (HPA)", DESIRED, True)])


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


def _runs(steps: Sequence[Step], index: int, duration: float) -> list[tuple[str, float, float]]:
    """The periods of one trigger: ``value``, ``error`` or ``fallback``, each from the step
    that began it to the next step of another kind (or the end)."""
    runs: list[tuple[str, float, float]] = []
    for k, step in enumerate(steps):
        served = step.triggers[index]
        kind = "fallback" if served.fallback else ("error" if served.value is None else "value")
        end = steps[k + 1].t if k + 1 < len(steps) else duration
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, runs[-1][1], end)
        else:
            runs.append((kind, step.t, end))
    return runs


_CHAR_W = 6.7
"""About the width of one character of an 11 px label, in both writers."""


def _bands(
    axes: _Axes, steps: Sequence[Step], index: int, duration: float, name: str, row: int
) -> list[Item]:
    """Shaded periods of errors and fallback, each labelled; labels take turns on two rows
    (from ``row``) so that neighbouring periods do not write over each other."""
    items: list[Item] = []
    for kind, start, end in _runs(steps, index, duration):
        if kind == "value" or end <= start:
            continue
        fill = ERROR_BAND if kind == "error" else FALLBACK_BAND
        x0, x1 = axes.x(start), axes.x(end)
        items.append(Box(x0, axes.top, x1 - x0, axes.bottom - axes.top, fill=fill))
        text = f"{name}: {kind}"
        half = len(text) * _CHAR_W / 2
        x = min(max((x0 + x1) / 2, _LEFT + half + 2), _RIGHT - half - 2)
        items.append(Label(x, axes.top + 14 + 14 * (row % 2), text, 11, "middle"))
        row += 1
    return items


def _value_steps(
    axes: _Axes, steps: Sequence[Step], index: int, color: str, duration: float
) -> list[Item]:
    """Each served value held until the next step; none drawn while in error."""
    lines: list[Item] = []
    run: list[tuple[float, float]] = []
    for k, step in enumerate(steps):
        value = step.triggers[index].value
        if value is None:
            if run:
                lines.append(_staircase(axes, run, step.t, color, 2.0))
            run = []
            continue
        run.append((step.t, value))
        if k + 1 == len(steps):
            lines.append(_staircase(axes, run, duration, color, 2.0))
    return lines


def _staircase(
    axes: _Axes,
    counts: Sequence[tuple[float, float]],
    until: float,
    color: str,
    width: float,
    *,
    dashed: bool = False,
) -> Line:
    """A value that holds until the next one changes it, and to ``until`` after the last."""
    points: list[Point] = []

    def to(point: Point) -> None:
        if not points or points[-1] != point:
            points.append(point)

    for t, n in counts:
        if points:
            to((axes.x(t), points[-1][1]))
        to((axes.x(t), axes.y(n)))
    if points:
        to((axes.x(until), points[-1][1]))
    return Line(tuple(points), color, width, dashed)


def _legend(axes: _Axes, entries: Sequence[tuple[str, str, bool]]) -> list[Item]:
    items: list[Item] = []
    x = _RIGHT + 16
    for i, (text, color, dashed) in enumerate(entries):
        y = axes.top + 14 + 18 * i
        if color in (ERROR_BAND, FALLBACK_BAND):
            items.append(Box(x, y - 10, 24, 12, fill=color))
        else:
            items.append(Line(((x, y - 4), (x + 24, y - 4)), color, 2.0, dashed))
        items.append(Label(x + 32, y, text, size=12))
    return items
