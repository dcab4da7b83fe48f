"""Environment detection and GPU scoping for gpu-metrics (pure functions of the env)."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.app.gpu_metrics.scope import (
    Device,
    DeviceFilter,
    ScopeError,
    detect_environment,
    gpu_scope,
    parse_device_list,
)


def test_slurm_step_gpus_win_over_everything() -> None:
    env = {
        "SLURM_STEP_GPUS": "2",
        "SLURM_JOB_GPUS": "0,1",
        "GPU_DEVICE_ORDINAL": "3",
        "CUDA_VISIBLE_DEVICES": "4",
    }
    assert gpu_scope(env) == DeviceFilter((2,), (), "SLURM_STEP_GPUS", given="2")


@pytest.mark.parametrize(
    ("env", "origin"),
    [
        (
            {"SLURM_JOB_GPUS": "0,1", "GPU_DEVICE_ORDINAL": "3", "CUDA_VISIBLE_DEVICES": "4"},
            "SLURM_JOB_GPUS",
        ),
        ({"GPU_DEVICE_ORDINAL": "0,1", "CUDA_VISIBLE_DEVICES": "4"}, "GPU_DEVICE_ORDINAL"),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, "CUDA_VISIBLE_DEVICES"),
    ],
)
def test_precedence(env: dict[str, str], origin: str) -> None:
    scope = gpu_scope(env)
    assert scope.origin == origin
    assert scope.indices == (0, 1)


def test_uuids_and_mig_uuids() -> None:
    scope = parse_device_list("GPU-aaa, MIG-bbb,3", origin="--device")
    assert scope == DeviceFilter(
        (3,), ("GPU-aaa", "MIG-bbb"), "--device", given="GPU-aaa, MIG-bbb,3"
    )
    assert scope.allows(3, "GPU-x")
    assert scope.allows(0, "MIG-bbb")
    assert not scope.allows(0, "GPU-x")


def test_empty_scope_grants_nothing_and_no_scope_grants_all() -> None:
    assert not gpu_scope({"CUDA_VISIBLE_DEVICES": ""}).allows(0, "GPU-a")
    assert not gpu_scope({"SLURM_JOB_GPUS": "NoDevFiles"}).allows(0, "GPU-a")
    assert gpu_scope({}).allows(7, "GPU-a")


def test_garbage_is_a_clear_error() -> None:
    with pytest.raises(ScopeError, match=r"CUDA_VISIBLE_DEVICES=\"0,gpu1\": 'gpu1' is neither"):
        gpu_scope({"CUDA_VISIBLE_DEVICES": "0,gpu1"})


def test_environments() -> None:
    slurm = detect_environment({"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu-n7"})
    assert (slurm.kind, slurm.node, slurm.job) == ("slurm", "gpu-n7", "42")
    flux = detect_environment({"FLUX_JOB_ID": "f1"})
    assert (flux.kind, flux.job) == ("flux", "f1")
    k8s = detect_environment({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "NODE_NAME": "node-a"})
    assert (k8s.kind, k8s.node) == ("kubernetes", "node-a")
    assert detect_environment({}).kind == "host"


def test_mig_instances_by_gpu_colon_gi() -> None:
    scope = parse_device_list("0:1,2", origin="--device")
    assert scope.instances == ((0, 1),)
    assert scope.allows(0, "MIG-a", 1)
    assert not scope.allows(0, "MIG-b", 2)
    assert not scope.allows(0, "GPU-x")  # GPU 0 itself was not asked for
    assert scope.allows(2, "GPU-y")


DEVICES = [Device(0, "GPU-a"), Device(0, "MIG-b", 1), Device(1, "GPU-c")]


def test_entries_that_match_nothing_are_named_with_the_devices_there_are() -> None:
    scope = parse_device_list("1,4,0:3,GPU-zz", origin="CUDA_VISIBLE_DEVICES")
    assert scope.unmatched(DEVICES) == ["4", "GPU-zz", "0:3"]
    with pytest.raises(ScopeError) as caught:
        scope.check(DEVICES)
    assert str(caught.value) == (
        'CUDA_VISIBLE_DEVICES="1,4,0:3,GPU-zz": 4, GPU-zz, 0:3 match no device; '
        "there are: 0 GPU-a, 0:1 MIG-b, 1 GPU-c"
    )


def test_a_scope_that_matches_is_accepted() -> None:
    parse_device_list("0:1,GPU-c", origin="--device").check(DEVICES)
    gpu_scope({}).check(DEVICES)
    gpu_scope({"CUDA_VISIBLE_DEVICES": ""}).check(DEVICES)  # grants none, on purpose
