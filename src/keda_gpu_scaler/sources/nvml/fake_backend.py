"""FakeNvml: a scriptable NVML backend that behaves like the H200 that was measured.

What it reproduces from ``tests/fixtures/nvml-h200`` (a real capture): NVLink throughput
fields that come back from a successful call with a per-field NotSupported and a value of
0 (the link count field too); GPM DRAM bandwidth that is sometimes NaN; memory info v1
``used`` = v2 ``used`` + ``reserved``; ``nvmlDeviceGetMigDeviceHandleByIndex`` raising
NotFound with MIG disabled; fan speed NotSupported. NVLink throughput is per link, as in
nvml.h: a request's scope id names the link (0 is link 0, not the GPU) and
``SCOPE_ALL_LINKS`` asks for the sum over all links, which an older driver may refuse per
field. On top of that: MIG layouts, several GPUs, lost GPUs, injected error codes, slow
calls (the delay goes through an injectable ``sleep`` so tests can advance a fake clock
instead of sleeping), and the processes on each GPU with the driver's per-process samples
(:mod:`.fake_processes`), and MIG layouts changed at runtime as NVML changes them
(:mod:`.fake_mig`: instances created and destroyed, their handles invalid afterwards, MIG
mode current and pending).
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from keda_gpu_scaler.sources.nvml.backend import (
    FI_NVLINK_LINK_COUNT,
    FI_NVLINK_THROUGHPUT_DATA_RX,
    FI_NVLINK_THROUGHPUT_DATA_TX,
    SCOPE_ALL_LINKS,
    FieldRequest,
    FieldValue,
    GpmMetric,
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
from keda_gpu_scaler.sources.nvml.errors import NvmlCode, nvml_error
from keda_gpu_scaler.sources.nvml.fake_mig import (
    FakeMigInstance,
    activate_mig_mode,
    create_compute_instance,
    create_gpu_instance,
    destroy_compute_instance,
    destroy_gpu_instance,
    gpu_instance,
    holds,
)
from keda_gpu_scaler.sources.nvml.fake_processes import (
    EPOCH_US,
    FakeMps,
    FakeProcess,
    ProcessDriver,
    infos,
    mps_server_load,
)

MIB = 1 << 20
H200_UUID = "GPU-4f60bdab-7290-5bab-ee63-d697ab1e6349"
H200_TOTAL = 150_754_820_096
H200_RESERVED = 644_939_776
H200_IDLE_GPM: dict[int, float] = {
    GpmMetric.SM_UTIL: 0.0,
    GpmMetric.SM_OCCUPANCY: 0.0,
    GpmMetric.ANY_TENSOR_UTIL: 0.0,
    GpmMetric.DRAM_BW_UTIL: math.nan,  # as in the first frame of the capture
}


@dataclass
class FakeNvlink:
    """One NVLink's cumulative KiB counters; None: that field answers NotSupported."""

    tx_kib: int | None = 0
    rx_kib: int | None = 0


@dataclass
class FakeGpu:
    """One physical GPU; ``None`` readings raise NotSupported, like the H200's fan."""

    uuid: str
    name: str = "NVIDIA H200"
    utilization: Utilization | None = field(default_factory=lambda: Utilization(0, 0))
    memory_total: int = H200_TOTAL
    memory_used: int = 0
    """Memory info v2 ``used``; v1 reports ``memory_used + memory_reserved``."""
    memory_reserved: int = H200_RESERVED
    memory_v2_supported: bool = True
    temperature_c: int | None = 36
    power_mw: int | None = 123_590
    power_limit_mw: int | None = 700_000
    sm_clock_mhz: int | None = 1980
    fan_percent: int | None = None
    pcie_tx_kbs: int | None = 1315
    pcie_rx_kbs: int | None = 423
    nvlinks: list[FakeNvlink] = field(default_factory=list)
    """Empty: no NVLink (the H200 captured), every NVLink field answers NotSupported."""
    nvlink_all_links_code: int = 0
    """Per-field return code for the ``SCOPE_ALL_LINKS`` scope; an older driver refuses it."""
    gpm_supported: bool = True
    gpm: dict[int, float] = field(default_factory=lambda: dict(H200_IDLE_GPM))
    mig_supported: bool = True
    """False: a GPU without MIG (before Ampere), whose MIG calls answer NotSupported."""
    mig_enabled: bool = False
    """The current MIG mode."""
    mig_pending: bool | None = None
    """The pending MIG mode, until activation (:meth:`FakeNvml.activate_mig_mode`); None:
    the current one."""
    mig_slots: int = 0
    instances: list[FakeMigInstance] = field(default_factory=list)
    """The MIG devices (compute instances), in NVML's enumeration order."""
    bare_gpu_instances: dict[int, GpuInstanceInfo] = field(default_factory=dict)
    """GPU instances without a compute instance, by id: not MIG devices."""
    lost: bool = False
    processes: list[FakeProcess] = field(default_factory=list)
    """Processes with a context on the GPU (with ``mps``: the MPS clients)."""
    mps: FakeMps | None = None
    process_call_version: int = 3
    """The newest ``nvmlDeviceGetComputeRunningProcesses`` (and MPS) call the driver has."""
    process_utilization_call: str = "info"
    """``info``: ``nvmlDeviceGetProcessesUtilizationInfo`` and the older call; ``legacy``:
    the older ``nvmlDeviceGetProcessUtilization`` only; ``none``: neither (NotSupported)."""
    driver: ProcessDriver = field(default_factory=ProcessDriver)


def h200_gpu(index: int = 0) -> FakeGpu:
    """An idle H200 as captured; index 0 keeps the real UUID."""
    return FakeGpu(uuid=H200_UUID if index == 0 else f"GPU-fake-h200-{index:04d}")


def mig_instances(parent: int, count: int, *, first_gi: int = 7) -> list[FakeMigInstance]:
    """``count`` 1g instances with GPU instance ids from ``first_gi``, as a 7-way split:
    instance ``i`` on memory slice ``i``."""
    return [
        FakeMigInstance(
            uuid=f"MIG-fake-{parent}-{first_gi + i}",
            gpu_instance_id=first_gi + i,
            placement_start=i,
        )
        for i in range(count)
    ]


def enable_mig(gpu: FakeGpu, instances: Sequence[FakeMigInstance], *, slots: int = 7) -> None:
    gpu.mig_enabled = True
    gpu.mig_slots = slots
    gpu.instances = list(instances)


@dataclass(frozen=True, slots=True)
class _Handle:
    gpu: int
    instance: FakeMigInstance | None = None


@dataclass
class _Sample:
    key: tuple[int, int | None] | None = None
    values: dict[int, float] = field(default_factory=dict)
    seq: int = 0
    freed: bool = False


@dataclass
class _Fault:
    call: str
    code: int
    gpu: int | None
    remaining: int | None


class FakeNvml:
    """A backend over :class:`FakeGpu` objects; tests mutate the GPUs between cycles."""

    def __init__(
        self,
        gpus: Sequence[FakeGpu],
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.gpus = list(gpus)
        self.calls: collections.Counter[str] = collections.Counter()
        self.closed = False
        self.live_gpm_samples = 0
        self._clock = clock
        self._sleep = sleep
        self._latency: dict[str, float] = {}
        self._faults: list[_Fault] = []
        self._seq = 0
        self._made = 0
        self.stale_handle_code: int = NvmlCode.INVALID_ARGUMENT
        """What a call on the handle of a MIG device that no longer exists answers."""

    @classmethod
    def h200(
        cls,
        count: int = 1,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> FakeNvml:
        """``count`` H200s at idle, as captured (GPU 0 keeps the real UUID)."""
        gpus = [h200_gpu(i) for i in range(count)]
        return cls(gpus, clock=clock, sleep=sleep)

    # scripting -----------------------------------------------------------------------

    def lose(self, index: int) -> None:
        """GPU ``index`` falls off the bus: every call on it raises GpuIsLost."""
        self.gpus[index].lost = True

    def restore(self, index: int) -> None:
        self.gpus[index].lost = False

    def fail(
        self, call: str, code: int, *, gpu: int | None = None, times: int | None = None
    ) -> None:
        """Make ``call`` (a backend method name) return NVML ``code``, ``times`` times."""
        self._faults.append(_Fault(call, code, gpu, times))

    def exit_process(self, index: int, pid: int) -> None:
        """Process ``pid`` on GPU ``index`` exits now: the driver samples it a last time (the
        sample outlives it), and it leaves the GPU's list."""
        gpu = self.gpus[index]
        gone = [p for p in gpu.processes if p.pid == pid]
        gpu.driver.take(gone, self._now_us())
        gpu.processes = [p for p in gpu.processes if p.pid != pid]

    def create_gpu_instance(
        self,
        index: int,
        *,
        start: int,
        size: int = 1,
        profile_id: int = 19,
        gpu_instance_id: int | None = None,
    ) -> int:
        """A GPU instance on memory slices ``start .. start + size - 1`` of GPU ``index``
        (``nvmlDeviceCreateGpuInstanceWithPlacement``); its id."""
        return create_gpu_instance(self.gpus[index], profile_id, start, size, gpu_instance_id)

    def create_compute_instance(
        self,
        index: int,
        gpu_instance_id: int,
        *,
        uuid: str | None = None,
        name: str = "NVIDIA H200 MIG 1g.18gb",
    ) -> FakeMigInstance:
        """A compute instance in GPU instance ``gpu_instance_id``: a new MIG device, with a
        UUID of its own (``nvmlGpuInstanceCreateComputeInstance``)."""
        self._made += 1
        uuid = uuid or f"MIG-fake-{index}-{gpu_instance_id}-made-{self._made}"
        return create_compute_instance(self.gpus[index], gpu_instance_id, uuid=uuid, name=name)

    def create_mig_device(
        self,
        index: int,
        *,
        start: int,
        size: int = 1,
        profile_id: int = 19,
        uuid: str | None = None,
    ) -> FakeMigInstance:
        """A GPU instance and one compute instance in it, as ``nvidia-smi mig -cgi .. -C``
        and NVIDIA's DRA driver make a MIG device."""
        gpu_instance_id = self.create_gpu_instance(
            index, start=start, size=size, profile_id=profile_id
        )
        return self.create_compute_instance(index, gpu_instance_id, uuid=uuid)

    def destroy_compute_instance(
        self, index: int, gpu_instance_id: int, compute_instance_id: int = 0
    ) -> None:
        """``nvmlComputeInstanceDestroy``: its MIG device's handles are invalid from now."""
        destroy_compute_instance(self.gpus[index], gpu_instance_id, compute_instance_id)

    def destroy_gpu_instance(self, index: int, gpu_instance_id: int) -> None:
        """``nvmlGpuInstanceDestroy``: InUse while it has a compute instance."""
        destroy_gpu_instance(self.gpus[index], gpu_instance_id)

    def destroy_mig_device(self, index: int, uuid: str) -> None:
        """The MIG device ``uuid``'s compute instance, then its GPU instance if that was
        its last one (``nvidia-smi mig -dci``, then ``-dgi``)."""
        gpu = self.gpus[index]
        (instance,) = [i for i in gpu.instances if i.uuid == uuid]
        gi = instance.gpu_instance_id
        destroy_compute_instance(gpu, gi, instance.compute_instance_id)
        if gi in gpu.bare_gpu_instances:
            destroy_gpu_instance(gpu, gi)

    def set_mig_mode(self, index: int, enabled: bool, *, activate: bool = True) -> None:
        """``nvmlDeviceSetMigMode``: the pending mode; ``activate`` applies it at once, as
        the driver does on an idle GPU (else :meth:`activate_mig_mode`, a GPU reset)."""
        gpu = self.gpus[index]
        if not gpu.mig_supported:
            raise nvml_error(NvmlCode.NOT_SUPPORTED, "nvmlDeviceSetMigMode")
        gpu.mig_pending = enabled
        if activate:
            self.activate_mig_mode(index)

    def activate_mig_mode(self, index: int) -> None:
        """The pending MIG mode of GPU ``index`` takes effect (a GPU reset): every GPU and
        compute instance on it is destroyed."""
        activate_mig_mode(self.gpus[index])

    def _now_us(self) -> int:
        return EPOCH_US + round(self._clock() * 1e6)

    def set_latency(self, call: str, seconds: float) -> None:
        """Make ``call`` take ``seconds`` (through the injected ``sleep``)."""
        self._latency[call] = seconds

    # plumbing ------------------------------------------------------------------------

    def _enter(self, call: str, handle: Handle | None = None) -> _Handle | None:
        self.calls[call] += 1
        if (delay := self._latency.get(call)) is not None:
            self._sleep(delay)
        h = None
        if handle is not None:
            if not isinstance(handle, _Handle):
                raise nvml_error(NvmlCode.INVALID_ARGUMENT, call)
            h = handle
        self._raise_injected(call, None if h is None else h.gpu)
        if h is not None and self.gpus[h.gpu].lost:
            raise nvml_error(NvmlCode.GPU_IS_LOST, call)
        if h is not None and h.instance is not None and not holds(self.gpus[h.gpu], h.instance):
            raise nvml_error(self.stale_handle_code, call)  # destroyed since
        return h

    def _raise_injected(self, call: str, gpu: int | None) -> None:
        for fault in self._faults:
            if fault.call == call and fault.gpu in (None, gpu):
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                raise nvml_error(fault.code, call)

    def _gpu(self, call: str, handle: Handle, *, mig_ok: bool = False) -> FakeGpu:
        h = self._enter(call, handle)
        assert h is not None
        if h.instance is not None and not mig_ok:
            # Whole-GPU readings do not exist on a MIG device handle.
            raise nvml_error(NvmlCode.NOT_SUPPORTED, call)
        return self.gpus[h.gpu]

    @staticmethod
    def _value(call: str, value: int | None) -> int:
        if value is None:
            raise nvml_error(NvmlCode.NOT_SUPPORTED, call)
        return value

    # NvmlBackend ---------------------------------------------------------------------

    def close(self) -> None:
        self.calls["close"] += 1
        self.closed = True

    def device_count(self) -> int:
        self._enter("device_count")
        return len(self.gpus)

    def device_handle(self, index: int) -> Handle:
        self._enter("device_handle")
        if not 0 <= index < len(self.gpus):
            raise nvml_error(NvmlCode.INVALID_ARGUMENT, "device_handle")
        if self.gpus[index].lost:
            raise nvml_error(NvmlCode.GPU_IS_LOST, "device_handle")
        return _Handle(index)

    def uuid(self, handle: Handle) -> str:
        h = self._enter("uuid", handle)
        assert h is not None
        return h.instance.uuid if h.instance else self.gpus[h.gpu].uuid

    def name(self, handle: Handle) -> str:
        h = self._enter("name", handle)
        assert h is not None
        return h.instance.name if h.instance else self.gpus[h.gpu].name

    def utilization(self, handle: Handle) -> Utilization:
        gpu = self._gpu("utilization", handle)
        if gpu.mig_enabled or gpu.utilization is None:
            # A100/H100 in MIG mode have no whole-GPU utilization either.
            raise nvml_error(NvmlCode.NOT_SUPPORTED, "utilization")
        return gpu.utilization

    def memory_v1(self, handle: Handle) -> MemoryV1:
        total, used, reserved = self._memory("memory_v1", handle)
        return MemoryV1(total=total, free=total - used - reserved, used=used + reserved)

    def memory_v2(self, handle: Handle) -> MemoryV2:
        total, used, reserved = self._memory("memory_v2", handle)
        return MemoryV2(total=total, reserved=reserved, free=total - used - reserved, used=used)

    def _memory(self, call: str, handle: Handle) -> tuple[int, int, int]:
        h = self._enter(call, handle)
        assert h is not None
        if h.instance is not None:
            i = h.instance
            return i.memory_total, i.memory_used, i.memory_reserved
        gpu = self.gpus[h.gpu]
        if call == "memory_v2" and not gpu.memory_v2_supported:
            raise nvml_error(NvmlCode.FUNCTION_NOT_FOUND, call)
        return gpu.memory_total, gpu.memory_used, gpu.memory_reserved

    def temperature_c(self, handle: Handle) -> int:
        return self._value("temperature_c", self._gpu("temperature_c", handle).temperature_c)

    def power_usage_mw(self, handle: Handle) -> int:
        return self._value("power_usage_mw", self._gpu("power_usage_mw", handle).power_mw)

    def power_limit_mw(self, handle: Handle) -> int:
        return self._value("power_limit_mw", self._gpu("power_limit_mw", handle).power_limit_mw)

    def sm_clock_mhz(self, handle: Handle) -> int:
        return self._value("sm_clock_mhz", self._gpu("sm_clock_mhz", handle).sm_clock_mhz)

    def fan_speed_percent(self, handle: Handle) -> int:
        return self._value("fan_speed_percent", self._gpu("fan_speed_percent", handle).fan_percent)

    def pcie_throughput_kbs(self, handle: Handle, direction: PcieDirection) -> int:
        gpu = self._gpu("pcie_throughput_kbs", handle)
        value = gpu.pcie_tx_kbs if direction is PcieDirection.TX else gpu.pcie_rx_kbs
        return self._value("pcie_throughput_kbs", value)

    def field_values(self, handle: Handle, fields: Sequence[FieldRequest]) -> list[FieldValue]:
        gpu = self._gpu("field_values", handle)
        stamp = int(self._clock() * 1e6)
        out = []
        for request in fields:
            code, value = _field(gpu, request)
            out.append(FieldValue(request.field_id, int(code), value, stamp, request.scope_id))
        return out

    def mig_mode(self, handle: Handle) -> tuple[int, int]:
        gpu = self._gpu("mig_mode", handle)
        if not gpu.mig_supported:
            raise nvml_error(NvmlCode.NOT_SUPPORTED, "mig_mode")
        pending = gpu.mig_enabled if gpu.mig_pending is None else gpu.mig_pending
        return (int(gpu.mig_enabled), int(pending))

    def max_mig_device_count(self, handle: Handle) -> int:
        gpu = self._gpu("max_mig_device_count", handle)
        return gpu.mig_slots if gpu.mig_enabled else 0

    def mig_device_handle(self, handle: Handle, index: int) -> Handle:
        h = self._enter("mig_device_handle", handle)
        assert h is not None
        gpu = self.gpus[h.gpu]
        if not gpu.mig_enabled or not 0 <= index < len(gpu.instances):
            raise nvml_error(NvmlCode.NOT_FOUND, "mig_device_handle")
        return _Handle(h.gpu, gpu.instances[index])

    def gpu_instance_id(self, mig_handle: Handle) -> int:
        return self._instance("gpu_instance_id", mig_handle).gpu_instance_id

    def compute_instance_id(self, mig_handle: Handle) -> int:
        return self._instance("compute_instance_id", mig_handle).compute_instance_id

    def gpu_instance_info(self, handle: Handle, gpu_instance_id: int) -> GpuInstanceInfo:
        info = gpu_instance(self._gpu("gpu_instance_info", handle), gpu_instance_id)
        if info is None:
            raise nvml_error(NvmlCode.NOT_FOUND, "gpu_instance_info")
        return info

    def _instance(self, call: str, handle: Handle) -> FakeMigInstance:
        h = self._enter(call, handle)
        if h is None or h.instance is None:
            raise nvml_error(NvmlCode.INVALID_ARGUMENT, call)
        return h.instance

    def compute_processes_v3(self, handle: Handle) -> list[ProcessInfo]:
        return self._compute("compute_processes_v3", handle, 3)

    def compute_processes_v2(self, handle: Handle) -> list[ProcessInfo]:
        return self._compute("compute_processes_v2", handle, 2)

    def _compute(self, call: str, handle: Handle, version: int) -> list[ProcessInfo]:
        h, gpu = self._versioned(call, handle, version)
        if h.instance is not None:
            return infos(h.instance.processes, self._instance_ids(h.instance))
        if gpu.mig_enabled:
            return [
                info for i in gpu.instances for info in infos(i.processes, self._instance_ids(i))
            ]
        return infos([gpu.mps.server] if gpu.mps is not None else gpu.processes)

    @staticmethod
    def _instance_ids(instance: FakeMigInstance) -> tuple[int, int]:
        return instance.gpu_instance_id, instance.compute_instance_id

    def mps_compute_processes_v3(self, handle: Handle) -> list[ProcessInfo]:
        return self._mps("mps_compute_processes_v3", handle, 3)

    def mps_compute_processes_v2(self, handle: Handle) -> list[ProcessInfo]:
        return self._mps("mps_compute_processes_v2", handle, 2)

    def _mps(self, call: str, handle: Handle, version: int) -> list[ProcessInfo]:
        h, gpu = self._versioned(call, handle, version)
        if h.instance is not None or gpu.mps is None:
            return []
        if not gpu.mps.mps_call_supported:
            raise nvml_error(NvmlCode.NOT_SUPPORTED, call)
        return infos(gpu.processes)

    def _versioned(self, call: str, handle: Handle, version: int) -> tuple[_Handle, FakeGpu]:
        h = self._enter(call, handle)
        assert h is not None
        gpu = self.gpus[h.gpu]
        if version > gpu.process_call_version:
            raise nvml_error(NvmlCode.FUNCTION_NOT_FOUND, call)
        return h, gpu

    def processes_utilization_info(self, handle: Handle, last_seen_us: int) -> list[ProcessSample]:
        return self._samples("processes_utilization_info", handle, last_seen_us, newer=True)

    def process_utilization(self, handle: Handle, last_seen_us: int) -> list[ProcessSample]:
        return self._samples("process_utilization", handle, last_seen_us, newer=False)

    def _samples(
        self, call: str, handle: Handle, last_seen_us: int, *, newer: bool
    ) -> list[ProcessSample]:
        h = self._enter(call, handle)
        assert h is not None
        gpu = self.gpus[h.gpu]
        if newer and gpu.process_utilization_call != "info":
            raise nvml_error(NvmlCode.FUNCTION_NOT_FOUND, call)
        if h.instance is not None or gpu.mig_enabled or gpu.process_utilization_call == "none":
            raise nvml_error(NvmlCode.NOT_SUPPORTED, call)
        sampled = gpu.processes
        if gpu.mps is not None and not gpu.mps.mps_samples_clients:
            sampled = [mps_server_load(gpu.mps, gpu.processes)]
        gpu.driver.take(sampled, self._now_us())
        found = gpu.driver.since(last_seen_us)
        if not found:
            raise nvml_error(NvmlCode.NOT_FOUND, call)
        return found

    def gpm_supported(self, handle: Handle) -> bool:
        return self._gpu("gpm_supported", handle).gpm_supported

    def gpm_sample_alloc(self) -> GpmSample:
        self._enter("gpm_sample_alloc")
        self.live_gpm_samples += 1
        return _Sample()

    def gpm_sample_free(self, sample: GpmSample) -> None:
        self._enter("gpm_sample_free")
        s = self._sample("gpm_sample_free", sample)
        s.freed = True
        self.live_gpm_samples -= 1

    def gpm_sample_get(self, handle: Handle, sample: GpmSample) -> None:
        h = self._enter("gpm_sample_get", handle)
        assert h is not None
        gpu = self.gpus[h.gpu]
        if h.instance is not None or not gpu.gpm_supported:
            raise nvml_error(NvmlCode.NOT_SUPPORTED, "gpm_sample_get")
        self._fill(self._sample("gpm_sample_get", sample), (h.gpu, None), gpu.gpm)

    def gpm_mig_sample_get(self, handle: Handle, gpu_instance_id: int, sample: GpmSample) -> None:
        gpu = self._gpu("gpm_mig_sample_get", handle)
        if not gpu.gpm_supported or not gpu.mig_enabled:
            raise nvml_error(NvmlCode.NOT_SUPPORTED, "gpm_mig_sample_get")
        found = [i for i in gpu.instances if i.gpu_instance_id == gpu_instance_id]
        if not found:
            raise nvml_error(NvmlCode.NOT_FOUND, "gpm_mig_sample_get")
        key = (self.gpus.index(gpu), gpu_instance_id)
        self._fill(self._sample("gpm_mig_sample_get", sample), key, found[0].gpm)

    def _sample(self, call: str, sample: GpmSample) -> _Sample:
        if not isinstance(sample, _Sample) or sample.freed:
            raise nvml_error(NvmlCode.INVALID_ARGUMENT, call)
        return sample

    def _fill(self, sample: _Sample, key: tuple[int, int | None], values: dict[int, float]) -> None:
        self._seq += 1
        sample.key, sample.values, sample.seq = key, dict(values), self._seq

    def gpm_metrics(
        self, first: GpmSample, second: GpmSample, metric_ids: Sequence[int]
    ) -> list[GpmMetricValue]:
        self._enter("gpm_metrics")
        a = self._sample("gpm_metrics", first)
        b = self._sample("gpm_metrics", second)
        # NVML needs two samples of the same device, the older one first.
        if a.key is None or a.key != b.key or not a.seq < b.seq:
            raise nvml_error(NvmlCode.INVALID_ARGUMENT, "gpm_metrics")
        out = []
        for metric_id in metric_ids:
            value = b.values.get(metric_id)
            code = NvmlCode.NOT_SUPPORTED if value is None else 0
            out.append(GpmMetricValue(metric_id, int(code), 0.0 if value is None else value))
        return out


def _field(gpu: FakeGpu, request: FieldRequest) -> tuple[int, int]:
    """(return code, value) of one field, as NVML fills one ``nvmlFieldValue_t``."""
    if request.field_id == FI_NVLINK_LINK_COUNT:
        return (0, len(gpu.nvlinks)) if gpu.nvlinks else (NvmlCode.NOT_SUPPORTED, 0)
    if request.field_id not in (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX):
        return NvmlCode.NOT_SUPPORTED, 0
    tx = request.field_id == FI_NVLINK_THROUGHPUT_DATA_TX
    counters = [link.tx_kib if tx else link.rx_kib for link in gpu.nvlinks]
    if request.scope_id == SCOPE_ALL_LINKS:
        if not counters or None in counters:
            return NvmlCode.NOT_SUPPORTED, 0
        if gpu.nvlink_all_links_code:
            return gpu.nvlink_all_links_code, 0
        return 0, sum(c for c in counters if c is not None)
    if request.scope_id >= len(counters):
        return (NvmlCode.NOT_SUPPORTED if not counters else NvmlCode.INVALID_ARGUMENT), 0
    counter = counters[request.scope_id]
    return (NvmlCode.NOT_SUPPORTED, 0) if counter is None else (0, counter)
