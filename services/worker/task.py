"""A task is one input partition of one persistent query, with its transactions (and, for
GROUP BY queries, its store). ``ProjectionTask`` writes each filtered, projected record to
the sink; ``AggregationTask`` keeps per-key state.

``AggregationTask.commit`` is the exactly-once step for a micro-batch, in this order:

1. Skip the batch if the store already reflects its input offsets (a replayed batch).
2. Merge the batch's per-key partials into the stored states.
3. In one Kafka transaction: the changelog records, the sink records, the processing-log
   records, and once they are delivered the input offsets (``send_offsets_to_transaction``
   to the query's group; ``Task._commit_input``).
4. Only after the commit: the states and both positions in one RocksDB write batch.

A crash between 3 and 4 leaves the store behind the changelog; ``start`` replays the
changelog tail, so the store catches up without re-reading the input.

``stop`` may come while a commit is in flight (its query is torn down). A commit still in its
transaction is cancelled, so the transaction aborts and the store is untouched; one whose
transaction is already committing is let finish, store write included, unless it overruns.
Only then is the producer stopped (under a running transaction it would leave the commit
waiting forever), and the store closes last, always, so it can be reopened at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from millpond.services.worker.state.changelog import ChangelogReader
from millpond.services.worker.state.store import (
    CHANGELOG_OFFSET,
    INPUT_OFFSET,
    INPUT_OFFSET_HEADER,
    STREAM_TIME,
    STREAM_TIME_HEADER,
    WRITTEN_MS,
    PartitionStore,
    encode_state,
    mark_up_to_date,
    opened,
    partition_dir,
)
from millpond.services.worker.state.table_topic import TableTopicReader
from millpond.shared import metrics
from millpond.shared.catalog.names import changelog_topic, consumer_group, task_transactional_id
from millpond.shared.catalog.queries import OutputColumn, PersistentQuery
from millpond.shared.catalog.sources import WINDOW_END, WINDOW_START, DataSource
from millpond.shared.catalog.topology import JOINED_TOMBSTONES_MS
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.admin import committed_positions, tombstones_kept_ms
from millpond.shared.kafka.connection import FENCED, KafkaConnection, start_client, stop_client
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.kafka.serde import (
    bytes_decoder,
    key_decoder,
    serialize_value,
    session_key,
    split_windowed_key,
    window_bounds,
)
from millpond.shared.sql import aggregates, ast
from millpond.shared.sql.expressions import evaluate
from millpond.shared.sql.joins import join_aggregation
from millpond.shared.sql.parser import statement_query
from millpond.shared.sql.planner import aggregates_over_result, having_over_result
from millpond.shared.sql.types import Scope, with_widths
from millpond.shared.task_status import RESTORING, RUNNING, STARTING, StoreLag, TaskReport, now_ms
from millpond.shared.teardown import bounded, gather_or_cancel, run_to_end

log = logging.getLogger(__name__)
COMMIT_GRACE_S = 10.0
"""How long ``stop`` lets a commit whose transaction is already committing finish."""
ABORT_TIMEOUT_S = 10.0
"""How long ``stop`` waits for a cancelled commit to abort its transaction."""
PRODUCER_STOP_TIMEOUT_S = 10.0
"""How long ``stop`` waits for the producer to close."""
OUTPUT_ENDS = "ends"
"""The field of a committed input offset's metadata (JSON) that says, for a stage feeding
another, how far its output had reached: a list, one offset per partition (``Task.output_ends``)."""
METADATA_BYTES = 4000
"""The most commit metadata a task writes (the broker's offset.metadata.max.bytes is 4096 by
default): past it the output positions are left out (a stage of several hundred partitions)."""


def commit_metadata(metadata: str) -> dict[str, Any]:
    """The JSON object of a committed offset's metadata (empty for none or another form)."""
    try:
        parsed = json.loads(metadata) if metadata else None
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


class TaskStopped(MillpondError):
    """A batch reached a task that is stopping (its query is being torn down); it is not applied."""


@dataclass(frozen=True)
class BadRecord:
    """An input record that could not be processed, and why."""

    offset: int
    reason: str
    value: str | None


@dataclass
class BatchSlice:
    """The part of one micro-batch that belongs to one task's partition: its offsets and the
    records that could not be processed. Each plan kind's slice adds what its task commits."""

    first_offset: int
    last_offset: int
    count: int = 0
    """Records of the partition in the batch (the offsets between may hold transaction markers)."""
    bad: list[BadRecord] = field(default_factory=list)


@dataclass
class AggregateSlice(BatchSlice):
    """A GROUP BY query's slice: the batch's partial aggregates per key."""

    partials: list[tuple[bytes, list[list[Any]]]] = field(default_factory=list)
    """Per key, one partial state per aggregate, to merge into the stored state."""
    times: dict[bytes, int] = field(default_factory=dict)
    """Per key, the latest time of the batch's records (ROWTIME; a windowed aggregation's event
    time): the stored state keeps the latest of all, which stamps the key's sink records."""


@dataclass
class WindowSlice(AggregateSlice):
    """A windowed aggregation's slice: partials per (key, window), keyed by the windowed key
    (``windowed_key``), and the records dropped as late."""

    reduced_at: int = -1
    """The task's stream time the batch was reduced against (-1: none yet)."""
    stream_time: int = -1
    """The stream time once the batch is applied: the latest event time of its records or before."""
    late: list[BadRecord] = field(default_factory=list)
    """Records (one per record and window) whose window closed before they came."""


@dataclass
class SessionSlice(BatchSlice):
    """A session-windowed aggregation's slice: every usable record, in offset order."""

    records: list[tuple[int, bytes, int, list[list[Any]]]] = field(default_factory=list)
    """(offset, serialized key, event time, the record's partial state per aggregate)."""


@dataclass
class ProjectSlice(BatchSlice):
    """A projection's slice: the result records, in input order."""

    records: list[tuple[bytes | None, bytes | None]] = field(default_factory=list)
    """Result records (key, value); a None value is a tombstone (a table row deleted)."""
    timestamps: list[int | None] = field(default_factory=list)
    """Each result record's input record timestamp (epoch ms), which a sink record keeps, as
    ksqlDB's do (ROWTIME carries over); empty: the producer stamps them."""


@dataclass
class RegroupSlice(ProjectSlice):
    """A table aggregation's regrouping slice: ``records`` hold each table record's group key
    and regrouped value (a tombstone of the table key: the row is in no group now)."""

    inputs: list[tuple[int, bytes]] = field(default_factory=list)
    """Each of ``records``' input offset and table key."""


@dataclass
class MaterializeSlice(BatchSlice):
    """A source table's slice: each key's latest row in the batch."""

    latest: list[tuple[bytes, list[Any] | None]] = field(default_factory=list)
    """Each key's last value columns in the batch, None for a tombstone."""
    stream_time: int = -1
    """A windowed table's: the latest timestamp of the batch's records (-1: none), its windows'
    latest event times (``TableTask._expired_windows``)."""


SliceT = TypeVar("SliceT", bound=BatchSlice)
"""The slice type a task commits."""


class Task(ABC, Generic[SliceT]):
    """What every task has: its input partition, a transactional producer whose id is stable
    per task (a new owner fences the old), and the query's committed input position."""

    def __init__(self, settings: WorkerSettings, query: PersistentQuery, source: DataSource,
                 sink: DataSource, partition: int, stage: str = ""):
        self.settings = settings
        self.query = query
        self.stage = stage
        """Which stage of a two-stage query this task runs (empty for the result stage)."""
        self.source = source
        self.sink = sink
        self.partition = partition
        self.input = TopicPartition(source.topic, partition)
        self.group = consumer_group(settings.service_id, query.query_id)
        self.store: PartitionStore | None = None
        self.producer: AIOKafkaProducer | None = None
        self.next_input_offset: int | None = None
        self.start_input_offset: int | None = None
        self.state = STARTING
        self.restored_records = 0
        self.records_to_restore = 0
        self._sent: list[asyncio.Future[Any]] = []
        self._commit_job: asyncio.Task[bool] | None = None
        """The commit ``apply`` runs, which ``stop`` ends before it stops the producer."""
        self._committing = False
        """Whether the transaction's records are all sent and it is committing (``stop`` lets it finish)."""
        self._stopping = False
        self.fenced = False
        """Whether a transaction failed because another producer took this task's transactional
        id: the partition's new owner, most likely, before this worker heard it moved."""
        self.output_ends: dict[int, int] = {}
        """For a stage that feeds another (``stage`` not empty): per partition of its sink, the
        offset after the last record it wrote there in transactions up to ``next_input_offset``
        (kept with the committed offset, so a new owner knows it too). A consistency token's
        position on this stage's input becomes these positions on the next stage's."""
        self._outputs: dict[int, asyncio.Future[Any]] = {}
        """This transaction's last send to each partition of the sink: enough to know how far
        the output reached (a producer's records keep their order per partition)."""
        self._unplaced: list[asyncio.Future[Any]] = []
        """This transaction's sends to the sink whose partition the producer chose."""
        self._ends: dict[int, int] | None = None
        """``output_ends`` once this transaction commits."""

    def report(self) -> TaskReport:
        """Where this task is, for the heartbeat."""
        return TaskReport(
            self.query.query_id, self.partition, self.state, restored_records=self.restored_records,
            records_to_restore=self.records_to_restore,
            input_offset=-1 if self.next_input_offset is None else self.next_input_offset,
            start_input_offset=-1 if self.start_input_offset is None else self.start_input_offset,
        )

    def rebuilding(self) -> bool:
        """Whether the task's store is still being rebuilt from its input (it stays RESTORING
        once its Spark query runs); only ``TableTask`` rebuilds that way."""
        return False

    def read_through(self, offset: int) -> None:
        """The task's query has read and committed its input up to ``offset``."""

    async def _open_producer(self) -> None:
        self.producer = AIOKafkaProducer(**self.settings.kafka.transactional_args(task_transactional_id(
            self.settings.service_id, self.query.query_id, self.partition, self.stage)))
        # init_transactions fences the previous owner and aborts its open transaction.
        await start_client(self.producer)

    async def start(self) -> None:
        """Fence any older owner and find where to read from."""
        await self._open_producer()
        self.next_input_offset = self.start_input_offset = await self._starting_offset()
        log.info("task started", extra={"query": self.query.query_id, "partition": self.partition,
                                        "input_offset": self.next_input_offset})

    async def _starting_offset(self) -> int | None:
        """The committed position; for a new query, where it was created to start (None: earliest)."""
        return self._resume_at(await self._committed_input_offset())

    def _resume_at(self, committed: int | None) -> int | None:
        """Where the input resumes from a ``committed`` position (None: none yet)."""
        if committed is None and self.query.start_offsets is not None:
            return self.query.start_offsets[self.partition]
        return committed

    async def expected_input_offset(self) -> int | None:
        """Where the input resumes if the older owner commits nothing more: the committed
        position as it stands, read without fencing anyone (``start`` reads it again once it
        has fenced; a kill's open transaction is aborted then, so it is usually the same).
        Its query's Spark plan is made with it meanwhile (``StageStream.expect``)."""
        committed = await self._committed()
        return self._resume_at(None if committed is None else committed[0])

    async def _committed_input_offset(self) -> int | None:
        """The committed position (and, from its metadata, ``output_ends``)."""
        committed = await self._committed()
        if committed is None:
            return None
        ends = commit_metadata(committed[1]).get(OUTPUT_ENDS) if self.stage else None
        self.output_ends = {p: int(o) for p, o in enumerate(ends) if o} if isinstance(ends, list) else {}
        return committed[0]

    async def _committed(self) -> tuple[int, str] | None:
        """The group's committed input offset and its metadata (None: none committed)."""
        return (await committed_positions(self.settings.kafka, self.group, [self.input])).get(self.input)

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[None]:
        """One Kafka transaction; ``_send`` inside it. If the transaction fails (fenced), the
        sends fail with it: their futures are collected here so none goes unretrieved."""
        if self._stopping:
            raise TaskStopped(f"task {self.query.query_id}/{self.partition} is stopping: the batch is not applied")
        assert self.producer is not None
        self._sent, self._committing, self._outputs, self._unplaced, self._ends = [], False, {}, [], None
        try:
            async with self.producer.transaction():
                yield
                self._committing = True
            if self._ends is not None:
                self.output_ends = self._ends
        except FENCED:
            self.fenced = True  # another worker owns the partition now (the supervisor waits to hear)
            raise
        finally:
            sent, self._sent = self._sent, []
            # After a commit every send is resolved: awaiting nothing here leaves no await (no
            # place for a cancel) between the commit and the caller's store write.
            pending = [f for f in sent if not f.done()]
            for future in sent:
                if future.done() and not future.cancelled():
                    future.exception()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    async def _send(self, topic: str, value: bytes | None, key: bytes | None, partition: int | None,
                    headers: list[tuple[str, bytes]] | None = None,
                    timestamp_ms: int | None = None) -> asyncio.Future[Any]:
        assert self.producer is not None
        future: asyncio.Future[Any] = await self.producer.send(topic, value, key=key, partition=partition,
                                                               headers=headers, timestamp_ms=timestamp_ms)
        self._sent.append(future)
        if self.stage and topic == self.sink.topic:
            if partition is None:
                self._unplaced.append(future)
            else:
                self._outputs[partition] = future
        return future

    async def _commit_input(self, offset: int, metadata: dict[str, Any] | None = None) -> None:
        """Commit the input up to ``offset`` in this transaction, with ``metadata`` (JSON) and,
        for a stage that feeds another, how far its output reached (``output_ends``): the
        transaction's sends to the sink are awaited first, for their offsets."""
        assert self.producer is not None
        # The transaction's records are delivered before its input offsets join it. Sent
        # together, the offsets' AddOffsetsToTxn was still being written at the transaction
        # coordinator when the broker verified the records' produce against it, which then
        # failed (CONCURRENT_TRANSACTIONS, reported as NOT_ENOUGH_REPLICAS) and was retried
        # after the producer's backoff: a fifth of the commits under bench.freshness's load.
        # Back-to-back transactions of 40 records, 300 each way, on an idle broker: p99 per
        # commit 11-16 ms and no retry when delivered first, 27-38 ms and 12-50 retries.
        await self.producer.flush()
        # A send that failed (a fenced producer) fails the commit with its own error: the
        # offsets would only be refused as outside a transaction.
        error = next((e for f in self._sent if f.done() and not f.cancelled() and (e := f.exception()) is not None),
                     None)
        if error is not None:
            raise error
        metadata = dict(metadata or {})
        text = json.dumps(metadata, separators=(",", ":")) if metadata else ""
        if self.stage:
            ends = dict(self.output_ends)
            for future in (*self._outputs.values(), *self._unplaced):
                record = await future
                ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
            self._ends = ends
            listed = [ends.get(p, 0) for p in range(max(ends, default=-1) + 1)]
            with_ends = json.dumps({**metadata, OUTPUT_ENDS: listed}, separators=(",", ":"))
            if len(with_ends) <= METADATA_BYTES:
                text = with_ends
            else:
                log.warning("too many output partitions to commit how far the output reached: a new owner of the "
                            "task will not carry consistency tokens through it",
                            extra={"query": self.query.query_id, "partition": self.partition, "stage": self.stage})
        await self.producer.send_offsets_to_transaction({self.input: OffsetAndMetadata(offset, text)}, self.group)

    async def _send_bad(self, bad: list[BadRecord], source: TopicPartition | None = None) -> None:
        """Processing-log records of ``bad`` records of ``source`` (the task's input by default)."""
        source = source or self.input
        for record in bad:
            await self._send(self.settings.processing_log_topic, json.dumps({
                "QUERY_ID": self.query.query_id, "SOURCE_TOPIC": source.topic,
                "SOURCE_PARTITION": source.partition, "SOURCE_OFFSET": record.offset,
                "REASON": record.reason, "RECORD": record.value,
            }).encode(), None, None)

    @abstractmethod
    async def commit(self, batch: SliceT) -> bool:
        """Apply one micro-batch slice exactly once; False when it was applied before."""

    async def apply(self, batch: SliceT) -> bool:
        """``commit`` as a job of this task's own, so that ``stop`` can end it; cancelling the
        caller cancels the commit (its transaction aborts). Refused once the task is stopping,
        while another commit is in flight, and for a slice that overlaps what was committed
        without being wholly behind it (a Spark query started from a stale position)."""
        if self._stopping:
            raise TaskStopped(f"task {self.query.query_id}/{self.partition} is stopping: the batch is not applied")
        if self._commit_job is not None and not self._commit_job.done():
            raise MillpondError(f"task {self.query.query_id}/{self.partition} got a batch while a commit is in flight")
        if self.next_input_offset is not None and batch.first_offset < self.next_input_offset <= batch.last_offset:
            raise MillpondError(f"task {self.query.query_id}/{self.partition} got offsets {batch.first_offset}-"
                                f"{batch.last_offset} across its position {self.next_input_offset}")
        job = self._commit_job = asyncio.create_task(self.commit(batch),
                                                     name=f"commit-{self.query.query_id}-{self.partition}")
        job.add_done_callback(lambda j: j.cancelled() or j.exception())  # read even if the caller left
        return await job

    def settled(self) -> bool:
        """Whether no commit is in flight and the last one ended cleanly: then its outcome is
        known, and ``next_input_offset`` is where its input resumes."""
        job = self._commit_job
        return job is None or (job.done() and not job.cancelled() and job.exception() is None)

    def applied(self, batch: BatchSlice) -> bool:
        """True when a (replayed) batch is already reflected in the output."""
        return self.next_input_offset is not None and batch.last_offset < self.next_input_offset

    async def stop(self) -> None:
        """End a commit in flight, then close the producer and the store (the store stays on
        disk for a quick return). Every step runs, each bounded (an overrun is logged by name),
        even if the caller is cancelled meanwhile: the cancel is raised after."""
        await run_to_end(self._close())

    async def _close(self) -> None:
        self._stopping = True
        context = {"query": self.query.query_id, "partition": self.partition, "stage": self.stage}
        job = self._commit_job
        try:
            if job is not None and not job.done():
                await self._end_commit(job, context)
            if self.producer is not None:
                await bounded(stop_client(self.producer), PRODUCER_STOP_TIMEOUT_S, "stop the producer", context)
            if job is not None and not job.done():
                # What it waits for will never come from a stopped producer.
                job.cancel()
                await asyncio.wait({job}, timeout=1.0)
                if not job.done():
                    log.error("a commit outlived its producer; left to end on its own", extra=context)
        finally:  # a store left open would lock out its next owner in this process
            if self.store is not None:
                self.store.close()
                self.store = None

    async def _end_commit(self, job: asyncio.Task[bool], context: dict[str, object]) -> None:
        """Let a committing commit finish (store write included); abort one still in its transaction."""
        if self._committing:
            await asyncio.wait({job}, timeout=COMMIT_GRACE_S)
            if not job.done():
                log.error("a committing transaction overran; cancelled (its outcome is the broker's)",
                          extra={**context, "timeout_s": COMMIT_GRACE_S})
        if not job.done():
            job.cancel()  # in the transaction: the transaction context aborts it
            await asyncio.wait({job}, timeout=ABORT_TIMEOUT_S)
            if not job.done():
                log.error("aborting the commit in flight overran; stopping the producer under it",
                          extra={**context, "timeout_s": ABORT_TIMEOUT_S})


def store_path(settings: WorkerSettings, query_id: str, partition: int) -> Path:
    """Where a worker keeps its copy of one partition of a query's table (active or standby:
    the same place, so a promoted standby starts from what it replayed)."""
    return partition_dir(settings.state_dir, settings.worker_id, query_id, partition)


RowFn = Callable[[bytes, list[Any]], list[Any] | None]
"""A table's row from a stored key and state; None when the row is not in the table (a
GROUP BY row its HAVING drops)."""


def table_rows(table: DataSource) -> Callable[[bytes, list[Any]], list[Any]]:
    """A materialized table's row from a stored key and values, in declared column order:
    the key columns where they are, values elsewhere (its active task's and standby copies');
    a windowed table's (keyed by the key and the window) with its window's bounds after the key."""
    rows = _unwindowed_rows(table)
    window = table.window
    if window is None:
        return rows
    at = sum(c.key for c in table.columns)  # the key columns come first (``DataSource.row_columns``)

    def windowed(key: bytes, state: list[Any]) -> list[Any]:
        inner, start, end = window_bounds(key, window)
        row = rows(inner, state)
        return [*row[:at], start, end, *row[at:]]

    return windowed


def _unwindowed_rows(table: DataSource) -> Callable[[bytes, list[Any]], list[Any]]:
    """``table_rows`` without the window's bounds: the row of a stored key (without its window) and values."""
    decode, columns = key_decoder(table.key_columns), table.columns
    decoders = [None if c.key else bytes_decoder(c.type) for c in columns]
    width = sum(not c.key for c in columns)

    def fitted(state: list[Any]) -> list[Any]:
        """A row stored before a CREATE OR REPLACE added columns at the end has them NULL."""
        return state if len(state) == width else [*state[:width], *[None] * (width - len(state))]

    if not any(decoders):
        def row(key: bytes, state: list[Any]) -> list[Any]:
            keys, values = iter(decode(key)), iter(fitted(state))
            return [next(keys) if c.key else next(values) for c in columns]

        return row

    def with_bytes(key: bytes, state: list[Any]) -> list[Any]:  # stored as base64 text (``reducers.stored``)
        keys, values = iter(decode(key)), iter(fitted(state))
        out = []
        for c, bytes_of in zip(columns, decoders, strict=True):
            value = next(keys) if c.key else next(values)
            out.append(value if bytes_of is None or value is None else bytes_of(value))
        return out

    return with_bytes


def group_rows(query: PersistentQuery, sink: DataSource) -> RowFn:
    """A GROUP BY table's rows (``aggregate_rows``), without those its HAVING drops (a HAVING
    that cannot be computed for a row drops it)."""
    aggs = [aggregates.of(a.function, a.literals) for a in query.plan.aggregates]
    held = {a.column for a in query.plan.aggregates}
    if any(a.result is not None for a in query.plan.aggregates) or any(
            not c.key and c.name not in held and c.expression not in (WINDOW_START, WINDOW_END) for c in query.plan.columns):
        return computed_rows(query, sink, aggs)
    row = aggregate_rows(sink, aggs, query.plan.columns)
    having = having_over_result(aggregation_query(query)) if query.plan.having is not None else None
    if having is None:
        return row
    names = [c.name for c in sink.row_columns]
    # Its INT and BIGINT arithmetic wraps as Spark's (``types.with_widths``), over the result's columns.
    having = with_widths(having, Scope(sink.name, {c.name: c.type for c in sink.row_columns}))

    def kept(key: bytes, state: list[Any]) -> list[Any] | None:
        values = row(key, state)
        try:
            passes = evaluate(having, dict(zip(names, values, strict=True))) is True
        except (ArithmeticError, TypeError, ValueError):
            passes = False
        return values if passes else None

    return kept


def aggregate_rows(sink: DataSource, aggs: list[aggregates.Aggregate],
                   columns: Sequence[OutputColumn] = ()) -> Callable[[bytes, list[Any]], list[Any]]:
    """How a GROUP BY table's row (key columns first, for a windowed table WINDOWSTART and
    WINDOWEND next, then the aggregates) is made from a stored state, with its key decoder
    and finalizers looked up once (a scan makes thousands of rows)."""
    decode = key_decoder(sink.key_columns)
    window = sink.window
    # The plan's value columns that are a window's bounds (SELECT WINDOWSTART AS ws, ...), in order.
    bounds = [c.expression if c.expression in (WINDOW_START, WINDOW_END) else None for c in columns if not c.key]
    # A state keeps BYTES as base64 text (``reducers.stored``): the row has them back as bytes,
    # by the type of the aggregate's column (the sink's value columns but the window bounds).
    results = [c.type for c, bound in zip(sink.value_columns, bounds or [None] * len(sink.value_columns), strict=True)
               if bound is None]
    finals = [_final(agg, t) for agg, t in zip(aggs, results, strict=True)]
    n = len(finals)  # a state's partials; its time may follow them (``AggregationTask._merge``)
    if window is not None and any(bounds):
        def bounded_row(key: bytes, state: list[Any]) -> list[Any]:
            inner, start, end = window_bounds(key, window)
            finalized = (final(s) for final, s in zip(finals, state[:n], strict=True))
            values = [start if b == WINDOW_START else end if b == WINDOW_END else next(finalized) for b in bounds]
            return [*decode(inner), start, end, *values]

        return bounded_row
    if window is not None:
        def windowed_row(key: bytes, state: list[Any]) -> list[Any]:
            inner, start, end = window_bounds(key, window)
            return [*decode(inner), start, end, *[final(s) for final, s in zip(finals, state[:n], strict=True)]]

        return windowed_row

    def row(key: bytes, state: list[Any]) -> list[Any]:
        return [*decode(key), *[final(s) for final, s in zip(finals, state[:n], strict=True)]]

    return row


def aggregation_query(query: PersistentQuery) -> ast.Query:
    """The SELECT a GROUP BY query's aggregation computes, as its planner planned it: the
    statement's, or over a join the one over the joined row (``join_aggregation``: each column
    known by its side, ``O_AMOUNT``, as the plan's aggregates read it)."""
    statement, spec = statement_query(query.statement, dict(query.types)), query.plan.join
    if spec is None:
        return statement
    return join_aggregation(statement, spec.stream, tuple(t.table for t in spec.tables)).query


def computed_rows(query: PersistentQuery, sink: DataSource, aggs: list[aggregates.Aggregate]) -> RowFn:
    """A GROUP BY table's row (as ``group_rows``) where value columns compute over its
    aggregates (``ROUND(AVG(x), 2)``, ``SUM(x) / COUNT(*)``), or some aggregate is held apart
    for them or for HAVING (``aggregates_over_result``, from the statement): each aggregate's
    value by its column's name (or the name it is held apart under), then each such expression
    over them, its INT and BIGINT arithmetic wrapping as Spark's (one that cannot be computed
    is NULL), then HAVING over all of them (None: a row it drops, or cannot compute)."""
    plan = query.plan
    types = {c.name: c.type for c in sink.row_columns} | {a.column: a.result for a in plan.aggregates if a.result is not None}
    scope = Scope(sink.name, types)
    derived, _, having_over = aggregates_over_result(aggregation_query(query))
    over = {name: with_widths(expr, scope) for name, expr in derived.items()}
    having = None if plan.having is None or having_over is None else with_widths(having_over, scope)
    finals = [(a.column, _final(agg, types[a.column])) for a, agg in zip(plan.aggregates, aggs, strict=True)]
    n = len(finals)  # a state's partials; its time may follow them (``AggregationTask._merge``)
    decode, keys, window = key_decoder(sink.key_columns), [c.name for c in sink.key_columns], sink.window
    head = [*keys, *((WINDOW_START, WINDOW_END) if window is not None else ())]
    # Each value column: a window's bound, an aggregate, or an expression over them, by name.
    values = [(c.name, c.expression if c.expression in (WINDOW_START, WINDOW_END) else c.name, over.get(c.name))
              for c in plan.columns if not c.key]

    def computed(expr: Any, known: dict[str, Any]) -> Any:
        try:
            return evaluate(expr, known)
        except (ArithmeticError, TypeError, ValueError):
            return None

    def row(key: bytes, state: list[Any]) -> list[Any] | None:
        if window is not None:
            inner, start, end = window_bounds(key, window)
            known = dict(zip(keys, decode(inner), strict=True))
            known[WINDOW_START], known[WINDOW_END] = start, end
        else:
            known = dict(zip(keys, decode(key), strict=True))
        for (name, final), partial in zip(finals, state[:n], strict=True):
            known[name] = final(partial)
        out = [known[name] for name in head]
        for name, source, expr in values:
            known[name] = value = known[source] if expr is None else computed(expr, known)
            out.append(value)
        return out if having is None or computed(having, known) is True else None

    return row


def _final(agg: aggregates.Aggregate, type_: Any) -> Callable[[list[Any]], Any]:
    """``agg``'s finalizer of a state into a value of ``type_`` (BYTES back from base64 text)."""
    to_bytes = bytes_decoder(type_)
    return agg.finalize if to_bytes is None else _with_bytes(agg.finalize, to_bytes)


def _with_bytes(finalize: Callable[[list[Any]], Any], to_bytes: Callable[[Any], Any]) -> Callable[[list[Any]], Any]:
    """``finalize`` whose result has its BYTES back from the base64 text the state keeps."""
    def final(state: list[Any]) -> Any:
        value = finalize(state)
        return None if value is None else to_bytes(value)

    return final


KEPT_STORE_MAX_AGE_MS = JOINED_TOMBSTONES_MS - 24 * 3_600_000
"""How old a kept store that a compacted topic's tombstones keep right (a join's, a regroup's)
may be and still resume from its position: those topics keep a tombstone
``JOINED_TOMBSTONES_MS``, less a day's margin for the log cleaner's pace; an older one starts
over (``state.store.open_kept``)."""
RESTORE_FETCH_MS = 50
"""The longest one restore fetch waits for records (the position is checked between fetches)."""


class StoreTask(Task[SliceT]):
    """A task that keeps one partition of a table in a RocksDB store, for pull queries."""

    restored = False
    """Set once ``start`` has brought the store up to every change committed before it."""

    @property
    def readable(self) -> bool:
        """Whether pulls may read the store as the active's: RUNNING, or restored and not
        rebuilding while Spark starts the task's query. A promoted standby answers at once,
        its store as current as the committed changelog, not seconds later once Spark runs."""
        return self.state == RUNNING or (self.restored and self.state in (STARTING, RESTORING)
                                         and not self.rebuilding())

    @property
    def store_path(self) -> Path:
        """Where this task's RocksDB store lives."""
        return store_path(self.settings, self.query.query_id, self.partition)

    async def expected_input_offset(self) -> int | None:
        """The input position the task's store has applied, once ``start`` has opened it (a
        promoted standby's copy, caught up with the changelog: known at once, where asking the
        group takes as long as the start itself); else as ``Task`` has it."""
        if self.store is not None and (applied := self.store.position(INPUT_OFFSET)) is not None:
            return applied
        return await super().expected_input_offset()

    @abstractmethod
    def row(self, key: bytes, state: list[Any]) -> list[Any] | None:
        """A table row, in the table's column order, from a stored state (None: not a row of
        the table, as ``RowFn``)."""


class AggregationTask(StoreTask[AggregateSlice]):
    """Materializes one partition of a GROUP BY query's table."""

    def __init__(self, settings: WorkerSettings, query: PersistentQuery, source: DataSource,
                 sink: DataSource, partition: int, stage: str = ""):
        super().__init__(settings, query, source, sink, partition, stage)
        self.aggregates = [aggregates.of(a.function, a.literals) for a in query.plan.aggregates]
        # A table aggregation's partials add and take back rows (``Aggregate.undo``).
        self._mergers = [agg.merger(signed=query.plan.regrouped is not None) for agg in self.aggregates]
        self._row = group_rows(query, sink)
        self.changelog = TopicPartition(changelog_topic(settings.service_id, query.query_id), partition)
        self.changelog_position = 0
        """The next changelog offset the store reflects."""
        self.changelog_end: int | None = None
        """The changelog's end when last known; None until the restore read it."""
        self.last_applied_ms = 0

    def lag(self) -> StoreLag | None:
        """How far the store is behind its changelog (0 once running: it writes the changelog);
        None until the restore knows the end, so a store that has not looked is never caught up."""
        if self.changelog_end is None:
            return None
        return StoreLag(self.query.query_id, self.partition, True, self.changelog_position,
                        max(self.changelog_end, self.changelog_position), self.last_applied_ms,
                        -1 if self.next_input_offset is None else self.next_input_offset)

    async def start(self) -> None:
        """Open the store, fence any older owner, and restore the store from the changelog."""
        self.store = await opened(self.store_path)
        reader = self._changelog_reader()
        try:
            # Fencing aborts the old owner's open transaction, so the changelog end read after
            # it is final; the changelog consumer connects meanwhile. Once fenced, the committed
            # input position is final too: it is read while the store restores.
            await gather_or_cancel(self._open_producer(), reader.start())
            _, resume = await gather_or_cancel(self._restore(reader), self._starting_offset())
        finally:
            await reader.stop()
        # The store has applied its input up to where its changelog's transactions committed it,
        # which is where the group's committed offset is, unless Kafka expired that offset (a
        # partition without input for offsets.retention.minutes): then resuming from the start
        # would merge the retained input a second time.
        applied = self.store.position(INPUT_OFFSET)
        if applied is not None and (resume is None or resume < applied):
            log.warning("the committed input offset is behind the restored store (expired?); resuming where the store is",
                        extra={"query": self.query.query_id, "partition": self.partition, "committed": resume,
                               "store": applied})
            resume = applied
        self.next_input_offset = resume
        self.start_input_offset = self.next_input_offset
        self.restored = True
        log.info("task started", extra={"query": self.query.query_id, "partition": self.partition,
                                        "restored": self.restored_records,
                                        "input_offset": self.next_input_offset})

    def _changelog_reader(self) -> ChangelogReader:
        # A short fetch wait: the changelog usually ends with a commit marker, and a fetch
        # that finds only the marker would otherwise wait the default 500 ms.
        assert self.store is not None
        return ChangelogReader(self.settings.kafka, self.changelog, self.store, fetch_max_wait_ms=25)

    async def _restore(self, reader: ChangelogReader) -> None:
        """Apply the changelog from the store's position to its end (``reader`` started)."""
        end = await reader.end_offset()
        self.changelog_position = reader.position
        self.changelog_end = end
        self.state, self.records_to_restore = RESTORING, max(end - reader.position, 0)
        started = time.monotonic()
        while reader.position < end:
            # A fetch that finds only a transaction marker moves the position past it but
            # returns no record: a long timeout would wait it out (1 s of every promotion).
            applied = await reader.fetch(timeout_ms=RESTORE_FETCH_MS)
            if applied:
                self.changelog_position = reader.position
                self.restored_records += applied
                self.last_applied_ms = now_ms()
        log.info("restore finished", extra={"query": self.query.query_id, "partition": self.partition,
                                            "restored": self.restored_records,
                                            "seconds": round(time.monotonic() - started, 3)})

    def _merge(self, key: bytes, partial: list[list[Any]], time_ms: int | None) -> list[Any]:
        """The key's stored state with the batch's partial merged in, and after the partials the
        latest time of every record merged into it (the stored one's and ``time_ms``, the
        batch's latest for the key), as Kafka Streams stamps an aggregation's results; a state
        stored before states kept it, merged with a batch that does not say it, has none."""
        assert self.store is not None
        old = self.store.get(key)
        count = len(self._mergers)
        if old is None:
            state: list[Any] = [merge(None, n) for merge, n in zip(self._mergers, partial, strict=True)]
        else:
            state = [merge(o, n) for merge, o, n in zip(self._mergers, old[:count], partial, strict=True)]
        times = [t for t in (time_ms, old[count] if old is not None and len(old) > count else None) if t is not None]
        return [*state, max(times)] if times else state

    def row_time(self, key: bytes, state: list[Any]) -> int | None:
        """The timestamp of the sink record of ``state``'s row: the latest time of its records
        (None: not known, the producer stamps it)."""
        return state[len(self._mergers)] if len(state) > len(self._mergers) else None

    def row(self, key: bytes, state: list[Any]) -> list[Any] | None:
        """A table row (key column first, then the aggregates) from a stored state; None when
        its HAVING drops it."""
        return self._row(key, state)

    async def commit(self, batch: AggregateSlice) -> bool:
        """Apply one micro-batch slice exactly once; False when it was applied before."""
        assert self.store is not None and self.producer is not None
        if self.applied(batch):
            return False
        states = {key: self._merge(key, partial, batch.times.get(key)) for key, partial in batch.partials}
        expired = self._expired(batch, states)
        gone = set(expired)
        emitted = self._emitted(batch, states)
        changelog_futures = []
        # Each changelog record says which input position its batch reaches, so a standby
        # knows the position it reflects (consistency tokens are input positions).
        headers = [(INPUT_OFFSET_HEADER, str(batch.last_offset + 1).encode()), *self._headers(batch)]
        async with self._transaction():
            for key, state in states.items():
                if key not in gone:
                    changelog_futures.append(await self._send(self.changelog.topic, encode_state(state), key,
                                                              self.partition, headers))
            for key, state in emitted.items():
                await self._send_row(key, state, batch.bad, batch.last_offset)
            for key in expired:
                changelog_futures.append(await self._send(self.changelog.topic, None, key, self.partition, headers))
            await self._send_bad(batch.bad)
            await self._send_dropped(batch)
            await self._commit_input(batch.last_offset + 1)
        positions = {INPUT_OFFSET: batch.last_offset + 1, **self._positions(batch)}
        if changelog_futures:
            positions[CHANGELOG_OFFSET] = (await changelog_futures[-1]).offset + 1
        self.store.write({k: encode_state(s) for k, s in states.items() if k not in gone}, positions, expired)
        self.next_input_offset = batch.last_offset + 1
        if CHANGELOG_OFFSET in positions:
            self.changelog_position = self.changelog_end = positions[CHANGELOG_OFFSET]
            self.last_applied_ms = now_ms()
        self._applied(batch, states)
        return True

    async def _send_row(self, key: bytes, state: list[Any], bad: list[BadRecord], offset: int) -> None:
        """The sink record of ``state``'s row; a row the sink's format cannot hold goes to
        ``bad`` instead (as ksqlDB logs a serialization error and goes on)."""
        try:
            value = self._sink_value(key, state)
        except ValueError as error:
            bad.append(BadRecord(offset, f"the row cannot be written as {self.sink.value_format}: {error}", None))
            return
        await self._send(self.sink.topic, value, key, self.partition, timestamp_ms=self.row_time(key, state))

    def _sink_value(self, key: bytes, state: list[Any]) -> bytes | None:
        """The sink record's value of a state: the row's value columns (they come last); None
        (a tombstone: the row left the table) when its HAVING drops it."""
        names = [c.name for c in self.sink.value_columns]
        row = self._row(key, state)
        if row is None:
            return None
        return serialize_value(names, row[len(row) - len(names):], self.sink.value_format, self.sink.value_delimiter)

    def _expired(self, batch: AggregateSlice, states: dict[bytes, list[Any]]) -> list[bytes]:
        """Keys the batch removes from the store and the changelog, ``states``' own among them
        (their update still goes to the sink); none here: a key's state lasts."""
        return []

    def _emitted(self, batch: AggregateSlice, states: dict[bytes, list[Any]]) -> dict[bytes, list[Any]]:
        """The rows the batch sends to the sink, by key: every state it changed (EMIT CHANGES)."""
        return states

    def _headers(self, batch: AggregateSlice) -> list[tuple[str, bytes]]:
        """Changelog headers besides the input offset."""
        return []

    def _positions(self, batch: AggregateSlice) -> dict[bytes, int]:
        """Store positions the batch sets besides the offsets."""
        return {}

    async def _send_dropped(self, batch: AggregateSlice) -> None:
        """Processing-log records for input the batch dropped on purpose (none here)."""

    def _applied(self, batch: AggregateSlice, states: dict[bytes, list[Any]]) -> None:
        """The batch is committed and in the store."""


_NO_WINDOW = 2**63
"""Above every window start: the oldest start of an empty store."""


class EventTimeTask(AggregationTask):
    """An aggregation over windows of event time: its windows, and its partition's stream time
    (the latest event time applied), which the store keeps and ``start`` takes back."""

    def __init__(self, settings: WorkerSettings, query: PersistentQuery, source: DataSource,
                 sink: DataSource, partition: int, stage: str = ""):
        super().__init__(settings, query, source, sink, partition, stage)
        assert query.plan.window is not None
        self.window = query.plan.window
        self.stream_time = -1
        """The latest event time applied (-1: none yet). Read by the reducer between batches."""

    async def start(self) -> None:
        """Restore as any aggregation, then take the stream time the store reached."""
        await super().start()
        assert self.store is not None
        self.stream_time = self.store.stream_time()


class WindowedAggregationTask(EventTimeTask):
    """Materializes one partition of a windowed GROUP BY table: a state per (key, window),
    stored under the windowed key. Stream time (the latest event time of the partition's
    records) is kept with the state, in the store and in every changelog record's header, so a
    restored or promoted copy closes windows exactly where the old owner would have. A batch
    is reduced against the task's stream time (``WindowSlice.reduced_at``): records whose
    window closed (its end plus grace at or before stream time, as Kafka Streams) are dropped
    to the processing log. Windows whose start is ``retention`` or more behind stream time
    leave the store and the changelog (a tombstone each). With EMIT FINAL the sink gets each
    window once, when stream time closes it, instead of every change."""

    def __init__(self, settings: WorkerSettings, query: PersistentQuery, source: DataSource,
                 sink: DataSource, partition: int, stage: str = ""):
        super().__init__(settings, query, source, sink, partition, stage)
        self._oldest_start: int | None = None
        """The earliest window start in the store (``_NO_WINDOW``: none); None until a scan found it."""
        self._open: dict[int, set[bytes]] | None = None
        """EMIT FINAL: the windows not closed yet, by start; None until a scan of the store found them."""

    async def commit(self, batch: AggregateSlice) -> bool:
        """Apply one micro-batch slice exactly once, if it was reduced against this task's
        stream time; False when it was applied before."""
        assert isinstance(batch, WindowSlice)
        if not self.applied(batch) and batch.reduced_at != self.stream_time:
            raise MillpondError(f"task {self.query.query_id}/{self.partition} got a batch reduced at stream time "
                                f"{batch.reduced_at}, but its own is {self.stream_time}; the batch is not applied")
        return await super().commit(batch)

    def _expired(self, batch: AggregateSlice, states: dict[bytes, list[Any]]) -> list[bytes]:
        assert isinstance(batch, WindowSlice) and self.store is not None
        cutoff = batch.stream_time - self.window.retention_ms  # a window starting at or before it goes
        # A window the batch updated may be past the retention by the batch's end (stream time
        # moved on after its records): it is emitted, then let go at once, as a record-at-a-time
        # store would have kept it and then dropped it.
        expired = [key for key in states if split_windowed_key(key)[1] <= cutoff]
        if self._oldest_start is not None and self._oldest_start > cutoff:
            return expired
        oldest = None
        for key, _ in self.store.items():
            start = split_windowed_key(key)[1]
            if start <= cutoff:
                if key not in states:
                    expired.append(key)
            elif oldest is None or start < oldest:
                oldest = start
        self._oldest_start = oldest if oldest is not None else _NO_WINDOW
        return expired

    def _close_limit(self, stream_time: int) -> int:
        """The latest window start that is closed at ``stream_time`` (its end plus grace reached)."""
        return stream_time - self.window.size_ms - self.window.grace_ms

    def _emitted(self, batch: AggregateSlice, states: dict[bytes, list[Any]]) -> dict[bytes, list[Any]]:
        """EMIT CHANGES: every window the batch changed. EMIT FINAL: every window the batch's
        stream time closes, with its final state, once (a closed window takes no more records)."""
        assert isinstance(batch, WindowSlice) and self.store is not None
        if not self.window.emit_final:
            return states
        if self._open is None:
            self._open = {}
            limit = self._close_limit(self.stream_time)
            for key, _ in self.store.items():
                if (start := split_windowed_key(key)[1]) > limit:
                    self._open.setdefault(start, set()).add(key)
        limit = self._close_limit(batch.stream_time)
        closing = {key for start, keys in self._open.items() if start <= limit for key in keys}
        closing |= {key for key in states if split_windowed_key(key)[1] <= limit}
        final = {}
        for key in sorted(closing, key=lambda k: (split_windowed_key(k)[1], k)):
            state = states[key] if key in states else self.store.get(key)
            if state is not None:
                final[key] = state
        return final

    def _headers(self, batch: AggregateSlice) -> list[tuple[str, bytes]]:
        assert isinstance(batch, WindowSlice)
        return [(STREAM_TIME_HEADER, str(batch.stream_time).encode())]

    def _positions(self, batch: AggregateSlice) -> dict[bytes, int]:
        assert isinstance(batch, WindowSlice)
        return {STREAM_TIME: batch.stream_time}

    async def _send_dropped(self, batch: AggregateSlice) -> None:
        assert isinstance(batch, WindowSlice)
        await self._send_bad(batch.late)

    def _applied(self, batch: AggregateSlice, states: dict[bytes, list[Any]]) -> None:
        assert isinstance(batch, WindowSlice)
        if self._open is not None:  # EMIT FINAL: what the batch opened stays open until it closes
            limit = self._close_limit(batch.stream_time)
            for key in states:
                if (start := split_windowed_key(key)[1]) > limit:
                    self._open.setdefault(start, set()).add(key)
            for start in [s for s in self._open if s <= limit]:
                del self._open[start]
        self.stream_time = batch.stream_time
        cutoff = batch.stream_time - self.window.retention_ms
        starts = [start for key in states if (start := split_windowed_key(key)[1]) > cutoff]
        if starts and self._oldest_start is not None:
            self._oldest_start = min(self._oldest_start, *starts)
        if batch.late:
            metrics.RECORDS_LATE.labels(self.query.query_id, str(self.partition)).inc(len(batch.late))


class ProjectionTask(Task[ProjectSlice]):
    """Writes one partition's filtered, projected records to the sink, exactly once: the
    records and the input offsets go in one transaction. Over a table, a deleted row or one
    the filter drops is written as a tombstone, so the sink table loses it too."""

    def target_partition(self, key: bytes | None) -> int | None:
        """Where a result record goes: the input's partition while the key is unchanged,
        else murmur2 of the new key (as the Java client), or the producer's choice if keyless."""
        if not self.query.plan.repartition:
            return self.partition
        return partition_for(key, self.sink.partitions) if key is not None else None

    async def commit(self, batch: ProjectSlice) -> bool:
        """Apply one micro-batch slice exactly once; False when it was applied before."""
        assert self.producer is not None
        if self.applied(batch):
            return False
        # A repartition topic's records are stamped when written: its retention must not
        # delete an input's old records before the next stage reads them.
        timestamps = batch.timestamps if batch.timestamps and self.stage != "repartition" else [None] * len(batch.records)
        async with self._transaction():
            for (key, value), timestamp in zip(batch.records, timestamps, strict=True):
                await self._send(self.sink.topic, value, key, self.target_partition(key), timestamp_ms=timestamp)
            await self._send_bad(batch.bad)
            await self._commit_input(batch.last_offset + 1)
        self.next_input_offset = batch.last_offset + 1
        return True


CATCH_UP_RECORDS = 100_000
"""Most records of its topic a ``ReplayedTableTask`` applies at start; a longer tail (a
store rebuilt from far behind) is the Spark query's to read."""
CATCH_UP_WAIT_MS = 25
CATCH_UP_S = 10.0
"""How long a ``ReplayedTableTask``'s start spends applying its store's tail at most."""
PAST_MARKERS_S = 2.0
"""How long a table task's start spends looking past the transaction markers at its store's
end at most."""


async def table_store_max_age(kafka: KafkaConnection, table: DataSource) -> int | None:
    """How old a kept store of ``table`` (its task's, or a copy's) may be and still resume from
    its position: a compacted topic's cleaner removes a tombstone ``delete.retention.ms`` after it
    could (a tenth less, for the clocks and the cleaner's pace), and a store last brought up to
    date (``WRITTEN_MS``) longer ago may have missed one, keeping a deleted row; such a store is
    built again from the topic unless the topic has no record past its position
    (``TableTopicReader``). None: the topic is not compacted."""
    kept = await tombstones_kept_ms(kafka, table.topic)
    return None if kept is None else kept - kept // 10


class TableTask(StoreTask[MaterializeSlice]):
    """Materializes one partition of a table declared over a topic: the latest row per key
    (a NULL value deletes the key). The topic is its own changelog, as Kafka Streams does
    for source tables: rows and the next input offset change in one RocksDB write batch, so
    a crash at any point resumes exactly, and a worker without the store rebuilds it by
    reading the topic from the start. Each batch's transaction carries its processing-log
    records and the input offsets (for lag tooling and to fence a zombie)."""

    REPLAYS = False
    """Whether the table's standby copies replay its topic (``ReplayedTableTask``)."""

    def __init__(self, settings: WorkerSettings, query: PersistentQuery, source: DataSource,
                 sink: DataSource, partition: int, stage: str = ""):
        super().__init__(settings, query, source, sink, partition, stage)
        self.input_end: int | None = None
        """The topic's last stable offset when the task started: the store is rebuilding
        (RESTORING) until it has read that far. None until known."""
        self.input_start = 0
        """Where the store's replay of the topic began (its position, or the topic's first offset)."""
        self.last_applied_ms = 0
        self._row = table_rows(sink)
        self._oldest_window: int | None = None
        """A windowed table's: the earliest time by which a stored window expires (``_NO_WINDOW``:
        none); None until a scan of the store found it."""

    async def start(self) -> None:
        """Open the store and fence any older owner; resume after the store's own position,
        brought up to the topic's end here where that takes no Spark batch (``_catch_up``),
        else RESTORING while the query replays what the topic held when it started."""
        self.store = await opened(self.store_path)
        max_age = await table_store_max_age(self.settings.kafka, self.source)
        await self._open_producer()
        reader = TableTopicReader(self.settings.kafka, self.source, self.partition, self.store,
                                  fetch_max_wait_ms=CATCH_UP_WAIT_MS, max_age_ms=max_age)
        try:
            await reader.start()  # (a store behind the topic's retention, or its tombstones', starts empty)
            stored = self.store.position(INPUT_OFFSET)
            first = reader.first if reader.first is not None else (
                await reader.consumer.beginning_offsets([self.input]))[self.input]
            self.input_end = await reader.end_offset()
            if stored is not None and stored < self.input_end:
                await self._catch_up(reader, self.input_end)
            if stored is not None and (self.store.position(INPUT_OFFSET) or 0) >= self.input_end:
                mark_up_to_date(self.store, self.input_end)
        finally:
            await reader.stop()
        self.next_input_offset = self.start_input_offset = self.store.position(INPUT_OFFSET)
        self.input_start = first if self.next_input_offset is None else max(first, self.next_input_offset)
        self.records_to_restore = max(self.input_end - self.input_start, 0)
        if self.records_to_restore:
            self.state = RESTORING
        self.restored = True  # rebuilding() keeps it unreadable while it replays the topic
        log.info("task started", extra={"query": self.query.query_id, "partition": self.partition,
                                        "input_offset": self.next_input_offset, "input_end": self.input_end})

    async def _catch_up(self, reader: TableTopicReader, end: int) -> None:
        """Bring a kept store (a promoted copy's, or this worker's own from before) to ``end``
        without waiting for the query's first batch, where that is exact: past a tail of
        transaction markers alone (every committed batch leaves one), and, for a table whose
        copies replay its topic (``REPLAYS``), through up to ``CATCH_UP_RECORDS`` records
        applied as a copy applies them; the records left out go to the processing log, and
        the input is committed up to there, as a batch would. Whatever is left, the query
        reads (RESTORING until then)."""
        if not self.REPLAYS or end - reader.position > CATCH_UP_RECORDS:
            await reader.past_markers(end, PAST_MARKERS_S)
            return
        bad: list[BadRecord] = []
        applied = 0
        deadline = time.monotonic() + CATCH_UP_S
        assert self.store is not None
        stored = self.store.position(INPUT_OFFSET)
        try:
            while reader.position < end and time.monotonic() < deadline:
                applied += await reader.fetch(CATCH_UP_WAIT_MS, lambda *record: bad.append(BadRecord(*record)))
            if applied:
                self.last_applied_ms = now_ms()
                async with self._transaction():
                    await self._send_bad(bad)
                    await self._commit_input(reader.position)
                self.store.write({}, {WRITTEN_MS: now_ms()})
        except BaseException:
            # Not committed (cancelled, fenced, a broker error): the store's position goes back
            # to where it was, so the next start applies the same records again (each key's
            # last one wins: the same rows) and logs the ones left out, which this one never did.
            if stored is not None and self.store.position(INPUT_OFFSET) != stored:
                self.store.write({}, {INPUT_OFFSET: stored})
            raise

    def rebuilding(self) -> bool:
        """Whether the store still lacks part of what the topic held when the task started."""
        return self.state == RESTORING

    def read_through(self, offset: int) -> None:
        """The query has read (and committed) its input up to ``offset``: past transaction
        markers, which committed record offsets alone never reach. Ends the rebuild there; the
        store reflects the topic up to there (``MARKED_END``: a quiet table's store, however
        old, need not be built again)."""
        if self.store is not None and self.next_input_offset is not None and offset >= self.next_input_offset:
            mark_up_to_date(self.store, offset)
        if self.state == RESTORING and self.input_end is not None and offset >= self.input_end:
            self.state = RUNNING
            self.restored_records = self.records_to_restore
            log.info("rebuild finished", extra={"query": self.query.query_id, "partition": self.partition,
                                                "input_offset": self.next_input_offset})

    def lag(self) -> StoreLag | None:
        """How far the store is behind its topic, which is its changelog: as of the end the
        task knows (the end at start, then what it committed); None before ``start`` read it."""
        if self.input_end is None:
            return None
        current = self.input_start if self.next_input_offset is None else self.next_input_offset
        if self.state != RESTORING:
            current = max(current, self.input_end)
        return StoreLag(self.query.query_id, self.partition, True, current, max(self.input_end, current),
                        self.last_applied_ms, -1 if self.next_input_offset is None else self.next_input_offset)

    def row(self, key: bytes, state: list[Any]) -> list[Any]:
        """The row in declared column order: the key columns where they are, values elsewhere."""
        return self._row(key, state)

    async def commit(self, batch: MaterializeSlice) -> bool:
        """Apply one micro-batch slice exactly once; False when it was applied before."""
        assert self.store is not None and self.producer is not None
        if self.applied(batch):
            return False
        async with self._transaction():
            await self._send_bad(batch.bad)
            await self._commit_input(batch.last_offset + 1)
        rows = {key: encode_state(values) for key, values in batch.latest if values is not None}
        deleted = [key for key, values in batch.latest if values is None]
        positions = {INPUT_OFFSET: batch.last_offset + 1, WRITTEN_MS: now_ms()}
        if self.sink.window is not None:
            positions[STREAM_TIME] = stream_time = max(self.store.stream_time(), batch.stream_time)
            expired = self._expired_windows(stream_time, rows)
            deleted += expired
            for key in expired:
                rows.pop(key, None)
        self.store.write(rows, positions, deleted)
        self.next_input_offset = batch.last_offset + 1
        self.last_applied_ms = now_ms()
        if self.state == RESTORING:
            self.restored_records = min(self.next_input_offset - self.input_start, self.records_to_restore)
            self.read_through(self.next_input_offset)
        return True

    def _expired_windows(self, stream_time: int, rows: Mapping[bytes, bytes]) -> list[bytes]:
        """A windowed table's windows (stored, or written by this batch) that its source let go
        by ``stream_time``, its records' latest timestamp, which is the source's latest event
        time: a time window whose start, or a session that ended, its retention or more before
        it (as ``WindowedAggregationTask`` and ``SessionAggregationTask`` let theirs go)."""
        assert self.store is not None and self.sink.window is not None
        window = self.sink.window
        cutoff = stream_time - window.retention_ms - (1 if window.kind == "SESSION" else 0)

        def moment(key: bytes) -> int:
            _, start, end = window_bounds(key, window)
            return end if window.kind == "SESSION" else start

        moments = {key: moment(key) for key in rows}
        expired = [key for key, m in moments.items() if m <= cutoff]
        kept = [m for m in moments.values() if m > cutoff]
        if self._oldest_window is None or self._oldest_window <= cutoff:
            oldest = None
            for key, _ in self.store.items():
                if (m := moment(key)) <= cutoff:
                    if key not in rows:
                        expired.append(key)
                elif oldest is None or m < oldest:
                    oldest = m
            self._oldest_window = oldest if oldest is not None else _NO_WINDOW
        self._oldest_window = min([self._oldest_window, *kept])
        return expired


class ReplayedTableTask(TableTask):
    """A table task whose table's standby copies replay its topic in Python (a table-table
    join's result: ``Stage.replayed``): at start it applies a kept store's tail of the
    topic the same way, so a promoted copy serves and processes at once."""

    REPLAYS = True


class SessionAggregationTask(EventTimeTask):
    """Materializes one partition of a session-windowed GROUP BY table (ksqlDB's WINDOW
    SESSION), record by record in offset order, as Kafka Streams' session aggregation:

    - stream time is the latest event time so far (kept in the store and on every changelog
      record, as for time windows);
    - a record at ``t`` joins every session of its key that ends at or after ``t - gap`` and
      starts at or before ``t + gap``: they merge into one session from the earliest start to
      the latest end, whose state is the merge of theirs and the record's;
    - the merged session is late when its end is before stream time minus grace: the record is
      dropped to the processing log;
    - the sessions merged away are deleted: a tombstone in the changelog and in the sink, as
      ksqlDB's session tables do; the merged session is written to both;
    - sessions that ended ``retention`` or more before stream time leave the store and the
      changelog.

    Its store key is ksqlDB's session key: the key, then the session's end and start."""

    def __init__(self, settings: WorkerSettings, query: PersistentQuery, source: DataSource,
                 sink: DataSource, partition: int, stage: str = ""):
        super().__init__(settings, query, source, sink, partition, stage)
        self._oldest_end: int | None = None
        """The earliest session end in the store (``_NO_WINDOW``: none); None until a scan found it."""

    def _sessions(self, key: bytes, pending: dict[bytes, list[Any] | None]) -> list[tuple[bytes, int, int]]:
        """The sessions of ``key`` (session key, start, end): the store's, as ``pending`` changes them."""
        assert self.store is not None
        width = len(key) + 16
        found = {k for k, _ in self.store.page(None, 1 << 30, key + b"\x00") if len(k) == width}
        found |= {k for k, v in pending.items() if v is not None and len(k) == width and k.startswith(key)}
        found -= {k for k, v in pending.items() if v is None}
        return [(k, *window_bounds(k, self.window)[1:]) for k in found]

    async def commit(self, batch: AggregateSlice) -> bool:
        """Apply one micro-batch slice exactly once, record by record; False when it was applied before."""
        assert isinstance(batch, SessionSlice) and self.store is not None and self.producer is not None
        if self.applied(batch):
            return False
        gap, grace = self.window.size_ms, self.window.grace_ms
        stream_time = self.stream_time
        pending: dict[bytes, list[Any] | None] = {}
        merged_at: dict[bytes, int] = {}
        """Per session merged into another, the time of the record that merged it (its tombstone's)."""
        late: list[BadRecord] = []
        for offset, key, ts, own in batch.records:
            stream_time = max(stream_time, ts)
            touching = [s for s in self._sessions(key, pending) if s[2] >= ts - gap and s[1] <= ts + gap]
            start, end = min([ts, *(s[1] for s in touching)]), max([ts, *(s[2] for s in touching)])
            if end < stream_time - grace:
                late.append(BadRecord(offset, f"late: its session [{start}, {end}] closed at stream time {stream_time} "
                                              f"(its end plus its {grace} ms grace period); the record is dropped", None))
                continue
            # The sessions in start order, then the record: COLLECT_LIST keeps Kafka Streams' order.
            state: list[list[Any]] | None = None
            for session, _, _ in sorted(touching, key=lambda s: s[1]):
                old = pending[session] if session in pending else self.store.get(session)
                assert old is not None
                state = old if state is None else self._merged(state, old)
                pending[session] = None
                merged_at[session] = ts
            pending[session_key(key, start, end)] = own if state is None else self._merged(state, own)
        # Sessions past the retention: the stored ones and this batch's own (emitted, then let go).
        retired = set(self._expired_sessions(stream_time, pending))
        headers = [(INPUT_OFFSET_HEADER, str(batch.last_offset + 1).encode()),
                   (STREAM_TIME_HEADER, str(stream_time).encode())]
        kept = {k: v for k, v in pending.items() if v is not None and k not in retired}
        deleted = [k for k, v in pending.items() if v is None or k in retired] + sorted(retired - pending.keys())
        changelog_futures = []
        async with self._transaction():
            for session in [*pending, *sorted(retired - pending.keys())]:
                latest = pending.get(session)
                value = encode_state(kept[session]) if session in kept else None
                changelog_futures.append(await self._send(self.changelog.topic, value, session, self.partition, headers))
                if latest is not None:  # a session's new state
                    await self._send_row(session, latest, batch.bad, batch.last_offset)
                elif session in pending:  # merged into another: gone downstream too
                    await self._send(self.sink.topic, None, session, self.partition, timestamp_ms=merged_at[session])
            await self._send_bad(batch.bad)
            await self._send_bad(late)
            await self._commit_input(batch.last_offset + 1)
        positions = {INPUT_OFFSET: batch.last_offset + 1, STREAM_TIME: stream_time}
        if changelog_futures:
            positions[CHANGELOG_OFFSET] = (await changelog_futures[-1]).offset + 1
        self.store.write({k: encode_state(v) for k, v in kept.items()}, positions, deleted)
        self.next_input_offset = batch.last_offset + 1
        self.stream_time = stream_time
        if CHANGELOG_OFFSET in positions:
            self.changelog_position = self.changelog_end = positions[CHANGELOG_OFFSET]
            self.last_applied_ms = now_ms()
        ends = [window_bounds(k, self.window)[2] for k in kept]
        if ends and self._oldest_end is not None:
            self._oldest_end = min(self._oldest_end, *ends)
        if late:
            metrics.RECORDS_LATE.labels(self.query.query_id, str(self.partition)).inc(len(late))
        return True

    def row_time(self, key: bytes, state: list[Any]) -> int | None:
        """A session's row is stamped with the session's end, its latest record's time (as
        Kafka Streams' session aggregation stamps it)."""
        return window_bounds(key, self.window)[2]

    def _merged(self, earlier: list[list[Any]], later: list[list[Any]]) -> list[list[Any]]:
        return [agg.merge(o, n) for agg, o, n in zip(self.aggregates, earlier, later, strict=True)]

    def _expired_sessions(self, stream_time: int, pending: dict[bytes, list[Any] | None]) -> list[bytes]:
        """Sessions (stored, or made by this batch) that ended more than ``retention`` before
        ``stream_time``: strictly, as a record not late may still join a session that ended
        exactly gap plus grace (the least retention) before stream time."""
        assert self.store is not None
        cutoff = stream_time - self.window.retention_ms - 1
        expired = [k for k, v in pending.items() if v is not None and window_bounds(k, self.window)[2] <= cutoff]
        if self._oldest_end is not None and self._oldest_end > cutoff:
            return expired
        oldest = None
        for key, _ in self.store.items():
            end = window_bounds(key, self.window)[2]
            if end <= cutoff:
                if key not in pending:
                    expired.append(key)
            elif key not in pending and (oldest is None or end < oldest):
                oldest = end
        self._oldest_end = oldest if oldest is not None else _NO_WINDOW
        return expired
