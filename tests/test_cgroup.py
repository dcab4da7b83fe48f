"""Process -> pod and container, from ``/proc/<pid>/cgroup`` as real nodes write it."""

from __future__ import annotations

from pathlib import Path

import pytest

from keda_gpu_scaler.sources.procfs import (
    CgroupOwner,
    HostProc,
    ProcessGone,
    ProcessOwner,
    ProcUnreadable,
    parse_cgroup,
)
from tests.fake_proc import FakeProc, pod_cgroup

UID = "6f3b9c2e-1d4a-4b8e-9f10-2a3b4c5d6e7f"
SYSTEMD_UID = UID.replace("-", "_")
CID = "4d2a8c1f0e9b7a6d5c4b3a29180f7e6d5c4b3a29180f7e6d5c4b3a29180f7e6d"
STATIC_UID = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"

CASES = {
    # cgroup v2, systemd driver (kubeadm, EKS, GKE, AKS on current images), containerd.
    "systemd v2 containerd burstable": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        CgroupOwner(UID, CID, "burstable"),
    ),
    "systemd v2 containerd besteffort": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        CgroupOwner(UID, CID, "besteffort"),
    ),
    "systemd v2 guaranteed (no QoS level)": (
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
        CgroupOwner(UID, CID, "guaranteed"),
    ),
    "systemd v2 CRI-O (OpenShift)": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
        f"crio-{CID}.scope\n",
        CgroupOwner(UID, CID, "burstable"),
    ),
    "systemd v2 cri-dockerd": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/"
        f"docker-{CID}.scope\n",
        CgroupOwner(UID, CID, "besteffort"),
    ),
    "systemd v2 read from inside another cgroup namespace": (
        f"0::/../../kubepods-besteffort-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
        CgroupOwner(UID, CID, "besteffort"),
    ),
    "systemd v2 nested cgroup inside the container": (
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope/"
        "init.scope\n",
        CgroupOwner(UID, CID, "guaranteed"),
    ),
    "kind (systemd, kubelet.slice root)": (
        "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
        CgroupOwner(UID, CID, "besteffort"),
    ),
    "k3s in a container (systemd, kubelet.slice, guaranteed)": (
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{SYSTEMD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        CgroupOwner(UID, CID, "guaranteed"),
    ),
    # cgroup v1, cgroupfs driver (older nodes, k3s' default), one line per controller.
    "cgroupfs v1 besteffort containerd": (
        f"12:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"11:cpu,cpuacct:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n",
        CgroupOwner(UID, CID, "besteffort"),
    ),
    "cgroupfs v1 guaranteed": (
        f"10:devices:/kubepods/pod{UID}/{CID}\n",
        CgroupOwner(UID, CID, "guaranteed"),
    ),
    "cgroupfs v1 CRI-O": (
        f"9:pids:/kubepods/burstable/pod{UID}/crio-{CID}\n",
        CgroupOwner(UID, CID, "burstable"),
    ),
    "cgroupfs v2 (k3s on a unified host)": (
        f"0::/kubepods/burstable/pod{UID}/{CID}\n",
        CgroupOwner(UID, CID, "burstable"),
    ),
    "kind cgroupfs (/kubelet root)": (
        f"0::/kubelet/kubepods/besteffort/pod{UID}/{CID}\n",
        CgroupOwner(UID, CID, "besteffort"),
    ),
    "hybrid v1 and v2, the pod on v1 controllers only": (
        f"12:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}"
        f".slice/cri-containerd-{CID}.scope\n"
        "0::/\n",
        CgroupOwner(UID, CID, "burstable"),
    ),
    "static pod (its UID a hash)": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        CgroupOwner(STATIC_UID, CID, "burstable"),
    ),
    "the pod's own cgroup, no container": (
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice\n",
        CgroupOwner(UID, "", "guaranteed"),
    ),
    "CRI-O's conmon beside the container": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
        f"crio-conmon-{CID}.scope\n",
        CgroupOwner(UID, CID, "burstable"),
    ),
}

NOT_IN_A_POD = {
    "a system service": "0::/system.slice/nvidia-persistenced.service\n",
    "a user session": "0::/user.slice/user-1000.slice/session-3.scope\n",
    "the root": "0::/\n",
    "the QoS slice itself": "0::/kubepods.slice/kubepods-burstable.slice\n",
    "docker outside Kubernetes": f"0::/system.slice/docker-{CID}.scope\n",
    "v1 outside any pod": "12:memory:/user.slice\n1:name=systemd:/init.scope\n",
    "a malformed UID": "0::/kubepods.slice/kubepods-podnot_a_uid.slice/x.scope\n",
    "empty": "",
    "garbage": "not a cgroup file\n",
}


@pytest.mark.parametrize(("text", "owner"), CASES.values(), ids=CASES.keys())
def test_pod_and_container_from_real_cgroup_paths(text: str, owner: CgroupOwner) -> None:
    assert parse_cgroup(text) == owner


@pytest.mark.parametrize("text", NOT_IN_A_POD.values(), ids=NOT_IN_A_POD.keys())
def test_a_process_outside_any_pod_has_no_owner(text: str) -> None:
    assert parse_cgroup(text) is None


def test_the_host_proc_reader_maps_a_pid_through_its_cgroup(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    proc.add(4242, pod_cgroup(UID, CID), comm="python3")
    proc.add(77, "0::/system.slice/nvidia-mps.service\n", comm="nvidia-cuda-mps-server")
    host = proc.host
    assert host.owner(4242) == ProcessOwner(UID, CID, "python3")
    assert host.owner(77) == ProcessOwner("", "", "nvidia-cuda-mps-server")
    assert host.owner(77).is_mps_server()
    with pytest.raises(ProcessGone):
        host.owner(5)
    proc.remove(4242)
    with pytest.raises(ProcessGone):
        host.owner(4242)


def test_a_proc_that_is_not_there_is_unreadable_not_gone(tmp_path: Path) -> None:
    with pytest.raises(ProcUnreadable, match="is not a directory"):
        HostProc(tmp_path / "missing").owner(1)
    proc = FakeProc(tmp_path / "proc")
    proc.add(9, pod_cgroup(UID, CID))
    (tmp_path / "proc" / "9" / "cgroup").chmod(0)
    try:
        (tmp_path / "proc" / "9" / "cgroup").read_text()
    except PermissionError:
        with pytest.raises(ProcUnreadable, match=r"cannot read .*9/cgroup: Permission denied"):
            proc.host.owner(9)
    else:  # running as root: mode bits do not stop it
        assert proc.host.owner(9).pod_uid == UID
