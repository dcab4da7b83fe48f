"""The fake NVML's processes: who runs on a GPU, and the driver's per-process samples.

What it reproduces of NVML (``nvml.h``, nvidia-ml-py 13.615):

- ``nvmlDeviceGetComputeRunningProcesses`` lists the processes with a context on the
  device, each with its used memory (None: "not available"); on a MIG device handle, the
  processes of that instance, with their GPU and compute instance ids. Drivers before the
  ``_v3`` call offer ``_v2`` only (``FunctionNotFound``).
- The driver samples each process's utilization (SM, memory, encoder, decoder) into a
  buffer of CPU-timestamped samples (microseconds of the wall clock). A query with
  ``lastSeenTimeStamp`` returns, for each process with a non-zero sample newer than it, one
  entry: its utilization over those samples and the newest sample's timestamp; NotFound
  when there is none. A process idle since then is not listed at all.
- A process that exits leaves its samples in the buffer: the next query still reports it,
  although it is no longer among the running processes. A PID the kernel gives to a new
  process is sampled under the same number.
- MIG: per-process utilization is NotSupported (on a MIG-enabled GPU and on its instances).
- MPS: the compute call lists the MPS server; the MPS call lists the clients (an older
  driver refuses it). By default the driver samples the clients' work under the server's
  PID, as the MPS server runs their kernels; ``mps_samples_clients`` samples each client.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from keda_gpu_scaler.sources.nvml.backend import ProcessInfo, ProcessSample

EPOCH_US = 1_767_225_600_000_000
"""2026-01-01 in microseconds: the fake's timestamps read like the driver's CPU clock."""


@dataclass
class FakeProcess:
    """A process on a GPU and its steady load, which the driver samples at each query."""

    pid: int
    used_memory: int | None = 1 << 30
    sm: int = 0
    memory: int = 0
    encoder: int = 0
    decoder: int = 0


@dataclass
class FakeMps:
    """An MPS server on a GPU; the GPU's ``processes`` are then its clients."""

    server: FakeProcess
    mps_call_supported: bool = True
    """False: ``nvmlDeviceGetMPSComputeRunningProcesses`` refused (NotSupported), so NVML
    shows the server alone."""
    mps_samples_clients: bool = False
    """False: the clients' work is sampled as the server's (one PID for all of them)."""


@dataclass
class ProcessDriver:
    """One device's sample buffer: one sample per busy process and driver sample period."""

    samples: list[ProcessSample] = field(default_factory=list)

    def take(self, running: Iterable[FakeProcess], now_us: int) -> None:
        """The driver's sample of ``running`` now (idle processes leave no sample); the
        driver samples on its own clock, so two queries at one instant share one sample."""
        sampled: set[int] = set()
        for earlier in reversed(self.samples):  # in time order: those of now come last
            if earlier.timestamp_us != now_us:
                break
            sampled.add(earlier.pid)
        for p in running:
            if p.pid in sampled:
                continue
            if p.sm or p.memory or p.encoder or p.decoder:
                self.samples.append(
                    ProcessSample(p.pid, now_us, p.sm, p.memory, p.encoder, p.decoder)
                )

    def since(self, last_seen_us: int) -> list[ProcessSample]:
        """One entry per PID with a non-zero sample newer than ``last_seen_us``: the mean
        of its samples there, at the newest one's timestamp."""
        by_pid: dict[int, list[ProcessSample]] = {}
        for s in self.samples:
            if s.timestamp_us > last_seen_us:
                by_pid.setdefault(s.pid, []).append(s)
        return [_mean(pid, got) for pid, got in sorted(by_pid.items())]


def _mean(pid: int, samples: list[ProcessSample]) -> ProcessSample:
    n = len(samples)
    return ProcessSample(
        pid=pid,
        timestamp_us=max(s.timestamp_us for s in samples),
        sm=sum(s.sm for s in samples) // n,
        memory=sum(s.memory for s in samples) // n,
        encoder=sum(s.encoder for s in samples) // n,
        decoder=sum(s.decoder for s in samples) // n,
    )


def infos(
    processes: Iterable[FakeProcess], instance: tuple[int, int] | None = None
) -> list[ProcessInfo]:
    gi, ci = (None, None) if instance is None else instance
    return [ProcessInfo(p.pid, p.used_memory, gi, ci) for p in processes]


def mps_server_load(mps: FakeMps, clients: Iterable[FakeProcess]) -> FakeProcess:
    """The server as the driver samples it: its clients' work summed (at most 100 %)."""
    clients = list(clients)
    return FakeProcess(
        mps.server.pid,
        mps.server.used_memory,
        sm=min(100, sum(c.sm for c in clients)),
        memory=min(100, sum(c.memory for c in clients)),
        encoder=min(100, sum(c.encoder for c in clients)),
        decoder=min(100, sum(c.decoder for c in clients)),
    )
