"""A router's scan of a worker over real gRPC on a loopback port: a worker of an earlier
version, which has no ScanPages (UNIMPLEMENTED), is asked its unary Scan and the router
filters, projects and cuts its whole rows; any other failover status is an UnavailableError
(the next copy is asked)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from millpond.common.v1 import rows_pb2
from millpond.services.router.pull import plan_pull
from millpond.services.router.pull_routing import remote_pages
from millpond.shared.errors import UnavailableError
from millpond.shared.kafka.serde import from_proto, to_proto
from millpond.shared.sql.parser import parse_statement
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc
from tests.unit.services.router.test_pull import metastore

SERVICE = "millpond.worker.v1.WorkerService"


async def scan_pages(handlers: dict[str, grpc.RpcMethodHandler], sql: str, limit: int) -> list[list[Any]]:
    """``remote_pages`` against a server with only ``handlers``; the result rows."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            plan = plan_pull(parse_statement(sql), metastore(), "svc")  # type: ignore[arg-type]
            request = worker_pb2.ScanPagesRequest(table="COUNTS", partitions=[0], limit=limit, statement=sql)
            pages = [p async for p in remote_pages(worker_pb2_grpc.WorkerServiceStub(channel), request, plan, 5)]
    finally:
        await server.stop(None)
    assert [p.row_count for p in pages] == [len(rows_pb2.StatementResult.FromString(p.rows).rows) for p in pages]
    return [[from_proto(v) for v in r.values] for p in pages for r in rows_pb2.StatementResult.FromString(p.rows).rows]


def earlier_worker(asked: list[worker_pb2.ScanRequest]) -> dict[str, grpc.RpcMethodHandler]:
    """A worker that answers only the unary Scan: every row of COUNTS (SENSOR, N), n = 0..5."""
    async def scan(request: worker_pb2.ScanRequest, context: Any) -> worker_pb2.ScanResponse:
        asked.append(request)
        rows = [rows_pb2.Row(values=[to_proto(f"s{n}"), to_proto(n)]) for n in range(6)]
        return worker_pb2.ScanResponse(rows=rows[:request.limit or None], input_offsets={0: 42})

    return {"Scan": grpc.unary_unary_rpc_method_handler(
        scan, request_deserializer=worker_pb2.ScanRequest.FromString,
        response_serializer=worker_pb2.ScanResponse.SerializeToString)}


@pytest.mark.parametrize("sql, limit, rows, asked_limit", [
    ("SELECT sensor FROM counts WHERE n >= 2 LIMIT 2", 2, [["s2"], ["s3"]], 0),  # a WHERE: every row is read
    ("SELECT * FROM counts LIMIT 3", 3, [["s0", 0], ["s1", 1], ["s2", 2]], 3),
    ("SELECT n * 10 AS t FROM counts WHERE n < 2", 0, [[0], [10]], 0),
])
def test_a_worker_of_an_earlier_version_is_asked_its_unary_scan(sql: str, limit: int, rows: list[list[Any]],
                                                                asked_limit: int) -> None:
    asked: list[worker_pb2.ScanRequest] = []
    assert asyncio.run(scan_pages(earlier_worker(asked), sql, limit)) == rows
    assert [(list(r.partitions), r.limit) for r in asked] == [([0], asked_limit)]


def failing(code: grpc.StatusCode) -> dict[str, grpc.RpcMethodHandler]:
    async def pages(request: worker_pb2.ScanPagesRequest, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, "partition 0 of COUNTS is not active on worker w")
        yield  # an async generator, as a streaming handler is

    handler: Callable[..., Any] = pages
    return {"ScanPages": grpc.unary_stream_rpc_method_handler(
        handler, request_deserializer=worker_pb2.ScanPagesRequest.FromString,
        response_serializer=worker_pb2.ScanPagesResponse.SerializeToString)}


def test_a_failover_status_is_unavailable_and_others_pass_through() -> None:
    with pytest.raises(UnavailableError, match="not active on worker w"):
        asyncio.run(scan_pages(failing(grpc.StatusCode.UNAVAILABLE), "SELECT * FROM counts", 0))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        asyncio.run(scan_pages(failing(grpc.StatusCode.INVALID_ARGUMENT), "SELECT * FROM counts", 0))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
