"""A simulation as a table (for people) or one JSON object (for programs)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from keda_gpu_scaler.app.simulate.runner import HPA, KEDA, PUSH, Step
from keda_gpu_scaler.app.simulate.scaledobject import Plan, Trigger
from keda_gpu_scaler.app.simulate.text import num
from keda_gpu_scaler.models.hpa import DOWNSCALE_STABILIZATION_S, ScalingRules

_WHO = {KEDA: "KEDA poll", HPA: "HPA sync", PUSH: "KEDA push"}


def to_json(warnings: Sequence[str], steps: Sequence[Step]) -> str:
    """``{"warnings": [...], "steps": [{"t", "replicas", "desired", "active", "triggers",
    "why"}]}``, each trigger ``{"metricName", "value", "target", "active", "fallback"}``."""
    doc = {
        "warnings": list(warnings),
        "steps": [
            {
                "t": _t(s.t),
                "replicas": s.replicas,
                "desired": s.desired,
                "active": s.active,
                "triggers": [
                    {
                        "metricName": x.metric_name,
                        "value": x.value,
                        "target": x.target,
                        "active": x.active,
                        "fallback": x.fallback,
                    }
                    for x in s.triggers
                ],
                "why": f"{_WHO[s.by]}: {s.why}",
            }
            for s in steps
        ],
    }
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def _t(t: float) -> float | int:
    """Whole seconds as integers, as the steps fall when the ScaledObject is made at 0."""
    return int(t) if float(t).is_integer() else round(t, 3)


def describe(plan: Plan) -> list[str]:
    """The header: what KEDA, the HPA and each trigger were set to."""
    keda = plan.keda
    text = (
        f"ScaledObject {plan.namespace}/{plan.name}: minReplicaCount {keda.min_replicas}, "
        f"maxReplicaCount {keda.max_replicas}, pollingInterval {keda.polling_s} s, "
        f"cooldownPeriod {keda.cooldown_s} s"
    )
    if keda.idle_replicas is not None:
        text += f", idleReplicaCount {keda.idle_replicas}"
    if keda.fallback is not None:
        fb = keda.fallback
        text += (
            f", fallback {fb.replicas} replicas ({fb.behavior}) after "
            f"{fb.failure_threshold} failures"
        )
    return [text, _hpa_line(plan), *(_trigger_line(t) for t in plan.triggers)]


def _hpa_line(plan: Plan) -> str:
    behavior = plan.hpa.behavior
    head = f"HPA: minReplicas {plan.hpa.min_replicas}, maxReplicas {plan.hpa.max_replicas}"
    if behavior is None:
        return (
            f"{head}, no behavior (the older rule: scale-up at most max(2 × current, 4) per "
            f"sync, scale-down to the highest recommendation of {DOWNSCALE_STABILIZATION_S} s)"
        )
    return (
        f"{head}, behavior: scale-up {_rules(behavior.scale_up)}; "
        f"scale-down {_rules(behavior.scale_down)}"
    )


def _rules(rules: ScalingRules) -> str:
    policies = ", ".join(f"{p.value} {p.type} per {p.period_s} s" for p in rules.policies)
    text = f"window {rules.stabilization_s} s, {rules.select} of [{policies}]"
    return text + f", tolerance {rules.tolerance:g}"


def _trigger_line(trigger: Trigger) -> str:
    spec = trigger.spec
    if spec.engine_target is None:
        where = f" ({spec.aggregation} over the GPUs)"
    else:
        where = f" from {spec.endpoint} ({spec.endpoint_discovery})"
    return (
        f"s{trigger.index} = {trigger.hpa_name}: {spec.metric_type}{where}, "
        f"{trigger.target_type} target {num(spec.target)}, activation {num(spec.activation)}, "
        f"cooldownSeconds {spec.cooldown_s}"
    )


def to_table(
    header: Sequence[str], warnings: Sequence[str], plan: Plan, steps: Sequence[Step]
) -> str:
    """One row per step: value and target of each trigger, activity, desired and actual
    replicas, and why."""
    columns = ["t", "by"]
    for trigger in plan.triggers:
        columns += [f"s{trigger.index} value", f"s{trigger.index} target"]
    columns += ["active", "desired", "replicas"]
    rows = [_row(s) for s in steps]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    lines = [*header, *(f"warning: {w}" for w in warnings)]
    lines.append(_line(columns, widths, "why"))
    lines += [_line(r, widths, s.why) for r, s in zip(rows, steps, strict=True)]
    return "\n".join(lines) + "\n"


def _row(step: Step) -> list[str]:
    cells = [num(step.t), step.by]
    for trigger in step.triggers:
        cells += ["error" if trigger.value is None else num(trigger.value), num(trigger.target)]
    return [*cells, "yes" if step.active else "no", str(step.desired), str(step.replicas)]


def _line(cells: Sequence[str], widths: Sequence[int], why: str) -> str:
    left = {1}  # "by" reads better left-aligned
    text = "  ".join(
        c.ljust(w) if i in left else c.rjust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )
    return f"{text}  {why}"
