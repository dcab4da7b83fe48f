from __future__ import annotations

import pytest

from keda_gpu_scaler.domain.errors import InvalidTrigger
from keda_gpu_scaler.domain.trigger import parse_trigger
from tests.metadata_cases import BAD_METADATA


@pytest.mark.parametrize(("metadata", "message"), BAD_METADATA)
def test_bad_metadata_is_rejected_naming_key_and_value(
    metadata: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidTrigger) as caught:
        parse_trigger(metadata)
    assert message in str(caught.value)
    assert caught.value.key in str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:8000/metrics",
        "http://10.0.0.5:8000/metrics",
        "https://vllm.ns.svc/m",
        "http://[fd12::1]:8000/metrics",
        "http://127.0.0.1:8000/metrics",
        "HTTP://vllm/metrics",
    ],
)
def test_private_and_loopback_endpoints_are_allowed(url: str) -> None:
    assert parse_trigger({"vllmEndpoint": url}).vllm_endpoint == url
