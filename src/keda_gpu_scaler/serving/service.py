"""The External Scaler servicer: parse, read a snapshot, decide, convert. Nothing else.

Handlers never touch hardware or the network. The one wait is for the very first
snapshot after start-up, bounded by ``first_snapshot_timeout_s``.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import anyio

from keda_gpu_scaler.domain.cooldown import CooldownBook, cooldown_key
from keda_gpu_scaler.domain.decision import Decision, decide
from keda_gpu_scaler.domain.errors import NoData
from keda_gpu_scaler.domain.snapshot import Snapshot
from keda_gpu_scaler.domain.trigger import TriggerSpec, parse_trigger
from keda_gpu_scaler.pipeline.engines import EngineSubscriptions
from keda_gpu_scaler.pipeline.hub import SnapshotHub
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
from keda_gpu_scaler.serving.status import streaming, unary

log = logging.getLogger(__name__)

_INT64_MAX = 2**63 - 1


_cooldown_key = functools.lru_cache(maxsize=4096)(cooldown_key)


@functools.lru_cache(maxsize=4096)
def _parse_items(items: frozenset[tuple[str, str]]) -> TriggerSpec:
    spec = parse_trigger(dict(items))
    for warning in spec.warnings:
        log.warning("trigger metadata warning", extra={"detail": warning})
    return spec


def parse_cached(metadata: Mapping[str, str]) -> TriggerSpec:
    """Parse once per distinct metadata map; KEDA sends the same map on every call."""
    return _parse_items(frozenset(metadata.items()))


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


class DecisionObserver(Protocol):
    """Told of every decision and every failed one (self-metrics, the debug tap)."""

    def decided(
        self, trigger: str, spec: TriggerSpec, rpc: str, decision: Decision, now: float
    ) -> None: ...

    def failed(
        self, trigger: str, spec: TriggerSpec, rpc: str, reason: str, now: float
    ) -> None: ...


RpcObserver = Callable[[str, str, float | None], None]
"""(method, status code name, seconds or None for a stream)."""


@dataclass(frozen=True, slots=True)
class ServiceStatistics:
    open_streams: int
    cooldown_entries: int


class ExternalScalerService(ExternalScalerBase):
    def __init__(
        self,
        hub: SnapshotHub,
        *,
        cooldowns: CooldownBook | None = None,
        first_snapshot_timeout_s: float = 2.0,
        decisions: DecisionObserver | None = None,
        rpc_observer: RpcObserver | None = None,
        engines: EngineSubscriptions | None = None,
    ) -> None:
        self._hub = hub
        self._engines = engines
        self._decisions = decisions
        self._rpc_observer = rpc_observer
        self._cooldowns = cooldowns or CooldownBook()
        self._first_snapshot_timeout_s = first_snapshot_timeout_s
        self._closing = False
        self._waits: set[anyio.CancelScope] = set()
        self._open_streams = 0
        self._streams_ended: anyio.Event | None = None

    def set_rpc_observer(self, observer: RpcObserver | None) -> None:
        self._rpc_observer = observer

    def observe_rpc(self, method: str, code: str, seconds: float | None) -> None:
        if self._rpc_observer is not None:
            self._rpc_observer(method, code, seconds)

    def statistics(self) -> ServiceStatistics:
        return ServiceStatistics(self._open_streams, len(self._cooldowns))

    @property
    def open_streams(self) -> int:
        return self._open_streams

    def begin_shutdown(self) -> None:
        """End every open stream with status OK (KEDA reconnects within 2 s)."""
        self._closing = True
        self._streams_ended = anyio.Event()
        if not self._open_streams:
            self._streams_ended.set()
        for scope in list(self._waits):
            scope.cancel()

    async def wait_streams_ended(self) -> None:
        """After :meth:`begin_shutdown`, until every stream handler has returned."""
        if self._streams_ended is not None:
            await self._streams_ended.wait()

    # -- unary RPCs -------------------------------------------------------------------

    @unary("GetMetricSpec")
    async def get_metric_spec(self, message: ScaledObjectRef) -> GetMetricSpecResponse:
        # Depends on metadata alone, so KEDA's fallback keeps working while GPUs fail.
        spec = parse_cached(message.scaler_metadata)
        return GetMetricSpecResponse(metric_specs=[metric_spec(spec)])

    @unary("GetMetrics")
    async def get_metrics(self, message: GetMetricsRequest) -> GetMetricsResponse:
        # `is None`, not `or`: a betterproto2 truth test compares every field.
        ref = message.scaled_object_ref
        if ref is None:
            ref = ScaledObjectRef()
        spec = parse_cached(ref.scaler_metadata)
        decision = self._decide(ref, spec, await self._snapshot(spec), "GetMetrics")
        name = message.metric_name or spec.metric_name
        return GetMetricsResponse(metric_values=[metric_value(name, decision.value)])

    @unary("IsActive")
    async def is_active(self, message: ScaledObjectRef) -> IsActiveResponse:
        spec = parse_cached(message.scaler_metadata)
        decision = self._decide(message, spec, await self._snapshot(spec), "IsActive")
        return IsActiveResponse(result=decision.active)

    # -- streams ----------------------------------------------------------------------

    @streaming("StreamIsActive")
    async def stream_is_active(self, message: ScaledObjectRef) -> AsyncIterator[IsActiveResponse]:
        spec = parse_cached(message.scaler_metadata)
        self._open_streams += 1
        try:
            async for active in self._activity(message, spec):
                yield IsActiveResponse(result=active)
        finally:
            self._open_streams -= 1
            if self._streams_ended is not None and not self._open_streams:
                self._streams_ended.set()

    async def _activity(self, ref: ScaledObjectRef, spec: TriggerSpec) -> AsyncIterator[bool]:
        """The current activity at once, again on every change and every poll interval.

        A failed reading is logged and skipped: it is never sent as activity.
        """
        last: bool | None = None
        sent_at = -math.inf
        failure: str | None = None
        await self._snapshot(spec)
        target = spec.engine_target
        while not self._closing:
            if target is not None and self._engines is not None:
                self._engines.touch(target)  # a stream keeps its engine sampler alive
            snapshot = self._hub.current
            now = anyio.current_time()
            try:
                active: bool | None = self._decide(ref, spec, snapshot, "StreamIsActive").active
            except NoData as exc:
                active = None
                failure = self._log_stream_failure(ref, spec, failure, str(exc))
            else:
                failure = None
            if active is not None and (active != last or now - sent_at >= spec.poll_interval_s):
                last, sent_at = active, now
                yield active
            # After a failure, try again on the next snapshot or a poll interval from now;
            # a deadline already past would spin without ever yielding to time.
            since = now if active is None else sent_at
            await self._wait_newer(snapshot.version, deadline=since + spec.poll_interval_s)

    def _log_stream_failure(
        self, ref: ScaledObjectRef, spec: TriggerSpec, previous: str | None, reason: str
    ) -> str:
        if reason != previous:
            log.warning(
                "stream skips a tick: no usable reading",
                extra={
                    "trigger": f"{ref.namespace}/{ref.name}",
                    "metric": spec.metric_name,
                    "reason": reason,
                },
            )
        return reason

    async def _wait_newer(self, version: int, *, deadline: float) -> None:
        with anyio.CancelScope(deadline=deadline) as scope:
            self._waits.add(scope)
            try:
                await self._hub.wait_newer(version)
            finally:
                self._waits.discard(scope)

    # -- helpers ----------------------------------------------------------------------

    async def _snapshot(self, spec: TriggerSpec) -> Snapshot:
        """The newest snapshot; the one wait allowed is for a source's very first sample."""
        target = spec.engine_target
        if target is not None:
            if self._engines is None:
                raise NoData(f"engine sampling is not enabled on this server ({target.url})")
            await self._engines.ensure(target)
            return self._hub.current
        snapshot = self._hub.current
        if snapshot.version == 0:
            with anyio.move_on_after(self._first_snapshot_timeout_s):
                snapshot = await self._hub.wait_newer(0)
        return snapshot

    def _decide(
        self, ref: ScaledObjectRef, spec: TriggerSpec, snapshot: Snapshot, rpc: str
    ) -> Decision:
        key = _cooldown_key(ref.namespace, ref.name, spec)
        now = anyio.current_time()
        try:
            decision = decide(spec, snapshot, self._cooldowns.get(key), now)
        except NoData as exc:
            if self._decisions is not None:
                self._decisions.failed(f"{ref.namespace}/{ref.name}", spec, rpc, str(exc), now)
            raise
        self._cooldowns.put(key, decision.cooldown.entry)
        if self._decisions is not None:
            self._decisions.decided(f"{ref.namespace}/{ref.name}", spec, rpc, decision, now)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "decision",
                extra={
                    "trigger": f"{ref.namespace}/{ref.name}",
                    "metric": spec.metric_name,
                    "value": decision.value,
                    "active": decision.active,
                    "why": decision.explanation,
                },
            )
        return decision
