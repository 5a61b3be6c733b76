"""The router's client-facing gRPC endpoint."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
from millpond.router.v1 import router_pb2, router_pb2_grpc

from shared.rpc.status import grpc_errors
from shared.task_status import StoreLag

if TYPE_CHECKING:
    from services.router.app import Router


class RouterServicer(router_pb2_grpc.RouterServiceServicer):
    """Implements ``millpond.router.v1.RouterService``."""

    def __init__(self, router: Router):
        self.router = router

    @grpc_errors
    async def Execute(self, request: router_pb2.ExecuteRequest, context: grpc.aio.ServicerContext) -> router_pb2.ExecuteResponse:
        outcomes = await self.router.execute(request.sql, dict(request.properties))
        return router_pb2.ExecuteResponse(results=[o.to_proto() for o in outcomes])

    @grpc_errors
    async def ReportHostStatus(self, request: router_pb2.ReportHostStatusRequest,
                               context: grpc.aio.ServicerContext) -> router_pb2.ReportHostStatusResponse:
        self.router.hosts.beat(request.endpoint, request.worker_id, [StoreLag.from_proto(lag) for lag in request.lags])
        return router_pb2.ReportHostStatusResponse()
