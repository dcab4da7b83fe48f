"""Server TLS and mutual TLS for the gRPC port, with certificate files reloaded in place.

asyncio keeps the one ``SSLContext`` it was given for the listener's whole life, so rotation
cannot replace it. Instead the listener gets an *outer* context whose ``sni_callback``, which
OpenSSL runs early in every handshake (with or without SNI), moves the connection onto the
*current* inner context: certificate, key, client-CA store and ALPN all come from there.
Connections already open keep the context they were made with.

asyncio drops a failed handshake silently (an ``SSLError`` is an ``OSError``, logged only in
asyncio's debug mode), which leaves a mutual-TLS problem invisible from the server. The
listener's ``SSLObject`` class therefore logs each failure with OpenSSL's reason, at most
once per reason per minute, with the number of failures left unlogged in between.

Errors:

    TlsConfigError   permanent at start-up: fix the file or the flag named in the message.
                     During a reload it is logged and the previous context stays in use,
                     since a rotation may be half-written and complete a moment later.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from ssl import PROTOCOL_TLS_CLIENT, PROTOCOL_TLS_SERVER, SSLContext, SSLObject, TLSVersion

import anyio
from anyio.abc import TaskStatus

from keda_gpu_scaler.domain.errors import ScalerError
from keda_gpu_scaler.tls_files import (
    file_error,
    pem_text,
    read_pem,
    refuse_password,
    ssl_reason,
)

log = logging.getLogger(__name__)

__all__ = [
    "ALPN_PROTOCOLS",
    "ReloadingTlsContext",
    "TlsConfig",
    "TlsConfigError",
    "build_server_context",
]

# KEDA >= 2.16 (grpc-go >= 1.67) refuses a TLS server that does not select "h2".
ALPN_PROTOCOLS = ("h2",)

HANDSHAKE_LOG_INTERVAL_S = 60.0


class TlsConfigError(ScalerError):
    """A TLS file that cannot be used; the one-line message names the file and the problem."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """PEM files for the gRPC port; ``client_ca_file`` turns on mutual TLS."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    @property
    def files(self) -> tuple[Path, ...]:
        optional = () if self.client_ca_file is None else (self.client_ca_file,)
        return (self.cert_file, self.key_file, *optional)


def build_server_context(config: TlsConfig) -> SSLContext:
    """A server context for ``config``; raises :class:`TlsConfigError` naming the bad file."""
    context = SSLContext(PROTOCOL_TLS_SERVER)
    context.minimum_version = TLSVersion.TLSv1_2
    context.set_alpn_protocols(list(ALPN_PROTOCOLS))
    # A resumed session skips the certificate exchange; without tickets every new connection
    # sees the current certificate and is checked against the current client CA.
    context.options |= ssl.OP_NO_TICKET
    context.num_tickets = 0
    _load_chain(context, config.cert_file, config.key_file)
    if config.client_ca_file is not None:
        _load_client_ca(context, config.client_ca_file)
    return context


class ReloadingTlsContext:
    """Give :attr:`context` to the listener once; :meth:`reload_if_changed` swaps the files."""

    def __init__(self, config: TlsConfig) -> None:
        self.config = config
        # Stat before reading: a change during the first load is then seen by the next check.
        self._signature = _signature(config)
        self._outer = build_server_context(config)
        self._current = self._outer
        self._outer.sni_callback = self._use_current
        self.handshake_failures = HandshakeFailureLog()
        self._outer.sslobject_class = self.handshake_failures.sslobject_class()

    @property
    def context(self) -> SSLContext:
        """The context for ``ScalerServer.start(..., ssl=...)``; the same object for life."""
        return self._outer

    def reload_if_changed(self) -> bool:
        """Rebuild from the files if their stat signature changed; True if new handshakes
        now use new files. Invalid files are logged and the previous context kept."""
        signature = _signature(self.config)
        if signature == self._signature:
            return False
        # Recorded even on failure: a half-written rotation changes the files again when it
        # completes, and retrying unchanged files would only repeat the same error.
        self._signature = signature
        try:
            context = build_server_context(self.config)
        except TlsConfigError as exc:
            log.error(
                "TLS reload failed; new connections keep the previous files",
                extra={"reason": str(exc)},
            )
            return False
        self._current = context
        log.info("TLS files reloaded", extra={"cert_file": str(self.config.cert_file)})
        return True

    async def watch(
        self,
        *,
        interval_s: float = 10.0,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Check the files every ``interval_s`` seconds of anyio's clock, forever."""
        task_status.started()
        while True:
            await anyio.sleep(interval_s)
            # A few stats and small PEM files: cheaper inline than a worker thread.
            self.reload_if_changed()

    def _use_current(
        self, ssl_object: SSLObject, server_name: str | None, outer: SSLContext
    ) -> None:
        current = self._current
        if current is not outer:
            ssl_object.context = current


class HandshakeFailureLog:
    """Logs rejected handshakes by reason, each reason at most once per ``interval_s``.

    ``clock`` is monotonic seconds; the hook runs inside OpenSSL's callback path, outside
    any task, where anyio's clock cannot be read.
    """

    def __init__(
        self,
        *,
        interval_s: float = HANDSHAKE_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._logged_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def unlogged(self) -> dict[str, int]:
        """Refusals counted since their reason was last logged, by reason."""
        return dict(self._unlogged)

    def record(self, exc: ssl.SSLError) -> None:
        reason = handshake_reason(exc)
        now = self._clock()
        last = self._logged_at.get(reason)
        if last is not None and now - last < self.interval_s:
            self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
            return
        self._logged_at[reason] = now
        log.warning(
            "TLS handshake rejected",
            extra={
                "reason": reason,
                "also_rejected_since_last_log": self._unlogged.pop(reason, 0),
            },
        )

    def sslobject_class(self) -> type[SSLObject]:
        failures = self

        class _LoggedSSLObject(SSLObject):
            def do_handshake(self) -> None:
                try:
                    super().do_handshake()
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    raise  # more bytes to come: not a failure
                except ssl.SSLError as exc:
                    failures.record(exc)
                    raise

        return _LoggedSSLObject


def handshake_reason(exc: ssl.SSLError) -> str:
    """What went wrong, in words an operator can act on."""
    verify = getattr(exc, "verify_message", None)
    if verify:
        return f"client certificate refused: {verify}"
    reason = ssl_reason(exc)
    hints = {
        "peer did not return a certificate": "the client sent no certificate (mutual TLS)",
        "wrong version number": "the client does not speak TLS (plaintext on the TLS port?)",
        "http request": "the client does not speak TLS (plaintext on the TLS port?)",
        "no shared cipher": "no cipher in common with the client",
        "unsupported protocol": "the client offers only TLS older than 1.2",
        "tlsv1 alert unknown ca": "the client does not trust this server's certificate",
        "sslv3 alert bad certificate": "the client refused this server's certificate",
        "sslv3 alert certificate unknown": "the client refused this server's certificate",
    }
    hint = hints.get(reason)
    return f"{reason}: {hint}" if hint else reason


_Signature = tuple[tuple[int, int, int, int] | None, ...]


def _signature(config: TlsConfig) -> _Signature:
    return tuple(_stat(path) for path in config.files)


def _stat(path: Path) -> tuple[int, int, int, int] | None:
    try:
        # Follows symlinks: a Kubernetes Secret volume swaps its ..data link, and only the
        # resolved files change inode.
        st = path.stat()
    except OSError:
        return None  # missing now; the reload that follows reports it
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _load_chain(context: SSLContext, cert_file: Path, key_file: Path) -> None:
    _check_certificates(cert_file, "certificate")
    read_pem(key_file, "TLS private key", TlsConfigError)
    try:
        context.load_cert_chain(
            cert_file,
            key_file,
            password=refuse_password(
                f"TLS private key {key_file}: encrypted; give an unencrypted key", TlsConfigError
            ),
        )
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            problem = f"does not match the certificate {cert_file}"
        else:  # the chain was checked above, so what failed to load is the key
            problem = f"no usable PEM private key in it ({ssl_reason(exc)})"
        raise TlsConfigError(f"TLS private key {key_file}: {problem}") from exc
    except OSError as exc:  # replaced between the check and the load
        raise file_error(key_file, "TLS private key", exc, TlsConfigError) from exc


def _load_client_ca(context: SSLContext, ca_file: Path) -> None:
    _check_certificates(ca_file, "client CA")
    try:
        context.load_verify_locations(cafile=ca_file)
    except ssl.SSLError as exc:
        raise TlsConfigError(f"TLS client CA {ca_file}: {ssl_reason(exc)}") from exc
    except OSError as exc:
        raise file_error(ca_file, "TLS client CA", exc, TlsConfigError) from exc
    context.verify_mode = ssl.CERT_REQUIRED


def _check_certificates(path: Path, what: str) -> None:
    """Parse the PEM certificates in ``path``, so that a bad file is named as such."""
    pem = pem_text(read_pem(path, f"TLS {what}", TlsConfigError))
    try:
        SSLContext(PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem)
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"TLS {what} {path}: no valid PEM certificate in it ({ssl_reason(exc)})"
        ) from exc
