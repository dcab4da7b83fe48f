"""``keda-gpu-scaler simulate``: the load format, the ScaledObject it reads, the timing, the
outputs, and the examples of docs/simulate.md."""

from __future__ import annotations

import io
import json
import re
import shlex
import struct
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from keda_gpu_scaler.app import cli
from keda_gpu_scaler.app.simulate.command import Simulation, run_simulate, run_simulation
from keda_gpu_scaler.app.simulate.feeds import (
    LoadFeed,
    engine_share,
    gpu_share,
)
from keda_gpu_scaler.app.simulate.inputs import BadInput
from keda_gpu_scaler.app.simulate.load import read_load
from keda_gpu_scaler.app.simulate.png import encode_png
from keda_gpu_scaler.app.simulate.runner import HPA, KEDA, PUSH
from keda_gpu_scaler.domain.aggregation import Aggregation
from keda_gpu_scaler.domain.catalog import CATALOG, MetricType, Origin
from keda_gpu_scaler.domain.engines import Discovery
from keda_gpu_scaler.models.reach import replica_ceiling, unreachable_max
from tests.k8s_tools import validate

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"
DOC = ROOT / "docs" / "simulate.md"


def scaled_object(**spec: Any) -> dict[str, Any]:
    """A ScaledObject with one gpu_utilization trigger (Value, target 50, no cooldown)."""
    trigger = {
        "type": "external",
        "metricType": "Value",
        "metadata": {
            "scalerAddress": "scaler:6000",
            "metricName": "gpu",
            "metricType": "gpu_utilization",
            "targetValue": "50",
            "cooldownSeconds": "0",
        },
    }
    body: dict[str, Any] = {
        "scaleTargetRef": {"name": "app"},
        "minReplicaCount": 1,
        "maxReplicaCount": 10,
        "pollingInterval": 30,
        "triggers": [trigger],
    }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "app", "namespace": "default"},
        "spec": body | spec,
    }


def load(duration: float = 60, **metrics: Any) -> dict[str, Any]:
    return {"duration": duration, "gpus": 1, "metrics": metrics}


def put(tmp_path: Path, name: str, doc: Any) -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def simulate(tmp_path: Path, so: dict[str, Any], ld: dict[str, Any]) -> Simulation:
    return run_simulation(put(tmp_path, "so.yaml", so), load=put(tmp_path, "load.yaml", ld))


def steady(value: float | None, *, demand: bool = False) -> dict[str, Any]:
    return {"demand": demand, "steps": [{"at": 0, "value": value}]}


def values(result: Simulation, by: str | None = None) -> list[tuple[float, float | None]]:
    return [(s.t, s.triggers[0].value) for s in result.steps if by is None or s.by == by]


# -- the load format ---------------------------------------------------------------------


def test_steps_hold_ramps_go_linearly_and_null_is_no_reading(tmp_path: Path) -> None:
    steps = [
        {"at": 0, "value": 40},
        {"at": 60, "ramp": {"to": 310, "over": 300}},
        {"at": 500, "value": None},
    ]
    parsed = read_load(
        put(tmp_path, "l.yaml", load(1200, gpu_utilization={"demand": True, "steps": steps}))
    )
    metric = parsed.metrics[MetricType.GPU_UTILIZATION]
    # 40 until the ramp; halfway through it 40 + 270 / 2; then 310 holds until null.
    samples = {t: metric.raw(t) for t in (0, 59.5, 60, 210, 360, 499, 500, 1199)}
    assert samples == {0: 40, 59.5: 40, 60: 40, 210: 175, 360: 310, 499: 310, 500: None, 1199: None}
    assert parsed.initial_replicas is None
    assert parsed.gpus == 1


def test_a_ramp_starts_from_a_ramp_under_way(tmp_path: Path) -> None:
    steps = [
        {"at": 0, "value": 0},
        {"at": 10, "ramp": {"to": 100, "over": 100}},
        {"at": 60, "ramp": {"to": 0, "over": 10}},
    ]
    metric = read_load(put(tmp_path, "l.yaml", load(120, sm_active={"steps": steps}))).metrics[
        MetricType.SM_ACTIVE
    ]
    # At 60 the first ramp is at 50: the second goes from 50 to 0 in 10 s.
    assert [metric.raw(t) for t in (60, 65, 70, 100)] == [50, 25, 0, 0]


def test_one_series_per_gpu(tmp_path: Path) -> None:
    doc = load(
        30,
        gpu_utilization={
            "gpus": [{"steps": [{"at": 0, "value": 10}]}, {"steps": [{"at": 0, "value": 70}]}]
        },
    )
    doc["gpus"] = 2
    metric = read_load(put(tmp_path, "l.yaml", doc)).metrics[MetricType.GPU_UTILIZATION]
    assert [metric.raw(5, gpu) for gpu in (0, 1)] == [10, 70]


BAD_LOADS = [
    ({"duration": 60, "metrics": {"gpu_utilization": steady(1)}, "gpu": 2}, "unknown field `gpu`"),
    (load(0, gpu_utilization=steady(1)), "duration 0: must be above 0"),
    (load(90000, gpu_utilization=steady(1)), "at most 86400"),
    (load(60), "metrics: give at least one metric type"),
    (
        load(gpu_utilisation=steady(1)),
        "'gpu_utilisation' is not a metricType of this scaler; did you mean gpu_utilization?",
    ),
    (
        load(gpu_utilization={"steps": [{"at": 5, "value": 1}]}),
        "metrics.gpu_utilization.steps[0].at: the first step is at 0",
    ),
    (
        load(gpu_utilization={"steps": [{"at": 0, "value": 1}, {"at": 0, "value": 2}]}),
        "steps[1].at: 0 must be after the step before (0)",
    ),
    (
        load(gpu_utilization={"steps": [{"at": 0, "value": 1}, {"at": 60, "value": 2}]}),
        "steps[1].at: 60 is not before the end (60 s)",
    ),
    (load(gpu_utilization={"steps": [{"at": 0}]}), "steps[0]: give either value or ramp"),
    (
        load(gpu_utilization={"steps": [{"at": 0, "value": 1, "ramp": {"to": 2, "over": 5}}]}),
        "steps[0]: give either value or ramp",
    ),
    (
        load(
            gpu_utilization={
                "steps": [{"at": 0, "value": None}, {"at": 10, "ramp": {"to": 5, "over": 5}}]
            }
        ),
        "steps[1].ramp: a ramp starts from a value in effect, and none is",
    ),
    (
        load(
            gpu_utilization={
                "steps": [{"at": 0, "value": 1}, {"at": 10, "ramp": {"to": 5, "over": 0}}]
            }
        ),
        "steps[1].ramp.over: 0 must be a positive duration",
    ),
    (load(gpu_utilization=steady(-1)), "steps[0].value: -1 must be a finite number, 0 or more"),
    (
        load(gpu_utilization=steady(140)),
        "steps[0].value: 140 is above 100, the most gpu_utilization reads (percent)",
    ),
    (
        load(gpu_utilization={"steps": [{"at": 0, "value": "high"}]}),
        "steps[0].value: expected `float | null`, got `str`",
    ),
    (
        load(gpu_utilization={"steps": [{"at": 0, "value": 1}], "gpus": [{"steps": []}]}),
        "metrics.gpu_utilization: give either steps or gpus",
    ),
    (
        load(gpu_utilization={"gpus": [{"steps": [{"at": 0, "value": 1}]}] * 2}),
        "gpus: 2 series for 1 GPUs",
    ),
    (
        load(vllm_queue_depth={"gpus": [{"steps": [{"at": 0, "value": 1}]}]}),
        "an engine metric, with one series (steps)",
    ),
    (load(memory_used_mib=steady(10), memory_used_percent=steady(10)), "give one"),
    ("duration: [", "not YAML at line 1"),
    ("duration: 5\n---\nduration: 6\n", "expected one YAML document with a load, found 2"),
]


@pytest.mark.parametrize(("doc", "message"), BAD_LOADS)
def test_a_bad_load_is_refused_naming_the_field(tmp_path: Path, doc: Any, message: str) -> None:
    path = put(tmp_path, "load.yaml", doc)
    with pytest.raises(BadInput) as caught:
        read_load(path)
    text = str(caught.value)
    assert message in text
    assert text.startswith(f"{path}: ")
    assert "\n" not in text


def test_bad_input_is_one_line_on_stderr_and_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    so = put(tmp_path, "so.yaml", scaled_object())
    bad = put(tmp_path, "load.yaml", load(gpu_utilization=steady(140)))
    assert cli.main(["simulate", str(so), "--load", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("keda-gpu-scaler: ") and "140 is above 100" in err


# -- the ScaledObject --------------------------------------------------------------------


def _trigger(**changes: Any) -> dict[str, Any]:
    so = scaled_object()
    trigger = so["spec"]["triggers"][0]
    metadata = changes.pop("metadata", {})
    trigger.update(changes)
    trigger["metadata"].update(metadata)
    return so


BAD_SCALED_OBJECTS = [
    (
        scaled_object() | {"kind": "ScaledJob"},
        "only a ScaledObject (keda.sh/v1alpha1) is simulated",
    ),
    (scaled_object(pollingInterva=5), "unknown field `pollingInterva`"),
    (scaled_object(pollingInterval=0), "spec.pollingInterval: expected `int` >= 1"),
    (
        scaled_object(minReplicaCount=5, maxReplicaCount=2),
        "minReplicaCount 5 is above maxReplicaCount 2",
    ),
    (
        scaled_object(idleReplicaCount=1, minReplicaCount=1),
        "idleReplicaCount 1 must be less than minReplicaCount 1",
    ),
    (scaled_object(triggers=[]), "spec.triggers: at least one trigger is needed"),
    (_trigger(type="cpu"), "spec.triggers[0].type 'cpu': only this scaler's triggers"),
    (
        _trigger(metricType="Utilization"),
        "metricType Utilization: KEDA refuses it for external triggers",
    ),
    (
        _trigger(metricType="Average"),
        "spec.triggers[0].metricType 'Average': must be one of Value, AverageValue",
    ),
    (
        _trigger(metadata={"targetValue": "-3"}),
        'spec.triggers[0].metadata: invalid targetValue "-3": must be greater than 0',
    ),
    (
        _trigger(metadata={"targetValue": 70}),
        'metadata.targetValue: must be a string (quote it: "70")',
    ),
    (
        _trigger(metadata={"targetValueFromEnv": "TARGET"}),
        "targetValueFromEnv: needs the scale target's environment",
    ),
    (
        _trigger(metadata={"podSelector": "app=vllm"}),
        "metadata.podSelector: the simulator has no pods",
    ),
    (
        scaled_object(advanced={"scalingModifiers": {"formula": "a"}}),
        "scalingModifiers is not simulated",
    ),
    (
        scaled_object(
            fallback={"failureThreshold": 3, "replicas": 2, "behavior": "scalingModifiers"}
        ),
        "fallback.behavior scalingModifiers is not simulated",
    ),
    (scaled_object(fallback={"failureThreshold": 3}), "missing required field `replicas`"),
    (
        scaled_object(
            advanced={
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleUp": {"policies": [{"type": "Pod", "value": 1, "periodSeconds": 15}]}
                    }
                }
            }
        ),
        "behavior.scaleUp.policies[0].type 'Pod': must be one of Pods, Percent",
    ),
    (
        scaled_object(
            advanced={
                "horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {"policies": []}}}
            }
        ),
        "behavior.scaleDown.policies: give at least one policy",
    ),
    (
        scaled_object(
            advanced={
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleUp": {
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 1801}]
                        }
                    }
                }
            }
        ),
        "periodSeconds: expected `int` <= 1800",
    ),
    (
        scaled_object(
            advanced={
                "horizontalPodAutoscalerConfig": {"behavior": {"scaleUp": {"tolerance": "5%"}}}
            }
        ),
        "behavior.scaleUp.tolerance: '5%' is not a quantity such as 0.05 or 50m",
    ),
]


@pytest.mark.parametrize(("doc", "message"), BAD_SCALED_OBJECTS)
def test_a_scaled_object_it_cannot_simulate_is_refused_naming_the_field(
    tmp_path: Path, doc: dict[str, Any], message: str
) -> None:
    with pytest.raises(BadInput) as caught:
        simulate(tmp_path, doc, load(gpu_utilization=steady(1)))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_trigger_the_scaler_refuses_never_falls_back(tmp_path: Path) -> None:
    """kedacore/keda v2.21.0 pkg/scaling/scale_handler.go getScalerState: a GetMetricSpec
    error leaves the trigger without metric specs, and GetMetricsWithFallback
    (pkg/fallback/fallback.go) is reached only for a spec: no fallback (kedacore/keda#8056,
    open in 2.21). The simulator refuses such a trigger, and says why a fallback would not
    help."""
    so = _trigger(metadata={"targetValue": "0"})
    so["spec"]["fallback"] = {"failureThreshold": 3, "replicas": 4}
    with pytest.raises(BadInput) as caught:
        run_simulation(put(tmp_path, "so.yaml", so), load=put(tmp_path, "l.yaml", load()))
    text = str(caught.value)
    assert 'invalid targetValue "0"' in text
    assert "never falls back (kedacore/keda#8056)" in text
    assert "\n" not in text


def test_the_load_must_give_what_the_triggers_read(tmp_path: Path) -> None:
    with pytest.raises(
        BadInput,
        match=re.escape(
            "s0-gpu (spec.triggers[0]) reads gpu_utilization, which the load does not give"
        ),
    ):
        simulate(tmp_path, scaled_object(), load(sm_active=steady(1)))
    gpu_3 = _trigger(metadata={"gpuIndex": "3"})
    with pytest.raises(BadInput, match=r"reads gpuIndex 3; the load has 1 GPU \(0-0\)"):
        simulate(tmp_path, gpu_3, load(gpu_utilization=steady(1)))


def test_behavior_tolerance_quantities(tmp_path: Path) -> None:
    up = {"tolerance": "50m"}
    down = {"tolerance": 0.2, "stabilizationWindowSeconds": 0}
    so = scaled_object(
        advanced={"horizontalPodAutoscalerConfig": {"behavior": {"scaleUp": up, "scaleDown": down}}}
    )
    result = simulate(tmp_path, so, load(gpu_utilization=steady(53)))
    behavior = result.plan.hpa.behavior
    assert behavior is not None
    assert (behavior.scale_up.tolerance, behavior.scale_down.tolerance) == (0.05, 0.2)
    # 53 / 50 = 1.06 is above 1.05: one replica becomes ceil(1.06) = 2.
    assert [s.replicas for s in result.steps[:2]] == [1, 2]


# -- what the triggers read ----------------------------------------------------------------


def test_demand_is_shared_by_the_replicas_and_a_percentage_tops_at_100(tmp_path: Path) -> None:
    metric = read_load(
        put(tmp_path, "l.yaml", load(gpu_utilization=steady(310, demand=True)))
    ).metrics[MetricType.GPU_UTILIZATION]
    assert [gpu_share(metric, 0, 0, n) for n in (0, 1, 2, 4)] == [0.0, 100.0, 100.0, 77.5]


def test_an_engine_has_nothing_to_read_at_zero_replicas_and_dns_sums_counts(
    tmp_path: Path,
) -> None:
    metrics = read_load(
        put(
            tmp_path,
            "l.yaml",
            load(
                vllm_queue_depth=steady(40, demand=True),
                vllm_kv_cache_usage=steady(80, demand=True),
                llmd_queue_size=steady(40, demand=True),
            ),
        )
    ).metrics
    queue, cache = metrics[MetricType.VLLM_QUEUE_DEPTH], metrics[MetricType.VLLM_KV_CACHE_USAGE]
    static, dns = Discovery.STATIC, Discovery.DNS
    # No replica, no engine to scrape: no reading, as the server answers it (UNAVAILABLE).
    assert [engine_share(queue, 0, n, static) for n in (0, 1, 4)] == [None, 40, 10]
    # Behind a headless Service the scaler sums the pods' queues: the whole demand.
    assert [engine_share(queue, 0, n, dns) for n in (0, 1, 4)] == [None, 40, 40]
    # A level is the highest pod's: one share.
    assert engine_share(cache, 0, 4, dns) == 20
    # The router holds the demand while no replica runs; the pool takes it from one on.
    router = metrics[MetricType.LLMD_QUEUE_SIZE]
    assert [engine_share(router, 0, n, static) for n in (0, 1, 4)] == [40, 0, 0]


def test_the_routers_queue_activates_a_workload_at_zero_replicas(tmp_path: Path) -> None:
    router = {
        "type": "external",
        "metadata": {
            "scalerAddress": "scaler:6000",
            "profile": "llmd-queue",
            "llmdEndpoint": "http://epp.llm.svc:9090/metrics",
            "inferencePool": "app",
            "cooldownSeconds": "0",
        },
    }
    engine = {
        "type": "external",
        "metadata": {
            "scalerAddress": "scaler:6000",
            "profile": "vllm-queue-depth",
            "vllmEndpoint": "http://vllm-headless.llm.svc:8000/metrics",
            "endpointDiscovery": "dns",
            "cooldownSeconds": "0",
        },
    }
    so = scaled_object(minReplicaCount=0, pollingInterval=15, triggers=[router, engine])
    burst = {"demand": True, "steps": [{"at": 0, "value": 0}, {"at": 40, "value": 12}]}
    ld = load(120, llmd_queue_size=burst, vllm_queue_depth=burst) | {"initialReplicas": 0}
    result = simulate(tmp_path, so, ld)
    keda = [s for s in result.steps if s.by == KEDA]
    # Before the burst: the router holds nothing and the engines have no pod to read.
    assert [(s.t, s.replicas, s.triggers[0].value, s.triggers[1].value) for s in keda[:3]] == [
        (0, 0, 0.0, None),
        (15, 0, 0.0, None),
        (30, 0, 0.0, None),
    ]
    # The first poll after the router holds requests activates the workload from zero ...
    assert (keda[3].t, keda[3].replicas, keda[3].triggers[0].value) == (45, 1, 12.0)
    assert keda[3].why.endswith("activation 0 -> 1")
    # ... and once replicas run, the engines' queue sizes it and the router's reads 0.
    later = next(s for s in result.steps if s.t == 60 and s.by == HPA)
    assert (later.triggers[0].value, later.triggers[1].value) == (0.0, 12.0)


@pytest.mark.parametrize(
    "metric_type", [m for m, info in CATALOG.items() if info.origin is Origin.GPU]
)
def test_every_gpu_metric_type_reads_back_what_the_load_gives(
    tmp_path: Path, metric_type: MetricType
) -> None:
    doc = {"duration": 10, "metrics": {str(metric_type): steady(42)}}
    parsed = read_load(put(tmp_path, "l.yaml", doc))
    snapshot = LoadFeed(parsed).advance(0, 1)
    (device,) = snapshot.devices.values()
    read = CATALOG[metric_type].read
    assert read is not None and device.reading is not None
    assert read(device.reading) == pytest.approx(42)


def test_an_engine_trigger_reads_its_endpoint_in_the_metric_unit(tmp_path: Path) -> None:
    so = _trigger(
        metadata={
            "metricType": "vllm_queue_time_ms",
            "vllmEndpoint": "http://vllm.llm.svc:8000/metrics",
            "targetValue": "100",
        }
    )
    result = simulate(tmp_path, so, load(vllm_queue_time_ms=steady(250)))
    assert values(result)[:2] == [(0, 250.0), (0, 250.0)]


# -- timing --------------------------------------------------------------------------------


def test_keda_acts_first_at_an_instant_and_each_step_shows_the_count_after_it(
    tmp_path: Path,
) -> None:
    # At 0 replicas a reading of 100 (not a demand) activates: KEDA's step at t=0 ends at 1;
    # the HPA's sync at the same instant then sees 1 replica: 100 / 50 = 2 × 1 → 2; at t=15,
    # 2 × 2 → 4 (a level that does not fall with more replicas keeps asking for more).
    result = simulate(tmp_path, scaled_object(minReplicaCount=0), load(gpu_utilization=steady(100)))
    first = result.steps[:3]
    assert [(s.t, s.by, s.replicas, s.desired) for s in first] == [
        (0, KEDA, 1, 1),
        (0, HPA, 2, 2),
        (15, HPA, 4, 4),
    ]
    assert first[0].why == "active: activation 0 -> 1"


def test_a_reading_is_shared_by_the_replicas_in_effect_when_it_was_taken(tmp_path: Path) -> None:
    # 100 of demand, 1 replica at t=0: the t=0 reading is 100 (the HPA then scales to 2),
    # the readings from t=1 on are 50 each, which the sync at t=15 finds within tolerance.
    result = simulate(tmp_path, scaled_object(), load(gpu_utilization=steady(100, demand=True)))
    assert values(result, HPA)[:2] == [(0, 100.0), (15, 50.0)]
    assert [s.replicas for s in result.steps[:3]] == [1, 2, 2]


def test_the_workloads_own_gpus_read_nothing_at_zero_replicas(tmp_path: Path) -> None:
    so = scaled_object(minReplicaCount=0)
    ld = load(gpu_utilization=steady(100, demand=True)) | {"initialReplicas": 0}
    result = simulate(tmp_path, so, ld)
    assert {s.replicas for s in result.steps} == {0}
    assert {s.triggers[0].value for s in result.steps} == {0.0}


def test_failures_count_on_the_scale_loop_and_the_hpa_path(tmp_path: Path) -> None:
    # minReplicaCount 0: the scale loop asks the scaler itself at every poll.
    so = scaled_object(
        fallback={"failureThreshold": 2, "replicas": 6}, maxReplicaCount=10, minReplicaCount=0
    )
    so["spec"]["triggers"][0]["metricType"] = "AverageValue"
    ld = load(gpu_utilization=steady(None)) | {"initialReplicas": 1}
    result = simulate(tmp_path, so, ld)
    failures = [int(m) for s in result.steps for m in re.findall(r"failure (\d+)", s.why)]
    # t=0 poll, t=0 sync, t=15 sync, t=30 poll, t=30 sync, t=45 sync: one count each.
    assert failures == [1, 2, 3, 4, 5, 6]
    # From the third failure the HPA gets target × 6 (AverageValue): 300 / 50 → 6, which the
    # older rule reaches in two syncs (max(2 × 1, 4) = 4, then 6); KEDA's poll keeps 4.
    assert [s.replicas for s in result.steps] == [1, 1, 4, 4, 6, 6]
    assert "fallback serves 300 for 6 replicas" in result.steps[2].why


def test_keda_2_21_polls_reuse_what_the_hpa_observed_and_count_no_failure(
    tmp_path: Path,
) -> None:
    """kedacore/keda v2.21.0 apis/keda/v1alpha1/scaledobject_types.go UsesHPAObservations
    (minReplicaCount above 0, no idleReplicaCount, no useCachedMetrics) and
    pkg/scaling/scale_handler.go getScalerState / hpaObservedRecord / hpaActivelyQuerying: a
    poll takes each metric's record from the HPA path's last GetScaledObjectMetrics while the
    HPA's ScalingActive condition is true, and so counts no failure of its own."""
    so = scaled_object(fallback={"failureThreshold": 2, "replicas": 6}, maxReplicaCount=10)
    so["spec"]["triggers"][0]["metricType"] = "AverageValue"
    ld = load(90, gpu_utilization={"steps": [{"at": 0, "value": 20}, {"at": 20, "value": None}]})
    result = simulate(tmp_path, so, ld)
    at = {(s.t, s.by): s for s in result.steps}
    # t=30: the poll reads the HPA's good record of t=15 (ScalingActive true) ...
    assert at[30, KEDA].triggers[0].value == 20
    assert "s0-gpu as the HPA read it at t=15" in at[30, KEDA].why
    # ... so the failures are the HPA's: t=30 (1), t=45 (2); ScalingActive is then false and
    # the poll of t=60 asks the scaler (3), the sync of t=60 (4) falls back: 6 × 50 = 300.
    failures = [
        (s.t, s.by, int(m)) for s in result.steps for m in re.findall(r"failure (\d+)", s.why)
    ]
    assert failures == [(30, HPA, 1), (45, HPA, 2), (60, KEDA, 3), (60, HPA, 4), (75, HPA, 5)]
    # KEDA 2.20 counted on both paths and fell back at t=45; 2.21 does at t=60.
    assert [(s.t, s.replicas) for s in result.steps if s.by == HPA] == [
        (0, 1),
        (15, 1),
        (30, 1),
        (45, 1),
        (60, 4),
        (75, 6),
    ]


def test_a_cached_fallback_reads_as_a_success_on_the_hpa_path(tmp_path: Path) -> None:
    """kedacore/keda v2.21.0 pkg/scaling/scale_handler.go GetScaledObjectMetrics: a
    useCachedMetrics record is the scale loop's, fallback applied, and observeMetric feeds it
    to GetMetricsWithFallback as the raw outcome: a fallback value is no error there, and the
    metric's failure count goes back to 0."""
    so = scaled_object(fallback={"failureThreshold": 1, "replicas": 4}, maxReplicaCount=10)
    trigger = so["spec"]["triggers"][0]
    trigger |= {"metricType": "AverageValue", "useCachedMetrics": True}
    result = simulate(tmp_path, so, load(120, gpu_utilization=steady(None)))
    failures = [
        (s.t, s.by, int(m)) for s in result.steps for m in re.findall(r"failure (\d+)", s.why)
    ]
    # t=0: poll 1, sync 2 (the cached error counts again, and falls back), 15: 3. t=30: poll
    # 4, above 1: fallback, cached as such; the sync reads it as a success (count 0) and gets
    # 4 × 50.
    assert failures[:4] == [(0, KEDA, 1), (0, HPA, 2), (15, HPA, 3), (30, KEDA, 4)]
    t30 = next(s for s in result.steps if (s.t, s.by) == (30, HPA))
    assert "failure" not in t30.why
    assert t30.replicas == 4
    # The next poll starts counting from 0 again: 1, not above the threshold.
    t60 = next(s for s in result.steps if (s.t, s.by) == (60, KEDA))
    assert "failure 1," in t60.why


def test_the_hpa_counts_no_failure_at_zero_replicas_and_a_fallback_activates(
    tmp_path: Path,
) -> None:
    so = scaled_object(minReplicaCount=0, fallback={"failureThreshold": 1, "replicas": 3})
    so["spec"]["triggers"][0]["metricType"] = "AverageValue"
    ld = load(gpu_utilization=steady(None)) | {"initialReplicas": 0}
    result = simulate(tmp_path, so, ld)
    whys = [(s.t, s.by, s.why) for s in result.steps]
    assert whys[1] == (0, HPA, "0 replicas: scaling is disabled (only KEDA scales from 0)")
    # The poll at t=30 makes the second failure: above the threshold, active, activation.
    t30 = result.steps[3]
    assert (t30.t, t30.by, t30.replicas, t30.active) == (30, KEDA, 1, True)
    assert "failure 2" in t30.why
    assert result.steps[4].replicas == 3


def test_the_scalers_cooldown_seconds_holds_a_lower_value(tmp_path: Path) -> None:
    steps = [{"at": 0, "value": 80}, {"at": 20, "value": 60}, {"at": 40, "value": 20}]
    ld = load(120, gpu_utilization={"steps": steps})
    held = simulate(tmp_path, _trigger(metadata={"cooldownSeconds": "60"}), ld)
    # The decrease to 60 is let through at t=30 and starts the 60 s window; the one to 20 is
    # held until t=90.
    assert values(held, HPA) == [
        (0, 80),
        (15, 80),
        (30, 60),
        (45, 60),
        (60, 60),
        (75, 60),
        (90, 20),
        (105, 20),
    ]
    free = simulate(tmp_path, scaled_object(), ld)
    assert values(free, HPA)[3] == (45, 20)


def test_use_cached_metrics_gives_the_hpa_the_last_polls_answer(tmp_path: Path) -> None:
    ld = load(60, gpu_utilization={"steps": [{"at": 0, "value": 40}, {"at": 10, "value": 90}]})
    cached = simulate(tmp_path, _trigger(useCachedMetrics=True), ld)
    assert values(cached, HPA)[:3] == [(0, 40), (15, 40), (30, 90)]
    live = simulate(tmp_path, scaled_object(), ld)
    assert values(live, HPA)[1] == (15, 90)


# -- outputs -------------------------------------------------------------------------------


def test_the_json_is_one_object_with_the_steps_exactly(tmp_path: Path) -> None:
    result = simulate(tmp_path, scaled_object(), load(45, gpu_utilization=steady(60)))
    doc = json.loads(result.json())
    assert set(doc) == {"warnings", "steps"}
    assert doc["warnings"] == []
    for step in doc["steps"]:
        assert set(step) == {"t", "replicas", "desired", "active", "triggers", "why"}
        assert isinstance(step["t"], int) and isinstance(step["active"], bool)
        for trigger in step["triggers"]:
            assert set(trigger) == {"metricName", "value", "target", "active", "fallback"}
    assert [(s["t"], s["why"].split(":")[0]) for s in doc["steps"]] == [
        (0, "KEDA poll"),
        (0, "HPA sync"),
        (15, "HPA sync"),
        (30, "KEDA poll"),
        (30, "HPA sync"),
    ]
    assert doc["steps"][1]["triggers"] == [
        {"metricName": "s0-gpu", "value": 60.0, "target": 50.0, "active": True, "fallback": False}
    ]
    # An error is null, never 0.
    broken = simulate(tmp_path, scaled_object(), load(15, gpu_utilization=steady(None)))
    assert json.loads(broken.json())["steps"][0]["triggers"][0]["value"] is None


def test_the_command_writes_json_and_a_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    so = put(tmp_path, "so.yaml", scaled_object())
    ld = put(tmp_path, "load.yaml", load(gpu_utilization=steady(60)))
    plot = tmp_path / "out.svg"
    args = ["simulate", str(so), "--load", str(ld), "--format", "json", "--plot", str(plot)]
    assert cli.main(args) == 0
    assert json.loads(capsys.readouterr().out)["steps"][0]["t"] == 0
    assert ET.parse(plot).getroot().tag == "{http://www.w3.org/2000/svg}svg"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--format", "yaml"], "--format 'yaml': must be one of table, json"),
        (["--plot", "out.jpg"], "the name must end in .png or .svg"),
    ],
)
def test_bad_output_options_are_refused(tmp_path: Path, flags: list[str], message: str) -> None:
    so = put(tmp_path, "so.yaml", scaled_object())
    ld = put(tmp_path, "load.yaml", load(gpu_utilization=steady(60)))
    with pytest.raises(BadInput, match=re.escape(message)):
        run_simulate(
            so,
            load=ld,
            output_format=flags[1] if flags[0] == "--format" else "table",
            plot=Path(flags[1]) if flags[0] == "--plot" else None,
            out=io.StringIO(),
        )


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        chunks.append((kind, body))
        at += 12 + length
    return chunks


def test_the_png_is_valid(tmp_path: Path) -> None:
    so = put(tmp_path, "so.yaml", scaled_object())
    ld = put(tmp_path, "load.yaml", load(gpu_utilization=steady(60)))
    out = tmp_path / "plot.png"
    run_simulate(so, load=ld, plot=out, out=io.StringIO())
    chunks = _png_chunks(out.read_bytes())
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    width, height, depth, color, compression, filtering, interlace = struct.unpack(
        ">IIBBBBB", chunks[0][1]
    )
    # Drawn at twice the figure's 960 × 550 (one value panel, the replicas).
    assert (width, height, depth, color, compression, filtering, interlace) == (
        1920,
        1100,
        8,
        2,
        0,
        0,
        0,
    )
    raw = zlib.decompress(chunks[1][1])
    assert len(raw) == height * (1 + width * 3)
    assert {raw[y * (1 + width * 3)] for y in range(height)} == {0}
    # Something was drawn: not every pixel is white.
    assert raw.count(b"\xff") < len(raw) - height


def test_the_png_writer_encodes_pixels_row_by_row() -> None:
    data = encode_png(2, 1, b"\x01\x02\x03\x04\x05\x06")
    (_, header), (_, idat), _ = _png_chunks(data)
    assert struct.unpack(">II", header[:8]) == (2, 1)
    assert zlib.decompress(idat) == b"\x00\x01\x02\x03\x04\x05\x06"


def test_the_svg_is_xml_with_the_lines_and_the_legend(tmp_path: Path) -> None:
    result = simulate(tmp_path, scaled_object(), load(gpu_utilization=steady(60)))
    out = tmp_path / "plot.svg"
    from keda_gpu_scaler.app.simulate.command import write_plot

    write_plot(result.figure(), out)
    root = ET.parse(out).getroot()
    ns = {"s": "http://www.w3.org/2000/svg"}
    texts = [t.text for t in root.findall("s:text", ns)]
    assert {"s0-gpu", "target 50", "replicas", "desired (HPA)", "t (s)"} <= set(texts)
    assert len(root.findall("s:polyline", ns)) > 10


# -- the per-node-metric warning -------------------------------------------------------------


def test_replica_ceiling_of_a_percentage_under_average_value() -> None:
    gpu, mx, total = MetricType.GPU_UTILIZATION, Aggregation.MAX, Aggregation.SUM
    assert [replica_ceiling(gpu, mx, t, None) for t in (80, 75, 50, 30)] == [2, 2, 2, 4]
    # Summed over 4 GPUs: ceil(400 / 80) = 5; over unknown GPUs: no ceiling known.
    assert replica_ceiling(gpu, total, 80, 4) == 5
    assert replica_ceiling(gpu, total, 80, None) is None
    assert replica_ceiling(MetricType.POWER_DRAW, mx, 100, 1) is None
    assert replica_ceiling(MetricType.VLLM_KV_CACHE_USAGE, total, 40, None) == 3
    assert unreachable_max(gpu, mx, 80, 1, 2) is None
    assert unreachable_max(gpu, mx, 80, 1, 3) == (
        "gpu_utilization is a percentage (at most 100): under AverageValue it never asks for "
        "more than ceil(100 / 80) = 2 replicas, fewer than maxReplicaCount 3; a level wants "
        "metricType: Value"
    )


def test_the_simulator_warns_when_a_trigger_cannot_reach_max_replicas(tmp_path: Path) -> None:
    so = _trigger(metricType="AverageValue", metadata={"targetValue": "80"})
    result = simulate(tmp_path, so, load(gpu_utilization=steady(60)))
    (warning,) = result.warnings
    assert warning.startswith("s0-gpu: gpu_utilization is a percentage")
    assert f"warning: {warning}\n" in result.table()
    assert json.loads(result.json())["warnings"] == [warning]
    assert simulate(tmp_path, scaled_object(), load(gpu_utilization=steady(60))).warnings == ()


# -- traces ---------------------------------------------------------------------------------


def _trace(tmp_path: Path, values: list[float]) -> Path:
    lines = [json.dumps({"t": 100 + i, "index": 0, "util_gpu": v}) for i, v in enumerate(values)]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_trace_plays_from_t_zero_whatever_the_replicas(tmp_path: Path) -> None:
    trace = _trace(tmp_path, [10.0] * 15 + [90.0] * 20)
    result = run_simulation(put(tmp_path, "so.yaml", scaled_object()), trace=str(trace))
    assert result.duration == 35
    assert values(result, HPA) == [(0, 10.0), (15, 90.0), (30, 90.0)]
    assert result.source == f"trace {trace}: 35 s, 1 GPU, 1 replica(s) at t=0"


def test_a_trace_holds_gpu_readings_only(tmp_path: Path) -> None:
    so = _trigger(
        metadata={"metricType": "vllm_queue_depth", "vllmEndpoint": "http://v:8000/metrics"}
    )
    with pytest.raises(BadInput, match="a trace holds GPU readings only"):
        run_simulation(put(tmp_path, "so.yaml", so), trace=str(_trace(tmp_path, [1.0])))
    with pytest.raises(BadInput, match="reads gpuIndex 2; the trace has GPU 0"):
        run_simulation(
            put(tmp_path, "so.yaml", _trigger(metadata={"gpuIndex": "2"})),
            trace=str(_trace(tmp_path, [1.0])),
        )
    junk = tmp_path / "junk.jsonl"
    junk.write_text("{not json\n")
    with pytest.raises(BadInput, match=r"junk.jsonl:1: not a trace frame"):
        run_simulation(put(tmp_path, "so.yaml", scaled_object()), trace=str(junk))


# -- the examples of docs/simulate.md ---------------------------------------------------------

_BLOCK = re.compile(r"```\n\$ keda-gpu-scaler simulate (?P<args>.*?)\n(?P<out>.*?)```\n", re.S)


def _blocks() -> list[tuple[list[str], str]]:
    return [(shlex.split(m["args"]), m["out"]) for m in _BLOCK.finditer(DOC.read_text())]


def test_the_doc_shows_the_five_examples() -> None:
    shown = {Path(args[0]).name for args, _ in _blocks()}
    assert shown == {
        "h200-scaledobject.yaml",
        "ramp-scaledobject.yaml",
        "queue-scaledobject.yaml",
        "saturation-utilization-scaledobject.yaml",
        "saturation-queue-scaledobject.yaml",
    }


@pytest.mark.parametrize(("args", "shown"), _blocks(), ids=lambda a: str(a[0]) if a else "")
def test_each_example_prints_what_the_doc_shows_and_draws_the_committed_picture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], shown: str
) -> None:
    monkeypatch.chdir(ROOT)  # the doc's commands name the files from the repository root
    flags = dict(zip(args[1::2], args[2::2], strict=True))
    plot = Path(flags["--plot"])
    out = io.StringIO()
    trace, ld = flags.get("--trace"), flags.get("--load")
    run_simulate(
        Path(args[0]),
        trace=trace,
        load=None if ld is None else Path(ld),
        plot=tmp_path / plot.name,
        out=out,
    )
    printed = out.getvalue()
    # Every segment between ⋮ marks is a run of the output, in order.
    at = 0
    for segment in shown.split("⋮\n"):
        found = printed.find(segment, at)
        assert found >= 0, segment
        at = found + len(segment)
    assert (tmp_path / plot.name).read_text() == plot.read_text(), f"regenerate {plot}"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*-scaledobject.yaml")), ids=lambda p: p.name)
def test_the_example_scaled_objects_are_valid_against_the_crd(path: Path) -> None:
    assert validate(yaml.safe_load(path.read_text()))


def test_the_bundled_recording_runs_with_its_example() -> None:
    result = run_simulation(EXAMPLES / "h200-scaledobject.yaml", trace="bundled")
    # Idle at first, active during the matmuls, back to 0 after cooldownPeriod.
    assert [s.replicas for s in result.steps if s.by == KEDA][:3] == [0, 0, 0]
    assert max(s.replicas for s in result.steps) == 2
    assert result.steps[-1].replicas == 0


def test_a_windowed_trigger_reads_its_window(tmp_path: Path) -> None:
    """The simulator keeps the history a window needs, as a running scaler does."""
    so = scaled_object(pollingInterval=15)
    metadata = so["spec"]["triggers"][0]["metadata"]
    metadata |= {"windowSeconds": "30", "windowAggregation": "max"}
    # 90 until t=20, then 10: the 30 s max window still holds 90 until it slides past.
    spike = {"demand": False, "steps": [{"at": 0, "value": 90}, {"at": 20, "value": 10}]}
    result = simulate(tmp_path, so, load(120, gpu_utilization=spike))
    seen = dict(values(result, by="HPA"))
    assert seen[0] is None  # the window is not covered yet: no reading, never a guess
    assert seen[30] == 90.0  # readings from 1 to 30 s: max 90
    assert seen[60] == 10.0  # the spike has left the window


# --- files of several documents -------------------------------------------------------------

GETTING_STARTED = ROOT / "k8s" / "examples" / "getting-started.yaml"


def _scaled_object(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "scaleTargetRef": {"name": name},
            "triggers": [
                {
                    "type": "external",
                    "metadata": {
                        "scalerAddress": "keda-gpu-scaler.keda.svc.cluster.local:6000",
                        "profile": "training",
                    },
                }
            ],
        },
    }


def _documents(path: Path, *docs: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump_all(docs))
    return path


def test_the_getting_started_example_simulates_its_scaled_object() -> None:
    """Namespace, Deployment and ScaledObject in one file: the ScaledObject is the one."""
    kinds = [d["kind"] for d in yaml.safe_load_all(GETTING_STARTED.read_text()) if d]
    assert kinds.count("ScaledObject") == 1 and len(kinds) > 1
    result = run_simulation(GETTING_STARTED, trace="bundled")
    assert (result.plan.namespace, result.plan.name) == ("gpu-demo", "gpu-load")


def test_several_scaled_objects_need_a_name(tmp_path: Path) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}}
    both = _documents(tmp_path / "both.yaml", deployment, _scaled_object("a"), _scaled_object("b"))
    with pytest.raises(BadInput, match=r"2 ScaledObjects \(a, b\): choose one with --name"):
        run_simulation(both, trace="bundled")
    assert run_simulation(both, trace="bundled", name="b").plan.name == "b"
    with pytest.raises(BadInput, match=r"no ScaledObject named 'c'; there are: a, b"):
        run_simulation(both, trace="bundled", name="c")
    none = _documents(tmp_path / "none.yaml", deployment, deployment)
    with pytest.raises(BadInput, match=r"no ScaledObject \(keda.sh/v1alpha1\) among its 2 docum"):
        run_simulation(none, trace="bundled")


def test_simulate_takes_name_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    both = _documents(tmp_path / "both.yaml", _scaled_object("a"), _scaled_object("b"))
    assert cli.main(["simulate", str(both), "--trace", "bundled", "--name", "a"]) == 0
    assert capsys.readouterr().out.startswith("ScaledObject ml/a:")


# -- external-push: StreamIsActive ------------------------------------------------------------


def _push(**spec: Any) -> dict[str, Any]:
    so = _trigger(type="external-push", metadata={"activationThreshold": "10"})
    so["spec"] |= {"minReplicaCount": 0, **spec}
    return so


def test_a_push_trigger_activates_on_the_reading_not_at_the_next_poll(tmp_path: Path) -> None:
    """kedacore/keda v2.21.0 pkg/scaling/scale_handler.go startPushScalers: a true from
    StreamIsActive is RequestScale(active, no error) at once; the scaler's stream sends on
    the reading that changes the activity (serving/streams.py)."""
    busy = {"steps": [{"at": 0, "value": 0}, {"at": 7, "value": 80}]}
    ld = load(60, gpu_utilization=busy) | {"initialReplicas": 0}
    pushed = simulate(tmp_path, _push(), ld)
    first = next(s for s in pushed.steps if s.replicas > 0)
    assert (first.t, first.by, first.replicas) == (7, PUSH, 1)
    assert first.why == "s0-gpu StreamIsActive true; active: activation 0 -> 1"
    # The HPA's sync of t=15 then finds a replica (80 / 50 × 1 → 2); polled only, the poll of
    # t=30 would have been first.
    assert next(s for s in pushed.steps if (s.t, s.by) == (15, HPA)).replicas == 2
    polled_so = _trigger(metadata={"activationThreshold": "10"})
    polled_so["spec"]["minReplicaCount"] = 0
    polled = simulate(tmp_path, polled_so, ld)
    assert next(s for s in polled.steps if s.replicas > 0).t == 30


def test_push_heartbeats_postpone_the_cooldown(tmp_path: Path) -> None:
    """Each true (every pollIntervalSeconds while active) sets lastActiveTime
    (scale_scaledobjects.go RequestScale), so cooldownPeriod runs from the last heartbeat."""
    busy = {"steps": [{"at": 0, "value": 80}, {"at": 48, "value": 0}]}
    ld = load(120, gpu_utilization=busy) | {"initialReplicas": 0}
    spec = {"pollingInterval": 10, "cooldownPeriod": 25}
    pushed = _push(**spec)
    pushed["spec"]["triggers"][0]["metadata"]["pollIntervalSeconds"] = "5"
    polled = _trigger(metadata={"activationThreshold": "10"})
    polled["spec"] |= {"minReplicaCount": 0, **spec}

    def scaled_in(so: dict[str, Any]) -> float:
        result = simulate(tmp_path, so, ld)
        return next(s.t for s in result.steps if s.t > 0 and s.replicas == 0)

    # Polled: last active at the poll of t=40, in after t=65: t=70. Pushed: the heartbeat of
    # t=45 was the last true, in after t=70: t=80.
    assert (scaled_in(polled), scaled_in(pushed)) == (70, 80)


def test_the_scaled_object_created_later_starts_both_grids_then(tmp_path: Path) -> None:
    """The scale loop polls at once when it starts (pkg/scaling/scale_handler.go
    startScaleLoop) and the HPA controller syncs an HPA when it is added, then every 15 s:
    both grids start at the ScaledObject's creation."""
    busy = {"steps": [{"at": 0, "value": 0}, {"at": 30, "value": 80}]}
    ld = load(70, gpu_utilization=busy) | {"initialReplicas": 0}
    so = _trigger(metadata={"activationThreshold": "10"})
    so["spec"] |= {"minReplicaCount": 0, "pollingInterval": 5}
    late = run_simulation(
        put(tmp_path, "so.yaml", so), load=put(tmp_path, "l.yaml", ld), created_at=0.3
    )
    assert [(s.t, s.by) for s in late.steps[:3]] == [(0.3, KEDA), (0.3, HPA), (5.3, KEDA)]
    # The reading of t=30 activates at the poll of t=30.3, before the sync of that instant.
    first = next(s for s in late.steps if s.replicas > 0)
    assert (first.t, first.by) == (30.3, KEDA)
    assert next(s for s in late.steps if (s.t, s.by) == (30.3, HPA)).replicas == 2
    doc = json.loads(late.json())
    assert [s["t"] for s in doc["steps"][:3]] == [0.3, 0.3, 5.3]
    assert "ScaledObject created at t=0.3" in late.table()


@pytest.mark.parametrize(
    ("value", "message"),
    [("soon", "--created-at 'soon': give a number of seconds"), ("70", "before the end (70 s)")],
)
def test_a_bad_creation_time_is_refused(tmp_path: Path, value: str, message: str) -> None:
    so = put(tmp_path, "so.yaml", scaled_object())
    ld = put(tmp_path, "l.yaml", load(70, gpu_utilization=steady(10)))
    with pytest.raises(BadInput) as caught:
        run_simulate(so, load=ld, created_at=value, out=io.StringIO())
    assert message in str(caught.value)
