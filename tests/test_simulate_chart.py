"""The simulator's picture: values held as steps, one axis per unit, errors and fallback
labelled, lower-case text in the PNG too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from keda_gpu_scaler.app.simulate.chart import (
    ERROR_BAND,
    FALLBACK_BAND,
    Box,
    Figure,
    Label,
    Line,
)
from keda_gpu_scaler.app.simulate.command import Simulation
from keda_gpu_scaler.app.simulate.png import _GLYPHS, SCALE, _Canvas
from tests.test_simulate import scaled_object, simulate


def _simulate(
    tmp_path: Path, triggers: list[dict[str, Any]], metrics: dict[str, Any]
) -> Simulation:
    so = scaled_object(
        maxReplicaCount=6,
        pollingInterval=15,
        fallback={"failureThreshold": 1, "replicas": 3},
        triggers=triggers,
    )
    return simulate(tmp_path, so, {"duration": 300, "metrics": metrics})


GPU = {
    "type": "external",
    "metricType": "Value",
    "metadata": {
        "scalerAddress": "s:6000",
        "metricName": "gpu",
        "metricType": "gpu_utilization",
        "targetValue": "60",
    },
}
QUEUE = {
    "type": "external",
    "metadata": {
        "scalerAddress": "s:6000",
        "metricName": "queue",
        "metricType": "vllm_queue_depth",
        "vllmEndpoint": "http://vllm.llm.svc:8000/metrics",
        "endpointDiscovery": "dns",
        "targetValue": "5",
    },
}
RAMP = {
    "demand": True,
    "steps": [
        {"at": 0, "value": 50},
        {"at": 30, "ramp": {"to": 250, "over": 90}},
        {"at": 150, "value": None},
        {"at": 210, "value": 80},
    ],
}


def _figure(tmp_path: Path) -> Figure:
    metrics = {"gpu_utilization": RAMP, "vllm_queue_depth": {"backlog": "gpu_utilization"}}
    return _simulate(tmp_path, [GPU, QUEUE], metrics).figure()


def _panels(figure: Figure) -> list[str]:
    frames = [b for b in figure.items if isinstance(b, Box) and b.stroke is not None]
    names = [lb for lb in figure.items if isinstance(lb, Label) and lb.size == 12]
    return [
        next(lb.text for lb in names if lb.x == frame.x and lb.y == frame.y - 8) for frame in frames
    ]


def test_each_unit_has_its_own_panel(tmp_path: Path) -> None:
    figure = _figure(tmp_path)
    assert _panels(figure) == ["percent", "requests", "replicas"]
    assert figure.height == 56 + 3 * (190 + 62) - 62 + 52


def test_values_are_held_as_steps_between_polls(tmp_path: Path) -> None:
    figure = _figure(tmp_path)
    value_lines = [
        item for item in figure.items if isinstance(item, Line) and item.color == "#1f77b4"
    ]
    solid = [line for line in value_lines if not line.dashed]
    assert solid
    for line in solid:
        for (xa, ya), (xb, yb) in zip(line.points, line.points[1:], strict=False):
            assert xa == xb or ya == yb, "a value line that is not a step"


def test_error_and_fallback_periods_are_labelled(tmp_path: Path) -> None:
    figure = _figure(tmp_path)
    bands = [b for b in figure.items if isinstance(b, Box) and b.fill is not None]
    labels = {lb.text for lb in figure.items if isinstance(lb, Label)}
    assert {b.fill for b in bands} == {ERROR_BAND, FALLBACK_BAND}
    # The first failure is an error (threshold 1), then KEDA falls back; the queue, whose
    # source is in error too, the same.
    assert {"s0-gpu: error", "s0-gpu: fallback", "s1-queue: fallback"} <= labels
    assert {"error (no value)", "fallback value"} <= labels


def test_the_png_font_has_lower_case() -> None:
    for char in "abcdefghijklmnopqrstuvwxyz":
        assert _GLYPHS[char] != _GLYPHS[char.upper()], char
    lower, upper = _Canvas(80, 20), _Canvas(80, 20)
    lower.label(Label(2, 9, "desired"))
    upper.label(Label(2, 9, "DESIRED"))
    assert lower.pixels != upper.pixels
    assert SCALE == 2
