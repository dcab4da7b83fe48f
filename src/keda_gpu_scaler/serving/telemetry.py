"""What serving tells telemetry: one protocol, built once in the composition root.

The aggregator tells it of every folded batch (``folded``, the pipeline's
:class:`~keda_gpu_scaler.pipeline.aggregator.FoldObserver`), the decider of every decision
and failed decision, the servicer of every RPC outcome. Implementations must not block.
"""

from __future__ import annotations

from typing import Protocol

from keda_gpu_scaler.domain.decision import Decision, TriggerKey
from keda_gpu_scaler.domain.samples import Sample
from keda_gpu_scaler.domain.snapshot import Snapshot


class Telemetry(Protocol):
    def folded(self, batch: list[Sample], snapshot: Snapshot) -> None: ...

    def decided(self, key: TriggerKey, rpc: str, decision: Decision, now: float) -> None: ...

    def failed(self, key: TriggerKey, rpc: str, reason: str, now: float) -> None: ...

    def answered(self, method: str, code: str, seconds: float | None) -> None:
        """``seconds`` is None for a stream, which reports its code when it ends."""


class NoTelemetry:
    """Tells nobody (tests, tools)."""

    def folded(self, batch: list[Sample], snapshot: Snapshot) -> None:
        pass

    def decided(self, key: TriggerKey, rpc: str, decision: Decision, now: float) -> None:
        pass

    def failed(self, key: TriggerKey, rpc: str, reason: str, now: float) -> None:
        pass

    def answered(self, method: str, code: str, seconds: float | None) -> None:
        pass
