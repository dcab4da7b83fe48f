"""The harness's kubelet (and scheduler): what no real kubelet does here, done through the API.

For the pods of the namespaces it is given, it does what the scheduler and a kubelet would
make visible in the API, and nothing more:

- a pod with no node is bound (the ``binding`` subresource) to the node its DaemonSet
  affinity names, else to the next of its nodes in turn;
- a bound, pending pod gets the status a kubelet writes once its containers run: phase
  Running, an address, ``Ready`` and ``ContainersReady`` true, each container running and
  ready (the ``status`` subresource);
- a pod being deleted (``deletionTimestamp`` set) is deleted for good, as a kubelet confirms
  a graceful termination.

So the ReplicaSet, DaemonSet, EndpointSlice and HPA controllers, and KEDA, see pods come up,
become ready and go away as they would on a cluster; the ready-pod counts the HPA uses for
``Value`` metrics are real. Nothing runs in those pods.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from tests.e2e.harness.kube import Kube, KubeError

POLL_S = 0.2


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def ready_status(pod: dict[str, Any], address: str) -> dict[str, Any]:
    """The status a kubelet reports for a pod whose containers all run and are ready."""
    now = _now()
    containers = pod["spec"].get("containers", [])
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": now}
        for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    ]
    return {
        "phase": "Running",
        "hostIP": address,
        "podIP": address,
        "podIPs": [{"ip": address}],
        "startTime": now,
        "conditions": conditions,
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image", "e2e"),
                "imageID": "",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for c in containers
        ],
    }


def affinity_node(pod: dict[str, Any]) -> str | None:
    """The node a DaemonSet pod's required node affinity names (metadata.name), if any."""
    affinity = pod["spec"].get("affinity", {}).get("nodeAffinity", {})
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {})
    for term in required.get("nodeSelectorTerms", []):
        for field in term.get("matchFields", []):
            if field.get("key") == "metadata.name" and field.get("values"):
                return str(field["values"][0])
    return None


class Kubelet:
    """A thread that keeps the pods of ``namespaces`` moving; :meth:`stop` ends it."""

    def __init__(
        self,
        kube: Kube,
        *,
        namespaces: Sequence[str],
        nodes: Sequence[str],
        addresses: Iterator[str],
        node_addresses: dict[str, str] | None = None,
    ) -> None:
        self._kube = kube
        self._namespaces = list(namespaces)
        self._nodes = itertools.cycle(nodes)
        self._addresses = addresses
        self._node_addresses = node_addresses or {}
        self._assigned: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="e2e-kubelet", daemon=True)
        self.errors: list[str] = []
        self.started_pods: list[tuple[float, str]] = []

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def address_of(self, uid: str) -> str | None:
        return self._assigned.get(uid)

    def _run(self) -> None:
        while not self._stop.is_set():
            for namespace in self._namespaces:
                try:
                    self._sync(namespace)
                except (KubeError, OSError) as exc:  # the API restarting: try again next turn
                    self.errors.append(str(exc)[:200])
            self._stop.wait(POLL_S)

    def _sync(self, namespace: str) -> None:
        for pod in self._kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
            self._step(pod)

    def _step(self, pod: dict[str, Any]) -> None:
        meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        if meta.get("deletionTimestamp"):
            self._kube.request(
                "DELETE",
                path,
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
            )
            return
        if not spec.get("nodeName"):
            node = affinity_node(pod) or next(self._nodes)
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
            self._kube.post(f"{path}/binding", binding)
            return
        if status.get("phase", "Pending") == "Pending":
            if spec.get("hostNetwork") and spec["nodeName"] in self._node_addresses:
                address = self._node_addresses[spec["nodeName"]]
            else:
                address = self._assigned.get(meta["uid"]) or next(self._addresses)
            self._assigned[meta["uid"]] = address
            self._kube.put(f"{path}/status", pod | {"status": ready_status(pod, address)})
            self.started_pods.append((time.monotonic(), meta["name"]))
