"""The one place where domain errors become gRPC status codes."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from millpond.shared.errors import ErrorKind, MillpondError

log = logging.getLogger(__name__)

_CODES = {
    ErrorKind.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.DEADLINE: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorKind.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorKind.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorKind.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
}

T = TypeVar("T")
Handler = Callable[..., Awaitable[T]]


def status_code(kind: ErrorKind) -> grpc.StatusCode:
    """The gRPC status code for a domain error kind."""
    return _CODES[kind]


def grpc_errors(method: Handler[T]) -> Handler[T]:
    """Turn ``MillpondError`` into its status; anything else is INTERNAL and logged."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> T:
        try:
            return await method(self, request, context)
        except MillpondError as err:
            await context.abort(_CODES[err.kind], err.message)
        except grpc.aio.AioRpcError as err:
            # A downstream service's status passes through unchanged.
            await context.abort(err.code(), err.details() or "")
        except Exception:
            log.exception("unexpected error in %s", method.__qualname__)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the service log")
        raise AssertionError("unreachable")

    return wrapper


def raise_for_rpc(err: grpc.aio.AioRpcError) -> MillpondError:
    """Map a downstream RPC failure back to a domain error (for callers that must decide)."""
    kinds = {code: kind for kind, code in _CODES.items()}
    return MillpondError(err.details() or str(err.code()), kind=kinds.get(err.code(), ErrorKind.INTERNAL))
