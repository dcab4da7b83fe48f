"""The Kubernetes API: the watch of this node's pods (labels and phase), through kr8s.

``wire`` decodes the list and watch format (sans-I/O), ``podset`` keeps the pods and
paces the readings (pure), ``client`` is the one seam to kr8s and httpx (credentials,
requests, errors translated), and ``pods`` is the actor that lists, then watches.
"""

from keda_gpu_scaler.sources.kube.client import SERVICE_ACCOUNT, KubeClient, KubeFailure, KubeGone
from keda_gpu_scaler.sources.kube.pods import (
    DEFAULT_REFRESH_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_WATCH_TIMEOUT_S,
    PERIOD_S,
    PodWatcher,
    PodWatchStatistics,
)

__all__ = [
    "DEFAULT_REFRESH_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_WATCH_TIMEOUT_S",
    "PERIOD_S",
    "SERVICE_ACCOUNT",
    "KubeClient",
    "KubeFailure",
    "KubeGone",
    "PodWatchStatistics",
    "PodWatcher",
]
