"""The Kubernetes list and watch wire format, sans-I/O: bytes in, typed values out.

A list answers one JSON list object (``PodList``, ``EndpointSliceList``, ...)::

    {"kind": "PodList", "metadata": {"resourceVersion": "812", "continue": "..."},
     "items": [{"metadata": {"namespace": "ml", "name": "vllm-0", "uid": "...",
                             "labels": {...}, "resourceVersion": "790"},
                "spec": {"nodeName": "node-a", ...}, "status": {"phase": "Running"}}]}

A watch answers one JSON event per line, ``{"type": ..., "object": ...}``:

    ADDED, MODIFIED   the object as it is now
    DELETED           the object as it last was
    BOOKMARK          progress only: an object whose ``metadata.resourceVersion`` is all
                      that counts (sent when asked with ``allowWatchBookmarks=true``)
    ERROR             a ``Status`` object: ``code`` 410 (Gone, "too old resource
                      version") means relist; anything else is a failure of the watch

The envelope is the same for every kind; a :class:`Codec` says how one kind of object is
decoded (a msgspec Struct with only the fields this product reads, so the rest of an object
is skipped without being built) and turned into the value the product keeps. The pods'
codec is :data:`POD_CODEC`; the EndpointSlices' is in
:mod:`~keda_gpu_scaler.sources.kube.endpointslices`. Anything that is not this shape raises
:class:`WireError` naming what was wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from keda_gpu_scaler.domain.samples import PodInfo

GONE = 410

S = TypeVar("S", bound=msgspec.Struct)
T = TypeVar("T")


class WireError(ValueError):
    """An answer of the Kubernetes API that is not the list or watch format."""


class ListMeta(msgspec.Struct, rename="camel"):
    resource_version: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class _List(msgspec.Struct, Generic[S]):
    metadata: ListMeta
    items: list[S] | None = None


class _Envelope(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _Progress(msgspec.Struct):
    metadata: ListMeta


class _Status(msgspec.Struct):
    code: int = 0
    reason: str = ""
    message: str = ""


_ENVELOPE = msgspec.json.Decoder(_Envelope)
_PROGRESS = msgspec.json.Decoder(_Progress)
_STATUS = msgspec.json.Decoder(_Status)


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a list: its objects, the list's resourceVersion and the next page's
    token (empty on the last page)."""

    items: tuple[T, ...]
    resource_version: str
    continue_token: str


@dataclass(frozen=True, slots=True)
class Upsert(Generic[T]):
    """ADDED or MODIFIED: the object as it is now."""

    item: T
    resource_version: str


@dataclass(frozen=True, slots=True)
class Delete(Generic[T]):
    item: T
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


WatchEvent = Upsert[T] | Delete[T] | Bookmark | WatchError


class Codec(Generic[S, T]):
    """How the objects of one kind are read: ``struct`` is what is decoded, ``convert``
    makes the value kept of it, ``version_of`` reads its ``metadata.resourceVersion``.
    ``noun`` and ``list_kind`` name them in errors ("the pod list is not a PodList")."""

    def __init__(
        self,
        *,
        noun: str,
        list_kind: str,
        struct: type[S],
        convert: Callable[[S], T],
        version_of: Callable[[S], str],
    ) -> None:
        self.noun = noun
        self.list_kind = list_kind
        self._convert = convert
        self._version_of = version_of
        self._object = msgspec.json.Decoder(struct)
        self._list: msgspec.json.Decoder[_List[Any]] = msgspec.json.Decoder(_List[struct])  # type: ignore[valid-type]

    def decode_page(self, body: bytes) -> Page[T]:
        """One list answer; :class:`WireError` when it is not one."""
        try:
            page = self._list.decode(body)
        except msgspec.DecodeError as exc:
            article = "an" if self.list_kind[0] in "AEIOU" else "a"
            raise WireError(
                f"the {self.noun} list is not {article} {self.list_kind}: {exc}"
            ) from exc
        if not page.metadata.resource_version:
            raise WireError(f"the {self.noun} list has no metadata.resourceVersion")
        return Page(
            items=tuple(self._convert(item) for item in page.items or ()),
            resource_version=page.metadata.resource_version,
            continue_token=page.metadata.continue_,
        )

    def decode_event(self, line: bytes | str) -> WatchEvent[T]:
        """One line of a watch; :class:`WireError` when it is not a watch event."""
        try:
            envelope = _ENVELOPE.decode(line)
            return self._event(envelope.type, envelope.object)
        except msgspec.DecodeError as exc:
            raise WireError(f"a watch event is not valid: {exc} in {_excerpt(line)}") from exc

    def _event(self, kind: str, body: msgspec.Raw) -> WatchEvent[T]:
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            decoded = self._object.decode(body)
            item = self._convert(decoded)
            if kind == "DELETED":
                return Delete(item, self._version_of(decoded))
            return Upsert(item, self._version_of(decoded))
        if kind == "BOOKMARK":
            version = _PROGRESS.decode(body).metadata.resource_version
            if not version:
                raise WireError("a BOOKMARK event has no metadata.resourceVersion")
            return Bookmark(version)
        if kind == "ERROR":
            status = _STATUS.decode(body)
            return WatchError(status.code, status.reason, status.message)
        raise WireError(f"unknown watch event type {kind!r}")


# -- pods ----------------------------------------------------------------------------


class _Meta(msgspec.Struct, rename="camel"):
    namespace: str
    name: str
    uid: str = ""
    labels: dict[str, str] | None = None
    resource_version: str = ""


class _Phase(msgspec.Struct):
    phase: str = ""


class _Spec(msgspec.Struct, rename="camel"):
    node_name: str = ""


class _Pod(msgspec.Struct):
    metadata: _Meta
    spec: _Spec | None = None
    status: _Phase | None = None


def _info(pod: _Pod) -> PodInfo:
    meta = pod.metadata
    return PodInfo(
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        labels=meta.labels or {},
        phase=pod.status.phase if pod.status is not None else "",
        node=pod.spec.node_name if pod.spec is not None else "",
    )


POD_CODEC: Codec[_Pod, PodInfo] = Codec(
    noun="pod",
    list_kind="PodList",
    struct=_Pod,
    convert=_info,
    version_of=lambda pod: pod.metadata.resource_version,
)
"""Pods: namespace, name, uid, labels, phase and node, nothing else."""


def _excerpt(line: bytes | str, limit: int = 120) -> str:
    text = line if isinstance(line, str) else line.decode("utf-8", "replace")
    text = text.strip()
    return repr(text if len(text) <= limit else text[:limit] + "...")
