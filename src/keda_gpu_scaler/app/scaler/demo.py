"""``keda-gpu-scaler demo``: the server on the bundled H200 recording, polled like KEDA."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import anyio
from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from keda_gpu_scaler.app.scaler.compose import open_scaler
from keda_gpu_scaler.domain.catalog import CATALOG, MetricType
from keda_gpu_scaler.domain.profiles import PROFILES
from keda_gpu_scaler.serving._proto.externalscaler import (
    ExternalScalerStub,
    GetMetricsRequest,
    ScaledObjectRef,
)
from keda_gpu_scaler.sources.replay import ReplaySampler

_UNITS = {"percent": "%"}


@dataclass(frozen=True, slots=True)
class DemoTrigger:
    label: str
    metadata: dict[str, str]

    @property
    def unit(self) -> str:
        profile = PROFILES.get(self.metadata.get("profile", ""))
        metric = profile.metric_type if profile else MetricType(self.metadata["metricType"])
        unit = CATALOG[metric].unit
        return _UNITS.get(unit, unit)

    def without_cooldown(self) -> DemoTrigger:
        return DemoTrigger(self.label, {**self.metadata, "cooldownSeconds": "0"})


DEMO_TRIGGERS = (
    DemoTrigger("training", {"profile": "training", "cooldownSeconds": "0"}),
    DemoTrigger("triton-inference", {"profile": "triton-inference", "cooldownSeconds": "0"}),
    DemoTrigger("vllm-inference", {"profile": "vllm-inference", "cooldownSeconds": "0"}),
    DemoTrigger(
        "sm_active (GPM)",
        {
            "metricType": "sm_active",
            "targetValue": "60",
            "activationThreshold": "5",
            "cooldownSeconds": "0",
        },
    ),
    DemoTrigger(
        "power_draw, 60 s cooldown",
        {"metricType": "power_draw", "targetValue": "500", "activationThreshold": "150"},
    ),
    DemoTrigger("distributed-training", {"profile": "distributed-training"}),
)


async def _value(stub: ExternalScalerStub, ref: ScaledObjectRef, metric_name: str) -> float:
    request = GetMetricsRequest(scaled_object_ref=ref, metric_name=metric_name)
    return (await stub.get_metrics(request, timeout=3)).metric_values[0].metric_value_float


def _ref(name: str, trigger: DemoTrigger) -> ScaledObjectRef:
    return ScaledObjectRef(name=name, namespace="default", scaler_metadata=trigger.metadata)


async def _poll(stub: ExternalScalerStub, trigger: DemoTrigger) -> str:
    ref = _ref("demo", trigger)
    spec = (await stub.get_metric_spec(ref, timeout=3)).metric_specs[0]
    unit = trigger.unit
    try:
        value = await _value(stub, ref, spec.metric_name)
        active = (await stub.is_active(ref, timeout=3)).result
        # The same trigger without cooldown, on a ScaledObject of its own, gives the reading
        # as it is now: a higher value above is being held.
        raw = await _value(stub, _ref("demo-raw", trigger.without_cooldown()), spec.metric_name)
    except GRPCError as exc:
        shown, state = "-", f"{exc.status.name}: {exc.message}"
    else:
        shown, state = f"{value:.1f} {unit}", "ACTIVE" if active else "inactive"
        if value > raw:
            state += f", held by cooldown (now {raw:.1f} {unit})"
    target = f"{spec.target_size_float:g} {unit}"
    return f"{trigger.label:<28} {shown:>12} {target:>11}  {state}"


async def run_demo(duration_s: float, every_s: float) -> None:
    source = ReplaySampler.bundled()
    tty = sys.stdout.isatty()
    async with open_scaler(source, host="127.0.0.1", port=0) as running:
        print(f"keda-gpu-scaler serving on 127.0.0.1:{running.port}, replaying a real NVIDIA H200")
        async with Channel("127.0.0.1", running.port) as channel:
            stub = ExternalScalerStub(channel)
            started = anyio.current_time()
            lines = 0
            while (elapsed := anyio.current_time() - started) < duration_s:
                phase = source.phase or "?"
                rows = [
                    f"t={elapsed:5.1f}s  recorded phase: {phase}",
                    f"{'trigger':<28} {'value':>12} {'target':>11}  activity",
                ]
                rows += [await _poll(stub, trigger) for trigger in DEMO_TRIGGERS]
                if tty and lines:
                    print(f"\x1b[{lines}F\x1b[J", end="")
                print("\n".join(rows), flush=True)
                lines = len(rows)
                await anyio.sleep(every_s)
