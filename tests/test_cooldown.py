from __future__ import annotations

from keda_gpu_scaler.domain.cooldown import (
    CooldownBook,
    CooldownEntry,
    apply_cooldown,
)
from keda_gpu_scaler.domain.decision import TriggerKey
from keda_gpu_scaler.domain.trigger import parse_trigger


def _run(values: list[tuple[float, float]], cooldown_s: float = 60) -> list[tuple[float, bool]]:
    entry: CooldownEntry | None = None
    served = []
    for now, raw in values:
        outcome = apply_cooldown(entry, raw, cooldown_s=cooldown_s, now=now)
        entry = outcome.entry
        served.append((outcome.value, outcome.held))
    return served


def test_first_value_and_increases_pass() -> None:
    assert _run([(0, 10), (1, 20), (2, 20)]) == [(10, False), (20, False), (20, False)]


def test_a_decrease_starts_a_window_that_holds_later_decreases() -> None:
    served = _run([(0, 50), (1, 40), (2, 30), (60.9, 20), (61, 20), (62, 10)])
    assert served == [(50, False), (40, False), (40, True), (40, True), (20, False), (20, True)]


def test_an_increase_does_not_reset_the_window() -> None:
    served = _run([(0, 50), (1, 40), (30, 45), (40, 10), (61, 10)])
    assert served == [(50, False), (40, False), (45, False), (45, True), (10, False)]


def test_zero_disables() -> None:
    assert _run([(0, 50), (1, 40), (2, 30)], cooldown_s=0) == [
        (50, False),
        (40, False),
        (30, False),
    ]


def test_remaining_time_is_reported() -> None:
    first = apply_cooldown(None, 50, cooldown_s=60, now=0)
    down = apply_cooldown(first.entry, 40, cooldown_s=60, now=10)
    held = apply_cooldown(down.entry, 30, cooldown_s=60, now=25)
    assert held.held
    assert held.remaining_s == 45


def test_keys_separate_objects_and_triggers() -> None:
    spec = parse_trigger({"profile": "training"})
    other = parse_trigger({"profile": "training", "aggregation": "avg"})
    keys = {
        TriggerKey("ns", "a", spec),
        TriggerKey("ns", "b", spec),
        TriggerKey("other", "a", spec),
        TriggerKey("ns", "a", other),
    }
    assert len(keys) == 4
    assert TriggerKey("ns", "a", spec) == TriggerKey(
        "ns", "a", parse_trigger({"profile": "training"})
    )


def test_book_forgets_untouched_entries() -> None:
    book: CooldownBook[TriggerKey] = CooldownBook(forget_after_s=100)
    spec = parse_trigger({})
    old, new = TriggerKey("ns", "old", spec), TriggerKey("ns", "new", spec)
    book.put(old, CooldownEntry(1, None, touched_at=0))
    book.put(new, CooldownEntry(1, None, touched_at=150))
    assert len(book) == 1
    assert book.get(old) is None
    assert book.get(new) is not None


def test_keys_tell_apart_triggers_that_differ_only_in_activation_target_or_cooldown() -> None:
    base = {"metricType": "power_draw"}
    variants = [
        base,
        {**base, "activationThreshold": "100"},
        {**base, "targetValue": "300"},
        {**base, "cooldownSeconds": "10"},
    ]
    keys = {TriggerKey("ns", "so", parse_trigger(v)) for v in variants}
    assert len(keys) == len(variants)
