"""Environment detection and GPU scoping for gpu-metrics (pure functions of the env)."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.app.scope import (
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
    assert gpu_scope(env) == DeviceFilter((2,), (), "SLURM_STEP_GPUS")


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
    assert scope == DeviceFilter((3,), ("GPU-aaa", "MIG-bbb"), "--device")
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
