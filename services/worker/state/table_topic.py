"""Reading a materialized table's own topic into a standby copy of its store.

A table that is materialized from a topic (here: a table-table join's result) keeps no
changelog of its own: the topic is its changelog, as Kafka Streams' source tables. A standby
copy therefore replays that topic the way the active task applies it: each key's latest
value, a tombstone deleting the key, a multi-column key stored in its canonical form, a
value that does not decode left out (the active task logs it). Both decode each record in
Python, the same way (``TableRecords``: ``reducers.materialize_reduction`` for the active task),
so a copy holds what the active task held whatever the columns' types; for what Millpond
writes, that is what Spark's reading of it stores for any other table (``values.stored``). The
next topic offset is the copy's input offset, written in the same write batch as the rows,
so a promoted copy's active task resumes exactly there, after applying the tail the copy had
not reached yet the same way (``ReplayedTableTask``). ``TableTopicReader`` has
``ChangelogReader``'s interface, so the standby replica reads either.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from aiokafka import AIOKafkaConsumer, TopicPartition

from millpond.services.worker import reasons
from millpond.services.worker.state.changelog import CONSUMER_STOP_TIMEOUT_S, MAX_RECORDS, wiped_if_behind
from millpond.services.worker.state.store import (
    INPUT_OFFSET,
    MARKED_END,
    PartitionStore,
    encode_state,
    mark_up_to_date,
    stale,
    wiped,
)
from millpond.shared.catalog.sources import DataSource
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.connection import KafkaConnection, idle_wake_ms, start_client
from millpond.shared.kafka.serde import encode_key, key_decoder, window_key_bytes
from millpond.shared.kafka.values import value_reader
from millpond.shared.task_status import now_ms
from millpond.shared.teardown import bounded, run_to_end

log = logging.getLogger(__name__)

BadSink = Callable[[int, str, str | None], None]
"""Told of a record left out: its offset, why, and its text."""
PROBE_MS = 25
"""How long ``past_markers`` waits for one fetch."""


class LeftOut(NamedTuple):
    """A record a table's store does not take: why, and the record's text."""

    reason: str
    text: str


class TableRecords:
    """How a table's topic record becomes a row of its store, in Python: the key as the store
    keeps it (a key of several columns in its canonical form; None: no usable key) and the
    value columns as the store keeps them (``values.stored``; None: the value does not decode). A
    joined table's active task and its standby copies both apply records this way
    (``reducers.materialize_reduction``, ``TableTopicReader``), so a promoted copy holds what the
    active held, whatever the columns' types."""

    def __init__(self, table: DataSource):
        self.table = table
        self.columns = [(c.name, c.type) for c in table.value_columns]
        keys = table.key_columns
        self._canonical = None if len(keys) < 2 else (key_decoder(keys), keys)
        self._width = reasons.KEY_WIDTHS.get(keys[0].type.base) if len(keys) == 1 else None
        """A KAFKA-format number key's width: a key of another length is no key (``reasons.bad_key``)."""
        self._text = len(keys) == 1 and keys[0].type.base == "VARCHAR"
        """A VARCHAR key: bytes that are not UTF-8 are no key either."""
        self._window = 0 if table.window is None else window_key_bytes(table.window)
        """A windowed table's record key is the key, then this many bytes of its window's bounds."""
        self._values = value_reader(table)

    def read(self, key: bytes | None, value: bytes | None) -> tuple[bytes, list[Any] | None] | LeftOut | None:
        """What one record does to the store: (key, values) to write, values None deleting the
        key; ``LeftOut`` for a record the processing log takes instead; None for nothing (a
        tombstone without a key)."""
        stored_key = self.key(key)
        if stored_key is None:
            raw = key if key is not None else value
            return None if raw is None else LeftOut(reasons.bad_key(self.table), raw.decode(errors="replace"))
        if value is None:
            return stored_key, None
        values = self.row(value)
        if values is None:
            return LeftOut(reasons.bad_value(self.table), value.decode(errors="replace"))
        return stored_key, values

    def key(self, key: bytes | None) -> bytes | None:
        """The key as the store keeps it, None for no usable key (a windowed table's: its window's
        bounds after the key)."""
        if self._window:
            if key is None or len(key) < self._window:
                return None
            inner = self._inner_key(key[:-self._window])
            return None if inner is None else inner + key[-self._window:]
        return self._inner_key(key)

    def _inner_key(self, key: bytes | None) -> bytes | None:
        if key is None or (self._width is not None and len(key) != self._width):
            return None
        if self._text:
            try:
                key.decode()
            except UnicodeDecodeError:
                return None
        if self._canonical is None:
            return key
        decode, keys = self._canonical
        try:
            return encode_key(decode(key), keys)
        except (MillpondError, ValueError, TypeError, KeyError, ArithmeticError, RecursionError):
            return None

    def row(self, value: bytes) -> list[Any] | None:
        return self._values(value)


class TableTopicReader:
    """Applies one partition of a table's topic to a store through a ``read_committed``
    consumer, from the store's input offset on: ``start``, ``fetch`` as often as wanted, ``stop``."""

    def __init__(self, kafka: KafkaConnection, table: DataSource, partition: int, store: PartitionStore,
                 fetch_max_wait_ms: int, max_age_ms: int | None = None):
        self.input = TopicPartition(table.topic, partition)
        self.store = store
        self.max_age_ms = max_age_ms
        """How long ago the store may have been last brought up to date and still go on from its
        position when the topic has records past it (``task.table_store_max_age``; None: any)."""
        self.table = table
        self.records = TableRecords(table)
        # "earliest": a copy's position below the topic's first offset (retention) starts there.
        self.consumer = AIOKafkaConsumer(**kafka.client_args(), isolation_level="read_committed",
                                         enable_auto_commit=False, fetch_max_wait_ms=fetch_max_wait_ms,
                                         consumer_timeout_ms=idle_wake_ms(fetch_max_wait_ms), auto_offset_reset="earliest")
        self.offset = 0
        self.first: int | None = None
        """The topic's first offset when ``start`` asked it (it asks only for a store with a position)."""

    @property
    def position(self) -> int:
        """The next offset of the topic the store will apply."""
        return self.offset

    @property
    def input_offset(self) -> int:
        """The input offset the store reflects: the topic is the table's input."""
        return self.offset

    async def start(self) -> None:
        """Connect, and seek to where the store is; a store behind the topic's retention is
        built again from its first offset (``wiped_if_behind``)."""
        await start_client(self.consumer)
        self.consumer.assign([self.input])
        if (stored := self.store.position(INPUT_OFFSET)) is not None:
            self.first = (await wiped_if_behind(self.store, self.consumer, {self.input: stored}))[self.input]
        # Asked before the seek: after it, a fetch is out at the broker, and a question waits behind it.
        if self.max_age_ms is not None and stale(self.store, self.max_age_ms, now_ms()):
            await self._wiped_if_missed()
        self.offset = self.store.position(INPUT_OFFSET) or 0
        self.consumer.seek(self.input, self.offset)

    async def _wiped_if_missed(self) -> None:
        """The store was last brought up to date longer ago than the topic keeps a tombstone: if
        the topic's end moved since (``MARKED_END``), the cleaner may have removed the tombstone
        of a row it holds (with every record after it: none may be left to show it), so it is
        emptied and built again from the topic; if not (a quiet table), nothing was appended, it
        missed nothing and is up to date now."""
        end = await self.end_offset()
        if self.store.position(MARKED_END) == end:
            mark_up_to_date(self.store, end)
            return
        log.warning("the store was brought up to date longer ago than its topic keeps tombstones, and the topic has "
                    "had records appended since: it is built again from the topic", extra={
                        "store": str(self.store.path), "topic": f"{self.input.topic}-{self.input.partition}",
                        "store_offset": self.store.position(INPUT_OFFSET), "end_offset": end,
                        "max_age_ms": self.max_age_ms})
        await wiped(self.store)

    async def end_offset(self) -> int:
        """The topic's end now (its last stable offset, as the consumer reads committed)."""
        end: int = (await self.consumer.end_offsets([self.input]))[self.input]
        return end

    def last_stable_offset(self) -> int | None:
        """The last stable offset from the latest fetch; None before one answered."""
        stable = self.consumer.last_stable_offset(self.input)
        return stable if stable is not None and stable >= 0 else None

    async def fetch(self, timeout_ms: int, bad: BadSink | None = None) -> int:
        """Fetch once and apply what came, rows and position in one write batch; how many
        records were fetched. The position then moves past the commit markers fetched. ``bad``
        is told of each record left out (offset, reason, the record's text) with the reason
        the active task's query gives it."""
        batches = await self.consumer.getmany(self.input, timeout_ms=timeout_ms, max_records=MAX_RECORDS)
        records = batches.get(self.input, [])
        rows: dict[bytes, bytes] = {}
        deleted: set[bytes] = set()
        for record in records:
            outcome = self.records.read(record.key, record.value)
            if outcome is None:
                continue
            if isinstance(outcome, LeftOut):
                if bad is not None:
                    bad(record.offset, outcome.reason, outcome.text)
                continue
            key, values = outcome
            if values is None:
                rows.pop(key, None)
                deleted.add(key)
            else:
                rows[key] = encode_state(values)
                deleted.discard(key)
        if records:  # in one write batch after the last await: a cancelled fetch applied nothing
            self.offset = max(self.offset, int(records[-1].offset) + 1)
            self.store.write(rows, {INPUT_OFFSET: self.offset}, deleted)
        # Past the commit markers read with the records (the consumer skips them as it takes a
        # fetch's answer), or alone: else they would wait for the next fetch, held at the broker.
        position = await self.consumer.position(self.input)
        if position > self.offset:
            self.offset = position
            self.store.write({}, {INPUT_OFFSET: position})
        return len(records)

    async def past_markers(self, end: int, timeout_s: float) -> bool:
        """Whether the topic holds no record from the store's position up to ``end``: only
        transaction markers, or records of aborted transactions, which hold no rows. If so,
        the store's position moves past them (to ``end`` at least); a record there answers
        no at once, and nothing changes. False too when ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        position = self.offset
        while position < end:
            if time.monotonic() > deadline:
                return False
            batches = await self.consumer.getmany(self.input, timeout_ms=PROBE_MS, max_records=1)
            if batches.get(self.input):
                return False
            position = await self.consumer.position(self.input)
        if position > self.offset:
            self.offset = position
            self.store.write({}, {INPUT_OFFSET: position})
        return True

    async def stop(self) -> None:
        """Disconnect (the store stays open: it belongs to the caller); to the end even if the
        caller is cancelled meanwhile, and bounded."""
        await run_to_end(bounded(self.consumer.stop(), CONSUMER_STOP_TIMEOUT_S, "stop the table topic consumer",
                                 {"topic": f"{self.input.topic}-{self.input.partition}"}))
