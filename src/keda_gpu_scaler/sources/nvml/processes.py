"""Per-process readings of one device (worker-thread code): the processes NVML lists on it,
their utilization, and the pod each runs in (the host's ``/proc``).

NVML's calls, each in the newest version the driver offers (learned once per device):
``nvmlDeviceGetComputeRunningProcesses`` (``_v3``, else ``_v2``) for the processes and their
memory, ``nvmlDeviceGetMPSComputeRunningProcesses`` for MPS clients, and
``nvmlDeviceGetProcessesUtilizationInfo`` (else ``nvmlDeviceGetProcessUtilization``) for
their utilization, with the ``lastSeenTimeStamp`` protocol: each query asks for the samples
newer than the newest one it has seen, so each read covers the time since the last one.
NVML lists a process there only if it was busy: a running process it does not list was
idle (0), a process it lists that is no longer running has exited (not counted).

What cannot be known is said, never read as 0 (:class:`~keda_gpu_scaler.domain.samples.
DeviceProcesses`): a call NVML does not support on the device (MIG, older GPUs), an MPS
server NVML attributes its clients' work to, a ``/proc`` that does not show the PIDs NVML
names (the agent is not in the host's PID namespace), a PID another container took since
the last read (its samples cannot be split between the two).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from keda_gpu_scaler.domain.samples import DeviceKey, DeviceProcesses, ProcessUse
from keda_gpu_scaler.sources.nvml.backend import Handle, NvmlBackend, ProcessInfo, ProcessSample
from keda_gpu_scaler.sources.nvml.errors import NvmlAbsent, NvmlCode
from keda_gpu_scaler.sources.procfs import (
    ProcessGone,
    ProcessOwner,
    ProcessOwners,
    ProcUnreadable,
)

OFF = "per-process readings are off on this node (--host-proc is not set)"
_OLDER_CALL = frozenset({NvmlCode.FUNCTION_NOT_FOUND, NvmlCode.ARGUMENT_VERSION_MISMATCH})
"""A call the driver does not have (or whose struct version it does not know): try the
older one."""


@dataclass
class ProcessState:
    """What the sampler keeps of one device's per-process readings between reads."""

    compute_version: int | None = None
    """3 or 2 once known: the newest ``nvmlDeviceGetComputeRunningProcesses``."""
    mps_version: int | None = None
    utilization_call: str | None = None
    """``info`` or ``legacy`` once known."""
    last_seen_us: int = 0
    """The newest sample timestamp seen: the next query's ``lastSeenTimeStamp``."""
    owners: dict[int, tuple[str, str]] = field(default_factory=dict)
    """PID -> (pod UID, container ID) at the last read, to see a PID change hands."""
    mps_server_view: bool = False
    """NVML was seen sampling MPS clients' work as the server's on this device."""


@dataclass(frozen=True, slots=True)
class ProcessTarget:
    """One device to read the processes of: its key and index as readings have them."""

    key: str
    index: int
    handle: Handle
    state: ProcessState


def read_processes(
    backend: NvmlBackend,
    owners: ProcessOwners | None,
    target: ProcessTarget,
    *,
    source: str,
    taken_at: float,
    period_s: float,
) -> DeviceProcesses:
    """The device's processes now. Raises what a lost device or a broken NVML raises."""

    def result(
        processes: tuple[ProcessUse, ...] = (),
        memory: str | None = None,
        utilization: str | None = None,
    ) -> DeviceProcesses:
        return DeviceProcesses(
            source=source,
            key=DeviceKey(target.key),
            index=target.index,
            taken_at=taken_at,
            period_s=period_s,
            processes=processes,
            memory_unsupported=memory,
            utilization_unsupported=utilization,
        )

    if owners is None:
        return result(memory=OFF, utilization=OFF)
    read = _Read(backend, target.handle, target.state)
    try:
        listed = read.listed()
    except NvmlAbsent as exc:
        refused = f"NVML lists no processes on this device ({exc})"
        return result(memory=refused, utilization=refused)
    samples, utilization = read.utilization()
    found, why = _owners(owners, listed, read.relisted)
    if why is not None:
        return result(memory=why, utilization=why)
    memory, utilization = read.mps(found, samples, utilization)
    return result(
        _uses(found, listed, samples, target.state, memory, utilization), memory, utilization
    )


class _Read:
    """One read's calls on one device, in the versions the device is known to answer."""

    def __init__(self, backend: NvmlBackend, handle: Handle, state: ProcessState) -> None:
        self._backend = backend
        self._handle = handle
        self._state = state
        self.clients: list[ProcessInfo] | None = None
        """The MPS clients NVML lists; None where the MPS call is refused."""

    def listed(self) -> dict[int, ProcessInfo]:
        """Every process with a context on the device, MPS clients included, by PID."""
        b = self._backend
        found = self._newest(b.compute_processes_v3, b.compute_processes_v2, "compute_version")
        try:
            self.clients = self._newest(
                b.mps_compute_processes_v3, b.mps_compute_processes_v2, "mps_version"
            )
        except NvmlAbsent:
            self.clients = None
        by_pid = {p.pid: p for p in found}
        for client in self.clients or ():
            known = by_pid.get(client.pid)
            if known is None or known.used_memory is None:
                by_pid[client.pid] = client
        return by_pid

    def relisted(self) -> set[int]:
        """The PIDs NVML lists now (after ``/proc`` missed some)."""
        try:
            return set(self.listed())
        except NvmlAbsent:
            return set()

    def _newest(
        self,
        v3: Callable[[Handle], list[ProcessInfo]],
        v2: Callable[[Handle], list[ProcessInfo]],
        version: str,
    ) -> list[ProcessInfo]:
        if getattr(self._state, version) in (None, 3):
            try:
                found = v3(self._handle)
            except NvmlAbsent as exc:
                if exc.code not in _OLDER_CALL:
                    raise
            else:
                setattr(self._state, version, 3)
                return found
            setattr(self._state, version, 2)
        return v2(self._handle)

    def utilization(self) -> tuple[list[ProcessSample], str | None]:
        """The samples since the last read, or why the device gives none."""
        state, b = self._state, self._backend
        calls = {"info": b.processes_utilization_info, "legacy": b.process_utilization}
        for name in ("info", "legacy"):
            if state.utilization_call not in (None, name):
                continue
            try:
                got = _sized(calls[name], self._handle, state.last_seen_us)
            except NvmlAbsent as exc:
                if exc.code == NvmlCode.NOT_FOUND:  # nothing busy since the last read
                    state.utilization_call = name
                    return [], None
                if name == "info" and exc.code in _OLDER_CALL:
                    continue
                return [], f"NVML gives no per-process utilization on this device ({exc})"
            state.utilization_call = name
            if got:
                state.last_seen_us = max(state.last_seen_us, *(s.timestamp_us for s in got))
            return got, None
        return [], "NVML gives no per-process utilization on this device"

    def mps(
        self,
        found: dict[int, ProcessOwner],
        samples: Sequence[ProcessSample],
        utilization: str | None,
    ) -> tuple[str | None, str | None]:
        """Whether an MPS server hides its clients: (memory, utilization) reasons."""
        servers = sorted(pid for pid, owner in found.items() if owner.is_mps_server())
        if not servers:
            self._state.mps_server_view = False
            return None, utilization
        if self.clients is None:
            why = f"NVML shows the MPS server (PID {servers[0]}) on this device, not its clients"
            return why, utilization or why
        if any(s.pid in servers for s in samples):
            self._state.mps_server_view = True
        if self._state.mps_server_view and utilization is None:
            utilization = (
                f"NVML samples the MPS clients' work as the MPS server's (PID {servers[0]}) "
                "on this device: no utilization per client"
            )
        return None, utilization


def _sized(
    call: Callable[[Handle, int], list[ProcessSample]], handle: Handle, last_seen_us: int
) -> list[ProcessSample]:
    """``call``, again once if a process started between its sizing call and its read
    (InsufficientSize: the buffer it sized is one sample short)."""
    try:
        return call(handle, last_seen_us)
    except NvmlAbsent as exc:
        if exc.code != NvmlCode.INSUFFICIENT_SIZE:
            raise
    return call(handle, last_seen_us)


def _owners(
    owners: ProcessOwners, listed: dict[int, ProcessInfo], relisted: Callable[[], set[int]]
) -> tuple[dict[int, ProcessOwner], str | None]:
    """Each listed PID's owner; a PID ``/proc`` no longer has exited in between, unless NVML
    still lists it: then this ``/proc`` is not the host's."""
    found: dict[int, ProcessOwner] = {}
    gone: list[int] = []
    for pid in sorted(listed):
        try:
            found[pid] = owners.owner(pid)
        except ProcessGone:
            gone.append(pid)
        except ProcUnreadable as exc:
            return {}, f"the processes on this device cannot be mapped to pods: {exc}"
    if gone:
        still = sorted(set(gone) & relisted())
        if still:
            return {}, (
                f"NVML lists PID {still[0]}, which {owners} does not have: the node agent "
                "must run in the host's PID namespace (hostPID) with the host's /proc"
            )
    return found, None


def _uses(
    found: dict[int, ProcessOwner],
    listed: dict[int, ProcessInfo],
    samples: Sequence[ProcessSample],
    state: ProcessState,
    memory: str | None,
    utilization: str | None,
) -> tuple[ProcessUse, ...]:
    newest: dict[int, ProcessSample] = {}
    for s in samples:  # one per PID; the newest should the driver send two
        if s.pid not in newest or s.timestamp_us > newest[s.pid].timestamp_us:
            newest[s.pid] = s
    previous, state.owners = state.owners, {}
    uses = []
    for pid, owner in found.items():
        where = (owner.pod_uid, owner.container_id)
        state.owners[pid] = where
        reused = pid in previous and previous[pid] != where
        known = utilization is None and not reused
        sample = newest.get(pid)
        used = listed[pid].used_memory
        uses.append(
            ProcessUse(
                pid=pid,
                pod_uid=owner.pod_uid,
                container_id=owner.container_id,
                used_memory_bytes=None if memory is not None else used,
                sm=_share(known, sample, "sm"),
                memory=_share(known, sample, "memory"),
                encoder=_share(known, sample, "encoder"),
                decoder=_share(known, sample, "decoder"),
                mps_server=owner.is_mps_server(),
                pid_reused=reused,
            )
        )
    return tuple(uses)


def _share(known: bool, sample: ProcessSample | None, name: str) -> float | None:
    if not known:
        return None
    return 0.0 if sample is None else float(getattr(sample, name))
