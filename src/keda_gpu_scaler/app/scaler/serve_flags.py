"""The ``serve`` command's flags, each readable from ``KEDA_GPU_SCALER_<NAME>`` too.

:data:`SERVE_FLAGS` is the one catalog: the command line is built from it (app/cli.py), the
configuration reference is rendered from it (app/reference.py), and :func:`named` says which
flag, or which variable, a value came from, so that errors point at what the user wrote.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keda_gpu_scaler.app import gocli
from keda_gpu_scaler.app.argtypes import boolean, bounded_int, port
from keda_gpu_scaler.app.logs import LEVELS
from keda_gpu_scaler.domain.names import is_node_name

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ENV_PREFIX = "KEDA_GPU_SCALER_"
DEFAULT_MAX_CONCURRENT_STREAMS = 4096
"""Equal to ``serving.server.DEFAULT_MAX_CONCURRENT_STREAMS`` (a test checks), without
loading grpclib before main() runs."""
MAX_CONCURRENT_STREAMS_RANGE = (100, 2**31 - 1)


def _stream_limit(text: str) -> int:
    low, high = MAX_CONCURRENT_STREAMS_RANGE
    return bounded_int(text, low=low, high=high, meaning=f"must be an integer from {low} to {high}")


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


def _dra_drivers(text: str) -> object:
    from keda_gpu_scaler.sources.kubelet import DraDrivers

    try:
        return DraDrivers.parse(text)
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
"""Where the kubelet serves its PodResources API. ``gpu-metrics`` reads the same variable
(``KEDA_GPU_SCALER_POD_RESOURCES_SOCKET``) and falls back to this path when it exists."""


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
        if variable is None:
            args.defaulted.add(self.dest)
        try:
            setattr(args, self.dest, self.parse(raw))
        except argparse.ArgumentTypeError as exc:
            origin = f" (from {variable})" if variable else ""
            parser.error(f"argument {self.name}: {exc}{origin}")
        if variable is not None:
            args.from_environment[self.dest] = variable


def is_default(args: argparse.Namespace, flag: str) -> bool:
    """True when ``flag`` was given neither on the command line nor in its variable."""
    return flag.removeprefix("--").replace("-", "_") in getattr(args, "defaulted", set())


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where Kubernetes mounts a pod's service account token (absent outside a pod)."""


def pod_resources_socket(
    args: argparse.Namespace, *, account_dir: str = SERVICE_ACCOUNT_DIR
) -> str:
    """The PodResources socket to read; empty when pod attribution is not configured.

    The default socket is read when it exists, or inside a pod (a service account mounted):
    there a missing socket is a mistake to report (the directory is not mounted). Outside
    Kubernetes (neither), attribution is not configured: nothing to warn about. A socket given
    with the flag or its variable is always read."""
    socket = str(args.pod_resources_socket)
    if not socket or not is_default(args, "--pod-resources-socket"):
        return socket
    if os.path.exists(socket) or os.path.isdir(account_dir):
        return socket
    return ""


def named(args: argparse.Namespace, flag: str) -> str:
    """``--port``, or ``--port (KEDA_GPU_SCALER_PORT)`` when the value came from there."""
    variable = getattr(args, "from_environment", {}).get(flag.removeprefix("--").replace("-", "_"))
    return f"{flag} ({variable})" if variable else flag


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
        "--dra-drivers",
        "DRA_DRIVERS",
        "gpu.nvidia.com",
        "comma-separated DRA drivers whose devices are GPUs, each joined to NVML through "
        "this node's ResourceSlices (podSelector); a pod holding one that cannot be "
        "identified makes its triggers UNAVAILABLE",
        _dra_drivers,
    ),
    Flag(
        "--dra-join",
        "DRA_JOIN",
        "true",
        "watch this node's ResourceSlices (resource.k8s.io/v1) to join DRA devices to NVML, "
        "with --node-name and --pod-resources-socket; false leaves every DRA GPU "
        "unidentified, and triggers over its pods UNAVAILABLE",
        boolean,
    ),
    Flag(
        "--host-proc",
        "HOST_PROC",
        "",
        "the host's /proc, through which the processes NVML lists on each GPU are mapped to "
        "their pods (per-process readings: a podSelector trigger's own share of a GPU shared "
        "with another workload); the node agent must run in the host's PID namespace "
        "(hostPID), where it is /proc; empty turns per-process readings off",
    ),
    Flag(
        "--process-interval",
        "PROCESS_INTERVAL",
        "5",
        "seconds between per-process readings of the GPUs (with --host-proc)",
        gocli.positive_duration,
    ),
    Flag(
        "--mig-layout-interval",
        "MIG_LAYOUT_INTERVAL",
        "5",
        "seconds between reads of each GPU's MIG mode and instances (with --source nvml): "
        "an instance made since (dynamic MIG) is read from then on; one destroyed is "
        "forgotten as soon as NVML refuses its handle, at the next cycle",
        gocli.positive_duration,
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
        gocli.log_level,
    ),
)
