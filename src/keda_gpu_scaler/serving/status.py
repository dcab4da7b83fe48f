"""Domain errors to gRPC status codes, in one place."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from keda_gpu_scaler.domain.errors import InvalidTrigger, NoData

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")


def to_grpc_error(exc: Exception) -> GRPCError:
    if isinstance(exc, InvalidTrigger):
        return GRPCError(Status.INVALID_ARGUMENT, f"failed to parse scaler metadata: {exc}")
    if isinstance(exc, NoData):
        return GRPCError(Status.UNAVAILABLE, str(exc))
    log.exception("unexpected error while answering KEDA", exc_info=exc)
    return GRPCError(Status.INTERNAL, f"internal error: {type(exc).__name__}")


def unary(
    func: Callable[_P, Coroutine[Any, Any, _T]],
) -> Callable[_P, Coroutine[Any, Any, _T]]:
    @functools.wraps(func)
    async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await func(*args, **kwargs)
        except GRPCError:
            raise
        except Exception as exc:
            raise to_grpc_error(exc) from exc

    return wrapper


def streaming(func: Callable[_P, AsyncIterator[_T]]) -> Callable[_P, AsyncIterator[_T]]:
    @functools.wraps(func)
    async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> AsyncIterator[_T]:
        try:
            async for item in func(*args, **kwargs):
                yield item
        except GRPCError:
            raise
        except Exception as exc:
            raise to_grpc_error(exc) from exc

    return wrapper
