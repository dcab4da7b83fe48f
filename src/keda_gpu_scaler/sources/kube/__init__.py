"""The Kubernetes API through kr8s: the watch of this node's pods (labels and phase) and
ResourceSlices (what its DRA devices are), and the EndpointSlices a cluster scaler discovers
its agents by.

``client`` is the one seam to kr8s and httpx (credentials, requests, errors translated);
``listwatch`` is the engine that lists, then watches, one collection; ``wire`` decodes the
list and watch format and the pods (sans-I/O), ``endpointslices`` the EndpointSlices and
the agents they list (sans-I/O); ``store`` keeps the objects and paces the readings
(pure); ``pods`` is the actor that publishes this node's pods, ``resourceslices`` the one
that publishes this node's ResourceSlices (the DRA join) and decodes them.
"""

from keda_gpu_scaler.sources.kube.client import SERVICE_ACCOUNT, KubeClient, KubeFailure, KubeGone
from keda_gpu_scaler.sources.kube.listwatch import ListWatch, Resource
from keda_gpu_scaler.sources.kube.pods import (
    DEFAULT_REFRESH_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_WATCH_TIMEOUT_S,
    PERIOD_S,
    PodWatcher,
)
from keda_gpu_scaler.sources.kube.resourceslices import ResourceSliceWatcher

__all__ = [
    "DEFAULT_REFRESH_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_WATCH_TIMEOUT_S",
    "PERIOD_S",
    "SERVICE_ACCOUNT",
    "KubeClient",
    "KubeFailure",
    "KubeGone",
    "ListWatch",
    "PodWatcher",
    "Resource",
    "ResourceSliceWatcher",
]
