"""``podSelector``: the decision over the GPUs held by a workload's pods, on hand-built
snapshots (the kubelet's answer and the pod watch as samples)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from keda_gpu_scaler.domain.attribution import attribute, device_key
from keda_gpu_scaler.domain.decision import decide, measure
from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData
from keda_gpu_scaler.domain.samples import (
    POD_RESOURCES_SOURCE,
    PODS_SOURCE,
    DeviceHolder,
    DeviceKey,
    DraDevice,
    GpuReading,
    PodInfo,
    PodResourcesReading,
    PodsReading,
    SourceFault,
)
from keda_gpu_scaler.domain.snapshot import EMPTY_SNAPSHOT, DeviceState, Snapshot
from keda_gpu_scaler.domain.trigger import parse_trigger
from keda_gpu_scaler.pipeline.state import fold
from keda_gpu_scaler.testing import snapshot_of

NOW = 100.0


def _gpu(index: int, utilization: float, **fields: Any) -> GpuReading:
    base = GpuReading(
        source="nvml",
        key=DeviceKey(f"GPU-{index}"),
        index=index,
        uuid=f"GPU-{index}",
        name="test",
        taken_at=NOW,
        period_s=1.0,
        gpu_utilization=utilization,
        temperature_c=40.0 + index,
    )
    return msgspec.structs.replace(base, **fields)


def _mig(parent: int, gi: int, utilization: float) -> GpuReading:
    uuid = f"MIG-{parent}-{gi}"
    return _gpu(
        parent,
        utilization,
        key=DeviceKey(uuid),
        uuid=uuid,
        parent_index=parent,
        parent_uuid=f"GPU-{parent}",
        gpu_instance_id=gi,
        compute_instance_id=0,
        temperature_c=60.0,
    )


def _holder(ns: str, pod: str, device_id: str, resource: str = "nvidia.com/gpu") -> DeviceHolder:
    return DeviceHolder(
        namespace=ns, pod=pod, container="main", resource=resource, device_id=device_id
    )


def _pod(ns: str, name: str, phase: str = "Running", **labels: str) -> PodInfo:
    return PodInfo(namespace=ns, name=name, uid=f"uid-{name}", labels=labels, phase=phase)


def _snapshot(
    readings: list[GpuReading],
    holders: list[DeviceHolder] | None,
    pods: list[PodInfo] | None,
    *,
    attributed_at: float = NOW,
    listed_at: float = NOW,
    dra: tuple[DraDevice, ...] = (),
) -> Snapshot:
    return snapshot_of(
        (DeviceState(key=r.key, index=r.index, reading=r) for r in readings),
        attributions=()
        if holders is None
        else [
            PodResourcesReading(
                source=POD_RESOURCES_SOURCE,
                taken_at=attributed_at,
                period_s=5.0,
                holders=tuple(holders),
                dra=dra,
            )
        ],
        pods=None
        if pods is None
        else PodsReading(
            source=PODS_SOURCE, taken_at=listed_at, period_s=10.0, node="n1", pods=tuple(pods)
        ),
        published_at=NOW,
    )


# A node with 4 GPUs and a MIG GPU (index 4), three workloads and an idle notebook.
READINGS = [
    _gpu(0, 90.0),
    _gpu(1, 80.0),
    _gpu(2, 20.0),
    _gpu(3, 5.0),
    _mig(4, 1, 33.0),
    _mig(4, 2, 44.0),
]
HOLDERS = [
    _holder("ml", "train-0", "GPU-0"),
    _holder("ml", "train-0", "GPU-1"),
    _holder("serve", "vllm-a", "GPU-2::0"),  # time-sliced: two pods on GPU 2
    _holder("serve", "vllm-b", "GPU-2::1"),
    _holder("serve", "vllm-b", "MIG-4-1", "nvidia.com/mig-1g.18gb"),
    _holder("lab", "notebook", "GPU-3"),
    _holder("lab", "notebook", "MIG-4-2", "nvidia.com/mig-1g.18gb"),
]
PODS = [
    _pod("ml", "train-0", app="train"),
    _pod("serve", "vllm-a", app="vllm", tier="web"),
    _pod("serve", "vllm-b", app="vllm", tier="batch"),
    _pod("lab", "notebook", app="jupyter"),
]
NODE = _snapshot(READINGS, HOLDERS, PODS)


def _spec(namespace: str, **metadata: str) -> Any:
    return parse_trigger(metadata, namespace)


def test_each_workload_measures_only_its_own_gpus() -> None:
    train = measure(_spec("ml", podSelector="app=train"), NODE, NOW)
    vllm = measure(_spec("serve", podSelector="app=vllm"), NODE, NOW)
    notebook = measure(_spec("lab", podSelector="app=jupyter", aggregation="avg"), NODE, NOW)
    assert (train.value, vllm.value, notebook.value) == (90.0, 33.0, (5.0 + 44.0) / 2)
    assert [i for i, _ in train.parts] == [0, 1]
    # vllm: GPU 2 (shared by its two pods: counted once) and MIG 4:1
    assert sorted(v for _, v in vllm.parts) == [20.0, 33.0]


def test_without_pod_selector_every_gpu_counts_as_before() -> None:
    assert measure(_spec("serve"), NODE, NOW).value == 90.0


def test_a_device_shared_by_two_matching_pods_counts_once_and_says_so() -> None:
    spec = _spec("serve", podSelector="app=vllm", aggregation="sum")
    measured = measure(spec, NODE, NOW)
    assert measured.value == 53.0
    why = decide(spec, NODE, None, NOW).explanation
    assert "GPU 2 (vllm-a, vllm-b; shared)=20" in why
    assert "MIG 4:1 (vllm-b)=33" in why
    assert "pods app=vllm in serve" in why


def test_a_device_shared_with_a_pod_outside_the_selector_names_it() -> None:
    spec = _spec("serve", podSelector="app=vllm,tier=web", sharedDevices="whole")
    why = decide(spec, NODE, None, NOW).explanation
    assert measure(spec, NODE, NOW).value == 20.0
    assert "GPU 2 (vllm-a; shared with serve/vllm-b)=20" in why


def test_a_device_shared_with_another_workload_is_never_counted_whole_by_default() -> None:
    # By default the workload's own processes are measured; this node has no per-process
    # reading of GPU 2, so there is no value rather than vllm-b's load as vllm-a's.
    with pytest.raises(NoData) as caught:
        measure(_spec("serve", podSelector="app=vllm,tier=web"), NODE, NOW)
    assert str(caught.value) == (
        "GPU 2 is shared with serve/vllm-b, and it has no per-process reading yet; "
        "sharedDevices: whole measures the whole device, its neighbours' load included"
    )


def test_parent_readings_of_a_mig_gpu_count_once_per_gpu() -> None:
    holders = [*HOLDERS, _holder("lab", "notebook", "MIG-4-3", "nvidia.com/mig-1g.18gb")]
    snapshot = _snapshot([*READINGS, _mig(4, 3, 10.0)], holders, PODS)
    spec = _spec("lab", podSelector="app=jupyter", metricType="temperature", aggregation="sum")
    measured = measure(spec, snapshot, NOW)
    # GPU 3 (43 C) and the MIG GPU 4 once (60 C), although two of its instances are held.
    assert measured.value == 43.0 + 60.0
    assert measured.labels == ("GPU 3 (notebook)", "GPU 4 (notebook)")


def test_no_matching_pod_is_zero_and_inactive_with_a_reason() -> None:
    spec = _spec("serve", podSelector="app=nothing")
    decision = decide(spec, NODE, None, NOW)
    assert (decision.value, decision.active) == (0.0, False)
    assert "no pod app=nothing in serve holds a GPU" in decision.explanation
    assert "a workload with no pods uses no GPU" in decision.explanation


def test_matching_pods_without_a_gpu_are_zero_and_named() -> None:
    pods = [*PODS, _pod("serve", "proxy", app="proxy")]
    spec = _spec("serve", podSelector="app=proxy")
    decision = decide(spec, _snapshot(READINGS, HOLDERS, pods), None, NOW)
    assert decision.value == 0.0
    assert "pods app=proxy in serve (proxy) hold no GPU" in decision.explanation


def test_the_namespace_is_the_scaled_objects_unless_pod_namespace_names_one() -> None:
    assert measure(_spec("ml", podSelector="app=vllm"), NODE, NOW).value == 0.0
    spec = _spec("ml", podSelector="app=vllm", podNamespace="serve")
    assert measure(spec, NODE, NOW).value == 33.0


def test_terminated_pods_never_count() -> None:
    pods = [_pod("ml", "train-0", "Succeeded", app="train"), *PODS[1:]]
    measured = measure(
        _spec("ml", podSelector="app=train"), _snapshot(READINGS, HOLDERS, pods), NOW
    )
    assert measured.value == 0.0


def test_a_pod_not_yet_seen_by_the_watch_is_not_matched() -> None:
    pods = PODS[1:]  # train-0 holds GPUs 0 and 1, but its labels are unknown yet
    assert (
        measure(_spec("ml", podSelector="app=train"), _snapshot(READINGS, HOLDERS, pods), NOW).value
        == 0.0
    )


def test_a_device_id_that_matches_no_nvml_device_is_unavailable_not_guessed() -> None:
    holders = [*HOLDERS, _holder("ml", "train-0", "nvidia0")]
    snapshot = _snapshot(READINGS, holders, PODS)
    with pytest.raises(
        NoData, match=r"train-0 holds nvidia.com/gpu nvidia0: no GPU .* \(not guessed\)"
    ):
        measure(_spec("ml", podSelector="app=train"), snapshot, NOW)
    joined = attribute(snapshot)
    assert joined is not None
    assert [h.device_id for h in joined.unmatched] == ["nvidia0"]
    # Another workload is not affected.
    assert measure(_spec("serve", podSelector="app=vllm"), snapshot, NOW).value == 33.0


@pytest.mark.parametrize(
    ("holders", "pods", "message"),
    [
        (None, PODS, "pod attribution is unavailable: the kubelet PodResources API has not"),
        (HOLDERS, None, "pod labels are unavailable: the Kubernetes API has not answered"),
    ],
)
def test_missing_attribution_or_labels_is_unavailable_never_zero(
    holders: list[DeviceHolder] | None, pods: list[PodInfo] | None, message: str
) -> None:
    with pytest.raises(NoData, match=message):
        measure(_spec("ml", podSelector="app=train"), _snapshot(READINGS, holders, pods), NOW)


def test_stale_attribution_or_labels_are_unavailable() -> None:
    stale = _snapshot(READINGS, HOLDERS, PODS, attributed_at=NOW - 16.0)
    with pytest.raises(NoData, match=r"pod attribution is stale: .* 16 s old \(limit 15 s\)"):
        measure(_spec("ml", podSelector="app=train"), stale, NOW)
    quiet = _snapshot(READINGS, HOLDERS, PODS, listed_at=NOW - 31.0)
    with pytest.raises(NoData, match=r"pod labels are stale: .* 31 s ago \(limit 30 s\)"):
        measure(_spec("ml", podSelector="app=train"), quiet, NOW)
    # Still fresh just inside the limits.
    fresh = _snapshot(READINGS, HOLDERS, PODS, attributed_at=NOW - 14.0, listed_at=NOW - 29.0)
    measured = measure(_spec("ml", podSelector="app=train"), fresh, NOW)
    assert measured.fresh_until == NOW - 14.0 + 15.0


def test_the_kubelets_fault_is_the_reason_once_the_last_answer_is_stale() -> None:
    snapshot = fold(EMPTY_SNAPSHOT, [*READINGS], NOW)
    first = PodResourcesReading(
        source=POD_RESOURCES_SOURCE, taken_at=NOW, period_s=5.0, holders=tuple(HOLDERS)
    )
    pods = PodsReading(source=PODS_SOURCE, taken_at=NOW, period_s=10.0, node="n", pods=tuple(PODS))
    snapshot = fold(snapshot, [first, pods], NOW)
    refused = SourceFault(
        source=POD_RESOURCES_SOURCE,
        key=None,
        at=NOW + 1,
        reason="kubelet PodResources List failed: rate limited (RESOURCE_EXHAUSTED)",
    )
    snapshot = fold(snapshot, [refused], NOW + 1)
    readings = [msgspec.structs.replace(r, taken_at=NOW + 14) for r in READINGS]
    snapshot = fold(snapshot, readings, NOW + 14)
    # The last good answer holds until it is stale (three intervals)...
    assert measure(_spec("ml", podSelector="app=train"), snapshot, NOW + 14).value == 90.0
    readings = [msgspec.structs.replace(r, taken_at=NOW + 16) for r in READINGS]
    snapshot = fold(snapshot, readings, NOW + 16)
    with pytest.raises(NoData, match=r"stale.*RESOURCE_EXHAUSTED"):
        measure(_spec("ml", podSelector="app=train"), snapshot, NOW + 16)


def test_a_stale_gpu_of_the_workload_is_unavailable_but_not_another_workloads() -> None:
    readings = [
        msgspec.structs.replace(r, taken_at=NOW - 5) if r.index == 3 else r for r in READINGS
    ]
    snapshot = _snapshot(readings, HOLDERS, PODS)
    with pytest.raises(NoData, match="GPU 3 reading is stale"):
        measure(_spec("lab", podSelector="app=jupyter"), snapshot, NOW)
    assert measure(_spec("ml", podSelector="app=train"), snapshot, NOW).value == 90.0


@pytest.mark.parametrize(
    ("metadata", "key", "message"),
    [
        ({"podSelector": ""}, "podSelector", "leave the key out"),
        ({"podSelector": "app in (a"}, "podSelector", ""),
        ({"podSelector": "app=x", "gpuIndex": "0"}, "podSelector", "gpuIndex"),
        ({"podSelector": "app=x", "migInstance": "0:1"}, "podSelector", "migInstance"),
        (
            {
                "podSelector": "app=x",
                "metricType": "vllm_queue_depth",
                "vllmEndpoint": "http://127.0.0.1:8000/metrics",
            },
            "podSelector",
            "engine endpoint",
        ),
        ({"podSelector": "app=x", "podNamespace": "Bad_NS"}, "podNamespace", "RFC 1123"),
    ],
)
def test_bad_pod_keys_name_the_key_and_the_value(
    metadata: dict[str, str], key: str, message: str
) -> None:
    with pytest.raises(InvalidTrigger) as caught:
        parse_trigger(metadata, "serve")
    assert caught.value.key == key
    assert message in str(caught.value)
    assert caught.value.value == metadata[key]


def test_pod_namespace_without_selector_is_a_warning() -> None:
    spec = parse_trigger({"podNamespace": "serve"}, "ml")
    assert spec.pod_selector is None
    assert any("podNamespace" in w for w in spec.warnings)


def test_no_namespace_at_all_is_refused() -> None:
    with pytest.raises(InvalidTrigger, match="missing podNamespace"):
        parse_trigger({"podSelector": "app=x"}, "")


def test_equal_selectors_make_equal_specs() -> None:
    a = parse_trigger({"podSelector": "app=vllm,tier in (b,a)"}, "serve")
    b = parse_trigger({"podSelector": "tier in (a, b), app==vllm"}, "serve")
    assert a == b
    assert hash(a) == hash(b)


@pytest.mark.parametrize(
    ("device_id", "key"),
    [
        ("GPU-abc", "GPU-abc"),
        ("MIG-abc", "MIG-abc"),
        ("GPU-abc::3", "GPU-abc"),
        ("MIG-x::0", "MIG-x"),
    ],
)
def test_device_ids_name_nvml_keys(device_id: str, key: str) -> None:
    assert device_key(device_id) == key


@pytest.mark.anyio
async def test_metrics_show_holders_unmatched_ids_and_dra_devices() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from keda_gpu_scaler.serving.observability import SelfMetrics

    dra = DraDevice(
        namespace="lab",
        pod="notebook",
        container="main",
        claim_namespace="lab",
        claim_name="gpu-claim",
        driver="gpu.nvidia.com",
        pool="node-a",
        device="gpu-0",
    )
    snapshot = _snapshot(
        READINGS, [*HOLDERS, _holder("ml", "train-0", "nvidia0")], PODS, dra=(dra,)
    )
    metrics = SelfMetrics()
    metrics.read_live(lambda: snapshot, lambda: 0)
    series: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            series.setdefault(sample.name, []).append(sample.labels)
    info = series["keda_gpu_scaler_gpu_pod_info"]
    assert len(info) == len(HOLDERS)
    assert {
        "index": "4",
        "uuid": "MIG-4-1",
        "mig_instance": "4:1",
        "namespace": "serve",
        "pod": "vllm-b",
        "container": "main",
        "resource": "nvidia.com/mig-1g.18gb",
        "device_id": "MIG-4-1",
    } in info
    assert series["keda_gpu_scaler_pod_resources_unmatched_devices"] == [
        {
            "namespace": "ml",
            "pod": "train-0",
            "container": "main",
            "resource": "nvidia.com/gpu",
            "device_id": "nvidia0",
        }
    ]
    (row,) = series["keda_gpu_scaler_pod_resources_dra_devices"]
    assert (row["claim"], row["driver"], row["pool"], row["device"]) == (
        "lab/gpu-claim",
        "gpu.nvidia.com",
        "node-a",
        "gpu-0",
    )
