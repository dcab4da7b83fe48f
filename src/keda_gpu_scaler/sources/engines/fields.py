"""What every engine's extractor shares: building a reading from field computations, the
window between two scrapes, rates, histogram means and quantiles, a family renamed upstream,
and a hint for a family an engine writes only when an option turns it on.

A field's computation returns a float or raises :class:`~.window.Absent` with the reason;
:func:`build` stores the reason beside the field, never a 0 in its place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from keda_gpu_scaler.sources.engines import window as w
from keda_gpu_scaler.sources.engines.promtext import Exposition, PromSample
from keda_gpu_scaler.sources.engines.window import Absent, Baseline, Window

Options = Mapping[str, str]
"""What a target names beyond its URL (a Dynamo metric prefix, a router's pool or model)."""
NO_OPTIONS: Options = {}

QUANTILE = 0.95
"""The quantile read from latency histograms (p95, as the reference dashboards use)."""
FIRST_SCRAPE = "first scrape: a rate needs two scrapes"

_R = TypeVar("_R")
Compute = Callable[[], float]


def build(cls: type[_R], taken_at: float, computations: Mapping[str, Compute]) -> _R:
    """A reading of ``cls``: each field's value, or the reason it has none."""
    values, reasons = w.split(w.fill(computations))
    make: Callable[..., _R] = cls
    return make(taken_at=taken_at, reasons=reasons, **values)


def advance(
    exposition: Exposition, names: Iterable[str], taken_at: float, previous: Baseline | None
) -> tuple[Window | None, Baseline]:
    """The counters ``names`` now, and their window since ``previous`` (None at first)."""
    current = w.take_baseline(exposition, names, taken_at)
    return w.window_between(previous, current), current


def rate(window: Window | None, name: str) -> float:
    return w.rate(w.require(window, FIRST_SCRAPE), [name])


def mean(window: Window | None, family: str) -> float:
    hist = w.histogram_delta(w.require(window, FIRST_SCRAPE), family)
    return w.histogram_mean(hist, family)


def quantile(window: Window | None, family: str) -> float:
    hist = w.histogram_delta(w.require(window, FIRST_SCRAPE), family)
    return w.histogram_quantile(QUANTILE, hist, family)


def newer_or_older(exposition: Exposition, newer: str, older: str) -> str:
    """The family to read of one renamed upstream: the older name only when the newer has no
    samples (releases in between export both with the same values: never add them)."""
    if not exposition.named(newer) and exposition.named(older):
        return older
    return newer


def hinted(compute: Compute, hint: str) -> Compute:
    """``compute``, whose "missing from the payload" says what turns the family on."""

    def run() -> float:
        try:
            return compute()
        except Absent as absent:
            if not absent.missing:
                raise
            raise Absent(f"{absent.reason}: {hint}", missing=True) from None

    return run


def matching(samples: list[PromSample], wanted: Options) -> list[PromSample]:
    """The samples whose labels have every value ``wanted`` names."""
    return [s for s in samples if all(s.label(k) == v for k, v in wanted.items())]
