"""Domain errors to gRPC status codes in one place, and every answer counted by its code."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData
from keda_gpu_scaler.serving.telemetry import Telemetry

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")


class _Told(Protocol):
    @property
    def telemetry(self) -> Telemetry: ...


_S = TypeVar("_S", bound=_Told)
_Unary = Callable[Concatenate[_S, _P], Coroutine[Any, Any, _T]]
_Streaming = Callable[Concatenate[_S, _P], AsyncIterator[_T]]


def to_grpc_error(exc: Exception) -> GRPCError:
    if isinstance(exc, GRPCError):
        return exc
    if isinstance(exc, InvalidTrigger):
        return GRPCError(Status.INVALID_ARGUMENT, f"failed to parse scaler metadata: {exc}")
    if isinstance(exc, NoData):
        return GRPCError(Status.UNAVAILABLE, str(exc))
    log.exception("unexpected error while answering KEDA", exc_info=exc)
    return GRPCError(Status.INTERNAL, f"internal error: {type(exc).__name__}")


def unary(method: str) -> Callable[[_Unary[_S, _P, _T]], _Unary[_S, _P, _T]]:
    """Map errors to status codes and tell telemetry (method, code, seconds)."""

    def decorate(func: _Unary[_S, _P, _T]) -> _Unary[_S, _P, _T]:
        @functools.wraps(func)
        async def wrapper(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
            # A latency measurement for /metrics, not logic: the wall clock is right here.
            started = time.perf_counter()
            code = "OK"
            try:
                return await func(self, *args, **kwargs)
            except Exception as exc:
                error = to_grpc_error(exc)
                code = error.status.name
                raise error from exc
            finally:
                self.telemetry.answered(method, code, time.perf_counter() - started)

        return wrapper

    return decorate


def streaming(method: str) -> Callable[[_Streaming[_S, _P, _T]], _Streaming[_S, _P, _T]]:
    """As :func:`unary`, for server streams; a stream reports its code when it ends."""

    def decorate(func: _Streaming[_S, _P, _T]) -> _Streaming[_S, _P, _T]:
        @functools.wraps(func)
        async def wrapper(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> AsyncIterator[_T]:
            code = "CANCELLED"
            try:
                async for item in func(self, *args, **kwargs):
                    yield item
                code = "OK"
            except Exception as exc:
                error = to_grpc_error(exc)
                code = error.status.name
                raise error from exc
            finally:
                self.telemetry.answered(method, code, None)

        return wrapper

    return decorate
