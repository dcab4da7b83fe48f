"""Builders of small engine payloads and a scriptable engine endpoint for MockTransport."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx

from keda_gpu_scaler.domain.endpoints import IpAddress

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
VLLM_V0 = "vllm-v0-datadog-integrations-core.txt"
VLLM_V1 = "vllm-v1-vllm-docs-design-metrics.txt"
TRITON = "triton-datadog-integrations-core.txt"
TGI = "tgi-datadog-integrations-core.txt"
SGLANG = "sglang-sglang-docs-production-metrics.txt"
SGLANG_2026 = "sglang-0.5.23-dp2-tp2-ep2-priority.txt"
VLLM_2026 = "vllm-0.34.0-dp2.txt"
VLLM_2026_ASLEEP = "vllm-0.34.0-dp2-asleep.txt"
TRTLLM = "trtllm-serve-iter-stats.txt"
TRTLLM_NO_ITER_STATS = "trtllm-serve-no-iter-stats.txt"
DYNAMO = "dynamo-frontend.txt"
LLMD = "llmd-router-epp.txt"
ALL_FIXTURES = (
    VLLM_V0,
    VLLM_V1,
    TRITON,
    TGI,
    SGLANG,
    SGLANG_2026,
    VLLM_2026,
    VLLM_2026_ASLEEP,
    TRTLLM,
    TRTLLM_NO_ITER_STATS,
    DYNAMO,
    LLMD,
)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def triton_payload(models: Mapping[str, tuple[int, int, int, int, int]]) -> str:
    """``models``: name -> (success, failure, items, queue_us, pending)."""
    lines: list[str] = []
    columns = (
        ("nv_inference_request_success", "counter"),
        ("nv_inference_request_failure", "counter"),
        ("nv_inference_count", "counter"),
        ("nv_inference_queue_duration_us", "counter"),
        ("nv_inference_pending_request_count", "gauge"),
    )
    for column, (name, kind) in enumerate(columns):
        lines.append(f"# TYPE {name} {kind}")
        for model, values in models.items():
            lines.append(f'{name}{{model="{model}",version="1"}} {values[column]}')
    return "\n".join(lines)


def vllm_histogram(
    family: str, buckets: Sequence[tuple[str, float]], total: float, labels: str
) -> list[str]:
    """Bucket lines (``le`` then cumulative count), ``_sum`` and ``_count`` (the +Inf count)."""
    lines = [f"# TYPE {family} histogram"]
    lines += [f'{family}_bucket{{{labels},le="{le}"}} {count}' for le, count in buckets]
    lines.append(f"{family}_sum{{{labels}}} {total}")
    lines.append(f"{family}_count{{{labels}}} {buckets[-1][1]}")
    return lines


@dataclass
class FakeEndpoint:
    """Per-address scripted answers for ``httpx.MockTransport``; records every request."""

    bodies: dict[str, str | httpx.Response] = field(default_factory=dict)
    requests: list[httpx.Request] = field(default_factory=list)
    delay_s: float = 0.0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.delay_s:
            await anyio.sleep(self.delay_s)
        answer = self.bodies.get(request.url.host)
        if answer is None:
            raise httpx.ConnectError("connection refused", request=request)
        if isinstance(answer, httpx.Response):
            return answer
        return httpx.Response(200, text=answer)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle))


class FakeResolver:
    """An injectable resolver: hostname -> addresses, changeable between scrapes."""

    def __init__(self, table: Mapping[str, Sequence[IpAddress]]) -> None:
        self.table = dict(table)
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> Sequence[IpAddress]:
        self.calls.append((host, port))
        if host not in self.table:
            raise OSError(-2, "Name or service not known")
        return self.table[host]
