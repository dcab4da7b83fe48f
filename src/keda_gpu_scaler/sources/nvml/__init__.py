"""Real GPUs through NVML: the sampler, its backend seam, the real backend and a fake.

The real backend lives in :mod:`.pynvml_backend`, the only module that imports pynvml;
:func:`open_nvml_sampler` imports it when called, so users of the fake never load pynvml.
"""

from keda_gpu_scaler.sources.nvml.backend import NvmlBackend
from keda_gpu_scaler.sources.nvml.fake_backend import FakeGpu, FakeNvlink, FakeNvml
from keda_gpu_scaler.sources.nvml.fake_mig import FakeMigInstance
from keda_gpu_scaler.sources.nvml.sampler import (
    DEFAULT_INTERVAL_S,
    DEFAULT_MIG_LAYOUT_INTERVAL_S,
    DEFAULT_PCIE_INTERVAL_S,
    DEFAULT_PROCESS_INTERVAL_S,
    CallInThread,
    NvmlSampler,
    run_in_worker_thread,
)

__all__ = [
    "CallInThread",
    "FakeGpu",
    "FakeMigInstance",
    "FakeNvlink",
    "FakeNvml",
    "NvmlBackend",
    "NvmlSampler",
    "open_nvml_sampler",
    "run_in_worker_thread",
]


def open_nvml_sampler(
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    pcie_interval_s: float | None = DEFAULT_PCIE_INTERVAL_S,
    process_interval_s: float = DEFAULT_PROCESS_INTERVAL_S,
    host_proc: str = "",
    mig_layout_interval_s: float = DEFAULT_MIG_LAYOUT_INTERVAL_S,
) -> NvmlSampler:
    """Initialise NVML and return a sampler over every GPU of this node; with ``host_proc``
    (the host's ``/proc``) its per-process readings map each process to its pod; every
    ``mig_layout_interval_s`` it reads each GPU's MIG mode and instances again.

    Raises :class:`~keda_gpu_scaler.domain.errors.SourceUnavailable` with a one-line
    reason (for example ``NVML library libnvidia-ml.so.1 not found: ...``). NVML stays
    initialised for the life of the process; restarts of the sampler reuse it.
    """
    from keda_gpu_scaler.sources.nvml.pynvml_backend import open_nvml_backend
    from keda_gpu_scaler.sources.procfs import HostProc

    backend = open_nvml_backend()
    return NvmlSampler(
        backend,
        interval_s=interval_s,
        pcie_interval_s=pcie_interval_s,
        process_interval_s=process_interval_s,
        process_owners=HostProc(host_proc) if host_proc else None,
        mig_layout_interval_s=mig_layout_interval_s,
    )
