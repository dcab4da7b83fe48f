"""Static checks of engine endpoint URLs, before any connection is made.

These checks see only the URL text. Addresses a hostname resolves to are checked again
by the engine sampler, at connect time.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

_METADATA_HOSTNAMES = frozenset({"metadata.google.internal", "metadata.goog"})
_METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "169.254.170.2")
)
_LINK_LOCAL_MULTICAST = (
    ipaddress.ip_network("224.0.0.0/24"),
    ipaddress.ip_network("ff02::/16"),
)

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def refusal_for_address(ip: IpAddress) -> str | None:
    """Why this address must never be scraped, or None when it may be."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return refusal_for_address(ip.ipv4_mapped)
    if ip in _METADATA_ADDRESSES:
        return f"cloud metadata address not allowed: {ip}"
    if ip.is_link_local or any(ip in net for net in _LINK_LOCAL_MULTICAST):
        return f"link-local address not allowed: {ip}"
    if ip.is_unspecified:
        return f"unspecified address not allowed: {ip}"
    if ip.is_multicast:
        return f"multicast address not allowed: {ip}"
    return None


def endpoint_refusal(url: str) -> str | None:
    """Why this scrape URL is refused, or None when it passes the static checks."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        return f"invalid URL: {exc}"
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        return f'unsupported scheme "{parts.scheme}", must be http or https'
    host = (parts.hostname or "").rstrip(".")
    if not host:
        return "missing hostname"
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        if host.lower() in _METADATA_HOSTNAMES:
            return f"cloud metadata hostname not allowed: {host}"
        return None
    return refusal_for_address(ip)
