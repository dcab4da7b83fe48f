"""DRA: GPUs allocated through ResourceClaims, joined through the real API's ResourceSlices.

The node agent runs with the chart's ServiceAccount (its ClusterRole reads ResourceSlices)
and watches its node's slices through the real API server; the slices and claims are
created through that API, so its validation of ``resource.k8s.io/v1`` checks the test data.
The kubelet's PodResources answer (the fake kubelet) lists each container's claim devices as
the kubelet does, ``(driver, pool, device)`` with no UUID. Then:

- a pod holding ``gpu-0`` through a claim measures that GPU (63 %), and a second pod sharing
  the claim makes it a holder of the same device, counted once;
- a pod whose claim names a device its slice does not list is UNAVAILABLE, naming the pod,
  the claim and why, never 0;
- a new generation of the pool that lists the device joins it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dra_objects import allocated, gpu_device, listed, resource_claim, resource_slice
from tests.e2e.harness.chart import Release
from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.kubelet import ready_status
from tests.e2e.harness.scaler import NodeAgent, Ports, node_agent
from tests.e2e.harness.traces import GPU_UUIDS, write_trace
from tests.fake_kubelet import container, pod
from tests.grpcio_client import GrpcioModules

NAMESPACE = "dra-ml"
PORTS = Ports(grpc=16060, metrics=19060, probes=18060)
UTILIZATION = 63.0
LLM = {"metricType": "gpu_utilization", "podSelector": "app=llm", "cooldownSeconds": "0"}
GHOST = {"metricType": "gpu_utilization", "podSelector": "app=ghost", "cooldownSeconds": "0"}
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/" + NAMESPACE + "/resourceclaims"
SLICE = "gpu-node-1-dra"


def _pod(plane: ControlPlane, node: str, name: str, app: str, claim: str) -> dict[str, Any]:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": app}},
        "spec": {
            "nodeName": node,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [
                {
                    "name": "server",
                    "image": "vllm/vllm-openai",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    created: dict[str, Any] = plane.admin.post(f"/api/v1/namespaces/{NAMESPACE}/pods", body)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/status"
    plane.admin.put(path, created | {"status": ready_status(created, "10.99.1.60")})
    return created


def _claim(
    plane: ControlPlane, name: str, device: str, node: str, pods: list[dict[str, Any]]
) -> dict[str, Any]:
    """A claim created, then allocated and reserved through its status, as the scheduler does."""
    holders = [(p["metadata"]["name"], p["metadata"]["uid"]) for p in pods]
    claim = resource_claim(NAMESPACE, name, [allocated(node, device)], pods=holders, node=node)
    created = plane.admin.post(CLAIMS, {k: v for k, v in claim.items() if k != "status"})
    plane.admin.put(f"{CLAIMS}/{name}/status", created | {"status": claim["status"]})
    return claim


@pytest.fixture
def agent(
    plane: ControlPlane,
    gpu_nodes: list[str],
    node_release: Release,
    grpcio_mods: GrpcioModules,
    tmp_path: Path,
) -> Iterator[NodeAgent]:
    plane.namespace(NAMESPACE)
    trace = write_trace(
        tmp_path / "trace.jsonl", [(0, UTILIZATION)], duration_s=600, gpus=GPU_UUIDS
    )
    try:
        with node_agent(
            plane,
            "dra-agent",
            release=node_release,
            node=gpu_nodes[0],
            trace=trace,
            ports=PORTS,
            modules=grpcio_mods,
            folder=tmp_path,
        ) as running:
            yield running
    finally:
        plane.admin.delete(f"/apis/resource.k8s.io/v1/resourceslices/{SLICE}")


def _answers(agent: NodeAgent, trigger: dict[str, str], expected: str | float) -> None:
    agent.client.await_outcome(trigger, expected, namespace=NAMESPACE, timeout_s=30, every_s=0.2)


def test_claims_are_joined_through_the_real_apis_resource_slices(
    plane: ControlPlane, gpu_nodes: list[str], agent: NodeAgent
) -> None:
    node = gpu_nodes[0]
    slice_name = SLICE
    first = resource_slice(node, [gpu_device(0, GPU_UUIDS[0])], name=slice_name)
    plane.admin.post("/apis/resource.k8s.io/v1/resourceslices", first)

    llm = [_pod(plane, node, f"llm-{n}", "llm", "llm-gpu") for n in (0, 1)]
    shared = _claim(plane, "llm-gpu", "gpu-0", node, llm)
    ghost_pod = _pod(plane, node, "ghost-0", "ghost", "ghost-gpu")
    ghost = _claim(plane, "ghost-gpu", "gpu-1", node, [ghost_pod])
    agent.kubelet.set_pods(
        [
            pod(
                NAMESPACE,
                p["metadata"]["name"],
                containers=[container("server", dra=[listed(shared)])],
            )
            for p in llm
        ]
        + [pod(NAMESPACE, "ghost-0", containers=[container("server", dra=[listed(ghost)])])]
    )

    _answers(agent, LLM, UTILIZATION)  # two pods on one claim: one device, counted once
    _answers(agent, GHOST, "UNAVAILABLE")
    why = agent.client.details(GHOST, namespace=NAMESPACE)
    assert "ghost-0" in why and "ghost-gpu" in why and "gpu-1" in why, why

    # The driver publishes a new generation of its pool that lists gpu-1 as well.
    current = plane.admin.get(f"/apis/resource.k8s.io/v1/resourceslices/{slice_name}")
    second = resource_slice(
        node,
        [gpu_device(0, GPU_UUIDS[0]), gpu_device(1, GPU_UUIDS[1])],
        name=slice_name,
        generation=2,
    )
    second["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    plane.admin.put(f"/apis/resource.k8s.io/v1/resourceslices/{slice_name}", second)
    _answers(agent, GHOST, UTILIZATION)
