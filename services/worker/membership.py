"""The worker's membership: heartbeats to every coordinator (which answer with the
assignment), status reports to every router (liveness and lags, for routing), and the
leave on shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.router.v1 import router_internal_pb2, router_internal_pb2_grpc
from millpond.services.worker.assignment import TaskAssignment
from millpond.services.worker.converters import assigned_to
from millpond.shared.config import WorkerSettings
from millpond.shared.rpc.converters import store_lag_to_common, store_lag_to_proto, task_report_to_proto
from millpond.shared.rpc.tls import ChannelFactory
from millpond.shared.task_status import StoreLag

log = logging.getLogger(__name__)


def offered_lags(lags: list[StoreLag], spark_ready: bool) -> list[StoreLag]:
    """The store lags the coordinator's assignor weighs. While the worker's Spark session
    starts (tens of seconds on a busy machine) its standby and warm-up copies are left out:
    none then counts as caught up, so no active moves here before it could run; the
    assignor keeps it where it runs and warms this copy up (as a Kafka Streams instance
    warms up before it takes a task over)."""
    return lags if spark_ready else [lag for lag in lags if lag.active]


class MembershipAgent:
    """Beats the coordinators and the routers on behalf of this worker's tasks."""

    def __init__(self, settings: WorkerSettings, channels: ChannelFactory, tasks: TaskAssignment,
                 endpoint: Callable[[], str]):
        self.settings = settings
        self.channels = channels
        self.tasks = tasks
        """What is reported, and what takes a new assignment."""
        self.endpoint = endpoint
        """host:port of this worker's gRPC server (known once it listens)."""

    async def heartbeat_loop(self, stop: asyncio.Event, coordinator: str) -> None:
        """Beat one coordinator: every coordinator tracks the members, so a follower that
        takes over knows them and what they run; only the leader answers with assignments."""
        interval = self.settings.heartbeat_interval_ms / 1000
        tasks = self.tasks
        while not stop.is_set():
            stub = self.channels.stub(coordinator, coordinator_pb2_grpc.CoordinatorServiceStub)
            try:
                response = await stub.Heartbeat(coordinator_pb2.HeartbeatRequest(
                    worker_id=self.settings.worker_id, endpoint=self.endpoint(),
                    known_generation=tasks.generation, tasks=[task_report_to_proto(r) for r in tasks.task_reports()],
                    lags=[store_lag_to_proto(lag) for lag in offered_lags(tasks.store_lags(), tasks.spark.ready)]),
                    timeout=2)
                # A newer leader's generations are larger: an older leader cannot undo its orders.
                if response.HasField("assignment") and response.generation > tasks.generation:
                    tasks.take(response.assignment.generation,
                               *assigned_to(self.settings.worker_id, response.assignment))
            except grpc.aio.AioRpcError as err:
                log.warning("heartbeat failed", extra={"coordinator": coordinator, "code": str(err.code())})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def report_loop(self, stop: asyncio.Event, router: str) -> None:
        """Beat one router with this worker's lags, for its failure detector and lag-aware routing."""
        interval = self.settings.heartbeat_interval_ms / 1000
        while not stop.is_set():
            stub = self.channels.stub(router, router_internal_pb2_grpc.RouterInternalServiceStub)
            try:
                await stub.ReportWorkerStatus(router_internal_pb2.ReportWorkerStatusRequest(
                    worker_id=self.settings.worker_id, endpoint=self.endpoint(),
                    lags=[store_lag_to_common(lag) for lag in self.tasks.store_lags()]), timeout=2)
            except grpc.aio.AioRpcError as err:
                log.debug("lag report failed", extra={"router": router, "code": str(err.code())})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def leave(self) -> None:
        """Tell the coordinators this worker is going, so its tasks move now (to caught-up
        standbys) rather than after its heartbeats time out."""
        for coordinator in self.settings.coordinators:
            try:
                await self.channels.stub(coordinator, coordinator_pb2_grpc.CoordinatorServiceStub).Leave(
                    coordinator_pb2.LeaveRequest(worker_id=self.settings.worker_id), timeout=2)
            except grpc.aio.AioRpcError as err:
                log.warning("could not leave the cluster; the coordinator will time the worker out",
                            extra={"coordinator": coordinator, "code": str(err.code())})
