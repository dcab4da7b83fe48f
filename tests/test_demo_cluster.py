"""``demo --cluster``: three node agents on replays and a cluster scaler, run in-process.

The demo really listens (127.0.0.1, free ports) and polls for a few seconds of real time;
its tables are read back from stdout.
"""

from __future__ import annotations

import re
from statistics import mean

import pytest

from keda_gpu_scaler.app.cli import build_parser
from keda_gpu_scaler.app.scaler.demo_cluster import gpus_used, run_cluster_demo

ROW = re.compile(
    r"^(?P<selector>app=\w+)\s+(?P<agg>max|avg)\s+(?P<value>\d+\.\d) %\s+80 %\s+"
    r"(?P<activity>ACTIVE|inactive)\s+(?P<gpus>.+)$"
)
PART = re.compile(r"(node-\d) GPU 0 \((\S+)\)=([\d.e+-]+)")


def _tables(out: str) -> list[list[re.Match[str]]]:
    tables: list[list[re.Match[str]]] = []
    for line in out.splitlines():
        if line.startswith("t="):
            tables.append([])
        elif tables and (row := ROW.match(line)):
            tables[-1].append(row)
    return tables


@pytest.mark.anyio
async def test_two_workloads_each_over_its_own_gpus_on_several_nodes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    await run_cluster_demo(3.0, 1.0)
    out = capsys.readouterr().out
    tables = _tables(out)
    assert len(tables) >= 2, out
    for table in tables:
        rows = {(r["selector"], r["agg"]): r for r in table}
        assert set(rows) == {
            ("app=vllm", "max"),
            ("app=vllm", "avg"),
            ("app=train", "max"),
            ("app=train", "avg"),
        }, out
        for (selector, agg), row in rows.items():
            parts = PART.findall(row["gpus"])
            pods = {(node, pod) for node, pod, _ in parts}
            if selector == "app=vllm":
                assert pods == {("node-1", "vllm-0"), ("node-3", "vllm-1")}, row.string
            else:
                assert pods == {("node-2", "train-0")}, row.string
            values = [float(v) for _, _, v in parts]
            expected = max(values) if agg == "max" else mean(values)
            assert float(row["value"]) == pytest.approx(expected, abs=0.06), row.string
            assert (row["activity"] == "ACTIVE") == (float(row["value"]) > 5), row.string


def test_gpus_used_is_the_list_of_parts_of_an_explanation() -> None:
    why = (
        "gpu_utilization max over the GPUs of pods app=vllm in ml of "
        "[node-1 GPU 0 (vllm-0)=0, node-3 GPU 0 (vllm-1)=62] = 62; 62 > activation 5: active"
    )
    assert gpus_used(why) == "node-1 GPU 0 (vllm-0)=0, node-3 GPU 0 (vllm-1)=62"
    assert gpus_used("no pod app=x in ml holds a GPU") == "-"


def test_the_demo_command_takes_cluster() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo", "--cluster", "--duration", "3"]).cluster is True
    assert parser.parse_args(["demo"]).cluster is False
