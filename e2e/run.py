"""Run the end-to-end scenarios inside a network namespace of their own.

``make e2e`` builds the components (``e2e/build.py``), then runs this: it starts itself again
in a new network namespace (``unshare --net``; with ``--map-root-user`` when not root), brings
up loopback and the interface ``e2e0`` whose private range 10.99.0.0/16 is local to the
namespace (the API server's advertised address, the KEDA metrics server's endpoint, the
pods' addresses), and runs ``pytest -m e2e tests/e2e`` there. Nothing the scenarios send can
leave the namespace: it has no other interface and no route out.

It ends with the line ``e2e: N passed, M failed`` and the exit status of pytest; the
scenarios' outcomes, durations, component versions and replica timelines are in
``build/e2e/report.json``.

Usage: python e2e/run.py [PYTEST ARGS...]   (for example -k keda, or tests/e2e/test_rbac.py)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "build" / "e2e" / "report.json"
INSIDE = "KEDA_GPU_SCALER_E2E_NETNS"
NETWORK_SETUP = (
    ("ip", "link", "set", "lo", "up"),
    ("ip", "link", "add", "e2e0", "type", "veth", "peer", "name", "e2e1"),
    ("ip", "link", "set", "e2e0", "up"),
    ("ip", "link", "set", "e2e1", "up"),
    ("ip", "addr", "add", "10.99.0.1/16", "dev", "e2e0"),
    ("ip", "route", "add", "local", "10.99.0.0/16", "dev", "e2e0", "table", "local"),
)


def enter_namespace(argv: list[str]) -> int:
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("ip") is None:
        print("e2e: needs unshare (util-linux) and ip (iproute2)", file=sys.stderr)
        return 2
    userns = [] if os.geteuid() == 0 else ["--map-root-user"]
    command = [unshare, "--net", *userns, "--", sys.executable, __file__, *argv]
    return subprocess.call(command, env=os.environ | {INSIDE: "1"})


def set_up_network() -> None:
    for step in NETWORK_SETUP:
        subprocess.run(step, check=True, capture_output=True, text=True)


def summary() -> tuple[int, int]:
    try:
        report = json.loads(REPORT.read_text())
    except (OSError, ValueError):
        return 0, 0
    outcomes = [s["outcome"] for s in report.get("scenarios", [])]
    return outcomes.count("passed"), sum(o in ("failed", "error") for o in outcomes)


def main(argv: list[str]) -> int:
    if os.environ.get(INSIDE) != "1":
        code = enter_namespace(argv)
        passed, failed = summary()
        print(f"e2e: {passed} passed, {failed} failed")
        return code if code or failed or passed else 1
    try:
        set_up_network()
    except subprocess.CalledProcessError as exc:
        print(f"e2e: cannot set up the network namespace: {exc.stderr.strip()}", file=sys.stderr)
        return 2
    REPORT.unlink(missing_ok=True)
    pytest = [sys.executable, "-m", "pytest", "-m", "e2e", "-p", "no:cacheprovider"]
    return subprocess.call([*pytest, *(argv or ["tests/e2e"])], cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
