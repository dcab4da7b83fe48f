"""``keda-gpu-scaler demo``: the server on the bundled H200 recording, polled like KEDA."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import anyio
from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from keda_gpu_scaler.app.compose import open_scaler
from keda_gpu_scaler.serving._proto.externalscaler import (
    ExternalScalerStub,
    GetMetricsRequest,
    ScaledObjectRef,
)
from keda_gpu_scaler.sources.replay import ReplaySampler


@dataclass(frozen=True, slots=True)
class DemoTrigger:
    label: str
    metadata: dict[str, str]


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


async def _poll(stub: ExternalScalerStub, trigger: DemoTrigger) -> str:
    ref = ScaledObjectRef(name="demo", namespace="default", scaler_metadata=trigger.metadata)
    spec = (await stub.get_metric_spec(ref, timeout=3)).metric_specs[0]
    try:
        request = GetMetricsRequest(scaled_object_ref=ref, metric_name=spec.metric_name)
        value = (await stub.get_metrics(request, timeout=3)).metric_values[0].metric_value_float
        active = (await stub.is_active(ref, timeout=3)).result
    except GRPCError as exc:
        shown, state = "-", f"{exc.status.name}: {exc.message}"
    else:
        shown, state = f"{value:.1f}", "ACTIVE" if active else "inactive"
    return f"{trigger.label:<28} {shown:>10} {spec.target_size_float:>8g}  {state}"


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
                phase = source.statistics().phase or "?"
                rows = [
                    f"t={elapsed:5.1f}s  recorded phase: {phase}",
                    f"{'trigger':<28} {'value':>10} {'target':>8}  activity",
                ]
                rows += [await _poll(stub, trigger) for trigger in DEMO_TRIGGERS]
                if tty and lines:
                    print(f"\x1b[{lines}F\x1b[J", end="")
                print("\n".join(rows), flush=True)
                lines = len(rows)
                await anyio.sleep(every_s)
