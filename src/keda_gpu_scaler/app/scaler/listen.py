"""Before serving: can this process listen on the host and ports it was given?

Every port is bound once, as the servers bind it (``SO_REUSEADDR``, IPv6 only on IPv6
sockets), then released, so that a port in use, a host name that does not resolve or an
address of another machine is one line naming the flag, before anything starts. Binding
sends nothing on the network. A port taken between this check and the real bind still
fails start-up, with the operating system's words.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence


class ListenError(Exception):
    """The host or a port cannot be listened on; the message names the flag."""


def check_listen(host_flag: str, host: str, ports: Sequence[tuple[str, int]]) -> None:
    """``ports`` are (flag, port) pairs; port 0 (any free port) checks only the host."""
    for family, address in _addresses(host_flag, host):
        seen: set[int] = set()
        for flag, port in ports:
            if port in seen:
                continue  # the metrics and probe ports may be one port
            seen.add(port)
            _try_bind(host_flag, host, flag, family, address, port)


def _addresses(host_flag: str, host: str) -> list[tuple[int, str]]:
    try:
        infos = socket.getaddrinfo(
            host or None, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise ListenError(
            f"{host_flag} {host!r}: cannot be resolved ({exc.strerror or exc})"
        ) from None
    except UnicodeError:
        raise ListenError(f"{host_flag} {host!r}: not a host name") from None
    return sorted({(family, str(sockaddr[0])) for family, *_, sockaddr in infos})


def _try_bind(host_flag: str, host: str, flag: str, family: int, address: str, port: int) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            probe.bind((address, port))
        except OSError as exc:
            raise ListenError(_problem(host_flag, host, flag, address, port, exc)) from None


def _problem(host_flag: str, host: str, flag: str, address: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRNOTAVAIL:
        shown = host if host == address else f"{host} ({address})"
        return f"{host_flag} {shown}: not an address of this machine"
    if exc.errno == errno.EADDRINUSE:
        return f"{flag} {port}: already in use on {address} (another process listens there)"
    if exc.errno == errno.EACCES:
        return f"{flag} {port}: permission denied on {address} (ports below 1024 need privilege)"
    return f"{flag} {port}: cannot listen on {address} ({exc.strerror or exc})"
