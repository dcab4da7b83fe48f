"""The committed generated code is exactly what the compiler makes from protos/."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from keda_gpu_scaler._proto_agent.kedagpuscaler.v1 import (
    DeviceHolder,
    DeviceReading,
    DraDevice,
    NodeUpdate,
)
from keda_gpu_scaler.domain import samples
from keda_gpu_scaler.sources.kubelet._proto import v1

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "src" / "keda_gpu_scaler" / "serving" / "_proto"
KUBELET_GENERATED = ROOT / "src" / "keda_gpu_scaler" / "sources" / "kubelet" / "_proto"
KUBELET_PROTO = ROOT / "protos" / "kubelet" / "podresources" / "v1" / "api.proto"
AGENT_GENERATED = ROOT / "src" / "keda_gpu_scaler" / "_proto_agent"
AGENT_PROTO = ROOT / "protos" / "kedagpuscaler" / "v1" / "node_agent.proto"


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    outs = [tmp_path / "serving", tmp_path / "kubelet", tmp_path / "agent"]
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "generate_proto.sh"), *map(str, outs)],
        check=True,
        env=env,
        capture_output=True,
    )
    serving, kubelet, agent = outs
    assert _files(serving) == _files(GENERATED), "run `make proto` and commit the result"
    assert _files(kubelet) == _files(KUBELET_GENERATED), "run `make proto` and commit the result"
    assert _files(agent) == _files(AGENT_GENERATED), "run `make proto` and commit the result"
    assert "v1/__init__.py" in _files(kubelet)
    assert "kedagpuscaler/v1/__init__.py" in _files(agent)


@pytest.mark.parametrize("given", [1, 2])
def test_the_generator_refuses_some_output_folders_without_the_others(
    tmp_path: Path, given: int
) -> None:
    folders = [tmp_path / name for name in ("serving", "kubelet")[:given]]
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "generate_proto.sh"), *map(str, folders)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "usage:" in done.stderr
    assert not any(folder.exists() for folder in folders)


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


def test_node_agent_proto_keeps_its_package_service_and_stream() -> None:
    proto = AGENT_PROTO.read_text()
    assert "package kedagpuscaler.v1;" in proto  # part of the method path
    assert "service NodeAgent {" in proto
    assert "rpc WatchNode(WatchNodeRequest) returns (stream NodeUpdate);" in proto
    kinds = {f.name for f in dataclasses.fields(NodeUpdate)}
    assert kinds == {"identity", "readings", "heartbeat"}


def _proto_fields(message: type[Any]) -> dict[str, Any]:
    return {f.name: f.metadata["betterproto"] for f in dataclasses.fields(message)}


def test_every_reading_field_travels_and_what_may_be_absent_is_optional() -> None:
    sent = _proto_fields(DeviceReading)
    # What the receiver dates and names itself: the age replaces taken_at; source and node
    # are the link's.
    local = {"source", "taken_at", "node"}
    reading = set(samples.GpuReading.__struct_fields__) - local
    assert set(sent) - {"age_s"} == reading
    defaults = dict(
        zip(
            samples.GpuReading.__struct_fields__[-len(samples.GpuReading.__struct_defaults__) :],
            samples.GpuReading.__struct_defaults__,
            strict=True,
        )
    )
    for name in reading:
        may_be_absent = defaults.get(name, msgspec.NODEFAULT) is None
        assert sent[name].optional is may_be_absent, name


@pytest.mark.parametrize(
    ("message", "struct"),
    [(DeviceHolder, samples.DeviceHolder), (DraDevice, samples.DraDevice)],
)
def test_attribution_messages_carry_every_field_of_their_samples(
    message: type[Any], struct: type[msgspec.Struct]
) -> None:
    fields = _proto_fields(message)
    assert set(fields) == set(struct.__struct_fields__)
    optional = {name for name, meta in fields.items() if meta.optional}
    # Exactly the fields the struct may leave None are optional in the proto.
    names, defaults = struct.__struct_fields__, struct.__struct_defaults__
    with_default = names[len(names) - len(defaults) :]
    may_be_none = {n for n, d in zip(with_default, defaults, strict=True) if d is None}
    assert optional == may_be_none
