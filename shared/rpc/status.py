"""The one place where domain errors become gRPC status codes."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

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
StreamHandler = Callable[..., AsyncIterator[T]]


MAX_DETAILS_CHARS = 1000
"""The most of an error message a status carries: messages may quote the client's input (a
property name, a statement), and gRPC clients refuse trailers over 16 KiB (RESOURCE_EXHAUSTED
instead of the status), which percent-encoded non-ASCII text reaches from about 1,400 characters."""


def status_details(message: str) -> str:
    """``message`` as a status carries it: cut at ``MAX_DETAILS_CHARS``, saying how much was left out."""
    if len(message) <= MAX_DETAILS_CHARS:
        return message
    return f"{message[:MAX_DETAILS_CHARS]}... ({len(message) - MAX_DETAILS_CHARS} more characters)"


def status_code(kind: ErrorKind) -> grpc.StatusCode:
    """The gRPC status code for a domain error kind."""
    return _CODES[kind]


async def _abort(context: grpc.aio.ServicerContext, error: Exception, method: Callable[..., Any]) -> NoReturn:
    """End the call with ``error``'s status: a ``MillpondError``'s own, a downstream call's
    unchanged, anything else INTERNAL (and logged). A call already aborted (a client stream's
    undecodable message, refused by ``RequestDecoder`` inside the iteration) stays as it is:
    gRPC allows one abort per call."""
    if isinstance(error, grpc.aio.AbortError):
        raise error
    if isinstance(error, MillpondError):
        await context.abort(_CODES[error.kind], status_details(error.message))
    if isinstance(error, grpc.aio.AioRpcError):
        await context.abort(error.code(), status_details(error.details() or ""))
    log.error("unexpected error in %s", method.__qualname__, exc_info=error)
    await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the service log")
    raise AssertionError("unreachable")


def grpc_errors(method: Handler[T]) -> Handler[T]:
    """Turn ``MillpondError`` into its status; anything else is INTERNAL and logged."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> T:
        try:
            return await method(self, request, context)
        except Exception as error:
            await _abort(context, error, method)

    return wrapper


def grpc_stream_errors(method: StreamHandler[T]) -> StreamHandler[T]:
    """``grpc_errors`` for a handler that streams its responses."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[T]:
        try:
            async for response in method(self, request, context):
                yield response
        except Exception as error:
            await _abort(context, error, method)

    return wrapper


_KINDS = {code: kind for kind, code in _CODES.items()}
_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


def raise_for_rpc(err: grpc.aio.AioRpcError) -> MillpondError:
    """Map a downstream RPC failure back to a domain error (for callers that must decide)."""
    return MillpondError(err.details() or str(err.code()), kind=_KINDS.get(err.code(), ErrorKind.INTERNAL))


def code_number(code: grpc.StatusCode) -> int:
    """A status code as the number a message carries (google.rpc.Code)."""
    return int(code.value[0])


def code_of_number(number: int) -> grpc.StatusCode:
    """The status code a message's number stands for (UNKNOWN for one gRPC does not define)."""
    return _BY_VALUE.get(number, grpc.StatusCode.UNKNOWN)


def error_of_status(code: grpc.StatusCode, message: str) -> MillpondError:
    """The domain error of a status a message carries (as ``raise_for_rpc`` for a call's)."""
    return MillpondError(message or code.name, kind=_KINDS.get(code, ErrorKind.INTERNAL))
