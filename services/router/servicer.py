"""The router's gRPC endpoints: the client-facing ``RouterService`` and the workers'
``RouterInternalService``.

The servicers are given the parts they serve (constructor injection) and know nothing of
the router's wiring: convert the request, call the domain, convert the answer back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc

from millpond.router.v1 import router_internal_pb2, router_internal_pb2_grpc, router_pb2, router_pb2_grpc
from millpond.services.router.converters import push_message
from millpond.services.router.push import PushHeader
from millpond.shared import security
from millpond.shared.results import Outcome
from millpond.shared.rpc.converters import outcome_to_proto, store_lag_from_proto
from millpond.shared.rpc.status import grpc_errors, grpc_stream_errors
from millpond.shared.task_status import StoreLag


class StatementRunner(Protocol):
    """Runs the statements of a request (the router's ``Statements``)."""

    async def execute(self, sql: str, properties: dict[str, str], token: str = "",
                      time_remaining: float | None = None, request_id: str = "") -> list[Outcome]:
        """Each statement's outcome, in order (each run once per request id)."""


class PushStreams(Protocol):
    """Streams push queries (the router's ``PushQueries``)."""

    def stream(self, sql: str, properties: dict[str, str], client: str) -> AsyncIterator[PushHeader | list[Any]]:
        """A header, then the rows as they happen."""


class StatusSource(Protocol):
    """The cluster status (the router's ``ClusterStatus``)."""

    async def get(self) -> router_pb2.GetClusterStatusResponse:
        """The leading coordinator's view with this router's own."""


class Beats(Protocol):
    """Takes the workers' beats (the router's ``HostTable``)."""

    def beat(self, endpoint: str, worker_id: str, lags: list[StoreLag]) -> None:
        """A worker's heartbeat and lag report."""

    def disconnected(self, endpoint: str) -> None:
        """The worker's beat stream broke (its process died, or the connection did)."""


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

    def __init__(self, statements: StatementRunner, pushes: PushStreams, status: StatusSource, beats: Beats):
        self.statements = statements
        self.pushes = pushes
        self.status = status
        self.beats = beats
        """For the deprecated ``ReportHostStatus`` only."""

    @grpc_errors
    async def Execute(self, request: router_pb2.ExecuteRequest, context: grpc.aio.ServicerContext) -> router_pb2.ExecuteResponse:
        outcomes = await self.statements.execute(request.sql, dict(request.properties), request.consistency_token,
                                                 context.time_remaining(), request.request_id)
        response = router_pb2.ExecuteResponse()
        for outcome in outcomes:
            outcome_to_proto(outcome, response.results.add())
        return response

    @grpc_stream_errors
    async def StreamQuery(self, request: router_pb2.StreamQueryRequest,
                          context: grpc.aio.ServicerContext) -> AsyncIterator[router_pb2.StreamQueryResponse]:
        # A client that goes away cancels this generator at its next write: the push query's
        # reader stops in its finally.
        async for item in self.pushes.stream(request.sql, dict(request.properties), client_of(context)):
            yield push_message(item)

    @grpc_errors
    async def GetClusterStatus(self, request: router_pb2.GetClusterStatusRequest,
                               context: grpc.aio.ServicerContext) -> router_pb2.GetClusterStatusResponse:
        return await self.status.get()

    @grpc_errors
    async def ReportHostStatus(self, request: router_pb2.ReportHostStatusRequest,
                               context: grpc.aio.ServicerContext) -> router_pb2.ReportHostStatusResponse:
        """Deprecated (RouterInternalService.ReportWorkerStatus replaces it); answered the same way."""
        self.beats.beat(request.endpoint, request.worker_id, [store_lag_from_proto(lag) for lag in request.lags])
        return router_pb2.ReportHostStatusResponse()


class RouterInternalServicer(router_internal_pb2_grpc.RouterInternalServiceServicer):
    """Implements ``millpond.router.v1.RouterInternalService`` (the services' calls only)."""

    def __init__(self, beats: Beats):
        self.beats = beats

    @grpc_errors
    async def ReportWorkerStatus(self, request: router_internal_pb2.ReportWorkerStatusRequest,
                                 context: grpc.aio.ServicerContext) -> router_internal_pb2.ReportWorkerStatusResponse:
        self._take(request)
        return router_internal_pb2.ReportWorkerStatusResponse()

    @grpc_errors
    async def StreamWorkerStatus(self, requests: AsyncIterator[router_internal_pb2.StreamWorkerStatusRequest],
                                 context: grpc.aio.ServicerContext) -> router_internal_pb2.StreamWorkerStatusResponse:
        endpoint, ended = "", False
        try:
            async for request in requests:
                endpoint, ended = request.status.endpoint, request.last
                self._take(request.status)
        finally:
            if endpoint and not ended:  # broken, not ended by the worker: dead until it reports again
                self.beats.disconnected(endpoint)
        return router_internal_pb2.StreamWorkerStatusResponse()

    def _take(self, status: router_internal_pb2.ReportWorkerStatusRequest) -> None:
        self.beats.beat(status.endpoint, status.worker_id, [store_lag_from_proto(lag) for lag in status.lags])
