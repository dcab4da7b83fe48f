"""The configuration reference, generated from the code's own catalogs.

``python -m keda_gpu_scaler.app.reference > docs/configuration.md`` (``make docs``); a test
fails when the committed file differs from what this renders.
"""

from __future__ import annotations

from collections.abc import Sequence

from keda_gpu_scaler.app.scaler.serve_flags import SERVE_FLAGS
from keda_gpu_scaler.domain.aggregation import Aggregation
from keda_gpu_scaler.domain.catalog import CATALOG, MetricType
from keda_gpu_scaler.domain.profiles import PROFILES
from keda_gpu_scaler.domain.trigger_keys import KEDA_KEYS, TRIGGER_KEY_HELP, TRIGGER_KEYS
from keda_gpu_scaler.models.reach import PERCENT_CEILING, bounded_metric_types, replica_ceiling


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _trigger_keys() -> list[str]:
    rows = [(f"`{key}`", *TRIGGER_KEY_HELP[key]) for key in TRIGGER_KEYS]
    return _table(("key", "default", "meaning"), rows)


def _metric_types() -> list[str]:
    rows = []
    for info in CATALOG.values():
        needs = f"; needs {info.needs}" if info.needs else ""
        rows.append(
            (
                f"`{info.type}`",
                info.unit,
                info.bound.value,
                info.origin.value,
                info.source,
                info.description + needs,
            )
        )
    return _table(("metricType", "unit", "bound per device", "from", "source", "meaning"), rows)


def _profiles() -> list[str]:
    rows = [
        (
            f"`{p.name}`",
            f"`{p.metric_name}`",
            f"`{p.metric_type}`",
            f"{p.target:g}",
            f"{p.activation:g}",
            str(p.keda_cooldown_s),
            p.description,
        )
        for p in PROFILES.values()
    ]
    header = (
        "profile",
        "metricName",
        "metricType",
        "target",
        "activation",
        "suggested cooldownPeriod s",
        "for",
    )
    return _table(header, rows)


def _average_value() -> list[str]:
    bounded = ", ".join(f"`{t}`" for t in bounded_metric_types())
    most = {
        t: replica_ceiling(MetricType.GPU_UTILIZATION, Aggregation.MAX, t, None)
        for t in (80, 50, 30)
    }
    return [
        "## AverageValue and percentages",
        "",
        "KEDA's default `metricType: AverageValue` makes the HPA ask for ceil(value / target) "
        "replicas whatever the current count, so a metric with a ceiling can never ask for more "
        f"than ceil(ceiling / target). The percentages ({bounded}) are at most "
        f"{PERCENT_CEILING:g}, and {PERCENT_CEILING:g} × G with `aggregation: sum` over G GPUs: "
        f"with target 80 a trigger never asks for more than {most[80]} replicas, with 50 for "
        f"{most[50]}, with 30 for {most[30]}. "
        "A level wants `metricType: Value` (desired = ceil(replicas × value / target)); "
        "`keda-gpu-scaler simulate` warns when an `AverageValue` trigger cannot reach "
        "`maxReplicaCount` (see [simulate.md](simulate.md)).",
    ]


_PUSH_EXAMPLE = """\
```yaml
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: llm-server
spec:
  scaleTargetRef:
    name: llm-server
  minReplicaCount: 0
  maxReplicaCount: 8
  pollingInterval: 30            # deactivation and the HPA's metrics still come from polls
  cooldownPeriod: 300
  triggers:
    - type: external-push        # StreamIsActive (and StreamMetricSpec, KEDA 2.21) beside the polls
      metricType: Value
      metadata:
        scalerAddress: keda-gpu-scaler.keda.svc.cluster.local:6000
        metricType: gpu_utilization
        targetValue: "70"
        activationThreshold: "10"
        pollIntervalSeconds: "5" # StreamIsActive's heartbeat while active
```"""


def _external_push() -> list[str]:
    return [
        "## `external-push` triggers",
        "",
        "`type: external-push` takes the same metadata as `type: external` and gets everything "
        "KEDA does for it (`GetMetricSpec`, `GetMetrics` and `IsActive` on every poll and HPA "
        "sync), plus two streams that KEDA holds open on its one connection to the scaler:",
        "",
        "- `StreamIsActive`: the trigger's activity at once on open, on every change (judged on "
        "each new reading, so a workload at zero is activated within a sample period instead "
        "of at the next poll) and every `pollIntervalSeconds` while it lasts (each `true` "
        "postpones KEDA's `cooldownPeriod`). KEDA ignores `false`: deactivation comes from polls.",
        "- `StreamMetricSpec` (KEDA 2.21 and later): the metric spec, at once on open, exactly "
        "what `GetMetricSpec` answers. KEDA then caches it and stops asking `GetMetricSpec` for "
        "the trigger. A spec depends on the metadata alone, so nothing follows the first "
        "message: no heartbeat, since KEDA reconciles the ScaledObject and its HPA on every "
        "message. The stream stays open until KEDA cancels it (an update of the ScaledObject) "
        "or the scaler stops.",
        "",
        "Bad metadata fails both streams with `INVALID_ARGUMENT` before any message. On "
        "shutdown (SIGTERM) every stream ends with status OK, and KEDA opens it again, on "
        "another scaler pod, 2 s later.",
        "",
        _PUSH_EXAMPLE,
    ]


def _flags() -> list[str]:
    rows = [
        (f"`{f.name}`", f"`{f.variable}`", f"`{f.default}`" if f.default else "unset", f.help)
        for f in SERVE_FLAGS
    ]
    return _table(("flag", "environment variable", "default", "meaning"), rows)


def render_configuration() -> str:
    keda = ", ".join(f"`{k}`" for k in KEDA_KEYS)
    parts = [
        "# Configuration reference",
        "",
        "Generated from the code by `make docs`; do not edit by hand.",
        "",
        "## Trigger metadata",
        "",
        "Keys are case-sensitive. Explicit keys override the profile; the shorthands "
        "`targetGpuUtilization` and `targetMemoryUtilization` override `targetValue` and "
        "`metricType` whatever their order. Any key may arrive as `<key>FromEnv` (resolved by "
        f"KEDA from the scale target's environment). KEDA's own keys ({keda}) and unknown keys "
        "are ignored; a key that looks like a typo of a known one is logged as a warning. Bad "
        "values are answered with `INVALID_ARGUMENT` naming the key and the value.",
        "",
        *_trigger_keys(),
        "",
        "## Metric types",
        "",
        "The bound is the most one device reads: a demand above it saturates the device, which "
        "reads the bound while the rest waits in the engine's queue (`keda-gpu-scaler simulate` "
        "models this, see [simulate.md](simulate.md#saturation)).",
        "",
        *_metric_types(),
        "",
        "## Profiles",
        "",
        "Only the metric name, type, target and activation are applied. The cooldown column is "
        "the `cooldownPeriod` the examples set on the ScaledObject (KEDA's 1 to 0 delay).",
        "",
        *_profiles(),
        "",
        *_average_value(),
        "",
        *_external_push(),
        "",
        "## `keda-gpu-scaler serve` flags",
        "",
        "Every flag can be set from its environment variable; a flag given on the command line "
        "wins.",
        "",
        *_flags(),
        "",
    ]
    return "\n".join(parts)


if __name__ == "__main__":
    print(render_configuration(), end="")
