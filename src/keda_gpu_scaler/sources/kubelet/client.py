"""The one seam to the kubelet: ``List`` over its unix socket with grpclib.

grpclib's and the operating system's errors end here, translated by table into
:class:`PodResourcesFailed` whose message names the socket and says what to check. A
channel that failed is dropped and the next call opens a new one, so a kubelet that
restarts (its socket removed, then created again) is reached again without help.
grpclib runs on asyncio only.
"""

from __future__ import annotations

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError

from keda_gpu_scaler.domain.errors import SourceFailure
from keda_gpu_scaler.sources.kubelet._proto.v1 import (
    ListPodResourcesResponse,
    PodResourcesListerStub,
)


class PodResourcesFailed(SourceFailure):
    """One ``List`` failed; the message names the socket and the cause. Retry next tick."""

    def __init__(self, socket_path: str, detail: str, *, rate_limited: bool = False) -> None:
        self.socket_path = socket_path
        self.detail = detail
        self.rate_limited = rate_limited
        super().__init__(detail)


_OS_HINTS: tuple[tuple[type[OSError], str], ...] = (
    (
        FileNotFoundError,
        "no socket there: mount the kubelet's pod-resources directory into this pod "
        "(read-only is enough), or the kubelet is restarting",
    ),
    (ConnectionRefusedError, "connection refused: the kubelet is not listening (restarting?)"),
    (PermissionError, "permission denied: the kubelet's socket is owned by root"),
)


class PodResourcesClient:
    """Calls ``List`` on ``socket_path``, each call bounded by ``timeout_s``."""

    def __init__(self, socket_path: str, *, timeout_s: float) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel: Channel | None = None

    async def list(self) -> ListPodResourcesResponse:
        """Raises :class:`PodResourcesFailed` for whatever kept the answer from coming."""
        if self._channel is None:
            self._channel = Channel(path=self.socket_path)
        stub = PodResourcesListerStub(self._channel)
        try:
            return await stub.list(timeout=self.timeout_s)
        except GRPCError as exc:
            # Any other status is an answer: the connection is sound and is kept.
            if exc.status is Status.UNAVAILABLE:
                self.close()
            raise self._grpc_failure(exc) from exc
        except (OSError, ProtocolError, StreamTerminatedError) as exc:
            self.close()
            raise PodResourcesFailed(self.socket_path, self._transport_detail(exc)) from exc

    def close(self) -> None:
        """Closes the connection, if any; the next :meth:`list` opens a new one."""
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()

    def _grpc_failure(self, exc: GRPCError) -> PodResourcesFailed:
        said = f"{exc.status.name}: {exc.message}" if exc.message else exc.status.name
        if exc.status is Status.RESOURCE_EXHAUSTED:
            detail = (
                f"the kubelet rate-limited the socket {self.socket_path} ({said}); "
                "another client may be calling it too often"
            )
            return PodResourcesFailed(self.socket_path, detail, rate_limited=True)
        if exc.status is Status.UNIMPLEMENTED:
            detail = f"{self.socket_path} does not serve PodResourcesLister v1 List ({said})"
        elif exc.status is Status.DEADLINE_EXCEEDED:
            detail = f"{self.socket_path} did not answer within {self.timeout_s:g} s ({said})"
        else:
            detail = f"{self.socket_path} answered {said}"
        return PodResourcesFailed(self.socket_path, detail)

    def _transport_detail(self, exc: Exception) -> str:
        # asyncio's TimeoutError is an OSError too: grpclib raises it at the deadline.
        if isinstance(exc, TimeoutError):
            return f"{self.socket_path} did not answer within {self.timeout_s:g} s"
        for kind, hint in _OS_HINTS:
            if isinstance(exc, kind):
                return f"{self.socket_path}: {hint}"
        if isinstance(exc, OSError):
            return f"{self.socket_path}: {exc.strerror or exc}"
        return f"{self.socket_path}: the connection broke ({type(exc).__name__}: {exc})"
