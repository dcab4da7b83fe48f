"""First contact with the commands: every mistake is one line and a status, never a traceback.

Every port here is one this test holds itself on 127.0.0.1 (port 0, then kept open), and
no test sends a packet off the machine: the unresolvable host is under the reserved
``.invalid`` domain, and 192.0.2.1 (TEST-NET-1) is only ever given to ``bind()``.
"""

from __future__ import annotations

import datetime
import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from keda_gpu_scaler.app import cli
from keda_gpu_scaler.app.scaler import serve

pytestmark = pytest.mark.slow

BUNDLED = Path(__file__).resolve().parent.parent / "src/keda_gpu_scaler/sources/data"
FREE_PORTS = ("--port", "0", "--metrics-port", "0", "--probe-port", "0")


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KEDA_GPU_SCALER_", "SLURM", "CUDA", "GPU_", "FLUX", "KUBERNETES"))
    }
    return {**env, **(extra or {})}


def _scaler(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keda_gpu_scaler", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=_clean_env(env),
    )


def _gpu_metrics(*args: str, env: dict[str, str] | None = None) -> list[str]:
    return [
        sys.executable,
        "-c",
        "from keda_gpu_scaler.app.gpu_metrics.command import main; raise SystemExit(main())",
        *args,
    ]


def _run_gpu_metrics(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _gpu_metrics(*args),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=_clean_env(env),
    )


def _one_line(result: subprocess.CompletedProcess[str], *, status: int = 2) -> str:
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that another socket listens on for the whole test."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize("flag", ["--port", "--metrics-port", "--probe-port"])
def test_a_port_in_use_is_one_line_naming_the_flag(flag: str, taken_port: int) -> None:
    ports = {"--port": "0", "--metrics-port": "0", "--probe-port": "0", flag: str(taken_port)}
    args = [x for pair in ports.items() for x in pair]
    line = _one_line(_scaler("serve", "--source", "replay", "--host", "127.0.0.1", *args))
    assert line == (
        f"keda-gpu-scaler: {flag} {taken_port}: already in use on 127.0.0.1 "
        "(another process listens there)"
    )


def test_a_port_in_use_from_the_environment_names_the_variable(taken_port: int) -> None:
    result = _scaler(
        "serve",
        "--source",
        "replay",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--probe-port",
        "0",
        env={"KEDA_GPU_SCALER_METRICS_PORT": str(taken_port)},
    )
    assert f"--metrics-port (KEDA_GPU_SCALER_METRICS_PORT) {taken_port}:" in _one_line(result)


@pytest.mark.parametrize("flag", ["--metrics-port", "--probe-port"])
def test_the_grpc_port_given_to_an_http_flag_is_refused(flag: str, taken_port: int) -> None:
    other = "--probe-port" if flag == "--metrics-port" else "--metrics-port"
    args = ("--port", str(taken_port), flag, str(taken_port), other, "0")
    line = _one_line(_scaler("serve", "--source", "replay", "--host", "127.0.0.1", *args))
    assert line.startswith(f"keda-gpu-scaler: {flag} {taken_port} is also the gRPC port (--port)")


def test_metrics_and_probes_may_still_share_a_port() -> None:
    args = cli.build_parser().parse_args(
        ["serve", "--port", "7000", "--metrics-port", "7001", "--probe-port", "7001"]
    )
    assert serve._listeners(args) == [
        ("--port", 7000),
        ("--metrics-port", 7001),
        ("--probe-port", 7001),
    ]


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("no-such-host.invalid", "--host 'no-such-host.invalid': cannot be resolved"),
        ("192.0.2.1", "--host 192.0.2.1: not an address of this machine"),
    ],
)
def test_an_unresolvable_or_foreign_host_is_one_line(host: str, message: str) -> None:
    line = _one_line(_scaler("serve", "--source", "replay", "--host", host, *FREE_PORTS))
    assert line.startswith(f"keda-gpu-scaler: {message}")


def test_a_host_from_the_environment_names_the_variable() -> None:
    result = _scaler(
        "serve", "--source", "replay", *FREE_PORTS, env={"KEDA_GPU_SCALER_HOST": "x.invalid"}
    )
    assert "--host (KEDA_GPU_SCALER_HOST) 'x.invalid': cannot be resolved" in _one_line(result)


def test_a_gzipped_recording_replays_as_it_is(tmp_path: Path) -> None:
    packed = tmp_path / "h200.jsonl.gz"
    packed.write_bytes(gzip.compress((BUNDLED / "h200-trace.jsonl").read_bytes()))
    result = _run_gpu_metrics("--source", f"replay:{packed}", "--format", "jsonl")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["index"] == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00\xff\xfe binary", "not a trace (JSON lines in UTF-8, or gzipped)"),
        (gzip.compress(b'{"t": 0}\n')[:-6], "a damaged gzip file"),
    ],
)
@pytest.mark.parametrize("command", ["serve", "gpu-metrics"])
def test_a_trace_that_is_not_text_is_one_line_and_exit_2(
    tmp_path: Path, content: bytes, message: str, command: str
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(content)
    if command == "serve":
        result = _scaler("serve", "--source", f"replay:{trace}", *FREE_PORTS)
    else:
        result = _run_gpu_metrics("--source", f"replay:{trace}")
    assert f"{trace}: {message}" in _one_line(result)


def _tls_files(out: Path) -> dict[str, Path]:
    """A self-signed certificate and its key, each in PEM and in DER."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "keda-gpu-scaler")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    pkcs8, plain = serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    blobs = {
        "cert.pem": cert.public_bytes(serialization.Encoding.PEM),
        "cert.der": cert.public_bytes(serialization.Encoding.DER),
        "key.pem": key.private_bytes(serialization.Encoding.PEM, pkcs8, plain),
        "key.der": key.private_bytes(serialization.Encoding.DER, pkcs8, plain),
    }
    for file_name, blob in blobs.items():
        (out / file_name).write_bytes(blob)
    return {file_name: out / file_name for file_name in blobs}


SERVE_TLS = ("serve", "--source", "replay", "--host", "127.0.0.1", *FREE_PORTS)
CLUSTER_TLS = ("serve", "--source", "agents", "--agents", "static:127.0.0.1:1", *FREE_PORTS)
DER_GIVEN = [  # (command, flags: file names, the DER one's flag)
    (SERVE_TLS, {"--tls-cert": "cert.der", "--tls-key": "key.pem"}, "TLS certificate"),
    (SERVE_TLS, {"--tls-cert": "cert.pem", "--tls-key": "key.der"}, "TLS private key"),
    (
        SERVE_TLS,
        {"--tls-cert": "cert.pem", "--tls-key": "key.pem", "--tls-client-ca": "cert.der"},
        "TLS client CA",
    ),
    (CLUSTER_TLS, {"--agents-tls-ca": "cert.der"}, "--agents-tls-ca"),
    (CLUSTER_TLS, {"--agents-tls-cert": "cert.der", "--agents-tls-key": "key.pem"}, None),
    (CLUSTER_TLS, {"--agents-tls-cert": "cert.pem", "--agents-tls-key": "key.der"}, None),
]


@pytest.mark.parametrize(("command", "flags", "what"), DER_GIVEN)
def test_a_der_file_given_for_pem_is_one_line_and_exit_2(
    tmp_path: Path, command: tuple[str, ...], flags: dict[str, str], what: str | None
) -> None:
    files = _tls_files(tmp_path)
    args = [x for flag, file_name in flags.items() for x in (flag, str(files[file_name]))]
    line = _one_line(_scaler(*command, *args))
    (der_flag,) = [flag for flag, file_name in flags.items() if file_name.endswith(".der")]
    der = files[flags[der_flag]]
    assert f"{what or der_flag} {der}: DER (binary), not PEM: convert it with openssl" in line


@pytest.mark.parametrize(
    "address", ["127.0.0.1:70000", "127.0.0.1:99999", "127.0.0.1", "::1:9090", "host:0"]
)
def test_tap_refuses_an_address_it_cannot_use_in_one_line(address: str) -> None:
    line = _one_line(_scaler("tap", "--address", address))
    assert line.startswith("keda-gpu-scaler tap: argument --address:")
    assert line.endswith("(see keda-gpu-scaler tap --help)")


def test_tap_given_a_url_says_it_takes_the_metrics_ports_host_and_port() -> None:
    line = _one_line(_scaler("tap", "--address", "http://127.0.0.1:9090/debug/tap"))
    assert "'http://127.0.0.1:9090/debug/tap' is a URL: give HOST:PORT" in line
    assert "the tap is (--metrics-port, 9090 by default), as in 127.0.0.1:9090" in line
    assert "IPv6" not in line


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("bogus", 'unknown source "bogus": use nvml, replay, replay:PATH or agents'),
        ("replay:", 'source "replay:": the path is missing: replay:PATH names a recording'),
        ("replay: ", 'source "replay: ": the path is missing'),
    ],
)
def test_a_source_that_cannot_be_read_says_what_is_wrong(spec: str, message: str) -> None:
    line = _one_line(_scaler("serve", "--source", spec, *FREE_PORTS))
    assert line.startswith(f"keda-gpu-scaler: {message}")


def test_gpu_metrics_offers_only_its_own_sources() -> None:
    line = _one_line(_run_gpu_metrics("--source", "bogus"))
    assert line == 'gpu-metrics: unknown source "bogus": use nvml, replay or replay:PATH'


def test_gpu_metrics_into_a_closed_pipe_ends_quietly() -> None:
    command = _gpu_metrics("--source", "replay", "--format", "jsonl", "--interval", "0.05")
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_clean_env()
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        assert json.loads(process.stdout.readline())["index"] == 0  # `| head -1`
        process.stdout.close()
        status = process.wait(timeout=20)
        err = process.stderr.read().decode()
    assert status == 0, err
    assert err == ""


# Moments after the command's own code starts (before, Python is still starting and finding
# the module to run, which no code of ours can guard): the command's imports, the source,
# binding, and serving, where SIGINT is the ordinary request to stop (status 0).
INTERRUPT_AFTER_S: tuple[float, ...] = (0.0, 0.01, 0.03, 0.06, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35)
INTERRUPT_AFTER_S += (0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.85, 1.0, 1.5)


@pytest.mark.parametrize("delay_s", INTERRUPT_AFTER_S)
def test_ctrl_c_at_any_moment_of_start_up_ends_quietly(delay_s: float) -> None:
    command = [
        *(sys.executable, "-X", "importtime", "-m", "keda_gpu_scaler", "serve"),
        *("--source", "replay", "--host", "127.0.0.1", *FREE_PORTS),
    ]
    with subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_clean_env()
    ) as process:
        assert process.stderr is not None
        # -X importtime reports each module once imported; keda_gpu_scaler.app is the first
        # that __main__ imports.
        for line in process.stderr:
            if line.rstrip().endswith(" keda_gpu_scaler.app"):
                break
        time.sleep(delay_s)  # the moment is what this test varies
        process.send_signal(signal.SIGINT)
        err = process.stderr.read()
        status = process.wait(timeout=20)
    said = [line for line in err.splitlines() if not line.startswith("import time:")]
    events = [json.loads(line)["event"] for line in said]
    if "serving" in events:
        assert status == 0, err
        assert events[-2:] == ["shutting down", "stopped"]
    else:
        # Now and then CPython ends an interrupted start-up by re-sending itself SIGINT
        # (when the interrupt passed through code it ran for an extension module), which
        # a shell reports as 130 too; either way nothing is printed.
        assert status in (130, -signal.SIGINT), said
        assert said == []


def test_outside_kubernetes_serve_says_nothing_of_pod_attribution_but_that_it_is_off() -> None:
    command = [sys.executable, "-m", "keda_gpu_scaler", "serve", *SERVE_TLS[1:]]
    with subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_clean_env()
    ) as process:
        assert process.stderr is not None
        said = [json.loads(process.stderr.readline())]
        process.send_signal(signal.SIGINT)
        said += [json.loads(line) for line in process.stderr]
        assert process.wait(timeout=20) == 0
    assert [line["event"] for line in said] == ["serving", "shutting down", "stopped"]
    assert said[0]["pod_attribution"] == "not configured"


def test_gpu_metrics_count_without_interval_samples_at_the_default_interval() -> None:
    result = _run_gpu_metrics("--source", "replay", "--format", "jsonl", "--count", "2")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2
    plan = _run_gpu_metrics("--count", "3", "--dry-run")
    assert json.loads(plan.stdout)["interval_s"] == 1.0


@pytest.mark.parametrize(
    ("args", "env", "origin"),
    [
        (("--device", "3"), {}, '--device="3"'),
        (("--device", "0,GPU-nope"), {}, '--device="0,GPU-nope"'),
        ((), {"CUDA_VISIBLE_DEVICES": "5"}, 'CUDA_VISIBLE_DEVICES="5"'),
    ],
)
def test_a_device_that_matches_nothing_lists_the_devices_there_are(
    args: tuple[str, ...], env: dict[str, str], origin: str
) -> None:
    line = _one_line(_run_gpu_metrics("--source", "replay", *args, env=env))
    assert line.startswith(f"gpu-metrics: {origin}: ")
    assert "matches no device; there are: 0 GPU-4f60bdab-7290-5bab-ee63-d697ab1e6349" in line


def _mig_trace(path: Path) -> Path:
    frames = []
    for t in (0.0, 1.0, 2.0):
        frames.append({"t": t, "index": 0, "uuid": "GPU-a", "name": "A100", "mig_enabled": True})
        for gi in (1, 2):
            frames.append(
                {
                    "t": t,
                    "index": 0,
                    "uuid": f"MIG-{gi}",
                    "name": "A100 MIG 3g.40gb",
                    "parent_index": 0,
                    "parent_uuid": "GPU-a",
                    "gpu_instance_id": gi,
                    "compute_instance_id": 0,
                    "util_gpu": 10.0 * gi,
                }
            )
    path.write_text("".join(json.dumps(f) + "\n" for f in frames))
    return path


def test_mig_instances_are_labelled_gpu_colon_gi_and_selectable(tmp_path: Path) -> None:
    trace = _mig_trace(tmp_path / "mig.jsonl")
    table = _run_gpu_metrics("--source", f"replay:{trace}")
    assert table.returncode == 0, table.stderr
    labels = [line.split()[0] for line in table.stdout.splitlines()[1:]]
    assert labels == ["0", "0:1", "0:2"]
    one = _run_gpu_metrics("--source", f"replay:{trace}", "--device", "0:2", "--format", "jsonl")
    rows = [json.loads(line) for line in one.stdout.splitlines()]
    assert [(r["uuid"], r["gpu_instance_id"]) for r in rows] == [("MIG-2", 2)]
    missing = _one_line(_run_gpu_metrics("--source", f"replay:{trace}", "--device", "0:7"))
    assert missing.endswith("0:7 matches no device; there are: 0 GPU-a, 0:1 MIG-1, 0:2 MIG-2")
