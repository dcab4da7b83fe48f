"""``keda-gpu-scaler serve``: from the parsed flags to a running scaler, until a signal.

It checks the flags that only make sense together (the TLS files, the ports, a cluster
scaler's agents), builds the source and the samplers, opens the scaler and serves until
SIGTERM or SIGINT. Errors name the flag, or the variable its value came from
(:func:`keda_gpu_scaler.app.scaler.serve_flags.named`).

Signals are never lost, whenever they come. From the first line of :func:`run_serve`, SIGINT
only sets a flag (so asyncio's own SIGINT handling, which cancels the main task and relies on
nothing swallowing that cancellation, is never installed), until anyio's signal receiver
takes over; from then on one task reads every signal. A signal while the scaler starts
abandons start-up and ends quietly, 130 for SIGINT (128 + the signal's number for any
other); once it serves, SIGINT and SIGTERM stop it cleanly, with 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import anyio
from anyio import CancelScope

from keda_gpu_scaler.app.scaler.listen import ListenError, check_listen
from keda_gpu_scaler.app.scaler.serve_flags import named, pod_resources_socket

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from keda_gpu_scaler.pipeline.podnamespaces import PodNamespaces
    from keda_gpu_scaler.pipeline.supervisor import Sampler
    from keda_gpu_scaler.serving.tls import ReloadingTlsContext

log = logging.getLogger("keda_gpu_scaler")


def run_serve(args: argparse.Namespace) -> int:
    """Serve until a signal; the exit status: 0 once served, 128 + the signal's number for a
    signal while starting (130 for SIGINT)."""
    with _held_interrupt() as held:
        return anyio.run(_serve, args, held, backend="asyncio")


class _Held:
    """The signal that came while only a flag could record it."""

    signum: int | None = None


@contextmanager
def _held_interrupt() -> Iterator[_Held]:
    held = _Held()

    def hold(signum: int, frame: FrameType | None) -> None:
        held.signum = signum

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, previous)


class _Lifecycle:
    """Starting, then serving: what a signal means depends on which (one task reads them)."""

    def __init__(self, starting: CancelScope) -> None:
        self._starting = starting
        self.serving = False
        self.stop = anyio.Event()
        self.signal_while_starting: int | None = None

    async def watch(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            if not self.serving:
                self.signal_while_starting = signum
                self._starting.cancel()
                return
            log.info("shutting down", extra={"signal": signal.Signals(signum).name})
            self.stop.set()
            return


def _tls(args: argparse.Namespace) -> ReloadingTlsContext | None:
    from keda_gpu_scaler.serving.tls import ReloadingTlsContext, TlsConfig, TlsConfigError

    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise TlsConfigError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise TlsConfigError("--tls-cert and --tls-key go together")
    return ReloadingTlsContext(TlsConfig(args.tls_cert, args.tls_key, args.tls_client_ca))


def _listeners(args: argparse.Namespace) -> list[tuple[str, int]]:
    """The ports to listen on, named as the user gave them; refuses gRPC on an HTTP port."""
    grpc = (named(args, "--port"), args.port)
    http = [
        (named(args, f), p)
        for f, p in (("--metrics-port", args.metrics_port), ("--probe-port", args.probe_port))
        if p
    ]
    for name, number in http:
        if number == args.port:
            raise ListenError(
                f"{name} {number} is also the gRPC port ({grpc[0]}): give it a port of its own "
                "(only the metrics and probe ports may share one)"
            )
    return [grpc, *http]


def _cluster_sources(
    args: argparse.Namespace,
) -> tuple[Sampler, list[Sampler], PodNamespaces]:
    """A cluster scaler: links to the node agents, and the pods of every node, of the
    namespaces ``--pod-namespaces`` says (which the decider is given too)."""
    from keda_gpu_scaler.app.scaler.compose import build_agents_source, build_cluster_pods
    from keda_gpu_scaler.domain.errors import SourceUnavailable
    from keda_gpu_scaler.pipeline.podnamespaces import PodNamespaces
    from keda_gpu_scaler.sources.agents import AgentTlsConfig

    if not args.agents:
        raise SourceUnavailable(
            f"--source agents needs {named(args, '--agents')}: where the node agents are "
            "(endpoints:NAMESPACE/SERVICE:PORT, dns:HOST:PORT or static:HOST:PORT)"
        )
    tls = None
    if (
        args.agents_tls_ca
        or args.agents_tls_cert
        or args.agents_tls_key
        or args.agents_tls_server_name
    ):
        tls = AgentTlsConfig(
            args.agents_tls_ca,
            args.agents_tls_cert,
            args.agents_tls_key,
            args.agents_tls_server_name,
        )
    namespaces = PodNamespaces.parse(args.pod_namespaces)
    source = build_agents_source(args.agents, tls=tls)
    return source, build_cluster_pods(namespaces), namespaces


def _check_host_proc(args: argparse.Namespace) -> None:
    """``--host-proc`` must be a directory where it is read (the NVML source)."""
    from keda_gpu_scaler.domain.errors import SourceUnavailable

    if args.source == "nvml" and args.host_proc and not Path(args.host_proc).is_dir():
        raise SourceUnavailable(
            f"{named(args, '--host-proc')} {args.host_proc}: not a directory (the host's /proc: "
            "give /proc and run in the host's PID namespace, hostPID)"
        )


async def _serve(args: argparse.Namespace, held: _Held) -> int:
    from keda_gpu_scaler.app.scaler.compose import (
        AttributionOptions,
        EngineOptions,
        build_attribution,
        build_source,
        open_scaler,
        tune_garbage_collector,
    )
    from keda_gpu_scaler.sources.engines.http import ScrapePolicy

    pod_namespaces = None
    if args.source == "agents":
        source, attribution, pod_namespaces = _cluster_sources(args)
        pod_attribution = "from the agents"
    else:
        _check_host_proc(args)
        source = build_source(
            args.source,
            interval_s=args.interval,
            cluster=True,
            host_proc=args.host_proc,
            process_interval_s=args.process_interval,
            mig_layout_interval_s=args.mig_layout_interval,
        )
        socket_path = pod_resources_socket(args)
        pod_attribution = "on" if socket_path else "not configured"
        attribution = build_attribution(
            AttributionOptions(
                socket_path=socket_path,
                interval_s=args.pod_resources_interval,
                resource_names=args.gpu_resource_names,
                node_name=args.node_name,
                dra_drivers=args.dra_drivers,
                dra_join=args.dra_join,
            )
        )
    tls = _tls(args)
    check_listen(named(args, "--host"), args.host, _listeners(args))
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        if held.signum is not None:  # before the receiver took over: while starting
            return 128 + held.signum
        async with anyio.create_task_group() as tg:
            lifecycle = _Lifecycle(tg.cancel_scope)
            tg.start_soon(lifecycle.watch, signals)
            async with open_scaler(
                source,
                samplers=attribution,
                node_name=args.node_name,
                pod_namespaces=pod_namespaces,
                host=args.host,
                port=args.port,
                max_concurrent_streams=args.max_concurrent_streams,
                ssl=None if tls is None else tls.context,
                metrics_port=args.metrics_port or None,
                probe_port=args.probe_port or None,
                health_check_interval_s=args.health_check_interval,
                engine_options=EngineOptions(
                    interval_s=args.engine_interval,
                    idle_stop_s=args.engine_idle_stop,
                    policy=ScrapePolicy(allowed_networks=args.engine_allowed_networks),
                ),
            ) as running:
                if tls is not None:
                    tg.start_soon(partial(tls.watch, interval_s=args.tls_reload_interval))
                lifecycle.serving = True
                log.info(
                    "serving",
                    extra={
                        "host": args.host,
                        "port": running.port,
                        "metrics_port": running.metrics_port,
                        "probe_port": running.probe_port,
                        "source": source.name,
                        "tls": "off" if tls is None else "mtls" if args.tls_client_ca else "tls",
                        "pod_attribution": pod_attribution,
                    },
                )
                tune_garbage_collector()
                await lifecycle.stop.wait()
            tg.cancel_scope.cancel()
    if lifecycle.signal_while_starting is not None:
        return 128 + lifecycle.signal_while_starting
    log.info("stopped")
    return 0
