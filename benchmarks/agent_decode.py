"""Decoding the node agent's WatchNode updates on a cluster scaler: betterproto2 and the codec.

Three updates as a node agent sends them (its own ``device_reading`` and
``attribution_lists``): the cluster-scale benchmark's typical one (8 GPUs, no attribution,
``cluster_scale._Agents(10).message(3, 1, False)``), 8 GPUs with every reading an H200 gives
(GPM included), and a MIG node's with its attribution (56 MIG instances, 56 holders). Each
is decoded ``--iterations`` times with betterproto2's ``NodeUpdate.parse`` and with
``decode_update``, alternating in rounds so that a noisy neighbour hits both alike, and the
codec's result goes through ``StreamReader.receive`` as a link does. Prints microseconds per update
(median of the rounds) and the ratios side by side, and the share of one core that 1000
agents at one update a second would take; writes JSON.

``--baseline TREE`` also decodes each update with the codec of the checkout at TREE (its
``codec.py`` loaded by path into this process), alternating with this tree's in three times
as many rounds, and prints the ratio: a comparison that the machine's noise between two runs
does not blur.

Usage: python benchmarks/agent_decode.py [--iterations 500] [--rounds 7] [--json OUT]
                                         [--baseline TREE]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster_scale import _Agents
from soak import write_json

from keda_gpu_scaler._proto_agent.kedagpuscaler.v1 import (
    Attribution,
    NodeIdentity,
    NodeReadings,
    NodeUpdate,
)
from keda_gpu_scaler.domain.samples import (
    FLOAT_READINGS,
    POD_RESOURCES_SOURCE,
    DeviceHolder,
    DeviceKey,
    GpuReading,
    PodResourcesReading,
)
from keda_gpu_scaler.serving.node_agent import attribution_lists, device_reading
from keda_gpu_scaler.sources.agents.codec import decode_update
from keda_gpu_scaler.sources.agents.updates import StreamReader

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "agent_decode.json"
AGENTS = 1000
GPUS, INSTANCES_PER_GPU = 8, 7
IDENTITY = bytes(
    NodeUpdate(identity=NodeIdentity("node-0003", "bench", sample_period_s=1.0, heartbeat_s=1.0))
)


NOW = 1000.0


def _reading(uuid: str, index: int, name: str, **readings: Any) -> GpuReading:
    """A reading as the NVML sampler makes it, 20 ms old at ``NOW``."""
    return GpuReading(
        source="nvml",
        key=DeviceKey(uuid),
        index=index,
        uuid=uuid,
        name=name,
        taken_at=NOW - 0.02,
        period_s=1.0,
        **readings,
    )


def mig_update() -> bytes:
    """56 1g MIG instances (7 on each of 8 GPUs), their GPM readings, and an attribution
    listing one holder for each."""
    readings = [
        _reading(
            f"MIG-bench-{g:02d}-{i:02d}",
            g,
            "NVIDIA H200 MIG 1g.18gb",
            memory_used_bytes=(4 + i) << 30,
            memory_total_bytes=16 << 30,
            sm_active=30.0 + i,
            sm_occupancy=20.0 + i,
            tensor_active=10.0 + i,
            dram_bw_util=5.0 + i,
            parent_index=g,
            parent_uuid=f"GPU-bench-{g:04d}",
            gpu_instance_id=7 + i,
            compute_instance_id=0,
        )
        for g in range(GPUS)
        for i in range(INSTANCES_PER_GPU)
    ]
    holders = tuple(
        DeviceHolder(
            namespace="bench",
            pod=f"work-{n}",
            container="main",
            resource="nvidia.com/mig-1g.18gb",
            device_id=r.uuid,
        )
        for n, r in enumerate(readings)
    )
    kubelet = PodResourcesReading(
        source=POD_RESOURCES_SOURCE, taken_at=NOW - 1.0, period_s=5.0, holders=holders
    )
    lists = attribution_lists(kubelet)
    attribution = Attribution(age_s=1.0, period_s=5.0, holders=lists[0], dra=lists[1])
    devices = [device_reading(r, NOW) for r in readings]
    return bytes(NodeUpdate(readings=NodeReadings(devices=devices, attribution=attribution)))


def every_reading_update() -> bytes:
    """8 GPUs with every reading an H200 gives (GPM included), as a real agent sends them."""
    readings = [
        _reading(
            f"GPU-bench-{g:04d}",
            g,
            "NVIDIA H200",
            memory_used_bytes=(40 + g) << 30,
            memory_total_bytes=141 << 30,
            memory_reserved_bytes=1 << 29,
            **{name: 10.0 + g + i for i, name in enumerate(FLOAT_READINGS)},
        )
        for g in range(GPUS)
    ]
    devices = [device_reading(r, NOW) for r in readings]
    return bytes(NodeUpdate(readings=NodeReadings(devices=devices)))


def _reader() -> StreamReader:
    """A reader past the agent's identity, as a link's is after its first message."""
    reader = StreamReader()
    reader.receive(decode_update(IDENTITY), 0.0)
    return reader


def _per_call_us(func: Callable[[], object], iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        func()
    return (time.perf_counter() - start) / iterations * 1e6


def measure(data: bytes, iterations: int, rounds: int) -> dict[str, Any]:
    """Median microseconds per update of each step, over ``rounds`` alternating rounds."""
    ours = decode_update(data)
    reader = _reader()
    steps: dict[str, Callable[[], object]] = {
        "betterproto2_decode": lambda: NodeUpdate.parse(data),
        "codec_decode": lambda: decode_update(data),
        "receive": lambda: reader.receive(ours, 1.0),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, func in steps.items():
            times[name].append(_per_call_us(func, iterations))
    us = {name: round(statistics.median(values), 2) for name, values in times.items()}
    after = us["codec_decode"] + us["receive"]
    return {
        "bytes": len(data),
        "us_per_update": us,
        "decode_ratio": round(us["betterproto2_decode"] / us["codec_decode"], 1),
        "decode_and_receive_us": round(after, 2),
        "core_share_at_1000_agents": {
            "betterproto2_decode_alone": round(us["betterproto2_decode"] * AGENTS / 1e6, 3),
            "codec_decode_and_receive": round(after * AGENTS / 1e6, 3),
        },
    }


def baseline_decoder(tree: Path) -> Callable[[bytes], object]:
    """``decode_update`` of the codec in another checkout, loaded from its file under a name
    of its own, so both decoders run in one process (its imports resolve to this tree)."""
    path = tree / "src" / "keda_gpu_scaler" / "sources" / "agents" / "codec.py"
    spec = importlib.util.spec_from_file_location("baseline_codec", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline: no codec at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    decode: Callable[[bytes], object] = module.decode_update
    return decode


def compare(
    data: bytes, baseline: Callable[[bytes], object], iterations: int, rounds: int
) -> dict[str, Any]:
    """Median µs per decode of this tree's codec and ``baseline``, alternating in rounds."""
    times: dict[str, list[float]] = {"baseline": [], "current": []}
    for _ in range(rounds):
        times["baseline"].append(_per_call_us(lambda: baseline(data), iterations))
        times["current"].append(_per_call_us(lambda: decode_update(data), iterations))
    us = {name: round(statistics.median(values), 2) for name, values in times.items()}
    return {
        "codec_decode_us": us,
        "current_over_baseline": round(us["current"] / us["baseline"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=500, help="calls per timed round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--baseline", type=Path, help="another checkout: compare its codec")
    args = parser.parse_args()
    updates = {
        "8 GPUs (cluster_scale's typical update)": _Agents(10).message(3, 1, False),
        "8 GPUs, every reading": every_reading_update(),
        "56 MIG instances, 56 holders": mig_update(),
    }
    baseline = baseline_decoder(args.baseline) if args.baseline else None
    results = []
    for name, data in updates.items():
        result = {"update": name, "iterations": args.iterations, "rounds": args.rounds}
        result |= measure(data, args.iterations, args.rounds)
        if baseline is not None:
            result["baseline"] = compare(data, baseline, args.iterations, 3 * args.rounds)
        results.append(result)
        _print(result)
    write_json(args.json, results)
    print(f"wrote {args.json}")


def _print(result: dict[str, Any]) -> None:
    us = result["us_per_update"]
    both = result["decode_and_receive_us"]
    share = result["core_share_at_1000_agents"]
    print(f"{result['update']}: {result['bytes']} bytes, median of {result['rounds']} rounds")
    print(f"  {'us per update':24s} {'betterproto2':>12s} {'codec':>10s} {'ratio':>7s}")
    theirs, ours = us["betterproto2_decode"], us["codec_decode"]
    print(f"  {'decode':24s} {theirs:12.1f} {ours:10.1f} {theirs / ours:6.1f}x")
    print(f"  {'StreamReader.receive':24s} {'':12s} {us['receive']:10.1f}")
    print(f"  {'decode + receive':24s} {'':12s} {both:10.1f}")
    print(
        f"  {'core share, 1000 agents':24s} {share['betterproto2_decode_alone']:12.1%} "
        f"{share['codec_decode_and_receive']:10.1%}  (betterproto2: decoding alone)"
    )
    if "baseline" in result:
        us = result["baseline"]["codec_decode_us"]
        print(
            f"  codec decode, baseline tree {us['baseline']:.1f} us, this tree {us['current']:.1f} "
            f"us: {result['baseline']['current_over_baseline']:.2f}x"
        )


if __name__ == "__main__":
    main()
