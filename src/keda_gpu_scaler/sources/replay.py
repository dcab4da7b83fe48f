"""ReplaySampler: plays a recorded trace in (virtual or real) time, looped by default.

The frames of one recorded instant (one ``t``: every GPU of one cycle of the recording) are
published together as one :class:`Batch`, as the NVML sampler publishes a cycle, so a reader
never sees a node with part of its GPUs.
"""

from __future__ import annotations

import itertools
from importlib import resources
from pathlib import Path

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.domain.samples import Batch, Sample
from keda_gpu_scaler.sources.trace import (
    Identity,
    TraceFrame,
    decode_trace,
    frame_to_reading,
    parse_trace,
    trace_period,
)

BUNDLED_TRACE = "h200-trace.jsonl"
BUNDLED_IDENTITY = Identity("GPU-4f60bdab-7290-5bab-ee63-d697ab1e6349", "NVIDIA H200")


class ReplaySampler:
    """Publishes each recorded cycle at its offset; the time base is anyio's clock."""

    def __init__(
        self,
        frames: list[TraceFrame],
        *,
        name: str = "replay",
        loop: bool = True,
        identity: Identity | None = None,
        start_at_s: float = 0.0,
    ) -> None:
        """``start_at_s``: seconds into the recording where the first pass begins (the
        cycles before it are played from the second pass on, when looping)."""
        self.name = name
        ordered = sorted(frames, key=lambda f: (f.t, f.index))
        self._cycles = [tuple(group) for _, group in itertools.groupby(ordered, lambda f: f.t)]
        self._loop = loop
        self._identity = identity
        self.period_s = trace_period(ordered)
        self._duration = ordered[-1].t - ordered[0].t + self.period_s
        if not 0.0 <= start_at_s < self._duration:
            raise ValueError(
                f"start_at_s must be from 0 to under the recording's {self._duration:g} s, "
                f"not {start_at_s!r}"
            )
        self._start_at_s = start_at_s
        self._phase: str | None = None

    @classmethod
    def from_path(cls, path: Path, *, loop: bool = True, start_at_s: float = 0.0) -> ReplaySampler:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise SourceUnavailable(f"cannot read replay trace {path}: {exc.strerror}") from exc
        text = decode_trace(data, origin=str(path))
        frames = parse_trace(text.splitlines(), origin=str(path))
        return cls(frames, name="replay", loop=loop, start_at_s=start_at_s)

    @classmethod
    def bundled(cls, *, loop: bool = True, start_at_s: float = 0.0) -> ReplaySampler:
        """The real H200 recording shipped with the package."""
        text = resources.files("keda_gpu_scaler.sources").joinpath("data", BUNDLED_TRACE)
        frames = parse_trace(text.read_text(encoding="utf-8").splitlines(), origin=BUNDLED_TRACE)
        return cls(
            frames, name="replay", loop=loop, identity=BUNDLED_IDENTITY, start_at_s=start_at_s
        )

    @property
    def phase(self) -> str | None:
        """The recorded phase of the cycle sent last (the demo shows it); None before one."""
        return self._phase

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            task_status.started()
            first = self._cycles[0][0].t
            start = anyio.current_time() - first - self._start_at_s
            skip = first + self._start_at_s
            while True:
                for cycle in self._cycles:
                    if cycle[0].t < skip:
                        continue
                    await anyio.sleep_until(start + cycle[0].t)
                    await self._publish(send, cycle)
                if not self._loop:
                    return
                start += self._duration
                skip = first

    async def _publish(
        self, send: MemoryObjectSendStream[Sample], cycle: tuple[TraceFrame, ...]
    ) -> None:
        now = anyio.current_time()
        readings = tuple(
            frame_to_reading(
                f, source=self.name, taken_at=now, period_s=self.period_s, identity=self._identity
            )
            for f in cycle
        )
        await send.send(Batch(source=self.name, samples=readings))
        self._phase = cycle[-1].phase
