"""A node agent whose workloads hold GPUs allocated through DRA: each ``podSelector`` trigger
answers its workload's value, or UNAVAILABLE naming the pod, the claim and why, and never
0 for a pod that holds a GPU.

Everything outside is faked at its protocol edge: NVML by the fake backend (two whole GPUs,
a third in MIG mode with an instance that existed before its claim and one made at
allocation), the kubelet by a real grpclib PodResources server listing the claims'
devices, the Kubernetes API by a local HTTP server serving the pods and NVIDIA's
ResourceSlices (``resource.k8s.io/v1``) as an API server does; KEDA by a grpclib client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from keda_gpu_scaler.app.scaler.compose import AttributionOptions, RunningScaler, build_attribution
from keda_gpu_scaler.domain.samples import DeviceKey
from keda_gpu_scaler.pipeline.supervisor import Sampler
from keda_gpu_scaler.serving._proto.externalscaler import (
    ExternalScalerStub,
    GetMetricsRequest,
    ScaledObjectRef,
)
from keda_gpu_scaler.sources.kubelet import DraDrivers
from keda_gpu_scaler.sources.nvml.backend import GpmMetric, Utilization
from keda_gpu_scaler.sources.nvml.fake_backend import FakeNvml, enable_mig, h200_gpu
from keda_gpu_scaler.sources.nvml.fake_mig import FakeMigInstance
from keda_gpu_scaler.sources.nvml.sampler import NvmlSampler
from keda_gpu_scaler.testing import inline
from tests.dra_objects import (
    allocated,
    gpu_device,
    listed,
    mig_device,
    resource_claim,
    resource_slice,
)
from tests.fake_kube_api import FakeKubeApi, open_fake_kube_api, write_kubeconfig
from tests.fake_kubelet import FakeKubelet, container, fake_kubelet, pod
from tests.loopback import loopback_scaler

pytestmark = pytest.mark.anyio

NODE = "gpu-node-1"
WAIT_S = 10.0


def _nvml() -> FakeNvml:
    """GPU 0 at 80 %, GPU 1 at 30 %; GPU 2 in MIG mode: GI 7 at memory slice 0 (a static
    instance, 55 % of its SMs) and GI 9 at slice 3 (made by dynamic MIG, 65 %)."""
    gpus = [h200_gpu(i) for i in range(3)]
    for gpu, value in zip(gpus[:2], (80, 30), strict=True):
        gpu.utilization = Utilization(value, 0)
        gpu.gpm = {GpmMetric.SM_UTIL: float(value)}
    static = FakeMigInstance(uuid="MIG-static-2-7", gpu_instance_id=7, placement_start=0)
    made = FakeMigInstance(uuid="MIG-made-2-9", gpu_instance_id=9, placement_start=3)
    static.gpm = {GpmMetric.SM_UTIL: 55.0}
    made.gpm = {GpmMetric.SM_UTIL: 65.0}
    enable_mig(gpus[2], [static, made])
    return FakeNvml(gpus)


NVML = _nvml()
GPU = [gpu.uuid for gpu in NVML.gpus]
STATIC, MADE = (instance.uuid for instance in NVML.gpus[2].instances)

SLICE = resource_slice(
    NODE,
    [
        gpu_device(0, GPU[0]),
        gpu_device(1, GPU[1]),
        mig_device(2, parent_uuid=GPU[2], start=0, uuid=STATIC),
        mig_device(2, parent_uuid=GPU[2], start=3),  # made at allocation: no uuid
        mig_device(2, parent_uuid=GPU[2], start=5),  # made while the agent runs (a test's)
    ],
    name="gpu-node-1-gpu.nvidia.com-x7k2p",
)
OTHER_DRIVER_SLICE = resource_slice(NODE, [gpu_device(0, GPU[1])], driver="gpu.example.com")

CLAIMS = {
    "full": resource_claim("ml", "full-gpu", [allocated(NODE, "gpu-0")], node=NODE),
    "static": resource_claim("ml", "static-mig", [allocated(NODE, "gpu-2-mig-1g10gb-19-0")]),
    "made": resource_claim("ml", "made-mig", [allocated(NODE, "gpu-2-mig-1g10gb-19-3")]),
    "ghost": resource_claim("ml", "ghost-gpu", [allocated(NODE, "gpu-5")]),
    "later": resource_claim("ml", "later-mig", [allocated(NODE, "gpu-2-mig-1g10gb-19-5")]),
    "shared": resource_claim(
        "ml",
        "shared-gpu",
        [allocated(NODE, "gpu-1")],
        pods=[(f"share-{i}", f"uid-share-{i}") for i in range(3)],
    ),
    "other": resource_claim(
        "ml", "other-gpu", [allocated(NODE, "gpu-0", driver="gpu.example.com")]
    ),
}
PODS = {
    # pod name: (its claim, its labels)
    "full-0": ("full", {"app": "full"}),
    "static-0": ("static", {"app": "static"}),
    "made-0": ("made", {"app": "made"}),
    "ghost-0": ("ghost", {"app": "ghost"}),
    "later-0": ("later", {"app": "later"}),
    "share-0": ("shared", {"app": "shared"}),
    "share-1": ("shared", {"app": "shared"}),
    "share-2": ("shared", {"app": "shared"}),
    "other-0": ("other", {"app": "other"}),
}


@dataclass
class Agent:
    scaler: RunningScaler
    kubelet: FakeKubelet
    api: FakeKubeApi


@asynccontextmanager
async def node_agent(
    tmp_path: Path,
    *,
    before: Callable[[FakeKubeApi], None] = lambda api: None,
    nvml: FakeNvml = NVML,
) -> AsyncIterator[Agent]:
    listing = [
        pod("ml", name, containers=[container("main", dra=[listed(CLAIMS[claim])])])
        for name, (claim, _) in PODS.items()
    ]
    async with fake_kubelet(tmp_path, pods=listing) as kubelet, open_fake_kube_api() as api:
        for name, (_, labels) in PODS.items():
            api.add_pod("ml", name, node=NODE, labels=labels)
        api.add_resource_slice(SLICE)
        api.add_resource_slice(OTHER_DRIVER_SLICE)
        before(api)
        samplers = build_attribution(
            AttributionOptions(
                socket_path=kubelet.socket_path,
                interval_s=0.2,
                node_name=NODE,
                kubeconfig=str(write_kubeconfig(tmp_path / "kubeconfig", api.url)),
                dra_drivers=DraDrivers.parse("gpu.nvidia.com"),
            )
        )
        source = NvmlSampler(nvml, interval_s=0.1, mig_layout_interval_s=0.3, call_in_thread=inline)
        async with loopback(source, samplers) as scaler:
            yield Agent(scaler, kubelet, api)


@asynccontextmanager
async def loopback(source: NvmlSampler, samplers: list[Sampler]) -> AsyncIterator[RunningScaler]:
    async with loopback_scaler(source, samplers=samplers) as scaler:
        with anyio.fail_after(WAIT_S):
            while not _ready(scaler):
                await scaler.hub.wait_newer(scaler.hub.current.version)
        yield scaler


def _ready(scaler: RunningScaler) -> bool:
    snapshot = scaler.hub.current
    fresh = [d for d in snapshot.devices.values() if d.reading and d.reading.sm_active is not None]
    return snapshot.attribution is not None and snapshot.pods is not None and len(fresh) >= 4


async def _metrics(scaler: RunningScaler, app: str, **metadata: str) -> float:
    """GetMetrics for a trigger over the pods ``app=<app>`` of namespace ml; raises
    GRPCError when the answer is an error."""
    meta = {"podSelector": f"app={app}", "metricType": "sm_active", "cooldownSeconds": "0"}
    ref = ScaledObjectRef(name="so", namespace="ml", scaler_metadata={**meta, **metadata})
    async with Channel("127.0.0.1", scaler.port) as channel:
        answer = await ExternalScalerStub(channel).get_metrics(
            GetMetricsRequest(scaled_object_ref=ref, metric_name="m")
        )
    (value,) = answer.metric_values
    return value.metric_value_float


async def _unavailable(scaler: RunningScaler, app: str) -> str:
    with pytest.raises(GRPCError) as caught:
        await _metrics(scaler, app)
    assert caught.value.status is Status.UNAVAILABLE, caught.value
    return caught.value.message or ""


async def _eventually(scaler: RunningScaler, app: str, expected: float) -> None:
    """Until the trigger over ``app`` answers ``expected`` (each new snapshot, at most
    WAIT_S)."""
    with anyio.fail_after(WAIT_S):
        while True:
            try:
                if await _metrics(scaler, app) == expected:
                    return
            except GRPCError:
                pass
            await scaler.hub.wait_newer(scaler.hub.current.version)


async def _eventually_unavailable(scaler: RunningScaler, app: str, needle: str) -> str:
    with anyio.fail_after(WAIT_S):
        while True:
            try:
                await _metrics(scaler, app)
            except GRPCError as error:
                if error.status is Status.UNAVAILABLE and needle in (error.message or ""):
                    return error.message or ""
            await scaler.hub.wait_newer(scaler.hub.current.version)


async def test_full_gpus_and_mig_devices_with_and_without_uuid_are_their_pods_own(
    tmp_path: Path,
) -> None:
    async with node_agent(tmp_path) as agent:
        await _eventually(agent.scaler, "full", 80.0)  # gpu-0, by its uuid
        assert await _metrics(agent.scaler, "static") == 55.0  # a MIG device's uuid
        assert await _metrics(agent.scaler, "made") == 65.0  # parentUUID and placement


async def test_a_claim_shared_by_three_pods_counts_its_gpu_once_for_each(tmp_path: Path) -> None:
    async with node_agent(tmp_path) as agent:
        await _eventually(agent.scaler, "shared", 30.0)
        assert await _metrics(agent.scaler, "shared", aggregation="sum") == 30.0
        joined = agent.scaler.hub.current.nodes[""].by_device
        assert [h.pod for h in joined[DeviceKey(GPU[1])]] == ["share-0", "share-1", "share-2"]


async def test_a_device_missing_from_its_slice_is_unavailable_naming_pod_claim_and_why(
    tmp_path: Path,
) -> None:
    async with node_agent(tmp_path) as agent:
        await _eventually(agent.scaler, "full", 80.0)
        message = await _unavailable(agent.scaler, "ghost")
    assert message == (
        "ml/ghost-0 holds DRA device gpu.nvidia.com/gpu-node-1/gpu-5 of claim ml/ghost-gpu, "
        "not identified (device_missing: pool gpu-node-1 of gpu.nvidia.com (generation 1) has "
        "no device gpu-5) (a GPU it holds is never counted as none)"
    )


async def test_a_gpu_of_a_driver_not_among_the_gpu_drivers_is_unavailable(
    tmp_path: Path,
) -> None:
    async with node_agent(tmp_path) as agent:
        await _eventually(agent.scaler, "full", 80.0)
        message = await _unavailable(agent.scaler, "other")
    assert "ml/other-0 holds DRA device gpu.example.com/gpu-node-1/gpu-0 of claim ml/other-gpu" in (
        message
    )
    assert "driver gpu.example.com is not among --dra-drivers: add it" in message


async def test_no_rbac_for_slices_is_unavailable_with_the_apis_answer_until_it_is_granted(
    tmp_path: Path,
) -> None:
    forbidden = 'resourceslices.resource.k8s.io is forbidden: cannot list resource "resourceslices"'

    def refuse(api: FakeKubeApi) -> None:
        api.fail(403, forbidden, on="resourceslices")

    async with node_agent(tmp_path, before=refuse) as agent:
        message = await _eventually_unavailable(agent.scaler, "full", "403 Forbidden")
        assert (
            "ml/full-0 holds DRA device gpu.nvidia.com/gpu-node-1/gpu-0 of claim ml/full-gpu"
            in (message)
        )
        assert "slices_unavailable: this node's ResourceSlices are unavailable: " in message
        assert forbidden in message
        # Triggers over workloads without DRA devices are not affected.
        assert await _metrics(agent.scaler, "nothing") == 0.0
        agent.api.heal()  # the ClusterRole is fixed
        await _eventually(agent.scaler, "full", 80.0)


async def test_a_slice_moving_to_a_new_generation_is_unavailable_until_complete(
    tmp_path: Path,
) -> None:
    async with node_agent(tmp_path) as agent:
        await _eventually(agent.scaler, "made", 65.0)
        # The driver republishes its pool as two slices of generation 2; the first one
        # alone is an incomplete pool.
        first = resource_slice(
            NODE,
            [gpu_device(0, GPU[0]), gpu_device(1, GPU[1])],
            name=SLICE["metadata"]["name"],
            generation=2,
            count=2,
        )
        agent.api.replace_resource_slice(first)
        message = await _eventually_unavailable(agent.scaler, "made", "pool_incomplete")
        assert "1 of its 2 ResourceSlices of generation 2 seen" in message
        second = resource_slice(
            NODE,
            [mig_device(2, parent_uuid=GPU[2], start=3, uuid=MADE)],
            name="gpu-node-1-gpu.nvidia.com-second",
            generation=2,
            count=2,
        )
        agent.api.add_resource_slice(second)
        await _eventually(agent.scaler, "made", 65.0)  # now by the uuid the slice carries
        (made,) = [d for d in agent.scaler.hub.current.nodes[""].dra if d.pod == "made-0"]
        assert (made.outcome, made.key) == ("uuid", MADE)


async def test_a_mig_device_made_while_the_agent_runs_is_its_claims_once_nvml_has_it(
    tmp_path: Path,
) -> None:
    """Dynamic MIG: the DRA driver makes the instance of a claim's MIG device (no uuid in
    the slice) after the node agent started, and destroys it when the claim is released;
    the agent follows without a restart."""
    nvml = _nvml()
    async with node_agent(tmp_path, nvml=nvml) as agent:
        await _eventually(agent.scaler, "made", 65.0)
        message = await _unavailable(agent.scaler, "later")
        assert "placement_unmatched: no MIG instance NVML reports is at placement start 5" in (
            message
        )
        made = nvml.create_mig_device(2, start=5, uuid="MIG-later-2-5")
        made.gpm = {GpmMetric.SM_UTIL: 75.0}
        await _eventually(agent.scaler, "later", 75.0)
        (later,) = [d for d in agent.scaler.hub.current.nodes[""].dra if d.pod == "later-0"]
        assert (later.outcome, later.key) == ("placement", "MIG-later-2-5")
        # The claim is released and its instance destroyed: gone from the snapshot, and
        # the claim's device is no instance again (not the old one's last reading).
        nvml.destroy_mig_device(2, "MIG-later-2-5")
        await _eventually_unavailable(agent.scaler, "later", "placement_unmatched")
        assert DeviceKey("MIG-later-2-5") not in agent.scaler.hub.current.devices
        assert await _metrics(agent.scaler, "made") == 65.0
