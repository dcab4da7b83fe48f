"""Sans-I/O arithmetic over parsed samples: gauges, per-series counter deltas, histograms.

A computation that cannot give a number raises :class:`Absent` with the reason, which the
extractors store next to the field; nothing here ever turns "unknown" into 0.

Counters are compared **per series** (sample name plus full label set) between two
scrapes. A series that went backwards (a restart, a model reload) or that is new this
scrape is re-baselined: it adds nothing to this window and its current value is the next
baseline. A signal whose every series was re-baselined is absent, not 0; a signal whose
series all moved by 0 is a real 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

import msgspec

from keda_gpu_scaler.sources.engines.promtext import Exposition, Labels, PromSample, SeriesKey


class Absent(Exception):
    """No value for one field; ``reason`` says why. ``missing``: the payload lacks the family's
    samples altogether (an engine option that turns it on, an older release)."""

    def __init__(self, reason: str, *, missing: bool = False) -> None:
        self.reason = reason
        self.missing = missing
        super().__init__(reason)


class Baseline(msgspec.Struct, frozen=True):
    """Cumulative series of one scrape, kept for the next scrape's deltas."""

    at: float
    values: dict[SeriesKey, float]


class Window(msgspec.Struct, frozen=True):
    """Valid per-series deltas between two scrapes ``dt`` seconds apart."""

    dt: float
    deltas: dict[SeriesKey, float]
    current: dict[SeriesKey, float]


def fill(computations: Mapping[str, Callable[[], float]]) -> dict[str, float | str]:
    """Run each field's computation: a float, or the reason it is absent (a str)."""
    out: dict[str, float | str] = {}
    for field, compute in computations.items():
        try:
            out[field] = compute()
        except Absent as absent:
            out[field] = absent.reason
    return out


def split(results: dict[str, float | str]) -> tuple[dict[str, float], dict[str, str]]:
    values = {k: v for k, v in results.items() if isinstance(v, float)}
    reasons = {k: v for k, v in results.items() if isinstance(v, str)}
    return values, reasons


# --- gauges -------------------------------------------------------------------------------


def _finite(samples: list[PromSample], name: str, exposition: Exposition) -> list[PromSample]:
    if not samples:
        if name in exposition.declared:
            raise Absent(
                f"{name} is declared but has no samples (stats logging disabled?)", missing=True
            )
        raise Absent(f"{name} is missing from the payload", missing=True)
    for s in samples:
        if not math.isfinite(s.value) or s.value < 0:
            raise Absent(f"{name}{_show(s.labels)} is {s.value!r}")
    return samples


def gauge_sum(exposition: Exposition, name: str) -> float:
    return math.fsum(s.value for s in _finite(exposition.named(name), name, exposition))


def gauge_max(exposition: Exposition, name: str) -> float:
    return max(s.value for s in _finite(exposition.named(name), name, exposition))


def gauge_per_scheduler(
    exposition: Exposition, name: str, rank_labels: frozenset[str], split_label: str
) -> float:
    """Each scheduler's gauge once, Σ over schedulers.

    The ranks of one scheduler (``rank_labels``) repeat or share its number: the highest
    rank's counts. A series split by ``split_label`` (a non-empty value) beside a total (the
    label empty or absent) is a breakdown of that total: the total counts, or, for a rank
    that wrote no total, the Σ of its split. Every other label tells schedulers apart.
    """
    ranks: dict[Labels, dict[Labels, list[float]]] = defaultdict(dict)
    for s in _finite(exposition.named(name), name, exposition):
        scheduler = tuple(p for p in s.labels if p[0] not in rank_labels and p[0] != split_label)
        rank = tuple(p for p in s.labels if p[0] in rank_labels)
        total_and_split = ranks[scheduler].setdefault(rank, [math.nan, 0.0])
        if s.label(split_label):
            total_and_split[1] += s.value
        else:
            total_and_split[0] = s.value
    return math.fsum(
        max(split if math.isnan(total) else total for total, split in by_rank.values())
        for by_rank in ranks.values()
    )


def fraction_percent(value: float, name: str) -> float:
    """A 0..1 fraction as percent; above 1 means the engine's unit changed: refuse it."""
    if value > 1.0:
        raise Absent(f"{name} is {value!r}, above 1 (expected a fraction 0..1)")
    return value * 100.0


# --- counters -----------------------------------------------------------------------------


def take_baseline(exposition: Exposition, names: Iterable[str], at: float) -> Baseline:
    wanted = frozenset(names)
    values = {s.key: s.value for s in exposition.samples if s.name in wanted}
    return Baseline(at=at, values=values)


def window_between(previous: Baseline | None, current: Baseline) -> Window | None:
    """Per-series deltas; None before a second scrape or when the clock did not move."""
    if previous is None or current.at <= previous.at:
        return None
    deltas: dict[SeriesKey, float] = {}
    for key, value in current.values.items():
        before = previous.values.get(key)
        if before is None or not math.isfinite(value) or not math.isfinite(before):
            continue  # new series: re-baseline
        if value >= before:
            deltas[key] = value - before
        # else: reset, re-baseline (never a negative delta)
    return Window(dt=current.at - previous.at, deltas=deltas, current=current.values)


def require(window: Window | None, first_reason: str) -> Window:
    if window is None:
        raise Absent(first_reason)
    return window


def counter_delta(window: Window, name: str) -> float:
    """Σ of valid deltas of every series of ``name``."""
    keys = [k for k in window.current if k[0] == name]
    if not keys:
        raise Absent(f"{name} is missing from the payload", missing=True)
    valid = [window.deltas[k] for k in keys if k in window.deltas]
    if not valid:
        raise Absent(f"{name} was reset or is new in this window; re-baselined")
    return math.fsum(valid)


def paired_deltas(window: Window, numerator: str, denominator: str) -> tuple[float, float]:
    """Σ Δnumerator and Σ Δdenominator over label sets where both series have a delta."""
    num = {k[1]: d for k, d in window.deltas.items() if k[0] == numerator}
    den = {k[1]: d for k, d in window.deltas.items() if k[0] == denominator}
    both = num.keys() & den.keys()
    if not both:
        for name in (numerator, denominator):
            counter_delta(window, name)  # raises the precise reason
        raise Absent(f"no series of {numerator} matches one of {denominator}")
    return math.fsum(num[k] for k in both), math.fsum(den[k] for k in both)


def rate(window: Window, names: Iterable[str]) -> float:
    return math.fsum(counter_delta(window, name) for name in names) / window.dt


# --- histograms ---------------------------------------------------------------------------


class HistogramDelta(msgspec.Struct, frozen=True):
    buckets: list[tuple[float, float]]
    """(upper bound, cumulative Δcount), sorted by bound; ends with +Inf."""
    count: float
    sum: float | None
    unquantiled: str | None = None
    """Why no quantile can be read from ``buckets`` (the series share no finite bound)."""


def histogram_names(family: str) -> tuple[str, str, str]:
    return family + "_bucket", family + "_count", family + "_sum"


def histogram_delta(window: Window, family: str) -> HistogramDelta:
    """Bucket deltas summed over every series group (engines, models, pods) with valid deltas."""
    bucket_name, count_name, sum_name = histogram_names(family)
    groups: dict[Labels, dict[float, float] | None] = {}
    for key in window.current:
        name, labels = key
        if name != bucket_name:
            continue
        base = tuple(p for p in labels if p[0] != "le")
        delta = window.deltas.get(key)
        bucket = groups.setdefault(base, {})
        if delta is None or bucket is None:
            groups[base] = None  # one bucket re-baselined: the whole group waits a window
            continue
        bucket[_upper_bound(labels, bucket_name)] = delta
    if not groups:
        raise Absent(f"{family} is missing from the payload", missing=True)
    return _merge(window, groups, count_name, sum_name, family)


def _merge(
    window: Window,
    groups: dict[Labels, dict[float, float] | None],
    count_name: str,
    sum_name: str,
    family: str,
) -> HistogramDelta:
    merged: dict[float, float] = defaultdict(float)
    count = 0.0
    total: float | None = 0.0
    used: list[dict[float, float]] = []
    for base, buckets in groups.items():
        count_delta = window.deltas.get((count_name, base))
        if buckets is None or count_delta is None:
            continue
        used.append(buckets)
        buckets.setdefault(math.inf, count_delta)  # PromQL needs +Inf; _count is the same
        count += count_delta
        sum_delta = window.deltas.get((sum_name, base))
        total = None if total is None or sum_delta is None else total + sum_delta
    if not used:
        raise Absent(f"{family} was reset or is new in this window; re-baselined")
    # Bounds are the engine's choice (vLLM's --custom-histogram-buckets, Dynamo's
    # DYN_METRICS_*), so two engines may differ: a cumulative count is known for every series
    # only at a bound they all have.
    shared = frozenset(used[0]).intersection(*used[1:])
    for bound in shared:
        merged[bound] = math.fsum(buckets[bound] for buckets in used)
    unquantiled = None
    if len(shared) == 1 and any(len(buckets) > 1 for buckets in used):
        unquantiled = f"the series of {family} share no finite bucket bound (custom buckets?)"
    return HistogramDelta(sorted(merged.items()), count, total, unquantiled)


def histogram_mean(hist: HistogramDelta, family: str) -> float:
    if hist.count <= 0:
        raise Absent(f"no {family} observations in the window")
    if hist.sum is None:
        raise Absent(f"{family}_sum is missing from the payload")
    return hist.sum / hist.count


def histogram_quantile(q: float, hist: HistogramDelta, family: str) -> float:
    """Linear interpolation inside the bucket holding rank ``q × count``, as PromQL does."""
    if hist.unquantiled is not None:
        raise Absent(hist.unquantiled)
    buckets = _monotonic(hist.buckets)
    if len(buckets) < 2 or buckets[-1][1] <= 0:
        raise Absent(f"no {family} observations in the window")
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower  # past the last finite bound: PromQL answers that bound
            if bound <= 0:
                return bound
            width = cumulative - below
            return lower + (bound - lower) * ((rank - below) / width if width else 1.0)
        lower, below = bound, cumulative
    raise Absent(f"{family} buckets are inconsistent")  # unreachable: +Inf holds everything


def _monotonic(buckets: list[tuple[float, float]]) -> list[tuple[float, float]]:
    # Scrapes are not atomic; PromQL smooths small non-monotonic bucket counts the same way.
    out: list[tuple[float, float]] = []
    high = 0.0
    for bound, cumulative in buckets:
        high = max(high, cumulative)
        out.append((bound, high))
    return out


def _upper_bound(labels: Labels, name: str) -> float:
    text = dict(labels).get("le")
    if text is None:
        raise Absent(f"{name} has a sample without an le label")
    try:
        return float(text)
    except ValueError:
        raise Absent(f"{name} has an invalid le={text!r}") from None


def _show(labels: Labels) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else ""
