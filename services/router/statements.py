"""The router's statement path: parse a request, apply its session statements, answer pull
queries and produce INSERTed rows here, and forward everything else (DDL, SHOW, DESCRIBE,
EXPLAIN) to a coordinator."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from typing import Any

import grpc
from prometheus_client import Counter, Histogram

from millpond.coordinator.v1 import coordinator_pb2
from millpond.services.router.coordinators import Coordinators
from millpond.services.router.lookups import LookupTemplates
from millpond.services.router.pull import PullPlan
from millpond.services.router.pull_routing import PlanOutdated, PullRouter
from millpond.services.router.stream_pulls import StreamPulls
from millpond.shared import consistency, metrics, security
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.sources import DataSource
from millpond.shared.config import RouterSettings
from millpond.shared.errors import ErrorKind, LimitError, MillpondError, StatementError
from millpond.shared.kafka.command_log import CommandReader
from millpond.shared.kafka.inserts import RowInserter
from millpond.shared.results import Outcome, row_bytes
from millpond.shared.rpc.converters import outcome_from_proto
from millpond.shared.rpc.status import raise_for_rpc, status_code
from millpond.shared.security import authorize_statement, authorize_text
from millpond.shared.session import apply_session_statement, check_properties, check_request_id
from millpond.shared.sql import ast, custom_types
from millpond.shared.sql.guard import StatementParser, check_length

log = logging.getLogger(__name__)

DEADLINE_MARGIN_S = 0.05


@functools.cache
def _pull_metrics(outcome: str) -> tuple[Histogram, Counter]:
    """The pull metrics of an outcome, labelled once (``labels`` takes a lock per call)."""
    return metrics.PULL_SECONDS.labels(outcome), metrics.PULL_QUERIES.labels(outcome)


def _merged(positions: consistency.Positions, token: str,
            seen: consistency.Positions) -> tuple[consistency.Positions, str]:
    """``positions`` (whose token is ``token``) with the positions a statement read, and their
    token: ``token`` itself, as it came, when they moved none."""
    merged = consistency.merge(positions, seen)
    return (positions, token) if merged == positions else (merged, consistency.encode(merged))


def _out_of_time() -> MillpondError:
    return MillpondError("the request ran out of time before this statement was run; send fewer statements per "
                         "request or give it a longer deadline", kind=ErrorKind.DEADLINE)


def _before_retry(named: bool, why: str) -> str:
    """What a client whose statement may have been applied does before it retries: resend
    with its request id, or, having given none (the router's own is not sent back), look first."""
    if named:
        return f"before you retry, send the same request_id again ({why})"
    return ("look before you retry (the request had no request_id; give each request one, and a resend with it is "
            f"safe: {why})")


def _result_bytes(outcome: Outcome) -> int:
    """About the bytes ``outcome`` takes in a response: its encoded pages, and its other rows'
    text (a lookup's one row, a SHOW's few)."""
    return sum(map(len, outcome.encoded_rows)) + sum(map(row_bytes, outcome.rows))


def _log_failure(job: asyncio.Future[Any]) -> None:
    """An INSERT that went on after its request's deadline: its error, logged, as nobody waits for it."""
    if not job.cancelled() and job.exception() is not None:
        log.warning("an INSERT that outlasted its request failed", exc_info=job.exception())


class Statements:
    """Runs the statements of ``Execute`` requests."""

    def __init__(self, settings: RouterSettings, metastore: Metastore, reader: CommandReader,
                 coordinators: Coordinators, pulls: PullRouter, parser: StatementParser,
                 inserts: RowInserter | None = None):
        self.settings = settings
        self.parser = parser
        """Parses within the limits (a long text off the event loop), with a cache bounded by bytes."""
        self.metastore = metastore
        self.reader = reader
        self.coordinators = coordinators
        self.pulls = pulls
        self.inserts = inserts
        """Produces INSERTed rows here (None: a coordinator does)."""
        self.lookups = LookupTemplates(parser)
        """Key lookups by shape: another key asked with a known statement is not parsed again."""
        self.stream_pulls = StreamPulls(settings)

    @property
    def _timeout(self) -> float:
        return self.settings.request_timeout_ms / 1000

    async def execute(self, sql: str, properties: dict[str, str], token: str = "",
                      time_remaining: float | None = None, request_id: str = "") -> list[Outcome]:
        """Run each statement in order: pull queries and INSERTs here, everything else at the
        coordinator.

        SET and UNSET change the properties of the statements after them in this request.
        Pull queries and INSERTs carry the consistency token to send next: the request's
        token merged with the positions they reflect. The statements that change something
        are named ``<request id>/<n>`` (a new id when the client gave none; an INSERT's row
        carries it in a header), so a resend of the request, by the client or by this router
        to another coordinator, runs none twice.
        """
        # A client's id may be a resend of a call that already ran at some coordinator; an id
        # made here is new, and only this router's own resends of it can find it done.
        named = bool(request_id)
        check_request_id(request_id)
        principal = security.CURRENT.get()
        check_length(sql, self.parser.limits)
        authorize_text(principal, sql)  # the first statement's; each one is checked below
        session = dict(properties)
        check_properties(session)
        positions = consistency.decode(token)
        current = token  # the token of ``positions``, re-encoded only when a statement moves them
        deadline = self._deadline(time_remaining)
        outcomes: list[Outcome] = []
        # A text parsed before is held parsed and planned; another key of a known lookup is
        # answered from its template.
        parsed_before = self.parser.cached(sql)
        lookup = None if parsed_before else self.lookups.match(sql, self.metastore.command_offset)
        if lookup is not None:  # the most frequent request: one key of a known lookup
            query, plan = lookup
            authorize_statement(principal, query)
            try:
                outcome, read = await self._pull(query, plan, session, positions, deadline)
            except grpc.aio.AioRpcError as err:
                raise raise_for_rpc(err) from None
            _, outcome.consistency_token = _merged(positions, current, read)
            return [outcome]
        statements = await self.parser.parse(sql)
        if not request_id and not all(isinstance(stmt, ast.Query) for stmt in statements):
            request_id = uuid.uuid4().hex  # pull queries alone change nothing: they need none
        held = 0
        """The bytes of the results so far, against the most one response may carry."""
        for index, stmt in enumerate(statements):
            try:
                try:
                    authorize_statement(principal, stmt)
                    outcome, seen = await self._execute_one(stmt, session, positions, deadline, f"{request_id}/{index}",
                                                            named, learn=not parsed_before)
                except grpc.aio.AioRpcError as err:  # a coordinator's refusal: prefixed as any other
                    raise raise_for_rpc(err) from None
                held += _result_bytes(outcome)
                if held > self.settings.max_message_bytes:
                    raise LimitError(f"the results pass {self.settings.max_message_bytes} bytes, the most one "
                                     "response may carry (max_message_bytes): send these statements in separate "
                                     "requests, or add LIMITs")
            except MillpondError as err:
                if len(outcomes):
                    err.message = f"statement {len(outcomes) + 1} failed (earlier ones were applied): {err.message}"
                raise
            if seen is not None:
                positions, current = _merged(positions, current, seen)
                outcome.consistency_token = current
            outcomes.append(outcome)
        return outcomes

    def _deadline(self, time_remaining: float | None) -> float:
        """When this request must be answered: the router's own timeout, or the client's
        deadline less a margin to send a clear error before the client gives up."""
        budget = self._timeout if time_remaining is None else min(self._timeout, time_remaining - DEADLINE_MARGIN_S)
        return time.monotonic() + max(budget, 0.0)

    async def _execute_one(self, stmt: ast.Statement, properties: dict[str, str], positions: consistency.Positions,
                           deadline: float, request_id: str, named: bool,
                           learn: bool = False) -> tuple[Outcome, consistency.Positions | None]:
        """One statement; a pull query just parsed (``learn``) may become the template of its shape."""
        changed = apply_session_statement(properties, stmt)  # for the rest of this request
        if changed is not None:
            return Outcome(stmt.text, changed), None
        if isinstance(stmt, ast.Query | ast.InsertValues) and custom_types.missing(stmt, self.metastore.types):
            await self.reader.catch_up()  # a type made just before (in this request, say)
        if isinstance(stmt, ast.Query):
            return await self._pull(custom_types.resolved(stmt, self.metastore.types), None, properties, positions,
                                    deadline, learn)
        if isinstance(stmt, ast.PrintTopic):
            raise StatementError("PRINT streams the topic's records: call RouterService/StreamQuery (millpond sql runs "
                                 "it that way), not Execute")
        if isinstance(stmt, ast.InsertValues) and self.inserts is not None:
            return await self._insert(custom_types.resolved(stmt, self.metastore.types), deadline, request_id, named)
        return await self._forward(stmt, properties, deadline, request_id, named)

    async def _insert(self, stmt: ast.InsertValues, deadline: float, request_id: str,
                      named: bool) -> tuple[Outcome, consistency.Positions]:
        """Produce an INSERT's row here, as a coordinator would but without the hop, by the
        request's ``deadline``. Once started it runs to its end even when the deadline or the
        client goes first: a resend with the request id then finds the row instead of adding
        another. A client's id may name a row inserted before (``named``): looked for."""
        if deadline - time.monotonic() <= 0:
            raise _out_of_time()
        job = asyncio.ensure_future(self._produce(stmt, request_id, attempt=int(named)))
        try:
            done, _ = await asyncio.wait({job}, timeout=deadline - time.monotonic())
        finally:
            if not job.done():  # the deadline passed or the client went: it goes on alone
                job.add_done_callback(_log_failure)
        if not done:
            raise MillpondError("Kafka did not acknowledge the row within the request's time left; it may still be "
                                f"inserted: {_before_retry(named, 'a row already inserted is answered, not inserted again')}",
                                kind=ErrorKind.DEADLINE)
        outcome, topic = job.result()
        return outcome, {(topic, outcome.partition): outcome.offset + 1}

    async def _produce(self, stmt: ast.InsertValues, request_id: str, attempt: int) -> tuple[Outcome, str]:
        assert self.inserts is not None
        await self.reader.catch_up()  # the target as the latest DDL left it, a session's own included
        source = self.metastore.insert_target(stmt.target)
        return await self.inserts.insert(stmt, source, request_id, attempt), source.topic

    async def _pull(self, stmt: ast.Query, plan: PullPlan | None, properties: dict[str, str],
                    positions: consistency.Positions, deadline: float,
                    learn: bool = False) -> tuple[Outcome, consistency.Positions]:
        """A pull query (with ``plan``: not planned again) and the positions it read, counted
        in the pull metrics; one just parsed (``learn``) may become the template of its shape."""
        if stmt.emit_changes:
            raise StatementError("a push query (EMIT CHANGES) streams its rows: call RouterService/StreamQuery "
                                 "(millpond sql runs it that way), not Execute")
        started, result = time.monotonic(), "INTERNAL"
        try:
            version = self.metastore.command_offset
            while True:
                source = None if plan is not None else (self.metastore.sources.get(stmt.source) or
                                                        await self._caught_up_source(stmt.source))
                if source is not None and source.kind == "STREAM":
                    # (no positions: a pull over a stream reads where the token's are, and its own ends
                    # carried on would make a table of that stream wait for them)
                    scanned = await self.stream_pulls.answer(stmt, source, positions, deadline)
                    result = "OK"
                    return scanned, {}
                if plan is None:
                    plan = await self.pulls.plan(stmt)
                    version = self.metastore.command_offset  # the plan's (planning may catch up)
                try:
                    answer = await self.pulls.pull(stmt, plan, properties, positions, deadline)
                    break
                except PlanOutdated:  # the copies have a newer metastore, which this router has now too:
                    # the statement as written, against it (its source may even be a stream now)
                    written = await self.parser.parse_one(stmt.text)
                    assert isinstance(written, ast.Query)
                    stmt, plan = custom_types.resolved(written, self.metastore.types), None
            result = "OK"
            if learn:
                await self.lookups.learn(stmt, plan, version)
            return answer
        except MillpondError as err:
            result = status_code(err.kind).name
            raise
        finally:
            seconds, count = _pull_metrics(result)
            seconds.observe(time.monotonic() - started)
            count.inc()

    async def _forward(self, stmt: ast.Statement, properties: dict[str, str], deadline: float, request_id: str,
                       named: bool) -> tuple[Outcome, consistency.Positions | None]:
        """Have a coordinator execute a statement (DDL, INSERT) by the request's ``deadline``:
        the request's later statements share it, so a long request ends with a status of the
        router's before the client's own deadline, not after it. A resend after UNAVAILABLE
        carries the same request id, so a coordinator that did run it answers as it did."""
        # Any coordinator can execute (the command topic's transactions serialize them); the
        # leader first, the others if it is down.
        coordinators = self.coordinators
        order = [coordinators.leader, *(i for i in range(len(coordinators.stubs)) if i != coordinators.leader)]
        for n, i in enumerate(order):
            left = deadline - time.monotonic()
            if left <= 0:
                raise _out_of_time()
            request = coordinator_pb2.ExecuteStatementRequest(sql=stmt.text, properties=properties,
                                                              request_id=request_id, attempt=n + named)
            try:
                response = await coordinators.stubs[i].ExecuteStatement(request, timeout=left)
                outcome = outcome_from_proto(response.result)
                if isinstance(stmt, ast.InsertValues):
                    target = self.metastore.sources.get(stmt.target) or await self._caught_up_source(stmt.target)
                    return outcome, {(target.topic, outcome.partition): outcome.offset + 1}
                return outcome, None
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() >= deadline:
                    advice = _before_retry(named, "a statement already applied is answered, not run again")
                    raise MillpondError(f"the coordinator did not answer within the request's time left ({left:.1f} s); "
                                        f"the statement may still be applied: {advice}", kind=ErrorKind.DEADLINE) from None
                if err.code() != grpc.StatusCode.UNAVAILABLE or n == len(order) - 1:
                    raise
        raise AssertionError("unreachable")

    async def _caught_up_source(self, name: str) -> DataSource:
        await self.reader.catch_up()
        return self.metastore.source(name)
