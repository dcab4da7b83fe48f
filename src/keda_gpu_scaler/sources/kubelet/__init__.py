"""The kubelet PodResources API: which pod and container hold which GPU of this node.

``resources`` says which extended resources are GPUs, ``convert`` turns one ``List`` answer
into device holders (sans-I/O), ``client`` is the one seam to the kubelet's unix socket
(grpclib, errors translated) and ``sampler`` is the actor that polls it on a timer.
``_proto`` is generated from ``protos/kubelet/podresources/v1/api.proto``.
"""

from keda_gpu_scaler.sources.kubelet.client import PodResourcesFailed
from keda_gpu_scaler.sources.kubelet.convert import holders_of
from keda_gpu_scaler.sources.kubelet.resources import (
    DEFAULT_DRA_DRIVERS,
    DEFAULT_RESOURCE_NAMES,
    DraDrivers,
    ResourceNames,
)
from keda_gpu_scaler.sources.kubelet.sampler import (
    DEFAULT_INTERVAL_S,
    PodResourcesSampler,
    default_timeout_s,
)

__all__ = [
    "DEFAULT_DRA_DRIVERS",
    "DEFAULT_INTERVAL_S",
    "DEFAULT_RESOURCE_NAMES",
    "DraDrivers",
    "PodResourcesFailed",
    "PodResourcesSampler",
    "ResourceNames",
    "default_timeout_s",
    "holders_of",
]
