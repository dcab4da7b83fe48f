"""SGLang as 0.5.23 writes it: each scheduler's queue counted once.

SGLang labels every scheduler series with ``tp_rank``, ``pp_rank`` and ``moe_ep_rank``, adds
``dp_rank`` with data parallelism and ``priority`` with priority scheduling, which writes each
queue twice: the total under ``priority=""`` and a split under ``priority="<n>"``. With
``--enable-metrics-for-all-schedulers`` every rank of one scheduler reports the same queue.
"""

from __future__ import annotations

import pytest

from keda_gpu_scaler.domain.engines import EngineKind
from keda_gpu_scaler.sources.engines.extract import SELECTIONS, extract_sglang
from keda_gpu_scaler.sources.engines.promtext import parse_exposition
from tests.engine_payloads import SGLANG_2026, fixture


def _reading(text: str) -> tuple[float | None, float | None, float | None]:
    reading, _ = extract_sglang(parse_exposition(text, SELECTIONS[EngineKind.SGLANG]), taken_at=0)
    return reading.queue_requests, reading.running_requests, reading.token_usage_percent


def _queue(*series: tuple[str, float]) -> str:
    return "\n".join(f"sglang:num_queue_reqs{{{labels}}} {value}" for labels, value in series)


def test_the_2026_payload_counts_each_schedulers_queue_once() -> None:
    # dp 2 × tp 2 (moe_ep_rank = tp_rank), every scheduler reporting, priority split:
    # dp 0 holds 7 waiting (4 + 3) and 16 running, dp 1 holds 2 and 9.
    queue, running, usage = _reading(fixture(SGLANG_2026))
    assert (queue, running) == (9.0, 25.0)
    assert usage == pytest.approx(47.0)  # the highest rank's, rounded to 0.01 upstream


def test_a_priority_split_is_not_added_to_its_total() -> None:
    text = _queue(
        ('model_name="m",priority="",tp_rank="0"', 7),
        ('model_name="m",priority="0",tp_rank="0"', 4),
        ('model_name="m",priority="5",tp_rank="0"', 3),
    )
    assert _reading(text)[0] == 7.0


def test_a_split_without_its_total_is_summed() -> None:
    text = _queue(
        ('model_name="m",priority="0",tp_rank="0"', 4),
        ('model_name="m",priority="5",tp_rank="0"', 3),
        ('model_name="m",priority="0",tp_rank="1"', 4),
        ('model_name="m",priority="5",tp_rank="1"', 3),
    )
    assert _reading(text)[0] == 7.0


def test_every_expert_parallel_rank_reporting_is_one_queue() -> None:
    text = _queue(
        *((f'model_name="m",moe_ep_rank="{ep}",pp_rank="0",tp_rank="{ep}"', 6) for ep in range(4))
    )
    assert _reading(text)[0] == 6.0


def test_data_parallel_schedulers_are_summed() -> None:
    text = _queue(
        *(
            (f'dp_rank="{dp}",model_name="m",moe_ep_rank="{tp}",pp_rank="0",tp_rank="{tp}"', q)
            for dp, q in ((0, 5), (1, 2), (2, 0))
            for tp in range(2)
        )
    )
    assert _reading(text)[0] == 7.0
