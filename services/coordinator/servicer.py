"""The coordinator's gRPC endpoints: thin adapters over the executor and the assignment."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc

from shared.rpc.status import grpc_errors
from shared.task_status import TaskReport

if TYPE_CHECKING:
    from services.coordinator.app import Coordinator


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServiceServicer):
    """Implements ``millpond.coordinator.v1.CoordinatorService``."""

    def __init__(self, coordinator: Coordinator):
        self.coordinator = coordinator

    @grpc_errors
    async def ExecuteStatement(
        self, request: coordinator_pb2.ExecuteStatementRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.ExecuteStatementResponse:
        outcome = await self.coordinator.executor.execute(request.sql, dict(request.properties))
        return coordinator_pb2.ExecuteStatementResponse(result=outcome.to_proto())

    @grpc_errors
    async def Heartbeat(
        self, request: coordinator_pb2.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.HeartbeatResponse:
        reports = [TaskReport.from_proto(request.worker_id, t) for t in request.tasks]
        self.coordinator.heartbeat(request.worker_id, request.endpoint, reports)
        generation = self.coordinator.generation
        response = coordinator_pb2.HeartbeatResponse(generation=generation)
        if request.known_generation != generation:
            response.assignment.CopyFrom(self.coordinator.assignment_proto())
        return response

    @grpc_errors
    async def GetAssignment(
        self, request: coordinator_pb2.GetAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.GetAssignmentResponse:
        generation = self.coordinator.generation
        response = coordinator_pb2.GetAssignmentResponse(generation=generation)
        if request.known_generation != generation:
            response.assignment.CopyFrom(self.coordinator.assignment_proto())
        return response

    @grpc_errors
    async def ListTaskStatuses(
        self, request: coordinator_pb2.ListTaskStatusesRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.ListTaskStatusesResponse:
        by_query = self.coordinator.task_reports()
        wanted = [request.query_id] if request.query_id else sorted(by_query)
        return coordinator_pb2.ListTaskStatusesResponse(tasks=[
            r.to_proto() for q in wanted for r in sorted(by_query.get(q, []), key=lambda r: r.partition)])
