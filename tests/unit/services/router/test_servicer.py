"""The router's servicers over injected fakes, through a real ``grpc.aio`` server on a free
port: the workers' beats reach the host table by the internal service and by the deprecated
RPC alike, and Execute converts what the statements return."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from millpond.router.v1 import router_internal_pb2, router_internal_pb2_grpc, router_pb2, router_pb2_grpc
from millpond.services.router.hosts import HostTable
from millpond.services.router.push import PushHeader
from millpond.services.router.servicer import RouterInternalServicer, RouterServicer
from millpond.shared.errors import StatementError
from millpond.shared.results import Outcome
from millpond.shared.rpc.converters import store_lag_to_common, store_lag_to_proto
from millpond.shared.task_status import StoreLag


class FakeStatements:
    async def execute(self, sql: str, properties: dict[str, str], token: str = "",
                      time_remaining: float | None = None, request_id: str = "") -> list[Outcome]:
        return [Outcome(sql, f"{properties} {token}")]


class FakePushes:
    async def stream(self, sql: str, properties: dict[str, str], client: str) -> AsyncIterator[PushHeader | list[Any]]:
        yield PushHeader("PUSH_1", [("ID", "VARCHAR")])
        yield ["a"]


class FakeStatus:
    async def get(self) -> router_pb2.GetClusterStatusResponse:
        return router_pb2.GetClusterStatusResponse(push_queries=3)


async def test_the_servicers_serve_the_parts_they_are_given() -> None:
    hosts = HostTable(1.0, clock=lambda: 10.0, wall_clock_ms=lambda: 0)
    server = grpc.aio.server()
    router_pb2_grpc.add_RouterServiceServicer_to_server(
        RouterServicer(FakeStatements(), FakePushes(), FakeStatus(), hosts), server)
    router_internal_pb2_grpc.add_RouterInternalServiceServicer_to_server(RouterInternalServicer(hosts), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    lag = StoreLag("Q", 0, False, 40, 50, input_offset=60)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            internal = router_internal_pb2_grpc.RouterInternalServiceStub(channel)
            await internal.ReportWorkerStatus(router_internal_pb2.ReportWorkerStatusRequest(
                worker_id="w1", endpoint="w1:1", lags=[store_lag_to_common(lag)]), timeout=5)
            public = router_pb2_grpc.RouterServiceStub(channel)
            await public.ReportHostStatus(router_pb2.ReportHostStatusRequest(
                worker_id="w2", endpoint="w2:1", lags=[store_lag_to_proto(lag)]), timeout=5)
            response = await public.Execute(router_pb2.ExecuteRequest(
                sql="SHOW STREAMS;", properties={"a": "b"}, consistency_token="t"), timeout=5)
            stream = [m async for m in public.StreamQuery(router_pb2.StreamQueryRequest(sql="S"), timeout=5)]
            status = await public.GetClusterStatus(router_pb2.GetClusterStatusRequest(), timeout=5)
    finally:
        await server.stop(None)
    assert {e: (v.worker_id, list(v.lags.values())) for e, v in hosts.hosts.items()} == {
        "w1:1": ("w1", [lag]), "w2:1": ("w2", [lag])}
    assert [(r.statement_text, r.message) for r in response.results] == [("SHOW STREAMS;", "{'a': 'b'} t")]
    assert stream[0].header.query_id == "PUSH_1" and [c.name for c in stream[0].header.columns] == ["ID"]
    assert stream[1].row.values[0].string_value == "a"
    assert status.push_queries == 3


class FailingPushes:
    def __init__(self, error: Exception):
        self.error = error

    async def stream(self, sql: str, properties: dict[str, str], client: str) -> AsyncIterator[PushHeader | list[Any]]:
        yield PushHeader("PUSH_1", [("ID", "VARCHAR")])
        raise self.error


async def test_a_push_query_that_fails_mid_stream_ends_with_a_status_not_its_exception_text() -> None:
    """A statement's error keeps its status and message; anything else is INTERNAL with no
    detail of the exception (gRPC's own fallback sends UNKNOWN and the raw text)."""
    outcomes = {}
    for name, error in (("bad", StatementError("LIKE takes text")), ("bug", OverflowError("math range error"))):
        server = grpc.aio.server()
        router_pb2_grpc.add_RouterServiceServicer_to_server(
            RouterServicer(FakeStatements(), FailingPushes(error), FakeStatus(), HostTable(1.0)), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                public = router_pb2_grpc.RouterServiceStub(channel)
                received = []
                try:
                    async for message in public.StreamQuery(router_pb2.StreamQueryRequest(sql="S"), timeout=5):
                        received.append(message)
                except grpc.aio.AioRpcError as err:
                    outcomes[name] = (len(received), err.code(), err.details())
        finally:
            await server.stop(None)
    assert outcomes == {"bad": (1, grpc.StatusCode.INVALID_ARGUMENT, "LIKE takes text"),
                        "bug": (1, grpc.StatusCode.INTERNAL, "internal error; see the service log")}
