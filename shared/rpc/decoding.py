"""Requests that are not valid protobuf messages get INVALID_ARGUMENT, in one server interceptor.

gRPC decodes a request before the servicer sees it; when decoding fails (corrupt wire
format, bad UTF-8 in a string field, nesting past protobuf's recursion limit) grpc.aio
answers UNKNOWN and logs the DecodeError with its traceback as an unhandled servicer error.
Bad input is the caller's mistake, not the service's: the interceptor takes the request's
bytes undecoded and decodes them itself, so a malformed request is refused with
INVALID_ARGUMENT and a message naming the type it should have been, and nothing is logged.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

Decode = Callable[[bytes], Any]


def _type_name(decode: Decode, method: str) -> str:
    """The request's message type (``Class.FromString``), or the method when it is not known."""
    descriptor = getattr(getattr(decode, "__self__", None), "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", f"request of {method}"))


async def _refuse(decode: Decode, err: Exception, context: grpc.aio.ServicerContext, method: str) -> NoReturn:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                        f"the request is not a valid {_type_name(decode, method)} message ({err}); "
                        "build it with the service's .proto files")
    raise AssertionError("unreachable")


async def _decoded(decode: Decode, raw: bytes, context: grpc.aio.ServicerContext, method: str) -> Any:
    try:
        return decode(raw)
    except Exception as err:  # DecodeError, and whatever else a deserializer raises on bad bytes
        await _refuse(decode, err, context, method)


async def _resolved(result: Any) -> Any:
    """A behaviour's result, awaited when it is a coroutine (grpc accepts both kinds)."""
    return await result if inspect.isawaitable(result) else result


async def _stream(result: Any) -> AsyncIterator[Any]:
    """A streaming behaviour's messages: an async iterator's, an iterator's, or none when it
    writes through the context and returns a coroutine."""
    if hasattr(result, "__aiter__"):
        async for message in result:
            yield message
    elif inspect.isawaitable(result):
        await result
    elif result is not None:
        for message in result:
            yield message


class RequestDecoder(grpc.aio.ServerInterceptor):
    """Decodes every request inside the call, refusing undecodable bytes with INVALID_ARGUMENT.
    Each method's wrapped handler is made once (its first call) and kept while the server
    gives the same handler for it."""

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        known = self._wrapped.get(details.method)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = _decoding(handler, details.method)
        self._wrapped[details.method] = (handler, wrapped)
        return wrapped


def _decoding(handler: Any, method: str) -> Any:
    """``handler`` taking its requests' bytes undecoded and decoding them itself."""
    decode: Decode = handler.request_deserializer
    respond = handler.response_serializer

    async def one(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        return await _decoded(decode, raw, context, method)

    async def each(raws: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for raw in raws:
            yield await _decoded(decode, raw, context, method)

    if handler.unary_unary is not None:
        inner_unary = handler.unary_unary

        async def unary_unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            # The most frequent call (every pull): decoded here, without a coroutine more.
            try:
                request = decode(raw)
            except Exception as err:  # as in _decoded
                await _refuse(decode, err, context, method)
            result = inner_unary(request, context)
            return await result if inspect.isawaitable(result) else result

        return grpc.unary_unary_rpc_method_handler(unary_unary, None, respond)
    if handler.unary_stream is not None:
        inner_unary_stream = handler.unary_stream

        async def unary_stream(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for message in _stream(inner_unary_stream(await one(raw, context), context)):
                yield message

        return grpc.unary_stream_rpc_method_handler(unary_stream, None, respond)
    if handler.stream_unary is not None:
        inner_stream_unary = handler.stream_unary

        async def stream_unary(raws: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
            return await _resolved(inner_stream_unary(each(raws, context), context))

        return grpc.stream_unary_rpc_method_handler(stream_unary, None, respond)
    inner_stream_stream = handler.stream_stream

    async def stream_stream(raws: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for message in _stream(inner_stream_stream(each(raws, context), context)):
            yield message

    return grpc.stream_stream_rpc_method_handler(stream_stream, None, respond)
