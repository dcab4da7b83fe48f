"""The StreamIsActive pacer, a pure rule: given the last sent state, the time and the new
activity, send now or not, and when to look again."""

from __future__ import annotations

import math

import pytest

from keda_gpu_scaler.serving.streams import Step, StreamPacer, heartbeat_spread


def test_the_first_activity_is_sent_at_once() -> None:
    pacer = StreamPacer(interval_s=10)
    assert pacer.step(True, 100.0) == Step(send=True, wake_at=110.0)


def test_the_same_activity_waits_for_its_heartbeat() -> None:
    pacer = StreamPacer(interval_s=10)
    pacer.step(True, 100.0)
    assert pacer.step(True, 104.0) == Step(send=False, wake_at=110.0)
    assert pacer.step(True, 110.0) == Step(send=True, wake_at=120.0)


def test_a_change_is_sent_at_once_and_restarts_the_heartbeat() -> None:
    pacer = StreamPacer(interval_s=10)
    pacer.step(True, 100.0)
    assert pacer.step(False, 103.5) == Step(send=True, wake_at=113.5)
    assert pacer.step(False, 110.0) == Step(send=False, wake_at=113.5)


def test_a_failure_is_never_sent_and_retried_an_interval_later() -> None:
    pacer = StreamPacer(interval_s=5)
    pacer.step(True, 0.0)
    assert pacer.step(None, 3.0) == Step(send=False, wake_at=8.0)
    # Back after the failure with the same activity, the heartbeat being due: sent.
    assert pacer.step(True, 8.0) == Step(send=True, wake_at=13.0)


def test_a_cooldown_hold_ending_before_the_heartbeat_wakes_the_stream_sooner() -> None:
    pacer = StreamPacer(interval_s=10)
    assert pacer.step(True, 0.0, hold_ends_at=4.0) == Step(send=True, wake_at=4.0)
    assert pacer.step(True, 4.0, hold_ends_at=math.inf) == Step(send=False, wake_at=10.0)


def test_an_early_heartbeat_comes_early_after_every_send_and_retry() -> None:
    pacer = StreamPacer(interval_s=10, early_s=1.5)
    assert pacer.step(True, 100.0) == Step(send=True, wake_at=108.5)
    assert pacer.step(True, 108.5) == Step(send=True, wake_at=117.0)
    assert pacer.step(False, 110.0) == Step(send=True, wake_at=118.5)  # a change restarts it
    assert pacer.step(None, 111.0) == Step(send=False, wake_at=119.5)


@pytest.mark.parametrize("early_s", [-0.1, 10.0, 11.0])
def test_a_heartbeat_cannot_come_before_the_last_message_or_late(early_s: float) -> None:
    with pytest.raises(ValueError, match="early_s must be at least 0 and under interval_s"):
        StreamPacer(interval_s=10, early_s=early_s)


def test_heartbeats_of_many_streams_are_spread_evenly_over_a_fifth_of_the_interval() -> None:
    spreads = [heartbeat_spread(10.0, n) for n in range(1000)]
    assert spreads[0] == 0.0
    assert all(0.0 <= s < 2.0 for s in spreads)
    # Every tenth of a second of the 2 s holds its share, give or take a few.
    buckets = [0] * 20
    for spread in spreads:
        buckets[int(spread * 10)] += 1
    assert min(buckets) >= 45 and max(buckets) <= 55
    # A short interval: a fifth of it; a long one: 2 s at most.
    assert max(heartbeat_spread(1.0, n) for n in range(100)) < 0.2
    assert max(heartbeat_spread(300.0, n) for n in range(100)) < 2.0


@pytest.mark.parametrize("sent_at", [0.1, 23.943, 1014.93, 1234.567])
def test_a_heartbeat_is_due_at_the_time_it_asked_to_be_woken_at(sent_at: float) -> None:
    # (sent_at + 10) - sent_at can round below 10: the stream then never beat again, its
    # wake-up time unchanged and its timer spent.
    for early_s in (0.0, 0.494, 1.5):
        pacer = StreamPacer(interval_s=10, early_s=early_s)
        wake_at = pacer.step(True, sent_at).wake_at
        assert pacer.step(True, wake_at).send
        # A loop may fire the timer a hair early; that is due too.
        assert pacer.step(True, pacer.sent_at + 10 - early_s - 1e-6).send
