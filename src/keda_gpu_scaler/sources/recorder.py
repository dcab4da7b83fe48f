"""Record a replay trace from any NVML backend, in the format of :mod:`.trace`.

The recording runs the real :class:`NvmlSampler` (same conversions, same cadences) and
writes one frame per device reading; file writes go through ``call_in_thread`` like NVML
calls. Faults are counted, not written: the trace format has no place for them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from keda_gpu_scaler.domain.errors import SourceFailure, SourceUnavailable
from keda_gpu_scaler.domain.samples import GpuReading, Sample, SourceFault, unbatch
from keda_gpu_scaler.sources.nvml.backend import NvmlBackend
from keda_gpu_scaler.sources.nvml.sampler import (
    DEFAULT_PCIE_INTERVAL_S,
    CallInThread,
    NvmlSampler,
    run_in_worker_thread,
)
from keda_gpu_scaler.sources.trace import encode_frame, reading_to_frame


@dataclass(frozen=True, slots=True)
class RecordingSummary:
    path: Path
    frames: int
    faults: int
    devices: int
    """Distinct devices (GPUs and MIG instances) that gave at least one frame."""


async def record_trace(
    backend: NvmlBackend,
    output: Path,
    *,
    duration_s: float,
    interval_s: float = 1.0,
    pcie_interval_s: float | None = DEFAULT_PCIE_INTERVAL_S,
    phase: str | None = None,
    call_in_thread: CallInThread = run_in_worker_thread,
) -> RecordingSummary:
    """Sample every ``interval_s`` for ``duration_s`` seconds and write ``output`` (JSONL).

    Frames carry ``t`` relative to the first cycle; cycles taken at or after
    ``duration_s`` are not written. Raises :class:`SourceUnavailable` if ``output`` cannot
    be written, and what the sampler raises if NVML fails.
    """
    sampler = NvmlSampler(
        backend,
        interval_s=interval_s,
        pcie_interval_s=pcie_interval_s,
        process_interval_s=None,  # the trace format holds device readings only
        name="record",
        call_in_thread=call_in_thread,
    )
    file = await _open(output, call_in_thread)
    writer = _Writer(file, phase, call_in_thread)
    send, receive = anyio.create_memory_object_stream[Sample](256)
    try:
        # The sampler owns (and closes) ``send``; ``receive`` is closed here even if the
        # sampler fails to start.
        with receive:
            await _record(sampler, send, receive, writer, duration_s)
    finally:
        with anyio.CancelScope(shield=True):
            await call_in_thread(file.close)
    return RecordingSummary(output, writer.frames, writer.faults, len(writer.devices))


async def _record(
    sampler: NvmlSampler,
    send: MemoryObjectSendStream[Sample],
    receive: MemoryObjectReceiveStream[Sample],
    writer: _Writer,
    duration_s: float,
) -> None:
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(sampler.run, send)
            with anyio.move_on_after(duration_s):
                await writer.drain(receive, duration_s=duration_s)
            tg.cancel_scope.cancel()
    except* (SourceFailure, SourceUnavailable) as group:
        # The CLI should print why NVML failed, not "a group of 1 exception".
        raise group.exceptions[0]  # noqa: B904 - it keeps its own cause


async def _open(output: Path, call_in_thread: CallInThread) -> BinaryIO:
    try:
        return await call_in_thread(lambda: output.open("wb"))
    except OSError as exc:
        raise SourceUnavailable(f"cannot write trace {output}: {exc.strerror}") from exc


class _Writer:
    def __init__(self, file: BinaryIO, phase: str | None, call_in_thread: CallInThread) -> None:
        self.start: float | None = None
        """When the first cycle was taken: ``t`` = 0 in the trace."""
        self.frames = 0
        self.faults = 0
        self.devices: set[str] = set()
        self._file = file
        self._phase = phase
        self._call = call_in_thread

    async def drain(self, receive: MemoryObjectReceiveStream[Sample], *, duration_s: float) -> None:
        async for first in receive:
            batch = [first]
            while True:  # the rest of the cycle, so one cycle is one write
                try:
                    batch.append(receive.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            await self._write(batch, duration_s)

    async def _write(self, batch: list[Sample], duration_s: float) -> None:
        data = bytearray()
        for sample in _unbatch(batch):
            if not isinstance(sample, GpuReading):
                self.faults += 1
                continue
            if self.start is None:
                self.start = sample.taken_at
            t = sample.taken_at - self.start
            if t < duration_s:
                data += encode_frame(reading_to_frame(sample, t, phase=self._phase))
                self.frames += 1
                self.devices.add(sample.key)
        if data:
            await self._call(functools.partial(self._write_sync, bytes(data)))

    def _write_sync(self, data: bytes) -> None:
        self._file.write(data)
        self._file.flush()


def _unbatch(samples: list[Sample]) -> list[GpuReading | SourceFault]:
    return [s for s in unbatch(samples) if isinstance(s, GpuReading | SourceFault)]
