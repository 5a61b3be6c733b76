"""An error whose message quotes a client's long input still reaches the client with its own
status and the start of its message: gRPC clients refuse trailers over 16 KiB, which would
turn INVALID_ARGUMENT into RESOURCE_EXHAUSTED; through a real ``grpc.aio`` server."""

from __future__ import annotations

import grpc
import pytest

from millpond.shared.errors import StatementError
from millpond.shared.rpc.status import MAX_DETAILS_CHARS, grpc_errors

NAME = "é" * 100_000


class Refusing:
    @grpc_errors
    async def echo(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        raise StatementError(f"unknown property '{NAME}'; known properties: auto.offset.reset")


async def test_a_long_message_is_cut_and_keeps_its_status() -> None:
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(Refusing().echo)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Refusing", {"Echo": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await channel.unary_unary("/test.Refusing/Echo")(b"", timeout=10)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = raised.value.details() or ""
        assert details.startswith("unknown property 'ééé") and details.endswith("more characters)")
        assert len(details) < MAX_DETAILS_CHARS + 40
    finally:
        await server.stop(None)
