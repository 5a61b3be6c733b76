"""Pull-query routing: the plan cache, the assignment (which workers hold which table
partition), the request's bounds, and the calls to the workers with failover."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Mapping
from typing import Protocol, TypeVar

import grpc
from aiokafka.errors import KafkaError

from millpond.coordinator.v1 import coordinator_pb2
from millpond.services.router.converters import replicas_from_assignment
from millpond.services.router.coordinators import Coordinators
from millpond.services.router.hosts import HostTable, PullBounds
from millpond.services.router.lookup_streams import FAILOVER_CODES, LookupStreams
from millpond.services.router.pull import (
    LookupAnswer,
    PullPlan,
    PullResult,
    Replicas,
    Route,
    execute_pull,
    legacy_page,
    lookup_answer,
    lookup_request,
    lookup_result,
    plan_pull,
)
from millpond.shared import consistency, metrics
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import RouterSettings
from millpond.shared.errors import NotFoundError, UnavailableError
from millpond.shared.events import wait_at_most
from millpond.shared.kafka.command_log import CommandReader
from millpond.shared.results import Outcome
from millpond.shared.rpc.tls import ChannelFactory
from millpond.shared.session import ENABLE_STANDBY_READS, MAX_OFFSET_LAG, MAX_STALENESS_MS
from millpond.shared.sql import ast
from millpond.shared.sql.guard import CACHED_PLAN_CHARS
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")

PULL_RETRY_S = 0.1
TOKEN_ANSWER_S = 0.1
"""What a copy waiting for its token keeps of its time to say why it could not wait longer."""
WATCH_RETRY_S = 0.5
"""Pause before following a coordinator again whose assignment stream ended or failed."""
PLAN_CACHE_SIZE = 1024
LOCAL_HOPS, REMOTE_HOPS = metrics.PULL_HOPS.labels("local"), metrics.PULL_HOPS.labels("remote")
"""The hop counters, labelled once (``labels`` costs a lock and a lookup per call)."""
STAGE_CACHE_SIZE = 4096
"""StagePositions answers a router keeps (``PullRouter._stage_positions``)."""


class PlanOutdated(UnavailableError):
    """No copy answered a pull's plan, and the metastore it was made from has moved on since:
    plan the statement again, as written (a custom type in it may be defined anew)."""


class LocalWorker(Protocol):
    """The worker this router runs in, when it runs in one (``WorkerSettings.serve_router``)."""

    @property
    def endpoint(self) -> str:
        """The worker's host:port, as the assignment names it."""

    async def lookup(self, request: worker_pb2.LookupRequest) -> LookupAnswer:
        """WorkerService/Lookup's answer, in-process (UnavailableError when no copy here may answer)."""

    def scan(self, request: worker_pb2.ScanPagesRequest) -> AsyncGenerator[worker_pb2.ScanPagesResponse, None]:
        """WorkerService/Scan's pages, in-process."""


class PullRouter:
    """Answers pull queries from the workers' table copies."""

    def __init__(self, settings: RouterSettings, metastore: Metastore, reader: CommandReader,
                 channels: ChannelFactory, coordinators: Coordinators, hosts: HostTable,
                 local: LocalWorker | None = None):
        self.settings = settings
        self.metastore = metastore
        self.reader = reader
        self.channels = channels
        """One channel per worker, shared by every request (mutual TLS when configured)."""
        self.lookups = LookupStreams(channels)
        """One lookup stream per worker, over those channels."""
        self.coordinators = coordinators
        self.hosts = hosts
        """The workers' own heartbeats and lag reports to this router."""
        self.generation = 0
        self.replicas: dict[str, Replicas] = {}
        """query id -> partition -> the workers to ask, active first, then standbys."""
        self._plans: dict[tuple[str, int], PullPlan] = {}
        self._stage_ends: dict[tuple[str, str, int], tuple[int, dict[int, int]]] = {}
        """(query, stage, input partition) -> the input offset a StagePositions answer was asked
        for and the output positions it gave (``_stage_positions``)."""
        self.local = local
        """The worker this router runs in: its copies are read in-process, without a hop."""
        self._default_bounds = PullBounds(settings.enable_standby_reads, settings.max_allowed_offset_lag,
                                          settings.max_staleness_ms)
        """A request's bounds when it sets none (``bounds``)."""

    def _worker(self, endpoint: str) -> worker_pb2_grpc.WorkerServiceStub:
        return self.channels.stub(endpoint, worker_pb2_grpc.WorkerServiceStub)

    async def plan(self, stmt: ast.Query) -> PullPlan:
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
            if len(stmt.text) <= CACHED_PLAN_CHARS:
                if len(self._plans) >= PLAN_CACHE_SIZE:
                    self._plans.clear()
                self._plans[cache_key] = plan
        return plan

    def bounds(self, properties: Mapping[str, str]) -> PullBounds:
        """The request's pull-query bounds, the router's settings where it sets none."""
        if not properties:
            return self._default_bounds
        def number(name: str, default: int | None) -> int | None:
            return int(properties[name]) if name in properties else default

        standby = properties.get(ENABLE_STANDBY_READS)
        return PullBounds(
            standby_reads=self.settings.enable_standby_reads if standby is None else standby == "true",
            max_offset_lag=number(MAX_OFFSET_LAG, self.settings.max_allowed_offset_lag),
            max_staleness_ms=number(MAX_STALENESS_MS, self.settings.max_staleness_ms))

    async def pull(self, stmt: ast.Query, plan: PullPlan, properties: Mapping[str, str],
                   positions: consistency.Positions, deadline: float) -> tuple[Outcome, consistency.Positions]:
        """Answer one pull query, planned as ``plan``, by ``deadline`` from copies that reflect
        ``positions``; its outcome and the input positions it reflects."""
        query_id = plan.table.query_id
        assert query_id is not None
        if query_id not in self.replicas:
            await self.refresh_assignment()
        bounds = self.bounds(properties)
        # The token's positions on the topics of the stages before the table's are carried to
        # its input (the result's token holds the input's positions alone, as always).
        if plan.upstream and any(topic == reads for topic, _ in positions for _, reads, _ in plan.upstream):
            positions = await self._carry(query_id, plan, positions, deadline)

        local = self.local
        failed: dict[int, str] = {}
        """The partition whose own copy could not answer the short path, with why: not asked again at once."""
        if local is not None and plan.looks_up and plan.limit != 0:
            answered = await self._local_lookup(local, stmt.text, plan, bounds, positions, failed,
                                                self._token_wait(deadline))
            if answered is not None:
                return answered.outcome, consistency.of_partitions(plan.input_topic, answered.positions.items())

        def remaining(cap: float | None = None) -> float:
            left = deadline - time.monotonic()
            return max(left if cap is None else min(left, cap), 0.001)

        # A lookup that takes longer than pull_host_timeout_ms goes to the next copy; a scan's
        # time grows with the table, so it has the whole deadline.
        async def lookup(endpoint: str, request: worker_pb2.LookupRequest) -> LookupAnswer:
            if local is not None and endpoint == local.endpoint:
                LOCAL_HOPS.inc()
                answer = await local.lookup(request)
            else:
                REMOTE_HOPS.inc()
                host_timeout_s = self.settings.pull_host_timeout_ms / 1000
                answer = lookup_answer(await self.lookups.lookup(endpoint, request, remaining(host_timeout_s), host_timeout_s))
            self.hosts.answered(endpoint, query_id, request.partition, answer.input_offset)
            return answer

        def scan(endpoint: str, request: worker_pb2.ScanPagesRequest) -> AsyncGenerator[worker_pb2.ScanPagesResponse, None]:
            if local is not None and endpoint == local.endpoint:
                LOCAL_HOPS.inc()
                return self._noted(endpoint, query_id, local.scan(request))
            REMOTE_HOPS.inc()
            return self._noted(endpoint, query_id, remote_pages(self._worker(endpoint), request, plan, remaining()))

        def route(partition: int) -> Route:
            way = self._route(plan, partition, bounds, positions, self._token_wait(deadline))
            reason = failed.pop(partition, None)
            if reason is not None and way.candidates and local is not None and way.candidates[0].endpoint == local.endpoint:
                return dataclasses.replace(way, candidates=way.candidates[1:], excluded=[*way.excluded, reason])
            return way

        # While tasks move, or while copies catch up with the token, no copy may qualify for a
        # moment: ask again with the newest assignment until the deadline. A copy may also
        # refuse a plan this router made from a metastore older than its own (a custom type
        # defined anew, say): the statement is then planned again once this one has caught up.
        version = self.metastore.command_offset
        while True:
            try:
                result = await execute_pull(plan, stmt.text, route, lookup, scan, self.settings.max_rows_per_response)
                return result.outcome, consistency.of_partitions(plan.input_topic, result.positions.items())
            except UnavailableError as err:
                if time.monotonic() + PULL_RETRY_S > deadline:
                    raise
                if await self._metastore_moved(version, deadline - PULL_RETRY_S):
                    raise PlanOutdated(err.message) from err
                if time.monotonic() + PULL_RETRY_S > deadline:
                    raise
            await asyncio.sleep(PULL_RETRY_S)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.refresh_assignment()

    async def _metastore_moved(self, since: int, deadline: float) -> bool:
        """Whether the metastore is past version ``since`` once it has read the command topic
        to its end (as far as ``deadline`` allows)."""
        if self.reader is not None:
            with contextlib.suppress(UnavailableError, KafkaError, TimeoutError):
                await asyncio.wait_for(self.reader.catch_up(), max(deadline - time.monotonic(), 0.001))
        return self.metastore.command_offset != since

    async def _noted(self, endpoint: str, query_id: str, pages: AsyncGenerator[worker_pb2.ScanPagesResponse, None]
                     ) -> AsyncGenerator[worker_pb2.ScanPagesResponse, None]:
        """``pages``, each partition's position in them remembered as one its copy answered at
        (``HostTable.answered``), as a key lookup's is."""
        async with contextlib.aclosing(pages):
            async for page in pages:
                for partition, offset in page.input_offsets.items():
                    self.hosts.answered(endpoint, query_id, partition, offset)
                yield page

    def _token_wait(self, deadline: float) -> float:
        """How long a copy may wait for the token: within the request's deadline and the time a
        worker has to answer a lookup, less what it keeps to answer."""
        left = min(deadline - time.monotonic(), self.settings.pull_host_timeout_ms / 1000)
        return max(left - TOKEN_ANSWER_S, 0.0)

    def _route(self, plan: PullPlan, partition: int, bounds: PullBounds, positions: consistency.Positions,
               wait_s: float = 0.0) -> Route:
        """Whom to ask for ``partition`` of the plan's table under ``bounds`` and the token's
        ``positions``. When no copy qualifies but for its reported position (behind the token)
        and ``wait_s`` allows, the active is asked to wait for it that long: the reports trail
        the commits by up to a heartbeat, and a write just made is usually in the batch being
        committed (asking again until a report shows it took a batch cycle and up to two retry
        pauses more). So is an active asked first whose position no report shows yet (a
        partition that just moved, a worker that reports elsewhere); a standby asked first is
        asked as it is, without a wait, so that the next copy's turn comes at once."""
        query_id = plan.table.query_id
        assert query_id is not None
        needed = positions.get((plan.input_topic, partition), 0)
        copies = self.replicas.get(query_id, {}).get(partition, [])
        chosen, excluded = self.hosts.choose(query_id, partition, copies, bounds, needed)
        wait_ms = int(wait_s * 1000)
        if chosen and needed > 0 and wait_ms > 0 and not chosen[0].standby \
                and not self.hosts.reached(chosen[0].endpoint, query_id, partition, needed):
            return Route(chosen, excluded, needed, wait_ms)
        if not chosen and needed > 0 and wait_ms > 0:
            active = [r for r in self.hosts.choose(query_id, partition, copies, bounds)[0] if not r.standby]
            if active:  # (its own line among the excluded goes: it is asked, and says why if it fails)
                own = f"{active[0].endpoint} (active): "
                return Route(active, [line for line in excluded if not line.startswith(own)], needed, wait_ms)
        return Route(chosen, excluded, needed)

    async def _local_lookup(self, local: LocalWorker, text: str, plan: PullPlan, bounds: PullBounds,
                            positions: consistency.Positions, failed: dict[int, str],
                            wait_s: float) -> PullResult | None:
        """A key lookup answered in-process when the first copy its route names is this
        worker's: the usual case of co-located routing, without the general path's steps.
        None when it is not, or when that copy cannot answer (why, in ``failed``): the
        general path then asks the other copies in turn and says why none could."""
        assert plan.partition is not None
        way = self._route(plan, plan.partition, bounds, positions, wait_s)
        if not way.candidates or way.candidates[0].endpoint != local.endpoint:
            return None
        own = way.candidates[0]
        LOCAL_HOPS.inc()
        try:
            found = await local.lookup(lookup_request(plan, own, way))
        except UnavailableError as err:
            failed[plan.partition] = f"{own.endpoint} ({'standby' if own.standby else 'active'}): {err.message}"
            return None
        assert plan.table.query_id is not None
        self.hosts.answered(own.endpoint, plan.table.query_id, plan.partition, found.input_offset)
        return lookup_result(plan, text, found)

    async def _carry(self, query_id: str, plan: PullPlan, positions: consistency.Positions,
                     deadline: float) -> consistency.Positions:
        """``positions`` and, through each stage before the table's (``plan.upstream``), what
        they become on the topic the stage writes: how far its tasks had written once they had
        committed the input up to them. A token from an INSERT into a table's source thus
        reaches the table through a repartition or a join's stages (read-your-writes)."""
        for stage, reads, writes in plan.upstream:
            wanted = {p: o for (topic, p), o in positions.items() if topic == reads}
            if wanted:
                ends = await self._stage_positions(query_id, stage, wanted, deadline)
                if ends is None:
                    return positions
                positions = consistency.merge(positions, consistency.of_partitions(writes, ends.items()))
        return positions

    async def _stage_positions(self, query_id: str, stage: str, wanted: dict[int, int],
                               deadline: float) -> dict[int, int] | None:
        """Merged, what each wanted partition's active task of ``stage`` had written once it
        had committed the wanted offset (``WorkerService/StagePositions``, a call per partition,
        concurrently, again after a move, until ``deadline``: then UnavailableError). An answer
        serves again for any offset up to the one it was asked for. None: a worker of a version
        without the call (the token is not carried)."""
        ends: dict[int, int] = {}

        def take(found: Mapping[int, int]) -> None:
            for partition, end in found.items():
                ends[partition] = max(ends.get(partition, 0), end)

        pending: dict[int, int] = {}
        for partition, offset in wanted.items():
            known = self._stage_ends.get((query_id, stage, partition))
            if known is not None and offset <= known[0]:
                take(known[1])
            else:
                pending[partition] = offset
        problems: list[str] = []
        while pending:
            asked: dict[int, str] = {}
            for partition in pending:
                active = next((r.endpoint for r in self.replicas.get(query_id, {}).get(partition, []) if not r.standby),
                              None)
                if active is None:
                    problems.append(f"partition {partition} has no active task")
                else:
                    asked[partition] = active
            answers = await asyncio.gather(*(self._worker(endpoint).StagePositions(
                worker_pb2.StagePositionsRequest(query_id=query_id, stage=stage, input_offsets={p: pending[p]}),
                timeout=max(deadline - time.monotonic(), 0.001)) for p, endpoint in asked.items()),
                return_exceptions=True)
            for (partition, endpoint), answer in zip(asked.items(), answers, strict=True):
                if isinstance(answer, worker_pb2.StagePositionsResponse):
                    found = dict(answer.output_offsets)
                    take(found)
                    if len(self._stage_ends) >= STAGE_CACHE_SIZE:
                        self._stage_ends.clear()
                    self._stage_ends[(query_id, stage, partition)] = (pending.pop(partition), found)
                elif not isinstance(answer, grpc.aio.AioRpcError):
                    raise answer
                elif answer.code() is grpc.StatusCode.UNIMPLEMENTED:
                    log.warning("a worker cannot carry consistency tokens through a query's stages: the pull reads "
                                "the table without waiting for them", extra={"worker": endpoint, "query": query_id})
                    return None
                elif answer.code() in FAILOVER_CODES:
                    problems.append(f"{endpoint}: {answer.details()}")
                else:
                    raise UnavailableError(f"the consistency token cannot be carried through stage {stage!r} of "
                                           f"query {query_id}: {endpoint} answered {answer.code().name}: "
                                           f"{answer.details()}")
            if not pending:
                break
            if time.monotonic() + PULL_RETRY_S > deadline:
                raise UnavailableError(f"the consistency token was not reached in time by stage {stage!r} of query "
                                       f"{query_id}: {problems[-1]}")
            await asyncio.sleep(PULL_RETRY_S)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.refresh_assignment()
        return ends

    def _take(self, index: int, answer: coordinator_pb2.GetAssignmentResponse | coordinator_pb2.WatchAssignmentResponse
              ) -> None:
        """One coordinator's answer: the leader's newer assignment replaces the router's."""
        if not answer.leader:
            return
        self.coordinators.leader = index
        if answer.HasField("assignment") and answer.generation > self.generation:
            self.replicas, self.generation = replicas_from_assignment(answer.assignment), answer.generation

    async def refresh_assignment(self) -> None:
        """Take the newest assignment from whichever coordinator leads."""
        answers = await asyncio.gather(*(
            c.GetAssignment(coordinator_pb2.GetAssignmentRequest(known_generation=self.generation), timeout=2)
            for c in self.coordinators.stubs), return_exceptions=True)
        errors = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
        for i, answer in enumerate(answers):
            if not isinstance(answer, BaseException):
                self._take(i, answer)
        if len(errors) == len(answers) and errors:
            raise errors[0]

    async def follow(self, index: int, stop: asyncio.Event) -> None:
        """Take coordinator ``index``'s assignment as it pushes each change (so tasks that
        moved are asked at once), following it again after a pause whenever its stream ends."""
        while not stop.is_set():
            stub = self.coordinators.stubs[index]
            try:
                async for answer in stub.WatchAssignment(
                        coordinator_pb2.WatchAssignmentRequest(known_generation=self.generation)):
                    self._take(index, answer)
            except grpc.aio.AioRpcError as err:
                log.debug("assignment stream ended", extra={"coordinator": self.coordinators.endpoints[index],
                                                            "code": str(err.code())})
            await wait_at_most(stop, WATCH_RETRY_S)

    async def run(self, stop: asyncio.Event) -> None:
        """Follow every coordinator's assignment stream until ``stop``; meanwhile refresh the
        host gauges, and the assignment by polling (in case a stream is down), every poll
        interval."""
        followers = [asyncio.create_task(self.follow(i, stop)) for i in range(len(self.coordinators.endpoints))]
        try:
            while not stop.is_set():
                for endpoint, view in self.hosts.hosts.items():
                    metrics.HOST_ALIVE.labels(view.worker_id).set(0 if self.hosts.dead(endpoint) else 1)
                try:
                    await self.refresh_assignment()
                except grpc.aio.AioRpcError as err:
                    log.warning("assignment refresh failed", extra={"code": str(err.code())})
                await wait_at_most(stop, self.settings.assignment_poll_interval_ms / 1000)
        finally:
            for follower in followers:
                follower.cancel()
            await asyncio.gather(*followers, return_exceptions=True)


async def _unavailable_on_failure(call: Awaitable[T]) -> T:
    """A worker that is down or no longer holds the partition is an UnavailableError, so the
    next replica is asked; other statuses pass through."""
    try:
        return await call
    except grpc.aio.AioRpcError as err:
        raise _failover_error(err) from None


async def remote_pages(worker: worker_pb2_grpc.WorkerServiceStub, request: worker_pb2.ScanPagesRequest,
                       plan: PullPlan, call_timeout: float) -> AsyncGenerator[worker_pb2.ScanPagesResponse, None]:
    """A worker's ScanPages, its failure as ``_unavailable_on_failure``'s; a caller that stops
    reading early (its LIMIT reached, another host failed) cancels the call. A worker of an
    earlier version (UNIMPLEMENTED) is asked its unary Scan, and the router filters and
    projects the rows, as it did before scans carried their statement."""
    call = worker.ScanPages(request, timeout=call_timeout)
    try:
        async for page in call:
            yield page
        return
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.UNIMPLEMENTED:
            raise _failover_error(err) from None
    finally:
        call.cancel()
    whole = worker_pb2.ScanRequest(table=request.table, partitions=request.partitions,
                                   limit=request.limit if plan.where is None else 0,
                                   allow_standby=request.allow_standby, min_input_offsets=request.min_input_offsets)
    yield legacy_page(plan, await _unavailable_on_failure(worker.Scan(whole, timeout=call_timeout)), request.limit)


def _failover_error(err: grpc.aio.AioRpcError) -> Exception:
    """UnavailableError for a status that means "ask another copy"; the error itself otherwise."""
    return UnavailableError(err.details() or str(err.code())) if err.code() in FAILOVER_CODES else err

