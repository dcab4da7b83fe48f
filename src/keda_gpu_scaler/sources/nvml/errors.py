"""NVML errors translated where they enter, by what the sampler should do about them.

    NvmlError                 carries the NVML return ``code`` and the ``call`` that failed
    ├── NvmlAbsent            this reading does not exist here (NotSupported, NotFound, ...):
    │                         the metric is absent, never 0; other readings go on
    ├── NvmlDeviceLost        the device fell off the bus or answers nonsense (GpuIsLost,
    │                         Unknown, any code not in the table): mark it lost, retry later
    └── NvmlLibraryError      NVML itself is unusable (library missing, driver not loaded,
                              version mismatch): nothing on this node can be read

The table holds NVML's numeric return codes, so this module needs no ``pynvml``: both the
real backend and the fake raise through :func:`nvml_error`.
"""

from __future__ import annotations

import enum

NVML_SUCCESS = 0


class NvmlCode(enum.IntEnum):
    """NVML return codes this product distinguishes (``nvmlReturn_t``)."""

    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    NOT_FOUND = 6
    INSUFFICIENT_SIZE = 7
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    IRQ_ISSUE = 11
    LIBRARY_NOT_FOUND = 12
    FUNCTION_NOT_FOUND = 13
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    LIB_RM_VERSION_MISMATCH = 18
    IN_USE = 19
    NO_DATA = 21
    INSUFFICIENT_RESOURCES = 23
    ARGUMENT_VERSION_MISMATCH = 25
    DEPRECATED = 26
    NOT_READY = 27
    GPU_NOT_FOUND = 28
    UNKNOWN = 999


class NvmlError(Exception):
    """An NVML call returned ``code``."""

    def __init__(self, code: int, call: str, message: str | None = None) -> None:
        self.code = code
        self.call = call
        self.message = message or code_name(code)
        super().__init__(f"{call}: {self.message} (NVML return {code})")


class NvmlAbsent(NvmlError):
    """No such reading on this device: report it as absent."""


class NvmlDeviceLost(NvmlError):
    """The device cannot be trusted any more: mark it lost and retry with backoff."""


class NvmlLibraryError(NvmlError):
    """NVML as a whole does not work."""


# Why each code lands where it does: a reading that this device or driver cannot give
# (including "no data yet" and a timeout) is absent for this cycle; codes that say the GPU
# itself is gone, and codes nobody expects, mark the device lost, because a wrong number
# is worse than none (the Go project read 0 in both cases, defect D2).
_KIND: dict[int, type[NvmlError]] = {
    NvmlCode.INVALID_ARGUMENT: NvmlAbsent,
    NvmlCode.NOT_SUPPORTED: NvmlAbsent,
    NvmlCode.NO_PERMISSION: NvmlAbsent,
    NvmlCode.NOT_FOUND: NvmlAbsent,
    NvmlCode.INSUFFICIENT_SIZE: NvmlAbsent,
    NvmlCode.TIMEOUT: NvmlAbsent,
    NvmlCode.FUNCTION_NOT_FOUND: NvmlAbsent,
    NvmlCode.NO_DATA: NvmlAbsent,
    NvmlCode.ARGUMENT_VERSION_MISMATCH: NvmlAbsent,
    NvmlCode.DEPRECATED: NvmlAbsent,
    NvmlCode.NOT_READY: NvmlAbsent,
    NvmlCode.GPU_IS_LOST: NvmlDeviceLost,
    NvmlCode.RESET_REQUIRED: NvmlDeviceLost,
    NvmlCode.GPU_NOT_FOUND: NvmlDeviceLost,
    NvmlCode.IRQ_ISSUE: NvmlDeviceLost,
    NvmlCode.UNKNOWN: NvmlDeviceLost,
    NvmlCode.UNINITIALIZED: NvmlLibraryError,
    NvmlCode.DRIVER_NOT_LOADED: NvmlLibraryError,
    NvmlCode.LIBRARY_NOT_FOUND: NvmlLibraryError,
    NvmlCode.LIB_RM_VERSION_MISMATCH: NvmlLibraryError,
}


# nvmlErrorString() texts, so a fake's errors read like the real ones in logs and tests.
_TEXT: dict[int, str] = {
    NvmlCode.UNINITIALIZED: "Uninitialized",
    NvmlCode.INVALID_ARGUMENT: "Invalid Argument",
    NvmlCode.NOT_SUPPORTED: "Not Supported",
    NvmlCode.NO_PERMISSION: "Insufficient Permissions",
    NvmlCode.NOT_FOUND: "Not Found",
    NvmlCode.DRIVER_NOT_LOADED: "Driver Not Loaded",
    NvmlCode.TIMEOUT: "Timeout",
    NvmlCode.LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NvmlCode.FUNCTION_NOT_FOUND: "Function Not Found",
    NvmlCode.GPU_IS_LOST: "GPU is lost",
    NvmlCode.RESET_REQUIRED: "GPU requires restart",
    NvmlCode.NO_DATA: "No data",
    NvmlCode.IN_USE: "In use by another client",
    NvmlCode.INSUFFICIENT_RESOURCES: "Insufficient Resources",
    NvmlCode.UNKNOWN: "Unknown Error",
}


def code_name(code: int) -> str:
    if code in _TEXT:
        return _TEXT[code]
    try:
        return NvmlCode(code).name.replace("_", " ").capitalize()
    except ValueError:
        return f"NVML error {code}"


def nvml_error(code: int, call: str, message: str | None = None) -> NvmlError:
    """The exception for NVML return ``code`` from ``call``; unknown codes mean lost."""
    kind = _KIND.get(code, NvmlDeviceLost)
    return kind(code, call, message)
