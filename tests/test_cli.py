"""The keda-gpu-scaler command line: flags, environment variables, logs and the tap client."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import anyio
import pytest

from keda_gpu_scaler.app import cli
from keda_gpu_scaler.app.cli import build_parser
from keda_gpu_scaler.app.gpu_metrics import command as gpu_metrics
from keda_gpu_scaler.app.logs import JsonFormatter
from keda_gpu_scaler.app.scaler import serve_flags
from keda_gpu_scaler.app.scaler.compose import RunningScaler

SERVE_FLAGS = {
    "--host": ("HOST", "::1", "host", "::1"),
    "--port": ("PORT", "7000", "port", 7000),
    "--source": ("SOURCE", "replay", "source", "replay"),
    "--interval": ("INTERVAL", "2.5", "interval", 2.5),
    "--metrics-port": ("METRICS_PORT", "0", "metrics_port", 0),
    "--probe-port": ("PROBE_PORT", "9999", "probe_port", 9999),
    "--health-check-interval": ("HEALTH_CHECK_INTERVAL", "3", "health_check_interval", 3.0),
    "--max-concurrent-streams": ("MAX_CONCURRENT_STREAMS", "2000", "max_concurrent_streams", 2000),
    "--log-level": ("LOG_LEVEL", "debug", "log_level", "debug"),
    "--pod-resources-socket": (
        "POD_RESOURCES_SOCKET",
        "/run/k.sock",
        "pod_resources_socket",
        "/run/k.sock",
    ),
    "--pod-resources-interval": ("POD_RESOURCES_INTERVAL", "2", "pod_resources_interval", 2.0),
    "--dra-join": ("DRA_JOIN", "0", "dra_join", False),
    "--agents-tls-ca": ("AGENTS_TLS_CA", "/x/ca.crt", "agents_tls_ca", Path("/x/ca.crt")),
    "--agents-tls-cert": ("AGENTS_TLS_CERT", "/x/tls.crt", "agents_tls_cert", Path("/x/tls.crt")),
    "--agents-tls-key": ("AGENTS_TLS_KEY", "/x/tls.key", "agents_tls_key", Path("/x/tls.key")),
    "--agents-tls-server-name": (
        "AGENTS_TLS_SERVER_NAME",
        "agents.gpu.svc",
        "agents_tls_server_name",
        "agents.gpu.svc",
    ),
    "--agents": ("AGENTS", "static:127.0.0.1:6000", "agents", "static:127.0.0.1:6000"),
    "--pod-namespaces": ("POD_NAMESPACES", "serve, ml", "pod_namespaces", "ml,serve"),
    "--host-proc": ("HOST_PROC", "/proc", "host_proc", "/proc"),
    "--process-interval": ("PROCESS_INTERVAL", "2", "process_interval", 2.0),
    "--mig-layout-interval": ("MIG_LAYOUT_INTERVAL", "2.5", "mig_layout_interval", 2.5),
}


@pytest.mark.parametrize(("flag", "spec"), SERVE_FLAGS.items())
def test_every_serve_flag_reads_its_environment_variable(
    flag: str, spec: tuple[str, str, str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    env, raw, attribute, expected = spec
    monkeypatch.setenv(f"KEDA_GPU_SCALER_{env}", raw)
    args = build_parser().parse_args(["serve"])
    assert getattr(args, attribute) == expected


def test_the_flag_table_covers_every_serve_flag() -> None:
    assert {flag.name for flag in serve_flags.SERVE_FLAGS} == set(SERVE_FLAGS) | {
        "--tls-cert",
        "--tls-key",
        "--tls-client-ca",
        "--tls-reload-interval",
        "--engine-interval",
        "--engine-idle-stop",
        "--engine-allowed-networks",
        "--gpu-resource-names",
        "--dra-drivers",
        "--node-name",
    }


def test_a_bad_agents_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", "--agents", "carrier-pigeon:x"])
    assert exited.value.code == 2
    assert "--agents" in capsys.readouterr().err


def test_source_agents_needs_agents() -> None:
    assert cli.main(["serve", "--source", "agents", "--port", "0"]) == 2


def test_attribution_flags_and_their_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(["serve"])
    assert args.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert str(args.gpu_resource_names) == "nvidia.com/gpu,nvidia.com/mig-*"
    assert args.node_name == ""
    # The node name comes from NODE_NAME, as the Downward API sets it.
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    monkeypatch.setenv("KEDA_GPU_SCALER_GPU_RESOURCE_NAMES", "nvidia.com/gpu.shared, amd.com/*")
    monkeypatch.setenv("KEDA_GPU_SCALER_POD_RESOURCES_SOCKET", "")
    args = build_parser().parse_args(["serve"])
    assert args.node_name == "gpu-node-7"
    assert str(args.gpu_resource_names) == "nvidia.com/gpu.shared,amd.com/*"
    assert args.gpu_resource_names.matches("amd.com/gpu")
    assert args.pod_resources_socket == ""


def test_dra_flags_and_their_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(["serve"])
    assert (str(args.dra_drivers), args.dra_join) == ("gpu.nvidia.com", True)
    monkeypatch.setenv("KEDA_GPU_SCALER_DRA_DRIVERS", "gpu.nvidia.com, gpu.example.com")
    monkeypatch.setenv("KEDA_GPU_SCALER_DRA_JOIN", "false")
    args = build_parser().parse_args(["serve"])
    assert args.dra_drivers.is_gpu_driver("gpu.example.com")
    assert args.dra_join is False
    # None at all is allowed: a GPU is then still recognised by its ResourceSlice.
    assert build_parser().parse_args(["serve", "--dra-drivers", ""]).dra_drivers.names == ()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu-resource-names", "nvidia.com/gpu,,x"], "--gpu-resource-names"),
        (["--gpu-resource-names", "*"], "--gpu-resource-names"),
        (["--node-name", "Bad_Node"], "not a node name"),
        (["--pod-resources-interval", "0"], "--pod-resources-interval"),
        (["--dra-drivers", "gpu.nvidia.com,GPU_X"], "'GPU_X' (entry 2"),
        (["--dra-join", "maybe"], "--dra-join: not true or false: 'maybe'"),
    ],
)
def test_bad_attribution_flags_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_kubernetes_service_link_variables_are_not_taken_for_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A Service named keda-gpu-scaler makes Kubernetes set this in every pod of the namespace.
    monkeypatch.setenv("KEDA_GPU_SCALER_PORT", "tcp://10.96.0.17:6000")
    assert build_parser().parse_args(["serve"]).port == 6000


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEDA_GPU_SCALER_PORT", "7000")
    assert build_parser().parse_args(["serve", "--port", "7001"]).port == 7001


def test_a_bad_variable_is_not_read_when_its_flag_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KEDA_GPU_SCALER_PORT", "abc")
    assert build_parser().parse_args(["serve", "--port", "7001"]).port == 7001


def test_messages_name_the_variable_a_value_came_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEDA_GPU_SCALER_METRICS_PORT", "7000")
    args = build_parser().parse_args(["serve", "--probe-port", "7001"])
    assert (
        serve_flags.named(args, "--metrics-port") == "--metrics-port (KEDA_GPU_SCALER_METRICS_PORT)"
    )
    assert serve_flags.named(args, "--probe-port") == "--probe-port"
    assert serve_flags.named(args, "--port") == "--port"


def test_the_stream_limit_default_is_the_servers() -> None:
    from keda_gpu_scaler.serving import server

    assert serve_flags.DEFAULT_MAX_CONCURRENT_STREAMS == server.DEFAULT_MAX_CONCURRENT_STREAMS


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keda_gpu_scaler", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("serve", "--port", "70000"), {}, "not a TCP port"),
        (("serve",), {"KEDA_GPU_SCALER_PORT": "abc"}, "not a TCP port"),
        (("serve", "--interval", "0"), {}, "--interval: must be a positive duration"),
        (("serve", "--max-concurrent-streams", "50"), {}, "from 100 to 2147483647"),
        (
            ("serve",),
            {"KEDA_GPU_SCALER_MAX_CONCURRENT_STREAMS": "50"},
            "argument --max-concurrent-streams: must be an integer from 100 to 2147483647: '50' "
            "(from KEDA_GPU_SCALER_MAX_CONCURRENT_STREAMS)",
        ),
        (("serve",), {"KEDA_GPU_SCALER_INTERVAL": "-1"}, "(from KEDA_GPU_SCALER_INTERVAL)"),
        (("serve", "--source", "replay:/nonexistent.jsonl"), {}, "cannot read replay trace"),
        (("serve", "--source", "sim"), {}, 'unknown source "sim"'),
        (
            ("serve", "--source", "replay", "--tls-cert", "/nonexistent/tls.crt"),
            {},
            "--tls-cert and --tls-key go together",
        ),
        (
            ("serve", "--source", "replay", "--tls-client-ca", "/x/ca.crt"),
            {},
            "--tls-client-ca needs --tls-cert and --tls-key",
        ),
        (
            (
                "serve",
                "--source",
                "replay",
                "--tls-cert",
                "/nonexistent/tls.crt",
                "--tls-key",
                "/nonexistent/tls.key",
            ),
            {},
            "/nonexistent/tls.crt",
        ),
        (("serve", "--engine-allowed-networks", "10.0.0.0/33"), {}, "not a list of networks"),
        (
            ("serve", "--host-proc", "/nonexistent/proc"),
            {},
            "--host-proc /nonexistent/proc: not a directory",
        ),
        (
            ("serve",),
            {"KEDA_GPU_SCALER_HOST_PROC": "/nonexistent/proc"},
            "--host-proc (KEDA_GPU_SCALER_HOST_PROC) /nonexistent/proc: not a directory",
        ),
        (("serve", "--process-interval", "0"), {}, "--process-interval: must be a positive"),
        (
            ("serve", "--mig-layout-interval", "-1"),
            {},
            "--mig-layout-interval: must be a positive",
        ),
    ],
)
def test_bad_configuration_is_a_clear_error_and_exit_2(
    args: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    result = _cli(*args, env=env)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_log_lines_are_json_with_stable_keys() -> None:
    record = logging.makeLogRecord(
        {
            "name": "keda_gpu_scaler.x",
            "levelname": "WARNING",
            "msg": "source failed; restarting",
            "source": "nvml",
            "retry_in_s": 0.5,
            "created": 0.0,
            "msecs": 0.0,
        }
    )
    entry = json.loads(JsonFormatter().format(record))
    assert entry == {
        "time": "1970-01-01T00:00:00.000Z",
        "level": "warning",
        "event": "source failed; restarting",
        "logger": "keda_gpu_scaler.x",
        "source": "nvml",
        "retry_in_s": 0.5,
    }


@pytest.mark.slow
@pytest.mark.anyio
async def test_tap_command_prints_live_json_lines(scaler: RunningScaler) -> None:
    command = [
        sys.executable,
        "-m",
        "keda_gpu_scaler",
        "tap",
        "--address",
        f"127.0.0.1:{scaler.metrics_port}",
        "--device",
        "0",
    ]
    async with await anyio.open_process(command) as process:
        assert process.stdout is not None
        buffered = b""
        with anyio.fail_after(20):
            while buffered.count(b"\n") < 2:
                buffered += await process.stdout.receive()
        process.send_signal(signal.SIGINT)
        assert await process.wait() == 0
    events = [json.loads(line) for line in buffered.splitlines()[:2]]
    assert {(e["type"], e["index"]) for e in events} == {("gpu", 0)}


@pytest.mark.slow
def test_tap_command_without_a_server_is_one_line_and_exit_1() -> None:
    import socket

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    result = _cli("tap", "--address", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert result.stderr.startswith("keda-gpu-scaler tap: http://127.0.0.1:")
    assert len(result.stderr.strip().splitlines()) == 1


def test_serving_freezes_start_up_objects_and_makes_collections_smaller_and_full_ones_rarer() -> (
    None
):
    # In a process of its own: the collector's settings are the whole process's.
    probe = (
        "import gc\n"
        "from keda_gpu_scaler.app.scaler import compose\n"
        "before = gc.get_threshold()\n"
        "compose.tune_garbage_collector()\n"
        "after = gc.get_threshold()\n"
        "print(gc.get_freeze_count() > 1000, before[0] == after[0], *after[1:], "
        "compose.MIDDLE_COLLECTION_AFTER, compose.FULL_COLLECTION_AFTER)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["True", "True", "2", "500", "2", "500"]


# --- help ---------------------------------------------------------------------------------


def _help(
    main: Callable[[list[str]], int], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> str:
    with pytest.raises(SystemExit) as ended:
        main([*argv, "--help"])
    assert ended.value.code == 0
    return capsys.readouterr().out


SCALER_HELPS = [[], ["serve"], ["tap"], ["demo"], ["simulate"]]
GPU_METRICS_HELPS = [[], ["record"]]


@pytest.mark.parametrize("argv", SCALER_HELPS, ids=lambda a: " ".join(a) or "top")
def test_keda_gpu_scaler_help_shows_no_source_markup(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert "`" not in _help(cli.main, argv, capsys)


@pytest.mark.parametrize("argv", GPU_METRICS_HELPS, ids=lambda a: " ".join(a) or "top")
def test_gpu_metrics_help_shows_no_source_markup(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert "`" not in _help(gpu_metrics.main, argv, capsys)


def test_gpu_metrics_help_lists_record(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(gpu_metrics.main, [], capsys)
    assert "gpu-metrics record --output FILE" in text
    assert re.search(r"^  record +write a recording", text, re.MULTILINE)


def test_the_top_level_help_says_which_flags_have_variables_and_they_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    top = " ".join(_help(cli.main, [], capsys).split())
    assert "Every flag of serve can also be set from an environment variable" in top
    assert "the other commands take flags only" in top
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr,index]
    options = [a for a in serve._actions if a.option_strings and a.dest != "help"]
    assert len(options) == len(serve_flags.SERVE_FLAGS)
    for action in options:
        assert re.search(r"\(env (KEDA_GPU_SCALER_[A-Z_]+|NODE_NAME);", action.help or ""), (
            action.option_strings
        )


# --- first contact: the bare command, the tap at another port -----------------------------

NO_NVML = "NVML library libnvidia-ml.so.1 not found: NVML Shared Library Not Found"


def _without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    from keda_gpu_scaler.app.scaler import compose
    from keda_gpu_scaler.domain.errors import SourceUnavailable

    def unavailable(spec: str, **options: object) -> NoReturn:
        assert spec == "nvml"
        raise SourceUnavailable(NO_NVML)

    monkeypatch.setattr(compose, "build_source", unavailable)
    monkeypatch.delenv("KEDA_GPU_SCALER_SOURCE", raising=False)


def test_bare_without_nvml_names_demo_and_help_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_nvml(monkeypatch)
    assert cli.main([]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"keda-gpu-scaler: {NO_NVML}; ")
    assert "keda-gpu-scaler demo runs without a GPU" in line
    assert "keda-gpu-scaler --help lists the commands" in line


def test_serve_named_without_nvml_is_the_plain_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_nvml(monkeypatch)
    assert cli.main(["serve", "--port", "0", "--metrics-port", "0", "--probe-port", "0"]) == 2
    assert capsys.readouterr().err == f"keda-gpu-scaler: {NO_NVML}\n"


TAP_PORT = "the tap is on the metrics port (--metrics-port, 9090 by default)"


async def _tap_says(port: int) -> list[str]:
    command = [sys.executable, "-m", "keda_gpu_scaler", "tap", "--address", f"127.0.0.1:{port}"]
    done = await anyio.run_process(command, check=False)
    assert done.returncode == 1
    return done.stderr.decode().splitlines()


@pytest.mark.slow
@pytest.mark.anyio
async def test_tap_at_the_grpc_port_says_it_is_the_grpc_port(scaler: RunningScaler) -> None:
    assert await _tap_says(scaler.port) == [
        f"keda-gpu-scaler tap: 127.0.0.1:{scaler.port} does not answer HTTP/1.1: it looks like "
        f"the scaler's gRPC port (--port, 6000 by default), which speaks HTTP/2; {TAP_PORT}"
    ]


@pytest.mark.slow
@pytest.mark.anyio
async def test_tap_at_the_probe_port_says_it_is_the_probe_port(scaler: RunningScaler) -> None:
    assert scaler.probe_port is not None
    said = await _tap_says(scaler.probe_port)
    assert said == [
        f"keda-gpu-scaler tap: 127.0.0.1:{scaler.probe_port} is the scaler's probe port "
        f"(--probe-port, 8081 by default: /healthz and /readyz only); {TAP_PORT}"
    ]
    assert said[0].count("127.0.0.1") == 1
