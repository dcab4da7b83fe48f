"""The scaler in a process of its own, driven over stdin, for the soak and reaction benchmarks.

``python benchmarks/scaler_process.py --source replay|flip`` starts ``open_scaler`` on
127.0.0.1 (gRPC port 0, no HTTP ports) and prints the bound port. ``--source floor`` serves
instead a servicer that does no work (prebuilt answers; a stream sends one message, then one
every default polling interval, as a heartbeat) on the scaler's transport
(``serving/transport.py``): what the gRPC stack costs under a load before the scaler adds
anything. (grpclib's own server cannot be that floor: it offers h2's default of 100
concurrent streams per connection, so a thousand streams on one connection never open.)
Then it answers one line per command on stdin:

- ``cpu``: this process's CPU time in ns (all threads);
- ``rss``: its resident set size in bytes;
- ``waited``: how long the event loop's thread has waited, ready to run, for a core (ns,
  ``/proc/self/task/<id>/schedstat``; 0 where Linux does not tell);
- ``h2``: the closed-stream entries h2 keeps, summed over open connections;
- ``lag``: the longest the event loop was late for a 5 ms timer since the last ``lag``, and
  the longest garbage collection in that time, in seconds;
- ``census``: how many objects the garbage collector tracks, and the most common types;
- ``collections``: for each generation (young, middle, full), the garbage collections since
  the last ``collections`` and the longest of them in seconds, six numbers;
- ``flip VALUE`` (``--source flip``): publish a reading of ``VALUE`` % utilization at once
  and answer the ``time.monotonic()`` of the hand-over to the aggregator's channel.

With ``SOAK_GC_DETAIL=FILE`` it appends each middle-generation collection over 8 ms (objects
walked, collected) to FILE; with ``SOAK_STALLS=FILE``, a thread appends where the loop's
thread is whenever its 5 ms timer is 20 ms late.

It stops at end of input. Run it with ``PYTHONPATH=TREE/src`` to serve another checkout (a
baseline), which is how the benchmarks compare two versions in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

HOST = "127.0.0.1"
FLIP_PERIOD_S = 0.5
"""The flip source repeats its value this often, so it never goes stale."""


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _waited_ns() -> int:
    """The loop's (main) thread's time on a run queue, ready but not running, in ns."""
    try:
        with open(f"/proc/self/task/{threading.main_thread().native_id}/schedstat") as stat:
            return int(stat.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _census() -> str:
    """The most common types the garbage collector tracks (frozen objects left out)."""
    counts: dict[str, int] = {}
    for o in gc.get_objects():
        name = f"{type(o).__module__}.{type(o).__qualname__}"
        counts[name] = counts.get(name, 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:15]
    return f"{sum(counts.values())} " + " ".join(f"{k}={v}" for k, v in top)


_CONNECTIONS: list[Any] = []
"""Weak references to the server's h2 connections, found by one walk of the objects."""


def _closed_streams() -> int:
    """The closed-stream entries h2 keeps, summed over the server's connections. The walk of
    every object that finds the connections blocks the loop (about 50 ms with a thousand
    streams), so it runs once, and again only when none of those it found is left."""
    import weakref

    from h2.connection import H2Connection

    alive = [c for c in (ref() for ref in _CONNECTIONS) if c is not None]
    if not alive:
        alive = [o for o in gc.get_objects() if isinstance(o, H2Connection)]
        _CONNECTIONS[:] = [weakref.ref(c) for c in alive]
    return sum(len(c._closed_streams) for c in alive)


class FlipSource:
    """One GPU whose utilization changes on command; repeats it every ``FLIP_PERIOD_S``."""

    name = "flip"

    def __init__(self) -> None:
        self.value = 10.0
        self.wake: anyio.Event = anyio.Event()
        self.handed: anyio.Event = anyio.Event()
        """Set once a flipped value is in the aggregator's channel."""
        self.flipped_at: list[float] = []

    async def run(
        self,
        send: MemoryObjectSendStream[Any],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        from keda_gpu_scaler.domain.samples import Batch, DeviceKey, GpuReading

        async with send:
            task_status.started()
            while True:
                reading = GpuReading(
                    source=self.name,
                    key=DeviceKey("GPU-flip-0000"),
                    index=0,
                    uuid="GPU-flip-0000",
                    name="Flip GPU",
                    taken_at=anyio.current_time(),
                    period_s=FLIP_PERIOD_S,
                    gpu_utilization=self.value,
                )
                woken = self.wake.is_set()
                if woken:
                    self.wake = anyio.Event()
                    self.flipped_at.append(time.monotonic())
                await send.send(Batch(source=self.name, samples=(reading,)))
                if woken:
                    self.handed.set()
                    self.handed = anyio.Event()
                with anyio.move_on_after(FLIP_PERIOD_S):
                    await self.wake.wait()


class LagMonitor:
    def __init__(self) -> None:
        self.worst = 0.0
        self.worst_gc = 0.0
        self.ticked = time.monotonic()
        self.collections = [0, 0, 0]
        self.worst_by_generation = [0.0, 0.0, 0.0]
        self._gc_started = 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            if info["generation"] == 1 and os.environ.get("SOAK_GC_DETAIL"):
                self._young = len(gc.get_objects(0)) + len(gc.get_objects(1))
            self._gc_started = time.monotonic()
        else:
            took = time.monotonic() - self._gc_started
            self.worst_gc = max(self.worst_gc, took)
            generation = info["generation"]
            self.collections[generation] += 1
            self.worst_by_generation[generation] = max(self.worst_by_generation[generation], took)
            if generation == 1 and os.environ.get("SOAK_GC_DETAIL") and took > 0.008:
                with open(os.environ["SOAK_GC_DETAIL"], "a") as out:
                    print(
                        f"middle pass {took * 1000:.1f} ms over {self._young} objects, "
                        f"{info['collected']} collected, {info['uncollectable']} uncollectable",
                        file=out,
                    )

    async def run(self) -> None:
        while True:
            before = time.monotonic()
            self.ticked = before
            await asyncio.sleep(0.005)
            self.worst = max(self.worst, time.monotonic() - before - 0.005)

    def take(self) -> str:
        worst, self.worst = self.worst, 0.0
        worst_gc, self.worst_gc = self.worst_gc, 0.0
        return f"{worst} {worst_gc}"

    def take_collections(self) -> str:
        counts, self.collections = self.collections, [0, 0, 0]
        worst, self.worst_by_generation = self.worst_by_generation, [0.0, 0.0, 0.0]
        return " ".join(f"{n} {w}" for n, w in zip(counts, worst, strict=True))


def _control(loop: asyncio.AbstractEventLoop, flip: FlipSource | None, lag: LagMonitor) -> None:
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "cpu":
            answer: object = time.process_time_ns()
        elif words[0] == "rss":
            answer = _rss_bytes()
        elif words[0] == "waited":
            answer = _waited_ns()
        elif words[0] == "lag":
            answer = lag.take()
        elif words[0] == "collections":
            answer = lag.take_collections()
        elif words[0] == "census":
            answer = asyncio.run_coroutine_threadsafe(_on_loop(_census), loop).result()
        elif words[0] == "h2":
            answer = asyncio.run_coroutine_threadsafe(_on_loop(_closed_streams), loop).result()
        elif words[0] == "flip" and flip is not None:
            answer = asyncio.run_coroutine_threadsafe(_flip(flip, float(words[1])), loop).result()
        else:
            answer = "?"
        print(answer, flush=True)


def _watch_stalls(lag: LagMonitor, path: str) -> None:
    """A thread that, when the loop's 5 ms timer is 20 ms late, writes where the loop's
    thread is (a stack sample every 5 ms until it runs again) to ``path``."""
    import traceback

    main = threading.main_thread().ident

    def watch() -> None:
        while True:
            time.sleep(0.005)
            late = time.monotonic() - lag.ticked
            if late > 0.02 and main is not None:
                frame = sys._current_frames().get(main)
                if frame is not None:
                    stack = "".join(traceback.format_stack(frame, limit=12))
                    with open(path, "a") as out:
                        print(f"--- {late * 1000:.0f} ms late\n{stack}", file=out)

    threading.Thread(target=watch, daemon=True, name="stalls").start()


async def _on_loop(func: Any) -> Any:
    return func()


async def _flip(flip: FlipSource, value: float) -> float:
    handed = flip.handed
    flip.value = value
    flip.wake.set()
    await handed.wait()
    return flip.flipped_at[-1]


def _collector_as_serve_does() -> None:
    """What ``keda-gpu-scaler serve`` does to the garbage collector once it is up (a
    baseline may do less, or nothing)."""
    from keda_gpu_scaler.app.scaler import compose

    for name in ("tune_garbage_collector", "freeze_startup_objects"):
        tune = getattr(compose, name, None)
        if tune is not None:
            tune()
            return


def _bare_servicer() -> Any:
    """An External Scaler that answers at once from prebuilt messages."""
    from keda_gpu_scaler.domain.trigger import DEFAULT_POLL_INTERVAL_S
    from keda_gpu_scaler.serving._proto.externalscaler import (
        ExternalScalerBase,
        GetMetricSpecResponse,
        GetMetricsRequest,
        GetMetricsResponse,
        IsActiveResponse,
        MetricSpec,
        MetricValue,
        ScaledObjectRef,
    )

    active = IsActiveResponse(result=True)
    metrics = GetMetricsResponse(
        metric_values=[MetricValue(metric_name="m", metric_value=50, metric_value_float=50.0)]
    )
    spec = GetMetricSpecResponse(
        metric_specs=[MetricSpec(metric_name="m", target_size=80, target_size_float=80.0)]
    )

    class Bare(ExternalScalerBase):
        async def is_active(self, message: ScaledObjectRef) -> IsActiveResponse:
            return active

        async def stream_is_active(self, message: ScaledObjectRef) -> AsyncIterator[Any]:
            while True:
                yield active
                await asyncio.sleep(DEFAULT_POLL_INTERVAL_S)

        async def get_metric_spec(self, message: ScaledObjectRef) -> GetMetricSpecResponse:
            return spec

        async def get_metrics(self, message: GetMetricsRequest) -> GetMetricsResponse:
            return metrics

    return Bare()


@contextlib.asynccontextmanager
async def _floor() -> AsyncIterator[int]:
    """The bare servicer on the scaler's transport; yields its port."""
    from keda_gpu_scaler.serving.server import DEFAULT_MAX_CONCURRENT_STREAMS
    from keda_gpu_scaler.serving.transport import GrpcServer

    server = GrpcServer([_bare_servicer()], max_concurrent_streams=DEFAULT_MAX_CONCURRENT_STREAMS)
    await server.start(HOST, 0)
    try:
        listener = server._server
        assert isinstance(listener, asyncio.Server)
        yield int(listener.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def _serving(source_name: str, flip: FlipSource | None) -> AsyncIterator[int]:
    """The scaler on ``source_name`` (or ``flip``), or a floor server; yields its port."""
    from keda_gpu_scaler.app.scaler.compose import build_source, open_scaler

    if source_name == "floor":
        async with _floor() as port:
            yield port
        return
    source: Any = flip if flip is not None else build_source(source_name)
    async with open_scaler(source, host=HOST, port=0) as running:
        await running.hub.wait_newer(0)
        yield running.port


async def _main(source_name: str) -> None:
    flip = FlipSource() if source_name == "flip" else None
    async with _serving(source_name, flip) as port:
        _collector_as_serve_does()
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        lag = LagMonitor()
        monitor = asyncio.create_task(lag.run())
        if os.environ.get("SOAK_STALLS"):
            _watch_stalls(lag, os.environ["SOAK_STALLS"])

        def control() -> None:
            try:
                _control(loop, flip, lag)
            finally:
                loop.call_soon_threadsafe(done.set)

        print(port, flush=True)
        threading.Thread(target=control, daemon=True, name="control").start()
        await done.wait()
        monitor.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--source",
        default="replay",
        help="replay, replay:PATH, flip, or floor",
    )
    args = parser.parse_args()
    from keda_gpu_scaler.app.logs import configure_logging

    configure_logging("warning")
    anyio.run(_main, args.source, backend="asyncio")


if __name__ == "__main__":
    main()
