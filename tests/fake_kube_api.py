"""A fake Kubernetes API server for tests: pods, EndpointSlices and ResourceSlices, list
and watch, on 127.0.0.1.

It speaks the wire format a real API server does, over real HTTP/1.1 (h11 on anyio), so
the code under test runs its real client stack (kr8s, httpx) through a kubeconfig that
:func:`write_kubeconfig` writes::

    async with open_fake_kube_api() as api:
        api.add_pod("ml", "vllm-0", node="node-a", labels={"app": "vllm"})
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        ...  # a client lists and watches /api/v1/pods
        api.update_pod("ml", "vllm-0", labels={"app": "vllm", "tier": "gold"})
        await api.wait_until(lambda: ...)

What it models:

- Pods, with one resourceVersion counter bumped on every change (as etcd's revision).
  A list (``GET /api/v1/pods``, or one namespace's ``/api/v1/namespaces/<ns>/pods``;
  ``fieldSelector=spec.nodeName=...``, ``limit`` and ``continue``) answers a ``PodList``
  with ``metadata.resourceVersion``.
- EndpointSlices (``discovery.k8s.io/v1``), on the same counter and history:
  ``GET /apis/discovery.k8s.io/v1/namespaces/<ns>/endpointslices`` (or every namespace's,
  without ``namespaces/<ns>``) with a ``labelSelector`` of equality terms (``k=v``,
  ``k==v``, ``k!=v``, ``k``, ``!k``, comma-separated), such as
  ``kubernetes.io/service-name=agents``; :func:`slice_endpoint` and :func:`slice_port`
  build their parts.
- ResourceSlices (``resource.k8s.io/v1``, cluster-scoped), on the same counter and history:
  ``GET /apis/resource.k8s.io/v1/resourceslices`` with a ``fieldSelector`` of the fields
  the API server lets one select ResourceSlices by (``spec.nodeName``, ``spec.driver``,
  ``metadata.name``; ``=``, ``==`` or ``!=``, comma-separated: all must hold) and a
  ``labelSelector`` as above; a slice without ``spec.nodeName`` has the empty node name,
  as the API server indexes it. Objects are given whole (``tests/dra_objects.py`` builds
  them in the ``resource.k8s.io/v1`` schema) and kept as given, with the metadata the
  server sets.
- ``?watch=true`` streams one JSON event per line (chunked): the changes after the
  ``resourceVersion`` asked for are replayed from history, then live ones follow, as an
  API server's watch cache does, so a client that resumes misses nothing. An object that
  leaves or joins the selection (a pod moved to another node, a slice relabelled) shows as
  DELETED or ADDED. ``timeoutSeconds`` ends the watch cleanly. :meth:`FakeKubeApi.compact`
  forgets history: a watch from before it is answered 410 Gone (an HTTP status, or an ERROR
  event with ``too_old="event"``).
- Scripts: :meth:`~FakeKubeApi.bookmark`, :meth:`~FakeKubeApi.send_error`,
  :meth:`~FakeKubeApi.end_watches`, :meth:`~FakeKubeApi.drop_connections`,
  :meth:`~FakeKubeApi.fail` (an error status for the next requests, of one namespace's
  collection or of all), a bearer token that
  must be sent, :meth:`~FakeKubeApi.take_down` / :meth:`~FakeKubeApi.bring_up` (nothing
  listens on the port meanwhile) and :meth:`~FakeKubeApi.hang` (connections accepted,
  never answered).
- What kr8s asks when it starts: ``/version`` (by default the release the end-to-end suite
  runs, newer than kr8s's own tested range, as real clusters soon are), and
  minimal discovery (``/api``, ``/api/v1``, ``/apis``, ``/apis/discovery.k8s.io``,
  ``/apis/resource.k8s.io`` and their ``v1``).

Every request is recorded (:attr:`FakeKubeApi.requests`: method, path, query, the
Authorization header) so tests can tell a resumed watch from a relist.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

import anyio
import h11
import yaml
from anyio.abc import SocketAttribute, SocketStream, TaskGroup
from anyio.lowlevel import checkpoint
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from tests.loopback import serve_closing

Json = dict[str, Any]
Target = Literal["list", "watch", "pods", "slices", "resourceslices", "version"]
"""What a scripted failure applies to: lists, watches (of any kind), every pod request,
every EndpointSlice request, every ResourceSlice request, or ``/version``."""
Kind = Literal["pods", "endpointslices", "resourceslices"]

PODS_PATH = "/api/v1/pods"
_PODS_PATH = re.compile(r"/api/v1(?:/namespaces/([^/]+))?/pods")
SLICES_GROUP = "/apis/discovery.k8s.io/v1"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
_SLICES_PATH = re.compile(r"/apis/discovery\.k8s\.io/v1(?:/namespaces/([^/]+))?/endpointslices")
RESOURCE_GROUP = "/apis/resource.k8s.io/v1"
RESOURCE_SLICES_PATH = f"{RESOURCE_GROUP}/resourceslices"
_RESOURCE_SLICE_FIELDS = ("spec.nodeName", "spec.driver", "metadata.name")
"""The fields the API server selects ResourceSlices by (its resourceslice strategy)."""
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    query: Mapping[str, str]
    authorization: str | None

    def is_pods(self) -> bool:
        """A request for pods: of every namespace, or of one (``namespace``)."""
        return _PODS_PATH.fullmatch(self.path) is not None

    @property
    def namespace(self) -> str | None:
        """The namespace in the path of a pod or EndpointSlice request; None for every
        namespace's (or any other request)."""
        found = _PODS_PATH.fullmatch(self.path) or _SLICES_PATH.fullmatch(self.path)
        return found.group(1) if found is not None else None

    def is_slices(self) -> bool:
        return _SLICES_PATH.fullmatch(self.path) is not None

    def is_resource_slices(self) -> bool:
        return self.path == RESOURCE_SLICES_PATH

    def is_collection(self) -> bool:
        """A request for pods, EndpointSlices or ResourceSlices."""
        return self.is_pods() or self.is_slices() or self.is_resource_slices()

    def is_watch(self) -> bool:
        """A watch of pods, EndpointSlices or ResourceSlices."""
        return self.is_collection() and self.query.get("watch") == "true"

    def is_list(self) -> bool:
        """A list of pods, EndpointSlices or ResourceSlices."""
        return self.is_collection() and not self.is_watch()


@dataclass(slots=True)
class _Failure:
    status: int
    message: str
    on: Target
    remaining: float
    namespace: str | None = None

    def applies(self, request: RecordedRequest) -> bool:
        if self.namespace is not None and request.namespace != self.namespace:
            return False
        return _applies(self.on, request)


def _applies(on: Target, request: RecordedRequest) -> bool:
    if on == "version":
        return request.path == "/version"
    if on == "list":
        return request.is_list()
    if on == "watch":
        return request.is_watch()
    if on == "slices":
        return request.is_slices()
    if on == "resourceslices":
        return request.is_resource_slices()
    return request.is_pods()


@dataclass(frozen=True, slots=True)
class _Change:
    kind: Kind
    resource_version: int
    before: Json | None
    after: Json | None


Selects = Callable[[Json | None], bool]
"""Whether an object (None: no object) is in what a list or watch selects."""


class _End:
    """Ends a watch cleanly (the terminating chunk), as ``timeoutSeconds`` does."""


_END = _End()


@dataclass(eq=False, slots=True)
class _Watch:
    kind: Kind
    selects: Selects
    send: MemoryObjectSendStream[bytes | _End]
    receive: MemoryObjectReceiveStream[bytes | _End]


@dataclass(slots=True)
class _Pending:
    request: h11.Request | None = None
    body: bytearray = field(default_factory=bytearray)


class FakeKubeApi:
    """The server's state and scripts; run it with :func:`open_fake_kube_api`."""

    def __init__(
        self,
        *,
        token: str | None = None,
        git_version: str = "v1.37.2",
        too_old: Literal["status", "event"] = "status",
        first_resource_version: int = 100,
    ) -> None:
        self.token = token
        """When set, a request without ``Authorization: Bearer <token>`` is answered 401."""
        self.git_version = git_version
        self.too_old = too_old
        self.requests: list[RecordedRequest] = []
        self.events_sent = 0
        """Lines written on watches, every watch together (events, and raw data sent)."""
        self._rv = first_resource_version
        self._oldest = first_resource_version
        self._objects: dict[Kind, dict[tuple[str, str], Json]] = {
            "pods": {},
            "endpointslices": {},
            "resourceslices": {},
        }
        self._pods = self._objects["pods"]
        self._slices = self._objects["endpointslices"]
        self._resource_slices = self._objects["resourceslices"]
        self._history: list[_Change] = []
        self._list_snapshots: dict[tuple[str, str, str, int], list[Json]] = {}
        self._watches: set[_Watch] = set()
        self._failures: list[_Failure] = []
        self._connections: set[anyio.CancelScope] = set()
        self._hanging = False
        self._hang_on: Target | None = None
        self._uids = 0
        self._port = 0
        self._task_group: TaskGroup | None = None
        self._listening: anyio.CancelScope | None = None
        self._changed = anyio.Event()

    # -- where and what ----------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def resource_version(self) -> str:
        """The current resourceVersion (of the last change)."""
        return str(self._rv)

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def pod_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.is_pods()]

    def slice_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.is_slices()]

    def resource_slice_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.is_resource_slices()]

    def lists(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.is_list()]

    def watches(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.is_watch()]

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Until ``condition()`` holds, checked after every request, watch and change (bound
        the wait with the test's own ``anyio.fail_after``)."""
        while not condition():
            await self._changed.wait()

    # -- pods --------------------------------------------------------------------------

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str | None,
        labels: Mapping[str, str] | None = None,
        phase: str = "Running",
        uid: str | None = None,
    ) -> Json:
        """A new pod (``node`` None: not scheduled yet); returns it as the API shows it."""
        key = (namespace, name)
        if key in self._pods:
            raise ValueError(f"pod {namespace}/{name} exists already")
        uid = uid or self._next_uid()
        pod: Json = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                **({"labels": dict(labels)} if labels else {}),
            },
            "spec": {
                "containers": [{"name": "main", "image": "registry.example/app:1"}],
                **({"nodeName": node} if node is not None else {}),
            },
            "status": {"phase": phase},
        }
        return self._commit("pods", None, pod)

    def update_pod(
        self,
        namespace: str,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        phase: str | None = None,
        node: str | None = None,
    ) -> Json:
        """Change a pod's labels (replaced whole), phase or node; others stay."""
        before = self._pod(namespace, name)
        after = json.loads(json.dumps(before))
        if labels is not None:
            after["metadata"]["labels"] = dict(labels)
        if phase is not None:
            after["status"]["phase"] = phase
        if node is not None:
            after["spec"]["nodeName"] = node
        return self._commit("pods", before, after)

    def touch_pod(self, namespace: str, name: str) -> Json:
        """A change nobody here reads (a status condition): only the resourceVersion moves."""
        before = self._pod(namespace, name)
        after = json.loads(json.dumps(before))
        after["status"].setdefault("conditions", []).append({"type": "Ready", "status": "True"})
        return self._commit("pods", before, after)

    def delete_pod(self, namespace: str, name: str) -> None:
        self._commit("pods", self._pod(namespace, name), None)

    # -- EndpointSlices ------------------------------------------------------------------

    def add_endpoint_slice(
        self,
        namespace: str,
        name: str,
        *,
        service: str | None,
        endpoints: Sequence[Json] = (),
        ports: Sequence[Json] | None = None,
        address_type: str = "IPv4",
        labels: Mapping[str, str] | None = None,
    ) -> Json:
        """A new EndpointSlice of ``service`` (its ``kubernetes.io/service-name`` label; None:
        no such label), with ``endpoints`` (:func:`slice_endpoint`) and ``ports``
        (:func:`slice_port`; None: no ``ports`` field); returns it as the API shows it."""
        if (namespace, name) in self._slices:
            raise ValueError(f"EndpointSlice {namespace}/{name} exists already")
        all_labels = {
            **({SERVICE_NAME_LABEL: service} if service is not None else {}),
            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            **(labels or {}),
        }
        eps: Json = {
            "kind": "EndpointSlice",
            "apiVersion": "discovery.k8s.io/v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": self._next_uid(),
                "generation": 1,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": all_labels,
            },
            "addressType": address_type,
            "endpoints": [dict(endpoint) for endpoint in endpoints] or None,
            **({"ports": [dict(port) for port in ports]} if ports is not None else {}),
        }
        return self._commit("endpointslices", None, eps)

    def update_endpoint_slice(
        self,
        namespace: str,
        name: str,
        *,
        endpoints: Sequence[Json] | None = None,
        ports: Sequence[Json] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Json:
        """Replace a slice's endpoints, ports or labels (each whole); others stay."""
        before = self._slice(namespace, name)
        after = json.loads(json.dumps(before))
        if endpoints is not None:
            after["endpoints"] = [dict(endpoint) for endpoint in endpoints] or None
        if ports is not None:
            after["ports"] = [dict(port) for port in ports]
        if labels is not None:
            after["metadata"]["labels"] = dict(labels)
        after["metadata"]["generation"] += 1
        return self._commit("endpointslices", before, after)

    def touch_endpoint_slice(self, namespace: str, name: str) -> Json:
        """A change nobody here reads (an endpoint's zone): only the resourceVersion moves."""
        before = self._slice(namespace, name)
        after = json.loads(json.dumps(before))
        for endpoint in after["endpoints"] or ():
            endpoint["zone"] = "zone-b" if endpoint.get("zone") == "zone-a" else "zone-a"
        return self._commit("endpointslices", before, after)

    def delete_endpoint_slice(self, namespace: str, name: str) -> None:
        self._commit("endpointslices", self._slice(namespace, name), None)

    # -- ResourceSlices -----------------------------------------------------------------

    def add_resource_slice(self, resource_slice: Json) -> Json:
        """A new ResourceSlice, given whole (``tests/dra_objects.py``); returns it as the API
        shows it (uid, creationTimestamp, generation and resourceVersion set)."""
        name = resource_slice["metadata"]["name"]
        if ("", name) in self._resource_slices:
            raise ValueError(f"ResourceSlice {name} exists already")
        created = json.loads(json.dumps(resource_slice))
        created["metadata"].update(
            uid=self._next_uid(), generation=1, creationTimestamp="2026-01-01T00:00:00Z"
        )
        return self._commit("resourceslices", None, created)

    def replace_resource_slice(self, resource_slice: Json) -> Json:
        """Replace a ResourceSlice's spec (a driver republishing it), keeping its metadata."""
        before = self._resource_slice(resource_slice["metadata"]["name"])
        after = json.loads(json.dumps(before))
        after["spec"] = json.loads(json.dumps(resource_slice["spec"]))
        after["metadata"]["generation"] += 1
        return self._commit("resourceslices", before, after)

    def delete_resource_slice(self, name: str) -> None:
        self._commit("resourceslices", self._resource_slice(name), None)

    def compact(self) -> None:
        """Forget the history (etcd compaction): watches and list pages from before now are
        answered 410 Gone."""
        self._oldest = self._rv
        self._history.clear()
        self._list_snapshots.clear()

    # -- scripts for open watches and requests -----------------------------------------

    def bookmark(self) -> None:
        """Send every open watch a BOOKMARK at the current resourceVersion."""
        meta = _bookmark_meta(self._rv)
        self._to_watches(lambda watch: _line("BOOKMARK", {**_TYPE[watch.kind], "metadata": meta}))

    def send_error(self, code: int = 410, message: str | None = None) -> None:
        """Send every open watch an ERROR event with a Status, then end it."""
        text = message or f"too old resource version: {self._oldest - 1} ({self._rv})"
        status = _status(code, text)
        self._to_watches(lambda _: _line("ERROR", status))
        self.end_watches()

    def send_raw(self, data: bytes) -> None:
        """Send every open watch ``data`` as it is (bad JSON, say)."""
        self._to_watches(lambda _: data)

    def end_watches(self) -> None:
        """End every open watch cleanly, as ``timeoutSeconds`` would."""
        for watch in self._watches:
            watch.send.send_nowait(_END)

    def drop_connections(self) -> None:
        """Close every connection at once, mid-stream, without a terminating chunk."""
        for scope in self._connections:
            scope.cancel()

    def fail(
        self,
        status: int,
        message: str | None = None,
        *,
        on: Target = "pods",
        count: int | None = None,
        namespace: str | None = None,
    ) -> None:
        """Answer ``status`` with a Status object to the next ``count`` requests ``on``
        (None: until :meth:`heal`); with ``namespace``, only to the requests of that
        namespace's collection (``/api/v1/namespaces/<ns>/pods``, ...)."""
        text = message or f"the fake API answers {status}"
        remaining = math.inf if count is None else count
        self._failures.append(_Failure(status, text, on, remaining, namespace))

    def heal(self) -> None:
        """Forget every scripted failure and stop hanging."""
        self._failures.clear()
        self._hanging = False

    def hang(self, *, on: Target | None = None) -> None:
        """Accept connections and read requests (those ``on``, or all) but never answer
        them, until :meth:`heal`."""
        self._hanging = True
        self._hang_on = on

    async def take_down(self) -> None:
        """Stop listening and drop every connection: connecting is refused."""
        if self._listening is not None:
            self._listening.cancel()
            self._listening = None
        self.drop_connections()
        await checkpoint()

    async def bring_up(self) -> None:
        """Listen again on the same port."""
        if self._listening is None:
            await self._listen()

    # -- serving -----------------------------------------------------------------------

    async def _listen(self) -> None:
        assert self._task_group is not None
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=self._port)
        self._port = listener.extra(SocketAttribute.local_port)
        scope = anyio.CancelScope()
        self._listening = scope
        task_group = self._task_group

        async def serve() -> None:
            with scope:
                async with listener:
                    await serve_closing(listener, self._connection, task_group)

        task_group.start_soon(serve)

    async def _connection(self, stream: SocketStream) -> None:
        scope = anyio.CancelScope()
        self._connections.add(scope)
        try:
            with scope:
                async with stream:
                    await self._exchanges(stream)
        except (anyio.BrokenResourceError, h11.RemoteProtocolError, ConnectionError):
            pass
        finally:
            self._connections.discard(scope)
            self._notify()

    async def _exchanges(self, stream: SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            request = await _read_request(conn, stream)
            if request is None:
                return
            recorded = self._record(request)
            if self._hanging and (self._hang_on is None or _applies(self._hang_on, recorded)):
                await anyio.sleep_forever()
            await self._respond(conn, stream, recorded)
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    def _record(self, request: h11.Request) -> RecordedRequest:
        target = urlsplit(request.target.decode())
        headers = {name.decode().lower(): value.decode() for name, value in request.headers}
        recorded = RecordedRequest(
            method=request.method.decode(),
            path=target.path.rstrip("/") or "/",
            query=dict(parse_qsl(target.query, keep_blank_values=True)),
            authorization=headers.get("authorization"),
        )
        self.requests.append(recorded)
        self._notify()
        return recorded

    async def _respond(
        self, conn: h11.Connection, stream: SocketStream, req: RecordedRequest
    ) -> None:
        if self.token is not None and req.authorization != f"Bearer {self.token}":
            return await _send_json(conn, stream, 401, _status(401, "Unauthorized"))
        for failure in self._failures:
            if failure.remaining > 0 and failure.applies(req):
                failure.remaining -= 1
                status = _status(failure.status, failure.message)
                return await _send_json(conn, stream, failure.status, status)
        if req.method != "GET":
            return await _send_json(conn, stream, 405, _status(405, "only GET here"))
        if req.is_collection():
            if req.is_watch():
                return await self._watch(conn, stream, req)
            code, listed = self._list(req)
            return await _send_json(conn, stream, code, listed)
        found = self._discovery(req.path)
        if found is None:
            return await _send_json(conn, stream, 404, _status(404, f"{req.path} not found"))
        return await _send_json(conn, stream, 200, found)

    def _discovery(self, path: str) -> Json | None:
        if path == "/version":
            major, minor = self.git_version.lstrip("v").split(".")[:2]
            return {
                "major": major,
                "minor": minor,
                "gitVersion": self.git_version,
                "gitCommit": "0" * 40,
                "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.24.0",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self._port}"}
                ],
            }
        if path == "/api/v1":
            verbs = ["get", "list", "watch"]
            pods = {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod"}
            return {
                "kind": "APIResourceList",
                "groupVersion": "v1",
                "resources": [{**pods, "verbs": verbs, "shortNames": ["po"]}],
            }
        if path == "/apis":
            groups = [_DISCOVERY_GROUP, _RESOURCE_GROUP]
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        if path == "/apis/discovery.k8s.io":
            return {"kind": "APIGroup", "apiVersion": "v1", **_DISCOVERY_GROUP}
        if path == "/apis/resource.k8s.io":
            return {"kind": "APIGroup", "apiVersion": "v1", **_RESOURCE_GROUP}
        if path == RESOURCE_GROUP:
            return {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": "resource.k8s.io/v1",
                "resources": [
                    {
                        "name": "resourceslices",
                        "singularName": "resourceslice",
                        "namespaced": False,
                        "kind": "ResourceSlice",
                        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                    }
                ],
            }
        if path == SLICES_GROUP:
            verbs = ["get", "list", "watch"]
            return {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": "discovery.k8s.io/v1",
                "resources": [
                    {
                        "name": "endpointslices",
                        "singularName": "endpointslice",
                        "namespaced": True,
                        "kind": "EndpointSlice",
                        "verbs": verbs,
                    }
                ],
            }
        return None

    def _list(self, req: RecordedRequest) -> tuple[int, Json]:
        try:
            kind, selects = _selection(req)
        except ValueError as exc:
            return 400, _status(400, str(exc))
        token = req.query.get("continue")
        if token:
            version, offset = _decode_token(token)
            items = self._list_snapshots.get(_pages_key(req, version))
            if items is None:
                return 410, _status(410, "the provided continue parameter is too old")
        else:
            version, offset = self._rv, 0
            items = [obj for _, obj in sorted(self._objects[kind].items()) if selects(obj)]
            items = json.loads(json.dumps(items))
        limit = int(req.query.get("limit") or 0)
        end = offset + limit if limit else len(items)
        metadata: Json = {"resourceVersion": str(version)}
        if end < len(items):
            self._list_snapshots[_pages_key(req, version)] = items
            metadata["continue"] = _encode_token(version, end)
            metadata["remainingItemCount"] = len(items) - end
        page = {**_LIST_TYPE[kind], "metadata": metadata}
        return 200, {**page, "items": items[offset:end]}

    async def _watch(
        self, conn: h11.Connection, stream: SocketStream, req: RecordedRequest
    ) -> None:
        try:
            kind, selects = _selection(req)
        except ValueError as exc:
            return await _send_json(conn, stream, 400, _status(400, str(exc)))
        asked = req.query.get("resourceVersion", "")
        start = int(asked) if asked not in ("", "0") else None
        too_old = start is not None and start < self._oldest
        if too_old and self.too_old == "status":
            message = f"too old resource version: {start} ({self._oldest})"
            return await _send_json(conn, stream, 410, _status(410, message))
        # Replay and registration happen with no await between them: no change is missed.
        backlog = self._backlog(kind, start, selects) if not too_old else []
        if too_old:
            backlog = [_line("ERROR", _status(410, f"too old resource version: {start}"))]
        send, receive = anyio.create_memory_object_stream[bytes | _End](math.inf)
        watch = _Watch(kind, selects, send, receive)
        if too_old:
            send.send_nowait(_END)
        self._watches.add(watch)
        self._notify()
        timeout = float(req.query.get("timeoutSeconds") or math.inf)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_end_on_hangup, conn, stream, tg.cancel_scope)
                await _send(conn, stream, _chunked_ok())
                for line in backlog:
                    await _send(conn, stream, h11.Data(data=line))
                    self.events_sent += 1
                with anyio.move_on_after(timeout):
                    async for item in receive:
                        if isinstance(item, _End):
                            break
                        await _send(conn, stream, h11.Data(data=item))
                        self.events_sent += 1
                await _send(conn, stream, h11.EndOfMessage())
                tg.cancel_scope.cancel()
        finally:
            self._watches.discard(watch)
            send.close()
            receive.close()
            self._notify()

    def _backlog(self, kind: Kind, start: int | None, selects: Selects) -> list[bytes]:
        if start is None:
            # No resourceVersion: the current state as ADDED events, as a real server does.
            objects = [obj for _, obj in sorted(self._objects[kind].items()) if selects(obj)]
            return [_line("ADDED", obj) for obj in objects]
        changes = (c for c in self._history if c.resource_version > start and c.kind == kind)
        return [line for c in changes if (line := _render(c, selects)) is not None]

    # -- state -------------------------------------------------------------------------

    def _pod(self, namespace: str, name: str) -> Json:
        try:
            return self._pods[(namespace, name)]
        except KeyError:
            raise ValueError(f"no pod {namespace}/{name}") from None

    def _slice(self, namespace: str, name: str) -> Json:
        try:
            return self._slices[(namespace, name)]
        except KeyError:
            raise ValueError(f"no EndpointSlice {namespace}/{name}") from None

    def _resource_slice(self, name: str) -> Json:
        try:
            return self._resource_slices[("", name)]
        except KeyError:
            raise ValueError(f"no ResourceSlice {name}") from None

    def _next_uid(self) -> str:
        self._uids += 1
        return f"00000000-0000-4000-8000-{self._uids:012d}"

    def _commit(self, kind: Kind, before: Json | None, after: Json | None) -> Json:
        self._rv += 1
        objects = self._objects[kind]
        if after is not None:
            after["metadata"]["resourceVersion"] = str(self._rv)
            objects[_key(after)] = after
        elif before is not None:
            del objects[_key(before)]
        change = _Change(kind, self._rv, before, after)
        self._history.append(change)
        self._to_watches(
            lambda watch: _render(change, watch.selects) if watch.kind == kind else None
        )
        self._notify()
        result = after if after is not None else before
        assert result is not None
        return result

    def _to_watches(self, line_for: Callable[[_Watch], bytes | None]) -> None:
        for watch in self._watches:
            line = line_for(watch)
            if line is not None:
                watch.send.send_nowait(line)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()


@asynccontextmanager
async def open_fake_kube_api(**options: Any) -> AsyncIterator[FakeKubeApi]:
    """A :class:`FakeKubeApi` listening on 127.0.0.1 (an ephemeral port) until exit;
    ``options`` are its keyword arguments."""
    api = FakeKubeApi(**options)
    async with anyio.create_task_group() as task_group:
        api._task_group = task_group
        await api._listen()
        try:
            yield api
        finally:
            task_group.cancel_scope.cancel()


def write_kubeconfig(
    path: Path,
    server_url: str,
    namespace: str = "default",
    token: str = "fake-token",
) -> Path:
    """A kubeconfig at ``path`` whose one context reaches ``server_url`` with a bearer
    ``token`` (kr8s speaks plain http to an ``http://`` server: no certificate needed)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server_url}}],
        "users": [{"name": "fake", "user": {"token": token}}],
        "contexts": [
            {"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}
        ],
        "current-context": "fake",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def slice_endpoint(
    *addresses: str,
    node: str | None = None,
    pod: str | None = None,
    namespace: str = "gpu",
    ready: bool | None = True,
    serving: bool | None = None,
    terminating: bool | None = None,
) -> Json:
    """One endpoint of an EndpointSlice, as the EndpointSlice controller writes it: a
    condition given as None is left out (the API's nil); ``serving`` defaults to ``ready``
    and ``terminating`` to false when neither is given."""
    if serving is None and terminating is None:
        serving, terminating = ready, False
    conditions = {
        name: value
        for name, value in (("ready", ready), ("serving", serving), ("terminating", terminating))
        if value is not None
    }
    endpoint: Json = {"addresses": list(addresses), "conditions": conditions}
    if pod is not None:
        endpoint["targetRef"] = {"kind": "Pod", "namespace": namespace, "name": pod, "uid": ""}
    if node is not None:
        endpoint["nodeName"] = node
    return endpoint


def slice_port(port: int | None, name: str = "", protocol: str = "TCP") -> Json:
    """One port of an EndpointSlice (``port`` None: all ports)."""
    return {"name": name, "protocol": protocol, **({"port": port} if port is not None else {})}


_TYPE: dict[Kind, Json] = {
    "pods": {"kind": "Pod", "apiVersion": "v1"},
    "endpointslices": {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1"},
    "resourceslices": {"kind": "ResourceSlice", "apiVersion": "resource.k8s.io/v1"},
}
_LIST_TYPE: dict[Kind, Json] = {
    "pods": {"kind": "PodList", "apiVersion": "v1"},
    "endpointslices": {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1"},
    "resourceslices": {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1"},
}
_DISCOVERY_GROUP: Json = {
    "name": "discovery.k8s.io",
    "versions": [{"groupVersion": "discovery.k8s.io/v1", "version": "v1"}],
    "preferredVersion": {"groupVersion": "discovery.k8s.io/v1", "version": "v1"},
}


_RESOURCE_GROUP: Json = {
    "name": "resource.k8s.io",
    "versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}],
    "preferredVersion": {"groupVersion": "resource.k8s.io/v1", "version": "v1"},
}


def _key(obj: Json) -> tuple[str, str]:
    """Objects by namespace and name (a cluster-scoped one's namespace is empty)."""
    return (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def _selection(req: RecordedRequest) -> tuple[Kind, Selects]:
    """The collection a list or watch reads and what it selects; ValueError for a selector
    this fake does not serve (answered 400, as an API server answers one it cannot parse)."""
    if req.is_resource_slices():
        fields = _field_selector(req.query.get("fieldSelector", ""), _RESOURCE_SLICE_FIELDS)
        labels = _label_selector(req.query.get("labelSelector", ""))

        def selects_resource_slice(obj: Json | None) -> bool:
            if obj is None:
                return False
            values = {
                "spec.nodeName": obj["spec"].get("nodeName") or "",
                "spec.driver": obj["spec"]["driver"],
                "metadata.name": obj["metadata"]["name"],
            }
            return fields(values) and labels(obj["metadata"].get("labels") or {})

        return "resourceslices", selects_resource_slice
    if req.is_pods():
        node = _node_of(req.query.get("fieldSelector", ""))
        namespace = req.namespace

        def selects_pod(pod: Json | None) -> bool:
            in_namespace = pod is not None and (
                namespace is None or pod["metadata"]["namespace"] == namespace
            )
            return in_namespace and _on_node(pod, node)

        return "pods", selects_pod
    found = _SLICES_PATH.fullmatch(req.path)
    assert found is not None
    namespace = found.group(1)
    if req.query.get("fieldSelector"):
        raise ValueError(f'field label not supported here: "{req.query["fieldSelector"]}"')
    matches = _label_selector(req.query.get("labelSelector", ""))

    def selects(obj: Json | None) -> bool:
        if obj is None:
            return False
        in_namespace = namespace is None or obj["metadata"]["namespace"] == namespace
        return in_namespace and matches(obj["metadata"].get("labels") or {})

    return "endpointslices", selects


_TERM = re.compile(r"(!?)([^=!\s]+)(?:\s*(==|!=|=)\s*(\S*))?")


def _label_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """Equality-based terms only: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``."""
    terms: list[tuple[bool, str, str | None, str]] = []
    for term in filter(None, (t.strip() for t in selector.split(","))):
        found = _TERM.fullmatch(term)
        if found is None:
            raise ValueError(f"unable to parse requirement: {term!r} (not served here)")
        bang, key, op, value = found.groups()
        terms.append((bool(bang), key, op, value or ""))

    def matches(labels: Mapping[str, str]) -> bool:
        for absent, key, op, value in terms:
            if op is None and (key in labels) == absent:
                return False
            if op == "!=" and labels.get(key) == value:
                return False
            if op in ("=", "==") and labels.get(key) != value:
                return False
        return True

    return matches


_FIELD_TERM = re.compile(r"([A-Za-z.]+)(==|!=|=)(.*)")


def _field_selector(selector: str, allowed: Sequence[str]) -> Callable[[Mapping[str, str]], bool]:
    """``field=value``, ``field==value``, ``field!=value``, comma-separated, over the fields
    ``allowed``; ValueError (answered 400) for another field, as the API server refuses one
    (``field label not supported``)."""
    terms: list[tuple[str, bool, str]] = []
    for term in filter(None, (t.strip() for t in selector.split(","))):
        found = _FIELD_TERM.fullmatch(term)
        if found is None:
            raise ValueError(f"invalid selector: {term!r}; can't understand {term!r}")
        name, op, value = found.groups()
        if name not in allowed:
            raise ValueError(f'field label not supported: "{name}"')
        terms.append((name, op == "!=", value))

    def matches(values: Mapping[str, str]) -> bool:
        return all((values[name] == value) != negated for name, negated, value in terms)

    return matches


def _pages_key(req: RecordedRequest, version: int) -> tuple[str, str, str, int]:
    """Which list a page belongs to: the collection, its selectors, and its version."""
    query = req.query
    return (req.path, query.get("fieldSelector", ""), query.get("labelSelector", ""), version)


def _on_node(pod: Json | None, node: str | None) -> bool:
    if pod is None:
        return False
    return node is None or pod["spec"].get("nodeName") == node


def _render(change: _Change, selects: Selects) -> bytes | None:
    """The event a watch selecting with ``selects`` sees for ``change``, if any."""
    was, now = selects(change.before), selects(change.after)
    if was and now:
        return _line("MODIFIED", change.after)
    if now:
        return _line("ADDED", change.after)
    if was:
        last = json.loads(json.dumps(change.before))
        last["metadata"]["resourceVersion"] = str(change.resource_version)
        return _line("DELETED", last)
    return None


def _node_of(selector: str) -> str | None:
    """The node of ``spec.nodeName=<node>`` (the only field selector served here)."""
    if not selector:
        return None
    field_name, sep, value = selector.partition("=")
    if field_name != "spec.nodeName" or not sep or "," in value:
        raise ValueError(f'field label not supported here: "{selector}"')
    return value


def _bookmark_meta(resource_version: int) -> Json:
    return {
        "resourceVersion": str(resource_version),
        "annotations": {"k8s.io/initial-events-end": "true"},
    }


def _status(code: int, message: str) -> Json:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": _REASONS.get(code, "Unknown"),
        "code": code,
    }


def _line(kind: str, obj: Json | None) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _encode_token(version: int, offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps([version, offset]).encode()).decode()


def _decode_token(token: str) -> tuple[int, int]:
    version, offset = json.loads(base64.urlsafe_b64decode(token.encode()))
    return int(version), int(offset)


def _chunked_ok() -> h11.Response:
    headers = [("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")]
    return h11.Response(status_code=200, headers=headers, reason=b"OK")


async def _send_json(conn: h11.Connection, stream: SocketStream, status: int, body: Json) -> None:
    data = json.dumps(body).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    response = h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase)
    await _send(conn, stream, response)
    await _send(conn, stream, h11.Data(data=data))
    await _send(conn, stream, h11.EndOfMessage())


async def _send(conn: h11.Connection, stream: SocketStream, event: h11.Event) -> None:
    data = conn.send(event)
    if data:
        await stream.send(data)


async def _end_on_hangup(
    conn: h11.Connection, stream: SocketStream, watch: anyio.CancelScope
) -> None:
    """While a watch streams, notice the client going away (as a server does, by reading):
    bytes that come are kept for h11, the end of the stream ends the watch."""
    while True:
        try:
            conn.receive_data(await stream.receive())
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            conn.receive_data(b"")
            watch.cancel()
            return


async def _read_request(conn: h11.Connection, stream: SocketStream) -> h11.Request | None:
    """The next request, read to its end; None when the client closed the connection."""
    pending = _Pending()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            try:
                conn.receive_data(await stream.receive())
            except anyio.EndOfStream:
                conn.receive_data(b"")
            continue
        if isinstance(event, h11.Request):
            pending.request = event
        elif isinstance(event, h11.Data):
            pending.body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return pending.request
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None
