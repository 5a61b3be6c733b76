"""The router's client-facing gRPC endpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc

from millpond.router.v1 import router_pb2, router_pb2_grpc
from millpond.shared import security
from millpond.shared.errors import MillpondError
from millpond.shared.rpc.converters import outcome_to_proto, store_lag_from_proto
from millpond.shared.rpc.status import grpc_errors, status_code

if TYPE_CHECKING:
    from millpond.services.router.app import Router


def client_of(context: grpc.aio.ServicerContext) -> str:
    """Who is calling, for per-client limits: the authenticated principal, or without
    authentication the peer's address (its host, whatever connection it uses)."""
    principal = security.CURRENT.get()
    if principal is not security.ANONYMOUS:
        return f"principal {principal.name}"
    peer: str = context.peer() or "unknown"  # ipv4:127.0.0.1:40404, ipv6:[::1]:40404
    return "client " + peer.partition(":")[2].rpartition(":")[0]


class RouterServicer(router_pb2_grpc.RouterServiceServicer):
    """Implements ``millpond.router.v1.RouterService``."""

    def __init__(self, router: Router):
        self.router = router

    @grpc_errors
    async def Execute(self, request: router_pb2.ExecuteRequest, context: grpc.aio.ServicerContext) -> router_pb2.ExecuteResponse:
        outcomes = await self.router.execute(request.sql, dict(request.properties), request.consistency_token,
                                             context.time_remaining())
        return router_pb2.ExecuteResponse(results=[outcome_to_proto(o) for o in outcomes])

    async def StreamQuery(self, request: router_pb2.StreamQueryRequest,
                          context: grpc.aio.ServicerContext) -> AsyncIterator[router_pb2.StreamQueryResponse]:
        # A client that goes away cancels this generator at its next write: the push query's
        # reader stops in its finally.
        try:
            async for message in self.router.stream(request.sql, dict(request.properties), client_of(context)):
                yield message
        except MillpondError as err:
            await context.abort(status_code(err.kind), err.message)

    @grpc_errors
    async def GetClusterStatus(self, request: router_pb2.GetClusterStatusRequest,
                               context: grpc.aio.ServicerContext) -> router_pb2.GetClusterStatusResponse:
        return await self.router.cluster_status()

    @grpc_errors
    async def ReportHostStatus(self, request: router_pb2.ReportHostStatusRequest,
                               context: grpc.aio.ServicerContext) -> router_pb2.ReportHostStatusResponse:
        self.router.hosts.beat(request.endpoint, request.worker_id, [store_lag_from_proto(lag) for lag in request.lags])
        return router_pb2.ReportHostStatusResponse()
