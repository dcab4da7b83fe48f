"""Kubernetes object names as the API checks them: one place for every check of them."""

from __future__ import annotations

import re

_DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS_1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_namespace(name: str) -> bool:
    """A namespace name: an RFC 1123 label (lowercase letters, digits and '-', not at
    either end; at most 63)."""
    return len(name) <= 63 and _DNS_1123_LABEL.fullmatch(name) is not None


def is_service_name(name: str) -> bool:
    """A Service name: an RFC 1035 label (a lowercase letter first; at most 63)."""
    return len(name) <= 63 and _DNS_1035_LABEL.fullmatch(name) is not None


def is_node_name(name: str) -> bool:
    """A node name: an RFC 1123 subdomain (at most 253)."""
    return is_object_name(name)


def is_object_name(name: str) -> bool:
    """The name of most objects (an InferencePool's too): an RFC 1123 subdomain (lowercase
    letters, digits, '-' and '.'; at most 253)."""
    return len(name) <= 253 and _DNS_1123_SUBDOMAIN.fullmatch(name) is not None
