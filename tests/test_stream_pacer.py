"""The StreamIsActive pacer, a pure rule: given the last sent state, the time and the new
activity, send now or not, and when to look again."""

from __future__ import annotations

import math

from keda_gpu_scaler.serving.streams import Step, StreamPacer


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
