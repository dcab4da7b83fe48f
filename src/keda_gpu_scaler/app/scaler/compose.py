"""Wiring: a source under supervision, the aggregator, and the gRPC server, in one task group."""

from __future__ import annotations

import gc
import logging
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from ssl import SSLContext
from typing import TYPE_CHECKING

import anyio
import httpx
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.engines import EngineTarget
from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.domain.samples import POD_RESOURCES_SOURCE, AgentsReading, Sample
from keda_gpu_scaler.pipeline.agents import AgentLinkFactory, AgentLinks
from keda_gpu_scaler.pipeline.aggregator import Aggregator, FoldObserver
from keda_gpu_scaler.pipeline.engines import EngineSubscriptions
from keda_gpu_scaler.pipeline.hub import SnapshotHub
from keda_gpu_scaler.pipeline.podnamespaces import PodNamespaces
from keda_gpu_scaler.pipeline.supervisor import Sampler, supervise
from keda_gpu_scaler.pipeline.tap import Tap
from keda_gpu_scaler.serving.decider import Decider
from keda_gpu_scaler.serving.http import HttpServer, Route
from keda_gpu_scaler.serving.node_agent import NodeAgentService
from keda_gpu_scaler.serving.observability import SelfMetrics
from keda_gpu_scaler.serving.probes import Readiness, grpc_health
from keda_gpu_scaler.serving.routes import metrics_routes, probe_routes
from keda_gpu_scaler.serving.server import DEFAULT_MAX_CONCURRENT_STREAMS, ScalerServer
from keda_gpu_scaler.serving.service import ExternalScalerService
from keda_gpu_scaler.serving.streams import StreamRegistry
from keda_gpu_scaler.sources.engines.http import (
    EngineScraper,
    Resolver,
    ScrapePolicy,
    new_engine_client,
    system_resolver,
)
from keda_gpu_scaler.sources.engines.sampler import DEFAULT_INTERVAL_S, EngineSampler
from keda_gpu_scaler.sources.replay import ReplaySampler

if TYPE_CHECKING:
    from keda_gpu_scaler.sources.agents import AgentDiscovery, AgentTlsConfig
    from keda_gpu_scaler.sources.kubelet import DraDrivers, ResourceNames

log = logging.getLogger(__name__)

SAMPLE_BUFFER = 1024


def build_source(
    spec: str,
    *,
    interval_s: float = 1.0,
    cluster: bool = False,
    host_proc: str = "",
    process_interval_s: float = 5.0,
    mig_layout_interval_s: float = 5.0,
) -> Sampler:
    """``nvml``, ``replay`` (the bundled H200 trace) or ``replay:PATH``; ``cluster`` when
    the command also takes ``agents`` (which its caller builds), so that a wrong value is
    told every choice there is. ``host_proc`` (the host's ``/proc``; empty: off) and
    ``process_interval_s`` are NVML's per-process readings; ``mig_layout_interval_s`` how
    often NVML's MIG layouts are read again (dynamic MIG).

    Raises :class:`SourceUnavailable` with a one-line reason; never falls back to fake data.
    """
    if spec == "replay":
        return ReplaySampler.bundled()
    if spec.startswith("replay:"):
        path = spec.removeprefix("replay:")
        if not path.strip():
            raise SourceUnavailable(
                f'source "{spec}": the path is missing: replay:PATH names a recording '
                "(gpu-metrics record --output PATH); replay alone is the bundled one"
            )
        return ReplaySampler.from_path(Path(path))
    if spec == "nvml":
        from keda_gpu_scaler.sources.nvml import open_nvml_sampler

        return open_nvml_sampler(
            interval_s=interval_s,
            process_interval_s=process_interval_s,
            host_proc=host_proc,
            mig_layout_interval_s=mig_layout_interval_s,
        )
    choices = (
        "nvml, replay, replay:PATH or agents (a cluster scaler, with --agents)"
        if cluster
        else "nvml, replay or replay:PATH"
    )
    raise SourceUnavailable(f'unknown source "{spec}": use {choices}')


CLUSTER_FOLD_INTERVAL_S = 0.01
"""How often at most a cluster scaler folds its agents' updates into a snapshot."""


class AgentsSource:
    """A cluster scaler's source: discovery of the node agents and one link per ready agent
    (``--source agents --agents SPEC``). Each link is a supervised sampler of its own, so one
    agent's failures never touch another's readings."""

    name = "agents"

    def __init__(
        self,
        discovery: AgentDiscovery,
        link: AgentLinkFactory,
    ) -> None:
        self._discovery = discovery
        self._link = link

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        targets, found = anyio.create_memory_object_stream[AgentsReading](16)
        links = AgentLinks(found, send, self._link)
        async with anyio.create_task_group() as tg:
            await tg.start(links.run)
            await tg.start(self._discovery.run, targets)
            task_status.started()


def build_agents_source(
    spec: str,
    *,
    tls: AgentTlsConfig | None = None,
    kubeconfig: str | None = None,
) -> AgentsSource:
    """``--agents SPEC`` (``endpoints:``, ``dns:``, ``static:``) and the links' TLS settings.

    Raises :class:`SourceUnavailable` (bad TLS files) or ``ValueError`` (a bad SPEC)."""
    from keda_gpu_scaler.sources.agents import (
        AgentLink,
        build_agent_client_context,
        discovery_for,
        parse_agents,
    )

    context = None if tls is None else build_agent_client_context(tls)
    server_name = "" if tls is None else tls.server_name
    discovery = discovery_for(parse_agents(spec), kubeconfig=kubeconfig)
    return AgentsSource(
        discovery,
        lambda target, gate: AgentLink(target, ssl=context, server_name=server_name, gate=gate),
    )


def build_cluster_pods(
    namespaces: PodNamespaces | None = None, *, kubeconfig: str | None = None
) -> list[Sampler]:
    """A cluster scaler's pod watch: the pods of every node, whose labels ``podSelector``
    triggers match, of the namespaces ``namespaces`` says (``--pod-namespaces``: those
    triggers name, as they come, following it; a fixed list; all), or of all namespaces
    when None. The decider gets the same ``namespaces`` (:func:`open_scaler`)."""
    from keda_gpu_scaler.sources.kube import PodWatcher

    if namespaces is not None and namespaces.on_demand:
        return [PodWatcher.cluster(demand=namespaces, kubeconfig=kubeconfig)]
    fixed = None if namespaces is None or namespaces.names is None else sorted(namespaces.names)
    return [PodWatcher.cluster(fixed, kubeconfig=kubeconfig)]


@dataclass(frozen=True, slots=True)
class AttributionOptions:
    """Which pod holds which GPU: the kubelet socket (empty: off) and this node's name for
    the pod watch (empty: off)."""

    socket_path: str = ""
    interval_s: float = 5.0
    resource_names: ResourceNames | None = None
    """None: ``nvidia.com/gpu`` and ``nvidia.com/mig-*``."""
    node_name: str = ""
    kubeconfig: str | None = None
    """None: ``KUBECONFIG`` or the in-cluster service account."""
    dra_drivers: DraDrivers | None = None
    """The DRA drivers whose devices are GPUs; None: ``gpu.nvidia.com``."""
    dra_join: bool = True
    """Watch this node's ResourceSlices to join DRA devices to NVML's (with the pod watch).
    Off, a pod holding a DRA GPU makes its triggers UNAVAILABLE, never 0."""


def build_attribution(options: AttributionOptions) -> list[Sampler]:
    """The PodResources sampler, the pod watch and the ResourceSlice watch, each when
    configured (each loads its client, grpclib or kr8s, only then)."""
    samplers: list[Sampler] = []
    if options.socket_path:
        from keda_gpu_scaler.sources.kubelet import (
            DEFAULT_DRA_DRIVERS,
            DEFAULT_RESOURCE_NAMES,
            PodResourcesSampler,
        )

        samplers.append(
            PodResourcesSampler(
                options.socket_path,
                interval_s=options.interval_s,
                resource_names=options.resource_names or DEFAULT_RESOURCE_NAMES,
                dra_drivers=options.dra_drivers or DEFAULT_DRA_DRIVERS,
            )
        )
    # The pods' labels serve attribution only: a node name alone (gpu-metrics, a pod with
    # attribution off keeps NODE_NAME for its name) watches nothing.
    if options.node_name and options.socket_path:
        from keda_gpu_scaler.sources.kube import PodWatcher, ResourceSliceWatcher

        samplers.append(PodWatcher(options.node_name, kubeconfig=options.kubeconfig))
        if options.dra_join:
            samplers.append(ResourceSliceWatcher(options.node_name, kubeconfig=options.kubeconfig))
    return samplers


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """How engine endpoints are scraped; ``resolve`` is injectable for tests."""

    interval_s: float = DEFAULT_INTERVAL_S
    idle_stop_s: float = 600.0
    first_sample_timeout_s: float = 1.5
    policy: ScrapePolicy = field(default_factory=ScrapePolicy)
    resolve: Resolver = system_resolver
    transport: httpx.AsyncBaseTransport | None = None
    """Replaces the network (tests); None scrapes for real."""

    def client(self) -> httpx.AsyncClient:
        if self.transport is None:
            return new_engine_client()
        return httpx.AsyncClient(transport=self.transport, trust_env=False, follow_redirects=False)


def _engine_sampler(
    scraper: EngineScraper, interval_s: float, target: EngineTarget
) -> EngineSampler:
    return EngineSampler.for_target(target, scraper, interval_s=interval_s)


@dataclass(frozen=True, slots=True)
class RunningScaler:
    port: int
    hub: SnapshotHub
    service: ExternalScalerService
    streams: StreamRegistry
    aggregator: Aggregator
    source: Sampler
    tap: Tap
    metrics: SelfMetrics
    engines: EngineSubscriptions
    metrics_port: int | None = None
    """Bound port of /metrics and /debug/tap; None when disabled."""
    probe_port: int | None = None
    """Bound port of /healthz and /readyz; None when disabled."""
    node_agent: NodeAgentService | None = None
    """The WatchNode servicer on the gRPC port."""


@dataclass(frozen=True, slots=True)
class RunningPipeline:
    hub: SnapshotHub
    aggregator: Aggregator
    source: Sampler
    send: MemoryObjectSendStream[Sample]
    """Open until the pipeline stops: clone it to add producers (engine samplers)."""


@asynccontextmanager
async def open_pipeline(
    source: Sampler,
    *,
    hub: SnapshotHub | None = None,
    observers: Sequence[FoldObserver] = (),
    samplers: Sequence[Sampler] = (),
) -> AsyncIterator[RunningPipeline]:
    """A supervised source, and ``samplers`` beside it (attribution, pod labels), feeding
    the aggregator; everything stops on exit. A cluster scaler's aggregator folds at most
    every ``CLUSTER_FOLD_INTERVAL_S``."""
    hub = hub or SnapshotHub()
    send, receive = anyio.create_memory_object_stream[Sample](SAMPLE_BUFFER)
    interval = CLUSTER_FOLD_INTERVAL_S if isinstance(source, AgentsSource) else 0.0
    aggregator = Aggregator(receive, hub, observers=observers, min_interval_s=interval)
    async with anyio.create_task_group() as tg, send:
        await tg.start(aggregator.run)
        for sampler in (source, *samplers):
            tg.start_soon(_supervised, sampler, send.clone())
        try:
            yield RunningPipeline(hub, aggregator, source, send)
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def open_scaler(
    source: Sampler,
    *,
    host: str,
    port: int,
    max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS,
    ssl: SSLContext | None = None,
    metrics_port: int | None = None,
    probe_port: int | None = None,
    health_check_interval_s: float = 10.0,
    engine_options: EngineOptions | None = None,
    samplers: Sequence[Sampler] = (),
    node_name: str = "",
    pod_namespaces: PodNamespaces | None = None,
) -> AsyncIterator[RunningScaler]:
    """Start the pipeline, the gRPC server (with gRPC health, and on a node NodeAgent.WatchNode,
    which names the node ``node_name``, the host name when empty) and the HTTP endpoints. A
    cluster scaler (``source`` an :class:`AgentsSource`) serves no WatchNode.

    ``pod_namespaces``: on a cluster scaler, the namespaces its pod watch (one of
    ``samplers``) covers, which podSelector triggers add to and calls wait for.

    ``metrics_port``/``probe_port``: None disables, 0 picks a free port, and one port may
    serve both. On exit, streams end with OK and everything stops.
    """
    engine = engine_options or EngineOptions()
    hub = SnapshotHub()
    tap = Tap()
    metrics = SelfMetrics(tap)
    async with (
        engine.client() as http_client,
        open_pipeline(source, hub=hub, observers=[tap, metrics], samplers=samplers) as pipeline,
        anyio.create_task_group() as background,
    ):
        scraper = EngineScraper(http_client, policy=engine.policy, resolve=engine.resolve)
        engines = EngineSubscriptions(
            hub,
            pipeline.send.clone(),
            partial(_engine_sampler, scraper, engine.interval_s),
            idle_stop_s=engine.idle_stop_s,
            first_sample_timeout_s=engine.first_sample_timeout_s,
        )
        await background.start(engines.run)
        decider = Decider(hub, telemetry=metrics, engines=engines, pod_namespaces=pod_namespaces)
        streams = StreamRegistry(hub, decider)
        await background.start(streams.run)
        cluster = isinstance(source, AgentsSource)
        service = ExternalScalerService(decider, streams, metrics, cluster=cluster)
        # A cluster scaler is no node: it reads the agents' streams and serves none itself.
        node_agent = (
            None
            if cluster
            else NodeAgentService(hub, node_name or socket.gethostname(), telemetry=metrics)
        )
        metrics.read_live(
            lambda: hub.current,
            lambda: streams.open_streams,
            spec_streams=lambda: streams.held_streams,
            agent_streams=None if node_agent is None else (lambda: node_agent.open_streams),
            pod_attribution=None
            if cluster
            else any(s.name == POD_RESOURCES_SOURCE for s in samplers),
        )
        readiness = Readiness(hub)
        health = grpc_health(service, readiness, interval_s=health_check_interval_s)
        server = ScalerServer(
            service,
            streams,
            extra_handlers=[health] if node_agent is None else [health, node_agent],
            max_concurrent_streams=max_concurrent_streams,
        )
        bound = await server.start(host, port, ssl=ssl)
        try:
            async with anyio.create_task_group() as http:
                metrics_port, probe_port = await _start_http(
                    http,
                    host,
                    metrics_port,
                    probe_port,
                    metrics_routes(metrics, tap),
                    probe_routes(readiness),
                )
                yield RunningScaler(
                    port=bound,
                    hub=hub,
                    service=service,
                    streams=streams,
                    aggregator=pipeline.aggregator,
                    source=source,
                    tap=tap,
                    metrics=metrics,
                    engines=engines,
                    metrics_port=metrics_port,
                    probe_port=probe_port,
                    node_agent=node_agent,
                )
                http.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                if node_agent is not None:
                    await _end_agent_streams(node_agent)
                await server.aclose()
            background.cancel_scope.cancel()


MIDDLE_COLLECTION_AFTER = 2
"""Young collections between two middle-generation ones (Python's default: 10)."""
FULL_COLLECTION_AFTER = 500
"""Middle-generation collections between two full ones (Python's default: 10)."""


def tune_garbage_collector() -> None:
    """Keep what start-up built (modules, the server, the pipeline) out of the garbage
    collector's full passes, make middle-generation passes smaller and full ones rarer.

    A full pass walks every tracked object: with the libraries loaded that took 80 to 120 ms
    in one go while a thousand streams opened, long enough to stall every call, so start-up's
    objects are frozen. A thousand open streams still make about 100 000 tracked objects, a
    full pass over them 100 to 190 ms on a small machine, and under unary load Python started
    one every 15 s or so: it counts every object that outlives two young passes (the objects
    of calls in flight, of request tasks waiting to be swept), although nearly all of them
    are then freed by their reference count. The middle passes found no garbage at all under
    that load, and each walked the 10 000 to 20 000 survivors of ten young passes, 8 to 24 ms.
    A middle pass every ``MIDDLE_COLLECTION_AFTER`` young ones walks a fifth as many (every
    survivor is still walked once there), and a full pass every ``FULL_COLLECTION_AFTER``
    middle ones comes about ten times less often than Python's defaults; cyclic garbage waits
    longer for its pass. For the process that serves, once it is up; not for tests, which
    build many scalers in one process.
    """
    gc.freeze()
    young, _, _ = gc.get_threshold()
    gc.set_threshold(young, MIDDLE_COLLECTION_AFTER, FULL_COLLECTION_AFTER)


async def _start_http(
    tg: TaskGroup,
    host: str,
    metrics_port: int | None,
    probe_port: int | None,
    metrics: dict[str, Route],
    probes: dict[str, Route],
) -> tuple[int | None, int | None]:
    if metrics_port is not None and metrics_port == probe_port and metrics_port != 0:
        bound = await tg.start(HttpServer({**metrics, **probes}).serve, host, metrics_port)
        return bound, bound
    bound_metrics = bound_probes = None
    if metrics_port is not None:
        bound_metrics = await tg.start(HttpServer(metrics).serve, host, metrics_port)
    if probe_port is not None:
        bound_probes = await tg.start(HttpServer(probes).serve, host, probe_port)
    return bound_metrics, bound_probes


async def _end_agent_streams(
    node_agent: NodeAgentService, *, grace_s: float = 1.0, drain_s: float = 0.3
) -> None:
    """WatchNode streams end with OK before the server closes (it ends KEDA's own), and
    their clients get ``drain_s`` to read the trailers before the server's GOAWAY."""
    were_open = node_agent.open_streams > 0
    node_agent.begin_shutdown()
    with anyio.move_on_after(grace_s):
        await node_agent.wait_streams_ended()
    if were_open:
        await anyio.sleep(drain_s)


async def _supervised(source: Sampler, send: MemoryObjectSendStream[Sample]) -> None:
    await supervise(source.name, source.run, send=send)
