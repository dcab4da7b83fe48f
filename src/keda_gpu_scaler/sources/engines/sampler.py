"""EngineSampler: the actor that scrapes one engine endpoint at a steady cadence.

One sampler per (engine kind, endpoint, discovery mode) serves every trigger that names
it: rates come from **its own** consecutive scrapes, so no caller moves another's
baseline (defect D5 of the Go project). Each cycle publishes one :class:`EngineSample`,
a failed cycle included (``reading`` None, ``error`` the reason); the next cycle simply
tries again, so the sampler recovers by itself when the endpoint comes back.

Series are tagged with the address that answered (label ``__address__``, a name no engine
can export) before counters are compared. So a Service name that starts resolving to
another pod, or a pod that appears or vanishes behind a headless Service, re-baselines its
own series instead of producing a bogus delta; per-pod baselines fall out of one mapping.
After a failed cycle the baseline is dropped: an outage is often a restart whose counters
may already have climbed past their old values, which no reset check could see.
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream

from keda_gpu_scaler.domain.engines import (
    Discovery,
    EngineKind,
    EngineReading,
    EngineSample,
    EngineTarget,
    PodResult,
)
from keda_gpu_scaler.domain.errors import EndpointRefused, ScrapeFailed
from keda_gpu_scaler.sources.cadence import every
from keda_gpu_scaler.sources.engines.extract import extract, selection_for
from keda_gpu_scaler.sources.engines.http import EngineScraper, PodScrape, Scrape
from keda_gpu_scaler.sources.engines.promtext import Exposition, merge_expositions
from keda_gpu_scaler.sources.engines.window import Baseline

ADDRESS_LABEL = "__address__"
DEFAULT_INTERVAL_S = 5.0


class EngineSampler:
    def __init__(
        self,
        kind: EngineKind,
        url: str,
        scraper: EngineScraper,
        *,
        discovery: Discovery = Discovery.STATIC,
        interval_s: float = DEFAULT_INTERVAL_S,
        name: str | None = None,
        options: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.kind = kind
        self.url = url
        self.discovery = discovery
        self.interval_s = interval_s
        self.name = name or EngineTarget(kind, url, discovery, options).source
        self._scraper = scraper
        self._options = dict(options)
        self._selection = selection_for(kind, self._options)
        self._baseline: Baseline | None = None

    @classmethod
    def for_target(
        cls, target: EngineTarget, scraper: EngineScraper, *, interval_s: float
    ) -> EngineSampler:
        """The sampler of ``target``, named by its source."""
        return cls(
            target.kind,
            target.url,
            scraper,
            discovery=target.discovery,
            interval_s=interval_s,
            options=target.options,
        )

    async def run(
        self,
        send: MemoryObjectSendStream[EngineSample],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with send:
            task_status.started()
            # A scrape slower than the interval skips the ticks it missed, never bunches them.
            async for _ in every(self.interval_s):
                await send.send(await self.sample())

    async def sample(self) -> EngineSample:
        """One cycle: scrape, compute against this sampler's baseline; failures are data."""
        started = anyio.current_time()
        try:
            return await self._cycle(started)
        except EndpointRefused as exc:
            return self._failure(started, exc.reason, refused=True)
        except ScrapeFailed as exc:
            return self._failure(started, str(exc))

    async def _cycle(self, started: float) -> EngineSample:
        if self.discovery is Discovery.DNS:
            pods = await self._scraper.fetch_pods(self.url, self._selection)
            return self._from_pods(started, pods)
        scrape = await self._scraper.fetch(self.url, self._selection)
        reading, self._baseline = self._extract(_tagged(scrape), started, self._baseline)
        return self._sample(started, reading=reading)

    def _from_pods(self, started: float, pods: list[PodScrape]) -> EngineSample:
        answered = [(p.address, _tagged(p.scrape)) for p in pods if p.scrape is not None]
        failed = [p for p in pods if p.scrape is None]
        if not answered:
            reasons = "; ".join(f"{p.address}: {p.error}" for p in failed)
            return self._failure(started, f"no pod answered ({reasons})", pods=_results(pods))
        previous = self._baseline
        merged = merge_expositions(e for _, e in answered)
        reading, self._baseline = self._extract(merged, started, previous)
        per_pod = {
            address: self._extract(exposition, started, previous)[0]
            for address, exposition in answered
        }
        note = f"{len(failed)} of {len(pods)} pods failed" if failed else None
        return self._sample(started, reading=reading, error=note, pods=_results(pods, per_pod))

    def _extract(
        self, exposition: Exposition, started: float, previous: Baseline | None
    ) -> tuple[EngineReading, Baseline]:
        return extract(
            self.kind, exposition, taken_at=started, previous=previous, options=self._options
        )

    def _failure(
        self,
        started: float,
        reason: str,
        *,
        pods: tuple[PodResult, ...] = (),
        refused: bool = False,
    ) -> EngineSample:
        self._baseline = None
        return self._sample(started, error=reason, pods=pods, refused=refused)

    def _sample(
        self,
        started: float,
        *,
        reading: EngineReading | None = None,
        error: str | None = None,
        pods: tuple[PodResult, ...] = (),
        refused: bool = False,
    ) -> EngineSample:
        return EngineSample(
            source=self.name,
            kind=self.kind,
            endpoint=self.url,
            taken_at=started,
            period_s=self.interval_s,
            reading=reading,
            error=error,
            refused=refused,
            pods=pods,
        )


def _tagged(scrape: Scrape) -> Exposition:
    return scrape.exposition.with_label(ADDRESS_LABEL, scrape.address)


def _results(
    pods: list[PodScrape], readings: Mapping[str, EngineReading] | None = None
) -> tuple[PodResult, ...]:
    found = readings or {}
    return tuple(
        PodResult(
            address=p.address,
            reading=found.get(p.address),
            error=p.error,
            duration_s=p.scrape.duration_s if p.scrape is not None else None,
        )
        for p in pods
    )
