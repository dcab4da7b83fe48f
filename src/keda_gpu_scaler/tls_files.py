"""TLS files and OpenSSL's failures, in messages that name what failed.

Both ends of TLS in this product read their PEM files and word a failure the same way: the
gRPC port's server context (``serving.tls``) and the cluster scaler's client context for its
agent links (``sources.agents.tls``). A message is one line, ``<what> <path>: <problem>``,
with ``what`` the flag or the file's role, so that an operator knows which file to fix.
Each caller passes the error class its layer raises.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["file_error", "pem_text", "read_pem", "refuse_password", "ssl_reason"]

E = TypeVar("E", bound=Exception)

# How an OSError from reading a file reads in a message (errno → problem).
_OS_PROBLEMS = {
    errno.ENOENT: "not found",
    errno.EACCES: "not readable (permission denied)",
    errno.EISDIR: "is a directory, not a file",
    errno.ENOTDIR: "a parent of it is not a directory",
}

# "[SSL] PEM lib (_ssl.c:3926)" → "PEM lib"
_SSL_NOISE = re.compile(r"^\[\w+\] |:? ?\(_ssl\.c:\d+\)$")

# Every PEM block starts with this; DER (binary ASN.1) and other formats never contain it.
_PEM_BEGIN = b"-----BEGIN "
# A DER certificate or key is one ASN.1 SEQUENCE: its first byte is 0x30.
_DER_SEQUENCE = 0x30


def file_error(path: Path, what: str, exc: OSError, error: type[E]) -> E:
    """``error`` saying why ``path`` could not be read."""
    problem = _OS_PROBLEMS.get(exc.errno or 0) or f"cannot be read ({exc.strerror or exc})"
    return error(f"{what} {path}: {problem}")


def read_pem(path: Path, what: str, error: type[E]) -> bytes:
    """The bytes of ``path``; raises ``error`` if it cannot be read, holds nothing, or is
    not PEM text (DER, a PKCS#12 bundle, any binary file) at all."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise file_error(path, what, exc, error) from exc
    if not data.strip():
        raise error(f"{what} {path}: the file is empty")
    if _PEM_BEGIN not in data:
        raise error(f"{what} {path}: {_not_pem(data)}")
    return data


def pem_text(data: bytes) -> str:
    """``data`` (which :func:`read_pem` accepted) as the ASCII text OpenSSL's ``cadata``
    takes: bytes outside ASCII (a comment's accents, binary junk around the blocks) cannot
    be part of a PEM block, so dropping them changes no block."""
    return data.decode("ascii", errors="ignore")


def _not_pem(data: bytes) -> str:
    if data[0] == _DER_SEQUENCE:
        return (
            "DER (binary), not PEM: convert it with openssl "
            "(x509 -inform der for a certificate, pkey -inform der for a key)"
        )
    return "not PEM (no -----BEGIN line in it)"


def refuse_password(message: str, error: type[Exception]) -> Callable[[], str]:
    """A password callback for ``load_cert_chain`` that raises ``error(message)``: without
    one, OpenSSL would prompt on the terminal for an encrypted key."""

    def refuse() -> str:
        raise error(message)

    return refuse


def ssl_reason(exc: OSError) -> str:
    """OpenSSL's reason in a few lower-case words, without CPython's source location."""
    reason = getattr(exc, "reason", None)
    if reason:
        return str(reason).replace("_", " ").lower()
    return _SSL_NOISE.sub("", exc.strerror or str(exc)).lower()
