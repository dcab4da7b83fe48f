"""The exception tree, drawn by what the caller should do.

    ScalerError
    ├── InvalidTrigger      permanent: the trigger metadata is wrong; fix the ScaledObject
    ├── NoData              transient: no usable reading right now; ask again later
    └── SourceError         raised by samplers
        ├── SourceUnavailable   permanent: the source cannot start here (library, device, file)
        └── SourceFailure       transient: one cycle failed; the supervisor retries with backoff

Serving maps InvalidTrigger to INVALID_ARGUMENT and NoData to UNAVAILABLE in one place.
"""

from __future__ import annotations

import json


class ScalerError(Exception):
    """Base of every error this product raises on purpose."""


class InvalidTrigger(ScalerError):
    """Trigger metadata that can never work; the message names the key and the value."""

    def __init__(self, key: str, value: str | None, reason: str) -> None:
        self.key = key
        self.value = value
        self.reason = reason
        if value is None:
            super().__init__(f"missing {key}: {reason}")
        else:
            super().__init__(f"invalid {key} {json.dumps(value)}: {reason}")


class NoData(ScalerError):
    """No fresh, supported reading exists for what the trigger asks."""


class SourceError(ScalerError):
    """Raised by a sampler."""


class SourceUnavailable(SourceError):
    """The source cannot work on this host; retrying will not help."""


class SourceFailure(SourceError):
    """One sampling cycle failed; retry after a delay."""
