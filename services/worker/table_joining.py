"""A table-table join's tasks, as Kafka Streams' ``KTable#join(KTable)`` and ksqlDB's
primary-key table-table joins (INNER, LEFT, RIGHT, FULL OUTER; several tables on one key).

Both tables' changes must reach one task in one order, so the join runs in stages
(``millpond.shared.catalog.topology``): each table's ``JoinSideTask`` copies partition ``p``
of the table, tombstones included, into partition ``p`` of the query's compacted joined
topic, the key prefixed by the side's place in the join (one byte); the ``TableJoinTask``
of partition ``p`` reads that partition in offset order. For each record it replaces (or
deletes) that side's row of the key in its RocksDB store, joins the key's rows of every side
and writes the result to the sink topic: the joined row, or a tombstone when the join type
(or the WHERE) leaves no row for the key. The result stage then materializes the sink topic
for pulls, as for any CREATE TABLE AS SELECT over a table.

Exactly once: a batch's results, its processing-log records and its input offset go in one
Kafka transaction; the store (rows and input offset) is written after the commit, in one
RocksDB write batch. The joined topic is the store's changelog (same keys, the latest
record of each is the row): a task whose store is behind its committed offset (a crash
between the two, or a partition new to this worker) replays it up to that offset before
it joins again, so the next batch sees exactly the rows the committed output saw.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer

from millpond.services.worker.joining import VALUES_STORED, JoinedValue, rebuilt_if_old
from millpond.services.worker.state.store import INPUT_OFFSET, WRITTEN_MS, encode_state, open_kept
from millpond.services.worker.task import KEPT_STORE_MAX_AGE_MS, BadRecord, BatchSlice, Task, store_path
from millpond.shared.catalog.queries import PersistentQuery
from millpond.shared.catalog.sources import DataSource
from millpond.shared.catalog.topology import JOIN_SIDE_STAGE, chained_rows, chained_stream
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.connection import start_client
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.kafka.serde import base64_bytes, deserialize_key, serialize_key
from millpond.shared.kafka.values import stored_bytes, value_decoder
from millpond.shared.sql.ast import SqlType
from millpond.shared.sql.joins import joined
from millpond.shared.task_status import RESTORING, now_ms
from millpond.shared.teardown import bounded, run_to_end

log = logging.getLogger(__name__)
FETCH_MS = 50
"""The longest one fetch of a replay waits for records."""
REPLAY_STALL_S = 60.0
"""How long a replay waits for a fetch that moves it."""
CONSUMER_STOP_TIMEOUT_S = 10.0
CHAINED: dict[str, Callable[[bool, bool], bool]] = {
    "INNER": lambda before, there: before and there, "LEFT": lambda before, _: before,
    "RIGHT": lambda _, there: there, "FULL": lambda before, there: before or there,
}
"""Whether a key has a result row, from whether it has one before a JOIN and the joined table has a row."""
INDEX = b"\x02"
"""A foreign-key join store's index entries: ``INDEX``, the foreign key's length (4 bytes),
the foreign key, then a left key whose row has it."""
INDEX_PAGE = 1_000
REPLAY_WRITE_ROWS = 10_000
"""How many replayed rows a table join's store takes in one write batch."""


class ReplayStalled(MillpondError):
    """The joined topic could not be read up to the committed offset in time."""


def rekeyed(join_key: bytes, own_key: bytes | None) -> bytes:
    """A re-keyed stream record's key in the joined topic (after its side byte): the join
    column's key bytes, their length first (4 bytes), then the record's own key (its KEY
    column, 1 and its bytes), or nothing when it has none."""
    return len(join_key).to_bytes(4, "big") + join_key + (b"" if own_key is None else b"\1" + own_key)


def split_rekeyed(key: bytes) -> tuple[bytes, bytes | None]:
    """The join key and the record's own key (None: none) of ``rekeyed``'s bytes."""
    length = int.from_bytes(key[:4], "big")
    own = key[4 + length:]
    return key[4:4 + length], own[1:] if own else None


@dataclass
class KeyedSlice(BatchSlice):
    """A partition's records as they are, in offset order."""

    records: list[tuple[int, bytes, bytes | None, int]] = field(default_factory=list)
    """(offset, key, value or None for a tombstone, event time)."""


class JoinSideTask(Task[KeyedSlice]):
    """Copies one partition of one joined table into the same partition of the joined topic,
    its keys prefixed by the table's place in the join, exactly once (see the module)."""

    def __init__(self, settings: WorkerSettings, query: PersistentQuery, source: DataSource,
                 sink: DataSource, partition: int, stage: str = ""):
        super().__init__(settings, query, source, sink, partition, stage)
        self.side = bytes([int(stage.removeprefix(JOIN_SIDE_STAGE).rsplit("-", 1)[-1])])  # side-<n>, side-<step>-<n>
        spec = query.plan.join
        assert spec is not None
        # A foreign-key join's right table goes to every join task: a foreign key may name any of its keys.
        broadcast = self.side != b"\0" and spec.stage_tables()[0].foreign_key is not None
        self.targets = range(sink.partitions) if broadcast else (partition,)
        self.rekeyed = query.plan.key_expression is not None
        """A stream joined on another column: its records' keys are ``rekeyed``'s."""
        self.by_key = query.plan.repartition
        """Each record goes to its join key's partition (either stream of the join is re-keyed:
        the other's own partitioner may not be the Java client's)."""

    async def commit(self, batch: KeyedSlice) -> bool:
        """Copy one micro-batch slice exactly once; False when it was copied before."""
        assert self.producer is not None
        if self.applied(batch):
            return False
        async with self._transaction():
            for _, key, value, timestamp in batch.records:
                join_key = split_rekeyed(key)[0] if self.rekeyed else key
                targets = (partition_for(join_key, self.sink.partitions),) if self.by_key else self.targets
                for target in targets:
                    await self._send(self.sink.topic, value, self.side + key, target, timestamp_ms=timestamp)
            await self._send_bad(batch.bad)
            await self._commit_input(batch.last_offset + 1)
        self.next_input_offset = batch.last_offset + 1
        return True


@dataclass(frozen=True)
class Side:
    """One table of the join as its task decodes and names it."""

    table: DataSource
    type: str
    """How it joins what comes before it: INNER, LEFT, RIGHT or FULL (the first table: FROM)."""
    key: str | None
    """Its key column's name in the joined row (None: a stream without one)."""
    key_type: SqlType | None
    """Its key column's type (a foreign-key join's sides have different keys)."""
    names: tuple[str, ...]
    """Its value columns' names in the joined row."""
    decode: Callable[[bytes], list[Any]] = field(init=False)
    """Its records' values as its stores keep them (``values.stored``): as a pull of it reads them."""
    with_bytes: Callable[[list[Any]], list[Any]] | None = field(init=False)
    """Its stored values as the joined row has them (``values.stored_bytes``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "decode", value_decoder(self.table))
        object.__setattr__(self, "with_bytes", stored_bytes([c.type for c in self.table.value_columns]))


class GatheredJoinTask(Task[KeyedSlice]):
    """What the join stages of table-table and stream-stream joins share: the sides as the
    joined row names them, the replay of the joined topic, and the result's value."""

    def __init__(self, settings: WorkerSettings, query: PersistentQuery, source: DataSource,
                 sink: DataSource, partition: int, stage: str = ""):
        super().__init__(settings, query, source, sink, partition, stage)
        spec = query.plan.join
        assert spec is not None
        tables = spec.stage_tables()  # tables a chain joins later have stages of their own
        self.output = JoinedValue(query, sink)
        self.sides = []
        joining = [(t.table, t.type, t.prefix) for t in tables]
        if spec.step > 0:  # a later stage: the rows joined so far first, named as the joined row names them
            rows = (chained_rows(query.query_id, spec, spec.step - 1, settings.service_id, source.partitions)
                    if spec.stream.kind == "TABLE" else chained_stream(query.query_id, spec, spec.step,
                                                                        settings.service_id))
            self.sides.append(Side(rows, "FROM", None, None, tuple(c.name for c in rows.value_columns)))
        else:
            joining.insert(0, (spec.stream, "FROM", spec.stream_prefix))
        for side, type_, prefix in joining:
            key = side.key_column
            self.sides.append(Side(side, type_, None if key is None else joined(prefix, key.name),
                                   None if key is None else key.type,
                                   tuple(joined(prefix, c.name) for c in side.value_columns)))
        result_key = next(c for c in query.plan.columns if c.key)
        self.key_type = result_key.type
        """The result's key type: the join key's."""

    async def _replay(self, start: int | None, end: int, apply: Callable[[bytes, bytes | None, int, int], object]) -> None:
        """``apply`` (key, value, timestamp, offset) to each record of the joined topic from
        ``start`` (None: its beginning) below ``end``, without output: what the committed
        batches already joined."""
        started = time.monotonic()
        self.state = RESTORING
        consumer = AIOKafkaConsumer(**self.settings.kafka.client_args(), isolation_level="read_committed",
                                    enable_auto_commit=False, fetch_max_wait_ms=25, auto_offset_reset="earliest")
        try:
            await start_client(consumer)
            consumer.assign([self.input])
            if start is None:
                await consumer.seek_to_beginning(self.input)
            else:
                consumer.seek(self.input, start)
            first = await consumer.position(self.input)
            self.records_to_restore = max(end - first, 0)
            position, deadline = first, time.monotonic() + REPLAY_STALL_S
            while position < end:
                if time.monotonic() > deadline:
                    raise ReplayStalled(f"the joined topic {self.input.topic}'s partition {self.partition} was read "
                                        f"to {position} of {end} and moved no further in {REPLAY_STALL_S} s")
                batches = await consumer.getmany(self.input, timeout_ms=FETCH_MS, max_records=10_000)
                for record in batches.get(self.input, []):
                    if record.offset < end and record.key:
                        apply(record.key, record.value, record.timestamp, record.offset)
                moved = await consumer.position(self.input)
                if moved > position:
                    position, deadline = moved, time.monotonic() + REPLAY_STALL_S
                    self.restored_records = min(position - first, self.records_to_restore)
        finally:
            await run_to_end(bounded(consumer.stop(), CONSUMER_STOP_TIMEOUT_S, "stop the replay consumer",
                                     {"query": self.query.query_id, "partition": self.partition}))
        self.restored_records = self.records_to_restore
        log.info("joined topic replayed", extra={"query": self.query.query_id, "partition": self.partition,
                                                 "records": self.records_to_restore, "input_offset": end,
                                                 "seconds": round(time.monotonic() - started, 3)})

    def _decode(self, index: int, key: bytes | None, value: bytes, offset: int,
                bad: list[BadRecord] | None) -> tuple[Any, list[Any]] | None:
        """The own key's value and the value columns of a record of side ``index`` with its own
        ``key`` (None: a stream record without one); None (and a processing-log entry in
        ``bad``, when given) for a key or a value that does not decode."""
        side = self.sides[index]
        try:
            key_value = None if key is None or side.key_type is None else deserialize_key(key, side.key_type)
        except (ValueError, struct.error) as error:
            if bad is not None:
                bad.append(BadRecord(offset, f"{side.table.name}'s key is not KAFKA {side.key_type}: {error}",
                                     value.decode(errors="replace")))
            return None
        try:
            return key_value, side.decode(value)
        except ValueError as error:
            if bad is not None:
                bad.append(BadRecord(offset, f"{side.table.name}'s {error}", value.decode(errors="replace")))
            return None

    def _value(self, keys: list[Any], rows: list[list[Any] | None], offset: int, bad: list[BadRecord],
               extra: dict[str, Any] | None = None) -> bytes | None:
        """The result's value from each side's key and row (None: the side has none; ``extra``:
        more columns of the joined row), as ``JoinedValue`` gives it."""
        return self.output(self._joined_row(keys, rows, extra), offset, bad)

    def _joined_row(self, keys: list[Any], rows: list[list[Any] | None],
                    extra: dict[str, Any] | None = None) -> dict[str, Any]:
        joined_row: dict[str, Any] = dict(extra or {})
        for side, key, row in zip(self.sides, keys, rows, strict=True):
            if side.key is not None:
                joined_row[side.key] = None if row is None else key
            if row is not None and side.with_bytes is not None:
                row = side.with_bytes(row)
            for name, value in zip(side.names, row or [None] * len(side.names), strict=True):
                joined_row[name] = value
        return joined_row


class TableJoinTask(GatheredJoinTask):
    """Joins partition ``p`` of every table, read from the joined topic (see the module)."""

    async def start(self) -> None:
        """Open the store, fence any older owner and bring the store up to the committed offset."""
        path = store_path(self.settings, f"{self.query.query_id}-{self.stage}", self.partition)
        self.store, dropped = open_kept(path, KEPT_STORE_MAX_AGE_MS, now_ms())
        if dropped:  # it could have missed a delete the joined topic no longer holds
            log.warning("join store older than the joined topic keeps tombstones; rebuilding it from the start",
                        extra={"query": self.query.query_id, "partition": self.partition})
        await rebuilt_if_old(self.store, [INPUT_OFFSET])
        await self._open_producer()
        committed = await self._committed_input_offset()  # fenced: it is final
        stored = self.store.position(INPUT_OFFSET)
        if committed is not None and (stored is None or stored < committed):
            overlay: dict[bytes, list[Any] | None] = {}

            def replayed(key: bytes, value: bytes | None, _: int, offset: int) -> None:
                self._apply(key, value, overlay, None)
                if len(overlay) >= REPLAY_WRITE_ROWS:  # a long replay is kept as it goes
                    self._write(overlay, offset + 1)
                    overlay.clear()

            await self._replay(stored, committed, replayed)
            self._write(overlay, committed)
        # Without a committed offset (expired), the store's own position: it is written after each commit.
        self.next_input_offset = self.start_input_offset = committed if committed is not None else stored
        log.info("task started", extra={"query": self.query.query_id, "partition": self.partition,
                                        "stage": self.stage, "input_offset": self.next_input_offset})

    def _apply(self, key: bytes, value: bytes | None, overlay: dict[bytes, list[Any] | None],
               bad: tuple[list[BadRecord], int] | None) -> list[bytes]:
        """One joined-topic record into ``overlay``: the side's row of the key, replaced or
        deleted. A value that does not decode changes nothing (and goes to ``bad``'s list
        with its offset, when given). The result keys to join again."""
        if key[0] >= len(self.sides):
            return [key[1:]]
        if value is None:
            overlay[key] = None
            return [key[1:]]
        decoded = self._decode(key[0], key[1:], value, bad[1] if bad else 0, bad[0] if bad else None)
        if decoded is not None:
            overlay[key] = decoded[1]
        return [key[1:]]

    def _row(self, key: bytes, overlay: dict[bytes, list[Any] | None]) -> list[Any] | None:
        """A stored row (or index entry) as this batch left it."""
        assert self.store is not None
        return overlay[key] if key in overlay else self.store.get(key)

    def _result(self, key: bytes, overlay: dict[bytes, list[Any] | None], offset: int,
                bad: list[BadRecord]) -> bytes | None:
        """The key's joined row as the sink's value, or None when the join has no row for it."""
        rows = [self._row(bytes([index]) + key, overlay) for index in range(len(self.sides))]
        present = rows[0] is not None
        for side, row in zip(self.sides[1:], rows[1:], strict=True):
            present = CHAINED[side.type](present, row is not None)
        if not present:
            return None
        return self._value([deserialize_key(key, self.key_type)] * len(rows), rows, offset, bad)

    async def commit(self, batch: KeyedSlice) -> bool:
        """Join one micro-batch slice exactly once; False when it was joined before."""
        assert self.producer is not None
        if self.applied(batch):
            return False
        overlay: dict[bytes, list[Any] | None] = {}
        bad = list(batch.bad)
        results: dict[bytes, tuple[bytes | None, int]] = {}
        for offset, key, value, timestamp in batch.records:
            if not key:
                continue
            for changed in self._apply(key, value, overlay, (bad, offset)):
                results.pop(changed, None)  # the key's latest result goes last, as it was last changed
                results[changed] = (self._result(changed, overlay, offset, bad), timestamp)
        async with self._transaction():
            for key, (result, timestamp) in results.items():
                # The rows of a chain's stage before the last stay in this partition, the first
                # table's (the next stage's tables are co-partitioned with it, whatever their
                # producers' partitioner); the result goes to its key's partition, as pulls route.
                target = self.partition if self.output.carried else partition_for(key, self.sink.partitions)
                await self._send(self.sink.topic, result, key, target, timestamp_ms=timestamp)
            await self._send_bad(sorted(bad, key=lambda b: b.offset))
            await self._commit_input(batch.last_offset + 1)
        self._write(overlay, batch.last_offset + 1)
        self.next_input_offset = batch.last_offset + 1
        return True

    def _write(self, overlay: dict[bytes, list[Any] | None], input_offset: int) -> None:
        """The sides' rows and the input offset, in one RocksDB write batch."""
        assert self.store is not None
        rows = {key: encode_state(row) for key, row in overlay.items() if row is not None}
        self.store.write(rows, {INPUT_OFFSET: input_offset, WRITTEN_MS: now_ms(), VALUES_STORED: 1},
                         [key for key, row in overlay.items() if row is None])


class ForeignKeyJoinTask(TableJoinTask):
    """Joins partition ``p`` of the left table with the whole right table on the left rows'
    foreign key, as ksqlDB's foreign-key table-table joins (INNER, LEFT): the result is keyed
    by the left table's key. Its store keeps, besides both sides' rows, an index of the left
    keys by foreign key (see ``INDEX``), so a right row's change joins again every left row
    that names it. The rows and the index change in the same write batch."""

    def __init__(self, settings: WorkerSettings, query: PersistentQuery, source: DataSource,
                 sink: DataSource, partition: int, stage: str = ""):
        super().__init__(settings, query, source, sink, partition, stage)
        spec = query.plan.join
        assert spec is not None
        foreign_key = spec.stage_tables()[0].foreign_key
        assert foreign_key is not None
        left = self.sides[0]
        self.foreign = [c.name for c in left.table.value_columns].index(foreign_key)
        assert self.sides[1].key_type is not None
        self.foreign_type = self.sides[1].key_type
        self.by_foreign: dict[bytes, dict[bytes, bool]] = {}
        """The index entries the pending overlay adds (True) or deletes (False), by foreign key."""

    def _foreign(self, row: list[Any] | None) -> bytes | None:
        """A left row's foreign key as the right table's key bytes (None: no row, or NULL)."""
        value = None if row is None else row[self.foreign]
        if value is not None and self.foreign_type.base == "BYTES":  # stored as base64 text
            value = base64_bytes(value)
        return None if value is None else serialize_key(value, self.foreign_type)

    def _apply(self, key: bytes, value: bytes | None, overlay: dict[bytes, list[Any] | None],
               bad: tuple[list[BadRecord], int] | None) -> list[bytes]:
        if key[0] > 1:
            return []
        # Every join task reads the right table's records: partition 0's logs the bad ones.
        log_to = bad[0] if bad and (key[0] == 0 or self.partition == 0) else None
        decoded = None if value is None else self._decode(key[0], key[1:], value, bad[1] if bad else 0, log_to)
        if value is not None and decoded is None:
            return []  # a value that does not decode changes nothing
        row = None if decoded is None else decoded[1]
        if key[0] == 1:
            overlay[key] = row
            # (A replay, without ``bad``, has no results to give: it only rebuilds the store.)
            return [] if bad is None else self._left_keys(key[1:], overlay)
        try:
            after = self._foreign(row)
        except (ValueError, TypeError, OverflowError, struct.error, MillpondError) as error:
            if log_to is not None:  # (a value the KAFKA key format cannot hold: changes nothing either)
                log_to.append(BadRecord(bad[1] if bad else 0, f"{self.sides[0].table.name}'s foreign key is not a "
                                        f"KAFKA {self.foreign_type} key: {error}", value.decode(errors="replace")
                                        if value is not None else None))
            return []
        before = self._foreign(self._row(key, overlay))
        overlay[key] = row
        if before != after:
            for foreign, present in ((before, False), (after, True)):
                if foreign is not None:
                    entry = INDEX + len(foreign).to_bytes(4, "big") + foreign + key[1:]
                    overlay[entry] = [] if present else None
                    self.by_foreign.setdefault(foreign, {})[key[1:]] = present
        return [key[1:]]

    def _left_keys(self, foreign: bytes, overlay: dict[bytes, list[Any] | None]) -> list[bytes]:
        """The left keys whose rows name ``foreign``, as this batch left them, in key order."""
        assert self.store is not None
        prefix = INDEX + len(foreign).to_bytes(4, "big") + foreign
        found: set[bytes] = set()
        after = None
        while True:
            page = self.store.page(after, INDEX_PAGE, prefix)
            found.update(key[len(prefix):] for key, _ in page)
            if len(page) < INDEX_PAGE:
                break
            after = page[-1][0]
        for left, present in self.by_foreign.get(foreign, {}).items():
            if present:
                found.add(left)
            else:
                found.discard(left)
        return sorted(found)

    def _result(self, key: bytes, overlay: dict[bytes, list[Any] | None], offset: int,
                bad: list[BadRecord]) -> bytes | None:
        left = self._row(b"\0" + key, overlay)
        foreign = self._foreign(left)
        right = None if foreign is None else self._row(b"\1" + foreign, overlay)
        if left is None or (right is None and self.sides[1].type == "INNER"):
            return None
        keys = [deserialize_key(key, self.key_type), None if foreign is None else left[self.foreign]]
        return self._value(keys, [left, right], offset, bad)

    async def commit(self, batch: KeyedSlice) -> bool:
        self.by_foreign.clear()  # what a failed commit's overlay added is gone with it
        return await super().commit(batch)

    def _write(self, overlay: dict[bytes, list[Any] | None], input_offset: int) -> None:
        super()._write(overlay, input_offset)
        self.by_foreign.clear()
