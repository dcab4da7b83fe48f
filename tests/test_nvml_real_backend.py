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


def test_process_structs_convert_as_nvidia_ml_py_fills_them() -> None:
    from keda_gpu_scaler.sources.nvml.backend import ProcessInfo, ProcessSample
    from keda_gpu_scaler.sources.nvml.pynvml_backend import process_info, process_sample

    legacy = pynvml.c_nvmlProcessUtilizationSample_t(4242, 1_767_225_600_123_456, 61, 7, 1, 2)
    info = pynvml.c_nvmlProcessUtilizationInfo_v1_t(1_767_225_600_123_456, 4242, 61, 7, 1, 2)
    expected = ProcessSample(4242, 1_767_225_600_123_456, 61, 7, 1, 2)
    assert process_sample(legacy) == process_sample(info) == expected
    # nvmlDeviceGetComputeRunningProcesses_v3 returns friendly objects, memory None when N/A.
    raw = pynvml.c_nvmlProcessInfo_v3_t(4242, 5 << 30, 0xFFFFFFFF, 0xFFFFFFFF)
    friendly = pynvml.nvmlStructToFriendlyObject(raw)
    assert process_info(friendly) == ProcessInfo(4242, 5 << 30, None, None)
    friendly.usedGpuMemory = None
    friendly.gpuInstanceId, friendly.computeInstanceId = 7, 0
    assert process_info(friendly) == ProcessInfo(4242, None, 7, 0)


def test_a_sizing_call_that_finds_nothing_is_no_sample_and_errors_translate() -> None:
    from keda_gpu_scaler.sources.nvml.errors import NvmlAbsent, NvmlCode
    from keda_gpu_scaler.sources.nvml.pynvml_backend import _samples

    def succeeded_empty() -> list[object]:
        # nvidia-ml-py's wrapper raises NVMLError(NVML_SUCCESS) when the first call succeeds.
        raise pynvml.NVMLError(pynvml.NVML_SUCCESS)

    def not_found() -> list[object]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    assert _samples("nvmlDeviceGetProcessUtilization", succeeded_empty) == []
    with pytest.raises(NvmlAbsent) as caught:
        _samples("nvmlDeviceGetProcessUtilization", not_found)
    assert caught.value.code == NvmlCode.NOT_FOUND
    assert isinstance(caught.value.__cause__, pynvml.NVMLError)
