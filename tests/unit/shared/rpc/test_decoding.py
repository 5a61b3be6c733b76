"""A request that is not a valid protobuf message gets INVALID_ARGUMENT naming its type, for
every kind of RPC (unary, server-, client- and bidirectional streaming), also when the
servicer maps its errors to statuses (``grpc_errors``, ``grpc_stream_errors``), and valid
requests still reach their servicers; through a real ``grpc.aio`` server on a free port."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from millpond.shared.rpc.decoding import RequestDecoder
from millpond.shared.rpc.status import grpc_errors, grpc_stream_errors

CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"
REFLECT = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
COUNT = "/test.Counter/Count"
GUARDED_COUNT = "/test.Guarded/Count"
GUARDED_ECHO = "/test.Guarded/Echo"
MALFORMED = (b"\xff", b"\n\x05abc", b"\n\x03\xed\xa0\x80", b"\x08" + b"\xff" * 11, b"\x0b")


async def _count(requests: AsyncIterator[health_pb2.HealthCheckRequest], context: grpc.aio.ServicerContext) -> bytes:
    return str(len([r async for r in requests])).encode()


class Guarded:
    """Client- and bidi-streaming servicer methods behind the status mapping, as the services' are."""

    @grpc_errors
    async def count(self, requests: AsyncIterator[health_pb2.HealthCheckRequest],
                    context: grpc.aio.ServicerContext) -> bytes:
        return await _count(requests, context)

    @grpc_stream_errors
    async def echo(self, requests: AsyncIterator[health_pb2.HealthCheckRequest],
                   context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request.service.encode() or b"-"


@pytest.fixture
async def endpoint() -> AsyncIterator[str]:
    server = grpc.aio.server(interceptors=[RequestDecoder()])
    servicer = health.aio.HealthServicer()
    await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    reflection.enable_server_reflection([health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Counter", {
        "Count": grpc.stream_unary_rpc_method_handler(_count, health_pb2.HealthCheckRequest.FromString, None)})])
    guarded = Guarded()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Guarded", {
        "Count": grpc.stream_unary_rpc_method_handler(guarded.count, health_pb2.HealthCheckRequest.FromString, None),
        "Echo": grpc.stream_stream_rpc_method_handler(guarded.echo, health_pb2.HealthCheckRequest.FromString, None)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def _one(payload: bytes) -> AsyncIterator[bytes]:
    yield payload


async def _status(channel: grpc.aio.Channel, method: str, payload: bytes) -> tuple[grpc.StatusCode, str, bytes]:
    """Code, details and the first response's bytes of one call with raw ``payload``."""
    try:
        if method == CHECK:
            return grpc.StatusCode.OK, "", await channel.unary_unary(method)(payload, timeout=5)
        if method in (COUNT, GUARDED_COUNT):
            return grpc.StatusCode.OK, "", await channel.stream_unary(method)(_one(payload), timeout=5)
        call = (channel.unary_stream(method)(payload, timeout=5) if method == WATCH
                else channel.stream_stream(method)(_one(payload), timeout=5))
        first = await call.read()
        call.cancel()
        assert first is not grpc.aio.EOF
        return grpc.StatusCode.OK, "", first
    except grpc.aio.AioRpcError as err:
        return err.code(), err.details() or "", b""


@pytest.mark.parametrize("method", [CHECK, WATCH, COUNT, REFLECT, GUARDED_COUNT, GUARDED_ECHO])
async def test_malformed_requests_are_invalid_arguments_and_not_logged(
        endpoint: str, method: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    async with grpc.aio.insecure_channel(endpoint) as channel:
        for payload in MALFORMED:
            code, details, _ = await _status(channel, method, payload)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (payload, code, details)
            assert "is not a valid" in details and ("HealthCheckRequest" in details
                                                    or "ServerReflectionRequest" in details), details
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_valid_requests_reach_their_servicers(endpoint: str) -> None:
    async with grpc.aio.insecure_channel(endpoint) as channel:
        request = health_pb2.HealthCheckRequest().SerializeToString()
        _, _, check = await _status(channel, CHECK, request)
        assert health_pb2.HealthCheckResponse.FromString(check).status == health_pb2.HealthCheckResponse.SERVING
        _, _, watch = await _status(channel, WATCH, request)
        assert health_pb2.HealthCheckResponse.FromString(watch).status == health_pb2.HealthCheckResponse.SERVING
        _, _, count = await _status(channel, COUNT, request)
        assert count == b"1"
        _, _, guarded_count = await _status(channel, GUARDED_COUNT, request)
        assert guarded_count == b"1"
        _, _, echoed = await _status(channel, GUARDED_ECHO, health_pb2.HealthCheckRequest(
            service="x").SerializeToString())
        assert echoed == b"x"
        _, _, listed = await _status(channel, REFLECT, reflection_pb2.ServerReflectionRequest(
            list_services="").SerializeToString())
        services = reflection_pb2.ServerReflectionResponse.FromString(listed).list_services_response.service
        assert health.SERVICE_NAME in {s.name for s in services}


def test_a_methods_wrapped_handler_is_made_once_while_its_handler_stays() -> None:
    async def check(request: health_pb2.HealthCheckRequest, context: object) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse()

    def handler() -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(check, health_pb2.HealthCheckRequest.FromString,
                                                   health_pb2.HealthCheckResponse.SerializeToString)

    first, second = handler(), handler()
    current = [first]

    async def continuation(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return current[0]

    class Details:
        method = CHECK
        invocation_metadata = ()

    async def wrap() -> grpc.RpcMethodHandler:
        return await decoder.intercept_service(continuation, Details())

    decoder = RequestDecoder()
    made = asyncio.run(wrap())
    assert made is not first and made.request_deserializer is None  # it decodes inside the call
    assert asyncio.run(wrap()) is made
    current[0] = second  # the server gives another handler (a servicer replaced): wrapped anew
    again = asyncio.run(wrap())
    assert again is not made and asyncio.run(wrap()) is again
