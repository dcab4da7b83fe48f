"""A fake host ``/proc`` tree on disk: ``<root>/<pid>/cgroup`` and ``comm``, as the node
agent reads them with ``hostPID``, for the NVML sampler's per-process readings.

    proc = FakeProc(tmp_path / "proc")
    proc.add(4242, pod_cgroup("c0ffee00-...", "a" * 64))   # a container of a pod
    proc.add(77, "0::/system.slice/sshd.service\\n", comm="sshd")   # outside any pod
    proc.remove(4242)                                       # the process exited
"""

from __future__ import annotations

import shutil
from pathlib import Path

from keda_gpu_scaler.sources.procfs import HostProc


def pod_cgroup(uid: str, container: str, *, qos: str = "burstable") -> str:
    """The cgroup v2 line of a containerd container under the systemd driver, as a node
    agent in its own cgroup namespace reads it (relative to its own cgroup)."""
    level = "" if qos == "guaranteed" else f"-{qos}"
    slice_ = f"kubepods{level}-pod{uid.replace('-', '_')}.slice"
    return f"0::/../../{slice_}/cri-containerd-{container}.scope\n"


class FakeProc:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    @property
    def host(self) -> HostProc:
        return HostProc(self.root)

    def add(self, pid: int, cgroup: str, *, comm: str = "python3") -> None:
        """Process ``pid`` (replacing any process that had that PID before)."""
        folder = self.root / str(pid)
        folder.mkdir(exist_ok=True)
        (folder / "cgroup").write_text(cgroup)
        (folder / "comm").write_text(comm + "\n")

    def remove(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid))
