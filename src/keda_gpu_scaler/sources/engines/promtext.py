"""A sans-I/O parser of the Prometheus text format (0.0.4) for the few series a caller wants.

An engine's ``/metrics`` payload is mostly series nobody scales on (``python_gc_*``,
``process_*``, dozens of histogram buckets). :func:`parse_exposition` looks at the start of
each line, before any label parsing, and fully parses only the sample lines of the wanted
families; every other line gets a cheap shape check, so an HTML error page or JSON still
fails as a parse error rather than reading as "no series".

Handled: ``# HELP``/``# TYPE``/other comments, blank lines, CRLF, no final newline, label
values with escapes (``\\\\``, ``\\"``, ``\\n``) and with ``,`` or ``}`` inside, a trailing
comma in the label block, any label order, ``NaN``/``+Inf``/``-Inf``/exponents, optional
timestamps (integer milliseconds), OpenMetrics exemplars after `` # `` and a final ``# EOF``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import msgspec

Labels = tuple[tuple[str, str], ...]
"""Label pairs sorted by name: one series has one key whatever order the engine printed."""

SeriesKey = tuple[str, Labels]

_HISTOGRAM_SUFFIXES = ("", "_bucket", "_sum", "_count", "_total")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,?)')
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_LABEL_NAMES: set[str] = set()
_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
# Every line must be blank, a comment, or start like a sample (a name, then labels or a
# value), so an HTML error page or JSON fails as a parse error, not as "no series".
_SKIPPED_SHAPE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{|[ \t]+[-+0-9.NnIi])")
_BLANKS = frozenset(("", " ", "\t", "\r"))


class ExpositionError(ValueError):
    """The payload is not Prometheus text; ``line`` is 1-based."""

    def __init__(self, line: int, reason: str) -> None:
        self.line = line
        self.reason = reason
        super().__init__(f"line {line}: {reason}")


class PromSample(msgspec.Struct, frozen=True, gc=False):
    name: str
    labels: Labels
    value: float
    timestamp_ms: int | None = None

    def label(self, name: str) -> str | None:
        for key, value in self.labels:
            if key == name:
                return value
        return None

    @property
    def key(self) -> SeriesKey:
        return (self.name, self.labels)


class Exposition(msgspec.Struct, frozen=True):
    """The wanted samples in payload order, and the wanted families a ``# TYPE`` declared."""

    samples: tuple[PromSample, ...]
    declared: dict[str, str]
    """Family name -> type (``counter``, ``gauge``, ...), even when it has no samples."""

    def named(self, name: str) -> list[PromSample]:
        return [s for s in self.samples if s.name == name]

    def with_label(self, name: str, value: str) -> Exposition:
        """Every sample with one more label, e.g. the pod address in DNS discovery mode."""
        tagged = tuple(
            PromSample(s.name, tuple(sorted((*s.labels, (name, value)))), s.value, s.timestamp_ms)
            for s in self.samples
        )
        return Exposition(samples=tagged, declared=self.declared)


def merge_expositions(parts: Iterable[Exposition]) -> Exposition:
    """One exposition of several payloads whose series keys do not collide (tag them first)."""
    samples: list[PromSample] = []
    declared: dict[str, str] = {}
    for part in parts:
        samples.extend(part.samples)
        declared.update(part.declared)
    return Exposition(samples=tuple(samples), declared=declared)


class Selection:
    """Which families to extract: exact family names and/or name prefixes.

    A family ``f`` selects the sample names ``f``, ``f_bucket``, ``f_sum``, ``f_count`` and
    ``f_total`` (histograms, summaries, OpenMetrics counters), never ``f_created`` and never
    a longer name such as ``f_by_reason``.
    """

    def __init__(self, families: Iterable[str] = (), *, prefixes: Iterable[str] = ()) -> None:
        self.families = frozenset(families)
        self.prefixes = tuple(prefixes)
        self.names = frozenset(f + s for f in self.families for s in _HISTOGRAM_SUFFIXES)
        """Every sample name the exact families select."""
        # str.startswith(tuple) is one C call: the whole cost of an unwanted line.
        self._starts = tuple(sorted(self.families)) + self.prefixes

    @classmethod
    def everything(cls) -> Selection:
        return cls(prefixes=("",))

    def may_want(self, line: str) -> bool:
        return line.startswith(self._starts)

    def wants(self, name: str) -> bool:
        return name in self.names or name.startswith(self.prefixes)

    def wants_family(self, name: str) -> bool:
        return name in self.families or name.startswith(self.prefixes)


class _Invalid(Exception):
    """A malformed line; :func:`parse_exposition` adds the line number."""


def parse_exposition(text: str, selection: Selection) -> Exposition:
    """Parse ``text`` (a whole payload); raises :class:`ExpositionError`."""
    samples: list[PromSample] = []
    declared: dict[str, str] = {}
    seen: set[SeriesKey] = set()
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        first = line[:1]
        try:
            if first == "#":
                if line.startswith("# TYPE "):
                    _note_type(line, selection, declared)
                elif line.rstrip("\r") == "# EOF":
                    _check_after_eof(lines, number)
                    break
            elif first in _BLANKS:
                _add(_parse_indented(line, selection, declared), samples, seen)
            elif selection.may_want(line):
                _add(_parse_sample_line(line.rstrip("\r"), selection), samples, seen)
            elif _SKIPPED_SHAPE.match(line) is None:
                raise _Invalid(f"not a sample line: {line[:60]!r}")
        except _Invalid as exc:
            raise ExpositionError(number, str(exc)) from None
    return Exposition(samples=tuple(samples), declared=declared)


def _add(sample: PromSample | None, samples: list[PromSample], seen: set[SeriesKey]) -> None:
    if sample is None:
        return
    key = (sample.name, sample.labels)
    if key in seen:
        raise _Invalid(f"duplicate series {sample.name}{dict(sample.labels)}")
    seen.add(key)
    samples.append(sample)


def _parse_indented(line: str, selection: Selection, declared: dict[str, str]) -> PromSample | None:
    # Rare: blank lines, and lines with leading blanks, which the format allows.
    line = line.strip(" \t\r")
    if not line:
        return None
    if line[0] == "#":
        if line.startswith("# TYPE "):
            _note_type(line, selection, declared)
        return None
    if selection.may_want(line):
        return _parse_sample_line(line, selection)
    if _SKIPPED_SHAPE.match(line) is None:
        raise _Invalid(f"not a sample line: {line[:60]!r}")
    return None


def _check_after_eof(lines: list[str], number: int) -> None:
    for offset, rest in enumerate(lines[number:], number + 1):
        if rest.strip():
            raise ExpositionError(offset, "content after # EOF")


def _note_type(line: str, selection: Selection, declared: dict[str, str]) -> None:
    parts = line.split(None, 3)
    if len(parts) == 4 and selection.wants_family(parts[2]):
        declared[parts[2]] = parts[3].strip()


def _parse_sample_line(line: str, selection: Selection) -> PromSample | None:
    """The common line (no escapes, tabs or exemplars) by plain string slicing; others slowly."""
    if "\\" in line or "\t" in line or " #" in line:
        return _parse_sample_slowly(line, selection)
    brace = line.find("{")
    if brace < 0:
        name, _, tail = line.partition(" ")
        labels: Labels | None = ()
    else:
        close = line.rfind("}")
        name, tail = line[:brace], line[close + 1 :]
        labels = _fast_labels(line[brace + 1 : close]) if close > brace else None
    if labels is None or not tail.startswith(" ") or not _is_wanted_name(name, selection):
        return _parse_sample_slowly(line, selection)
    fields = tail.split()
    if len(fields) != 1:
        return _parse_sample_slowly(line, selection)
    return PromSample(name, labels, _parse_value(fields[0]))


def _fast_labels(block: str) -> Labels | None:
    """``a="x",b="y"`` without backslashes, where ``",`` can only end a value; else None."""
    if block.endswith('",'):
        body = block[:-2]
    elif block.endswith('"'):
        body = block[:-1]
    else:
        return None if block.strip() else ()
    parts = [part.split('="') for part in body.split('",')]
    # Exactly one quote per pair besides the separators': no quote hides in a key or value.
    if body.count('"') != 2 * len(parts) - 1:
        return None
    for part in parts:
        if len(part) != 2 or not _is_label_name(part[0]):
            return None
    pairs = sorted((key, value) for key, value in parts)
    if len(dict(pairs)) != len(pairs):
        raise _Invalid("duplicate label name")
    return tuple(pairs)


def _is_wanted_name(name: str, selection: Selection) -> bool:
    if name in selection.names:
        return True
    return selection.wants(name) and _NAME.fullmatch(name) is not None


def _is_label_name(key: str) -> bool:
    # Engines use a handful of label names: remember the valid ones (bounded).
    if key in _LABEL_NAMES:
        return True
    if _LABEL_NAME.fullmatch(key) is None:
        return False
    if len(_LABEL_NAMES) < 4096:
        _LABEL_NAMES.add(key)
    return True


def _parse_sample_slowly(line: str, selection: Selection) -> PromSample | None:
    match = _NAME.match(line)
    if match is None:
        raise _Invalid(f"not a metric name: {line[:60]!r}")
    name = match.group()
    if not selection.wants(name):
        return None  # a longer name sharing a wanted prefix, e.g. ``..._by_reason``
    pos = match.end()
    labels: Labels = ()
    if pos < len(line) and line[pos] == "{":
        labels, pos = _parse_labels(line, pos + 1)
    value, timestamp = _parse_tail(line[pos:])
    return PromSample(name, labels, value, timestamp)


def _parse_labels(line: str, pos: int) -> tuple[Labels, int]:
    pairs: list[tuple[str, str]] = []
    while True:
        while pos < len(line) and line[pos] in " \t":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            break
        match = _LABEL.match(line, pos)
        if match is None:
            raise _Invalid(f"malformed labels at column {pos + 1}")
        key, value, comma = match.groups()
        pairs.append((key, _unescape(value) if "\\" in value else value))
        pos = match.end()
        if not comma and not line.startswith("}", pos):
            raise _Invalid(f"expected ',' or '}}' at column {pos + 1}")
    if len({key for key, _ in pairs}) != len(pairs):
        raise _Invalid("duplicate label name")
    pairs.sort()
    return tuple(pairs), pos + 1


def _unescape(value: str) -> str:
    # Unknown escapes keep their backslash, as Prometheus itself reads them.
    return _UNESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group()), value)


def _parse_tail(tail: str) -> tuple[float, int | None]:
    if not tail or tail[0] not in " \t":
        raise _Invalid("expected a space before the value")
    exemplar = tail.find(" # ")
    if exemplar >= 0:  # OpenMetrics exemplar: not a reading
        tail = tail[:exemplar]
    fields = tail.split()
    if not 1 <= len(fields) <= 2:
        raise _Invalid(f"expected 'value [timestamp]', got {tail.strip()!r}")
    value = _parse_value(fields[0])
    if len(fields) == 1:
        return value, None
    try:
        return value, int(fields[1])
    except ValueError:
        raise _Invalid(f"invalid timestamp {fields[1]!r}") from None


def _parse_value(text: str) -> float:
    # Python's float() also takes "1_000" and "infinity"; Go's ParseFloat (Prometheus) does not.
    if "_" in text:
        raise _Invalid(f"invalid value {text!r}")
    try:
        value = float(text)
    except ValueError:
        raise _Invalid(f"invalid value {text!r}") from None
    if math.isinf(value) and text.lstrip("+-").lower() not in ("inf",):
        raise _Invalid(f"invalid value {text!r}")
    return value
