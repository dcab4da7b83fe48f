"""The committed generated code is exactly what the compiler makes from protos/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "src" / "keda_gpu_scaler" / "serving" / "_proto"


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    out = tmp_path / "proto"
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "generate_proto.sh"), str(out)],
        check=True,
        env=env,
        capture_output=True,
    )
    assert _files(out) == _files(GENERATED), "run `make proto` and commit the result"


def test_contract_keeps_keda_package_and_all_five_rpcs() -> None:
    proto = (ROOT / "protos" / "externalscaler.proto").read_text()
    assert "package externalscaler;" in proto
    for rpc in ("IsActive", "StreamIsActive", "GetMetricSpec", "GetMetrics", "StreamMetricSpec"):
        assert f"rpc {rpc}(" in proto
