"""PodNamespaces: the namespaces a cluster scaler's pod watch covers, and how they grow.

``--pod-namespaces`` sets it:

    triggers   (the default) none at first; the namespace of each ``podSelector`` trigger
               joins as the decider first parses it (KEDA's GetMetricSpec), so its pods are
               being listed before the first value is asked for
    all        every namespace, one watch of ``/api/v1/pods``
    a,b,...    these namespaces, fixed

The pod watch follows it (:meth:`PodNamespaces.wait_changed`); the decider reads it to tell
whether a namespace's pods are coming (worth the first-sample wait) or never will.

It never shrinks (a trigger KEDA stops sending leaves its watch in place), and it is
bounded: past ``limit`` namespaces (1024) it becomes every namespace, one watch of all of
them instead of a thousand watches of one each, logged once as a warning. That watch needs
list and watch on pods cluster-wide, as the cluster overlay's ClusterRole grants.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import anyio

from keda_gpu_scaler.domain.names import is_namespace

log = logging.getLogger(__name__)

MAX_POD_NAMESPACES = 1024
"""Namespaces watched one by one at most; past it, one watch of every namespace."""

TRIGGERS = "triggers"
ALL = "all"


class PodNamespaces:
    """Which namespaces' pods are watched; see the module docstring. Build one with
    :meth:`triggers`, :meth:`every`, :meth:`listed` or :meth:`parse`."""

    def __init__(
        self, names: frozenset[str] | None, *, on_demand: bool, limit: int = MAX_POD_NAMESPACES
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self._names = names
        self._on_demand = on_demand
        self._limit = limit
        self._version = 0
        self._changed = anyio.Event()

    @classmethod
    def triggers(cls, *, limit: int = MAX_POD_NAMESPACES) -> PodNamespaces:
        """The namespaces triggers name, as they come (``--pod-namespaces triggers``)."""
        return cls(frozenset(), on_demand=True, limit=limit)

    @classmethod
    def every(cls) -> PodNamespaces:
        """Every namespace (``--pod-namespaces all``)."""
        return cls(None, on_demand=False)

    @classmethod
    def listed(cls, names: Iterable[str]) -> PodNamespaces:
        """These namespaces and no other (``--pod-namespaces a,b``); raises ``ValueError``
        naming a name that is not a namespace's."""
        chosen = frozenset(names)
        if not chosen:
            raise ValueError("no namespace given")
        for name in sorted(chosen):
            if not is_namespace(name):
                raise ValueError(f"{name!r} is not a namespace name (RFC 1123 label)")
        if len(chosen) > MAX_POD_NAMESPACES:
            raise ValueError(
                f"{len(chosen)} namespaces: at most {MAX_POD_NAMESPACES} are watched one by "
                f"one (use {ALL})"
            )
        return cls(chosen, on_demand=False)

    @classmethod
    def parse(cls, text: str) -> PodNamespaces:
        """``triggers``, ``all``, or namespaces separated by commas; raises ``ValueError``
        saying what is wrong with ``text``."""
        words = [w.strip() for w in text.split(",") if w.strip()]
        if words == [TRIGGERS]:
            return cls.triggers()
        if words == [ALL]:
            return cls.every()
        if not words:
            raise ValueError(f"{text!r}: give {TRIGGERS}, {ALL}, or namespaces separated by commas")
        for word in (TRIGGERS, ALL):
            if word in words:
                raise ValueError(f"{text!r}: {word} stands alone, not in a list of namespaces")
        return cls.listed(words)

    @property
    def names(self) -> frozenset[str] | None:
        """The namespaces to watch now; None: every namespace."""
        return self._names

    @property
    def on_demand(self) -> bool:
        """More namespaces join as triggers name them."""
        return self._on_demand

    @property
    def version(self) -> int:
        """Counts the changes of :attr:`names`."""
        return self._version

    def watches(self, namespace: str) -> bool:
        """Whether ``namespace``'s pods are (or are being) watched."""
        return self._names is None or namespace in self._names

    def require(self, namespace: str) -> None:
        """A trigger reads ``namespace``'s pods: watch it from now on (with
        ``triggers``; a fixed choice stays as it is). A name that is not a namespace's
        names no pods and is never watched."""
        names = self._names
        if not self._on_demand or names is None or namespace in names:
            return
        if not is_namespace(namespace):
            return
        if len(names) >= self._limit:
            log.warning(
                "pod watch covers every namespace from now on",
                extra={
                    "namespaces": len(names) + 1,
                    "limit": self._limit,
                    "detail": f"more than {self._limit} namespaces named by triggers: one "
                    "watch of all namespaces replaces one each (it needs list and watch "
                    "on pods cluster-wide)",
                },
            )
            self._changed_to(None)
        else:
            self._changed_to(names | {namespace})

    async def wait_changed(self, version: int) -> None:
        """Return once :attr:`version` is past ``version`` (at once if it is)."""
        while self._version == version:
            await self._changed.wait()

    def _changed_to(self, names: frozenset[str] | None) -> None:
        self._names = names
        self._version += 1
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    def __str__(self) -> str:
        """As ``--pod-namespaces`` would say it."""
        if self._on_demand:
            return TRIGGERS
        if self._names is None:
            return ALL
        return ",".join(sorted(self._names))
