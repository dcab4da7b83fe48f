"""Which pod and container a process runs in, from its ``/proc/<pid>/cgroup`` (sans-I/O).

The kubelet puts each container in a cgroup below its pod's, and the pod's below its QoS
class's (Guaranteed pods have no level of their own). The names depend on the kubelet's
cgroup driver and on the container runtime:

    driver    path of one container's cgroup
    systemd   /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
                  cri-containerd-<id>.scope        (containerd; the UID's "-" written "_")
              /kubepods.slice/kubepods-pod<uid>.slice/crio-<id>.scope    (CRI-O, Guaranteed)
              ... docker-<id>.scope                (cri-dockerd)
    cgroupfs  /kubepods/besteffort/pod<uid>/<id>   (containerd: the bare ID)
              /kubepods/pod<uid>/crio-<id>         (CRI-O, Guaranteed)

A kubelet given a cgroup root of its own nests all of it one level down: kind and k3s in
containers use ``/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/
kubelet-kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope`` (systemd) or
``/kubelet/kubepods/besteffort/pod<uid>/<id>`` (cgroupfs).

The file has one line per hierarchy: ``0::<path>`` on cgroup v2 (the unified hierarchy),
``<id>:<controllers>:<path>`` for each v1 controller (a hybrid host has both). A reader in
a cgroup namespace of its own (a container on cgroup v2, by default) sees other pods' paths
relative to its own cgroup: ``0::/../../kubepods-besteffort-pod<uid>.slice/
cri-containerd-<id>.scope``. So the pod is found by its own path segment, wherever that
is, and the container by the segment after it. Static pods' UIDs are 32 hex digits (a
hash of the manifest), other pods' the usual dashed UUID.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CgroupOwner", "parse_cgroup"]

_SYSTEMD_POD = re.compile(
    r"(?:.+-)?kubepods(?:-(?P<qos>besteffort|burstable))?-pod(?P<uid>[0-9a-f_]+)\.slice"
)
_CGROUPFS_POD = re.compile(r"pod(?P<uid>[0-9a-f-]+)")
_QOS_LEVELS = frozenset({"besteffort", "burstable"})
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_STATIC_UID = re.compile(r"[0-9a-f]{32}")
_RUNTIME_PREFIXES = ("cri-containerd-", "crio-conmon-", "crio-", "docker-", "containerd-")
_CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")
GUARANTEED = "guaranteed"


@dataclass(frozen=True, slots=True)
class CgroupOwner:
    """The pod a process runs in, and its container where the path names one."""

    pod_uid: str
    """As the Kubernetes API writes it (``metadata.uid``): dashed, lowercase."""
    container_id: str = ""
    """The runtime's container ID (64 hex digits for containerd and CRI-O), without the
    runtime's prefix; empty when the path stops at the pod."""
    qos: str = GUARANTEED
    """``besteffort``, ``burstable`` or ``guaranteed``, as the path says."""


def parse_cgroup(text: str) -> CgroupOwner | None:
    """The pod of the first line of ``text`` (a ``/proc/<pid>/cgroup``) whose path is inside
    a pod's cgroup; None when no line is (a host process, a system service)."""
    for line in text.splitlines():
        _, _, rest = line.partition(":")
        _, separator, path = rest.partition(":")
        if not separator:
            continue
        owner = _owner_of(path)
        if owner is not None:
            return owner
    return None


def _owner_of(path: str) -> CgroupOwner | None:
    segments = [s for s in path.split("/") if s]
    for at, segment in enumerate(segments):
        found = _pod_segment(segment, segments[at - 1] if at else "")
        if found is None:
            continue
        uid, qos = found
        after = segments[at + 1] if at + 1 < len(segments) else ""
        return CgroupOwner(pod_uid=uid, container_id=_container_id(after), qos=qos)
    return None


def _pod_segment(segment: str, before: str) -> tuple[str, str] | None:
    """(UID, QoS) when ``segment`` is a pod's cgroup, in either driver's naming."""
    if (match := _SYSTEMD_POD.fullmatch(segment)) is not None:
        uid = _uid(match["uid"].replace("_", "-"))
        return None if uid is None else (uid, match["qos"] or GUARANTEED)
    if (match := _CGROUPFS_POD.fullmatch(segment)) is not None:
        uid = _uid(match["uid"])
        return None if uid is None else (uid, before if before in _QOS_LEVELS else GUARANTEED)
    return None


def _uid(text: str) -> str | None:
    return text if _UUID.fullmatch(text) or _STATIC_UID.fullmatch(text) else None


def _container_id(segment: str) -> str:
    name = segment.removesuffix(".scope")
    for prefix in _RUNTIME_PREFIXES:
        if name.startswith(prefix):
            name = name.removeprefix(prefix)
            break
    return name if _CONTAINER_ID.fullmatch(name) else ""
