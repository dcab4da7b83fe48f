"""The host's ``/proc``: which pod and container a GPU process runs in.

NVML names the processes on a GPU by their PIDs in the host's PID namespace, so the node
agent must run in it (the pod's ``hostPID``; see docs/operations.md): its ``/proc`` is then
the host's, and ``<root>/<pid>/cgroup`` says where each process runs (:mod:`.cgroup`).
Synchronous, blocking file reads: the NVML sampler calls them from its worker thread.

Errors say what to do about them:

    ProcessGone      the process exited between NVML's answer and the read (or NVML names
                     a PID this /proc does not have: the caller tells the two apart)
    ProcUnreadable   /proc cannot be read here (no such directory, permissions): no process
                     on this node can be attributed
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from keda_gpu_scaler.sources.procfs.cgroup import parse_cgroup

__all__ = ["HostProc", "ProcUnreadable", "ProcessGone", "ProcessOwner", "ProcessOwners"]

MPS_SERVER_COMMAND = "nvidia-cuda-mps-server"
"""The ``comm`` of an MPS server: the process NVML may attribute its clients' work to."""
_GONE = frozenset({errno.ENOENT, errno.ESRCH})


class ProcessGone(Exception):
    """No such process in this ``/proc`` (any more)."""


class ProcUnreadable(Exception):
    """This ``/proc`` cannot be read; the message says which file and why."""


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    """Where one process runs: its pod and container (empty outside any pod), and its name."""

    pod_uid: str = ""
    container_id: str = ""
    command: str = ""
    """``/proc/<pid>/comm``: the executable's name, at most 15 characters."""

    def is_mps_server(self) -> bool:
        return self.command == MPS_SERVER_COMMAND


class ProcessOwners(Protocol):
    """The seam the NVML sampler maps PIDs through (:class:`HostProc`, a fake tree in tests)."""

    def owner(self, pid: int) -> ProcessOwner:
        """Raises :class:`ProcessGone` or :class:`ProcUnreadable`."""
        ...


class HostProc:
    """:class:`ProcessOwners` over a ``/proc`` directory (``--host-proc``)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"HostProc({str(self.root)!r})"

    def owner(self, pid: int) -> ProcessOwner:
        if not self.root.is_dir():
            raise ProcUnreadable(f"{self.root} is not a directory (is the host's /proc there?)")
        cgroup = self._read(pid, "cgroup")
        command = self._read(pid, "comm").strip()
        found = parse_cgroup(cgroup)
        if found is None:
            return ProcessOwner(command=command)
        return ProcessOwner(found.pod_uid, found.container_id, command)

    def _read(self, pid: int, name: str) -> str:
        path = self.root / str(pid) / name
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            if exc.errno in _GONE:
                raise ProcessGone(pid) from exc
            raise ProcUnreadable(f"cannot read {path}: {exc.strerror or exc}") from exc
