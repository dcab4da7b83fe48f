"""Self-metrics (Prometheus), fed without touching the hot path.

GPU, source (cycles and faults included: the snapshot's counts are the one count), stream
and tap series are read from live views at scrape time, so they are never stale and a GPU
that disappears disappears from /metrics. RPC counters and the histograms are fed through
the :class:`~keda_gpu_scaler.serving.telemetry.Telemetry` protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import anyio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from keda_gpu_scaler.domain.attribution import attribute
from keda_gpu_scaler.domain.catalog import CATALOG, Origin
from keda_gpu_scaler.domain.decision import Decision, TriggerKey
from keda_gpu_scaler.domain.dra import is_joined, is_unidentified
from keda_gpu_scaler.domain.samples import Batch, GpuReading, Sample
from keda_gpu_scaler.domain.snapshot import LOCAL_NODE, Snapshot
from keda_gpu_scaler.pipeline.tap import Tap, TapDecision

PREFIX = "keda_gpu_scaler"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DECISION_TTL_S = 600.0
"""A trigger not evaluated for this long leaves /metrics (its ScaledObject is gone)."""
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_GPU_METRICS = [info for info in CATALOG.values() if info.origin is Origin.GPU]


def gpu_series_name(metric_type: str) -> str:
    """``gpu_utilization`` -> ``keda_gpu_scaler_gpu_utilization``; others get ``gpu_``."""
    return f"{PREFIX}_gpu_{metric_type.removeprefix('gpu_')}"


@dataclass(frozen=True, slots=True)
class _LastDecision:
    value: float | None
    target: float
    active: bool | None
    at: float


class LastDecisions:
    """The last value and activity served per (trigger, metric), for the trigger gauges."""

    def __init__(self, *, ttl_s: float = DECISION_TTL_S) -> None:
        self._last: dict[tuple[str, str], _LastDecision] = {}
        self._ttl_s = ttl_s

    def record(self, key: TriggerKey, decision: Decision | None, now: float) -> None:
        value = None if decision is None else decision.value
        active = None if decision is None else decision.active
        self._last[(str(key), key.spec.metric_name)] = _LastDecision(
            value, key.spec.target, active, now
        )

    def live(self, now: float) -> list[tuple[tuple[str, str], _LastDecision]]:
        """Entries evaluated within the TTL; older ones (a ScaledObject gone) are dropped."""
        expired = [k for k, last in self._last.items() if now - last.at > self._ttl_s]
        for k in expired:
            del self._last[k]
        return list(self._last.items())


class SelfMetrics:
    """The serving :class:`~keda_gpu_scaler.serving.telemetry.Telemetry`: counters and
    histograms fed as things happen, the trigger gauges, and the debug tap's decisions.

    Series about live state (GPUs, sources, streams, the tap) are read at scrape time from
    the read-only views given to :meth:`read_live`.
    """

    def __init__(self, tap: Tap | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._tap = tap
        self.decisions = LastDecisions()
        self.rpc_requests = Counter(
            f"{PREFIX}_grpc_requests",
            "gRPC requests answered, by method and status code",
            ["method", "code"],
            registry=self.registry,
        )
        self.rpc_seconds = Histogram(
            f"{PREFIX}_grpc_request_duration_seconds",
            "time to answer a unary gRPC request",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.cycle_seconds = Histogram(
            f"{PREFIX}_sampler_cycle_duration_seconds",
            "time one sampler cycle took to read",
            ["source"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.partial_answers = Counter(
            f"{PREFIX}_partial_answers",
            "decisions a cluster scaler made from a partial view (some selected GPUs missing)",
            ["trigger", "metric"],
            registry=self.registry,
        )
        self._rpc_children: dict[tuple[str, str], Counter] = {}
        self._latency_children: dict[str, Histogram] = {}

    def read_live(
        self,
        snapshot: Callable[[], Snapshot],
        open_streams: Callable[[], int],
        *,
        spec_streams: Callable[[], int] | None = None,
        agent_streams: Callable[[], int] | None = None,
        pod_attribution: bool | None = None,
    ) -> None:
        """Serve the live series from these views (called once, by the composition root);
        ``spec_streams`` counts open StreamMetricSpec streams, ``agent_streams`` open
        NodeAgent.WatchNode streams, where they are served; ``pod_attribution`` says whether a
        node agent reads the kubelet's PodResources socket (None on a cluster scaler, whose
        attribution comes from the agents)."""
        collector = _LiveCollector(snapshot, open_streams, self.decisions, self._tap)
        collector.spec_streams = spec_streams
        collector.agent_streams = agent_streams
        self.registry.register(collector)
        if pod_attribution is not None:
            configured = Gauge(
                f"{PREFIX}_pod_attribution_configured",
                "1 when this node agent reads the kubelet's PodResources socket; 0 when pod "
                "attribution is not configured (no socket given, outside Kubernetes)",
                registry=self.registry,
            )
            configured.set(1.0 if pod_attribution else 0.0)

    # -- Telemetry --------------------------------------------------------------------

    def folded(self, batch: list[Sample], snapshot: Snapshot) -> None:
        for sample in batch:
            if isinstance(sample, Batch) and sample.cycle_s is not None:
                self.cycle_seconds.labels(sample.source).observe(sample.cycle_s)

    def decided(self, key: TriggerKey, rpc: str, decision: Decision, now: float) -> None:
        self.decisions.record(key, decision, now)
        if decision.measurement.coverage:
            self.partial_answers.labels(str(key), key.spec.metric_name).inc()
        if self._tap is not None and self._tap.listening:
            self._tap.publish(_tap_decision(key, rpc, now, decision.explanation, decision))

    def failed(self, key: TriggerKey, rpc: str, reason: str, now: float) -> None:
        self.decisions.record(key, None, now)
        if self._tap is not None and self._tap.listening:
            self._tap.publish(_tap_decision(key, rpc, now, reason, None, error=reason))

    def answered(self, method: str, code: str, seconds: float | None) -> None:
        # labels() takes a lock and builds a key each call; the children never change.
        counter = self._rpc_children.get((method, code))
        if counter is None:
            counter = self._rpc_children[(method, code)] = self.rpc_requests.labels(method, code)
        counter.inc()
        if seconds is not None:
            histogram = self._latency_children.get(method)
            if histogram is None:
                histogram = self._latency_children[method] = self.rpc_seconds.labels(method)
            histogram.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _tap_decision(
    key: TriggerKey,
    rpc: str,
    now: float,
    why: str,
    decision: Decision | None,
    *,
    error: str | None = None,
) -> TapDecision:
    spec = key.spec
    return TapDecision(
        trigger=str(key),
        metric=spec.metric_name,
        metric_type=spec.metric_type.value,
        rpc=rpc,
        at=now,
        value=None if decision is None else decision.value,
        target=spec.target,
        active=None if decision is None else decision.active,
        why=why,
        error=error,
    )


class _LiveCollector(Collector):
    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        open_streams: Callable[[], int],
        decisions: LastDecisions,
        tap: Tap | None,
    ) -> None:
        self._snapshot = snapshot
        self._open_streams = open_streams
        self._decisions = decisions
        self._tap = tap
        self.spec_streams: Callable[[], int] | None = None
        self.agent_streams: Callable[[], int] | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        now = anyio.current_time()
        snapshot = self._snapshot()
        yield from _gpu_families(snapshot, now)
        yield from _attribution_families(snapshot)
        yield from _dra_counts(snapshot)
        yield from _agent_families(snapshot)
        yield from _source_families(snapshot, now)
        yield from _decision_families(self._decisions, now)
        streams = GaugeMetricFamily(f"{PREFIX}_open_streams", "open StreamIsActive streams")
        streams.add_metric([], self._open_streams())
        yield streams
        if self.spec_streams is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_open_metric_spec_streams",
                "open StreamMetricSpec streams",
                value=self.spec_streams(),
            )
        if self.agent_streams is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_agent_streams",
                "open WatchNode streams (cluster scalers reading this node agent)",
                value=self.agent_streams(),
            )
        if self._tap is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_tap_subscribers", "debug tap readers", value=self._tap.subscribers
            )
            yield GaugeMetricFamily(
                f"{PREFIX}_tap_dropped_events",
                "tap events dropped for slow readers",
                value=self._tap.dropped,
            )


_GPU_LABELS = ["index", "uuid", "name", "mig_instance"]


def _labels(reading: GpuReading) -> list[str]:
    mig = ""
    if reading.is_mig_instance():
        mig = f"{reading.parent_index}:{reading.gpu_instance_id}"
    return [str(reading.index), reading.uuid, reading.name, mig]


def _gpu_families(snapshot: Snapshot, now: float) -> Iterator[Metric]:
    devices = snapshot.ordered_devices()
    count = GaugeMetricFamily(
        f"{PREFIX}_gpu_device_count", "GPUs and MIG instances with a fresh reading"
    )
    count.add_metric([], sum(not d.is_lost() and not d.is_stale(now) for d in devices))
    yield count
    lost = GaugeMetricFamily(
        f"{PREFIX}_gpu_lost", "1 while a device is lost", labels=["index", "uuid"]
    )
    for device in devices:
        lost.add_metric([str(device.index), device.key], 1.0 if device.is_lost() else 0.0)
    yield lost
    fresh = [
        d.reading
        for d in devices
        if d.reading is not None and not d.is_lost() and not d.is_stale(now)
    ]
    total = GaugeMetricFamily(
        f"{PREFIX}_gpu_memory_total_bytes", "VRAM in all (bytes)", labels=_GPU_LABELS
    )
    for reading in fresh:
        if reading.memory_total_bytes is not None:
            total.add_metric(_labels(reading), reading.memory_total_bytes)
    yield total
    for info in _GPU_METRICS:
        assert info.read is not None
        family = GaugeMetricFamily(
            gpu_series_name(info.type.value),
            f"{info.description} ({info.unit})",
            labels=_GPU_LABELS,
        )
        for reading in fresh:
            value = info.read(reading)
            if value is not None:
                family.add_metric(_labels(reading), value)
        yield family


_HOLDER_LABELS = ["namespace", "pod", "container", "resource", "device_id"]


def _agent_families(snapshot: Snapshot) -> Iterator[Metric]:
    """On a cluster scaler: every node agent discovery sees, ready (linked) or not."""
    if snapshot.agents is None:
        return
    agents = GaugeMetricFamily(
        f"{PREFIX}_agent_targets",
        "1 per node agent discovery sees; ready ones are linked, not-ready ones only listed",
        labels=["address", "node", "pod", "ready"],
    )
    for target in snapshot.agents.targets:
        ready = "true" if target.ready else "false"
        agents.add_metric([target.address, target.node, target.pod, ready], 1.0)
    yield agents


def _attribution_families(snapshot: Snapshot) -> Iterator[Metric]:
    """Who holds each device (an info series per holder, to join on ``uuid``), the device IDs
    that match no device NVML reports, and DRA allocations, from the last kubelet answer."""
    joined = attribute(snapshot)
    if joined is None or snapshot.attribution is None:
        return
    info = GaugeMetricFamily(
        f"{PREFIX}_gpu_pod_info",
        "1 per pod container holding a GPU or MIG instance (kubelet PodResources)",
        labels=["index", "uuid", "mig_instance", *_HOLDER_LABELS],
    )
    for device in snapshot.ordered_devices():
        mig = device.label.removeprefix("MIG ") if device.label.startswith("MIG ") else ""
        for h in joined.holders(device.key):
            row = [h.namespace, h.pod, h.container, h.resource, h.device_id]
            info.add_metric([str(device.index), device.key, mig, *row], 1.0)
    yield info
    unmatched = GaugeMetricFamily(
        f"{PREFIX}_pod_resources_unmatched_devices",
        "1 per device ID held by a pod that matches no device NVML reports (never guessed)",
        labels=_HOLDER_LABELS,
    )
    for h in joined.unmatched:
        unmatched.add_metric([h.namespace, h.pod, h.container, h.resource, h.device_id], 1.0)
    yield unmatched
    local = snapshot.nodes[LOCAL_NODE]
    dra = GaugeMetricFamily(
        f"{PREFIX}_pod_resources_dra_devices",
        "1 per DRA device allocated to a pod container, with the NVML device it was joined "
        "to (uuid) or why not (outcome)",
        labels=_DRA_LABELS,
    )
    for d in local.dra:
        row = [d.namespace, d.pod, d.container, d.claim, d.driver, d.pool, d.device]
        dra.add_metric([*row, d.key or "", d.outcome], 1.0)
    yield dra


_DRA_LABELS = ["namespace", "pod", "container", "claim", "driver", "pool", "device"]
_DRA_LABELS += ["uuid", "outcome"]


def _dra_counts(snapshot: Snapshot) -> Iterator[Metric]:
    """DRA devices by driver, result (joined, unidentified, not_a_gpu) and outcome, over
    every node's last kubelet answer."""
    counts: dict[tuple[str, str, str], int] = {}
    for view in snapshot.nodes.values():
        for d in view.dra:
            result = (
                "joined" if is_joined(d) else "unidentified" if is_unidentified(d) else d.outcome
            )
            key = (d.driver, result, d.outcome)
            counts[key] = counts.get(key, 0) + 1
    family = GaugeMetricFamily(
        f"{PREFIX}_dra_devices",
        "DRA devices held by pods, by driver, result of the join to NVML (joined, "
        "unidentified: their pods' triggers are UNAVAILABLE, not_a_gpu) and outcome",
        labels=["driver", "result", "outcome"],
    )
    for labels, count in sorted(counts.items()):
        family.add_metric(list(labels), count)
    yield family


def _source_families(snapshot: Snapshot, now: float) -> Iterator[Metric]:
    age = GaugeMetricFamily(
        f"{PREFIX}_source_reading_age_seconds",
        "age of the newest reading, by source",
        labels=["source"],
    )
    up = GaugeMetricFamily(
        f"{PREFIX}_source_up",
        "1 when the source's last word was a reading, 0 after a failure",
        labels=["source"],
    )
    cycles = CounterMetricFamily(
        f"{PREFIX}_sampler_cycles", "sampler cycles folded, by source", labels=["source"]
    )
    errors = CounterMetricFamily(
        f"{PREFIX}_sampler_errors",
        "sampler faults (a device, a scrape or the whole source), by source",
        labels=["source"],
    )
    for name, state in sorted(snapshot.sources.items()):
        if state.last_sample_at is not None:
            age.add_metric([name], now - state.last_sample_at)
        up.add_metric([name], 0.0 if state.fault is not None else 1.0)
        cycles.add_metric([name], state.cycles)
        errors.add_metric([name], state.faults)
    yield age
    yield up
    yield cycles
    yield errors


def _decision_families(decisions: LastDecisions, now: float) -> Iterator[Metric]:
    labels = ["trigger", "metric"]
    value = GaugeMetricFamily(f"{PREFIX}_trigger_value", "last value served", labels=labels)
    target = GaugeMetricFamily(f"{PREFIX}_trigger_target", "the trigger's target", labels=labels)
    active = GaugeMetricFamily(f"{PREFIX}_trigger_active", "1 when active", labels=labels)
    for key, last in decisions.live(now):
        target.add_metric(list(key), last.target)
        if last.value is not None and last.active is not None:
            value.add_metric(list(key), last.value)
            active.add_metric(list(key), 1.0 if last.active else 0.0)
    yield value
    yield target
    yield active
