"""docs/configuration.md is generated from the code: it must not drift."""

from __future__ import annotations

from pathlib import Path

from keda_gpu_scaler.app.reference import render_configuration
from keda_gpu_scaler.domain.catalog import CATALOG
from keda_gpu_scaler.domain.profiles import PROFILES
from keda_gpu_scaler.domain.trigger_keys import TRIGGER_KEY_HELP, TRIGGER_KEYS

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_configuration_reference_is_up_to_date() -> None:
    assert DOC.read_text() == render_configuration(), "run `make docs` and commit the result"


def test_reference_covers_every_key_type_and_profile() -> None:
    text = render_configuration()
    assert set(TRIGGER_KEY_HELP) == set(TRIGGER_KEYS)
    for name in (*TRIGGER_KEYS, *CATALOG, *PROFILES):
        assert f"`{name}`" in text, name
