"""TLS and mutual TLS on the gRPC port, over real sockets on 127.0.0.1.

Certificates are made once per session with ``cryptography``. Files live in a directory laid
out like a Kubernetes Secret volume, so rotation is the kubelet's symlink swap.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import shutil
import socket
import ssl
import warnings
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpclib.client import Channel
from grpclib.const import Cardinality
from trio.testing import MockClock

from keda_gpu_scaler.app.scaler.compose import open_scaler
from keda_gpu_scaler.domain.errors import ScalerError
from keda_gpu_scaler.serving._proto.externalscaler import IsActiveResponse, ScaledObjectRef
from keda_gpu_scaler.serving.tls import (
    HandshakeFailureLog,
    ReloadingTlsContext,
    TlsConfig,
    TlsConfigError,
)
from keda_gpu_scaler.sources.fake import FakeGpuSource
from tests.grpcio_client import GrpcioModules, ref
from tests.waiting import wait_until

HOST = "127.0.0.1"
SERVICE_NAMES = ("keda-gpu-scaler.ns", "keda-gpu-scaler.ns.svc", "localhost")
TRIGGER = {"profile": "triton-inference", "cooldownSeconds": "0"}
METRIC = "keda_gpu_triton_inference"

# --- certificates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    cert: x509.Certificate
    cert_pem: bytes
    key_pem: bytes
    cert_file: Path
    key_file: Path

    @property
    def serial(self) -> int:
        return self.cert.serial_number

    @property
    def der(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.DER)


@dataclass(frozen=True)
class Authority:
    name: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    out: Path

    @classmethod
    def create(cls, name: str, out: Path) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = _builder(name, key.public_key(), name, key.public_key()).add_extension(
            x509.BasicConstraints(ca=True, path_length=None), critical=True
        )
        usage = _key_usage(cert_sign=True)
        cert = builder.add_extension(usage, critical=True).sign(key, hashes.SHA256())
        return cls(name, key, cert, out)

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, name: str, *, server: bool, sans: tuple[str, ...] = ()) -> Identity:
        key = ec.generate_private_key(ec.SECP256R1())
        purpose = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            _builder(name, key.public_key(), self.name, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
        )
        if sans:
            builder = builder.add_extension(_alt_names(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = _pem_key(key)
        cert_file, key_file = self.out / f"{name}.crt", self.out / f"{name}.key"
        cert_file.write_bytes(cert_pem)
        key_file.write_bytes(key_pem)
        return Identity(cert, cert_pem, key_pem, cert_file, key_file)


def _builder(
    subject: str, public: ec.EllipticCurvePublicKey, issuer: str, issuer_public: Any
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_public), critical=False
        )
    )


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _alt_names(sans: tuple[str, ...]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in sans]
    names.append(x509.IPAddress(ipaddress.ip_address(HOST)))
    return x509.SubjectAlternativeName(names)


def _pem_key(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


@dataclass(frozen=True)
class Pki:
    ca: Authority
    server: Identity
    rotated: Identity  # same names, new key and serial
    client: Identity
    other_ca: Authority  # unrelated to ca
    stranger: Identity  # a client certificate from other_ca


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    out = tmp_path_factory.mktemp("pki")
    ca = Authority.create("scaler-test-ca", out)
    sans = (*SERVICE_NAMES, "keda-gpu-scaler.ns.svc.cluster.local")
    other_ca = Authority.create("unrelated-ca", out)
    return Pki(
        ca=ca,
        server=ca.issue("server", server=True, sans=sans),
        rotated=ca.issue("server-rotated", server=True, sans=sans),
        client=ca.issue("keda-operator", server=False),
        other_ca=other_ca,
        stranger=other_ca.issue("stranger", server=False),
    )


# --- a Secret volume --------------------------------------------------------------------------


class SecretVolume:
    """Files reached through ``..data``, swapped atomically as the kubelet does."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._version: Path | None = None
        self._versions = 0

    def write(self, files: Mapping[str, bytes]) -> None:
        previous = self._version
        self._versions += 1
        self._version = self.root / f"..version-{self._versions}"
        self._version.mkdir()
        for name, data in files.items():
            (self._version / name).write_bytes(data)
        (self.root / "..data_tmp").symlink_to(self._version.name)
        os.replace(self.root / "..data_tmp", self.root / "..data")
        for name in files:
            if not (self.root / name).is_symlink():
                (self.root / name).symlink_to(Path("..data") / name)
        if previous is not None:
            shutil.rmtree(previous)

    def config(self, *, mtls: bool) -> TlsConfig:
        ca = self.root / "ca.crt" if mtls else None
        return TlsConfig(self.root / "tls.crt", self.root / "tls.key", ca)


def _secret(server: Identity, pki: Pki) -> dict[str, bytes]:
    return {"tls.crt": server.cert_pem, "tls.key": server.key_pem, "ca.crt": pki.ca.pem}


@pytest.fixture
def volume(tmp_path: Path, pki: Pki) -> SecretVolume:
    volume = SecretVolume(tmp_path)
    volume.write(_secret(pki.server, pki))
    return volume


@asynccontextmanager
async def _serving(source: FakeGpuSource, tls: ReloadingTlsContext) -> AsyncIterator[int]:
    async with open_scaler(source, host=HOST, port=0, ssl=tls.context) as running:
        await running.hub.wait_newer(0)
        yield running.port


# --- clients ----------------------------------------------------------------------------------


def _grpcio(
    port: int,
    mods: GrpcioModules,
    credentials: Any,
    name_override: str | None = None,
) -> tuple[Any, Any]:
    """IsActive and GetMetrics on one grpcio channel; blocking, run it in a thread."""
    options = [] if name_override is None else [("grpc.ssl_target_name_override", name_override)]
    with grpc.secure_channel(f"{HOST}:{port}", credentials, options) as channel:
        stub = mods.pb2_grpc.ExternalScalerStub(channel)
        request = ref(mods, TRIGGER)
        metrics = mods.pb2.GetMetricsRequest(scaledObjectRef=request, metricName=METRIC)
        return stub.IsActive(request, timeout=5), stub.GetMetrics(metrics, timeout=5)


def _credentials(pki: Pki, client: Identity | None = None) -> Any:
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=pki.ca.pem)
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca.pem, private_key=client.key_pem, certificate_chain=client.cert_pem
    )


def _client_context(pki: Pki, client: Identity | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=pki.ca.pem.decode())
    context.set_alpn_protocols(["h2"])
    if client is not None:
        context.load_cert_chain(client.cert_file, client.key_file)
    return context


@dataclass(frozen=True)
class Handshake:
    alpn: str | None
    version: str | None
    peer_der: bytes


def _handshake(port: int, context: ssl.SSLContext, server_hostname: str = HOST) -> Handshake:
    """A raw TLS handshake; blocking, run it in a thread."""
    with (
        socket.create_connection((HOST, port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=server_hostname) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return Handshake(tls.selected_alpn_protocol(), tls.version(), der)


async def _peer_serial(channel: Channel) -> int:
    """The serial of the certificate on the channel's connection, after one IsActive call."""
    request = ScaledObjectRef(name="so", namespace="ns", scaler_metadata=TRIGGER)
    async with channel.request(
        "/externalscaler.ExternalScaler/IsActive",
        Cardinality.UNARY_UNARY,
        ScaledObjectRef,
        IsActiveResponse,
        timeout=5,
    ) as stream:
        await stream.send_message(request, end=True)
        reply = await stream.recv_message()
        assert reply is not None and reply.result is True
        assert stream.peer is not None
        cert = stream.peer.cert()
    assert cert is not None
    return int(cert["serialNumber"], 16)


# --- serving ----------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("name", [None, *SERVICE_NAMES])
async def test_grpcio_calls_over_tls_for_each_name(
    fake_gpus: FakeGpuSource,
    volume: SecretVolume,
    pki: Pki,
    grpcio_modules: GrpcioModules,
    name: str | None,
) -> None:
    tls = ReloadingTlsContext(volume.config(mtls=False))
    async with _serving(fake_gpus, tls) as port:
        call = partial(_grpcio, port, grpcio_modules, _credentials(pki), name)
        active, metrics = await anyio.to_thread.run_sync(call)
    assert active.result is True
    assert [(v.metricName, v.metricValueFloat) for v in metrics.metricValues] == [(METRIC, 87.0)]


@pytest.mark.anyio
async def test_alpn_is_h2_from_tls_1_2_up_and_tls_1_1_is_refused(
    fake_gpus: FakeGpuSource, volume: SecretVolume, pki: Pki
) -> None:
    tls12 = _client_context(pki)
    tls12.maximum_version = ssl.TLSVersion.TLSv1_2
    tls11 = _client_context(pki)
    # The old versions warn as deprecated, and OpenSSL 3 offers them at security level 0 only.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        tls11.minimum_version = ssl.TLSVersion.TLSv1_1
        tls11.maximum_version = ssl.TLSVersion.TLSv1_1
    tls11.set_ciphers("DEFAULT:@SECLEVEL=0")
    async with _serving(fake_gpus, ReloadingTlsContext(volume.config(mtls=False))) as port:
        latest = await anyio.to_thread.run_sync(_handshake, port, _client_context(pki))
        older = await anyio.to_thread.run_sync(_handshake, port, tls12)
        with pytest.raises(ssl.SSLError) as refused:
            await anyio.to_thread.run_sync(_handshake, port, tls11)
    assert (latest.alpn, latest.version) == ("h2", "TLSv1.3")
    assert (older.alpn, older.version) == ("h2", "TLSv1.2")
    # asyncio aborts a failed handshake without flushing the alert, so the client may see EOF.
    assert refused.value.reason in {"TLSV1_ALERT_PROTOCOL_VERSION", "UNEXPECTED_EOF_WHILE_READING"}


@pytest.mark.anyio
async def test_plaintext_on_the_tls_port_fails(
    fake_gpus: FakeGpuSource, volume: SecretVolume, grpcio_modules: GrpcioModules
) -> None:
    def plaintext_call(port: int) -> Any:
        with grpc.insecure_channel(f"{HOST}:{port}") as channel:
            stub = grpcio_modules.pb2_grpc.ExternalScalerStub(channel)
            return stub.IsActive(ref(grpcio_modules, TRIGGER), timeout=5)

    async with _serving(fake_gpus, ReloadingTlsContext(volume.config(mtls=False))) as port:
        with pytest.raises(grpc.RpcError) as caught:
            await anyio.to_thread.run_sync(plaintext_call, port)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def _rejections(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "TLS handshake rejected"]


RELOADED = "TLS files reloaded"
RELOAD_FAILED = "TLS reload failed; new connections keep the previous files"


def _reloads(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What each reload said, in order (the log lines an operator sees)."""
    return [m for r in caplog.records if (m := r.getMessage()) in (RELOADED, RELOAD_FAILED)]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("client", "reason"),
    [
        ("none", "peer did not return a certificate: the client sent no certificate"),
        ("stranger", "client certificate refused: unable to get local issuer certificate"),
        ("plaintext", "the client does not speak TLS (plaintext on the TLS port?)"),
    ],
)
async def test_a_rejected_handshake_is_logged_with_its_reason_once_a_minute(
    fake_gpus: FakeGpuSource,
    volume: SecretVolume,
    pki: Pki,
    grpcio_modules: GrpcioModules,
    caplog: pytest.LogCaptureFixture,
    client: str,
    reason: str,
) -> None:
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.serving.tls")

    def attempt(port: int) -> None:
        if client == "plaintext":
            # A subchannel of its own: grpcio would otherwise reuse one connection (and its
            # one refusal) for every channel to the same address.
            options = [("grpc.use_local_subchannel_pool", 1)]
            with grpc.insecure_channel(f"{HOST}:{port}", options=options) as channel:
                stub = grpcio_modules.pb2_grpc.ExternalScalerStub(channel)
                call: Callable[[], Any] = partial(
                    stub.IsActive, ref(grpcio_modules, TRIGGER), timeout=5
                )
                with pytest.raises(grpc.RpcError):
                    call()
            return
        identity = pki.stranger if client == "stranger" else None
        with pytest.raises(grpc.RpcError):
            _grpcio(port, grpcio_modules, _credentials(pki, identity))

    tls = ReloadingTlsContext(volume.config(mtls=True))
    async with _serving(fake_gpus, tls) as port:
        for _ in range(3):
            await anyio.to_thread.run_sync(attempt, port)
        # The clients give up before the server has logged the refusals it answers them with.
        await wait_until(lambda: sum(tls.handshake_failures.unlogged().values()) >= 2)
        [logged] = _rejections(caplog)  # three refusals, one line: the same reason within a minute
        # Each refusal was counted: once the interval is over, the next line says how many
        # went unlogged in between.
        tls.handshake_failures.interval_s = 0.0
        await anyio.to_thread.run_sync(attempt, port)
        await wait_until(lambda: len(_rejections(caplog)) > 1)
    assert logged.levelno == logging.WARNING
    assert reason in logged.__dict__["reason"]
    later = _rejections(caplog)[1]
    assert reason in later.__dict__["reason"]
    assert later.__dict__["also_rejected_since_last_log"] >= 2


def test_rejections_are_logged_again_after_the_interval_with_the_count_in_between(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.serving.tls")
    now = [0.0]
    failures = HandshakeFailureLog(interval_s=60.0, clock=lambda: now[0])
    no_cert = ssl.SSLError(1, "[SSL: PEER_DID_NOT_RETURN_A_CERTIFICATE] peer did not return")
    no_cert.reason = "PEER_DID_NOT_RETURN_A_CERTIFICATE"
    other = ssl.SSLError(1, "[SSL: NO_SHARED_CIPHER] no shared cipher")
    other.reason = "NO_SHARED_CIPHER"
    for at, error in [(0, no_cert), (1, no_cert), (2, other), (59, no_cert), (60, no_cert)]:
        now[0] = float(at)
        failures.record(error)
    assert [
        (r.__dict__["reason"].split(":")[0], r.__dict__["also_rejected_since_last_log"])
        for r in _rejections(caplog)
    ] == [
        ("peer did not return a certificate", 0),
        ("no shared cipher", 0),
        ("peer did not return a certificate", 2),
    ]
    # Every rejection is in a line or in the count of a later one.
    assert sum(1 + r.__dict__["also_rejected_since_last_log"] for r in _rejections(caplog)) == 5


@pytest.mark.anyio
@pytest.mark.parametrize("client", ["none", "stranger"])
async def test_mtls_refuses_clients_without_a_certificate_from_the_ca(
    fake_gpus: FakeGpuSource,
    volume: SecretVolume,
    pki: Pki,
    grpcio_modules: GrpcioModules,
    client: str,
) -> None:
    identity = pki.stranger if client == "stranger" else None
    async with _serving(fake_gpus, ReloadingTlsContext(volume.config(mtls=True))) as port:
        call = partial(_grpcio, port, grpcio_modules, _credentials(pki, identity))
        with pytest.raises(grpc.RpcError) as caught:
            await anyio.to_thread.run_sync(call)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        # The listener is unharmed: the operator's certificate still works.
        good = partial(_grpcio, port, grpcio_modules, _credentials(pki, pki.client))
        active, _ = await anyio.to_thread.run_sync(good)
    assert active.result is True


# --- rotation ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_rotation_reaches_new_connections_and_spares_open_ones(
    fake_gpus: FakeGpuSource, volume: SecretVolume, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.serving.tls")
    tls = ReloadingTlsContext(volume.config(mtls=True))
    listener_context = tls.context
    client = _client_context(pki, pki.client)
    async with _serving(fake_gpus, tls) as port, Channel(HOST, port, ssl=client) as kept:
        assert await _peer_serial(kept) == pki.server.serial
        assert tls.reload_if_changed() is False  # nothing changed yet
        volume.write(_secret(pki.rotated, pki))
        assert tls.reload_if_changed() is True
        fresh = await anyio.to_thread.run_sync(_handshake, port, client)
        assert (fresh.peer_der, fresh.alpn) == (pki.rotated.der, "h2")
        async with Channel(HOST, port, ssl=client) as new:
            assert await _peer_serial(new) == pki.rotated.serial
        # The open connection (KEDA's) keeps its certificate until it reconnects.
        assert await _peer_serial(kept) == pki.server.serial
    assert tls.context is listener_context
    assert _reloads(caplog) == [RELOADED]
    [reloaded] = [r for r in caplog.records if r.getMessage() == RELOADED]
    assert reloaded.__dict__["cert_file"] == str(volume.root / "tls.crt")


@pytest.mark.anyio
async def test_client_ca_rotation_decides_who_may_connect_next(
    fake_gpus: FakeGpuSource, volume: SecretVolume, pki: Pki, grpcio_modules: GrpcioModules
) -> None:
    def outcome(port: int, client: Identity) -> str:
        try:
            _grpcio(port, grpcio_modules, _credentials(pki, client))
        except grpc.RpcError as exc:
            return str(exc.code().name)
        return "OK"

    tls = ReloadingTlsContext(volume.config(mtls=True))
    async with _serving(fake_gpus, tls) as port:
        before = [
            await anyio.to_thread.run_sync(outcome, port, c) for c in (pki.client, pki.stranger)
        ]
        volume.write({**_secret(pki.server, pki), "ca.crt": pki.other_ca.pem})
        assert tls.reload_if_changed() is True
        after = [
            await anyio.to_thread.run_sync(outcome, port, c) for c in (pki.client, pki.stranger)
        ]
    # The swapped-in context brings its own client-CA store; CERT_REQUIRED stays in force.
    assert (before, after) == (["OK", "UNAVAILABLE"], ["UNAVAILABLE", "OK"])


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("bad_files", "error"),
    [
        (
            lambda p: {"tls.crt": p.rotated.cert_pem[:300], "tls.key": p.rotated.key_pem},
            "TLS certificate {root}/tls.crt: no valid PEM certificate in it",
        ),
        (
            lambda p: {"tls.crt": p.rotated.cert_pem, "tls.key": p.server.key_pem},
            "TLS private key {root}/tls.key: does not match the certificate {root}/tls.crt",
        ),
        (
            lambda p: {"tls.crt": p.rotated.cert_pem, "ca.crt": p.ca.pem},
            "TLS private key {root}/tls.key: not found",
        ),
    ],
    ids=["truncated-certificate", "old-key", "key-missing"],
)
async def test_a_bad_rotation_keeps_the_previous_files_until_fixed(
    fake_gpus: FakeGpuSource,
    volume: SecretVolume,
    pki: Pki,
    caplog: pytest.LogCaptureFixture,
    bad_files: Callable[[Pki], dict[str, bytes]],
    error: str,
) -> None:
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.serving.tls")
    tls = ReloadingTlsContext(volume.config(mtls=False))
    expected = error.format(root=volume.root)
    async with _serving(fake_gpus, tls) as port:
        volume.write(bad_files(pki))
        assert tls.reload_if_changed() is False
        assert tls.reload_if_changed() is False  # the same bad files are reported once
        still = await anyio.to_thread.run_sync(_handshake, port, _client_context(pki))
        assert still.peer_der == pki.server.der
        [failure] = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert failure.getMessage() == RELOAD_FAILED
        assert failure.__dict__["reason"].startswith(expected)
        volume.write(_secret(pki.rotated, pki))  # the rotation completes
        assert tls.reload_if_changed() is True
        fixed = await anyio.to_thread.run_sync(_handshake, port, _client_context(pki))
    assert fixed.peer_der == pki.rotated.der
    # One reload failed, then one worked, and that is the last word.
    assert _reloads(caplog) == [RELOAD_FAILED, RELOADED]


@pytest.mark.trio
async def test_watch_checks_on_anyios_clock(
    autojump_clock: MockClock, volume: SecretVolume, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.serving.tls")
    tls = ReloadingTlsContext(volume.config(mtls=False))
    rotations = [pki.rotated, pki.server]
    reloads: dict[float, int] = {}
    async with anyio.create_task_group() as tg:
        await tg.start(partial(tls.watch, interval_s=10.0))
        # Between the watcher's checks (every 10 s): rotate at 3 and 15, look around each check.
        for at in (3.0, 9.5, 10.5, 15.0, 19.5, 20.5, 39.5):
            await anyio.sleep_until(at)
            if at in (3.0, 15.0):
                volume.write(_secret(rotations.pop(0), pki))
            reloads[at] = _reloads(caplog).count(RELOADED)
        tg.cancel_scope.cancel()
    assert reloads == {3.0: 0, 9.5: 0, 10.5: 1, 15.0: 1, 19.5: 1, 20.5: 2, 39.5: 2}


# --- configuration errors ---------------------------------------------------------------------


def _encrypted(key_pem: bytes) -> bytes:
    key = serialization.load_pem_private_key(key_pem, None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return _pem_key(key, b"secret")


BAD_CONTENT: dict[str, Callable[[Pki], bytes]] = {
    "empty": lambda p: b"\n",
    "a-key": lambda p: p.server.key_pem,
    "a-certificate": lambda p: p.server.cert_pem,
    "another-key": lambda p: p.rotated.key_pem,
    "encrypted": lambda p: _encrypted(p.server.key_pem),
    "not-base64": lambda p: b"-----BEGIN CERTIFICATE-----\nnot base64\n",
    "der-certificate": lambda p: p.server.der,
    "der-key": lambda p: serialization.load_pem_private_key(p.server.key_pem, None).private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ),
    "binary": lambda p: bytes(range(256)),
}

BAD_CONFIGS = [  # (file, damage, message)
    ("cert", "missing", "TLS certificate {cert}: not found"),
    ("key", "missing", "TLS private key {key}: not found"),
    ("ca", "missing", "TLS client CA {ca}: not found"),
    ("cert", "directory", "TLS certificate {cert}: is a directory, not a file"),
    ("cert", "empty", "TLS certificate {cert}: the file is empty"),
    ("cert", "a-key", "TLS certificate {cert}: no valid PEM certificate in it"),
    ("key", "a-certificate", "TLS private key {key}: no usable PEM private key in it"),
    ("key", "another-key", "TLS private key {key}: does not match the certificate {cert}"),
    ("key", "encrypted", "TLS private key {key}: encrypted; give an unencrypted key"),
    ("ca", "not-base64", "TLS client CA {ca}: no valid PEM certificate in it"),
    ("cert", "der-certificate", "TLS certificate {cert}: DER (binary), not PEM: convert it"),
    ("key", "der-key", "TLS private key {key}: DER (binary), not PEM: convert it"),
    ("ca", "der-certificate", "TLS client CA {ca}: DER (binary), not PEM: convert it"),
    ("ca", "binary", "TLS client CA {ca}: not PEM (no -----BEGIN line in it)"),
]


def _damage(path: Path, how: str, pki: Pki) -> None:
    path.unlink()
    if how == "directory":
        path.mkdir()
    elif how != "missing":
        path.write_bytes(BAD_CONTENT[how](pki))


@pytest.mark.parametrize(
    ("culprit", "damage", "message"), BAD_CONFIGS, ids=[f"{f}-{d}" for f, d, _ in BAD_CONFIGS]
)
def test_bad_files_fail_at_start_with_one_line_naming_the_file(
    tmp_path: Path, pki: Pki, culprit: str, damage: str, message: str
) -> None:
    files = {"cert": tmp_path / "tls.crt", "key": tmp_path / "tls.key", "ca": tmp_path / "ca.crt"}
    files["cert"].write_bytes(pki.server.cert_pem)
    files["key"].write_bytes(pki.server.key_pem)
    files["ca"].write_bytes(pki.ca.pem)
    _damage(files[culprit], damage, pki)
    with pytest.raises(TlsConfigError) as caught:
        ReloadingTlsContext(TlsConfig(files["cert"], files["key"], files["ca"]))
    text = str(caught.value)
    assert isinstance(caught.value, ScalerError)
    assert "\n" not in text
    assert text.startswith(message.format(**files))
    assert str(files[culprit]) in text
