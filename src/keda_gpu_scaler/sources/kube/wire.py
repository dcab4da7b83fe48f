"""The Kubernetes list and watch wire format for pods, sans-I/O: bytes in, typed values out.

A list answers one JSON ``PodList``::

    {"kind": "PodList", "metadata": {"resourceVersion": "812", "continue": "..."},
     "items": [{"metadata": {"namespace": "ml", "name": "vllm-0", "uid": "...",
                             "labels": {...}, "resourceVersion": "790"},
                "status": {"phase": "Running"}, ...}]}

A watch answers one JSON event per line, ``{"type": ..., "object": ...}``:

    ADDED, MODIFIED   the pod as it is now
    DELETED           the pod as it last was
    BOOKMARK          progress only: an object whose ``metadata.resourceVersion`` is all
                      that counts (sent when asked with ``allowWatchBookmarks=true``)
    ERROR             a ``Status`` object: ``code`` 410 (Gone, "too old resource
                      version") means relist; anything else is a failure of the watch

Only the fields this product reads are decoded (msgspec skips the rest of a pod without
building it), so a node's worth of pods costs little however large their specs are.
Anything that is not this shape raises :class:`WireError` naming what was wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from keda_gpu_scaler.domain.samples import PodInfo

GONE = 410


class WireError(ValueError):
    """An answer of the Kubernetes API that is not the list or watch format."""


class _Meta(msgspec.Struct, rename="camel"):
    namespace: str
    name: str
    uid: str = ""
    labels: dict[str, str] | None = None
    resource_version: str = ""


class _Phase(msgspec.Struct):
    phase: str = ""


class _Pod(msgspec.Struct):
    metadata: _Meta
    status: _Phase | None = None


class _ListMeta(msgspec.Struct, rename="camel"):
    resource_version: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class _PodList(msgspec.Struct):
    metadata: _ListMeta
    items: list[_Pod] | None = None


class _Envelope(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _Progress(msgspec.Struct):
    metadata: _ListMeta


class _Status(msgspec.Struct):
    code: int = 0
    reason: str = ""
    message: str = ""


_LIST = msgspec.json.Decoder(_PodList)
_ENVELOPE = msgspec.json.Decoder(_Envelope)
_POD = msgspec.json.Decoder(_Pod)
_PROGRESS = msgspec.json.Decoder(_Progress)
_STATUS = msgspec.json.Decoder(_Status)


@dataclass(frozen=True, slots=True)
class PodPage:
    """One page of a list: its pods, the list's resourceVersion and the next page's token
    (empty on the last page)."""

    pods: tuple[PodInfo, ...]
    resource_version: str
    continue_token: str


@dataclass(frozen=True, slots=True)
class Upsert:
    """ADDED or MODIFIED: the pod as it is now."""

    pod: PodInfo
    resource_version: str


@dataclass(frozen=True, slots=True)
class Delete:
    pod: PodInfo
    resource_version: str


@dataclass(frozen=True, slots=True)
class Bookmark:
    resource_version: str


@dataclass(frozen=True, slots=True)
class WatchError:
    """An ERROR event: the watch is over; ``code`` 410 means the resourceVersion expired."""

    code: int
    reason: str
    message: str

    def is_gone(self) -> bool:
        return self.code == GONE


WatchEvent = Upsert | Delete | Bookmark | WatchError


def decode_page(body: bytes) -> PodPage:
    """One ``PodList`` answer; :class:`WireError` when it is not one."""
    try:
        page = _LIST.decode(body)
    except msgspec.DecodeError as exc:
        raise WireError(f"the pod list is not a PodList: {exc}") from exc
    if not page.metadata.resource_version:
        raise WireError("the pod list has no metadata.resourceVersion")
    return PodPage(
        pods=tuple(_info(pod) for pod in page.items or ()),
        resource_version=page.metadata.resource_version,
        continue_token=page.metadata.continue_,
    )


def decode_event(line: bytes | str) -> WatchEvent:
    """One line of a watch; :class:`WireError` when it is not a watch event."""
    try:
        envelope = _ENVELOPE.decode(line)
        return _event(envelope.type, envelope.object)
    except msgspec.DecodeError as exc:
        raise WireError(f"a watch event is not valid: {exc} in {_excerpt(line)}") from exc


def _event(kind: str, body: msgspec.Raw) -> WatchEvent:
    if kind in ("ADDED", "MODIFIED", "DELETED"):
        pod = _POD.decode(body)
        info = _info(pod)
        if kind == "DELETED":
            return Delete(info, pod.metadata.resource_version)
        return Upsert(info, pod.metadata.resource_version)
    if kind == "BOOKMARK":
        version = _PROGRESS.decode(body).metadata.resource_version
        if not version:
            raise WireError("a BOOKMARK event has no metadata.resourceVersion")
        return Bookmark(version)
    if kind == "ERROR":
        status = _STATUS.decode(body)
        return WatchError(status.code, status.reason, status.message)
    raise WireError(f"unknown watch event type {kind!r}")


def _info(pod: _Pod) -> PodInfo:
    meta = pod.metadata
    return PodInfo(
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        labels=meta.labels or {},
        phase=pod.status.phase if pod.status is not None else "",
    )


def _excerpt(line: bytes | str, limit: int = 120) -> str:
    text = line if isinstance(line, str) else line.decode("utf-8", "replace")
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")
