"""Wires the router: metastore replay, assignment refresh, channels to the other services."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import TypeVar

import grpc
from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.router.v1 import router_pb2, router_pb2_grpc
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc

from services.router.hosts import HostTable
from services.router.pull import Replica, Replicas, execute_pull, plan_pull
from services.router.servicer import RouterServicer
from shared.command_log import CommandReader
from shared.config import RouterSettings
from shared.errors import MillpondError, NotFoundError, StatementError, UnavailableError
from shared.metastore import Metastore
from shared.results import Outcome
from shared.rpc.metastore import SERVICE_NAME as METASTORE_SERVICE
from shared.rpc.metastore import metastore_registrar
from shared.rpc.server import RpcServer, shutdown_event
from shared.rpc.status import raise_for_rpc
from shared.session import apply_session_statement, check_properties
from shared.sql import ast
from shared.sql.parser import parse_script
from shared.sql.planner import plan_select

log = logging.getLogger(__name__)
T = TypeVar("T")


class Router:
    """The client front door."""

    def __init__(self, settings: RouterSettings):
        self.settings = settings
        self.metastore = Metastore()
        self.reader = CommandReader(settings.kafka_bootstrap_servers, settings.command_topic, self.metastore)
        self.server = RpcServer(
            settings.host, settings.port,
            [lambda s: router_pb2_grpc.add_RouterServiceServicer_to_server(RouterServicer(self), s),
             metastore_registrar(self.reader, "router")],
            [router_pb2.DESCRIPTOR.services_by_name["RouterService"].full_name, METASTORE_SERVICE],
        )
        self._coordinator_channels = [grpc.aio.insecure_channel(c) for c in settings.coordinators]
        self.coordinators = [coordinator_pb2_grpc.CoordinatorServiceStub(c) for c in self._coordinator_channels]
        self.leader = 0
        """Index of the coordinator that last said it leads (asked first)."""
        self.generation = 0
        self.hosts = HostTable(settings.host_dead_after_ms / 1000)
        """The workers' own heartbeats and lag reports to this router."""
        self.replicas: dict[str, Replicas] = {}
        """query id -> partition -> the workers to ask, active first, then standbys."""
        self._workers: dict[str, worker_pb2_grpc.WorkerServiceStub] = {}
        self._channels: list[grpc.aio.Channel] = []

    def _worker(self, endpoint: str) -> worker_pb2_grpc.WorkerServiceStub:
        stub = self._workers.get(endpoint)
        if stub is None:
            channel = grpc.aio.insecure_channel(endpoint)
            self._channels.append(channel)
            stub = self._workers[endpoint] = worker_pb2_grpc.WorkerServiceStub(channel)
        return stub

    @property
    def _timeout(self) -> float:
        return self.settings.request_timeout_ms / 1000

    async def execute(self, sql: str, properties: dict[str, str]) -> list[Outcome]:
        """Run each statement in order: pull queries here, everything else at the coordinator.

        SET and UNSET change the properties of the statements after them in this request.
        """
        session = dict(properties)
        check_properties(session)
        outcomes = []
        for stmt in parse_script(sql):
            try:
                outcomes.append(await self._execute_one(stmt, session))
            except grpc.aio.AioRpcError as err:
                raise raise_for_rpc(err) from None
            except MillpondError as err:
                if len(outcomes):
                    err.message = f"statement {len(outcomes) + 1} failed (earlier ones were applied): {err.message}"
                raise
        return outcomes

    async def _execute_one(self, stmt: ast.Statement, properties: dict[str, str]) -> Outcome:
        changed = apply_session_statement(properties, stmt)  # for the rest of this request
        if changed is not None:
            return Outcome(stmt.text, changed)
        if isinstance(stmt, ast.Query):
            if stmt.emit_changes:
                await self.reader.catch_up()
                plan_select(stmt, self.metastore.source(stmt.source))  # names and types are right
                raise StatementError("push queries (EMIT CHANGES) are planned but not executed yet")
            return await self._pull(stmt)
        request = coordinator_pb2.ExecuteStatementRequest(sql=stmt.text, properties=properties)
        # Any coordinator can execute (the command topic's transactions serialize them); the
        # leader first, the others if it is down.
        order = [self.leader, *(i for i in range(len(self.coordinators)) if i != self.leader)]
        for n, i in enumerate(order):
            try:
                response = await self.coordinators[i].ExecuteStatement(request, timeout=self._timeout)
                return Outcome.from_proto(response.result)
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or n == len(order) - 1:
                    raise
        raise AssertionError("unreachable")

    async def _pull(self, stmt: ast.Query) -> Outcome:
        try:
            plan = plan_pull(stmt, self.metastore)
        except NotFoundError:
            await self.reader.catch_up()  # a table created a moment ago via the coordinator
            plan = plan_pull(stmt, self.metastore)
        query_id = plan.table.query_id
        assert query_id is not None
        if query_id not in self.replicas:
            await self._refresh_assignment()

        async def lookup(endpoint: str, request: worker_pb2.LookupRequest) -> worker_pb2.LookupResponse:
            return await _unavailable_on_failure(self._worker(endpoint).Lookup(request, timeout=self._timeout))

        async def scan(endpoint: str, request: worker_pb2.ScanRequest) -> worker_pb2.ScanResponse:
            return await _unavailable_on_failure(self._worker(endpoint).Scan(request, timeout=self._timeout))

        # While tasks move, no replica may answer for a moment: ask again with the newest
        # assignment until the deadline.
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                replicas = {p: self.hosts.order(query_id, p, r) for p, r in self.replicas.get(query_id, {}).items()}
                return await execute_pull(plan, stmt.text, replicas, lookup, scan)
            except UnavailableError:
                if time.monotonic() + PULL_RETRY_S > deadline:
                    raise
            await asyncio.sleep(PULL_RETRY_S)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self._refresh_assignment()

    async def _refresh_assignment(self) -> None:
        """Take the newest assignment from whichever coordinator leads."""
        answers = await asyncio.gather(*(
            c.GetAssignment(coordinator_pb2.GetAssignmentRequest(known_generation=self.generation), timeout=2)
            for c in self.coordinators), return_exceptions=True)
        errors = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
        for i, answer in enumerate(answers):
            if isinstance(answer, BaseException) or not answer.leader:
                continue
            self.leader = i
            if answer.HasField("assignment") and answer.generation > self.generation:
                self.replicas, self.generation = _replicas(answer.assignment, self.settings.enable_standby_reads), \
                    answer.generation
        if len(errors) == len(answers) and errors:
            raise errors[0]

    async def _assignment_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self._refresh_assignment()
            except grpc.aio.AioRpcError as err:
                log.warning("assignment refresh failed", extra={"code": str(err.code())})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.assignment_poll_interval_ms / 1000)

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT."""
        stop = shutdown_event()
        await self.reader.start()
        await self.reader.catch_up()
        await self.server.start()
        loops = [asyncio.create_task(self.reader.run(stop)), asyncio.create_task(self._assignment_loop(stop))]
        await self.server.set_serving()
        log.info("router ready", extra={"endpoint": self.server.endpoint})
        await stop.wait()
        log.info("router stopping")
        await self.server.stop()
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        for channel in [*self._coordinator_channels, *self._channels]:
            await channel.close()
        await self.reader.stop()


PULL_RETRY_S = 0.1
_FAILOVER_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}


async def _unavailable_on_failure(call: Awaitable[T]) -> T:
    """A worker that is down or no longer holds the partition is an UnavailableError, so the
    next replica is asked; other statuses pass through."""
    try:
        return await call
    except grpc.aio.AioRpcError as err:
        if err.code() in _FAILOVER_CODES:
            raise UnavailableError(err.details() or str(err.code())) from None
        raise


def _replicas(assignment: coordinator_pb2.Assignment, standby_reads: bool) -> dict[str, Replicas]:
    """Per query and partition, the workers to ask: the active, then (if standby reads are
    on) the standbys."""
    out: dict[str, Replicas] = {}
    for worker in assignment.workers:
        for task in worker.active_tasks:
            out.setdefault(task.query_id, {}).setdefault(task.partition, []).insert(0, Replica(worker.endpoint, False))
        for task in worker.standby_tasks if standby_reads else ():
            out.setdefault(task.query_id, {}).setdefault(task.partition, []).append(Replica(worker.endpoint, True))
    return out
