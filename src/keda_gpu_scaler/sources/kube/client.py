"""The Kubernetes API through kr8s: credentials, and one GET at a time.

kr8s finds the credentials as Kubernetes clients do (an explicit kubeconfig, else
``KUBECONFIG`` or ``~/.kube/config``, else the in-cluster service account; bearer tokens,
client certificates, exec plugins), loads them again when the API answers 401 or 403 (a
rotated service-account token), and makes the request over httpx. Its own list and watch
helpers are not used (see ``docs/decisions/0001-kubernetes-client.md``); this module only
makes single requests through ``Api.call_api`` and translates what kr8s and httpx raise,
where they raise it:

    SourceUnavailable   no usable configuration (no kubeconfig, not in a cluster, a
                        kubeconfig that does not load): the supervisor restarts the source
    KubeGone            410 Gone: the resourceVersion asked for has expired; relist
    KubeFailure         anything else (connection, timeout, an error status): the reason
                        names the request and what the API answered; retry with backoff

kr8s is imported when a client first connects, in a worker thread: it takes about half a
second, which a scaler without pod selectors never pays and the event loop never waits.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
import httpx

from keda_gpu_scaler.domain.errors import SourceFailure, SourceUnavailable

if TYPE_CHECKING:
    from kr8s.asyncio import Api

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where Kubernetes mounts a pod's service-account token, CA and namespace."""

_PREFIX = "Kubernetes API"

_TRANSPORT: tuple[tuple[type[httpx.HTTPError], str], ...] = (
    (httpx.ConnectTimeout, "cannot connect in time"),
    (httpx.ReadTimeout, "no answer in time"),
    (httpx.TimeoutException, "timed out"),
    (httpx.ConnectError, "cannot connect"),
    (httpx.RemoteProtocolError, "the connection broke"),
    (httpx.ReadError, "the connection broke"),
    (httpx.HTTPError, "the request failed"),
)
"""httpx exception -> what an operator reads; first match wins, so subclasses come first."""


class KubeFailure(SourceFailure):
    """One request failed; ``reason`` names it and what happened. Retry with backoff."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class KubeGone(KubeFailure):
    """410 Gone: the resourceVersion asked for is no longer kept; list again."""


class KubeClient:
    """One kr8s ``Api`` object and its httpx client, closed by :meth:`aclose`."""

    def __init__(
        self,
        *,
        kubeconfig: str | None = None,
        serviceaccount: str = SERVICE_ACCOUNT,
        timeout_s: float = 10.0,
    ) -> None:
        self._kubeconfig = kubeconfig
        self._serviceaccount = serviceaccount
        self._timeout_s = timeout_s
        self._api: Api | None = None

    @property
    def server(self) -> str:
        """The API server's URL, once :meth:`connect` succeeded."""
        return self._api.auth.server if self._api is not None else ""

    async def connect(self) -> None:
        """Load the credentials and ask the server its version (as kr8s does on start).

        :class:`SourceUnavailable` when there is no usable configuration, :class:`KubeFailure`
        when the server cannot be reached or refuses."""
        if self._kubeconfig is not None:
            path = await anyio.Path(self._kubeconfig).expanduser()
            if not await path.is_file():
                raise SourceUnavailable(f"{_PREFIX}: kubeconfig {self._kubeconfig} does not exist")
        if self._api is None:
            # kr8s takes about half a second to import: not on the event loop.
            await anyio.to_thread.run_sync(importlib.import_module, "kr8s.asyncio")
        api = self._api or self._new_api()
        self._api = api
        try:
            with anyio.fail_after(self._timeout_s):
                # What awaiting kr8s's Api does, less its version check: that warns on every
                # connect when the server is newer than the releases kr8s was tested with,
                # which says nothing an operator can act on (the requests made here, list
                # and watch of stable collections, do not change between releases) and
                # reached standard error as a raw line among the JSON logs.
                await api.auth
                await api.version()
        except TimeoutError as exc:
            raise KubeFailure(
                f"{_PREFIX}: GET /version: no answer within {self._timeout_s:g} s"
            ) from exc
        except Exception as exc:
            raise self._connect_error(exc) from exc

    @asynccontextmanager
    async def get(
        self,
        url: str,
        params: Mapping[str, str],
        *,
        what: str,
        version: str = "v1",
        stream: bool = False,
        read_timeout_s: float | None = None,
    ) -> AsyncIterator[httpx.Response]:
        """GET ``/api/<version>/<url>`` (``/apis/...`` for a group version); a status of 400
        or more raises. ``what`` names the request in failures. With ``stream`` the body is
        read inside the block, each read waiting ``read_timeout_s`` at most."""
        if self._api is None:
            raise RuntimeError("KubeClient.get before connect")
        from kr8s import APITimeoutError, ServerError

        timeout = httpx.Timeout(self._timeout_s, read=read_timeout_s or self._timeout_s)
        entered = False
        try:
            async with self._api.call_api(
                "GET", version=version, url=url, params=dict(params), stream=stream, timeout=timeout
            ) as response:
                entered = True
                yield response
        except (httpx.HTTPError, ServerError, APITimeoutError) as exc:
            raise translate(exc, what, timeout=timeout) from exc
        except (KeyError, ValueError) as exc:
            # kr8s raises these for an error answer without a Status message, or for
            # credentials that no longer load on a 401/403; errors of the block pass on.
            if entered:
                raise
            raise KubeFailure(f"{_PREFIX}: {what}: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        """Close the httpx client (kr8s keeps it in ``Api._session`` and has no close)."""
        session = self._api._session if self._api is not None else None
        if session is not None:
            with anyio.CancelScope(shield=True):
                await session.aclose()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _new_api(self) -> Api:
        # One Api of our own, not kr8s's per-thread cache (kr8s.asyncio.api): this one
        # is closed on exit, and a cached one may be shared with other code.
        from kr8s.asyncio import Api

        return Api(
            bypass_factory=True,
            url=None,
            kubeconfig=self._kubeconfig,
            serviceaccount=self._serviceaccount,
            namespace=None,
            context=None,
        )

    def _connect_error(self, exc: Exception) -> Exception:
        from kr8s import APITimeoutError, ServerError

        if isinstance(exc, httpx.HTTPError | ServerError | APITimeoutError):
            return translate(exc, "GET /version", timeout=httpx.Timeout(self._timeout_s))
        if isinstance(exc, ValueError) and "valid credentials" in str(exc):
            return SourceUnavailable(f"{_PREFIX}: no credentials: {self._where()}")
        return SourceUnavailable(
            f"{_PREFIX}: cannot load the credentials ({self._where()}): {type(exc).__name__}: {exc}"
        )

    def _where(self) -> str:
        if self._kubeconfig is not None:
            kubeconfig = f"kubeconfig {self._kubeconfig}"
        elif "KUBECONFIG" in os.environ:
            kubeconfig = f"KUBECONFIG={os.environ['KUBECONFIG']}"
        else:
            kubeconfig = "KUBECONFIG is unset, ~/.kube/config"
        return (
            f"{kubeconfig} gives no cluster, and there is no service account at "
            f"{self._serviceaccount} (not running in a cluster?)"
        )


def translate(exc: Exception, what: str, *, timeout: httpx.Timeout) -> KubeFailure:
    """The failure an exception of kr8s or httpx means, its reason naming ``what``."""
    from kr8s import APITimeoutError, ServerError

    if isinstance(exc, ServerError) and exc.response is not None:
        response = exc.response
        reason = (
            f"{_PREFIX}: {what} answered {response.status_code} {_reason_phrase(response)}"
            f"{_status_message(response)}"
        )
        return KubeGone(reason) if response.status_code == 410 else KubeFailure(reason)
    if isinstance(exc, APITimeoutError) and isinstance(exc.__cause__, httpx.HTTPError):
        exc = exc.__cause__
    if isinstance(exc, httpx.TimeoutException):
        limit = timeout.connect if isinstance(exc, httpx.ConnectTimeout) else timeout.read
        return KubeFailure(f"{_PREFIX}: {what}: {_phrase(exc)} (limit {limit:g} s)")
    if isinstance(exc, httpx.HTTPError):
        detail = f": {exc}" if str(exc) else ""
        return KubeFailure(f"{_PREFIX}: {what}: {_phrase(exc)}{detail}")
    return KubeFailure(f"{_PREFIX}: {what}: {exc}")


def _phrase(exc: httpx.HTTPError) -> str:
    return next(phrase for kind, phrase in _TRANSPORT if isinstance(exc, kind))


def _reason_phrase(response: httpx.Response) -> str:
    if response.reason_phrase:
        return response.reason_phrase
    try:
        return HTTPStatus(response.status_code).phrase
    except ValueError:
        return ""


def _status_message(response: httpx.Response, limit: int = 300) -> str:
    """The ``message`` of the API's Status answer, or the start of the body."""
    try:
        body = response.content
    except httpx.ResponseNotRead:
        return ""
    try:
        status = json.loads(body)
        message = status.get("message") if isinstance(status, dict) else None
    except ValueError:
        message = None
    text = str(message) if message else body.decode("utf-8", "replace").strip()
    if len(text) > limit:
        text = text[:limit] + "..."
    return f": {text}" if text else ""
