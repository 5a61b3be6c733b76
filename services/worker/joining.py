"""A stream-table join's task: one partition of the stream joined with the same partition
of the table (of each table, for a multi-way join on one stream expression), as Kafka
Streams' ``KStream#join(KTable)`` and ksqlDB's stream-table joins. A multi-way join on
several expressions runs a task per stage, each joining its tables with the joined rows the
stage before re-keyed (``topology._chained_join``).

The table side is state: the task keeps the table partition's rows in a RocksDB store, read
from the table's own topic (its changelog, as Kafka Streams' source tables), through a
``read_committed`` consumer. Each stream record joins the table's row **as of the record**:
before a batch is joined, the table partition is fetched up to its end, and its records
are applied in offset order, each one before every stream record with a later timestamp,
as Kafka Streams picks, of two partitions, the one whose next record is older (a table
record and a stream record of the same time: the table's first). Table records newer than
the batch's stream records wait for later batches.

Exactly once: a batch's results, its processing-log records and its stream offset go in one
Kafka transaction, and the offset's commit metadata says how far each table was applied for
it (``TABLE_OFFSETS`` of its JSON: one offset per table). Only after the commit do the table
rows and both positions change, in one RocksDB write batch. A crash between the two leaves
the store behind the committed offset; ``start`` then applies the table's records up to the
committed table position, so the next batch joins against exactly the table the committed
output saw. A worker without the store (a moved partition) rebuilds it from the table's
topic the same way.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from millpond.services.worker.state.changelog import wiped_if_behind
from millpond.services.worker.state.store import INPUT_OFFSET, PartitionStore, encode_state, opened, wiped
from millpond.services.worker.task import BadRecord, BatchSlice, Task, store_path
from millpond.shared.catalog.queries import JoinedTable, PersistentQuery
from millpond.shared.catalog.sources import DataSource
from millpond.shared.catalog.topology import REPARTITION_KEY, ROWTIME_COLUMN, join_input
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.admin import committed_positions
from millpond.shared.kafka.connection import start_client
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.kafka.serde import deserialize_key, serialize_key, serialize_value
from millpond.shared.kafka.time_patterns import pattern_reader
from millpond.shared.kafka.values import stored_bytes, value_decoder
from millpond.shared.sql import ast
from millpond.shared.sql.expressions import evaluate
from millpond.shared.sql.joins import ROWTIME, ResolvedJoin, join_aggregation, joined, resolve_join
from millpond.shared.sql.parser import statement_query
from millpond.shared.task_status import RESTORING
from millpond.shared.teardown import bounded, gather_or_cancel

log = logging.getLogger(__name__)
TABLE_OFFSET = b"table_offset_"
"""With the table's place among the JOINs: the next offset of its topic the store reflects."""
TABLE_OFFSETS = "tables"
"""The field of a committed stream offset's metadata (JSON) with the table offsets it was joined against."""
FETCH_MS = 50
"""The longest one fetch of the table waits for records."""
CATCH_UP_TIMEOUT_S = 60.0
"""How long a batch waits for the table's partition to be read up to its end."""
CONSUMER_STOP_TIMEOUT_S = 10.0
TABLE_IDLE_WAKE_MS = 2000
"""The table consumer's ``consumer_timeout_ms``: paused between batches, it has nothing to do
(a resume wakes it at once)."""


def committed_table_offsets(metadata: str) -> list[int] | None:
    """The table offsets a committed stream offset's metadata holds (``TABLE_OFFSETS``, or the
    whole JSON list that versions before the output positions wrote); None: none."""
    try:
        parsed = json.loads(metadata) if metadata else None
    except ValueError:
        return None
    found = parsed.get(TABLE_OFFSETS) if isinstance(parsed, dict) else parsed
    return [int(o) for o in found] if isinstance(found, list) else None


VALUES_STORED = b"values_stored"
"""Set in a join's store once its rows hold values as ``values.stored`` has them (BYTES as
base64 text); a store written before it (a DELIMITED table's BYTES as their own text) is
built again (``rebuilt_if_old``)."""


async def rebuilt_if_old(store: PartitionStore, positions: Iterable[bytes]) -> None:
    """Empty a join's ``store`` that holds any of ``positions`` but not ``VALUES_STORED``: its
    task then builds it again from the topics, as on a worker without it."""
    if store.position(VALUES_STORED) is None and any(store.position(name) is not None for name in positions):
        log.warning("a join store written before its values were kept as the table's own stores keep them is built "
                    "again", extra={"store": str(store.path)})
        await wiped(store)


class TableBehind(MillpondError):
    """The table's partition could not be read up to its end in time."""


@dataclass
class JoinSlice(BatchSlice):
    """A stream-table join's slice: every usable stream record, in offset order."""

    records: list[tuple[int, bytes, int, list[Any]]] = field(default_factory=list)
    """(offset, join key, ROWTIME, the stream's columns in the stream's order)."""


@dataclass(frozen=True)
class TableRecord:
    """A record of the table's topic, fetched and not yet applied."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    row: list[Any] | None = None
    """Its value decoded, where fetching it took that (its time is in it); None: not yet, or it
    does not decode (``TableSide.apply`` says why)."""


def event_time_reader(table: DataSource, decode: Callable[[bytes], list[Any]]) -> Callable[..., int] | None:
    """How a table record's time is read when the table declares a TIMESTAMP column (a BIGINT of
    epoch milliseconds, a TIMESTAMP, or a VARCHAR read with TIMESTAMP_FORMAT as Spark reads the
    stream side's: ``time_patterns``), as ksqlDB's timestamp extractor reads it; a record whose
    column is NULL, negative or does not read keeps its own timestamp (its row is applied all
    the same, as the table's store applies it). None without such a column, or for a pattern
    with a letter ``time_patterns`` does not read: the record's timestamp orders it."""
    column = table.timestamp
    if column is None:
        return None
    text_time = None if table.timestamp_format is None else pattern_reader(table.timestamp_format)
    if table.timestamp_format is not None and text_time is None:
        return None
    keys = [c.name for c in table.key_columns]
    type_ = table.schema[column]
    at = None if column in keys else [c.name for c in table.value_columns].index(column)
    if at is None and len(keys) > 1:
        return None

    def time_of(record: Any, values: list[Any] | None = None) -> int:
        """``record``'s time; ``values``: its value decoded already, if it was."""
        try:
            if at is None:
                found = None if record.key is None else deserialize_key(record.key, type_)
            else:
                if values is None and record.value is not None:
                    values = decode(record.value)
                found = None if values is None else values[at]
                if isinstance(found, str):  # text read with the table's pattern, or a TIMESTAMP as the stores keep it
                    found = text_time(found) if text_time is not None else _epoch_ms(found)
        except (ValueError, TypeError, ArithmeticError, struct.error):
            found = None
        return found if isinstance(found, int) and found >= 0 else int(record.timestamp)

    return time_of


def _epoch_ms(text: str) -> int:
    """A TIMESTAMP as the table's stores keep it (ISO text of its UTC time) in epoch milliseconds."""
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return (moment - _EPOCH) // datetime.timedelta(milliseconds=1)


_EPOCH = datetime.datetime.fromtimestamp(0, datetime.UTC)


class TableSide:
    """One joined table's partition as a task reads it: its records fetched and not yet
    applied, and its positions. Its rows live in the task's store under the key prefixed by
    the table's place among the JOINs (one byte)."""

    def __init__(self, index: int, joined_table: JoinedTable, partition: int):
        self.index = index
        self.prefix = bytes([index])
        self.table = joined_table.table
        self.inner = joined_table.type == "INNER"
        self.input = TopicPartition(self.table.topic, partition)
        key = self.table.key_column
        assert key is not None
        self.key = (joined(joined_table.prefix, key.name), key.type)
        self.values = [(joined(joined_table.prefix, c.name), c.name, c.type) for c in self.table.value_columns]
        self.decode = value_decoder(self.table)
        """A value as the table's stores keep it (``values.stored``): as a pull of the table reads it."""
        self.with_bytes = stored_bytes([c.type for c in self.table.value_columns])
        self.time_of = event_time_reader(self.table, self.decode)
        """A record's time, which orders it among the stream's (None: the record's timestamp)."""
        self.position_name = TABLE_OFFSET + str(index).encode()
        self.table_offset = 0
        """The next table offset the store reflects."""
        self.fetched_to = 0
        """The next offset to fetch; every record below it is in the store or ``pending``."""
        self.pending: list[TableRecord] = []
        """Records fetched and not applied yet (newer than every stream record so far), in offset order."""

    async def fetch(self, consumer: AIOKafkaConsumer) -> None:
        batches = await consumer.getmany(self.input, timeout_ms=FETCH_MS, max_records=10_000)
        records = batches.get(self.input, [])
        time_of = self.time_of
        if time_of is None:
            self.pending += [TableRecord(r.offset, r.timestamp, r.key, r.value) for r in records]
        else:  # its time may be in its value: decoded once, here, for ``apply`` too
            for r in records:
                row = self._decoded(r.value)
                self.pending.append(TableRecord(r.offset, time_of(r, row), r.key, r.value, row))
        last = records[-1].offset + 1 if records else 0
        # An empty fetch may still move past transaction markers.
        self.fetched_to = max(self.fetched_to, last, await consumer.position(self.input))

    @contextmanager
    def fetching(self, consumer: AIOKafkaConsumer) -> Iterator[None]:
        """The partition fetched while the body runs, paused otherwise: a consumer fetches its
        unpaused partitions in the background without end, one request every ``fetch_max_wait_ms``
        while they are quiet (40 a second for a task waiting on its stream's next batch)."""
        consumer.resume(self.input)
        try:
            yield
        finally:
            consumer.pause(self.input)

    async def catch_up(self, consumer: AIOKafkaConsumer, end: int) -> None:
        """Fetch up to ``end`` (the partition's last stable offset when the batch began);
        TableBehind when a fetch moves nothing for ``CATCH_UP_TIMEOUT_S``."""
        if self.fetched_to >= end:
            return
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        with self.fetching(consumer):
            while self.fetched_to < end:
                if time.monotonic() > deadline:
                    raise TableBehind(f"the table {self.table.name}'s partition {self.input.partition} was read to "
                                      f"{self.fetched_to} of {end} and moved no further in {CATCH_UP_TIMEOUT_S} s")
                before = self.fetched_to
                await self.fetch(consumer)
                if self.fetched_to > before:
                    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S

    def _decoded(self, value: bytes | None) -> list[Any] | None:
        """``value`` decoded; None for a tombstone, or one that does not decode."""
        try:
            return None if value is None else self.decode(value)
        except ValueError:
            return None

    def apply(self, record: TableRecord, overlay: dict[bytes, list[Any] | None], bad: list[BadRecord]) -> None:
        """One table record into ``overlay`` (a NULL value deletes its key's row; a value that
        does not decode changes nothing and goes to the processing log)."""
        if record.key is None:
            return
        if record.value is None:
            overlay[self.prefix + record.key] = None
            return
        try:
            overlay[self.prefix + record.key] = record.row if record.row is not None else self.decode(record.value)
        except ValueError as error:
            bad.append(BadRecord(record.offset, f"the table {self.table.name}'s {error}",
                                 record.value.decode(errors="replace")))

    def into(self, row: dict[str, Any], key: bytes, table_row: list[Any] | None) -> None:
        """The table's columns of the joined row (NULLs when the table has no row for the key)."""
        name, type_ = self.key
        row[name] = None if table_row is None else deserialize_key(key, type_)
        if table_row is not None and self.with_bytes is not None:
            table_row = self.with_bytes(table_row)
        for (column, _, _), value in zip(self.values, table_row or [None] * len(self.values), strict=True):
            row[column] = value


class JoinedValue:
    """A join query's result value from its joined row, as every join task computes it: the
    WHERE, then the SELECT list, serialized as the sink's value (the key item left out).

    A join stage whose rows another stage reads (the next stage of a multi-way join, or the
    aggregation of a GROUP BY over the join) writes every column of the joined row so far and
    its time instead, keyed by what the next stage is keyed by (``regroup``)."""

    def __init__(self, query: PersistentQuery, sink: DataSource):
        spec = query.plan.join
        assert spec is not None
        statement, tables = statement_query(query.statement, dict(query.types)), tuple(t.table for t in spec.tables)
        self.regroup: tuple[tuple[str, ast.Expr], ...] | None = None
        """The next stage's key columns over the joined row, which key each joined row (every
        column of it so far, and its time) in the next stage's topic; None for the result."""
        if statement.group_by:
            aggregation = join_aggregation(statement, spec.stream, tables)
            self.resolved = aggregation.resolved
            self.regroup = aggregation.keys
        else:
            self.resolved = resolve_join(statement, spec.stream, tables)
        self.where = self.resolved.where
        self.carried = spec.stream.kind == "TABLE" and spec.step + 1 < spec.steps
        """A chain of table joins' stage before the last: every column joined so far, as it is."""
        if spec.step + 1 < spec.steps and not self.carried:  # a stream's multi-way join's stage before the last:
            # keyed by the next one's expression
            self.regroup = ((REPARTITION_KEY, self.resolved.step_keys[spec.step + 1]),)
            self.where = None  # over every JOIN's columns: the last stage's
        self.value_names = [c.name for c in sink.value_columns]
        # The result's value columns by name (a GROUP BY's joined table keeps the left key among
        # them, keyed by the join key), else every item but the key.
        named = {name: i for i, (name, _) in enumerate(self.resolved.items)}
        self.value_items = ([named[n] for n in self.value_names] if all(n in named for n in self.value_names)
                            else [i for i in range(len(self.resolved.items)) if i != self.resolved.key_item])
        self.columns = [name for name in self.value_names if name != ROWTIME_COLUMN]
        self.key_type = sink.key_columns[0].type if self.regroup is not None else None
        self.sink = sink

    def keyed(self, row: dict[str, Any], key: bytes, time_ms: int, offset: int,
              bad: list[BadRecord]) -> tuple[bytes, bytes] | None:
        """The record the join writes for a joined row: keyed by the join key, or for another
        stage by its key columns (a NULL one logged, as a re-key's); None when the WHERE drops
        it or it cannot be computed."""
        if self.regroup is None:
            value = self(row, offset, bad)
            return None if value is None else (key, value)
        try:
            if self.where is not None and evaluate(self.where, row) is not True:
                return None
            group = [evaluate(expr, row) for _, expr in self.regroup]
        except (ArithmeticError, TypeError, ValueError) as error:
            bad.append(BadRecord(offset, f"the joined row cannot be computed: {error}", None))
            return None
        if any(v is None for v in group):
            shown = ", ".join(self.resolved.shown(expr) for _, expr in self.regroup)
            bad.append(BadRecord(offset, f"the new key ({shown}) is NULL", None))
            return None
        assert self.key_type is not None
        try:
            new_key = serialize_key(group[0] if len(group) == 1 else dict(zip((n for n, _ in self.regroup), group,
                                                                               strict=True)), self.key_type)
            return new_key, serialize_value(self.value_names, [*(row.get(c) for c in self.columns), time_ms], "JSON")
        except (MillpondError, ValueError, ArithmeticError, TypeError, struct.error) as error:
            bad.append(BadRecord(offset, f"the joined row cannot be written by its new key: {error}", None))
            return None

    def __call__(self, row: dict[str, Any], offset: int, bad: list[BadRecord]) -> bytes | None:
        """The value, or None when the WHERE drops the row or it cannot be computed (then
        logged in ``bad`` with ``offset``)."""
        if self.carried:  # the WHERE and the SELECT list are the last stage's
            return serialize_value(self.value_names, [row.get(name) for name in self.value_names], "JSON")
        where, items = self.resolved.where, self.resolved.items
        try:
            if where is not None and evaluate(where, row) is not True:
                return None
            result = [evaluate(expr, row) for _, expr in items]
        except (ArithmeticError, TypeError, ValueError) as error:
            bad.append(BadRecord(offset, f"the joined row cannot be computed: {error}", None))
            return None
        try:
            return serialize_value(self.value_names, [result[i] for i in self.value_items],
                                   self.sink.value_format, self.sink.value_delimiter)
        except (MillpondError, ValueError, ArithmeticError, TypeError) as error:
            bad.append(BadRecord(offset, f"the joined row cannot be written as {self.sink.value_format}: {error}", None))
            return None


class JoinTask(Task[JoinSlice]):
    """Joins one partition of a stream with the same partition of each table (see the module)."""

    def __init__(self, settings: WorkerSettings, query: PersistentQuery, source: DataSource,
                 sink: DataSource, partition: int, stage: str = ""):
        super().__init__(settings, query, source, sink, partition, stage)
        spec = query.plan.join
        assert spec is not None
        self.output = JoinedValue(query, sink)
        # A multi-way join's stage joins its own tables (of its ``step``) with the joined rows so far.
        self.sides = [TableSide(i, t, partition)
                      for i, t in enumerate(spec.stage_tables())]
        self.stream_names = (ResolvedJoin.names(spec.stream_prefix, spec.stream) if spec.step == 0
                             else [c.name for c in join_input(spec, source)])
        # The stream's ROWTIME is the record's time, unless the stage before carries it (after a
        # stream-stream join: the left record's, where the row's time is the later record's).
        rowtime = joined(spec.stream_prefix, ROWTIME)
        self.rowtime = None if ROWTIME in spec.stream.schema or rowtime in self.stream_names else rowtime
        self.consumer: AIOKafkaConsumer | None = None
        self._table_ends: AIOKafkaConsumer | None = None
        """Asks the tables' end offsets at each commit (on ``consumer`` each waited for its fetch)."""

    async def start(self) -> None:
        """Open the store, fence any older owner and bring the store to the table positions the
        committed stream offset was joined against (see the module)."""
        # A join stage before a GROUP BY's (which keeps the query's store) keeps its own.
        owner = f"{self.query.query_id}-{self.stage}" if self.stage else self.query.query_id
        self.store = await opened(store_path(self.settings, owner, self.partition))
        await rebuilt_if_old(self.store, [INPUT_OFFSET, *(side.position_name for side in self.sides)])
        self.consumer = AIOKafkaConsumer(**self.settings.kafka.client_args(), isolation_level="read_committed",
                                         enable_auto_commit=False, fetch_max_wait_ms=25,
                                         consumer_timeout_ms=TABLE_IDLE_WAKE_MS, auto_offset_reset="earliest")
        self._table_ends = self.settings.kafka.end_offsets_consumer()
        await gather_or_cancel(self._open_producer(), start_client(self.consumer), start_client(self._table_ends))
        self.consumer.assign([side.input for side in self.sides])
        self.consumer.pause(*(side.input for side in self.sides))  # fetched only to catch up (TableSide.fetching)
        await self._past_retention()
        # Fenced: the committed position is final.
        committed = (await committed_positions(self.settings.kafka, self.group, [self.input])).get(self.input)
        stored = self.store.position(INPUT_OFFSET)
        for side in self.sides:
            side.table_offset = side.fetched_to = self.store.position(side.position_name) or 0
            self.consumer.seek(side.input, side.table_offset)
        if committed is not None and (stored is None or stored < committed[0]):
            targets = committed_table_offsets(committed[1]) or [s.table_offset for s in self.sides]
            started = time.monotonic()
            self.state = RESTORING
            self.records_to_restore = sum(max(t - s.table_offset, 0) for s, t in zip(self.sides, targets, strict=True))
            overlay: dict[bytes, list[Any] | None] = {}
            for side, target in zip(self.sides, targets, strict=True):
                with side.fetching(self.consumer):
                    while side.fetched_to < target:
                        await side.fetch(self.consumer)
                applied = [r for r in side.pending if r.offset < target]
                side.pending = side.pending[len(applied):]
                for record in applied:
                    side.apply(record, overlay, [])
                self.restored_records += len(applied)
            self._write(overlay, committed[0], targets)
            log.info("join tables restored", extra={"query": self.query.query_id, "partition": self.partition,
                                                    "restored": self.restored_records, "table_offsets": targets,
                                                    "seconds": round(time.monotonic() - started, 3)})
        self.next_input_offset = self.start_input_offset = await self._starting_offset()
        log.info("task started", extra={"query": self.query.query_id, "partition": self.partition,
                                        "input_offset": self.next_input_offset,
                                        "table_offsets": [s.table_offset for s in self.sides]})

    async def _past_retention(self) -> None:
        """A store behind a table topic's retention is emptied (``wiped_if_behind``): the start
        then builds it again from the topics, as on a worker without it."""
        assert self.store is not None and self.consumer is not None
        if stored := {side.input: p for side in self.sides if (p := self.store.position(side.position_name))}:
            await wiped_if_behind(self.store, self.consumer, stored)

    def _joined_row(self, key: bytes, time_ms: int, values: list[Any],
                    table_rows: list[list[Any] | None]) -> dict[str, Any]:
        row = dict(zip(self.stream_names, values, strict=True))
        if self.rowtime is not None:
            row[self.rowtime] = time_ms
        for side, table_row in zip(self.sides, table_rows, strict=True):
            side.into(row, key, table_row)
        return row

    async def commit(self, batch: JoinSlice) -> bool:
        """Join one micro-batch slice with the tables, exactly once; False when it was applied before."""
        assert self.store is not None and self.producer is not None and self.consumer is not None
        assert self._table_ends is not None
        if self.applied(batch):
            return False
        ends = await self._table_ends.end_offsets([side.input for side in self.sides])
        for side in self.sides:
            await side.catch_up(self.consumer, ends[side.input])
        overlay: dict[bytes, list[Any] | None] = {}
        bad, table_bad = list(batch.bad), [list[BadRecord]() for _ in self.sides]
        results: list[tuple[bytes, bytes, int]] = []
        applied = [0] * len(self.sides)
        store = self.store
        for offset, key, time_ms, values in batch.records:
            table_rows: list[list[Any] | None] = []
            for side in self.sides:
                pending, done = side.pending, applied[side.index]
                while done < len(pending) and pending[done].timestamp <= time_ms:
                    side.apply(pending[done], overlay, table_bad[side.index])
                    done += 1
                applied[side.index] = done
                stored = side.prefix + key
                table_rows.append(overlay[stored] if stored in overlay else store.get(stored))
            if any(r is None and side.inner for r, side in zip(table_rows, self.sides, strict=True)):
                continue
            written = self.output.keyed(self._joined_row(key, time_ms, values, table_rows), key, time_ms, offset, bad)
            if written is not None:
                results.append((*written, time_ms))
        table_offsets = [side.pending[done].offset if done < len(side.pending) else side.fetched_to
                         for side, done in zip(self.sides, applied, strict=True)]
        async with self._transaction():
            # A GROUP BY's joined rows carry their time in a column: stamped now, the joined
            # topic's retention cannot delete an old record's row before the aggregation reads it.
            stamped = self.output.regroup is None
            for key, value, time_ms in results:
                await self._send(self.sink.topic, value, key, partition_for(key, self.sink.partitions),
                                 timestamp_ms=time_ms if stamped else None)
            await self._send_bad(sorted(bad, key=lambda b: b.offset))
            for side in self.sides:
                await self._send_bad(table_bad[side.index], side.input)
            await self._commit_input(batch.last_offset + 1, {TABLE_OFFSETS: table_offsets})
        self._write(overlay, batch.last_offset + 1, table_offsets)
        for side, done in zip(self.sides, applied, strict=True):
            del side.pending[:done]
        self.next_input_offset = batch.last_offset + 1
        return True

    def _write(self, overlay: dict[bytes, list[Any] | None], input_offset: int, table_offsets: list[int]) -> None:
        """The tables' rows and every position, in one RocksDB write batch."""
        assert self.store is not None
        rows = {key: encode_state(row) for key, row in overlay.items() if row is not None}
        deleted = [key for key, row in overlay.items() if row is None]
        positions = {INPUT_OFFSET: input_offset, VALUES_STORED: 1,
                     **{side.position_name: offset for side, offset in zip(self.sides, table_offsets, strict=True)}}
        self.store.write(rows, positions, deleted)
        for side, offset in zip(self.sides, table_offsets, strict=True):
            side.table_offset = offset

    async def _close(self) -> None:
        try:
            await super()._close()
        finally:
            # One step for both: a cancel while it waits leaves neither open (the step goes on).
            stops = [consumer.stop() for consumer in (self.consumer, self._table_ends) if consumer is not None]
            if stops:
                await bounded(asyncio.gather(*stops), CONSUMER_STOP_TIMEOUT_S, "stop the table consumers",
                              {"query": self.query.query_id, "partition": self.partition})
