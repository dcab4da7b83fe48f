"""A link's side of one WatchNode call: messages handed over as they arrive, and silence.

:class:`Pump` decodes each message, reads it by the stream's rules and hands its samples to
the aggregator's channel inside the call's ``data_received``; :class:`Watchdog` notices an
agent that stops sending. Both run on asyncio only, as the call does.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from typing import Protocol

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.samples import Sample
from keda_gpu_scaler.sources.agents.codec import CodecError, decode_update
from keda_gpu_scaler.sources.agents.h2call import WatchCall
from keda_gpu_scaler.sources.agents.updates import BadUpdate, StreamReader

__all__ = ["Pump", "Timer", "Timers", "Watchdog"]


class Pump:
    """A link's side of one call: each message decoded, read by the stream's rules and handed
    to the aggregator inside the call's ``data_received``, without a task step per message.

    While the aggregator's channel is full the call is paused (nothing more is read off the
    stream, so flow control holds the agent back) and :meth:`run`, the link's task, sends
    what is pending with ``await``, then resumes the call.
    """

    def __init__(
        self,
        send: MemoryObjectSendStream[Sample],
        reader: StreamReader,
        *,
        clock: Callable[[], float],
        gate: Callable[[Sample], bool],
        on_identity: Callable[[StreamReader], None],
    ) -> None:
        """``gate`` is asked, for each sample, whether to hand it over; ``on_identity`` is
        told once the stream's identity came."""
        self.reader = reader
        self.pending: deque[Sample] = deque()
        self.watchdog: Watchdog | None = None
        self._send = send
        self._gate = gate
        self._on_identity = on_identity
        self._clock = clock
        self._wake = asyncio.Event()
        self._call: WatchCall | None = None

    def attach(self, call: WatchCall) -> None:
        """The call whose messages this pump hands over (made with :meth:`on_message`)."""
        call.finished.add_done_callback(lambda _: self._wake.set())
        self._call = call

    def on_message(self, data: bytes) -> None:
        try:
            update = decode_update(data)
        except CodecError as exc:
            raise BadUpdate(f"a message that does not decode ({exc})") from exc
        now = self._clock()
        first = self.reader.node is None
        samples = self.reader.receive(update, now)  # the identity first, or refused
        if first:
            self._on_identity(self.reader)
            self._wake.set()
        pending = self.pending
        for sample in samples:
            if self._gate(sample):
                if pending:
                    pending.append(sample)
                    continue
                try:
                    self._send.send_nowait(sample)
                except anyio.WouldBlock:
                    pending.append(sample)
        if pending:
            assert self._call is not None
            self._call.pause()
            self._wake.set()
            now = math.inf  # a link blocked handing over is not waiting for the agent
        if self.watchdog is not None:
            self.watchdog.waiting_since = now

    async def opened(self) -> bool:
        """Until the identity came (True) or the call ended before it (False)."""
        assert self._call is not None
        while self.reader.node is None and not self._call.finished.done():
            self._wake.clear()
            await self._wake.wait()
        return self.reader.node is not None

    def watch(self, watchdog: Watchdog) -> None:
        """Tell ``watchdog`` when the link starts waiting for the agent (not while blocked)."""
        self.watchdog = watchdog
        watchdog.waiting_since = math.inf if self.pending else self._clock()

    async def run(self) -> None:
        """Hands over what the full channel left pending, until the call is over."""
        call = self._call
        assert call is not None
        while True:
            if self.pending:
                while self.pending:
                    await self._send.send(self.pending.popleft())
                if self.watchdog is not None:
                    self.watchdog.waiting_since = self._clock()
                call.resume()  # hands over what is buffered; may leave more pending
                continue
            if call.finished.done():
                return
            self._wake.clear()
            await self._wake.wait()


class Timer(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    """What :class:`Watchdog` needs of an event loop: its clock and a timer."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer: ...


class Watchdog:
    """Cancels ``scope`` once a wait for the next message has lasted ``idle_s``.

    One loop timer per ``idle_s`` (seconds) instead of a cancel scope and a timer per message,
    which a thousand links a second would pay for. Only a wait counts: ``waiting_since`` is
    set before each receive and cleared after it, so a hand-over that blocks is not silence.
    The call runs on asyncio only, so the timers are the running asyncio loop's unless
    ``timers`` says otherwise.
    """

    __slots__ = ("_handle", "_idle_s", "_loop", "_scope", "waiting_since")

    def __init__(
        self, scope: anyio.CancelScope, idle_s: float, *, timers: Timers | None = None
    ) -> None:
        self._scope = scope
        self._idle_s = idle_s
        self._loop: Timers = timers if timers is not None else asyncio.get_running_loop()
        self.waiting_since = math.inf
        self._handle: Timer | None = self._loop.call_at(self._loop.time() + idle_s, self._check)

    def _check(self) -> None:
        silent_until = self.waiting_since + self._idle_s
        if self._loop.time() >= silent_until:
            self._handle = None
            self._scope.cancel()
            return
        due = min(silent_until, self._loop.time() + self._idle_s)
        self._handle = self._loop.call_at(due, self._check)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
