"""The real backend where there is no GPU, and the rule that only it imports pynvml."""

from __future__ import annotations

import ast
from pathlib import Path

import pynvml
import pytest

from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.sources.nvml.pynvml_backend import _init_failure, open_nvml_backend

SRC = Path(__file__).resolve().parents[1] / "src" / "keda_gpu_scaler"


def _nvml_loads() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_nvml_loads(), reason="this host has NVML; the failure path needs none")
def test_missing_library_is_a_one_line_startup_error_naming_it() -> None:
    with pytest.raises(SourceUnavailable) as caught:
        open_nvml_backend()
    message = str(caught.value)
    assert message.startswith("NVML library libnvidia-ml.so.1 not found: ")
    assert "\n" not in message
    assert isinstance(caught.value.__cause__, pynvml.NVMLError)


def test_other_startup_failures_say_what_to_check() -> None:
    assert "kernel driver" in _init_failure(9, "Driver Not Loaded")
    assert _init_failure(18, "RM has detected an NVML/RM version mismatch.").endswith(
        "(NVML return 18)"
    )


def test_only_the_real_backend_imports_pynvml() -> None:
    importers = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] == "pynvml" for n in names):
                importers.add(path.relative_to(SRC).as_posix())
    assert importers == {"sources/nvml/pynvml_backend.py"}
