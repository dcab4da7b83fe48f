"""The External Scaler servicer: parse, read a snapshot, decide, convert. Nothing else.

Handlers never touch hardware or the network. Parsing, shared measurements, cooldown and the
first-sample wait are the :class:`~keda_gpu_scaler.serving.decider.Decider`'s; open streams
and their pacing are the :class:`~keda_gpu_scaler.serving.streams.StreamRegistry`'s.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

from keda_gpu_scaler.domain.decision import TriggerKey
from keda_gpu_scaler.domain.errors import NoData
from keda_gpu_scaler.domain.trigger import TriggerSpec, check_cluster_trigger
from keda_gpu_scaler.serving._proto.externalscaler import (
    ExternalScalerBase,
    GetMetricSpecResponse,
    GetMetricsRequest,
    GetMetricsResponse,
    IsActiveResponse,
    MetricSpec,
    MetricValue,
    ScaledObjectRef,
)
from keda_gpu_scaler.serving.decider import Decider
from keda_gpu_scaler.serving.status import streaming, unary
from keda_gpu_scaler.serving.streams import StreamRegistry
from keda_gpu_scaler.serving.telemetry import Telemetry

_INT64_MAX = 2**63 - 1


def metric_spec(spec: TriggerSpec) -> MetricSpec:
    """Both target fields, consistent: KEDA before 2.17 reads only the integer."""
    target = spec.target
    return MetricSpec(
        metric_name=spec.metric_name,
        target_size_float=target,
        target_size=min(_INT64_MAX, max(1, round(target))),
    )


def metric_value(name: str, value: float) -> MetricValue:
    """Both value fields, consistent, never negative or non-finite."""
    if not math.isfinite(value) or value < 0:
        raise NoData(f"refusing to serve {value!r} for {name}")
    return MetricValue(
        metric_name=name,
        metric_value_float=value,
        metric_value=min(_INT64_MAX, round(value)),
    )


class ExternalScalerService(ExternalScalerBase):
    def __init__(
        self,
        decider: Decider,
        streams: StreamRegistry,
        telemetry: Telemetry,
        *,
        cluster: bool = False,
    ) -> None:
        """``cluster``: this is a cluster scaler, where a GPU index or a MIG instance means
        nothing without a ``nodeName`` (refused on every RPC, GetMetricSpec included)."""
        self._decider = decider
        self._streams = streams
        self.telemetry = telemetry
        self._cluster = cluster

    def _key(self, ref: ScaledObjectRef) -> TriggerKey:
        spec = self._decider.parse(ref.scaler_metadata, ref.namespace, ref.name)
        if self._cluster:
            check_cluster_trigger(spec)
        return TriggerKey(ref.namespace, ref.name, spec)

    def _metric_specs(self, ref: ScaledObjectRef) -> GetMetricSpecResponse:
        # Depends on metadata alone, so KEDA's fallback keeps working while GPUs fail, and
        # what StreamMetricSpec sends is what GetMetricSpec answers, always.
        spec = self._key(ref).spec
        return GetMetricSpecResponse(metric_specs=[metric_spec(spec)])

    @unary("GetMetricSpec")
    async def get_metric_spec(self, message: ScaledObjectRef) -> GetMetricSpecResponse:
        return self._metric_specs(message)

    @unary("GetMetrics")
    async def get_metrics(self, message: GetMetricsRequest) -> GetMetricsResponse:
        # `is None`, not `or`: a betterproto2 truth test compares every field.
        ref = message.scaled_object_ref
        if ref is None:
            ref = ScaledObjectRef()
        key = self._key(ref)
        snapshot = await self._decider.snapshot_for(key.spec)
        decision = self._decider.decide(key, snapshot, "GetMetrics")
        name = message.metric_name or key.spec.metric_name
        return GetMetricsResponse(metric_values=[metric_value(name, decision.value)])

    @unary("IsActive")
    async def is_active(self, message: ScaledObjectRef) -> IsActiveResponse:
        key = self._key(message)
        snapshot = await self._decider.snapshot_for(key.spec)
        decision = self._decider.decide(key, snapshot, "IsActive")
        return IsActiveResponse(result=decision.active)

    @streaming("StreamIsActive")
    async def stream_is_active(self, message: ScaledObjectRef) -> AsyncIterator[IsActiveResponse]:
        key = self._key(message)  # bad metadata fails the stream before any message
        await self._decider.snapshot_for(key.spec)  # a first sample, if there is none yet
        async for active in self._streams.stream(key):
            yield IsActiveResponse(result=active)

    @streaming("StreamMetricSpec")
    async def stream_metric_spec(
        self, message: ScaledObjectRef
    ) -> AsyncIterator[GetMetricSpecResponse]:
        """KEDA 2.21 opens it beside StreamIsActive for ``external-push`` triggers: the specs
        at once (bad metadata fails the stream before any message), then nothing until they
        change, which they never do (they depend on the metadata alone); no heartbeat, since
        every message makes KEDA reconcile the ScaledObject and its HPA. The stream stays open
        until KEDA cancels it, and ends with OK when the server shuts down."""
        yield self._metric_specs(message)
        await self._streams.hold()
