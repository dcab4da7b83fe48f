"""The client side of TLS to node agents: one ``SSLContext`` for every agent link.

``--agents-tls-ca`` turns TLS on and names the CA that agents' certificates must chain to;
``--agents-tls-cert`` and ``--agents-tls-key`` add a client certificate (mutual TLS, for
agents started with ``--tls-client-ca``); without a CA, a client certificate alone trusts
the system's CAs. Agents are dialled by pod IP, so ``--agents-tls-server-name`` names what
their certificates carry instead. TLS 1.2 or newer, ALPN ``h2`` (gRPC).

Errors:

    AgentTlsConfigError  permanent at start-up: fix the file or the flag named in the message.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from ssl import SSLContext

from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.tls_files import read_pem, refuse_password, ssl_reason

__all__ = ["AgentTlsConfig", "AgentTlsConfigError", "build_agent_client_context"]


class AgentTlsConfigError(SourceUnavailable):
    """A TLS setting for the agent links that cannot work; the message names it."""


@dataclass(frozen=True, slots=True)
class AgentTlsConfig:
    """PEM files and the name to check, as the ``--agents-tls-*`` flags give them."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str = ""

    @property
    def enabled(self) -> bool:
        return self.ca_file is not None or self.cert_file is not None

    def check(self) -> None:
        """Raises :class:`AgentTlsConfigError` for settings that do not go together."""
        if (self.cert_file is None) != (self.key_file is None):
            raise AgentTlsConfigError("--agents-tls-cert and --agents-tls-key go together")
        if self.server_name and not self.enabled:
            raise AgentTlsConfigError(
                "--agents-tls-server-name needs TLS: give --agents-tls-ca "
                "(or --agents-tls-cert and --agents-tls-key)"
            )


def build_agent_client_context(config: AgentTlsConfig) -> SSLContext | None:
    """The context for every link (None: plaintext); raises :class:`AgentTlsConfigError`
    naming a bad file or flag."""
    config.check()
    if not config.enabled:
        return None
    if config.ca_file is None:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    else:
        # Only the CA given: agents' certificates come from the cluster's own CA.
        context = SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        read_pem(config.ca_file, "--agents-tls-ca", AgentTlsConfigError)
        try:
            context.load_verify_locations(cafile=config.ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise AgentTlsConfigError(
                f"--agents-tls-ca {config.ca_file}: no PEM certificate in it ({ssl_reason(exc)})"
            ) from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    if config.cert_file is not None and config.key_file is not None:
        _load_chain(context, config.cert_file, config.key_file)
    return context


def _load_chain(context: SSLContext, cert: Path, key: Path) -> None:
    read_pem(cert, "--agents-tls-cert", AgentTlsConfigError)
    read_pem(key, "--agents-tls-key", AgentTlsConfigError)
    refuse = refuse_password(
        f"--agents-tls-key {key}: encrypted; give an unencrypted key", AgentTlsConfigError
    )
    try:
        context.load_cert_chain(cert, key, password=refuse)
    except (ssl.SSLError, OSError) as exc:
        if isinstance(exc, ssl.SSLError) and exc.reason == "KEY_VALUES_MISMATCH":
            problem = f"--agents-tls-key {key} does not match --agents-tls-cert {cert}"
        else:
            problem = (
                f"--agents-tls-cert {cert} and --agents-tls-key {key}: no usable PEM "
                f"certificate chain and unencrypted key in them ({ssl_reason(exc)})"
            )
        raise AgentTlsConfigError(problem) from exc
