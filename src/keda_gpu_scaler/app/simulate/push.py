"""StreamIsActive of ``external-push`` triggers in the simulation, paced as the server paces it.

The server's :class:`~keda_gpu_scaler.serving.streams.StreamRegistry` judges a stream when it
opens, when the raw activity of its spec changes on a new reading (value above the activation
threshold, or no usable reading), when its heartbeat is due and when a cooldown hold that keeps
it active ends; whether it sends is the real :class:`StreamPacer`'s ``step``. KEDA acts only on
``true`` (``pkg/scaling/scale_handler.go`` ``startPushScalers``: ``RequestScale`` active,
without error); ``false`` is ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from keda_gpu_scaler.app.simulate.scaledobject import Trigger
from keda_gpu_scaler.serving.streams import StreamPacer, heartbeat_spread

_UNJUDGED = object()
_AFTER_S = 1e-3
"""A wake is never at the instant just judged (a hold ending now): the next is this later."""


@dataclass(frozen=True, slots=True)
class Judgement:
    """What the scaler served a stream: its activity (None: no usable reading), and when the
    cooldown hold that keeps it active ends."""

    active: bool | None
    hold_ends_at: float = math.inf


@dataclass
class PushStream:
    """One trigger's StreamIsActive: its pacer and the raw activity last seen."""

    trigger: Trigger
    pacer: StreamPacer
    raw: object = _UNJUDGED
    wake_at: float = math.inf

    @classmethod
    def open(cls, trigger: Trigger, n: int) -> PushStream:
        """The ``n``-th stream the scaler opened (its heartbeat spread, as the server's)."""
        interval = trigger.spec.poll_interval_s
        return cls(trigger, StreamPacer(interval, heartbeat_spread(interval, n)))

    def needs_judging(self, raw: bool | None, now: float) -> bool:
        """On a new reading: judged when the raw activity changed, or a wake is due."""
        changed = raw is not self.raw  # True, False and None are singletons
        self.raw = raw
        return changed or self.wake_at <= now

    def send(self, judged: Judgement, now: float) -> bool:
        """Whether the stream sends ``true`` now (KEDA acts on nothing else)."""
        step = self.pacer.step(judged.active, now, hold_ends_at=judged.hold_ends_at)
        self.wake_at = max(step.wake_at, now + _AFTER_S)
        return step.send and judged.active is True
