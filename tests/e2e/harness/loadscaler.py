"""The product's server over a load that follows the real replica counts.

``python -m tests.e2e.harness.loadscaler CONFIG.json`` runs the scaler as ``serve`` runs it
(``keda_gpu_scaler.app.scaler.compose.open_scaler``: the real pipeline, decider, stream registry and
gRPC edge, its engine sampler and scraper) with a source this harness drives. Every second, on
the grid of its own start (its t = 0), the source reads the ready replicas of each workload's
Deployment from the API server and publishes one GPU per workload with what ``simulate``'s load
model says that GPU reads then (``keda_gpu_scaler.app.simulate.feeds.gpu_reading``: a demand
shared by the ready replicas, capped at the metric's bound). An engine endpoint a trigger names
is answered, through the scaler's own scraper (an ``httpx.MockTransport``: nothing leaves the
process), with a vLLM page whose queue is ``engine_share`` of the same model at the instant of
the scrape.

Its t = 0, on the monotonic clock every process of the machine shares, is written to
``started`` in the config, so a scenario can date the real events on the load's clock.

CONFIG: ``{"host", "port", "metrics_port", "probe_port", "started", "namespace",
"api": {"server", "ca", "cert", "key"}, "workloads": [{"name", "gpu", "load",
"endpoint"}]}``, ``load`` a load file (docs/simulate.md), ``endpoint`` the vLLM URL a trigger
names (or null).
"""

from __future__ import annotations

import json
import logging
import math
import signal
import ssl
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import anyio
import httpx
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.app.scaler.compose import EngineOptions, open_scaler
from keda_gpu_scaler.app.simulate.feeds import engine_share, gpu_reading
from keda_gpu_scaler.app.simulate.load import Load, read_load
from keda_gpu_scaler.domain.catalog import CATALOG, Origin
from keda_gpu_scaler.domain.endpoints import IpAddress
from keda_gpu_scaler.domain.engines import Discovery
from keda_gpu_scaler.domain.samples import Batch, Sample

SOURCE = "e2e-load"
log = logging.getLogger("loadscaler")


@dataclass(frozen=True)
class Workload:
    name: str
    gpu: int
    load: Load
    endpoint: str | None


class ReadyReplicas:
    """The ready replicas of the namespace's Deployments, as last read from the API."""

    def __init__(self, api: Mapping[str, str], namespace: str) -> None:
        context = ssl.create_default_context(cafile=api["ca"])
        context.load_cert_chain(api["cert"], api["key"])
        self._client = httpx.AsyncClient(base_url=api["server"], verify=context, timeout=2.0)
        self._path = f"/apis/apps/v1/namespaces/{namespace}/deployments"
        self.ready: dict[str, int] = {}

    async def refresh(self) -> None:
        try:
            response = await self._client.get(self._path)
            response.raise_for_status()
        except httpx.HTTPError as exc:  # the last counts stand until the next second
            log.warning("cannot read the Deployments: %s", exc)
            return
        self.ready = {
            item["metadata"]["name"]: int(item.get("status", {}).get("readyReplicas") or 0)
            for item in response.json()["items"]
        }

    async def aclose(self) -> None:
        await self._client.aclose()


class LoadSource:
    """A sampler: each second, every workload's GPU as the load model reads it."""

    name = SOURCE

    def __init__(self, workloads: list[Workload], replicas: ReadyReplicas, started: Path) -> None:
        self._workloads = workloads
        self._replicas = replicas
        self._started = started
        self.t0 = math.nan

    async def run(
        self,
        send: MemoryObjectSendStream[Sample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            if math.isnan(self.t0):
                self.t0 = anyio.current_time()  # asyncio's clock is time.monotonic()
                self._started.write_text(repr(self.t0))
            task_status.started()
            k = max(0, math.ceil(anyio.current_time() - self.t0))
            while True:
                await anyio.sleep_until(self.t0 + k)
                await self._replicas.refresh()
                readings = tuple(
                    gpu_reading(
                        list(w.load.metrics.values()),
                        w.gpu,
                        float(k),
                        self._replicas.ready.get(w.name, 0),
                        source=SOURCE,
                        taken_at=anyio.current_time(),
                    )
                    for w in self._workloads
                )
                await send.send(Batch(source=SOURCE, samples=readings))
                k += 1


def vllm_page(waiting: float | None) -> str:
    """A vLLM 0.x ``/metrics`` page with one engine's queue (no line: no reading)."""
    lines = ["# TYPE vllm:num_requests_waiting gauge"]
    if waiting is not None:
        lines.append(f'vllm:num_requests_waiting{{engine="0",model_name="e2e"}} {waiting}')
    lines += [
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="e2e"} 0',
    ]
    return "\n".join(lines) + "\n"


class Engines:
    """The vLLM endpoints triggers name, answered from the load model."""

    def __init__(self, workloads: list[Workload], replicas: ReadyReplicas, source: LoadSource):
        self._by_host = {
            httpx.URL(w.endpoint).netloc.decode(): w for w in workloads if w.endpoint is not None
        }
        self._replicas = replicas
        self._source = source

    async def resolve(self, host: str, port: int) -> list[IpAddress]:
        if f"{host}:{port}" not in self._by_host and host not in self._by_host:
            raise OSError(f"{host}: not an endpoint of this scenario")
        return [ip_address("127.0.0.1")]  # never dialled: the transport answers

    def handle(self, request: httpx.Request) -> httpx.Response:
        workload = self._by_host.get(request.headers.get("host", ""))
        if workload is None:
            return httpx.Response(404, text="no such engine")
        at = anyio.current_time() - self._source.t0
        replicas = self._replicas.ready.get(workload.name, 0)
        queue = next(
            (
                m
                for m in workload.load.metrics.values()
                if CATALOG[m.metric_type].origin is Origin.VLLM
            ),
            None,
        )
        if queue is None:
            return httpx.Response(404, text="no engine metric in this load")
        waiting = engine_share(queue, at, replicas, Discovery.STATIC)
        if waiting is None:  # no replica runs: no engine answers
            return httpx.Response(503, text="no engine")
        return httpx.Response(200, text=vllm_page(waiting), headers={"content-type": "text/plain"})


async def main(config: Mapping[str, Any]) -> None:
    workloads = [
        Workload(w["name"], int(w["gpu"]), read_load(Path(w["load"])), w.get("endpoint"))
        for w in config["workloads"]
    ]
    replicas = ReadyReplicas(config["api"], config["namespace"])
    source = LoadSource(workloads, replicas, Path(config["started"]))
    engines = Engines(workloads, replicas, source)
    options = EngineOptions(transport=httpx.MockTransport(engines.handle), resolve=engines.resolve)
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with open_scaler(
            source,
            host=config["host"],
            port=int(config["port"]),
            metrics_port=int(config["metrics_port"]),
            probe_port=int(config["probe_port"]),
            engine_options=options,
        ):
            log.info("serving")
            async for _ in signals:
                break
    await replicas.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    anyio.run(main, json.loads(Path(sys.argv[1]).read_text()), backend="asyncio")
