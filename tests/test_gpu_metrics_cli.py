"""gpu-metrics as a subprocess: exit codes, and output parsable as JSON, JSON lines and CSV."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import anyio
import pytest

from keda_gpu_scaler.app.gpu_metrics.output import ATTRIBUTION_FIELDS, FIELDS, render_table

pytestmark = pytest.mark.slow


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-c",
        "from keda_gpu_scaler.app.gpu_metrics.command import main; raise SystemExit(main())",
        *args,
    ]
    full_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM", "CUDA", "GPU_", "FLUX", "KUBERNETES"))
    }
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        env={**full_env, **(env or {})},
        check=False,
    )


def test_json_is_one_document_with_the_documented_keys() -> None:
    result = _run("--source", "replay", "--format", "json")
    assert result.returncode == 0, result.stderr
    # The Go project's document (tests/test_go_cli.py): environment, collected_at, devices.
    rows = json.loads(result.stdout)["devices"]
    assert len(rows) == 1
    assert tuple(rows[0]) == FIELDS
    assert rows[0]["uuid"] == "GPU-4f60bdab-7290-5bab-ee63-d697ab1e6349"
    assert rows[0]["nvlink_tx_mbps"] is None  # unsupported on that H200: null, not 0
    # GPM needs two samples (the recording's first frame has none): the second cycle is shown.
    assert rows[0]["dram_bw_util"] is not None


def test_jsonl_with_an_interval_is_one_object_per_line() -> None:
    result = _run("--source", "replay", "--format", "jsonl", "--interval", "0.1", "--count", "4")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4
    assert all(json.loads(line)["index"] == 0 for line in lines)


def test_csv_header_once_with_an_interval() -> None:
    result = _run("--source", "replay", "--format", "csv", "--interval", "0.1", "--count", "3")
    assert result.returncode == 0, result.stderr
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows[0] == list(FIELDS)
    assert len(rows) == 4
    assert sum(row == list(FIELDS) for row in rows) == 1


def test_device_filter_and_environment_scope() -> None:
    chosen = _run("--source", "replay", "--format", "json", "--device", "0")
    assert [r["index"] for r in json.loads(chosen.stdout)["devices"]] == [0]
    scoped = _run("--source", "replay", "--format", "json", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert len(json.loads(scoped.stdout)["devices"]) == 1


def test_dry_run_touches_no_gpu() -> None:
    result = _run(
        "--dry-run", env={"SLURM_JOB_ID": "9", "SLURMD_NODENAME": "n1", "SLURM_STEP_GPUS": "1,2"}
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["source"] == "nvml"
    assert plan["environment"] == {"kind": "slurm", "node": "n1", "job": "9"}
    assert plan["devices"]["indices"] == [1, 2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--source", "nvml"), "NVML library libnvidia-ml.so.1 not found"),
        (("--source", "replay:/nonexistent/trace.jsonl"), "cannot read replay trace"),
        (("--source", "gpu"), 'unknown source "gpu"'),
        (("record", "--output", "/tmp/never.jsonl", "--duration", "1"), "libnvidia-ml.so.1"),
    ],
)
def test_unusable_source_is_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    result = _run(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args",
    [("--interval", "x"), ("--format", "xml"), ("--count", "-1"), ("--watch", "--format", "json")],
)
def test_bad_flags_exit_2_with_a_message(args: tuple[str, ...]) -> None:
    result = _run("--source", "replay", *args)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()  # one line, not the whole usage above it
    assert line.startswith("gpu-metrics: ")
    assert line.endswith("(see gpu-metrics --help)")


def test_bad_scope_variable_is_a_clear_error() -> None:
    result = _run("--source", "replay", env={"CUDA_VISIBLE_DEVICES": "zero"})
    assert result.returncode == 2
    assert "CUDA_VISIBLE_DEVICES" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_ends_continuous_output_cleanly(signum: signal.Signals) -> None:
    command = [
        sys.executable,
        "-c",
        "from keda_gpu_scaler.app.gpu_metrics.command import main; raise SystemExit(main())",
        "--source",
        "replay",
        "--format",
        "jsonl",
        "--interval",
        "0.05",
    ]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None
        first = process.stdout.readline()  # blocks until output flows: no sleeping
        assert json.loads(first)["index"] == 0
        process.send_signal(signum)
        out, err = process.communicate(timeout=10)
    assert process.returncode == 0, err
    assert err == ""
    for line in out.splitlines():
        json.loads(line)


def test_watch_into_a_pipe_writes_tables_without_escape_codes() -> None:
    result = _run("--source", "replay", "--watch", "--count", "2", "--interval", "0.1")
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout
    assert result.stdout.count("Ctrl-C to stop") == 2


def test_table_shows_absent_readings_as_a_dash() -> None:
    row = dict.fromkeys(FIELDS)
    row.update(index=0, name="GPU", status="ok", gpu_utilization=5.0, memory_total_mib=100)
    table = render_table([row])
    assert table.splitlines()[1].split() == ["0", "GPU", "5", "-", "-/100", "-", "-", "-", "ok"]


def test_docs_list_every_field() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "gpu-metrics.md").read_text()
    for field in FIELDS:
        assert f"| `{field}` |" in doc, field


def test_docs_show_the_json_document_it_prints() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "gpu-metrics.md").read_text()
    assert "array of records" not in doc
    shown = json.loads(doc.split("```json\n", 1)[1].split("```", 1)[0])
    printed = json.loads(_run("--source", "replay", "--format", "json").stdout)
    assert list(shown) == list(printed) == ["environment", "collected_at", "devices"]
    assert list(shown["environment"]) == list(printed["environment"])
    [example] = shown["devices"]
    fields = [f for f in example if f != "..."]
    assert fields == list(printed["devices"][0])[: len(fields)]


UUID = "GPU-4f60bdab-7290-5bab-ee63-d697ab1e6349"


@pytest.mark.anyio
async def test_attribution_adds_namespace_pod_and_container_in_every_format(
    tmp_path: Path,
) -> None:
    from tests.fake_kubelet import container, fake_kubelet, gpus, pod, replicas

    async with fake_kubelet(tmp_path) as kubelet:
        kubelet.set_pods(
            [
                pod(
                    "serve",
                    "vllm-a",
                    containers=[container("engine", devices=[gpus(*replicas(UUID, 0))])],
                ),
                pod(
                    "lab",
                    "notebook",
                    containers=[container("nb", devices=[gpus(*replicas(UUID, 1))])],
                ),
            ]
        )
        socket = ["--pod-resources-socket", kubelet.socket_path]
        outputs = {}
        for fmt in ("json", "jsonl", "csv", "table"):
            argv = ("--source", "replay", "--format", fmt, *socket)
            result = await anyio.to_thread.run_sync(partial(_run, *argv))
            assert result.returncode == 0, result.stderr
            outputs[fmt] = result.stdout
    (row,) = json.loads(outputs["json"])["devices"]
    assert tuple(row) == FIELDS + ATTRIBUTION_FIELDS
    # One device shared by two pods (time-slicing replicas): both named, in the kubelet's order.
    assert (row["namespace"], row["pod"], row["container"]) == (
        "lab,serve",
        "notebook,vllm-a",
        "nb,engine",
    )
    assert json.loads(outputs["jsonl"])["pod"] == "notebook,vllm-a"
    (csv_row,) = csv.DictReader(io.StringIO(outputs["csv"]))
    assert csv_row["container"] == "nb,engine"
    header, line = outputs["table"].splitlines()
    assert header.split()[-3:] == ["NAMESPACE", "POD", "CONTAINER"]
    assert line.split()[-3:] == ["lab,serve", "notebook,vllm-a", "nb,engine"]


def test_without_a_socket_there_are_no_attribution_columns(tmp_path: Path) -> None:
    result = _run("--source", "replay", "--format", "json", "--pod-resources-socket", "")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["devices"]
    assert tuple(row) == FIELDS


def test_a_socket_that_does_not_answer_shows_the_gpus_without_attribution(tmp_path: Path) -> None:
    missing = str(tmp_path / "kubelet.sock")
    result = _run("--source", "replay", "--format", "json", "--pod-resources-socket", missing)
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["devices"]
    assert tuple(row) == FIELDS


def test_bad_gpu_resource_names_are_a_usage_error() -> None:
    result = _run("--source", "replay", "--gpu-resource-names", "nvidia.com/gpu,,")
    assert result.returncode == 2
    assert "--gpu-resource-names" in result.stderr
