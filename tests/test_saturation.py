"""Saturation: a demand above what the replicas can serve reads the bound on each device, and
the rest waits in the queue metrics of the same load (docs/simulate.md, "Saturation")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keda_gpu_scaler.app.simulate.command import Simulation
from keda_gpu_scaler.app.simulate.feeds import LoadFeed, engine_share, gpu_share
from keda_gpu_scaler.app.simulate.inputs import BadInput
from keda_gpu_scaler.app.simulate.load import POWER_LIMIT_W, TOTAL_MIB, read_load
from keda_gpu_scaler.app.simulate.runner import HPA
from keda_gpu_scaler.domain.catalog import (
    CATALOG,
    QUEUES,
    Bound,
    DeviceLimits,
    MetricType,
    Origin,
)
from keda_gpu_scaler.domain.engines import Discovery
from keda_gpu_scaler.domain.samples import DeviceKey, GpuReading
from tests.test_simulate import put, scaled_object, simulate


def _load(tmp_path: Path, metrics: dict[str, Any], *, gpus: int = 1, duration: float = 120) -> Any:
    doc = {"duration": duration, "gpus": gpus, "metrics": metrics}
    return read_load(put(tmp_path, "load.yaml", doc))


def _demand(value: float) -> dict[str, Any]:
    return {"demand": True, "steps": [{"at": 0, "value": value}]}


def _trigger(metadata: dict[str, str], metric_type: str = "Value") -> dict[str, Any]:
    return {
        "type": "external",
        "metricType": metric_type,
        "metadata": {"scalerAddress": "scaler:6000", "cooldownSeconds": "0", **metadata},
    }


GPU_VALUE_50 = _trigger({"metricName": "gpu", "metricType": "gpu_utilization", "targetValue": "50"})
QUEUE_AVERAGE_10 = _trigger(
    {
        "metricName": "queue",
        "metricType": "vllm_queue_depth",
        "vllmEndpoint": "http://vllm.llm.svc:8000/metrics",
        "endpointDiscovery": "dns",
        "targetValue": "10",
    },
    "AverageValue",
)


def _simulate(
    tmp_path: Path, triggers: list[dict[str, Any]], metrics: dict[str, Any]
) -> Simulation:
    so = scaled_object(maxReplicaCount=8, pollingInterval=15, triggers=triggers)
    return simulate(tmp_path, so, {"duration": 90, "metrics": metrics})


# -- the catalog's bounds -----------------------------------------------------------------


def test_every_percentage_is_bounded_at_100_memory_and_power_by_the_device() -> None:
    device = DeviceLimits(memory_mib=81_559.0, power_limit_w=700.0)
    for info in CATALOG.values():
        if info.unit == "percent":
            assert (info.bound, info.limit(device)) == (Bound.PERCENT, 100.0), info.type
    memory, power = CATALOG[MetricType.MEMORY_USED_MIB], CATALOG[MetricType.POWER_DRAW]
    assert (memory.bound, memory.limit(device)) == (Bound.DEVICE_MEMORY, 81_559.0)
    assert (power.bound, power.limit(device)) == (Bound.POWER_LIMIT, 700.0)
    # A device whose limits are unknown bounds nothing it does not know.
    assert memory.limit(DeviceLimits()) is None


def test_counts_queues_rates_and_temperatures_have_no_bound() -> None:
    unbounded = {info.type for info in CATALOG.values() if info.bound is Bound.NONE}
    assert unbounded >= QUEUES
    assert {MetricType.TEMPERATURE, MetricType.TRITON_REQUEST_RATE} <= unbounded
    assert all(CATALOG[q].origin is not Origin.GPU for q in QUEUES)


def test_a_readings_limits_are_its_memory_and_power_limit() -> None:
    reading = GpuReading(
        source="nvml",
        key=DeviceKey("GPU-a"),
        index=0,
        uuid="GPU-a",
        name="NVIDIA H200",
        taken_at=0.0,
        period_s=1.0,
        memory_total_bytes=143_771 * (1 << 20),
        power_limit_mw=700_000.0,
    )
    assert DeviceLimits.of(reading) == DeviceLimits(memory_mib=143_771.0, power_limit_w=700.0)


# -- what the devices read ------------------------------------------------------------------


def test_390_gpu_percent_over_one_replica_reads_100_and_the_rest_waits(tmp_path: Path) -> None:
    load = _load(
        tmp_path,
        {
            "gpu_utilization": _demand(390),
            "vllm_queue_depth": {"backlog": "gpu_utilization", "perRequest": 10},
        },
    )
    gpu, queue = load.metrics[MetricType.GPU_UTILIZATION], load.metrics[MetricType.VLLM_QUEUE_DEPTH]
    assert [gpu_share(gpu, 0, 0, n) for n in (1, 2, 4, 8)] == [100.0, 100.0, 97.5, 48.75]
    # What the replicas cannot serve: 290, 190, 0 GPU-percent, 10 a request.
    dns = [engine_share(queue, 0, n, Discovery.DNS) for n in (1, 2, 4, 8)]
    assert dns == [29.0, 19.0, 0.0, 0.0]
    # One engine's queue (a Service in front of the pods) holds its share of it.
    assert engine_share(queue, 0, 2, Discovery.STATIC) == 9.5
    # No engine runs at 0 replicas: no reading, as the scaler answers it.
    assert engine_share(queue, 0, 0, Discovery.DNS) is None


def test_a_routers_queue_holds_the_whole_backlog_with_or_without_replicas(tmp_path: Path) -> None:
    load = _load(
        tmp_path,
        {"gpu_utilization": _demand(250), "llmd_queue_size": {"backlog": "gpu_utilization"}},
    )
    router = load.metrics[MetricType.LLMD_QUEUE_SIZE]
    assert [engine_share(router, 0, n, Discovery.STATIC) for n in (0, 1, 2, 3)] == [
        250.0,
        150.0,
        50.0,
        0.0,
    ]


def test_memory_and_power_are_capped_at_the_simulated_devices(tmp_path: Path) -> None:
    load = _load(
        tmp_path,
        {"memory_used_mib": _demand(250_000), "power_draw": _demand(2_000)},
    )
    memory, power = load.metrics[MetricType.MEMORY_USED_MIB], load.metrics[MetricType.POWER_DRAW]
    assert [gpu_share(memory, 0, 0, n) for n in (1, 2, 3, 5)] == [
        TOTAL_MIB,
        TOTAL_MIB,
        250_000 / 3,
        50_000,
    ]
    assert [gpu_share(power, 0, 0, n) for n in (1, 2, 4)] == [POWER_LIMIT_W, POWER_LIMIT_W, 500.0]
    # What the scaler then reads from the simulated GPU: the same, in its own units.
    (device,) = LoadFeed(load).advance(0, 1).devices.values()
    assert device.reading is not None
    memory_read, power_read = (
        CATALOG[MetricType.MEMORY_USED_MIB].read,
        CATALOG[MetricType.POWER_DRAW].read,
    )
    assert memory_read is not None and power_read is not None
    assert (memory_read(device.reading), power_read(device.reading)) == (TOTAL_MIB, POWER_LIMIT_W)


def test_a_backlog_drains_as_replicas_come(tmp_path: Path) -> None:
    load = _load(
        tmp_path,
        {
            "gpu_utilization": {
                "demand": True,
                "steps": [{"at": 0, "value": 300}, {"at": 60, "value": 120}],
            },
            "trtllm_queue_depth": {"backlog": "gpu_utilization", "perRequest": 20},
        },
    )
    queue = load.metrics[MetricType.TRTLLM_QUEUE_DEPTH]
    assert engine_share(queue, 30, 1, Discovery.DNS) == 10.0
    # Less demand, or one more replica: what was waiting runs.
    assert engine_share(queue, 60, 1, Discovery.DNS) == 1.0
    assert engine_share(queue, 60, 2, Discovery.DNS) == 0.0


def test_per_gpu_demands_each_add_their_excess(tmp_path: Path) -> None:
    load = _load(
        tmp_path,
        {
            "sm_active": {
                "demand": True,
                "gpus": [
                    {"steps": [{"at": 0, "value": 180}]},
                    {"steps": [{"at": 0, "value": 90}]},
                ],
            },
            "sglang_queue_requests": {"backlog": "sm_active"},
        },
        gpus=2,
    )
    queue = load.metrics[MetricType.SGLANG_QUEUE_REQUESTS]
    assert engine_share(queue, 0, 1, Discovery.DNS) == 80.0  # 80 above the first GPU's 100


# -- what the HPA does with it ------------------------------------------------------------


def test_a_value_trigger_doubles_while_saturated(tmp_path: Path) -> None:
    """390 GPU-percent over one replica reads 100: the HPA asks for 2, then 4, then 8
    (a reading of 390 would have asked for 8 at once)."""
    result = _simulate(tmp_path, [GPU_VALUE_50], {"gpu_utilization": _demand(390)})
    syncs = [s for s in result.steps if s.by == HPA]
    assert [(s.t, s.triggers[0].value, s.replicas) for s in syncs[:4]] == [
        (0, 100.0, 2),
        (15, 100.0, 4),
        (30, 97.5, 8),
        (45, 48.75, 8),
    ]


def test_a_queue_trigger_jumps_on_what_waits(tmp_path: Path) -> None:
    metrics = {
        "gpu_utilization": _demand(390),
        "vllm_queue_depth": {"backlog": "gpu_utilization", "perRequest": 2.5},
    }
    result = _simulate(tmp_path, [QUEUE_AVERAGE_10], metrics)
    first = next(s for s in result.steps if s.by == HPA)
    # 290 GPU-percent waiting, 2.5 a request: 116 requests, 10 a replica: 12, the older
    # rule's limit of the first sync (max(2 × 1, 4)) lets 4 through, then 8.
    assert (first.triggers[0].value, first.desired, first.replicas) == (116.0, 12, 4)
    second = [s for s in result.steps if s.by == HPA][1]
    assert (second.triggers[0].value, second.replicas) == (0.0, 8)


BAD_BACKLOGS = [
    (
        {"gpu_utilization": _demand(100), "vllm_running_requests": {"backlog": "gpu_utilization"}},
        "vllm_running_requests counts no waiting requests",
    ),
    (
        {"vllm_queue_depth": {"backlog": "gpu_utilization"}},
        "backlog: gpu_utilization is not a metric of this load",
    ),
    (
        {
            "gpu_utilization": {"steps": [{"at": 0, "value": 50}]},
            "vllm_queue_depth": {"backlog": "gpu_utilization"},
        },
        "gpu_utilization must be a demand (demand: true) with a bound per device",
    ),
    (
        {"vllm_queue_depth": _demand(4), "tgi_queue_size": {"backlog": "vllm_queue_depth"}},
        "vllm_queue_depth must be a demand (demand: true) with a bound",
    ),
    (
        {
            "gpu_utilization": _demand(100),
            "vllm_queue_depth": {"backlog": "gpu_utilization", "perRequest": 0},
        },
        "perRequest: 0 must be a positive number",
    ),
    (
        {
            "gpu_utilization": _demand(100),
            "vllm_queue_depth": {"backlog": "gpu_utilization", "demand": True},
        },
        "a backlog reads another metric; give no steps, gpus or demand",
    ),
    (
        {"gpu_utilization": {**_demand(100), "perRequest": 4}},
        "perRequest: only a backlog (backlog: METRIC) has one",
    ),
    (
        {"power_draw": {"steps": [{"at": 0, "value": 900}]}},
        "900 is above 700, the most power_draw reads (W)",
    ),
]


@pytest.mark.parametrize(("metrics", "message"), BAD_BACKLOGS)
def test_a_bad_backlog_is_refused_naming_the_field(
    tmp_path: Path, metrics: dict[str, Any], message: str
) -> None:
    with pytest.raises(BadInput) as caught:
        _load(tmp_path, metrics)
    assert message in str(caught.value)
