"""EngineSampler in trio's virtual time: cadence, its own rates, failures and recovery, DNS mode."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import anyio
import httpx
import pytest

from keda_gpu_scaler.domain.endpoints import IpAddress
from keda_gpu_scaler.domain.engines import (
    Discovery,
    EngineKind,
    EngineSample,
    TritonReading,
    VllmReading,
)
from keda_gpu_scaler.sources.engines.http import EngineScraper, ScrapePolicy
from keda_gpu_scaler.sources.engines.sampler import EngineSampler
from tests.engine_payloads import FakeEndpoint, FakeResolver, triton_payload

POD = "10.0.0.1"
URL = "http://triton.test:8002/metrics"


def _ip(text: str) -> IpAddress:
    return ipaddress.ip_address(text)


async def _collect(
    sampler: EngineSampler, count: int, after: Callable[[int], None] = lambda _: None
) -> list[EngineSample]:
    """Run the sampler for ``count`` samples; ``after(i)`` rescripts the endpoint."""
    send, receive = anyio.create_memory_object_stream[EngineSample](0)
    samples: list[EngineSample] = []
    async with anyio.create_task_group() as tg:
        await tg.start(sampler.run, send)
        async with receive:
            for i in range(count):
                samples.append(await receive.receive())
                after(i)
        tg.cancel_scope.cancel()
    return samples


def _triton_sampler(client: httpx.AsyncClient, policy: ScrapePolicy | None = None) -> EngineSampler:
    scraper = EngineScraper(
        client, policy=policy, resolve=FakeResolver({"triton.test": [_ip(POD)]})
    )
    return EngineSampler(EngineKind.TRITON, URL, scraper, interval_s=5.0)


def _triton_reading(sample: EngineSample) -> TritonReading:
    assert isinstance(sample.reading, TritonReading), sample.error
    return sample.reading


@pytest.mark.trio
async def test_cadence_and_triton_rates_over_several_scrapes(autojump_clock: object) -> None:
    # (success, failure, items, queue_us, pending): batches of 4 items per request.
    script = [
        {"a": (0, 0, 0, 0, 0)},
        {"a": (10, 0, 40, 20_000, 3)},
        {"a": (30, 5, 120, 60_000, 9)},
        {"a": (2, 0, 8, 1_000, 1)},  # a model reload: counters start again
        {"a": (12, 0, 48, 6_000, 0)},
        {"a": (12, 0, 48, 6_000, 0)},  # idle
    ]
    endpoint = FakeEndpoint({POD: triton_payload(script[0])})

    def rescript(i: int) -> None:
        if i + 1 < len(script):
            endpoint.bodies[POD] = triton_payload(script[i + 1])

    async with endpoint.client() as client:
        sampler = _triton_sampler(client)
        start = anyio.current_time()
        samples = await _collect(sampler, len(script), rescript)
    readings = [_triton_reading(s) for s in samples]
    assert [s.taken_at - start for s in samples] == [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]
    assert [r.pending_requests for r in readings] == [0, 3, 9, 1, 0, 0]
    assert [r.request_rate for r in readings] == [None, 2.0, 5.0, None, 2.0, 0.0]
    assert [r.inference_rate for r in readings] == [None, 8.0, 16.0, None, 8.0, 0.0]
    assert [r.queue_wait_ms for r in readings] == [None, 2.0, 2.0, None, 0.5, None]
    assert "re-baselined" in readings[3].reasons["request_rate"]
    assert "no request succeeded" in readings[5].reasons["queue_wait_ms"]
    assert [s.error for s in samples] == [None] * 6


BAD_ANSWERS: list[tuple[str, Callable[[], httpx.Response | None], str]] = [
    ("down", lambda: None, "connection failed"),
    ("garbage", lambda: httpx.Response(200, text="<html>502</html>"), "not Prometheus text"),
    ("huge", lambda: httpx.Response(200, text="m 1\n" * 2000), "larger than 4096 bytes"),
    ("redirect", lambda: httpx.Response(301, headers={"location": "/x"}), "redirect to /x"),
    ("error", lambda: httpx.Response(503), "returned HTTP 503"),
]


@pytest.mark.trio
@pytest.mark.parametrize(("case", "answer", "reason"), BAD_ANSWERS)
async def test_failures_are_published_and_the_sampler_recovers(
    autojump_clock: object, case: str, answer: Callable[[], httpx.Response | None], reason: str
) -> None:
    good = triton_payload({"a": (1, 0, 1, 10, 2)})
    later = triton_payload({"a": (6, 0, 6, 60, 2)})
    endpoint = FakeEndpoint({POD: good})

    def rescript(i: int) -> None:
        bad = answer()
        if i == 0 and bad is None:
            del endpoint.bodies[POD]
        elif i == 0 and bad is not None:
            endpoint.bodies[POD] = bad
        elif i == 1:
            endpoint.bodies[POD] = good
        elif i == 2:
            endpoint.bodies[POD] = later

    async with endpoint.client() as client:
        sampler = _triton_sampler(client, ScrapePolicy(max_bytes=4096))
        samples = await _collect(sampler, 4, rescript)
    failed = samples[1]
    assert failed.is_failure() and failed.error is not None
    assert reason in failed.error, case
    assert failed.error.startswith(f"{URL} ({POD})")
    # Back: levels at once; rates only from two good scrapes after the failure.
    assert _triton_reading(samples[2]).pending_requests == 2.0
    assert _triton_reading(samples[2]).request_rate is None
    assert _triton_reading(samples[3]).request_rate == 1.0
    assert [s.is_failure() for s in samples] == [False, True, False, False]


@pytest.mark.trio
async def test_slow_endpoint_fails_at_the_deadline_and_keeps_the_cadence(
    autojump_clock: object,
) -> None:
    endpoint = FakeEndpoint({POD: triton_payload({"a": (1, 0, 1, 1, 0)})}, delay_s=12.0)

    received_at: list[float] = []

    def rescript(i: int) -> None:
        received_at.append(anyio.current_time() - start)
        endpoint.delay_s = 0.0 if i >= 1 else endpoint.delay_s

    async with endpoint.client() as client:
        sampler = _triton_sampler(client, ScrapePolicy(total_timeout_s=7.0))
        start = anyio.current_time()
        samples = await _collect(sampler, 3, rescript)
    assert samples[0].error is not None and "no complete response within 7 s" in samples[0].error
    assert samples[1].error is not None  # the second was already waiting on the slow answer
    # The 7 s scrapes overran the 5 s ticks: missed ticks are skipped, never bunched.
    assert [s.taken_at - start for s in samples] == [0.0, 10.0, 20.0]
    assert samples[2].reading is not None
    assert received_at == [7.0, 17.0, 20.0]  # the last scrape, fast again, took no time


def _vllm_pod(waiting: int, kv: float, preemptions: int) -> str:
    return (
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
        f'vllm:num_requests_running{{model_name="m"}} 4\n'
        f'vllm:kv_cache_usage_perc{{model_name="m"}} {kv}\n'
        f'vllm:num_preemptions_total{{model_name="m"}} {preemptions}\n'
    )


@pytest.mark.trio
async def test_dns_discovery_aggregates_pods_and_rebaselines_new_ones(
    autojump_clock: object,
) -> None:
    resolver = FakeResolver({"vllm-headless": [_ip("10.0.0.1"), _ip("10.0.0.2")]})
    endpoint = FakeEndpoint({"10.0.0.1": _vllm_pod(3, 0.5, 0), "10.0.0.2": _vllm_pod(4, 0.9, 0)})

    def rescript(i: int) -> None:
        if i == 0:  # both pods preempt; a third pod appears
            resolver.table["vllm-headless"] = [_ip(f"10.0.0.{n}") for n in (1, 2, 3)]
            endpoint.bodies.update(
                {
                    "10.0.0.1": _vllm_pod(1, 0.5, 10),
                    "10.0.0.2": _vllm_pod(2, 0.25, 5),
                    "10.0.0.3": _vllm_pod(7, 0.1, 1000),
                }
            )
        if i == 1:  # pod 2 goes down
            del endpoint.bodies["10.0.0.2"]
        if i == 2:  # everything down
            endpoint.bodies.clear()

    async with endpoint.client() as client:
        scraper = EngineScraper(client, resolve=resolver)
        sampler = EngineSampler(
            EngineKind.VLLM,
            "http://vllm-headless:8000/metrics",
            scraper,
            discovery=Discovery.DNS,
            interval_s=5.0,
        )
        samples = await _collect(sampler, 4, rescript)

    first, grown, partial, down = samples
    assert isinstance(first.reading, VllmReading)
    assert (first.reading.queue_depth, first.reading.kv_cache_usage_percent) == (7.0, 90.0)
    assert first.reading.running == 8.0
    assert [p.address for p in first.pods] == ["10.0.0.1", "10.0.0.2"]

    assert isinstance(grown.reading, VllmReading)
    assert grown.reading.queue_depth == 10.0
    assert grown.reading.kv_cache_usage_percent == 50.0
    # The new pod's 1000 preemptions are its baseline, not a burst: (10 + 5) / 5 s.
    assert grown.reading.preemptions_per_s == 3.0
    per_pod = {p.address: p.reading for p in grown.pods}
    assert isinstance(per_pod["10.0.0.3"], VllmReading)
    assert per_pod["10.0.0.3"].queue_depth == 7.0
    assert per_pod["10.0.0.3"].preemptions_per_s is None
    assert isinstance(per_pod["10.0.0.1"], VllmReading)
    assert per_pod["10.0.0.1"].preemptions_per_s == 2.0

    assert isinstance(partial.reading, VllmReading)
    assert partial.reading.queue_depth == 8.0
    assert partial.error == "1 of 3 pods failed"
    assert [p.error is not None for p in partial.pods] == [False, True, False]

    assert down.reading is None and down.error is not None
    assert down.error.startswith("no pod answered (10.0.0.1: ")
    assert len(down.pods) == 3
    assert [p.error is not None for p in down.pods] == [True, True, True]
