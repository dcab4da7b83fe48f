"""The DRA join, pure: ResourceSlices (in the ``resource.k8s.io/v1`` schema, decoded by the
product's own codec) and the kubelet's DRA devices in, each device's NVML device or the
reason it has none out; then ``podSelector`` decisions over it, on a node agent and, through
the WatchNode stream, on a cluster scaler."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from keda_gpu_scaler._proto_agent.kedagpuscaler import v1 as proto
from keda_gpu_scaler.domain.attribution import attribute, slices_unavailable_reason
from keda_gpu_scaler.domain.decision import decide, measure
from keda_gpu_scaler.domain.dra import (
    MigName,
    Outcome,
    Slices,
    join_devices,
    parse_mig_name,
    pools_of,
)
from keda_gpu_scaler.domain.errors import NoData
from keda_gpu_scaler.domain.samples import (
    POD_RESOURCES_SOURCE,
    PODS_SOURCE,
    RESOURCE_SLICES_SOURCE,
    DeviceHolder,
    DeviceKey,
    DraDevice,
    GpuReading,
    PodInfo,
    PodResourcesReading,
    PodsReading,
    ResourceSliceInfo,
    ResourceSlicesReading,
    Sample,
    SourceFault,
)
from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT, DeviceState, Snapshot
from keda_gpu_scaler.domain.trigger import parse_trigger
from keda_gpu_scaler.pipeline.state import fold
from keda_gpu_scaler.pipeline.tap import Tap, TapFilter, tap_attribution
from keda_gpu_scaler.serving.node_agent import UpdateBuilder
from keda_gpu_scaler.sources.agents.codec import decode_update
from keda_gpu_scaler.sources.agents.updates import StreamReader
from keda_gpu_scaler.sources.kube.resourceslices import SLICE_CODEC
from tests.dra_objects import (
    gpu_device,
    mig_device,
    plain_device,
    resource_slice,
)

NOW = 100.0
NODE = "node-a"
NVIDIA = "gpu.nvidia.com"
GPU = [f"GPU-{i}0000000-0000-0000-0000-000000000000" for i in range(3)]
MIG_STATIC = "MIG-11111111-0000-0000-0000-000000000000"
MIG_DYNAMIC = "MIG-22222222-0000-0000-0000-000000000000"


def _infos(*objects: dict[str, Any]) -> tuple[ResourceSliceInfo, ...]:
    """The slices as the watch decodes them from an API server's list."""
    body = {"kind": "ResourceSliceList", "metadata": {"resourceVersion": "7"}, "items": objects}
    return SLICE_CODEC.decode_page(json.dumps(body).encode()).items


def _slices(*objects: dict[str, Any], at: float = NOW) -> ResourceSlicesReading:
    return ResourceSlicesReading(
        source=RESOURCE_SLICES_SOURCE,
        taken_at=at,
        period_s=10.0,
        node=NODE,
        pools=pools_of(_infos(*objects)),
    )


def _gpu(index: int, value: float, **fields: Any) -> GpuReading:
    reading = GpuReading(
        source="nvml",
        key=DeviceKey(GPU[index]),
        index=index,
        uuid=GPU[index],
        name="NVIDIA H100",
        taken_at=NOW,
        period_s=1.0,
        gpu_utilization=value,
        sm_active=value,
    )
    return msgspec.structs.replace(reading, **fields)


def _instance(uuid: str, parent: int, gi: int, start: int, value: float) -> GpuReading:
    return _gpu(
        parent,
        value,
        key=DeviceKey(uuid),
        uuid=uuid,
        gpu_utilization=None,
        parent_index=parent,
        parent_uuid=GPU[parent],
        gpu_instance_id=gi,
        compute_instance_id=0,
        gpu_instance_profile_id=19,
        placement_start=start,
        placement_size=1,
    )


# GPUs 0 and 1 whole; GPU 2 in MIG mode: a static instance at slice 0, a dynamic one at 3.
NVML = [
    _gpu(0, 80.0),
    _gpu(1, 30.0),
    _gpu(2, 0.0, mig_enabled=True, gpu_utilization=None),
    _instance(MIG_STATIC, 2, gi=7, start=0, value=55.0),
    _instance(MIG_DYNAMIC, 2, gi=9, start=3, value=65.0),
]
NODE_SLICE = resource_slice(
    NODE,
    [
        gpu_device(0, GPU[0]),
        gpu_device(1, GPU[1]),
        mig_device(2, parent_uuid=GPU[2], start=0, uuid=MIG_STATIC),
        mig_device(2, parent_uuid=GPU[2], start=3),  # dynamic MIG: no uuid
    ],
)


def _devices(readings: list[GpuReading] = NVML) -> dict[DeviceKey, DeviceState]:
    return {r.key: DeviceState(key=r.key, index=r.index, reading=r) for r in readings}


def _dra(
    pod: str,
    device: str,
    *,
    claim: str = "",
    driver: str = NVIDIA,
    pool: str = NODE,
    namespace: str = "ml",
    gpu: bool | None = None,
    share_id: str | None = None,
) -> DraDevice:
    return DraDevice(
        namespace=namespace,
        pod=pod,
        container="main",
        claim_namespace=namespace,
        claim_name=claim or f"{pod}-gpu",
        driver=driver,
        pool=pool,
        device=device,
        share_id=share_id,
        gpu=driver == NVIDIA if gpu is None else gpu,
    )


def _join(device: DraDevice, slices: Slices, readings: list[GpuReading] = NVML) -> DraDevice:
    (joined,) = join_devices((device,), slices, _devices(readings))
    return joined


def _of(reading: ResourceSlicesReading) -> Slices:
    return Slices.of(reading, None)


# -- pools ---------------------------------------------------------------------------


def test_a_pool_is_its_latest_generation_and_only_when_every_slice_of_it_is_there() -> None:
    old = resource_slice(NODE, [gpu_device(0, "GPU-old")], name="s-old", generation=1)
    new_a = resource_slice(NODE, [gpu_device(0, GPU[0])], name="s-a", generation=2, count=2)
    new_b = resource_slice(NODE, [gpu_device(1, GPU[1])], name="s-b", generation=2, count=2)
    (pool,) = pools_of(_infos(old, new_a))
    assert (pool.generation, pool.slices, pool.slice_count) == (2, 1, 2)
    assert pool.problem == (
        f"pool {NODE} of {NVIDIA} is incomplete: 1 of its 2 ResourceSlices of generation 2 seen"
    )
    (pool,) = pools_of(_infos(new_b, old, new_a))
    assert pool.problem is None
    assert [(d.name, d.uuid) for d in pool.devices] == [("gpu-0", GPU[0]), ("gpu-1", GPU[1])]
    twice = resource_slice(NODE, [gpu_device(0, GPU[0]), gpu_device(0, GPU[1])])
    (pool,) = pools_of(_infos(twice))
    assert pool.problem == f"pool {NODE} of {NVIDIA} is invalid: it lists gpu-0 twice"


def test_a_slice_is_read_for_the_attributes_of_its_drivers_domain_only() -> None:
    device = plain_device(
        "gpu-0",
        {
            f"{NVIDIA}/uuid": {"string": GPU[0]},  # qualified with the driver's own domain
            "example.com/parentUUID": {"string": "GPU-not-this-drivers"},
            "type": {"string": "gpu"},
            "index": {"int": 0},
            "driverVersion": {"version": "580.95.5"},
        },
    )
    (info,) = _infos(resource_slice(NODE, [device]))
    (read,) = info.devices
    assert (read.name, read.uuid, read.parent_uuid, read.type) == ("gpu-0", GPU[0], None, "gpu")
    assert (info.driver, info.pool, info.node, info.generation) == (NVIDIA, NODE, NODE, 1)


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("gpu-0-mig-1g10gb-19-3", MigName(profile_id=19, start=3)),
        ("gpu-12-mig-1g10gb-me-20-6", MigName(profile_id=20, start=6)),
        ("gpu-0-mig-19-3-1", MigName(profile_id=19, start=3, size=1)),  # before 2025
        ("gpu-0", None),
        ("gpu-vfio-0", None),
        ("gpu-0-mig-19-3", None),
    ],
)
def test_mig_device_names_say_their_placement(name: str, parsed: MigName | None) -> None:
    assert parse_mig_name(name) == parsed


# -- the join, one device at a time --------------------------------------------------


def test_a_full_gpu_and_a_static_mig_device_join_by_their_uuid() -> None:
    slices = _of(_slices(NODE_SLICE))
    gpu = _join(_dra("a", "gpu-1"), slices)
    assert (gpu.outcome, gpu.key) == (Outcome.UUID, GPU[1])
    mig = _join(_dra("b", "gpu-2-mig-1g10gb-19-0"), slices)
    assert (mig.outcome, mig.key) == (Outcome.UUID, MIG_STATIC)
    assert mig.detail == f"{MIG_STATIC}, by its ResourceSlice's uuid"


def test_a_dynamic_mig_device_joins_by_its_gpu_and_placement() -> None:
    joined = _join(_dra("c", "gpu-2-mig-1g10gb-19-3"), _of(_slices(NODE_SLICE)))
    assert (joined.outcome, joined.key) == (Outcome.PLACEMENT, MIG_DYNAMIC)
    assert joined.detail == f"{MIG_DYNAMIC}, by its placement start 3 (profile 19) on {GPU[2]}"
    older = resource_slice(NODE, [mig_device(2, parent_uuid=GPU[2], start=3, legacy_size=1)])
    joined = _join(_dra("c", "gpu-2-mig-19-3-1"), _of(_slices(older)))
    assert (joined.outcome, joined.key) == (Outcome.PLACEMENT, MIG_DYNAMIC)


def test_a_placement_that_is_not_one_instance_is_never_guessed() -> None:
    slices = _of(_slices(NODE_SLICE))
    dynamic = _dra("c", "gpu-2-mig-1g10gb-19-3")
    # Not created yet (NVML reports no instance there).
    joined = _join(dynamic, slices, NVML[:4])
    assert joined.outcome == Outcome.PLACEMENT_UNMATCHED
    assert joined.detail.startswith("no MIG instance NVML reports is at placement start 3")
    # Another profile at that start: another device than the one allocated.
    other = msgspec.structs.replace(NVML[4], gpu_instance_profile_id=14)
    assert _join(dynamic, slices, [*NVML[:4], other]).outcome == Outcome.PLACEMENT_UNMATCHED
    # Two instances at one placement (two compute instances in one GPU instance).
    twin = msgspec.structs.replace(NVML[4], key=DeviceKey("MIG-twin"), uuid="MIG-twin")
    joined = _join(dynamic, slices, [*NVML, twin])
    assert (joined.outcome, joined.key) == (Outcome.PLACEMENT_UNMATCHED, None)
    assert "2 MIG instances NVML reports are at placement start 3" in joined.detail
    # NVML gave no placements for that GPU.
    blind = msgspec.structs.replace(NVML[4], placement_start=None)
    joined = _join(dynamic, slices, [*NVML[:4], blind])
    assert joined.detail == f"NVML does not give the placement of the MIG instances of {GPU[2]}"


@pytest.mark.parametrize(
    ("device", "slice_objects", "outcome", "detail"),
    [
        (
            _dra("a", "gpu-7"),
            [NODE_SLICE],
            Outcome.DEVICE_MISSING,
            f"pool {NODE} of {NVIDIA} (generation 1) has no device gpu-7",
        ),
        (
            _dra("a", "gpu-0", pool="node-b"),
            [NODE_SLICE],
            Outcome.POOL_MISSING,
            f"no ResourceSlice of driver {NVIDIA} on this node is of pool node-b",
        ),
        (
            _dra("a", "gpu-0"),
            [resource_slice(NODE, [gpu_device(0, GPU[0])], generation=2, count=2)],
            Outcome.POOL_INCOMPLETE,
            f"pool {NODE} of {NVIDIA} is incomplete: 1 of its 2 ResourceSlices of generation 2 "
            "seen",
        ),
        (
            _dra("a", "gpu-0"),
            [resource_slice(NODE, [gpu_device(0, "GPU-gone")])],
            Outcome.UUID_UNKNOWN,
            "its ResourceSlice names GPU-gone, which is no device NVML reports on this node "
            "(not guessed)",
        ),
        (
            _dra("a", "gpu-2-mig-1g10gb-19-3"),
            [resource_slice(NODE, [mig_device(2, parent_uuid="GPU-elsewhere", start=3)])],
            Outcome.UUID_UNKNOWN,
            "its ResourceSlice names parent GPU GPU-elsewhere, which NVML does not report on "
            "this node (not guessed)",
        ),
        (
            _dra("a", "gpu-0"),
            [resource_slice(NODE, [plain_device("gpu-0", {"type": {"string": "gpu"}})])],
            Outcome.NO_IDENTITY,
            f"device gpu-0 of pool {NODE} has no uuid attribute, and no MIG name with a "
            "parentUUID to find it by",
        ),
    ],
)
def test_a_gpu_that_cannot_be_identified_says_why(
    device: DraDevice, slice_objects: list[dict[str, Any]], outcome: Outcome, detail: str
) -> None:
    joined = _join(device, _of(_slices(*slice_objects)))
    assert (joined.outcome, joined.key, joined.detail) == (outcome, None, detail)


def test_without_usable_slices_every_gpu_says_so_and_other_drivers_are_not_gpus() -> None:
    reason = slices_unavailable_reason({}, None, NOW)
    assert reason == (
        "this node's ResourceSlices are unavailable: none has been read (is the DRA join on, "
        "--dra-join, and may the service account list and watch resourceslices?)"
    )
    slices = Slices.of(None, reason)
    gpu = _join(_dra("a", "gpu-0"), slices)
    assert (gpu.outcome, gpu.detail) == (Outcome.SLICES_UNAVAILABLE, reason)
    nic = _join(_dra("a", "eth1", driver="dra.net"), slices)
    assert nic.outcome == Outcome.NOT_A_GPU


def test_a_gpu_of_a_driver_not_configured_is_unidentified_a_nic_is_not_a_gpu() -> None:
    other = resource_slice(NODE, [gpu_device(0, GPU[0])], driver="gpu.example.com")
    nics = resource_slice(
        NODE, [plain_device("eth1", {"ifName": {"string": "eth1"}})], driver="dra.net"
    )
    slices = _of(_slices(other, nics))
    gpu = _join(_dra("a", "gpu-0", driver="gpu.example.com"), slices)
    assert gpu.outcome == Outcome.UNKNOWN_DRIVER
    assert gpu.detail == (
        f"its ResourceSlice names {GPU[0]}, a device NVML reports, but driver gpu.example.com "
        "is not among --dra-drivers: add it to join its devices"
    )
    nic = _join(_dra("a", "eth1", driver="dra.net"), slices)
    assert (nic.outcome, nic.key) == (Outcome.NOT_A_GPU, None)
    unseen = _join(_dra("a", "ch0", driver="compute-domain.nvidia.com"), slices)
    assert unseen.outcome == Outcome.NOT_A_GPU


def test_devices_joined_already_are_kept_as_they_are() -> None:
    decided = msgspec.structs.replace(
        _dra("a", "gpu-0"), outcome=Outcome.UUID, key=GPU[0], detail="by the agent"
    )
    devices = (decided,)
    assert join_devices(devices, Slices.of(None, "none"), {}) is devices


# -- decisions on a node agent -------------------------------------------------------


def _pod(name: str, namespace: str = "ml", **labels: str) -> PodInfo:
    return PodInfo(namespace=namespace, name=name, labels=labels, phase="Running", node=NODE)


PODS = [
    _pod("llm-0", app="llm", role="leader"),
    _pod("llm-1", app="llm"),
    _pod("llm-2", app="llm"),
    _pod("mig-0", app="mig"),
    _pod("mig-1", app="mig"),
    _pod("mixed-0", app="mixed"),
]


def _node_agent(
    dra: list[DraDevice],
    *,
    slices: ResourceSlicesReading | None = None,
    holders: tuple[DeviceHolder, ...] = (),
    extra: list[Sample] | None = None,
) -> Snapshot:
    """A node agent's snapshot after its samplers spoke, folded as the aggregator folds."""
    samples: list[Sample] = [
        *NVML,
        PodResourcesReading(
            source=POD_RESOURCES_SOURCE, taken_at=NOW, period_s=5.0, holders=holders, dra=tuple(dra)
        ),
        PodsReading(source=PODS_SOURCE, taken_at=NOW, period_s=10.0, node=NODE, pods=tuple(PODS)),
        *([] if slices is None else [slices]),
        *(extra or []),
    ]
    return fold(EMPTY_SNAPSHOT, samples, NOW)


def _value(snapshot: Snapshot, selector: str, **metadata: str) -> float:
    spec = parse_trigger({"podSelector": selector, "podNamespace": "ml", **metadata})
    return measure(spec, snapshot, NOW).value


def test_a_workload_on_dra_gpus_measures_its_own() -> None:
    snapshot = _node_agent(
        [
            _dra("llm-0", "gpu-0"),
            _dra("mig-0", "gpu-2-mig-1g10gb-19-0"),
            _dra("mig-1", "gpu-2-mig-1g10gb-19-3"),
        ],
        slices=_slices(NODE_SLICE),
    )
    assert _value(snapshot, "app=llm", metricType="gpu_utilization") == 80.0
    assert _value(snapshot, "app=mig", metricType="sm_active", aggregation="sum") == 120.0
    # Not 30 (GPU 1, nobody's), not 0.
    assert _value(snapshot, "app=llm", metricType="sm_active", aggregation="min") == 80.0


def test_a_claim_shared_by_three_pods_is_one_device_with_three_holders() -> None:
    shared = [_dra(f"llm-{i}", "gpu-0", claim="shared-gpu", share_id=None) for i in range(3)]
    snapshot = _node_agent(shared, slices=_slices(NODE_SLICE))
    spec = parse_trigger(
        {"podSelector": "app=llm", "podNamespace": "ml", "metricType": "gpu_utilization"}
    )
    decision = decide(spec, snapshot, None, NOW)
    assert decision.value == 80.0
    assert "GPU 0 (llm-0, llm-1, llm-2; shared)=80" in decision.explanation
    joined = attribute(snapshot)
    assert joined is not None
    assert [h.pod for h in joined.holders(DeviceKey(GPU[0]))] == ["llm-0", "llm-1", "llm-2"]
    # One of the three selected: the device is still its, shared with the other two.
    leader = parse_trigger(
        {"podSelector": "app=llm,role=leader", "podNamespace": "ml", "sharedDevices": "whole"}
    )
    one = decide(leader, snapshot, None, NOW)
    assert one.value == 80.0
    assert "GPU 0 (llm-0; shared with ml/llm-1, ml/llm-2)=80" in one.explanation


def test_a_pod_holding_a_gpu_that_cannot_be_identified_is_unavailable_never_zero() -> None:
    snapshot = _node_agent(
        [_dra("llm-0", "gpu-0"), _dra("llm-1", "gpu-7")], slices=_slices(NODE_SLICE)
    )
    with pytest.raises(NoData) as caught:
        _value(snapshot, "app=llm")
    assert str(caught.value) == (
        f"ml/llm-1 holds DRA device {NVIDIA}/{NODE}/gpu-7 of claim ml/llm-1-gpu, not "
        f"identified (device_missing: pool {NODE} of {NVIDIA} (generation 1) has no device "
        "gpu-7) (a GPU it holds is never counted as none)"
    )


def test_without_slices_a_dra_gpu_is_unavailable_naming_the_apis_answer() -> None:
    refused = SourceFault(
        source=RESOURCE_SLICES_SOURCE,
        key=None,
        at=NOW,
        reason="Kubernetes API: list /apis/resource.k8s.io/v1/resourceslices?fieldSelector="
        f"spec.nodeName={NODE} answered 403 Forbidden: resourceslices.resource.k8s.io is "
        "forbidden",
    )
    snapshot = _node_agent([_dra("llm-0", "gpu-0")], extra=[refused])
    with pytest.raises(
        NoData,
        match=r"slices_unavailable: this node's ResourceSlices are "
        r"unavailable: Kubernetes API: list .* answered 403 Forbidden",
    ):
        _value(snapshot, "app=llm")


def test_stale_slices_make_dra_gpus_unavailable_until_they_answer_again() -> None:
    snapshot = _node_agent([_dra("llm-0", "gpu-0")], slices=_slices(NODE_SLICE, at=NOW - 31))
    with pytest.raises(
        NoData,
        match=r"this node's ResourceSlices are stale: the Kubernetes API "
        r"last answered 31 s ago \(limit 30 s\)",
    ):
        _value(snapshot, "app=llm")
    again = fold(snapshot, [_slices(NODE_SLICE)], NOW)
    assert _value(again, "app=llm") == 80.0


def test_other_drivers_devices_leave_a_pods_plugin_gpus_measured() -> None:
    nics = resource_slice(NODE, [plain_device("eth1")], driver="dra.net")
    snapshot = _node_agent(
        [_dra("mixed-0", "eth1", driver="dra.net")],
        slices=_slices(NODE_SLICE, nics),
        holders=(
            DeviceHolder(
                namespace="ml",
                pod="mixed-0",
                container="main",
                resource="nvidia.com/gpu",
                device_id=GPU[1],
            ),
        ),
    )
    assert _value(snapshot, "app=mixed") == 30.0


def test_a_join_that_changes_rebuilds_the_index_and_one_that_does_not_keeps_it() -> None:
    before = _node_agent([_dra("llm-0", "gpu-2-mig-1g10gb-19-3")], slices=_slices(NODE_SLICE))
    # Another NVML cycle joins the same: the index (and every scope over it) is kept.
    again = fold(before, NVML, NOW + 1)
    assert again.nodes[""].by_pod is before.nodes[""].by_pod
    assert again.nodes[""].dra is before.nodes[""].dra
    # The driver republishes without the device: the join changes, and so does the index.
    republished = resource_slice(NODE, [gpu_device(0, GPU[0])], generation=2)
    after = fold(before, [_slices(republished)], NOW + 1)
    (device,) = after.nodes[""].dra
    assert device.outcome == Outcome.DEVICE_MISSING
    assert after.nodes[""].by_pod is not before.nodes[""].by_pod


# -- decisions on a cluster scaler, from the agent's stream ---------------------------


def _through_the_stream(agent: Snapshot) -> list[Sample]:
    """What a cluster scaler's link publishes of the agent's first update."""
    builder = UpdateBuilder()
    readings = builder.update(agent, NOW)
    assert readings is not None
    reader = StreamReader(expected_node=NODE)
    identity = proto.NodeUpdate(identity=proto.NodeIdentity(NODE, "test", 1.0, 1.0))
    reader.receive(decode_update(bytes(identity)), NOW)
    data = bytes(proto.NodeUpdate(readings=readings))
    return list(reader.receive(decode_update(data), NOW))


def test_a_cluster_scaler_reads_the_agents_join_without_reading_slices() -> None:
    shared = [_dra(f"llm-{i}", "gpu-0", claim="shared-gpu") for i in range(3)]
    agent = _node_agent(
        [*shared, _dra("mig-0", "gpu-2-mig-1g10gb-19-7")], slices=_slices(NODE_SLICE)
    )
    cluster_pods = PodsReading(
        source=PODS_SOURCE, taken_at=NOW, period_s=10.0, node="", pods=tuple(PODS)
    )
    cluster = fold(EMPTY_SNAPSHOT, [*_through_the_stream(agent), cluster_pods], NOW)
    view = cluster.nodes[NODE]
    assert [d.outcome for d in view.dra] == ["uuid"] * 3 + ["device_missing"]
    spec = parse_trigger({"podSelector": "app=llm", "podNamespace": "ml"})
    decision = decide(spec, cluster, None, NOW)
    assert decision.value == 80.0
    assert f"{NODE} GPU 0 (llm-0, llm-1, llm-2; shared)=80" in decision.explanation
    with pytest.raises(
        NoData,
        match=r"ml/mig-0 holds DRA device .*gpu-2-mig-1g10gb-19-7 of "
        r"claim ml/mig-0-gpu, not identified \(device_missing: ",
    ):
        _value(cluster, "app=mig")


# -- what an operator sees -------------------------------------------------------------


def test_the_tap_shows_each_dra_device_with_its_join_and_share() -> None:
    dra = [
        _dra("llm-0", "gpu-0", claim="shared-gpu", share_id="4f1e-0"),
        _dra("llm-1", "gpu-0", claim="shared-gpu", share_id="4f1e-1"),
        _dra("llm-2", "gpu-7"),
    ]
    snapshot = _node_agent(dra, slices=_slices(NODE_SLICE))
    assert snapshot.attribution is not None
    event = json.loads(msgspec.json.encode(tap_attribution(snapshot.attribution, snapshot)))
    assert event["type"] == "attribution"
    shown = [(d["pod"], d["share_id"], d["key"], d["outcome"]) for d in event["dra"]]
    assert shown == [
        ("llm-0", "4f1e-0", GPU[0], "uuid"),
        ("llm-1", "4f1e-1", GPU[0], "uuid"),
        ("llm-2", None, None, "device_missing"),
    ]
    assert (
        event["dra"][2]["detail"] == f"pool {NODE} of {NVIDIA} (generation 1) has no device gpu-7"
    )
    (held,) = event["devices"]
    assert (held["key"], [h["pod"] for h in held["holders"]]) == (GPU[0], ["llm-0", "llm-1"])
    assert {h["resource"] for h in held["holders"]} == {NVIDIA}


@pytest.mark.anyio
async def test_the_tap_shows_the_slices_read_as_resource_slices_events() -> None:
    reading = _slices(NODE_SLICE)
    tap = Tap()
    with (
        tap.subscribe(TapFilter(source=RESOURCE_SLICES_SOURCE)) as slices,
        tap.subscribe(TapFilter(device="0")) as gpu_0,
    ):
        tap.folded([reading], fold(EMPTY_SNAPSHOT, [reading], NOW))
        tap.publish(NVML[0])  # a reading of GPU 0, which that filter is for
        event = json.loads(await slices.__anext__())
        assert json.loads(await gpu_0.__anext__())["type"] == "gpu"
    assert (event["type"], event["node"]) == ("resource-slices", NODE)
    (pool,) = event["pools"]
    assert [d["name"] for d in pool["devices"]][:2] == ["gpu-0", "gpu-1"]


@pytest.mark.anyio
async def test_metrics_count_dra_devices_joined_and_not_by_outcome() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from keda_gpu_scaler.serving.observability import SelfMetrics

    dra = [
        _dra("llm-0", "gpu-0"),
        _dra("llm-1", "gpu-0"),
        _dra("mig-1", "gpu-2-mig-1g10gb-19-3"),
        _dra("llm-2", "gpu-7"),
        _dra("mixed-0", "eth1", driver="dra.net"),
    ]
    snapshot = _node_agent(dra, slices=_slices(NODE_SLICE))
    metrics = SelfMetrics()
    metrics.read_live(lambda: snapshot, lambda: 0)
    series: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            series.setdefault(sample.name, []).append((sample.labels, sample.value))
    counts = {
        (labels["driver"], labels["result"], labels["outcome"]): value
        for labels, value in series["keda_gpu_scaler_dra_devices"]
    }
    assert counts == {
        ("dra.net", "not_a_gpu", "not_a_gpu"): 1.0,
        (NVIDIA, "joined", "placement"): 1.0,
        (NVIDIA, "joined", "uuid"): 2.0,
        (NVIDIA, "unidentified", "device_missing"): 1.0,
    }
    devices = {
        labels["pod"]: (labels["uuid"], labels["outcome"])
        for labels, _ in series["keda_gpu_scaler_pod_resources_dra_devices"]
    }
    assert devices["mig-1"] == (MIG_DYNAMIC, "placement")
    assert devices["llm-2"] == ("", "device_missing")
    # A joined DRA device is a holder of its GPU, like a device plugin's.
    info = [labels for labels, _ in series["keda_gpu_scaler_gpu_pod_info"]]
    assert {"pod": "mig-1", "uuid": MIG_DYNAMIC, "resource": NVIDIA} in [
        {k: i[k] for k in ("pod", "uuid", "resource")} for i in info
    ]
