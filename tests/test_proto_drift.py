"""The committed generated code is exactly what the compiler makes from protos/."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keda_gpu_scaler.sources.kubelet._proto import v1

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "src" / "keda_gpu_scaler" / "serving" / "_proto"
KUBELET_GENERATED = ROOT / "src" / "keda_gpu_scaler" / "sources" / "kubelet" / "_proto"
KUBELET_PROTO = ROOT / "protos" / "kubelet" / "podresources" / "v1" / "api.proto"


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    serving, kubelet = tmp_path / "serving", tmp_path / "kubelet"
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "generate_proto.sh"), str(serving), str(kubelet)],
        check=True,
        env=env,
        capture_output=True,
    )
    assert _files(serving) == _files(GENERATED), "run `make proto` and commit the result"
    assert _files(kubelet) == _files(KUBELET_GENERATED), "run `make proto` and commit the result"
    assert "v1/__init__.py" in _files(kubelet)


def test_the_generator_refuses_one_output_folder_alone(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "generate_proto.sh"), str(tmp_path / "only")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "usage:" in done.stderr
    assert not (tmp_path / "only").exists()


def test_contract_keeps_keda_package_and_all_five_rpcs() -> None:
    proto = (ROOT / "protos" / "externalscaler.proto").read_text()
    assert "package externalscaler;" in proto
    for rpc in ("IsActive", "StreamIsActive", "GetMetricSpec", "GetMetrics", "StreamMetricSpec"):
        assert f"rpc {rpc}(" in proto


def test_kubelet_api_keeps_package_v1_its_three_rpcs_and_licence() -> None:
    proto = KUBELET_PROTO.read_text()
    assert "package v1;" in proto  # part of every method path: /v1.PodResourcesLister/List
    assert "service PodResourcesLister {" in proto
    for rpc in ("List", "GetAllocatableResources", "Get"):
        assert f"rpc {rpc}(" in proto
    assert "pkg/apis/podresources/v1/api.proto" in proto
    assert "Apache License, Version 2.0" in proto


# Upstream's field numbers: a wrong one reads another field, or nothing, off the wire.
@pytest.mark.parametrize(
    ("message", "numbers"),
    [
        (v1.ListPodResourcesResponse, {"pod_resources": 1}),
        (v1.PodResources, {"name": 1, "namespace": 2, "containers": 3}),
        (
            v1.ContainerResources,
            {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5},
        ),
        (v1.ContainerDevices, {"resource_name": 1, "device_ids": 2, "topology": 3}),
        (v1.TopologyInfo, {"nodes": 1}),
        (v1.NumaNode, {"id": 1}),
        (v1.ContainerMemory, {"memory_type": 1, "size": 2, "topology": 3}),
        (v1.DynamicResource, {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4}),
        (
            v1.ClaimResource,
            {"cdi_devices": 1, "driver_name": 2, "pool_name": 3, "device_name": 4, "share_id": 5},
        ),
        (v1.CdiDevice, {"name": 1}),
    ],
)
def test_kubelet_messages_keep_upstream_field_numbers(
    message: type[Any], numbers: dict[str, int]
) -> None:
    # betterproto2 messages are dataclasses; each field's metadata holds its number.
    fields = {f.name: f.metadata["betterproto"].number for f in dataclasses.fields(message)}
    assert fields == numbers
