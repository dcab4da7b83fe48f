"""Certificates, keys and kubeconfigs for one control plane, made fresh for every run.

One cluster CA signs the API server's serving certificate and every client certificate
(administrator, controller manager); a front-proxy CA signs the aggregator's client
certificate (the requestheader authentication an aggregated API server checks); a KEDA CA
signs the one certificate the KEDA operator and its metrics server present to each other and
to the API server. The service-account signing key is an RSA pair, as kube-apiserver wants.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, written as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    pair: Pair


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def authority(directory: Path, name: str) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    pair = Pair(
        _write(directory / f"{name}.crt", _cert_pem(cert)),
        _write(directory / f"{name}.key", _key_pem(key)),
    )
    return Authority(cert, key, pair)


def issue(
    ca: Authority,
    directory: Path,
    file_name: str,
    common_name: str,
    *,
    organization: str | None = None,
    hosts: Sequence[str] = (),
    server: bool = False,
    client: bool = False,
) -> Pair:
    """A leaf certificate for ``common_name``; ``hosts`` are DNS names or IP addresses."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [ExtendedKeyUsageOID.CLIENT_AUTH] * client
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organization))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(h) for h in hosts]), critical=False
        )
    cert = builder.sign(ca.key, hashes.SHA256())
    return Pair(
        _write(directory / f"{file_name}.crt", _cert_pem(cert)),
        _write(directory / f"{file_name}.key", _key_pem(key)),
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def service_account_keys(directory: Path) -> Pair:
    """The RSA pair the API server signs service-account tokens with (``cert``: the public
    key)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return Pair(
        _write(directory / "sa.pub", public),
        _write(directory / "sa.key", _key_pem(key)),
    )


def kubeconfig(
    path: Path,
    server: str,
    ca: Path,
    *,
    user: str,
    client: Pair | None = None,
    token: str | None = None,
) -> Path:
    """A kubeconfig with one cluster, one user (a client certificate or a token), one context."""
    credentials: dict[str, str] = {}
    if client:
        credentials = {"client-certificate": str(client.cert), "client-key": str(client.key)}
    if token:
        credentials = {"token": token}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    }
    _write(path, yaml.safe_dump(config).encode())
    return path
