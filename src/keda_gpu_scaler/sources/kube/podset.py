"""The pods of this node as the list and watch have shown them (pure, no I/O).

A :class:`~keda_gpu_scaler.sources.kube.store.Store` of pods by namespace and name: a pod
whose uid, labels or phase changed is a change, one whose status conditions moved is not
(they are not decoded). :class:`Pacing` decides when they are published.
"""

from __future__ import annotations

from keda_gpu_scaler.domain.samples import PodInfo
from keda_gpu_scaler.sources.kube.store import Pacing, Store

__all__ = ["Pacing", "PodSet", "pod_key"]


def pod_key(pod: PodInfo) -> tuple[str, str]:
    """Pods are kept by namespace, then name."""
    return (pod.namespace, pod.name)


class PodSet(Store[PodInfo]):
    def __init__(self) -> None:
        super().__init__(pod_key)

    def pods(self) -> tuple[PodInfo, ...]:
        """The pods, sorted by namespace then name."""
        return self.items()
