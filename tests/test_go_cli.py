"""The Go project's command lines and its ``gpu-metrics --format json`` document."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

import pytest

from keda_gpu_scaler import __version__
from keda_gpu_scaler.app import gocli
from keda_gpu_scaler.app.cli import build_parser
from keda_gpu_scaler.app.gpu_metrics import command as gm
from keda_gpu_scaler.app.gpu_metrics import gojson


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("0.5", 0.5),
        ("30s", 30.0),
        ("1m", 60.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("1h", 3600.0),
        ("1.5s", 1.5),
    ],
)
def test_durations_take_go_units(text: str, seconds: float) -> None:
    assert gocli.positive_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5 s", "s", "1d", "-1s", "0"])
def test_bad_durations_name_the_value(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=repr(text).replace("\\", "\\\\")):
        gocli.positive_duration(text)


def test_interval_zero_means_once() -> None:
    assert gocli.interval_or_once("0") is None
    assert gocli.interval_or_once("0s") is None
    assert gocli.interval_or_once("5s") == 5.0


def test_bare_flags_serve() -> None:
    argv = ["--port", "6000", "--log-level", "warn", "--interval", "500ms"]
    argv += ["--health-check-interval", "30s", "--engine-idle-stop", "10m"]
    args = build_parser().parse_args(gocli.with_default_command(argv, default="serve"))
    assert args.command == "serve"
    assert (args.port, args.log_level, args.interval) == (6000, "warning", 0.5)
    assert (args.health_check_interval, args.engine_idle_stop) == (30.0, 600.0)
    assert gocli.with_default_command([], default="serve") == ["serve"]
    for kept in (["tap"], ["--version"], ["-h"], ["serve", "--port", "1"]):
        assert gocli.with_default_command(kept, default="serve") == kept


def test_gpu_metrics_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        gm.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"gpu-metrics {__version__}"


def test_go_environment_keys() -> None:
    k8s = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "NODE_NAME": "n1", "POD_NAME": "p"}
    assert gojson.go_environment(k8s | {"POD_NAMESPACE": "keda"}) == {
        "orchestrator": "k8s",
        "node": "n1",
        "pod_name": "p",
        "namespace": "keda",
    }
    slurm = {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "c7", "SLURM_PROCID": "3"}
    assert gojson.go_environment(slurm | {"SLURM_JOB_PARTITION": "gpu"}) == {
        "orchestrator": "slurm",
        "node": "c7",
        "job_id": "42",
        "task_rank": 3,
        "partition": "gpu",
    }
    flux = {"FLUX_JOB_ID": "f1", "FLUX_TASK_RANK": "1", "FLUX_URI": "local:///run/flux"}
    assert gojson.go_environment(flux) == {
        "orchestrator": "flux",
        "job_id": "f1",
        "task_rank": 1,
        "flux_uri": "local:///run/flux",
    }
    assert gojson.go_environment({}, "kubernetes")["orchestrator"] == "k8s"
    assert gojson.go_environment(k8s, "standalone")["orchestrator"] == "standalone"


@pytest.mark.slow
def test_json_is_the_go_document(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    monkeypatch.setenv("POD_NAME", "keda-gpu-scaler-x")
    monkeypatch.setenv("POD_NAMESPACE", "keda")
    for name in ("SLURM_JOB_ID", "FLUX_JOB_ID", "FLUX_URI"):
        monkeypatch.delenv(name, raising=False)
    assert (
        gm.main(["--source", "replay", "--format", "json", "--interval", "0", "--device", "-1"])
        == 0
    )
    document = json.loads(capsys.readouterr().out)
    assert list(document) == ["environment", "collected_at", "devices"]
    assert document["environment"] == {
        "orchestrator": "k8s",
        "node": "gpu-node-1",
        "pod_name": "keda-gpu-scaler-x",
        "namespace": "keda",
    }
    assert datetime.fromisoformat(document["collected_at"]).tzinfo is not None
    assert document["collected_at"].endswith("Z")
    (device,) = document["devices"]
    types = {"index": int, "uuid": str, "name": str, "memory_total_mib": int}
    types |= {"gpu_utilization": float, "memory_used_mib": float, "temperature": float}
    types |= {"power_draw": float}
    for key, kind in types.items():
        assert isinstance(device[key], kind), key


@pytest.mark.slow
def test_continuous_json_is_one_document_per_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the Flux plugin writes to its .jsonl file (gpu-metrics --interval 5s)."""
    monkeypatch.setenv("FLUX_JOB_ID", "f1")
    monkeypatch.setenv("FLUX_TASK_RANK", "2")
    for name in ("SLURM_JOB_ID", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    argv = ["--source", "replay", "--format", "json", "--env", "flux", "--interval", "100ms"]
    assert gm.main([*argv, "--count", "2", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line in lines:
        document = json.loads(line)
        assert document["environment"] == {"orchestrator": "flux", "job_id": "f1", "task_rank": 2}
        assert document["devices"]
