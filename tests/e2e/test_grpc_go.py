"""grpc-go, KEDA's own stack: a thousand StreamIsActive streams on one connection.

``scaler-client`` (e2e/grpcgo, built on KEDA's generated stubs and the grpc-go release KEDA's
go.mod selects) connects as KEDA does: one client connection per scaler address, every stream
and call multiplexed on it. It opens 1000 streams at once while unary calls flow on the same
connection and on a second one. Every stream must get its first message, none may fail, no
unary call may fail, and the figures (first-message latency, the slowest unary call during
the burst) go into the report.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.e2e.harness.controlplane import ControlPlane
from tests.e2e.harness.scaler import Ports, start_scaler

STREAMS = 1000
PORTS = Ports(grpc=16040, metrics=19040, probes=18040)
METADATA = [
    {"profile": "training"},
    {"profile": "triton-inference"},
    {"profile": "vllm-inference"},
    {"metricType": "sm_active", "activationThreshold": "5"},
    {"metricType": "power_draw", "targetValue": "500"},
]


def test_a_thousand_streams_from_grpc_go_on_one_connection(
    plane: ControlPlane, e2e_report: dict[str, Any]
) -> None:
    scaler = start_scaler(
        "grpc-go-scaler",
        ["--source=replay", "--pod-resources-socket="],
        logs=plane.paths.logs,
        ports=PORTS,
    )
    try:
        done = subprocess.run(
            [
                str(plane.paths.binary("scaler-client")),
                f"-address=127.0.0.1:{PORTS.grpc}",
                f"-streams={STREAMS}",
                f"-metadata={json.dumps(METADATA)}",
                "-rate=100",
                "-probe-rate=10",
                "-warmup=1s",
                "-hold=3s",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    finally:
        scaler.stop()
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    figures = {
        "streams answered": result["streams_answered"],
        "all first messages (s)": round(result["all_first_s"], 3),
        "first message p50/p99 (ms)": [
            result["first_message"]["p50_ms"],
            result["first_message"]["p99_ms"],
        ],
        "slowest unary during the burst, same connection (ms)": result["unary_during_burst"][
            "max_ms"
        ],
        "slowest unary during the burst, second connection (ms)": result["probe_during_burst"][
            "max_ms"
        ],
    }
    e2e_report["figures"]["grpc-go burst of 1000 streams"] = figures
    assert result["streams_answered"] == STREAMS, figures
    assert result["stream_errors"] == {}, result["stream_errors"]
    failed = [c for c in result["unary"] + result["probe"] if c["code"] != "OK"]
    assert failed == [], failed[:5]
