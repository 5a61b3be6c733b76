"""The coordinator's gRPC endpoints: thin adapters over the executor and the assignment.

The servicer is given the parts it serves (constructor injection) and knows nothing of the
service's wiring: convert the request, call the domain, convert the answer back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol, TypeVar

import grpc

from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.services.coordinator.cluster import Cluster
from millpond.services.coordinator.converters import assignment_to_proto, host_statuses, with_election
from millpond.services.coordinator.leadership import ElectionStatus
from millpond.services.coordinator.rebalancer import Changes
from millpond.shared.results import Outcome
from millpond.shared.rpc.converters import heartbeat_reports, outcome_to_proto, store_lag_from_proto, task_report_to_proto
from millpond.shared.rpc.status import grpc_errors, grpc_stream_errors
from millpond.shared.task_status import StoreLag, TaskReport

AssignmentReply = TypeVar("AssignmentReply", coordinator_pb2.HeartbeatResponse, coordinator_pb2.GetAssignmentResponse,
                          coordinator_pb2.WatchAssignmentResponse)


class Statements(Protocol):
    """Executes one statement (the coordinator's ``StatementExecutor``)."""

    async def execute(self, sql: str, properties: Mapping[str, str], request_id: str = "",
                      attempt: int = 0) -> Outcome:
        """Run one statement and describe what happened (once per request id)."""


class Members(Protocol):
    """Takes the workers' beats and leaves (the coordinator's ``Rebalancer``)."""

    def heartbeat(self, worker_id: str, endpoint: str, reports: list[TaskReport], lags: list[StoreLag]) -> None:
        """A worker is alive and reports its tasks and lags."""

    def leave(self, worker_id: str) -> None:
        """A worker is shutting down."""

    def disconnected(self, worker_id: str) -> None:
        """A worker's beat stream broke: it may be dead."""


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServiceServicer):
    """Implements ``millpond.coordinator.v1.CoordinatorService``."""

    def __init__(self, statements: Statements, members: Members, cluster: Cluster,
                 coordinator_id: Callable[[], str], election: Callable[[], ElectionStatus] = ElectionStatus,
                 changes: Changes | None = None):
        self.statements = statements
        self.members = members
        self.cluster = cluster
        """Read only here: generation, leadership, assignment, reports."""
        self.coordinator_id = coordinator_id
        self.election = election
        """Where this coordinator's election stands (for status: a coordinator claiming in vain)."""
        self.changes = changes or Changes()
        """Fired when the generation or the leadership changes (``WatchAssignment`` follows it)."""

    @grpc_errors
    async def ExecuteStatement(
        self, request: coordinator_pb2.ExecuteStatementRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.ExecuteStatementResponse:
        outcome = await self.statements.execute(request.sql, dict(request.properties), request.request_id,
                                                request.attempt)
        return coordinator_pb2.ExecuteStatementResponse(result=outcome_to_proto(outcome))

    @grpc_errors
    async def Heartbeat(
        self, request: coordinator_pb2.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.HeartbeatResponse:
        return self._beat(request)

    @grpc_stream_errors
    async def Heartbeats(
        self, requests: AsyncIterator[coordinator_pb2.HeartbeatsRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[coordinator_pb2.HeartbeatsResponse]:
        # Each beat is taken as a unary Heartbeat is; only an answer that carries an
        # assignment is sent, so an idle worker's stream is one small message an interval.
        # A new assignment is sent as soon as it is made, not at the worker's next beat; a
        # stream that ends without the worker's last beat broke (its process died: gRPC shows
        # that as the end of the requests as often as a cancellation) and makes it a suspect.
        beats = aiter(requests)
        beat: asyncio.Future[Any] = asyncio.ensure_future(anext(beats))
        change: asyncio.Future[Any] = asyncio.ensure_future(self.changes.next().wait())
        worker_id, known, ended = "", -1, False
        try:
            while True:
                await asyncio.wait({beat, change}, return_when=asyncio.FIRST_COMPLETED)
                if change.done():  # the next change's event, taken before the assignment is looked at
                    change = asyncio.ensure_future(self.changes.next().wait())
                if beat.done():
                    try:
                        request = beat.result()
                    except StopAsyncIteration:
                        return
                    beat = asyncio.ensure_future(anext(beats))
                    # (A beat sent before the worker took the last assignment sent here.)
                    request.beat.known_generation = known = max(request.beat.known_generation, known)
                    answer = self._beat(request.beat)  # (refused: another process has the id, not this stream's)
                    worker_id, ended = request.beat.worker_id, request.last
                elif worker_id and self.cluster.leading and self.cluster.generation != known:
                    answer = self._with_assignment(coordinator_pb2.HeartbeatResponse(), known)
                else:
                    continue
                if answer.HasField("assignment"):
                    known = answer.generation
                    yield coordinator_pb2.HeartbeatsResponse(answer=answer)
        finally:
            beat.cancel()
            change.cancel()
            if worker_id and not ended:
                self.members.disconnected(worker_id)

    def _beat(self, request: coordinator_pb2.HeartbeatRequest) -> coordinator_pb2.HeartbeatResponse:
        reports = heartbeat_reports(request)
        self.members.heartbeat(request.worker_id, request.endpoint, reports,
                               [store_lag_from_proto(lag) for lag in request.lags])
        return self._with_assignment(coordinator_pb2.HeartbeatResponse(), request.known_generation)

    @grpc_errors
    async def GetAssignment(
        self, request: coordinator_pb2.GetAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.GetAssignmentResponse:
        return self._with_assignment(coordinator_pb2.GetAssignmentResponse(), request.known_generation)

    async def WatchAssignment(
        self, request: coordinator_pb2.WatchAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[coordinator_pb2.WatchAssignmentResponse]:
        known, leading = request.known_generation, None
        while not self.changes.closed:
            change = self.changes.next()
            if self.cluster.generation != known or self.cluster.leading != leading:
                yield self._with_assignment(coordinator_pb2.WatchAssignmentResponse(), known)
                known, leading = self.cluster.generation, self.cluster.leading
            await change.wait()

    def _with_assignment(self, response: AssignmentReply, known_generation: int) -> AssignmentReply:
        cluster = self.cluster
        response.generation, response.leader = cluster.generation, cluster.leading
        if cluster.leading and known_generation != cluster.generation:
            response.assignment.CopyFrom(assignment_to_proto(cluster))
        return response

    @grpc_errors
    async def Leave(self, request: coordinator_pb2.LeaveRequest, context: grpc.aio.ServicerContext
                    ) -> coordinator_pb2.LeaveResponse:
        self.members.leave(request.worker_id)
        return coordinator_pb2.LeaveResponse(generation=self.cluster.generation)

    @grpc_errors
    async def ListTaskStatuses(
        self, request: coordinator_pb2.ListTaskStatusesRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.ListTaskStatusesResponse:
        by_query = self.cluster.task_reports()
        wanted = [request.query_id] if request.query_id else sorted(by_query)
        return coordinator_pb2.ListTaskStatusesResponse(tasks=[
            task_report_to_proto(r) for q in wanted for r in sorted(by_query.get(q, []), key=lambda r: r.partition)])

    @grpc_errors
    async def GetClusterStatus(
        self, request: coordinator_pb2.GetClusterStatusRequest, context: grpc.aio.ServicerContext
    ) -> coordinator_pb2.GetClusterStatusResponse:
        cluster = self.cluster
        return with_election(coordinator_pb2.GetClusterStatusResponse(
            coordinator_id=self.coordinator_id(), leader=cluster.leading, generation=cluster.generation,
            hosts=host_statuses(cluster)), self.election())
