"""Where a gRPC server's busy time goes, from a py-spy profile: h2, grpclib, sockets, protobuf.

Record the server of a soak (``soak.py``: the scaler's process, or with ``--floor`` the server
that does no work) while it runs, in py-spy's collapsed format, then read it here::

    python benchmarks/soak.py --floor --duration 70 &
    sleep 35   # past the burst and the first report
    py-spy record --pid "$(pgrep -f 'scaler_process.py --source floor')" \\
        --duration 30 --rate 200 --format raw -o floor.txt
    python benchmarks/profile_shares.py floor.txt

Each line of the profile is a stack and its number of samples. Samples of the benchmark's
own control thread, and those of the event loop waiting in ``select``, are not busy time.
For each part it prints the share of the busy samples whose stack passes through it (a
stack may pass through several parts: the shares overlap, they do not add up to 100 %).

Usage: python benchmarks/profile_shares.py PROFILE [--json PATH]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

PARTS: dict[str, tuple[str, ...]] = {
    "h2: parsing received frames": ("H2Connection.receive_data",),
    "h2: building and sending frames": (
        "H2Connection.send_headers",
        "H2Connection.send_data",
        "H2Connection.end_stream",
        "H2Connection.acknowledge_received_data",
        "H2Connection.increment_flow_control_window",
        "H2Connection.data_to_send",
    ),
    "grpclib: request handling (request_handler)": ("request_handler",),
    "grpclib: events (EventsProcessor.process)": ("EventsProcessor.process",),
    "asyncio: socket reads": ("_SelectorSocketTransport._read_ready",),
    "asyncio: socket writes": ("_SelectorSocketTransport.write",),
    "protobuf: encode and decode": (
        "Message.SerializeToString",
        "Message.parse",
        "Message.__bytes__",
        "ProtoCodec.encode",
        "ProtoCodec.decode",
        "RepeatedRequests.decode",
    ),
}
"""Each part, by the functions (py-spy's ``Class.method`` names) a stack passes through."""


def _stacks(lines: Iterable[str]) -> Iterable[tuple[list[str], int]]:
    for line in lines:
        line = line.rstrip()
        if line:
            stack, count = line.rsplit(" ", 1)
            yield stack.split(";"), int(count)


def _is_control_thread(frames: list[str]) -> bool:
    return any(f.startswith("_control ") for f in frames) and any("Thread" in f for f in frames)


def shares(lines: Iterable[str]) -> tuple[int, int, dict[str, float]]:
    """(samples, busy samples, share of the busy ones per part)."""
    samples = busy = 0
    hits = dict.fromkeys(PARTS, 0)
    for frames, count in _stacks(lines):
        if _is_control_thread(frames):
            continue
        samples += count
        if frames[-1].split(" ", 1)[0].endswith("select"):
            continue  # the loop waiting for work
        busy += count
        for part, functions in PARTS.items():
            if any(f.split(" ", 1)[0] in functions for f in frames):
                hits[part] += count
    return samples, busy, {part: n / busy if busy else 0.0 for part, n in hits.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, help="py-spy record --format raw output")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    samples, busy, by_part = shares(args.profile.read_text().splitlines())
    print(f"{busy} busy samples of {samples} ({busy / samples:.1%} busy)")
    for part, share in sorted(by_part.items(), key=lambda kv: -kv[1]):
        print(f"{share:6.1%}  {part}")
    if args.json is not None:
        args.json.write_text(json.dumps({"samples": samples, "busy": busy, "shares": by_part}))


if __name__ == "__main__":
    main()
