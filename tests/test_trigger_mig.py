"""The ``migInstance`` trigger key and the ``gpu-busy`` profile; upstream keys unchanged."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.domain.catalog import CATALOG, MetricType
from keda_gpu_scaler.domain.decision import TriggerKey, decide
from keda_gpu_scaler.domain.errors import InvalidTrigger
from keda_gpu_scaler.domain.profiles import PROFILES
from keda_gpu_scaler.domain.samples import DeviceKey, GpuReading
from keda_gpu_scaler.domain.trigger import parse_trigger
from keda_gpu_scaler.domain.trigger_values import MigSelector
from keda_gpu_scaler.testing import snapshot_after


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            "MIG-4f60bdab-7290-5bab-ee63-d697ab1e6349",
            MigSelector(uuid="MIG-4f60bdab-7290-5bab-ee63-d697ab1e6349"),
        ),
        ("MIG-GPU-4f60bdab/7/0", MigSelector(uuid="MIG-GPU-4f60bdab/7/0")),
        ("0:7", MigSelector(parent_index=0, gpu_instance_id=7)),
        ("3:13:1", MigSelector(parent_index=3, gpu_instance_id=13, compute_instance_id=1)),
    ],
)
def test_mig_instance_forms(raw: str, expected: MigSelector) -> None:
    spec = parse_trigger({"migInstance": raw})
    assert spec.mig_instance == expected
    assert str(spec.mig_instance) == raw


@pytest.mark.parametrize(
    "raw", ["7", "0:", ":7", "0:7:", "-1:7", "0:7:1:2", "mig-abc", "0 :7", "GPU-x"]
)
def test_bad_mig_instance_names_the_key_and_the_forms(raw: str) -> None:
    with pytest.raises(
        InvalidTrigger, match=r'invalid migInstance ".*": must be a MIG device UUID'
    ):
        parse_trigger({"migInstance": raw})


def test_mig_instance_and_gpu_index_are_exclusive() -> None:
    with pytest.raises(InvalidTrigger, match="cannot be combined with gpuIndex"):
        parse_trigger({"gpuIndex": "0", "migInstance": "0:7"})
    assert parse_trigger({"gpuIndex": "-1", "migInstance": "0:7"}).mig_instance is not None


def test_empty_mig_instance_is_unset_and_absent_keys_keep_defaults() -> None:
    assert parse_trigger({"migInstance": ""}).mig_instance is None
    spec = parse_trigger({})
    assert (spec.mig_instance, spec.gpu_index) == (None, -1)


def test_gpu_index_errors_still_come_first() -> None:
    with pytest.raises(InvalidTrigger, match="gpuIndex"):
        parse_trigger({"gpuIndex": "-2", "migInstance": "bad"})


def test_a_typo_of_mig_instance_is_warned() -> None:
    spec = parse_trigger({"miginstance": "0:7"})
    assert spec.mig_instance is None
    assert any('did you mean "migInstance"' in w for w in spec.warnings)


def test_cooldown_state_is_per_instance() -> None:
    a = TriggerKey("ns", "so", parse_trigger({"migInstance": "0:7"}))
    b = TriggerKey("ns", "so", parse_trigger({"migInstance": "0:8"}))
    assert a != b
    assert str(a.spec.mig_instance) == "0:7"


def _instance(**fields: int | str | None) -> GpuReading:
    base: dict[str, object] = {
        "source": "t",
        "key": DeviceKey("MIG-a"),
        "index": 0,
        "uuid": "MIG-a",
        "name": "n",
        "taken_at": 0.0,
        "period_s": 1.0,
        "parent_index": 0,
        "gpu_instance_id": 7,
        "compute_instance_id": 0,
    }
    base.update(fields)
    return GpuReading(**base)  # type: ignore[arg-type]


def test_selector_matches_instances_only() -> None:
    by_ids = MigSelector(parent_index=0, gpu_instance_id=7)
    assert by_ids.matches(_instance())
    assert not by_ids.matches(_instance(gpu_instance_id=8))
    assert not by_ids.matches(_instance(parent_index=1))
    assert MigSelector(parent_index=0, gpu_instance_id=7, compute_instance_id=0).matches(
        _instance()
    )
    assert not MigSelector(parent_index=0, gpu_instance_id=7, compute_instance_id=1).matches(
        _instance()
    )
    assert MigSelector(uuid="MIG-a").matches(_instance())
    assert not MigSelector(uuid="MIG-a").matches(_instance(parent_index=None))


def test_gpu_busy_profile_reads_gpm_sm_activity() -> None:
    spec = parse_trigger({"profile": "gpu-busy"})
    assert (spec.metric_name, spec.metric_type, spec.target, spec.activation) == (
        "keda_gpu_gpu_busy",
        MetricType.SM_ACTIVE,
        70.0,
        5.0,
    )


def test_the_ten_upstream_profiles_are_untouched() -> None:
    upstream = {
        "distributed-training": (MetricType.NVLINK_TX_MBPS, 50000, 5000),
        "vllm-inference": (MetricType.MEMORY_USED_PERCENT, 80, 5),
        "vllm-queue-depth": (MetricType.VLLM_QUEUE_DEPTH, 5, 1),
        "triton-inference": (MetricType.GPU_UTILIZATION, 75, 10),
        "triton-queue-wait": (MetricType.TRITON_QUEUE_WAIT_MS, 50, 5),
        "triton-request-rate": (MetricType.TRITON_REQUEST_RATE, 50, 1),
        "training": (MetricType.GPU_UTILIZATION, 90, 0),
        "batch": (MetricType.MEMORY_USED_PERCENT, 70, 1),
        "ollama": (MetricType.MEMORY_USED_PERCENT, 70, 3),
        "tgi-inference": (MetricType.MEMORY_USED_PERCENT, 75, 5),
    }
    for name, (metric_type, target, activation) in upstream.items():
        p = PROFILES[name]
        assert (p.metric_type, p.target, p.activation) == (metric_type, target, activation)
    assert set(PROFILES) == {
        *upstream,
        "gpu-busy",
        "triton-pending",
        "tgi-queue",
        "sglang-queue",
        "vllm-ttft",
        "vllm-admission-rejections",
        "trtllm-queue-depth",
        "dynamo-queue",
        "llmd-queue",
    }


def test_whole_gpu_metrics_are_marked_per_parent_and_gpm_metrics_say_what_they_need() -> None:
    per_parent = {t for t, info in CATALOG.items() if info.per_parent}
    assert per_parent == {
        MetricType.TEMPERATURE,
        MetricType.POWER_DRAW,
        MetricType.PCIE_TX_KBPS,
        MetricType.PCIE_RX_KBPS,
        MetricType.NVLINK_TX_MBPS,
        MetricType.NVLINK_RX_MBPS,
    }
    gpm = {t for t, info in CATALOG.items() if info.needs and "GPM" in info.needs}
    assert gpm == {
        MetricType.SM_ACTIVE,
        MetricType.SM_OCCUPANCY,
        MetricType.TENSOR_ACTIVE,
        MetricType.DRAM_BW_UTIL,
    }


def test_an_explanation_names_an_unsupported_instance_by_its_mig_label() -> None:
    # A MIG instance without GPM beside a whole GPU with it: the explanation named the
    # instance "GPU 0" (its parent's index), not "MIG 0:7".
    instance = _instance(sm_active=None)
    gpu = GpuReading(
        source="t",
        key=DeviceKey("GPU-b"),
        index=1,
        uuid="GPU-b",
        name="n",
        taken_at=0.0,
        period_s=1.0,
        sm_active=40.0,
    )
    snapshot = snapshot_after([instance, gpu], 0.0)
    decision = decide(parse_trigger({"metricType": "sm_active"}), snapshot, None, 0.5)
    assert "(not supported on MIG 0:7)" in decision.explanation
    assert "GPU 0" not in decision.explanation
