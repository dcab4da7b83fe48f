"""``keda-gpu-scaler``: serve KEDA's External Scaler contract, or show a demo.

Every flag can also be set from an environment variable, named in its help text.
"""

from __future__ import annotations

from keda_gpu_scaler.domain.names import is_node_name

try:
    import argparse
    import ipaddress
    import logging
    import os
    import signal
    import sys
    from collections.abc import Callable, Sequence
    from dataclasses import dataclass
    from functools import partial
    from pathlib import Path
    from typing import TYPE_CHECKING, Any

    from keda_gpu_scaler import __version__
    from keda_gpu_scaler.app import gocli
    from keda_gpu_scaler.app.argtypes import bounded_int, port, positive_float, tap_address
    from keda_gpu_scaler.app.exits import exit_status
    from keda_gpu_scaler.app.listen import ListenError, check_listen
    from keda_gpu_scaler.app.logs import LEVELS, configure_logging

    if TYPE_CHECKING:
        from keda_gpu_scaler.pipeline.podnamespaces import PodNamespaces
        from keda_gpu_scaler.pipeline.supervisor import Sampler
        from keda_gpu_scaler.serving.tls import ReloadingTlsContext
except KeyboardInterrupt:  # Ctrl-C while the command loads: quiet, like Ctrl-C later
    raise SystemExit(130) from None

# Heavy modules (grpclib, httpx, the pipeline) load inside main(), so that a Ctrl-C while
# they load is handled like any other: quietly, with status 130.

log = logging.getLogger("keda_gpu_scaler")

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ENV_PREFIX = "KEDA_GPU_SCALER_"
DEFAULT_MAX_CONCURRENT_STREAMS = 4096
"""Equal to ``serving.server.DEFAULT_MAX_CONCURRENT_STREAMS`` (a test checks), without
loading grpclib before main() runs."""
MAX_CONCURRENT_STREAMS_RANGE = (100, 2**31 - 1)


def _stream_limit(text: str) -> int:
    low, high = MAX_CONCURRENT_STREAMS_RANGE
    return bounded_int(text, low=low, high=high, meaning=f"must be an integer from {low} to {high}")


def _log_level(text: str) -> str:
    return gocli.log_level(text)


def _networks(text: str) -> tuple[IpNetwork, ...] | None:
    if not text.strip():
        return None
    try:
        return tuple(ipaddress.ip_network(n.strip()) for n in text.split(",") if n.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of networks: {text!r} ({exc})") from None


def _optional_path(text: str) -> Path | None:
    return Path(text) if text else None


def _resource_names(text: str) -> object:
    from keda_gpu_scaler.sources.kubelet import ResourceNames

    try:
        return ResourceNames.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _agents(text: str) -> str:
    if not text:
        return text
    from keda_gpu_scaler.sources.agents import parse_agents

    try:
        parse_agents(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _pod_namespaces(text: str) -> str:
    """``triggers``, ``all`` or namespaces separated by commas, checked (the watch is built
    from it once the cluster scaler starts)."""
    from keda_gpu_scaler.pipeline.podnamespaces import PodNamespaces

    try:
        return str(PodNamespaces.parse(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _node_name(text: str) -> str:
    name = text.strip()
    if name and not is_node_name(name):
        raise argparse.ArgumentTypeError(f"not a node name: {text!r} (RFC 1123 subdomain)")
    return name


DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass(frozen=True, slots=True)
class Flag:
    """One ``serve`` flag, readable from ``KEDA_GPU_SCALER_<env>`` too."""

    name: str
    env: str
    default: str
    help: str
    parse: Callable[[str], Any] = str
    prefixed: bool = True
    """False for a variable Kubernetes conventions name (``NODE_NAME``)."""

    @property
    def variable(self) -> str:
        return ENV_PREFIX + self.env if self.prefixed else self.env

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    def environment_value(self) -> str:
        return self._raw()[0]

    def _raw(self) -> tuple[str, str | None]:
        """The value when the flag is not given, and the variable it came from, if any."""
        value = os.environ.get(self.variable)
        # Kubernetes gives every pod a variable per Service of its namespace; a Service
        # named keda-gpu-scaler yields KEDA_GPU_SCALER_PORT=tcp://10.0.0.7:6000, which is
        # not ours. Such a value is ignored rather than refused.
        if value is None or value.startswith(("tcp://", "udp://", "sctp://")):
            return self.default, None
        return value, self.variable

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        shown = f"default {self.default}" if self.default else "unset by default"
        # Absent unless given: Flag.fill sets it after parsing, so that an error
        # in a value from the environment names the variable, not only the flag.
        parser.add_argument(
            self.name,
            type=self.parse,
            default=argparse.SUPPRESS,
            help=f"{self.help} (env {self.variable}; {shown})",
        )

    def fill(self, args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
        """Set the value from the environment or the default when the flag was not given."""
        if hasattr(args, self.dest):
            return
        raw, variable = self._raw()
        try:
            setattr(args, self.dest, self.parse(raw))
        except argparse.ArgumentTypeError as exc:
            origin = f" (from {variable})" if variable else ""
            parser.error(f"argument {self.name}: {exc}{origin}")
        if variable is not None:
            args.from_environment[self.dest] = variable


def named(args: argparse.Namespace, flag: str) -> str:
    """``--port``, or ``--port (KEDA_GPU_SCALER_PORT)`` when the value came from there."""
    variable = getattr(args, "from_environment", {}).get(flag.removeprefix("--").replace("-", "_"))
    return f"{flag} ({variable})" if variable else flag


class _Parser(argparse.ArgumentParser):
    """Fills in the ``serve`` flags that were not given, once the command line is parsed."""

    serve: argparse.ArgumentParser | None = None

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        if self.serve is not None and getattr(parsed, "command", None) == "serve":
            parsed.from_environment = {}
            for flag in SERVE_FLAGS:
                flag.fill(parsed, self.serve)
        return parsed, rest


SERVE_FLAGS = (
    Flag("--host", "HOST", "0.0.0.0", "address to listen on"),
    Flag("--port", "PORT", "6000", "gRPC port of the External Scaler; 0 picks a free one", port),
    Flag(
        "--source",
        "SOURCE",
        "nvml",
        "nvml, replay (the bundled H200 trace), replay:PATH, or agents (a cluster scaler: "
        "the node agents named by --agents)",
    ),
    Flag("--interval", "INTERVAL", "1.0", "NVML sampling period, seconds", gocli.positive_duration),
    Flag(
        "--metrics-port",
        "METRICS_PORT",
        "9090",
        "HTTP port of /metrics and /debug/tap; 0 disables",
        port,
    ),
    Flag(
        "--probe-port", "PROBE_PORT", "8081", "HTTP port of /healthz and /readyz; 0 disables", port
    ),
    Flag(
        "--health-check-interval",
        "HEALTH_CHECK_INTERVAL",
        "10",
        "seconds a gRPC health answer is reused",
        gocli.positive_duration,
    ),
    Flag(
        "--max-concurrent-streams",
        "MAX_CONCURRENT_STREAMS",
        str(DEFAULT_MAX_CONCURRENT_STREAMS),
        "HTTP/2 streams per connection",
        _stream_limit,
    ),
    Flag(
        "--engine-interval",
        "ENGINE_INTERVAL",
        "5",
        "seconds between scrapes of an engine "
        "endpoint (one sampler per endpoint, shared by every trigger)",
        gocli.positive_duration,
    ),
    Flag(
        "--engine-idle-stop",
        "ENGINE_IDLE_STOP",
        "600",
        "seconds without a reader after which an engine sampler stops",
        gocli.positive_duration,
    ),
    Flag(
        "--engine-allowed-networks",
        "ENGINE_ALLOWED_NETWORKS",
        "",
        "comma-separated CIDRs that engine endpoints must resolve into (default: any address "
        "but link-local and cloud metadata)",
        _networks,
    ),
    Flag(
        "--pod-resources-socket",
        "POD_RESOURCES_SOCKET",
        DEFAULT_POD_RESOURCES_SOCKET,
        "the kubelet PodResources socket, read to attribute GPUs to pods (podSelector); "
        "empty turns attribution off",
    ),
    Flag(
        "--pod-resources-interval",
        "POD_RESOURCES_INTERVAL",
        "5",
        "seconds between reads of the PodResources socket (the kubelet rate-limits it)",
        gocli.positive_duration,
    ),
    Flag(
        "--gpu-resource-names",
        "GPU_RESOURCE_NAMES",
        "nvidia.com/gpu,nvidia.com/mig-*",
        "comma-separated extended resource names that are GPUs; an entry ending in * is a prefix",
        _resource_names,
    ),
    Flag(
        "--node-name",
        "NODE_NAME",
        "",
        "this node's name (the Downward API's spec.nodeName): the pods of this node are "
        "watched for their labels (podSelector), with --pod-resources-socket, and the "
        "NodeAgent stream names the node with it (empty: the host name); empty turns the "
        "watch off",
        _node_name,
        prefixed=False,
    ),
    Flag(
        "--tls-cert", "TLS_CERT", "", "server certificate chain (PEM); enables TLS", _optional_path
    ),
    Flag(
        "--tls-key", "TLS_KEY", "", "private key of --tls-cert (PEM, unencrypted)", _optional_path
    ),
    Flag(
        "--tls-client-ca",
        "TLS_CLIENT_CA",
        "",
        "CA bundle that client certificates must chain to; enables mutual TLS",
        _optional_path,
    ),
    Flag(
        "--tls-reload-interval",
        "TLS_RELOAD_INTERVAL",
        "10",
        "seconds between checks of the TLS files for rotation",
        gocli.positive_duration,
    ),
    Flag(
        "--agents",
        "AGENTS",
        "",
        "with --source agents (a cluster scaler): where the node agents are, "
        "endpoints:NAMESPACE/SERVICE:PORT, dns:HOST:PORT or static:HOST:PORT[,HOST:PORT...]",
        _agents,
    ),
    Flag(
        "--pod-namespaces",
        "POD_NAMESPACES",
        "triggers",
        "with --source agents (a cluster scaler): the namespaces whose pods podSelector "
        "reads: triggers (each one a trigger names, watched from the first call naming it), "
        "all (one watch of every namespace), or a comma-separated list (those only)",
        _pod_namespaces,
    ),
    Flag(
        "--agents-tls-ca",
        "AGENTS_TLS_CA",
        "",
        "CA bundle (PEM) that node agents' certificates must chain to, on a cluster scaler; "
        "enables TLS to the agents (without it, a client certificate uses the system's CAs)",
        _optional_path,
    ),
    Flag(
        "--agents-tls-cert",
        "AGENTS_TLS_CERT",
        "",
        "client certificate chain (PEM) a cluster scaler shows node agents (mutual TLS)",
        _optional_path,
    ),
    Flag(
        "--agents-tls-key",
        "AGENTS_TLS_KEY",
        "",
        "private key of --agents-tls-cert (PEM, unencrypted)",
        _optional_path,
    ),
    Flag(
        "--agents-tls-server-name",
        "AGENTS_TLS_SERVER_NAME",
        "",
        "name node agents' certificates are checked against (default: the address dialled, "
        "a pod IP)",
    ),
    Flag(
        "--log-level",
        "LOG_LEVEL",
        "info",
        "log level: " + ", ".join(LEVELS) + " (or warn)",
        _log_level,
    ),
)


def _tls(args: argparse.Namespace) -> ReloadingTlsContext | None:
    from keda_gpu_scaler.serving.tls import ReloadingTlsContext, TlsConfig, TlsConfigError

    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise TlsConfigError("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise TlsConfigError("--tls-cert and --tls-key go together")
    return ReloadingTlsContext(TlsConfig(args.tls_cert, args.tls_key, args.tls_client_ca))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="keda-gpu-scaler", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve the External Scaler gRPC contract")
    for flag in SERVE_FLAGS:
        flag.add_to(serve)
    parser.serve = serve

    tap = commands.add_parser("tap", help="print the live samples and decisions of a server")
    tap.add_argument(
        "--address",
        type=tap_address,
        default="127.0.0.1:9090",
        help="HOST:PORT of the server's metrics port (default 127.0.0.1:9090)",
    )
    tap.add_argument("--source", help="only samples of this source (nvml, replay, ...)")
    tap.add_argument("--device", help="only samples of this GPU index or UUID")
    tap.add_argument("--metric", help="only decisions on this metric name or type")
    tap.add_argument("--trigger", help="only decisions of this trigger (namespace/name)")
    tap.add_argument("--log-level", type=_log_level, default="warning")

    demo = commands.add_parser("demo", help="replay a real H200 recording and query it like KEDA")
    demo.add_argument(
        "--duration",
        type=positive_float,
        default=60.0,
        help="seconds to run (default 60: one pass of the recording)",
    )
    demo.add_argument(
        "--every",
        type=positive_float,
        default=1.0,
        help="seconds between KEDA-style polls (default 1)",
    )
    demo.add_argument(
        "--cluster",
        action="store_true",
        help="three node agents on replays and a cluster scaler, polled for two workloads",
    )
    demo.add_argument("--log-level", type=_log_level, default="warning")

    simulate = commands.add_parser(
        "simulate",
        help="run a ScaledObject through KEDA and the HPA over a trace or a synthetic load, "
        "in virtual time",
    )
    simulate.add_argument("scaledobject", type=Path, metavar="SCALEDOBJECT.yaml")
    given = simulate.add_mutually_exclusive_group(required=True)
    given.add_argument(
        "--trace",
        metavar="FILE",
        help="a recording (gpu-metrics record), or 'bundled' for the H200 recording shipped "
        "with the package",
    )
    given.add_argument(
        "--load", type=Path, metavar="LOAD.yaml", help="a synthetic load (docs/simulate.md)"
    )
    simulate.add_argument("--format", default="table", help="table (default) or json")
    simulate.add_argument("--plot", type=Path, metavar="OUT.png|OUT.svg", help="also draw it")
    simulate.add_argument("--log-level", type=_log_level, default="warning")
    return parser


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
    from keda_gpu_scaler.app.compose import build_agents_source, build_cluster_pods
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


async def _serve(args: argparse.Namespace) -> int:
    import anyio

    from keda_gpu_scaler.app.compose import (
        AttributionOptions,
        EngineOptions,
        build_attribution,
        build_source,
        freeze_startup_objects,
        open_scaler,
    )
    from keda_gpu_scaler.sources.engines.http import ScrapePolicy

    pod_namespaces = None
    if args.source == "agents":
        source, attribution, pod_namespaces = _cluster_sources(args)
    else:
        source = build_source(args.source, interval_s=args.interval)
        attribution = build_attribution(
            AttributionOptions(
                socket_path=args.pod_resources_socket,
                interval_s=args.pod_resources_interval,
                resource_names=args.gpu_resource_names,
                node_name=args.node_name,
            )
        )
    tls = _tls(args)
    check_listen(named(args, "--host"), args.host, _listeners(args))
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with (
            open_scaler(
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
            ) as running,
            anyio.create_task_group() as tg,
        ):
            if tls is not None:
                tg.start_soon(partial(tls.watch, interval_s=args.tls_reload_interval))
            log.info(
                "serving",
                extra={
                    "host": args.host,
                    "port": running.port,
                    "metrics_port": running.metrics_port,
                    "probe_port": running.probe_port,
                    "source": source.name,
                    "tls": "off" if tls is None else "mtls" if args.tls_client_ca else "tls",
                },
            )
            freeze_startup_objects()
            async for signum in signals:
                log.info("shutting down", extra={"signal": signal.Signals(signum).name})
                break
            tg.cancel_scope.cancel()
    log.info("stopped")
    return 0


def _run(args: argparse.Namespace) -> int:
    import anyio

    if args.command == "serve":
        return anyio.run(_serve, args, backend="asyncio")
    if args.command == "tap":
        from keda_gpu_scaler.app.tap_client import run_tap

        return run_tap(
            args.address,
            source=args.source,
            device=args.device,
            metric=args.metric,
            trigger=args.trigger,
        )
    if args.command == "simulate":
        from keda_gpu_scaler.app.simulate import run_simulate

        return run_simulate(
            args.scaledobject,
            trace=args.trace,
            load=args.load,
            output_format=args.format,
            plot=args.plot,
        )
    if args.cluster:
        from keda_gpu_scaler.app.demo_cluster import run_cluster_demo

        anyio.run(run_cluster_demo, args.duration, args.every, backend="asyncio")
        return 0
    from keda_gpu_scaler.app.demo import run_demo

    anyio.run(run_demo, args.duration, args.every, backend="asyncio")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    # The Go binary had no subcommands: `keda-gpu-scaler --port 6000` serves.
    argv = gocli.with_default_command(sys.argv[1:] if argv is None else argv, default="serve")
    try:
        args = build_parser().parse_args(argv)
        configure_logging(args.log_level)
        return _run(args)
    except SystemExit:
        raise
    except BaseException as exc:  # sorted by exit_status; anything unexpected re-raised
        return exit_status(exc, prog="keda-gpu-scaler")
