"""The network the suite runs in: a namespace of its own, never the machine's.

``make e2e`` starts the suite inside a new network namespace (``e2e/run.py``) with
loopback and one interface, ``e2e0``, that carries the private addresses below: the API
server's advertised address, the KEDA metrics server's endpoint (the aggregation layer
reaches it through a Service's EndpointSlice, which may not name a loopback address) and the
pods' addresses. Both ends of that interface are inside the namespace, so nothing sent to
these addresses can leave it; :func:`require_private_namespace` refuses to start anything in
the machine's own namespace, where these addresses could be somebody else's.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterator

INTERFACE = "e2e0"
NETWORK = ipaddress.ip_network("10.99.0.0/16")
APISERVER = "10.99.0.1"
KEDA_METRICS = "10.99.0.2"
SERVICE_CIDR = "10.96.0.0/16"
POD_ADDRESSES = ipaddress.ip_network("10.99.1.0/24")


class NotIsolated(Exception):
    """The suite was started outside the network namespace ``make e2e`` makes for it."""


def own_namespace() -> str:
    return os.readlink("/proc/self/ns/net")


def require_private_namespace() -> None:
    try:
        init = os.readlink("/proc/1/ns/net")
    except OSError:
        init = None  # another PID namespace's init: compare by address instead
    if init is not None and own_namespace() == init:
        raise NotIsolated(
            "the end-to-end suite runs only inside its own network namespace: "
            "run it with `make e2e` (or python e2e/run.py)"
        )
    if not is_local(APISERVER):
        raise NotIsolated(f"{APISERVER} is not an address of this namespace: run `make e2e`")


def is_local(address: str) -> bool:
    """Whether ``address`` can be bound here, that is, belongs to this namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def pod_addresses() -> Iterator[str]:
    """Addresses for pods, in order: the harness's kubelet hands them out."""
    for host in POD_ADDRESSES.hosts():
        yield str(host)
