"""The real NVML backend over nvidia-ml-py; the only module that imports ``pynvml``.

Every call goes through :func:`_call`, which translates ``pynvml.NVMLError`` into
:mod:`.errors` (``raise ... from``), so pynvml never leaks past this module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import pynvml

from keda_gpu_scaler.domain.errors import SourceUnavailable
from keda_gpu_scaler.sources.nvml.backend import (
    FieldRequest,
    FieldValue,
    GpmMetricValue,
    GpmSample,
    GpuInstanceInfo,
    Handle,
    MemoryV1,
    MemoryV2,
    PcieDirection,
    ProcessInfo,
    ProcessSample,
    Utilization,
)
from keda_gpu_scaler.sources.nvml.errors import NvmlCode, NvmlError, nvml_error

NVML_LIBRARY = "libnvidia-ml.so.1"

_NOT_AVAILABLE_UINT = 0xFFFF_FFFF
"""``NVML_VALUE_NOT_AVAILABLE`` in a ``c_uint`` field: a process's instance ids off MIG."""

# nvmlValueType_t -> the member of the nvmlValue_t union that holds the value.
_VALUE_MEMBER = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _call(call: str, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise nvml_error(int(exc.value), call, str(exc)) from exc


def _samples(call: str, fn: Callable[..., Any], *args: Any) -> list[ProcessSample]:
    """A process utilization call's samples. nvidia-ml-py raises ``NVMLError(NVML_SUCCESS)``
    when the driver's first, sizing call succeeds (nothing to return): that is no sample."""
    try:
        raw = fn(*args)
    except pynvml.NVMLError as exc:
        if int(exc.value) == pynvml.NVML_SUCCESS:
            return []
        raise nvml_error(int(exc.value), call, str(exc)) from exc
    return [process_sample(s) for s in raw]


def process_sample(raw: Any) -> ProcessSample:
    """``c_nvmlProcessUtilizationSample_t`` or ``c_nvmlProcessUtilizationInfo_v1_t``."""
    return ProcessSample(
        pid=int(raw.pid),
        timestamp_us=int(raw.timeStamp),
        sm=int(raw.smUtil),
        memory=int(raw.memUtil),
        encoder=int(raw.encUtil),
        decoder=int(raw.decUtil),
    )


def process_info(raw: Any) -> ProcessInfo:
    """One ``nvmlProcessInfo_t`` as nvidia-ml-py returns it (``usedGpuMemory`` None where
    NVML says not available)."""
    used = raw.usedGpuMemory
    return ProcessInfo(
        pid=int(raw.pid),
        used_memory=None if used is None else int(used),
        gpu_instance_id=_instance_id(raw.gpuInstanceId),
        compute_instance_id=_instance_id(raw.computeInstanceId),
    )


def _instance_id(value: Any) -> int | None:
    return None if value is None or int(value) == _NOT_AVAILABLE_UINT else int(value)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def open_nvml_backend() -> PynvmlBackend:
    """Initialise NVML (about 11 ms; call it off the event loop) and return the backend.

    Raises :class:`SourceUnavailable` with a one-line reason when NVML cannot start here.
    """
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise SourceUnavailable(_init_failure(int(exc.value), str(exc))) from exc
    return PynvmlBackend()


def _init_failure(code: int, text: str) -> str:
    if code == NvmlCode.LIBRARY_NOT_FOUND:
        return (
            f"NVML library {NVML_LIBRARY} not found: {text}; install the NVIDIA driver, or run "
            "the container with the NVIDIA container runtime (runtimeClassName: nvidia)"
        )
    if code == NvmlCode.DRIVER_NOT_LOADED:
        return f"NVML cannot start: {text}; is the NVIDIA kernel driver loaded on this node?"
    return f"NVML cannot start: {text} (NVML return {code})"


class PynvmlBackend:
    """:class:`~keda_gpu_scaler.sources.nvml.backend.NvmlBackend` over nvidia-ml-py."""

    def __enter__(self) -> PynvmlBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        # Shutting down: nothing useful can be done about a failure here.
        with contextlib.suppress(NvmlError):
            _call("nvmlShutdown", pynvml.nvmlShutdown)

    def device_count(self) -> int:
        return int(_call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount))

    def device_handle(self, index: int) -> Handle:
        return _call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index)

    def uuid(self, handle: Handle) -> str:
        return _text(_call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle))

    def name(self, handle: Handle) -> str:
        return _text(_call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle))

    def utilization(self, handle: Handle) -> Utilization:
        u = _call("nvmlDeviceGetUtilizationRates", pynvml.nvmlDeviceGetUtilizationRates, handle)
        return Utilization(gpu=int(u.gpu), memory=int(u.memory))

    def memory_v1(self, handle: Handle) -> MemoryV1:
        m = _call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, handle)
        return MemoryV1(total=int(m.total), free=int(m.free), used=int(m.used))

    def memory_v2(self, handle: Handle) -> MemoryV2:
        m = _call(
            "nvmlDeviceGetMemoryInfo_v2",
            pynvml.nvmlDeviceGetMemoryInfo,
            handle,
            pynvml.nvmlMemory_v2,
        )
        return MemoryV2(
            total=int(m.total), reserved=int(m.reserved), free=int(m.free), used=int(m.used)
        )

    def temperature_c(self, handle: Handle) -> int:
        fn = pynvml.nvmlDeviceGetTemperature
        return int(_call("nvmlDeviceGetTemperature", fn, handle, pynvml.NVML_TEMPERATURE_GPU))

    def power_usage_mw(self, handle: Handle) -> int:
        return int(_call("nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage, handle))

    def power_limit_mw(self, handle: Handle) -> int:
        fn = pynvml.nvmlDeviceGetEnforcedPowerLimit
        return int(_call("nvmlDeviceGetEnforcedPowerLimit", fn, handle))

    def sm_clock_mhz(self, handle: Handle) -> int:
        fn = pynvml.nvmlDeviceGetClockInfo
        return int(_call("nvmlDeviceGetClockInfo", fn, handle, pynvml.NVML_CLOCK_SM))

    def fan_speed_percent(self, handle: Handle) -> int:
        return int(_call("nvmlDeviceGetFanSpeed", pynvml.nvmlDeviceGetFanSpeed, handle))

    def pcie_throughput_kbs(self, handle: Handle, direction: PcieDirection) -> int:
        fn = pynvml.nvmlDeviceGetPcieThroughput
        return int(_call("nvmlDeviceGetPcieThroughput", fn, handle, int(direction)))

    def field_values(self, handle: Handle, fields: Sequence[FieldRequest]) -> list[FieldValue]:
        fn = pynvml.nvmlDeviceGetFieldValues
        # nvidia-ml-py sets scopeId only from a (fieldId, scopeId) tuple; a bare id leaves
        # it 0, which for NVLink throughput is link 0 alone.
        requests = [(f.field_id, f.scope_id) for f in fields]
        raw = _call("nvmlDeviceGetFieldValues", fn, handle, requests)
        return [_field_value(v) for v in raw]

    def mig_mode(self, handle: Handle) -> tuple[int, int]:
        current, pending = _call("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, handle)
        return int(current), int(pending)

    def max_mig_device_count(self, handle: Handle) -> int:
        fn = pynvml.nvmlDeviceGetMaxMigDeviceCount
        return int(_call("nvmlDeviceGetMaxMigDeviceCount", fn, handle))

    def mig_device_handle(self, handle: Handle, index: int) -> Handle:
        fn = pynvml.nvmlDeviceGetMigDeviceHandleByIndex
        return _call("nvmlDeviceGetMigDeviceHandleByIndex", fn, handle, index)

    def gpu_instance_id(self, mig_handle: Handle) -> int:
        fn = pynvml.nvmlDeviceGetGpuInstanceId
        return int(_call("nvmlDeviceGetGpuInstanceId", fn, mig_handle))

    def compute_instance_id(self, mig_handle: Handle) -> int:
        fn = pynvml.nvmlDeviceGetComputeInstanceId
        return int(_call("nvmlDeviceGetComputeInstanceId", fn, mig_handle))

    def gpu_instance_info(self, handle: Handle, gpu_instance_id: int) -> GpuInstanceInfo:
        fn = pynvml.nvmlDeviceGetGpuInstanceById
        instance = _call("nvmlDeviceGetGpuInstanceById", fn, handle, gpu_instance_id)
        info = _call("nvmlGpuInstanceGetInfo", pynvml.nvmlGpuInstanceGetInfo, instance)
        return GpuInstanceInfo(
            profile_id=int(info.profileId),
            placement_start=int(info.placement.start),
            placement_size=int(info.placement.size),
        )

    def compute_processes_v3(self, handle: Handle) -> list[ProcessInfo]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v3", handle)

    def compute_processes_v2(self, handle: Handle) -> list[ProcessInfo]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", handle)

    def mps_compute_processes_v3(self, handle: Handle) -> list[ProcessInfo]:
        return self._processes("nvmlDeviceGetMPSComputeRunningProcesses_v3", handle)

    def mps_compute_processes_v2(self, handle: Handle) -> list[ProcessInfo]:
        return self._processes("nvmlDeviceGetMPSComputeRunningProcesses_v2", handle)

    @staticmethod
    def _processes(call: str, handle: Handle) -> list[ProcessInfo]:
        return [process_info(p) for p in _call(call, getattr(pynvml, call), handle)]

    def processes_utilization_info(self, handle: Handle, last_seen_us: int) -> list[ProcessSample]:
        fn = pynvml.nvmlDeviceGetProcessesUtilizationInfo
        return _samples("nvmlDeviceGetProcessesUtilizationInfo", fn, handle, last_seen_us)

    def process_utilization(self, handle: Handle, last_seen_us: int) -> list[ProcessSample]:
        fn = pynvml.nvmlDeviceGetProcessUtilization
        return _samples("nvmlDeviceGetProcessUtilization", fn, handle, last_seen_us)

    def gpm_supported(self, handle: Handle) -> bool:
        fn = pynvml.nvmlGpmQueryDeviceSupport
        return bool(_call("nvmlGpmQueryDeviceSupport", fn, handle).isSupportedDevice)

    def gpm_sample_alloc(self) -> GpmSample:
        return _call("nvmlGpmSampleAlloc", pynvml.nvmlGpmSampleAlloc)

    def gpm_sample_free(self, sample: GpmSample) -> None:
        _call("nvmlGpmSampleFree", pynvml.nvmlGpmSampleFree, sample)

    def gpm_sample_get(self, handle: Handle, sample: GpmSample) -> None:
        _call("nvmlGpmSampleGet", pynvml.nvmlGpmSampleGet, handle, sample)

    def gpm_mig_sample_get(self, handle: Handle, gpu_instance_id: int, sample: GpmSample) -> None:
        fn = pynvml.nvmlGpmMigSampleGet
        _call("nvmlGpmMigSampleGet", fn, handle, gpu_instance_id, sample)

    def gpm_metrics(
        self, first: GpmSample, second: GpmSample, metric_ids: Sequence[int]
    ) -> list[GpmMetricValue]:
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metric_ids)
        request.sample1 = first
        request.sample2 = second
        for i, metric_id in enumerate(metric_ids):
            request.metrics[i].metricId = metric_id
        _call("nvmlGpmMetricsGet", pynvml.nvmlGpmMetricsGet, request)
        return [
            GpmMetricValue(int(m.metricId), int(m.nvmlReturn), float(m.value))
            for m in request.metrics[: len(metric_ids)]
        ]


def _field_value(raw: Any) -> FieldValue:
    value_type = int(raw.valueType)
    member = _VALUE_MEMBER[value_type] if 0 <= value_type < len(_VALUE_MEMBER) else "ullVal"
    return FieldValue(
        field_id=int(raw.fieldId),
        return_code=int(raw.nvmlReturn),
        value=int(getattr(raw.value, member)),
        timestamp_us=int(raw.timestamp),
        scope_id=int(raw.scopeId),
    )
