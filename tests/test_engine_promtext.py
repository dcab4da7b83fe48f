"""The targeted exposition parser: agreement with prometheus_client, and the format's traps."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from keda_gpu_scaler.domain.engines import EngineKind
from keda_gpu_scaler.sources.engines.extract import SELECTIONS
from keda_gpu_scaler.sources.engines.promtext import (
    ExpositionError,
    PromSample,
    Selection,
    merge_expositions,
    parse_exposition,
)
from tests.engine_payloads import ALL_FIXTURES, fixture

Row = tuple[str, tuple[tuple[str, str], ...], str, float | None]


def _base(name: str) -> str:
    # prometheus_client appends ``_total`` to counter samples that lack it (Triton, TGI).
    return name.removesuffix("_total")


def _value(value: float) -> str:
    return "NaN" if math.isnan(value) else repr(float(value))


def _oracle(text: str, selection: Selection) -> list[Row]:
    rows: list[Row] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            raw = s.name if selection.wants(s.name) else s.name.removesuffix("_total")
            if not selection.wants(raw) or raw.endswith("_created"):
                continue
            ts = None if s.timestamp is None else float(s.timestamp)
            rows.append((_base(s.name), tuple(sorted(s.labels.items())), _value(s.value), ts))
    return sorted(rows)


def _ours(text: str, selection: Selection) -> list[Row]:
    rows: list[Row] = []
    for s in parse_exposition(text, selection).samples:
        if s.name.endswith("_created"):
            continue
        ts = None if s.timestamp_ms is None else s.timestamp_ms / 1000
        rows.append((_base(s.name), s.labels, _value(s.value), ts))
    return sorted(rows)


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_every_fixture_agrees_with_prometheus_client(name: str) -> None:
    text = fixture(name)
    everything = Selection.everything()
    ours = _ours(text, everything)
    assert len(ours) > 10
    assert ours == _oracle(text, everything)


@pytest.mark.parametrize("name", ALL_FIXTURES)
@pytest.mark.parametrize("kind", list(EngineKind))
def test_engine_selections_agree_with_prometheus_client(name: str, kind: EngineKind) -> None:
    text = fixture(name)
    assert _ours(text, SELECTIONS[kind]) == _oracle(text, SELECTIONS[kind])


def test_selection_takes_histogram_parts_but_not_longer_names() -> None:
    text = "\n".join(
        [
            'vllm:num_requests_waiting{model_name="m"} 3',
            'vllm:num_requests_waiting_by_reason{model_name="m",reason="capacity"} 2',
            'vllm:ttft_bucket{le="0.1",model_name="m"} 1',
            'vllm:ttft_sum{model_name="m"} 0.05',
            'vllm:ttft_count{model_name="m"} 1',
            'vllm:ttft_created{model_name="m"} 1.7e9',
        ]
    )
    parsed = parse_exposition(text, Selection({"vllm:num_requests_waiting", "vllm:ttft"}))
    assert [s.name for s in parsed.samples] == [
        "vllm:num_requests_waiting",
        "vllm:ttft_bucket",
        "vllm:ttft_sum",
        "vllm:ttft_count",
    ]


def test_label_values_with_escapes_braces_and_commas() -> None:
    text = 'm{b="x}y,z=\\"q\\"",a="back\\\\slash\\nnew line" , c="\\t",} 1\n'
    (sample,) = parse_exposition(text, Selection({"m"})).samples
    assert sample.labels == (
        ("a", "back\\slash\nnew line"),
        ("b", 'x}y,z="q"'),
        ("c", "\\t"),  # an unknown escape keeps its backslash
    )
    assert sample.label("b") == 'x}y,z="q"'
    assert _ours(text, Selection({"m"})) == _oracle(text, Selection({"m"}))


def test_special_values_timestamps_crlf_comments_and_blank_lines() -> None:
    text = (
        "# HELP g A gauge \\\\ with\\n escapes\r\n"
        "# TYPE g gauge\r\n"
        "\r\n"
        "# just a comment\r\n"
        'g{k="nan"} NaN\r\n'
        'g{k="pinf"} +Inf 1700000000123\r\n'
        'g{k="ninf"} -Inf\r\n'
        'g{k="exp"} 1.048576e+06\r\n'
        "g 9.75e-06 -5\r\n"
        '   g_bucket{k="indented"} 7\r\n'
    )
    parsed = parse_exposition(text, Selection({"g"}))
    values = {s.label("k"): s for s in parsed.samples}
    assert math.isnan(values["nan"].value)
    assert values["pinf"].value == math.inf
    assert values["pinf"].timestamp_ms == 1700000000123
    assert values["ninf"].value == -math.inf
    assert values["exp"].value == 1048576.0
    assert values["indented"].value == 7.0
    assert values[None].timestamp_ms == -5
    assert parsed.declared == {"g": "gauge"}
    assert _ours(text, Selection({"g"})) == _oracle(text, Selection({"g"}))


def test_declared_family_without_samples_is_recorded() -> None:
    text = "# HELP vllm:num_requests_waiting x\n# TYPE vllm:num_requests_waiting gauge\n"
    parsed = parse_exposition(text, SELECTIONS[EngineKind.VLLM])
    assert parsed.samples == ()
    assert parsed.declared == {"vllm:num_requests_waiting": "gauge"}


def test_openmetrics_eof_and_exemplars() -> None:
    text = (
        "# TYPE c counter\n# UNIT c seconds\n"
        'c_total{a="1"} 5 # {trace_id="abc"} 1.0 1700000000\n'
        "c_created 1.7e9\n# EOF\n"
    )
    parsed = parse_exposition(text, Selection({"c"}))
    assert parsed.samples == (PromSample("c_total", (("a", "1"),), 5.0),)
    with pytest.raises(ExpositionError, match="content after # EOF"):
        parse_exposition(text + "c_total 6\n", Selection({"c"}))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<html><body>502 Bad Gateway</body></html>", "not a sample line"),
        ('{"error": "not found"}', "not a sample line"),
        ("Not Found", "not a sample line"),
        ("m{a=b} 1", "malformed labels"),
        ('m{a="b" c="d"} 1', "expected ',' or '}'"),
        ('m{a="1",a="2"} 1', "duplicate label name"),
        ("m 1_000", "invalid value"),
        ("m infinity", "invalid value"),
        ("m 1 2 3", "expected 'value"),
        ("m 1 1.5", "invalid timestamp"),
        ("m{} 1\nm 2", "duplicate series"),
        ('m{a="unterminated} 1', "malformed labels"),
        ("m", "expected a space"),
    ],
)
def test_garbage_is_a_parse_error_with_the_line(text: str, reason: str) -> None:
    with pytest.raises(ExpositionError, match=reason) as info:
        parse_exposition("# TYPE m gauge\n" + text, Selection({"m"}))
    assert info.value.line >= 2


def test_skipped_lines_are_not_label_parsed() -> None:
    # An unwanted series with odd labels costs nothing and cannot fail the scrape.
    text = 'other{x="a}\\"b"} 1\nm 2'
    assert [s.value for s in parse_exposition(text, Selection({"m"})).samples] == [2.0]


def test_tagging_and_merging_keep_series_apart() -> None:
    one = parse_exposition('m{z="1"} 1', Selection({"m"}))
    merged = merge_expositions(
        [one.with_label("__address__", "10.0.0.1"), one.with_label("__address__", "10.0.0.2")]
    )
    assert [s.labels for s in merged.samples] == [
        (("__address__", "10.0.0.1"), ("z", "1")),
        (("__address__", "10.0.0.2"), ("z", "1")),
    ]
