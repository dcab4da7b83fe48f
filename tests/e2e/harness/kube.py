"""A small synchronous client of the real Kubernetes API, for the scenarios' own requests.

The product reads the API through its own sources (kr8s); the scenarios create, change and
delete objects through this client, as ``kubectl`` would: JSON over HTTPS with the run's
administrator certificate (or a ServiceAccount token), server-side apply for manifests, and
the status subresource where a kubelet would write.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

Obj = dict[str, Any]
FIELD_MANAGER = "keda-gpu-scaler-e2e"


class KubeError(Exception):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        super().__init__(f"{method} {path}: {status} {body[:400]}")


@dataclass(frozen=True)
class Resource:
    group_version: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base


class Kube:
    """One API server, one identity."""

    def __init__(
        self,
        server: str,
        ca: Path,
        *,
        client: tuple[Path, Path] | None = None,
        token: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        context = ssl.create_default_context(cafile=str(ca))
        if client:
            context.load_cert_chain(str(client[0]), str(client[1]))
        self._http = httpx.Client(
            base_url=server, verify=context, headers=headers, timeout=timeout_s
        )
        self._resources: dict[tuple[str, str], Resource] = {}

    def close(self) -> None:
        self._http.close()

    # --- raw requests ---------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> Any:
        content = None
        if body is not None:
            content = body if isinstance(body, str | bytes) else json.dumps(body)
        response = self._http.request(
            method,
            path,
            content=content,
            params=params,
            headers={"Content-Type": content_type} if content is not None else None,
        )
        if response.status_code >= 400:
            raise KubeError(method, path, response.status_code, response.text)
        if not response.content:
            return None
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text

    def get(self, path: str, **params: str) -> Any:
        return self.request("GET", path, params=params or None)

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body=body)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body=body)

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body=body, content_type="application/merge-patch+json")

    def delete(self, path: str, *, grace_s: int | None = None) -> Any:
        body = {"gracePeriodSeconds": grace_s} if grace_s is not None else None
        try:
            return self.request("DELETE", path, body=body)
        except KubeError as exc:
            if exc.status != 404:
                raise
            return None

    # --- typed helpers ----------------------------------------------------------------------

    def resource(self, api_version: str, kind: str) -> Resource:
        """The REST resource of a kind, from the API server's discovery."""
        key = (api_version, kind)
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            for entry in self.get(base)["resources"]:
                if "/" not in entry["name"]:
                    found = Resource(api_version, entry["name"], entry["namespaced"])
                    self._resources[(api_version, entry["kind"])] = found
            if key not in self._resources:
                raise KeyError(f"the API serves no {kind} in {api_version}")
        return self._resources[key]

    def path_of(self, obj: Mapping[str, Any]) -> str:
        meta = obj["metadata"]
        resource = self.resource(obj["apiVersion"], obj["kind"])
        return resource.path(meta.get("namespace"), meta["name"])

    def apply(self, obj: Mapping[str, Any], *, namespace: str | None = None) -> Obj:
        """Server-side apply, as ``kubectl apply --server-side --force-conflicts``."""
        obj = json.loads(json.dumps(obj))
        resource = self.resource(obj["apiVersion"], obj["kind"])
        if resource.namespaced and namespace and not obj["metadata"].get("namespace"):
            obj["metadata"]["namespace"] = namespace
        path = self.path_of(obj)
        result: Obj = self.request(
            "PATCH",
            path,
            body=json.dumps(obj),
            content_type="application/apply-patch+yaml",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
        )
        return result

    def apply_all(self, docs: Iterable[Mapping[str, Any]], *, namespace: str | None = None) -> None:
        for doc in docs:
            self.apply(doc, namespace=namespace)

    def apply_yaml(self, text: str, *, namespace: str | None = None) -> None:
        self.apply_all((d for d in yaml.safe_load_all(text) if d), namespace=namespace)

    def wait(
        self,
        what: str,
        check: Callable[[], bool],
        *,
        timeout_s: float = 60.0,
        every_s: float = 0.25,
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
            time.sleep(every_s)
