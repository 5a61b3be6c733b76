"""The coordinator's gRPC endpoints: thin adapters over the executor and the assignment."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import grpc

from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.shared.rpc.status import grpc_errors
from millpond.shared.task_status import StoreLag, TaskReport

if TYPE_CHECKING:
    from millpond.services.coordinator.app import Coordinator

AssignmentReply = TypeVar("AssignmentReply", coordinator_pb2.HeartbeatResponse, coordinator_pb2.GetAssignmentResponse)


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
        self.coordinator.heartbeat(request.worker_id, request.endpoint, reports,
                                   [StoreLag.from_proto(lag) for lag in request.lags])
        return self._with_assignment(coordinator_pb2.HeartbeatResponse(), request.known_generation)

    @grpc_errors
    async def GetAssignment(
        self, request: coordinator_pb2.GetAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.GetAssignmentResponse:
        return self._with_assignment(coordinator_pb2.GetAssignmentResponse(), request.known_generation)

    def _with_assignment(self, response: AssignmentReply, known_generation: int) -> AssignmentReply:
        cluster = self.coordinator.cluster
        response.generation, response.leader = cluster.generation, cluster.leading
        if cluster.leading and known_generation != cluster.generation:
            response.assignment.CopyFrom(cluster.assignment_proto())
        return response

    @grpc_errors
    async def Leave(self, request: coordinator_pb2.LeaveRequest, context: grpc.aio.ServicerContext
                    ) -> coordinator_pb2.LeaveResponse:
        self.coordinator.leave(request.worker_id)
        return coordinator_pb2.LeaveResponse(generation=self.coordinator.cluster.generation)

    @grpc_errors
    async def ListTaskStatuses(
        self, request: coordinator_pb2.ListTaskStatusesRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.ListTaskStatusesResponse:
        by_query = self.coordinator.cluster.task_reports()
        wanted = [request.query_id] if request.query_id else sorted(by_query)
        return coordinator_pb2.ListTaskStatusesResponse(tasks=[
            r.to_proto() for q in wanted for r in sorted(by_query.get(q, []), key=lambda r: r.partition)])

    @grpc_errors
    async def GetClusterStatus(
        self, request: coordinator_pb2.GetClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.GetClusterStatusResponse:
        cluster = self.coordinator.cluster
        return coordinator_pb2.GetClusterStatusResponse(
            coordinator_id=self.coordinator.coordinator_id, leader=cluster.leading, generation=cluster.generation,
            hosts=cluster.status_proto())
