"""Whether a trigger can ever ask for ``maxReplicaCount`` replicas.

Under ``AverageValue`` (KEDA's default ``metricType``) the HPA asks for ceil(value / target)
replicas whatever the current count. A metric with a ceiling (a percentage is at most 100,
summed over G GPUs at most 100 × G) can therefore never ask for more than
ceil(ceiling / target) replicas; under ``Value`` the count grows with the replicas, so there
is no such limit.
"""

from __future__ import annotations

import math

from keda_gpu_scaler.domain.aggregation import Aggregation
from keda_gpu_scaler.domain.catalog import CATALOG, Bound, MetricType, Origin

PERCENT_CEILING = 100.0


def bounded_metric_types() -> tuple[MetricType, ...]:
    """The metric types with a ceiling whatever the device: the percentages (memory and
    power are bounded by each device's own, which a trigger does not know)."""
    return tuple(info.type for info in CATALOG.values() if info.bound is Bound.PERCENT)


def value_ceiling(
    metric_type: MetricType, aggregation: Aggregation, gpus: int | None
) -> float | None:
    """The most a trigger's value can be; None when unbounded (or summed over unknown GPUs)."""
    info = CATALOG[metric_type]
    if info.bound is not Bound.PERCENT:
        return None
    if info.origin is Origin.GPU and aggregation is Aggregation.SUM:
        return None if gpus is None else PERCENT_CEILING * gpus
    return PERCENT_CEILING


def replica_ceiling(
    metric_type: MetricType, aggregation: Aggregation, target: float, gpus: int | None
) -> int | None:
    """The most replicas the trigger can ask for under ``AverageValue``, in the HPA's
    milli-units; None when unbounded."""
    ceiling = value_ceiling(metric_type, aggregation, gpus)
    if ceiling is None:
        return None
    return math.ceil(round(ceiling * 1000) / round(target * 1000))


def unreachable_max(
    metric_type: MetricType,
    aggregation: Aggregation,
    target: float,
    gpus: int | None,
    max_replicas: int,
) -> str | None:
    """A warning when an ``AverageValue`` trigger can never reach ``max_replicas``."""
    most = replica_ceiling(metric_type, aggregation, target, gpus)
    if most is None or most >= max_replicas:
        return None
    ceiling = value_ceiling(metric_type, aggregation, gpus)
    assert ceiling is not None
    summed = f", summed over {gpus} GPUs" if ceiling != PERCENT_CEILING else ""
    return (
        f"{metric_type} is a percentage (at most {ceiling:g}{summed}): under AverageValue it "
        f"never asks for more than ceil({ceiling:g} / {target:g}) = {most} replicas, fewer "
        f"than maxReplicaCount {max_replicas}; a level wants metricType: Value"
    )
