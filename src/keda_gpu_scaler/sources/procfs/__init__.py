"""The host's ``/proc``: the pod and container of a process (per-process GPU readings)."""

from keda_gpu_scaler.sources.procfs.cgroup import CgroupOwner, parse_cgroup
from keda_gpu_scaler.sources.procfs.host import (
    MPS_SERVER_COMMAND,
    HostProc,
    ProcessGone,
    ProcessOwner,
    ProcessOwners,
    ProcUnreadable,
)

__all__ = [
    "MPS_SERVER_COMMAND",
    "CgroupOwner",
    "HostProc",
    "ProcUnreadable",
    "ProcessGone",
    "ProcessOwner",
    "ProcessOwners",
    "parse_cgroup",
]
