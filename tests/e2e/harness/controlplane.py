"""A real control plane as local processes: etcd, kube-apiserver, kube-controller-manager,
the KEDA operator and KEDA's metrics API server, all built by ``e2e/build.py``.

What a cluster would add and this one does not: no kubelet, no scheduler, no kube-proxy, no
DNS. Nodes are API objects; the harness's :class:`~tests.e2e.harness.kubelet.Kubelet` binds
pods to them and writes their status as a kubelet would. The node lifecycle controller is off
(no kubelet renews the nodes' leases). The aggregation layer reaches KEDA's metrics server
through the API server's endpoint routing (``--enable-aggregator-routing``), which reads the
Service's EndpointSlice: no ClusterIP is ever dialled.
"""

from __future__ import annotations

import datetime
import json
import shutil
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.harness import network, pki
from tests.e2e.harness.kube import Kube, KubeError
from tests.e2e.harness.processes import HarnessError, Process, wait_for

ETCD = "http://127.0.0.1:2379"
APISERVER_PORT = 6443
KCM_PORT = 10257
KEDA_GRPC = "127.0.0.1:9666"
KEDA_PROBES = "127.0.0.1:18081"
KEDA_METRICS_PORT = 6443
ISSUER = "https://kubernetes.default.svc.cluster.local"
HPA_SYNC_S = 15
"""kube-controller-manager's HPA sync period: the controller's default, which the simulator
assumes too."""
START_S = 120.0
"""How long each component may take to become ready on a loaded two-core machine."""
KEDA_NAMESPACE = "keda"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        # The control plane's own components, the harness and KEDA (administrators): not
        # what the scenarios look at.
        {"level": "None", "userGroups": ["system:masters", "system:serviceaccounts:kube-system"]},
        {"level": "None", "users": ["system:kube-controller-manager", "system:apiserver"]},
        # Everything else (the product's ServiceAccounts above all): who asked what.
        {"level": "Metadata"},
    ],
}
"""What the API server records in ``audit.log``: every request of the product's identities,
with its verb, resource and answer, so RBAC scenarios compare what was used with what the
chart grants."""


def _seconds(stamp: str) -> float:
    """An audit event's RFC 3339 time (microseconds) as seconds since the epoch."""
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _http_ok(url: str, *, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@dataclass
class Paths:
    bin: Path
    work: Path
    logs: Path

    def binary(self, name: str) -> Path:
        path = self.bin / name
        if not path.is_file():
            raise HarnessError(f"{path} is missing: run `make e2e` (it builds the components)")
        return path


@dataclass
class ControlPlane:
    """Starts, holds and stops the components; ``admin`` is a client with every right."""

    paths: Paths
    crds: tuple[Path, ...] = ()
    """Folders of CRDs to install before anything else (KEDA's, the ServiceMonitor's)."""
    processes: dict[str, Process] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pki = self.paths.work / "pki"
        self.server = f"https://{network.APISERVER}:{APISERVER_PORT}"

    # --- certificates and identities -----------------------------------------------------

    def _make_pki(self) -> None:
        d = self.pki
        self.ca = pki.authority(d, "cluster-ca")
        self.front_proxy_ca = pki.authority(d, "front-proxy-ca")
        self.keda_ca = pki.authority(d, "keda-ca")
        hosts = [
            network.APISERVER,
            "127.0.0.1",
            "10.96.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ]
        self.serving = pki.issue(
            self.ca, d, "apiserver", "kube-apiserver", hosts=hosts, server=True
        )
        self.admin_pair = pki.issue(
            self.ca, d, "admin", "e2e-admin", organization="system:masters", client=True
        )
        self.kcm_pair = pki.issue(self.ca, d, "kcm", "system:kube-controller-manager", client=True)
        self.front_proxy = pki.issue(
            self.front_proxy_ca, d, "front-proxy-client", "front-proxy-client", client=True
        )
        self.sa = pki.service_account_keys(d)
        keda_hosts = [
            "127.0.0.1",
            network.KEDA_METRICS,
            "localhost",
            f"keda-operator.{KEDA_NAMESPACE}.svc",
            f"keda-operator.{KEDA_NAMESPACE}.svc.cluster.local",
            f"keda-metrics-apiserver.{KEDA_NAMESPACE}.svc",
        ]
        keda = pki.issue(
            self.keda_ca, d / "keda", "tls", "keda", hosts=keda_hosts, server=True, client=True
        )
        shutil.copy(self.keda_ca.pair.cert, d / "keda" / "ca.crt")
        self.keda_certs = keda.cert.parent
        self.admin_kubeconfig = pki.kubeconfig(
            d / "admin.kubeconfig",
            self.server,
            self.ca.pair.cert,
            user="admin",
            client=self.admin_pair,
        )
        self.kcm_kubeconfig = pki.kubeconfig(
            d / "kcm.kubeconfig",
            self.server,
            self.ca.pair.cert,
            user="kube-controller-manager",
            client=self.kcm_pair,
        )
        self.admin = Kube(
            self.server, self.ca.pair.cert, client=(self.admin_pair.cert, self.admin_pair.key)
        )

    def client_for(self, token: str) -> Kube:
        return Kube(self.server, self.ca.pair.cert, token=token)

    def token(self, namespace: str, service_account: str, *, seconds: int = 3600) -> str:
        """A token of a ServiceAccount from the TokenRequest API, as the kubelet mounts one."""
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"}
        request["spec"] = {"expirationSeconds": seconds}  # type: ignore[assignment]
        answer = self.admin.post(path, request)
        return str(answer["status"]["token"])

    def kubeconfig_for(self, namespace: str, service_account: str, path: Path) -> Path:
        token = self.token(namespace, service_account)
        return pki.kubeconfig(
            path, self.server, self.ca.pair.cert, user=f"{namespace}-{service_account}", token=token
        )

    # --- the components ------------------------------------------------------------------

    def _process(
        self, name: str, argv: list[str | Path], env: dict[str, str] | None = None
    ) -> Process:
        process = Process(name, argv, log=self.paths.logs / f"{name}.log", env=env)
        self.processes[name] = process
        return process.start()

    def start_etcd(self) -> None:
        data = self.paths.work / "etcd"
        argv: list[str | Path] = [
            self.paths.binary("etcd"),
            "--name=e2e",
            f"--data-dir={data}",
            f"--listen-client-urls={ETCD}",
            f"--advertise-client-urls={ETCD}",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=e2e=http://127.0.0.1:2380",
            "--log-level=warn",
            "--unsafe-no-fsync",
        ]
        self._process("etcd", argv).wait_ready(
            lambda: _http_ok(f"{ETCD}/health"), timeout_s=START_S
        )

    def _apiserver_argv(self) -> list[str | Path]:
        return [
            self.paths.binary("kube-apiserver"),
            f"--etcd-servers={ETCD}",
            f"--advertise-address={network.APISERVER}",
            f"--bind-address={network.APISERVER}",
            f"--secure-port={APISERVER_PORT}",
            f"--tls-cert-file={self.serving.cert}",
            f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={self.ca.pair.cert}",
            f"--service-account-key-file={self.sa.cert}",
            f"--service-account-signing-key-file={self.sa.key}",
            f"--service-account-issuer={ISSUER}",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={network.SERVICE_CIDR}",
            "--allow-privileged=true",
            f"--requestheader-client-ca-file={self.front_proxy_ca.pair.cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.front_proxy.cert}",
            f"--proxy-client-key-file={self.front_proxy.key}",
            "--enable-aggregator-routing=true",
            f"--audit-policy-file={self._audit_policy()}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
            "--profiling=false",
            "--v=1",
        ]

    @property
    def audit_log(self) -> Path:
        return self.paths.logs / "audit.log"

    def _audit_policy(self) -> Path:
        path = self.paths.work / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(AUDIT_POLICY))
        return path

    def audit_events(self) -> list[dict[str, Any]]:
        """Every request the audit policy records, oldest first."""
        if not self.audit_log.exists():
            return []
        lines = self.audit_log.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def audit_requests(self, user: str, since: float) -> list[dict[str, Any]]:
        """The resource requests ``user`` made since ``since`` (``time.time()``)."""
        return [
            e
            for e in self.audit_events()
            if e["user"]["username"] == user
            and "objectRef" in e
            and _seconds(e["stageTimestamp"]) >= since
        ]

    def apiserver_ready(self) -> bool:
        try:
            self.admin.get("/readyz")
        except (KubeError, OSError, Exception):
            return False
        return True

    def start_apiserver(self) -> None:
        self._process("kube-apiserver", self._apiserver_argv())
        self.processes["kube-apiserver"].wait_ready(self.apiserver_ready, timeout_s=START_S)

    def restart_apiserver(self) -> None:
        self.processes["kube-apiserver"].stop()
        self.start_apiserver()

    def start_controller_manager(self) -> None:
        kubeconfig = self.kcm_kubeconfig
        argv: list[str | Path] = [
            self.paths.binary("kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={KCM_PORT}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.sa.key}",
            f"--root-ca-file={self.ca.pair.cert}",
            "--controllers=*,-node-lifecycle-controller,-node-ipam-controller",
            f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_S}s",
            "--v=1",
        ]
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        url = f"https://127.0.0.1:{KCM_PORT}/healthz"
        self._process("kube-controller-manager", argv).wait_ready(
            lambda: _http_ok(url, context=insecure), timeout_s=START_S
        )

    def _keda_env(self) -> dict[str, str]:
        import os

        return dict(os.environ) | {
            "KUBECONFIG": str(self.admin_kubeconfig),
            "WATCH_NAMESPACE": "",
            "POD_NAMESPACE": KEDA_NAMESPACE,
            "POD_NAME": "keda-operator-e2e",
            "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE,
        }

    def start_keda(self) -> None:
        empty_ca_dir = self.paths.work / "keda-custom-ca"
        empty_ca_dir.mkdir(parents=True, exist_ok=True)
        operator: list[str | Path] = [
            self.paths.binary("keda-operator"),
            "--leader-elect=false",
            "--zap-log-level=info",
            "--zap-encoder=console",
            "--enable-cert-rotation=false",
            f"--cert-dir={self.keda_certs}",
            f"--ca-dir={empty_ca_dir}",
            f"--metrics-service-bind-address={KEDA_GRPC}",
            f"--health-probe-bind-address={KEDA_PROBES}",
            "--metrics-bind-address=127.0.0.1:18080",
        ]
        self._process("keda-operator", operator, self._keda_env()).wait_ready(
            lambda: _http_ok(f"http://{KEDA_PROBES}/readyz"), timeout_s=START_S
        )
        adapter: list[str | Path] = [
            self.paths.binary("keda-adapter"),
            f"--secure-port={KEDA_METRICS_PORT}",
            f"--bind-address={network.KEDA_METRICS}",
            f"--client-ca-file={self.keda_certs / 'ca.crt'}",
            f"--tls-cert-file={self.keda_certs / 'tls.crt'}",
            f"--tls-private-key-file={self.keda_certs / 'tls.key'}",
            f"--cert-dir={self.keda_certs}",
            f"--metrics-service-address={KEDA_GRPC}",
            "--metrics-service-grpc-authority=localhost",
            f"--lister-kubeconfig={self.admin_kubeconfig}",
            f"--authentication-kubeconfig={self.admin_kubeconfig}",
            f"--authorization-kubeconfig={self.admin_kubeconfig}",
            "--zap-log-level=info",
        ]
        self._process("keda-adapter", adapter, self._keda_env())
        self.processes["keda-adapter"].wait_ready(
            self.external_metrics_available, timeout_s=START_S
        )

    def external_metrics_available(self) -> bool:
        try:
            service = self.admin.get(
                "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.external.metrics.k8s.io"
            )
        except (KubeError, OSError):
            return False
        conditions = service.get("status", {}).get("conditions", [])
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)

    # --- objects every scenario expects ---------------------------------------------------

    def bootstrap(self) -> None:
        """The CRDs; KEDA's namespace, APIService and Service; the NVIDIA RuntimeClass."""
        self.admin.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KEDA_NAMESPACE}}
        )
        names = []
        for folder in self.crds:
            for crd in sorted(folder.glob("*.yaml")):
                for doc in yaml.safe_load_all(crd.read_text()):
                    self.admin.apply(doc)
                    names.append(doc["metadata"]["name"])
        self.wait_crds_established(names)
        self.admin.apply(
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": "nvidia"},
                "handler": "nvidia",
            }
        )
        self._register_keda_metrics()

    def wait_crds_established(self, names: list[str]) -> None:
        def is_established(name: str) -> bool:
            crd = self.admin.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            # A CRD just created can answer "conditions": null before the API server sets any.
            conditions = crd.get("status", {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        def established() -> bool:
            return all(is_established(name) for name in names)

        wait_for("the CRDs established", established, timeout_s=60)

    def _register_keda_metrics(self) -> None:
        name = "keda-metrics-apiserver"
        self.admin.apply(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": KEDA_NAMESPACE},
                "spec": {
                    "ports": [{"name": "https", "port": 443, "targetPort": KEDA_METRICS_PORT}]
                },
            }
        )
        self.admin.apply(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{name}-local",
                    "namespace": KEDA_NAMESPACE,
                    "labels": {
                        "kubernetes.io/service-name": name,
                        "endpointslice.kubernetes.io/managed-by": "e2e-harness",
                    },
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [network.KEDA_METRICS], "conditions": {"ready": True}}],
                "ports": [{"name": "https", "port": KEDA_METRICS_PORT, "protocol": "TCP"}],
            }
        )
        import base64

        self.admin.apply(
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
                "spec": {
                    "service": {"name": name, "namespace": KEDA_NAMESPACE, "port": 443},
                    "group": "external.metrics.k8s.io",
                    "version": "v1beta1",
                    "caBundle": base64.b64encode(self.keda_ca.pair.cert.read_bytes()).decode(),
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                },
            }
        )

    def add_node(
        self, name: str, *, labels: dict[str, str] | None = None, address: str | None = None
    ) -> None:
        """A Node object with a Ready status, as a kubelet registers one."""
        node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"} | (labels or {})
        self.admin.apply(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": node_labels}}
        )
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status: dict[str, Any] = {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "8"},
        }
        if address:
            status["addresses"] = [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": name},
            ]
        self.admin.patch(f"/api/v1/nodes/{name}/status", {"status": status})
        # Admission (TaintNodesByCondition) registers a node tainted not-ready; the node
        # lifecycle controller would lift the taint once the node reports Ready, but it is off
        # here (no kubelet renews the node's lease), so the harness lifts it.
        self.admin.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})

    def namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        """A namespace with its ``default`` ServiceAccount (made by the controller manager)."""
        self.admin.apply(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": labels or {}},
            }
        )
        wait_for(
            f"ServiceAccount {name}/default",
            lambda: self.admin.exists(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
            timeout_s=60,
        )

    # --- etcd --------------------------------------------------------------------------------

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (what the API server does every
        five minutes); returns that revision. Watches resumed from before it get 410 Gone."""
        status = self._etcd("/v3/kv/range", {"key": "Lw=="})  # any key: the header's revision
        revision = int(status["header"]["revision"])
        self._etcd("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def _etcd(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            f"{ETCD}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    # --- the whole plane -----------------------------------------------------------------------

    def start(self) -> None:
        network.require_private_namespace()
        self._make_pki()
        self.start_etcd()
        self.start_apiserver()
        self.start_controller_manager()
        self.bootstrap()

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            process.stop()
        if hasattr(self, "admin"):
            self.admin.close()

    def versions(self) -> dict[str, Any]:
        """What the running components say of themselves."""
        version = self.admin.get("/version")
        return {"kube-apiserver": version.get("gitVersion")}
