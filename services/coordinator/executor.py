"""Executes statements at the coordinator: validate, create topics and append to the command
topic in a transaction (DDL), produce (INSERT ... VALUES), or answer from the metastore
(SHOW, DESCRIBE, EXPLAIN).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from millpond.services.coordinator import views
from millpond.services.coordinator.topic_cleanup import DROP_WAIT_S, REPORTS_GRACE_S, QueryTopicCleanup
from millpond.shared import security
from millpond.shared.catalog.metastore import DDL, Change, Metastore, check_sources, uses
from millpond.shared.catalog.names import consumer_group
from millpond.shared.catalog.queries import PersistentQuery, Resolved
from millpond.shared.catalog.topology import internal_topics
from millpond.shared.catalog.upgrades import check_upgrades
from millpond.shared.config import CoordinatorSettings
from millpond.shared.errors import MillpondError, StatementError, UnavailableError
from millpond.shared.kafka.admin import (
    delete_groups,
    delete_topics,
    ensure_topic,
    partition_counts,
    topic_partitions,
    until_gone,
)
from millpond.shared.kafka.command_log import Command, CommandReader, CommandWriter, request_reused
from millpond.shared.kafka.connection import FENCED
from millpond.shared.kafka.inserts import RowInserter
from millpond.shared.results import Outcome
from millpond.shared.security import authorize_statement, authorize_text
from millpond.shared.session import AUTO_OFFSET_RESET, STATEMENT_ID_CHARS, check_properties, check_request_id, effective
from millpond.shared.sql import ast, custom_types
from millpond.shared.sql.guard import StatementParser, check_length
from millpond.shared.sql.joins import started_sources
from millpond.shared.sql.planner import check_round_places, check_topic_name
from millpond.shared.task_status import TaskReport
from millpond.shared.teardown import run_to_end

log = logging.getLogger(__name__)


class AppendFailed(KafkaError):
    """The command's record was not delivered inside its transaction, or the transaction did
    not commit: a racing coordinator's fence can show as an unexpected error instead of one
    of ``FENCED``. The statement is validated and tried again."""


RETRIED = (*FENCED, AppendFailed)
APPEND_ATTEMPTS = 6


@dataclass
class StatementExecutor:
    """Validates and runs one statement at a time, in arrival order."""

    settings: CoordinatorSettings
    metastore: Metastore
    reader: CommandReader
    writer: CommandWriter
    admin: AIOKafkaAdminClient
    inserts: RowInserter
    offsets: AIOKafkaConsumer
    """A read_committed consumer used only to look up end offsets."""
    task_reports: Callable[[], Mapping[str, list[TaskReport]]] = field(default=lambda: {})
    """What the workers last reported about each query's tasks, by query id."""
    query_runs: Callable[[str], bool] = field(default=lambda _: False)
    """Whether a live worker still reports a task or store copy of the query (``Cluster.runs``)."""

    def __post_init__(self) -> None:
        self._lock = asyncio.Lock()
        self.parser = StatementParser(self.settings.parse_limits)
        """Parses off the event loop, within the limits: heartbeats and the election go on meanwhile."""
        self.fenced_retries = 0
        """How often an append was fenced by another coordinator and retried."""
        self.replicas = 1
        """Replication factor of the internal topics it creates, and of the others unless REPLICAS
        says (the coordinator sets it at start)."""
        self.cleanup = QueryTopicCleanup(self._delete_unused, self.query_runs)
        """Topics a TERMINATE or a DROP ... DELETE TOPIC let go, deleted once the queries that used them stopped."""
        self._notes: set[asyncio.Task[None]] = set()
        """Notes being appended that dropped sources' topics were deleted (``_note_deleted``)."""

    @property
    def defaults(self) -> dict[str, str]:
        """The session properties a request starts from."""
        return {AUTO_OFFSET_RESET: self.settings.auto_offset_reset}

    async def execute(self, sql: str, properties: Mapping[str, str], request_id: str = "",
                      attempt: int = 0) -> Outcome:
        """Run one statement and describe what happened.

        A ``request_id`` names the statement across resends (``attempt`` counts them): a DDL
        statement whose id is in the command topic, or an INSERT whose id this coordinator
        produced (or, on a resend, finds in the topic's recent records), is answered with
        its first outcome instead of running again.
        """
        principal = security.CURRENT.get()
        # The cheap refusals come before the costly parse: too long, or a caller who could
        # not run a statement starting this way.
        check_length(sql, self.parser.limits)
        check_request_id(request_id, STATEMENT_ID_CHARS)
        authorize_text(principal, sql)
        stmt = await self.parser.parse_one(sql)
        authorize_statement(principal, stmt)
        check_properties(properties)
        if isinstance(stmt, (*DDL, ast.InsertValues, ast.Show, ast.Describe, ast.Explain)):
            async with self._lock:
                # Waiting for its turn, a statement can be called off; started, it runs to its
                # end even if its caller goes (a resend with its request id finds the outcome).
                return await run_to_end(self._bounded(self._run(stmt, properties, request_id, attempt)))
        if isinstance(stmt, ast.SetProperty | ast.UnsetProperty):
            raise StatementError("SET and UNSET change a client session; send them to the router "
                                 "with the statements they apply to")
        raise StatementError("queries run at the router, not the coordinator")

    async def _run(self, stmt: ast.Statement, properties: Mapping[str, str], request_id: str, attempt: int) -> Outcome:
        if isinstance(stmt, DDL):
            return await self._distribute(stmt, dict(properties), request_id)
        if isinstance(stmt, ast.InsertValues):
            return await self._insert(stmt, request_id, attempt)
        await self.reader.catch_up()
        stmt = custom_types.resolved(stmt, self.metastore.types)
        if isinstance(stmt, ast.Show):
            return await self._show(stmt, properties)
        if isinstance(stmt, ast.Describe):
            return views.describe(self.metastore, stmt)
        assert isinstance(stmt, ast.Explain)
        return views.explain(self.metastore, stmt, properties, self.task_reports())

    async def _bounded(self, running: Awaitable[Outcome]) -> Outcome:
        timeout_s = self.settings.statement_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):
                return await running
        except TimeoutError as err:
            raise UnavailableError(f"the statement did not finish in {timeout_s:g} s (statement_timeout_ms); "
                                   "is Kafka reachable? Resend it with the same request_id") from err

    async def _distribute(self, stmt: ast.Statement, properties: dict[str, str], request_id: str) -> Outcome:
        """Validate and append a DDL statement; retried when another coordinator fences us."""
        attempted: set[str] = set()
        """Internal topics made for earlier attempts (a fenced attempt's query id may not be the retry's)."""
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(RETRIED), stop=stop_after_attempt(APPEND_ATTEMPTS),
                wait=wait_random_exponential(multiplier=0.05, max=1.0), reraise=True,
                before_sleep=self._on_fenced,
            ):
                with attempt:
                    return await self._append(stmt, properties, request_id, attempted)
        except RETRIED as err:
            raise UnavailableError(f"another coordinator with service id {self.settings.service_id} kept "
                                   f"taking over the command topic ({type(err).__name__}); retry the statement") from err
        raise AssertionError("unreachable")

    def _on_fenced(self, state: RetryCallState) -> None:
        self.fenced_retries += 1
        log.warning("fenced by another coordinator; validating again", extra={"attempt": state.attempt_number})

    async def _append(self, stmt: ast.Statement, properties: dict[str, str], request_id: str,
                      attempted: set[str]) -> Outcome:
        appended = False
        try:
            async with self.writer.transaction() as txn:
                # Reading to the end inside the transaction means we validate against every
                # statement committed before ours; a fenced writer cannot commit at all.
                await self.reader.catch_up()
                if request_id and (done := self.reader.executed.get(request_id)) is not None:
                    statement, message = done
                    if statement != stmt.text:  # an id used again, not a resend: this statement would be lost
                        raise request_reused(request_id, statement)
                    log.info("statement already executed for this request", extra={"request_id": request_id})
                    if isinstance(stmt, ast.Drop | ast.Terminate):
                        # Its coordinator may have gone before deleting what it let go.
                        await self.delete_left_topics()
                    return Outcome(stmt.text, message)
                try:
                    resolved = await self._resolve(stmt, properties)
                    change = self.metastore.plan(stmt, properties, resolved)
                    # Here, not in plan: replay keeps what was accepted.
                    check_upgrades(self.metastore.queries, change)
                    check_sources(change)
                    if change.add_queries:
                        check_round_places(stmt)
                except MillpondError:  # (what fenced an attempt may make the statement invalid now)
                    await self._delete_attempted(attempted, None)
                    raise
                await self._delete_attempted(attempted, change)
                if change.noop:
                    return Outcome(stmt.text, change.message)
                attempted.update(name for query in change.add_queries for name in self._internal_topics(query))
                await self._create_topics(stmt, change)
                try:
                    offset = await txn.append(Command(stmt.text, properties, resolved, request_id))
                except FENCED:
                    raise
                except KafkaError as err:  # not delivered: the transaction aborts as the block exits
                    raise AppendFailed(f"the command was not appended: {err}") from err
                appended = True
        except KafkaError as err:
            if not appended or isinstance(err, RETRIED):
                raise
            # The commit failed: a racing coordinator's fence shows here too as an unexpected
            # error. Validated again, a statement that did commit is found (by its request id).
            raise AppendFailed(f"the command's transaction did not commit: {err}") from err
        await self.reader.catch_up(offset + 1)
        await self._delete_topics(change)
        log.info("statement appended", extra={"offset": offset, "result": change.message})
        return Outcome(stmt.text, change.message)

    async def _resolve(self, stmt: ast.Statement, properties: Mapping[str, str]) -> Resolved:
        """Look up what replay must not look up again: start offsets, an existing topic's size."""
        if isinstance(stmt, ast.CreateSource) and "partitions" not in stmt.properties:
            topic = str(stmt.properties.get("kafka_topic", ""))
            # Checked before the broker sees it (a 60,000-character name breaks the client's encoding).
            return Resolved(partitions=await topic_partitions(self.admin, check_topic_name(topic)) if topic else None)
        if isinstance(stmt, ast.CreateAsSelect | ast.InsertSelect):
            if effective(properties, self.defaults)[AUTO_OFFSET_RESET] != "latest":
                return Resolved()
            source = self.metastore.sources.get(stmt.query.source)
            if source is None:
                return Resolved()  # planning reports the missing source
            joined = [s for j in stmt.query.joins if (s := self.metastore.sources.get(j.source)) is not None]
            streams = started_sources(source, joined)
            partitions = [TopicPartition(s.topic, p) for s in streams for p in range(s.partitions)]
            ends = await self.offsets.end_offsets(partitions)
            return Resolved(start_offsets=tuple(ends[tp] for tp in partitions))
        return Resolved()

    async def _create_topics(self, stmt: ast.Statement, change: Change) -> None:
        replaced = {s.name for s in change.add_sources if s.name in self.metastore.sources}
        # Without REPLICAS, a topic made here is replicated as the internal topics are (a result
        # table's sink is what its copies and joins rebuild from), not left with one copy.
        replicas = int(getattr(stmt, "properties", {}).get("replicas", self.replicas))
        for source in change.add_sources:
            if source.name in replaced:
                continue
            if await self.cleanup.settled(source.topic):  # a DROP ... DELETE TOPIC of it just before
                await until_gone(self.admin, source.topic)  # (the broker's metadata shows it a moment longer)
            existing = await topic_partitions(self.admin, source.topic)
            if existing is None:
                if isinstance(stmt, ast.CreateSource) and "partitions" not in stmt.properties:
                    raise StatementError(f"topic {source.topic} does not exist; add PARTITIONS=n to the "
                                         "WITH clause to create it")
                # A table's topic is compacted, as ksqlDB makes it: its latest row per key stays (a
                # result's rows are stamped with their records' times, which a time retention
                # would delete at once in a backfill of old data), tombstones delete. A windowed
                # table's rows go by time, as its windows do.
                await ensure_topic(self.admin, source.topic, source.partitions, replicas=replicas,
                                   compacted=source.kind == "TABLE" and source.window is None)
            elif existing != source.partitions:
                raise StatementError(f"topic {source.topic} has {existing} partitions but {source.name} needs "
                                     f"{source.partitions}; set PARTITIONS={existing} or use another KAFKA_TOPIC")
        sinks = {s.name: s for s in change.add_sources}
        for query in change.add_queries:
            sink = sinks.get(query.sink) or self.metastore.source(query.sink)
            for topic in internal_topics(self.settings.service_id, query):
                await ensure_topic(self.admin, topic.name, topic.partitions or sink.partitions, compacted=topic.compacted,
                                   replicas=self.replicas, configs=dict(topic.configs))

    async def _delete_attempted(self, attempted: set[str], change: Change | None) -> None:
        """Delete the internal topics an earlier, fenced attempt of this statement made that
        neither this attempt nor any query uses (the coordinator that fenced it took the query
        id: the retry's query has another). Safe here: this attempt's transaction fences any
        other coordinator's append, whose retry makes its topics again."""
        if not attempted:
            return
        used = {name for query in (*self.metastore.queries.values(), *(change.add_queries if change else ()))
                for name in self._internal_topics(query)}
        if left := sorted(attempted - used):
            log.info("deleting the topics of a fenced attempt", extra={"topics": left})
            await delete_topics(self.admin, left)
        attempted.clear()

    def _group(self, query: PersistentQuery) -> str:
        """The consumer group a query's tasks commit their input offsets to."""
        return consumer_group(self.settings.service_id, query.query_id)

    def _internal_topics(self, query: PersistentQuery) -> list[str]:
        return [topic.name for topic in internal_topics(self.settings.service_id, query)]

    async def _delete_topics(self, change: Change) -> None:
        """Delete what the change drops, each once the queries that used it have stopped
        (``topic_cleanup``): a terminated query's internal topics, and with DROP ... DELETE
        TOPIC the source's topic (the query that wrote it, and any terminated one that read or
        wrote it, may still be stopping; a statement that names the topic again waits for it)."""
        for query in change.drop_queries:
            self.cleanup.after_stopped(query.query_id, self._internal_topics(query), groups=[self._group(query)])
        for topic in change.delete_topics:
            source = self.metastore.dropped_topics.get(topic)
            if source is not None:  # (None: a CREATE at another coordinator took the topic again since)
                self.cleanup.delete_after(self._users(source), [topic], DROP_WAIT_S)

    def _users(self, source: str) -> list[str]:
        """The terminated queries that read or wrote ``source`` (a dropped one's own among them)."""
        return [q.query_id for q in self.metastore.terminated.values() if uses(q, source)]

    async def _delete_unused(self, topics: list[str], groups: list[str]) -> None:
        """Delete ``topics`` but those a source took again meanwhile (a CREATE at another
        coordinator: this one's own wait for the delete, ``QueryTopicCleanup.settled``), and
        terminated queries' consumer ``groups`` (their committed offsets)."""
        if groups:
            await delete_groups(self.admin, groups)
        await self.reader.catch_up()
        taken = {source.topic for source in self.metastore.sources.values()}
        if unused := [topic for topic in topics if topic not in taken]:
            gone = await delete_topics(self.admin, unused)
            if dropped := [topic for topic in gone if topic in self.metastore.dropped_topics]:
                # Its own task, after this statement's turn: a statement waiting for this
                # delete (``settled``) holds the turn.
                note = asyncio.create_task(self._note_deleted(dropped), name=f"note-deleted-{dropped[0]}")
                self._notes.add(note)
                note.add_done_callback(self._notes.discard)

    async def _note_deleted(self, topics: list[str]) -> None:
        """Append that dropped sources' ``topics`` were deleted, so a coordinator that starts
        does not delete them again: one made anew outside Millpond under the same name since is
        someone else's. Not appended (a Kafka error, this coordinator stopping), they are
        looked for again at the next start, as before."""
        try:
            async with self._lock, self.writer.transaction() as txn:
                await self.reader.catch_up()
                if left := tuple(topic for topic in topics if topic in self.metastore.dropped_topics):
                    offset = await txn.append(Command("", deleted_topics=left))
                else:
                    return
            await self.reader.catch_up(offset + 1)
        except (KafkaError, UnavailableError) as err:
            log.warning("could not note that dropped sources' topics were deleted; a coordinator that starts "
                        "deletes them again if they are there", extra={"topics": topics, "error": str(err)})

    async def close(self) -> None:
        """Stop the topic deletes and notes under way (the next coordinator to start finds them)."""
        await self.cleanup.close()
        for note in list(self._notes):
            note.cancel()
        await asyncio.gather(*self._notes, return_exceptions=True)

    async def delete_left_topics(self, reports_grace_s: float = REPORTS_GRACE_S) -> None:
        """Delete, as a TERMINATE or a DROP ... DELETE TOPIC does, the internal topics of
        terminated queries and the dropped sources' topics that are still there: the
        coordinator that ran the statement stopped before it could (or a delete failed). Called
        once the command topic is read; the workers' reports are waited for."""
        present = set(await self.admin.list_topics())
        try:
            groups = {group for group, *_ in await self.admin.list_consumer_groups()}
        except KafkaError as err:  # (not allowed to list them, say): the topics go all the same
            log.warning("could not list consumer groups to delete terminated queries' ones", extra={"error": str(err)})
            groups = set()
        for query in self.metastore.terminated.values():
            left = [name for name in self._internal_topics(query) if name in present]
            group = [name for name in [self._group(query)] if name in groups]
            if left or group:
                log.info("a terminated query's topics or consumer group were left; deleting them once no worker runs it",
                         extra={"query": query.query_id, "topics": left, "groups": group})
                self.cleanup.after_stopped(query.query_id, left, not_before_s=reports_grace_s, groups=group)
        for topic, source in self.metastore.dropped_topics.items():
            if topic in present:
                log.info("a dropped source's topic was left; deleting it once no worker runs the queries that used it",
                         extra={"source": source, "topic": topic})
                self.cleanup.delete_after(self._users(source), [topic], DROP_WAIT_S, not_before_s=reports_grace_s)

    async def _insert(self, stmt: ast.InsertValues, request_id: str, attempt: int) -> Outcome:
        await self.reader.catch_up()
        stmt = custom_types.resolved(stmt, self.metastore.types)
        return await self.inserts.insert(stmt, self.metastore.insert_target(stmt.target), request_id, attempt)

    async def _show(self, stmt: ast.Show, properties: Mapping[str, str]) -> Outcome:
        if stmt.what != "TOPICS":
            return views.show(self.metastore, stmt, effective(properties, self.defaults), self.task_reports())
        # Internal topics (Kafka's, Millpond's command topic, a query's changelog...) with ALL, as ksqlDB's.
        names = sorted(t for t in await self.admin.list_topics() if stmt.internal or not t.startswith("_"))
        counts = await partition_counts(self.admin, names)  # (one deleted meanwhile is left out)
        rows = [[name, counts[name]] for name in names if name in counts]
        return Outcome(stmt.text, status="", columns=[("NAME", "VARCHAR"), ("PARTITIONS", "INT")], rows=rows)
