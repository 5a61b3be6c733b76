"""Wires the router: metastore replay, assignment refresh, channels to the other services."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import TypeVar

import grpc

from millpond.common.v1 import rows_pb2
from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.router.v1 import router_pb2, router_pb2_grpc
from millpond.services.router.hosts import HostTable, PullBounds
from millpond.services.router.pull import PullPlan, Replica, Replicas, Route, execute_pull, plan_pull
from millpond.services.router.push import PushQuery
from millpond.services.router.servicer import RouterServicer
from millpond.shared import consistency, metrics, security
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.sources import DataSource
from millpond.shared.config import RouterSettings
from millpond.shared.errors import LimitError, MillpondError, NotFoundError, StatementError, UnavailableError
from millpond.shared.kafka.command_log import CommandReader
from millpond.shared.kafka.serde import to_proto
from millpond.shared.results import Outcome
from millpond.shared.rpc.converters import outcome_from_proto
from millpond.shared.rpc.metastore import SERVICE_NAME as METASTORE_SERVICE
from millpond.shared.rpc.metastore import metastore_registrar
from millpond.shared.rpc.server import RpcServer, message_limits, shutdown_event
from millpond.shared.rpc.status import raise_for_rpc, status_code
from millpond.shared.rpc.tls import ChannelFactory
from millpond.shared.security import authorize_statement
from millpond.shared.session import (
    AUTO_OFFSET_RESET,
    ENABLE_STANDBY_READS,
    MAX_OFFSET_LAG,
    MAX_STALENESS_MS,
    apply_session_statement,
    check_properties,
    effective,
)
from millpond.shared.sql import ast
from millpond.shared.sql.parser import parse_script
from millpond.shared.sql.planner import plan_select
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")


class Router:
    """The client front door."""

    def __init__(self, settings: RouterSettings):
        self.settings = settings
        self.metastore = Metastore()
        self.reader = CommandReader(settings.kafka, settings.command_topic, self.metastore)
        self.server = RpcServer(
            settings,
            [lambda s: router_pb2_grpc.add_RouterServiceServicer_to_server(RouterServicer(self), s),
             metastore_registrar(self.reader, "router")],
            [router_pb2.DESCRIPTOR.services_by_name["RouterService"].full_name, METASTORE_SERVICE],
        )
        self.channels = ChannelFactory(settings.tls, message_limits(settings.max_message_bytes))
        """One channel per coordinator and worker, shared by every request (mutual TLS when configured)."""
        self.leader = 0
        """Index of the coordinator that last said it leads (asked first)."""
        self.generation = 0
        self.hosts = HostTable(settings.host_dead_after_ms / 1000)
        """The workers' own heartbeats and lag reports to this router."""
        self.replicas: dict[str, Replicas] = {}
        """query id -> partition -> the workers to ask, active first, then standbys."""
        self._plans: dict[tuple[str, int], PullPlan] = {}
        self.pushes: dict[str, PushQuery] = {}
        """The push queries this router streams now, by id."""
        self._push_clients: dict[str, str] = {}
        """Push query id -> the client streaming it."""

    def _worker(self, endpoint: str) -> worker_pb2_grpc.WorkerServiceStub:
        return self.channels.stub(endpoint, worker_pb2_grpc.WorkerServiceStub)

    @property
    def coordinators(self) -> list[coordinator_pb2_grpc.CoordinatorServiceStub]:
        """A stub per coordinator, in configuration order."""
        return [self.channels.stub(c, coordinator_pb2_grpc.CoordinatorServiceStub) for c in self.settings.coordinators]

    def _check_length(self, sql: str) -> None:
        if len(sql) > self.settings.max_statement_chars:
            raise StatementError(f"the statement text is {len(sql)} characters; this router accepts at most "
                                 f"{self.settings.max_statement_chars} (max_statement_chars): send fewer statements "
                                 "per request")

    @property
    def _timeout(self) -> float:
        return self.settings.request_timeout_ms / 1000

    async def execute(self, sql: str, properties: dict[str, str], token: str = "",
                      time_remaining: float | None = None) -> list[Outcome]:
        """Run each statement in order: pull queries here, everything else at the coordinator.

        SET and UNSET change the properties of the statements after them in this request.
        Pull queries and INSERTs carry the consistency token to send next: the request's
        token merged with the positions they reflect.
        """
        self._check_length(sql)
        session = dict(properties)
        check_properties(session)
        positions = consistency.decode(token)
        principal = security.CURRENT.get()
        deadline = self._deadline(time_remaining)
        outcomes: list[Outcome] = []
        for stmt in self._parse(sql):
            try:
                authorize_statement(principal, stmt)
                outcome, seen = await self._execute_one(stmt, session, positions, deadline)
            except grpc.aio.AioRpcError as err:
                raise raise_for_rpc(err) from None
            except MillpondError as err:
                if len(outcomes):
                    err.message = f"statement {len(outcomes) + 1} failed (earlier ones were applied): {err.message}"
                raise
            if seen is not None:
                positions = consistency.merge(positions, seen)
                outcome.consistency_token = consistency.encode(positions)
            outcomes.append(outcome)
        return outcomes

    def _deadline(self, time_remaining: float | None) -> float:
        """When this request must be answered: the router's own timeout, or the client's
        deadline less a margin to send a clear error before the client gives up."""
        budget = self._timeout if time_remaining is None else min(self._timeout, time_remaining - DEADLINE_MARGIN_S)
        return time.monotonic() + max(budget, 0.0)

    @functools.lru_cache(maxsize=1024)  # noqa: B019 - one router per process; statements are immutable
    def _parse(self, sql: str) -> tuple[ast.Statement, ...]:
        return tuple(parse_script(sql))

    async def _execute_one(self, stmt: ast.Statement, properties: dict[str, str], positions: consistency.Positions,
                           deadline: float) -> tuple[Outcome, consistency.Positions | None]:
        changed = apply_session_statement(properties, stmt)  # for the rest of this request
        if changed is not None:
            return Outcome(stmt.text, changed), None
        if isinstance(stmt, ast.Query):
            if stmt.emit_changes:
                raise StatementError("a push query (EMIT CHANGES) streams its rows: call RouterService/StreamQuery "
                                     "(millpond sql runs it that way), not Execute")
            started, result = time.monotonic(), "INTERNAL"
            try:
                answer = await self._pull(stmt, properties, positions, deadline)
                result = "OK"
                return answer
            except MillpondError as err:
                result = status_code(err.kind).name
                raise
            finally:
                metrics.PULL_SECONDS.labels(result).observe(time.monotonic() - started)
                metrics.PULL_QUERIES.labels(result).inc()
        request = coordinator_pb2.ExecuteStatementRequest(sql=stmt.text, properties=properties)
        # Any coordinator can execute (the command topic's transactions serialize them); the
        # leader first, the others if it is down.
        order = [self.leader, *(i for i in range(len(self.coordinators)) if i != self.leader)]
        for n, i in enumerate(order):
            try:
                response = await self.coordinators[i].ExecuteStatement(request, timeout=self._timeout)
                outcome = outcome_from_proto(response.result)
                if isinstance(stmt, ast.InsertValues):
                    target = self.metastore.sources.get(stmt.target) or await self._caught_up_source(stmt.target)
                    return outcome, {(target.topic, outcome.partition): outcome.offset + 1}
                return outcome, None
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or n == len(order) - 1:
                    raise
        raise AssertionError("unreachable")

    async def _caught_up_source(self, name: str) -> DataSource:
        await self.reader.catch_up()
        return self.metastore.source(name)

    async def _plan(self, stmt: ast.Query) -> PullPlan:
        """The pull plan, cached per statement text and metastore version."""
        cache_key = (stmt.text, self.metastore.command_offset)
        plan = self._plans.get(cache_key)
        if plan is None:
            try:
                plan = plan_pull(stmt, self.metastore, self.settings.service_id)
            except NotFoundError:
                await self.reader.catch_up()  # a table created a moment ago via the coordinator
                plan = plan_pull(stmt, self.metastore, self.settings.service_id)
                cache_key = (stmt.text, self.metastore.command_offset)
            if len(self._plans) >= PLAN_CACHE_SIZE:
                self._plans.clear()
            self._plans[cache_key] = plan
        return plan

    def bounds(self, properties: Mapping[str, str]) -> PullBounds:
        """The request's pull-query bounds, the router's settings where it sets none."""
        def number(name: str, default: int | None) -> int | None:
            return int(properties[name]) if name in properties else default

        standby = properties.get(ENABLE_STANDBY_READS)
        return PullBounds(
            standby_reads=self.settings.enable_standby_reads if standby is None else standby == "true",
            max_offset_lag=number(MAX_OFFSET_LAG, self.settings.max_allowed_offset_lag),
            max_staleness_ms=number(MAX_STALENESS_MS, self.settings.max_staleness_ms))

    async def _pull(self, stmt: ast.Query, properties: Mapping[str, str], positions: consistency.Positions,
                    deadline: float) -> tuple[Outcome, consistency.Positions]:
        plan = await self._plan(stmt)
        query_id = plan.table.query_id
        assert query_id is not None
        if query_id not in self.replicas:
            await self._refresh_assignment()
        bounds = self.bounds(properties)

        def remaining(cap: float | None = None) -> float:
            left = deadline - time.monotonic()
            return max(left if cap is None else min(left, cap), 0.001)

        # A lookup that takes longer than pull_host_timeout_ms goes to the next copy; a scan's
        # time grows with the table, so it has the whole deadline.
        async def lookup(endpoint: str, request: worker_pb2.LookupRequest) -> worker_pb2.LookupResponse:
            return await _unavailable_on_failure(self._worker(endpoint).Lookup(
                request, timeout=remaining(self.settings.pull_host_timeout_ms / 1000)))

        async def scan(endpoint: str, request: worker_pb2.ScanRequest) -> worker_pb2.ScanResponse:
            return await _unavailable_on_failure(self._worker(endpoint).Scan(request, timeout=remaining()))

        def route(partition: int) -> Route:
            needed = positions.get((plan.input_topic, partition), 0)
            copies = self.replicas.get(query_id, {}).get(partition, [])
            chosen, excluded = self.hosts.choose(query_id, partition, copies, bounds, needed)
            return Route(chosen, excluded, needed)

        # While tasks move, or while copies catch up with the token, no copy may qualify for a
        # moment: ask again with the newest assignment until the deadline.
        while True:
            try:
                result = await execute_pull(plan, stmt.text, route, lookup, scan, self.settings.max_rows_per_response)
                return result.outcome, consistency.of_partitions(plan.input_topic, result.positions.items())
            except UnavailableError:
                if time.monotonic() + PULL_RETRY_S > deadline:
                    raise
            await asyncio.sleep(PULL_RETRY_S)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self._refresh_assignment()

    async def stream(self, sql: str, properties: dict[str, str],
                     client: str) -> AsyncIterator[router_pb2.StreamQueryResponse]:
        """Run one push query for ``client`` (who asks, for the per-client limit): a header,
        then its rows as they happen."""
        self._check_length(sql)
        session = dict(properties)
        check_properties(session)
        statements = self._parse(sql)
        if len(statements) != 1 or not isinstance(statements[0], ast.Query) or not statements[0].emit_changes:
            raise StatementError("StreamQuery takes exactly one push query: SELECT ... FROM ... EMIT CHANGES")
        stmt = statements[0]
        try:
            source = self.metastore.source(stmt.source)
        except NotFoundError:
            source = await self._caught_up_source(stmt.source)
        if len(self.pushes) >= self.settings.max_push_queries:
            raise UnavailableError(f"this router already streams {len(self.pushes)} push queries (its limit, "
                                   "max_push_queries); try another router or later")
        mine = sum(c == client for c in self._push_clients.values())
        if mine >= self.settings.max_push_queries_per_client:
            raise LimitError(f"{client} already runs {mine} push queries on this router, the most one client may "
                             "(max_push_queries_per_client); cancel one first")
        push = PushQuery(plan_select(stmt, source), self.settings.kafka,
                         from_beginning=effective(session).get(AUTO_OFFSET_RESET) == "earliest")
        self.pushes[push.query_id] = push
        self._push_clients[push.query_id] = client
        metrics.PUSH_QUERIES.set(len(self.pushes))
        try:
            await push.start()
            yield router_pb2.StreamQueryResponse(header=router_pb2.StreamHeader(
                query_id=push.query_id,
                columns=[rows_pb2.Column(name=n, type=str(t)) for n, t in push.plan.columns]))
            async for row in push.rows():
                yield router_pb2.StreamQueryResponse(row=rows_pb2.Row(values=[to_proto(v) for v in row]))
                metrics.PUSH_ROWS.inc()
        finally:
            del self.pushes[push.query_id]
            del self._push_clients[push.query_id]
            metrics.PUSH_QUERIES.set(len(self.pushes))
            await push.stop()

    async def cluster_status(self) -> router_pb2.GetClusterStatusResponse:
        """The leading coordinator's cluster status with this router's view of the workers."""
        answers = await asyncio.gather(*(
            c.GetClusterStatus(coordinator_pb2.GetClusterStatusRequest(), timeout=self._timeout)
            for c in self.coordinators), return_exceptions=True)
        leader = next((a for a in answers if isinstance(a, coordinator_pb2.GetClusterStatusResponse) and a.leader),
                      None)
        if leader is None:
            replies = "; ".join(f"{e}: {a.code().name if isinstance(a, grpc.aio.AioRpcError) else 'follower'}"
                                for e, a in zip(self.settings.coordinators, answers, strict=True))
            raise UnavailableError(f"no coordinator leads the cluster ({replies}); a new leader is elected within "
                                   "the leader session timeout")
        now = self.hosts.clock()
        return router_pb2.GetClusterStatusResponse(
            cluster=leader, push_queries=len(self.pushes),
            router_hosts=[router_pb2.RouterHostView(endpoint=e, worker_id=v.worker_id, alive=not self.hosts.dead(e),
                                                    last_beat_age_ms=int((now - v.last_beat) * 1000))
                          for e, v in sorted(self.hosts.hosts.items())])

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
                self.replicas, self.generation = _replicas(answer.assignment), answer.generation
        if len(errors) == len(answers) and errors:
            raise errors[0]

    async def _assignment_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for endpoint, view in self.hosts.hosts.items():
                metrics.HOST_ALIVE.labels(view.worker_id).set(0 if self.hosts.dead(endpoint) else 1)
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
        metrics.serve(self.settings.host, self.settings.metrics_port)
        loops = [asyncio.create_task(self.reader.run(stop)), asyncio.create_task(self._assignment_loop(stop))]
        await self.server.set_serving()
        log.info("router ready", extra={"endpoint": self.server.endpoint})
        await stop.wait()
        log.info("router stopping")
        await self.server.stop()
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await self.channels.close()
        await self.reader.stop()


PULL_RETRY_S = 0.1
DEADLINE_MARGIN_S = 0.05
PLAN_CACHE_SIZE = 1024
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


def _replicas(assignment: coordinator_pb2.Assignment) -> dict[str, Replicas]:
    """Per query and partition, the workers holding a copy: the active, then the standbys."""
    out: dict[str, Replicas] = {}
    for worker in assignment.workers:
        for task in worker.active_tasks:
            out.setdefault(task.query_id, {}).setdefault(task.partition, []).insert(0, Replica(worker.endpoint, False))
        for task in worker.standby_tasks:
            out.setdefault(task.query_id, {}).setdefault(task.partition, []).append(Replica(worker.endpoint, True))
    return out
