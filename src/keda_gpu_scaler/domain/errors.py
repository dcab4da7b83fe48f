"""The exception tree, drawn by what the caller should do.

    ScalerError
    ├── InvalidTrigger      permanent: the trigger metadata is wrong; fix the ScaledObject
    ├── NoData              transient: no usable reading right now; ask again later
    └── SourceError         raised by samplers, never answered to KEDA as such
        ├── SourceUnavailable   permanent: the source cannot start here (library, device, file)
        │   └── EndpointRefused     an engine endpoint refused by policy (SSRF rules,
        │                           allow-list): no request is made
        └── SourceFailure       transient: one cycle failed; the supervisor retries with backoff
            └── ScrapeFailed        one scrape of an engine endpoint failed (resolution,
                                    connection, timeout, status, size, parse); next cycle retries

Only the decision layer raises InvalidTrigger and NoData: it reads what a source published
(an engine sample marked refused becomes InvalidTrigger naming the trigger key). Serving maps
InvalidTrigger to INVALID_ARGUMENT and NoData to UNAVAILABLE in one place.
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


class EndpointRefused(SourceUnavailable):
    """``url`` may not be scraped: ``reason`` says which rule refuses it."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"endpoint {json.dumps(url)} refused: {reason}")


class ScrapeFailed(SourceFailure):
    """One scrape of an engine endpoint failed; the message names the URL and why."""
