"""A figure as SVG text (no dependency: the figure is a few lines, boxes and labels)."""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from keda_gpu_scaler.app.simulate.chart import Box, Figure, Label, Line


def _n(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def _line(item: Line) -> str:
    points = " ".join(f"{_n(x)},{_n(y)}" for x, y in item.points)
    dash = ' stroke-dasharray="6 4"' if item.dashed else ""
    return (
        f'<polyline points="{points}" fill="none" stroke="{item.color}" '
        f'stroke-width="{_n(item.width)}"{dash} stroke-linejoin="round"/>'
    )


def _box(item: Box) -> str:
    fill = item.fill or "none"
    stroke = f' stroke="{item.stroke}"' if item.stroke else ""
    return (
        f'<rect x="{_n(item.x)}" y="{_n(item.y)}" width="{_n(item.w)}" height="{_n(item.h)}" '
        f'fill="{fill}"{stroke}/>'
    )


def _label(item: Label) -> str:
    return (
        f'<text x="{_n(item.x)}" y="{_n(item.y)}" font-size="{item.size}" '
        f'text-anchor={quoteattr(item.anchor)} fill="{item.color}">{escape(item.text)}</text>'
    )


def to_svg(figure: Figure) -> str:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{figure.width}" '
        f'height="{figure.height}" viewBox="0 0 {figure.width} {figure.height}" '
        'font-family="DejaVu Sans Mono, Menlo, Consolas, monospace">',
        f'<rect width="{figure.width}" height="{figure.height}" fill="#ffffff"/>',
    ]
    for item in figure.items:
        if isinstance(item, Line):
            parts.append(_line(item))
        elif isinstance(item, Box):
            parts.append(_box(item))
        else:
            parts.append(_label(item))
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
