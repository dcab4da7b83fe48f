"""``--agents`` (``KEDA_GPU_SCALER_AGENTS``): which discovery a cluster scaler uses.

    endpoints:NAMESPACE/SERVICE:PORT   PORT: the EndpointSlices' port name or number
    dns:HOST:PORT                      HOST: a headless Service's name, say
    static:HOST:PORT[,HOST:PORT...]    [::1]:6000 for IPv6

Pure: :func:`parse_agents` reads the text into an :data:`AgentsSpec`, or raises
``ValueError`` with a one-line message naming the bad part. Names are checked as Kubernetes
checks them (a namespace is a DNS-1123 label, a Service a DNS-1035 label, a port name an
IANA service name), so a typo fails at start-up, not as an empty set later.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from keda_gpu_scaler.domain.names import is_namespace, is_service_name
from keda_gpu_scaler.domain.samples import AgentTarget

USAGE = "endpoints:NAMESPACE/SERVICE:PORT, dns:HOST:PORT or static:HOST:PORT[,HOST:PORT...]"


@dataclass(frozen=True, slots=True)
class EndpointsAgents:
    namespace: str
    service: str
    port: int | str
    """The EndpointSlices' port: a number, or a port name."""

    def __str__(self) -> str:
        return f"endpoints:{self.namespace}/{self.service}:{self.port}"


@dataclass(frozen=True, slots=True)
class DnsAgents:
    host: str
    port: int

    def __str__(self) -> str:
        return f"dns:{_bracketed(self.host)}:{self.port}"


@dataclass(frozen=True, slots=True)
class StaticAgents:
    targets: tuple[AgentTarget, ...]

    def __str__(self) -> str:
        return "static:" + ",".join(target.address for target in self.targets)


AgentsSpec = EndpointsAgents | DnsAgents | StaticAgents

_PORT_NAME = re.compile(r"[a-z0-9-]{1,15}")
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?")


def parse_agents(text: str) -> AgentsSpec:
    """``--agents``: one of the three forms of the module docstring; ``ValueError`` with a
    one-line message naming the bad part."""
    text = text.strip()
    scheme, sep, rest = text.partition(":")
    if not text:
        raise ValueError(f"no agents given: expected {USAGE}")
    if not sep or scheme not in ("endpoints", "dns", "static"):
        raise ValueError(f"{text!r} is none of {USAGE}")
    if scheme == "endpoints":
        return _endpoints(rest, text)
    if scheme == "dns":
        host, port = _host_port(rest, text, form="dns:HOST:PORT")
        return DnsAgents(host, port)
    return _static(rest, text)


def _endpoints(rest: str, text: str) -> EndpointsAgents:
    namespace, slash, service_port = rest.partition("/")
    service, colon, port = service_port.rpartition(":")
    if not slash or not colon:
        raise ValueError(f"{text}: expected endpoints:NAMESPACE/SERVICE:PORT")
    check_namespace(namespace, text)
    check_service(service, text)
    return EndpointsAgents(namespace, service, slice_port(port, text))


def check_namespace(namespace: str, where: str) -> None:
    if not is_namespace(namespace):
        raise ValueError(
            f"{where}: namespace {namespace!r} is not a namespace name (lowercase letters, "
            "digits and '-', not at either end; at most 63)"
        )


def check_service(service: str, where: str) -> None:
    if not is_service_name(service):
        raise ValueError(
            f"{where}: service {service!r} is not a Service name (a lowercase letter, then "
            "lowercase letters, digits and '-', not '-' at the end; at most 63)"
        )


def slice_port(text: str, where: str) -> int | str:
    """An EndpointSlice port: a number 1-65535, or a port name as Kubernetes allows one."""
    if text.isdigit():
        return port_number(text, where)
    if (
        _PORT_NAME.fullmatch(text)
        and any(c.isalpha() for c in text)
        and not text.startswith("-")
        and not text.endswith("-")
        and "--" not in text
    ):
        return text
    raise ValueError(
        f"{where}: port {text!r} is neither a number (1-65535) nor a port name (1 to 15 "
        "lowercase letters, digits and '-', with a letter, no '-' at an end or twice in a row)"
    )


def port_number(text: str, where: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"{where}: port {text!r} is not a number from 1 to 65535")
    return int(text)


def _static(rest: str, text: str) -> StaticAgents:
    targets: list[AgentTarget] = []
    for entry in rest.split(","):
        if not entry.strip():
            raise ValueError(f"{text}: an empty entry (static:HOST:PORT[,HOST:PORT...])")
        host, port = _host_port(entry.strip(), text, form="HOST:PORT")
        target = AgentTarget(host=host, port=port)
        if target in targets:
            raise ValueError(f"{text}: {target.address} is listed twice")
        targets.append(target)
    return StaticAgents(tuple(targets))


def _host_port(text: str, where: str, *, form: str) -> tuple[str, int]:
    if text.startswith("["):
        host, bracket, after = text[1:].partition("]")
        if not bracket or not after.startswith(":"):
            raise ValueError(f"{where}: {text!r} is not [IPV6]:PORT")
        try:
            address = ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{where}: {host!r} in brackets is not an IPv6 address") from None
        # One spelling per address, so a duplicate is seen as one.
        return address.compressed, port_number(after[1:], where)
    host, colon, port = text.rpartition(":")
    if not colon:
        raise ValueError(f"{where}: {text!r} has no port ({form})")
    if ":" in host:
        raise ValueError(f"{where}: an IPv6 address goes in brackets, as [{host}]:{port}")
    check_host(host, where)
    return host, port_number(port, where)


def check_host(host: str, where: str) -> None:
    """A host name, or an IPv4 or IPv6 address (without brackets)."""
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{where}: {host!r} is not an IPv6 address") from None
        return
    labels = host.removesuffix(".").split(".")
    if labels[-1].isdigit():
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{where}: {host!r} is not an IPv4 address") from None
        return
    if len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{where}: {host!r} is not a host name")


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
