"""A stream-table join's task: one partition of the stream joined with the same partition
of the table, as Kafka Streams' ``KStream#join(KTable)`` and ksqlDB's stream-table joins.

The table side is state: the task keeps the table partition's rows in a RocksDB store, read
from the table's own topic (its changelog, as Kafka Streams' source tables), through a
``read_committed`` consumer. Each stream record joins the table's row **as of the record**:
before a batch is joined, the table partition is fetched up to its end, and its records
are applied in offset order, each one before every stream record with a later timestamp,
as Kafka Streams picks, of two partitions, the one whose next record is older (a table
record and a stream record of the same time: the table's first). Table records newer than
the batch's stream records wait for later batches.

Exactly once: a batch's results, its processing-log records and its stream offset go in one
Kafka transaction, and the offset's commit metadata says how far the table was applied for
it. Only after the commit do the table rows and both positions change, in one RocksDB write
batch. A crash between the two leaves the store behind the committed offset; ``start``
then applies the table's records up to the committed table position, so the next batch
joins against exactly the table the committed output saw. A worker without the store (a
moved partition) rebuilds it from the table's topic the same way.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from millpond.services.worker.state.store import INPUT_OFFSET, PartitionStore, encode_state
from millpond.services.worker.task import BadRecord, BatchSlice, Task, store_path
from millpond.shared.catalog.queries import PersistentQuery
from millpond.shared.catalog.sources import DataSource
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.admin import committed_positions
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.kafka.serde import deserialize_key, deserialize_value, serialize_value
from millpond.shared.sql.expressions import evaluate
from millpond.shared.sql.joins import ROWTIME, ResolvedJoin, joined, resolve_join
from millpond.shared.sql.parser import statement_query
from millpond.shared.task_status import RESTORING
from millpond.shared.teardown import bounded, gather_or_cancel

log = logging.getLogger(__name__)
TABLE_OFFSET = b"table_offset"
"""The next offset of the table's topic the store reflects."""
FETCH_MS = 50
"""The longest one fetch of the table waits for records."""
CATCH_UP_TIMEOUT_S = 60.0
"""How long a batch waits for the table's partition to be read up to its end."""
CONSUMER_STOP_TIMEOUT_S = 10.0


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


class JoinTask(Task[JoinSlice]):
    """Joins one partition of a stream with the same partition of a table (see the module)."""

    def __init__(self, settings: WorkerSettings, query: PersistentQuery, source: DataSource,
                 sink: DataSource, partition: int, stage: str = ""):
        super().__init__(settings, query, source, sink, partition, stage)
        spec = query.plan.join
        assert spec is not None
        self.table: DataSource = spec.table
        self.inner = spec.type == "INNER"
        self.resolved: ResolvedJoin = resolve_join(statement_query(query.statement), spec.stream, spec.table)
        self.table_input = TopicPartition(spec.table.topic, partition)
        self.stream_names = ResolvedJoin.names(spec.stream_prefix, spec.stream)
        self.rowtime = None if ROWTIME in spec.stream.schema else joined(spec.stream_prefix, ROWTIME)
        key = spec.table.key_column
        assert key is not None
        self.table_key = (joined(spec.table_prefix, key.name), key.type)
        self.table_values = [(joined(spec.table_prefix, c.name), c.name, c.type) for c in spec.table.value_columns]
        self.value_items = [i for i in range(len(self.resolved.items)) if i != self.resolved.key_item]
        self.value_names = [c.name for c in sink.value_columns]
        self.consumer: AIOKafkaConsumer | None = None
        self.table_offset = 0
        """The next table offset the store reflects."""
        self.fetched_to = 0
        """The next table offset to fetch; every record below it is in the store or ``pending``."""
        self.pending: list[TableRecord] = []
        """Table records fetched and not applied yet (newer than every stream record so far), in offset order."""

    async def start(self) -> None:
        """Open the store, fence any older owner and bring the store to the table position the
        committed stream offset was joined against (see the module)."""
        self.store = PartitionStore(store_path(self.settings, self.query.query_id, self.partition))
        self.consumer = AIOKafkaConsumer(**self.settings.kafka.client_args(), isolation_level="read_committed",
                                         enable_auto_commit=False, fetch_max_wait_ms=25,
                                         auto_offset_reset="earliest")
        await gather_or_cancel(self._open_producer(), self.consumer.start())
        self.consumer.assign([self.table_input])
        # Fenced: the committed position is final.
        committed = (await committed_positions(self.settings.kafka, self.group, [self.input])).get(self.input)
        stored = self.store.position(INPUT_OFFSET)
        self.table_offset = self.fetched_to = self.store.position(TABLE_OFFSET) or 0
        self.consumer.seek(self.table_input, self.table_offset)
        if committed is not None and (stored is None or stored < committed[0]):
            target = int(committed[1]) if committed[1] else self.table_offset
            self.state, self.records_to_restore = RESTORING, max(target - self.table_offset, 0)
            started = time.monotonic()
            while self.fetched_to < target:
                await self._fetch()
            applied = [r for r in self.pending if r.offset < target]
            self.pending = self.pending[len(applied):]
            overlay: dict[bytes, list[Any] | None] = {}
            for record in applied:
                self._apply(record, overlay, [])
            self._write(overlay, committed[0], target)
            self.restored_records = len(applied)
            log.info("join table restored", extra={"query": self.query.query_id, "partition": self.partition,
                                                   "restored": len(applied), "table_offset": target,
                                                   "seconds": round(time.monotonic() - started, 3)})
        self.next_input_offset = self.start_input_offset = await self._starting_offset()
        log.info("task started", extra={"query": self.query.query_id, "partition": self.partition,
                                        "input_offset": self.next_input_offset, "table_offset": self.table_offset})

    async def _fetch(self) -> None:
        assert self.consumer is not None
        batches = await self.consumer.getmany(self.table_input, timeout_ms=FETCH_MS, max_records=10_000)
        records = batches.get(self.table_input, [])
        self.pending += [TableRecord(r.offset, r.timestamp, r.key, r.value) for r in records]
        last = records[-1].offset + 1 if records else 0
        # An empty fetch may still move past transaction markers.
        self.fetched_to = max(self.fetched_to, last, await self.consumer.position(self.table_input))

    async def _catch_up(self) -> None:
        """Fetch the table's partition up to its end now (its last stable offset)."""
        assert self.consumer is not None
        end = (await self.consumer.end_offsets([self.table_input]))[self.table_input]
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while self.fetched_to < end:
            if time.monotonic() > deadline:
                raise TableBehind(f"the table {self.table.name}'s partition {self.partition} was read to "
                                  f"{self.fetched_to} of {end} in {CATCH_UP_TIMEOUT_S} s")
            await self._fetch()

    def _apply(self, record: TableRecord, overlay: dict[bytes, list[Any] | None], bad: list[BadRecord]) -> None:
        """One table record into ``overlay`` (a NULL value deletes its key's row; a value that
        does not decode changes nothing and goes to the processing log)."""
        if record.key is None:
            return
        if record.value is None:
            overlay[record.key] = None
            return
        try:
            row = deserialize_value([(n, t) for _, n, t in self.table_values], record.value,
                                    self.table.value_format, self.table.value_delimiter)
        except ValueError as error:
            bad.append(BadRecord(record.offset, f"table value is not {self.table.value_format} of the declared "
                                 f"columns and types: {error}", record.value.decode(errors="replace")))
            return
        overlay[record.key] = [row[n] for _, n, _ in self.table_values]

    def _joined_row(self, key: bytes, time_ms: int, values: list[Any], table_row: list[Any] | None) -> dict[str, Any]:
        row = dict(zip(self.stream_names, values, strict=True))
        if self.rowtime is not None:
            row[self.rowtime] = time_ms
        name, type_ = self.table_key
        row[name] = None if table_row is None else deserialize_key(key, type_)
        for (column, _, _), value in zip(self.table_values, table_row or [None] * len(self.table_values), strict=True):
            row[column] = value
        return row

    async def commit(self, batch: JoinSlice) -> bool:
        """Join one micro-batch slice with the table, exactly once; False when it was applied before."""
        assert self.store is not None and self.producer is not None
        if self.applied(batch):
            return False
        await self._catch_up()
        overlay: dict[bytes, list[Any] | None] = {}
        bad, table_bad = list(batch.bad), list[BadRecord]()
        results: list[tuple[bytes, bytes, int]] = []
        pending, applied = self.pending, 0
        where, items = self.resolved.where, self.resolved.items
        for offset, key, time_ms, values in batch.records:
            while applied < len(pending) and pending[applied].timestamp <= time_ms:
                self._apply(pending[applied], overlay, table_bad)
                applied += 1
            table_row = overlay[key] if key in overlay else self.store.get(key)
            if table_row is None and self.inner:
                continue
            row = self._joined_row(key, time_ms, values, table_row)
            try:
                if where is not None and evaluate(where, row) is not True:
                    continue
                result = [evaluate(expr, row) for _, expr in items]
            except (ArithmeticError, TypeError, ValueError) as error:
                bad.append(BadRecord(offset, f"the joined row cannot be computed: {error}", None))
                continue
            value = serialize_value(self.value_names, [result[i] for i in self.value_items],
                                    self.sink.value_format, self.sink.value_delimiter)
            results.append((key, value, time_ms))
        table_offset = pending[applied].offset if applied < len(pending) else self.fetched_to
        async with self._transaction():
            for key, value, time_ms in results:
                await self._send(self.sink.topic, value, key, partition_for(key, self.sink.partitions),
                                 timestamp_ms=time_ms)
            await self._send_bad(sorted(bad, key=lambda b: b.offset))
            await self._send_bad(table_bad, self.table_input)
            await self.producer.send_offsets_to_transaction(
                {self.input: OffsetAndMetadata(batch.last_offset + 1, str(table_offset))}, self.group)
        self._write(overlay, batch.last_offset + 1, table_offset)
        del self.pending[:applied]
        self.next_input_offset = batch.last_offset + 1
        return True

    def _write(self, overlay: dict[bytes, list[Any] | None], input_offset: int, table_offset: int) -> None:
        """The table rows and both positions, in one RocksDB write batch."""
        assert self.store is not None
        rows = {key: encode_state(row) for key, row in overlay.items() if row is not None}
        deleted = [key for key, row in overlay.items() if row is None]
        self.store.write(rows, {INPUT_OFFSET: input_offset, TABLE_OFFSET: table_offset}, deleted)
        self.table_offset = table_offset

    async def _close(self) -> None:
        try:
            await super()._close()
        finally:
            if self.consumer is not None:
                await bounded(self.consumer.stop(), CONSUMER_STOP_TIMEOUT_S, "stop the table consumer",
                              {"query": self.query.query_id, "partition": self.partition})
