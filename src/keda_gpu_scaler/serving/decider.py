"""Decisions for the servicer and its streams, shared where they can be.

KEDA sends the same metadata map on every call of a ScaledObject, and hundreds of objects
often share one map. So, per server:

- metadata is parsed once per distinct map (typo warnings are logged once per ScaledObject,
  naming it);
- the measured value of a trigger spec is computed once per snapshot version and shared by
  every stream and unary call with that spec, until a reading it used goes stale; a later
  version that changed nothing it read (on a cluster scaler, an update of another node)
  keeps it (:class:`~keda_gpu_scaler.domain.device_selection.Basis`);
- only the cooldown entry and the activity are per ScaledObject (cheap);
- a trigger with ``windowSeconds`` tells the hub's :class:`HistoryDemand` to keep that much
  of its metric's history, as soon as its metadata is first parsed (KEDA's GetMetricSpec),
  so the window is filling before the first value is asked for;
- on a cluster scaler, a trigger with ``podSelector`` tells the pod watch's
  :class:`~keda_gpu_scaler.pipeline.podnamespaces.PodNamespaces` to cover its namespace,
  likewise as soon as it is first parsed.

The one wait allowed on a KEDA call path is for a source's very first sample
(:meth:`Decider.snapshot_for`); on a cluster scaler, that includes the first list of the
pods of a namespace the pod watch started watching late. Either wait lasts at most
``first_snapshot_timeout_s`` (2 s), once: then the call answers UNAVAILABLE, never 0.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import anyio

from keda_gpu_scaler.domain.attribution import pods_coverage_reason
from keda_gpu_scaler.domain.cooldown import CooldownBook
from keda_gpu_scaler.domain.decision import Decision, Measurement, TriggerKey, judge, measure
from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData
from keda_gpu_scaler.domain.snapshot import Snapshot
from keda_gpu_scaler.domain.trigger import TriggerSpec, parse_trigger
from keda_gpu_scaler.pipeline.engines import EngineSubscriptions
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.podnamespaces import PodNamespaces
from keda_gpu_scaler.serving.telemetry import NoTelemetry, Telemetry

log = logging.getLogger(__name__)

MAX_CACHED = 4096
"""Distinct metadata maps and trigger specs remembered; past it a cache starts afresh."""

Measure = Callable[[TriggerSpec, Snapshot, float, Measurement | None], Measurement]
"""``measure``'s signature: the spec, the snapshot, the time, and the spec's last
measurement (whose unchanged nodes' parts it may reuse)."""


@dataclass(frozen=True, slots=True)
class _Measured:
    version: int
    valid_until: float
    measurement: Measurement | None
    error: NoData | InvalidTrigger | None

    def holds(self, snapshot: Snapshot) -> bool:
        """Whether this measurement is also that of ``snapshot`` (a later version)."""
        m = self.measurement
        return m is not None and m.basis is not None and m.basis.holds(snapshot)

    def result(self) -> Measurement:
        if self.error is not None:
            raise self.error
        assert self.measurement is not None
        return self.measurement


class Decider:
    def __init__(
        self,
        hub: SnapshotHub,
        *,
        telemetry: Telemetry | None = None,
        engines: EngineSubscriptions | None = None,
        first_snapshot_timeout_s: float = 2.0,
        measure: Measure = measure,
        pod_namespaces: PodNamespaces | None = None,
    ) -> None:
        """``pod_namespaces``: on a cluster scaler, the namespaces its pod watch covers
        (podSelector triggers add theirs); None on a node agent, which watches its node's
        pods of every namespace."""
        self._hub = hub
        self._telemetry = telemetry or NoTelemetry()
        self._engines = engines
        self._first_snapshot_timeout_s = first_snapshot_timeout_s
        self._measure = measure
        self._cooldowns: CooldownBook[TriggerKey] = CooldownBook()
        self._specs: dict[tuple[frozenset[tuple[str, str]], str], TriggerSpec] = {}
        self._warned: set[tuple[str, str, TriggerSpec]] = set()
        self._measured: dict[TriggerSpec, _Measured] = {}
        self._pod_namespaces = pod_namespaces
        self._pod_waits: dict[str, float] = {}
        """Until when a call may wait for a namespace's pods: the first-sample wait from
        the first call that found them missing."""

    # -- parse ------------------------------------------------------------------------

    def parse(self, metadata: Mapping[str, str], namespace: str, name: str) -> TriggerSpec:
        """The spec of a metadata map, parsed once per distinct map and namespace (the
        default of ``podNamespace``)."""
        items = (frozenset(metadata.items()), namespace)
        spec = self._specs.get(items)
        if spec is None:
            spec = parse_trigger(metadata, namespace)
            if len(self._specs) >= MAX_CACHED:
                self._specs.clear()
            self._specs[items] = spec
            self._demand(spec)
        if spec.warnings:
            self._warn_once(spec, namespace, name)
        return spec

    def _demand(self, spec: TriggerSpec) -> None:
        """Tell the producers what ``spec`` will read: its window's history, and on a
        cluster scaler its pods' namespace."""
        if spec.window_s:
            self._hub.history.require(spec.metric_type, spec.window_s)
        if spec.pod_namespace is not None and self._pod_namespaces is not None:
            self._pod_namespaces.require(spec.pod_namespace)

    def _warn_once(self, spec: TriggerSpec, namespace: str, name: str) -> None:
        seen = (namespace, name, spec)
        if seen in self._warned:
            return
        if len(self._warned) >= MAX_CACHED:
            self._warned.clear()
        self._warned.add(seen)
        for warning in spec.warnings:
            log.warning(
                "trigger metadata warning",
                extra={"trigger": f"{namespace}/{name}", "detail": warning},
            )

    # -- read -------------------------------------------------------------------------

    async def snapshot_for(self, spec: TriggerSpec) -> Snapshot:
        """The newest snapshot; the one wait allowed is for a source's very first sample
        (on a cluster scaler, that of the pods of ``spec``'s namespace too).

        Raises :class:`NoData` when the pod watch does not cover ``spec``'s namespace once
        that wait is over (its pods are unknown, never none)."""
        target = spec.engine_target
        if target is not None:
            if self._engines is None:
                raise NoData(f"engine sampling is not enabled on this server ({target.url})")
            await self._engines.ensure(target)
            return self._hub.current
        started = anyio.current_time()
        snapshot = self._hub.current
        if snapshot.version == 0:
            with anyio.move_on_after(self._first_snapshot_timeout_s):
                snapshot = await self._hub.wait_newer(0)
        namespace = spec.pod_namespace
        if namespace is None or self._pod_namespaces is None:
            return snapshot
        snapshot = await self._covering(namespace, snapshot, started)
        reason = pods_coverage_reason(snapshot.pods, namespace)
        if reason is not None:
            raise NoData(reason)
        return snapshot

    async def _covering(self, namespace: str, snapshot: Snapshot, started: float) -> Snapshot:
        """A snapshot whose pods cover ``namespace``, waited for while they may still come
        (the pod watch watches it), at most until the first-sample wait from the first call
        that found them missing; else the newest."""
        assert self._pod_namespaces is not None
        if _covers(snapshot, namespace) or not self._pod_namespaces.watches(namespace):
            return snapshot
        if len(self._pod_waits) >= MAX_CACHED:
            self._pod_waits.clear()
        deadline = self._pod_waits.setdefault(namespace, started + self._first_snapshot_timeout_s)
        with anyio.CancelScope(deadline=deadline):
            while not _covers(snapshot, namespace):
                snapshot = await self._hub.wait_newer(snapshot.version)
        return self._hub.current

    def keep_alive(self, spec: TriggerSpec) -> None:
        """A stream keeps its engine sampler running as unary calls do."""
        target = spec.engine_target
        if target is not None and self._engines is not None:
            self._engines.touch(target)

    # -- decide -----------------------------------------------------------------------

    def measurement(self, spec: TriggerSpec, snapshot: Snapshot, now: float) -> Measurement:
        """The measured value of ``spec``: computed once per snapshot version and shared
        until a reading it used goes stale. Raises :class:`NoData` or
        :class:`InvalidTrigger` as :func:`~keda_gpu_scaler.domain.decision.measure` does."""
        cached = self._measured.get(spec)
        if cached is not None and cached.version != snapshot.version and cached.holds(snapshot):
            # Nothing it read changed (another node's update made this version): it holds.
            cached = self._measured[spec] = replace(cached, version=snapshot.version)
        if cached is None or cached.version != snapshot.version or now > cached.valid_until:
            cached = self._measure_now(spec, snapshot, now)
        return cached.result()

    def _measure_now(self, spec: TriggerSpec, snapshot: Snapshot, now: float) -> _Measured:
        self._demand(spec)  # a spec that did not come through parse()
        try:
            last = self._measured.get(spec)
            measured = self._measure(
                spec, snapshot, now, None if last is None else last.measurement
            )
        except (NoData, InvalidTrigger) as exc:
            # A failure holds for the version: stale stays stale, lost stays lost. A window
            # that is not covered becomes covered only as a stale stretch leaves it; that is
            # looked at again with the source's next reading, a new version.
            cached = _Measured(snapshot.version, float("inf"), None, exc)
        else:
            cached = _Measured(snapshot.version, measured.fresh_until, measured, None)
        if len(self._measured) >= MAX_CACHED:
            self._measured.clear()
        self._measured[spec] = cached
        return cached

    def decide(self, key: TriggerKey, snapshot: Snapshot, rpc: str) -> Decision:
        """The decision for one trigger of one ScaledObject, its cooldown entry updated."""
        now = anyio.current_time()
        try:
            measured = self.measurement(key.spec, snapshot, now)
        except NoData as exc:
            self._telemetry.failed(key, rpc, str(exc), now)
            raise
        decision = judge(key.spec, measured, self._cooldowns.get(key), now)
        self._cooldowns.put(key, decision.cooldown.entry)
        self._telemetry.decided(key, rpc, decision, now)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "decision",
                extra={
                    "trigger": str(key),
                    "metric": key.spec.metric_name,
                    "value": decision.value,
                    "active": decision.active,
                    "why": decision.explanation,
                },
            )
        return decision


def _covers(snapshot: Snapshot, namespace: str) -> bool:
    """Whether the snapshot's pods are those of ``namespace`` too."""
    pods = snapshot.pods
    return pods is not None and (pods.namespaces is None or namespace in pods.namespaces)
