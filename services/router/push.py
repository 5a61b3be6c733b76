"""Push queries at the router: ``SELECT ... EMIT CHANGES`` streamed to the client (and PRINT's
records of a topic, ``TopicPrint``), and pull queries over a stream, which read its records the
same way up to where each partition ends when they start (``PushQuery.rows_to_end``).

The router reads the source's topic itself (every partition, read_committed, no consumer
group: several routers and several clients each get their own reader), decodes each
record as the persistent queries and the stores read it (``values.value_reader``: a push
and a pull over the same records give the same values), applies the WHERE and the SELECT
list, and hands rows to the gRPC stream. Over a stream a row is an event; over a table it
is a change of a row (the table's topic carries every update), in offset order per
partition, so in order per key.

Memory stays bounded for a slow client: rows are fetched a bounded batch at a time and the
next fetch waits until the stream has taken the previous rows (gRPC flow control makes
the stream's writes wait for the client).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from millpond.services.router.record_formats import PossibleFormats
from millpond.shared.catalog.sources import WINDOW_END, WINDOW_START, DataSource
from millpond.shared.errors import NotFoundError, StatementError, UnavailableError
from millpond.shared.kafka.admin import started_admin, topic_partitions
from millpond.shared.kafka.connection import KafkaConnection, start_client
from millpond.shared.kafka.serde import bytes_decoder, key_decoder, window_bounds, window_key_bytes
from millpond.shared.kafka.values import value_reader
from millpond.shared.sql.arrays import RecordFailure
from millpond.shared.sql.ast import PrintTopic
from millpond.shared.sql.planner import SelectPlan

log = logging.getLogger(__name__)
_ids = itertools.count(1)
TOKEN_POLL_S = 0.05
"""How often a pull over a stream asks again for the ends of partitions behind its consistency token."""


async def open_reader(kafka: KafkaConnection, topic: str, partitions: int, from_beginning: bool,
                      reading: str) -> AIOKafkaConsumer:
    """A reader of every partition of ``topic`` (read_committed, no consumer group: several
    routers and several clients each get their own), at its beginning or its end, resolved now,
    not at the first fetch: once this returns, every record written afterwards will be read.
    UnavailableError, naming what was ``reading``, where Kafka cannot be reached."""
    # A reader whose next record retention has deleted goes on where ``auto.offset.reset``
    # says, as a ksqlDB push query's consumer does: from the first record kept (earliest),
    # not from the end, which would skip every record kept since.
    consumer = AIOKafkaConsumer(
        **kafka.client_args(), isolation_level="read_committed", enable_auto_commit=False,
        fetch_max_wait_ms=100, max_partition_fetch_bytes=256 * 1024,
        auto_offset_reset="earliest" if from_beginning else "latest")
    try:
        await start_client(consumer)
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(assigned)
        if from_beginning:
            await consumer.seek_to_beginning(*assigned)
        else:
            await consumer.seek_to_end(*assigned)
        for tp in assigned:
            await consumer.position(tp)
    except BaseException as err:
        await consumer.stop()
        if isinstance(err, KafkaError):
            raise UnavailableError(f"could not read {topic} from Kafka ({err}); is Kafka reachable? "
                                   f"Run {reading} again") from err
        raise
    return consumer


async def fetched(consumer: AIOKafkaConsumer, most: int, topic: str, reading: str) -> dict[TopicPartition, list[Any]]:
    """The next records ``consumer`` has (at most ``most``, within a second); UnavailableError,
    naming what was ``reading``, where Kafka went away."""
    try:
        batches: dict[TopicPartition, list[Any]] = await consumer.getmany(timeout_ms=1000, max_records=most)
    except KafkaError as err:
        raise UnavailableError(f"{reading} could not go on reading {topic} from Kafka ({err}); run it again") from err
    return batches


@dataclass(frozen=True)
class PushHeader:
    """The first item of a push query's stream: its id and result columns."""

    query_id: str
    columns: list[tuple[str, str]]
    """Name and SQL type of each column, in row order."""


@dataclass
class PushQuery:
    """One running push query."""

    plan: SelectPlan
    kafka: KafkaConnection
    from_beginning: bool
    fetch_records: int = 500
    """Most records fetched at once: what a slow client can hold up at the router."""
    query_id: str = ""

    def __post_init__(self) -> None:
        self.query_id = self.query_id or f"PUSH_{next(_ids)}"
        self.delivered = 0
        self.skipped = 0
        """Records that did not decode (the persistent queries' processing log reports those)."""
        self._consumer: AIOKafkaConsumer | None = None
        source = self.plan.source
        self._values = value_reader(source)
        self._names = [c.name for c in source.value_columns]
        self._bytes = [(i, decode) for i, c in enumerate(source.value_columns)
                       if (decode := bytes_decoder(c.type)) is not None]
        """The value columns holding BYTES, with what gives them back from the base64 text a
        store keeps (``values.stored``), as a pull gives them."""

    async def start(self) -> None:
        """Open the reader at the beginning or the end of every partition. Once this returns,
        every record written afterwards will be streamed."""
        source = self.plan.source
        self._consumer = await open_reader(self.kafka, source.topic, source.partitions, self.from_beginning,
                                           "the push query")
        log.info("push query started", extra={"query": self.query_id, "source": source.name})

    async def stop(self) -> None:
        """Close the reader."""
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()
            log.info("push query ended", extra={"query": self.query_id, "rows": self.delivered,
                                                "skipped": self.skipped})

    async def rows(self) -> AsyncIterator[list[Any]]:
        """The result rows as they happen, until the LIMIT or until the caller stops iterating."""
        assert self._consumer is not None, "start the push query first"
        async for row in self._read(self._consumer, None, "the push query"):
            yield row

    async def rows_to_end(self, at_least: Mapping[int, int], wait_s: float = 0.0) -> AsyncIterator[list[Any]]:
        """The result rows of the records each partition holds now, then the end: a pull query over a
        stream (ksqlDB's), read from the beginning to each partition's end as it is when this is
        called (read_committed: its last stable offset, before another writer's open transaction;
        records written afterwards are not read), once each partition's end has reached its
        ``at_least`` offset (a consistency token's: waited for up to ``wait_s``, then
        UnavailableError), in each partition's offset order, until the LIMIT."""
        consumer = self._consumer
        assert consumer is not None, "start the query first"
        topic = self.plan.source.topic
        assigned = sorted(consumer.assignment(), key=lambda tp: tp.partition)
        waited_until = time.monotonic() + wait_s
        try:
            while True:
                ends: dict[TopicPartition, int] = await consumer.end_offsets(assigned)
                behind = next((tp for tp in assigned if ends[tp] < at_least.get(tp.partition, 0)), None)
                if behind is None:
                    break
                if time.monotonic() >= waited_until:
                    raise UnavailableError(
                        f"partition {behind.partition} of {topic} ends at offset {ends[behind]}, before the consistency "
                        f"token's {at_least[behind.partition]} (after waiting {wait_s:.1f} s): ask again, or, if the topic "
                        "was made anew, without that token")
                await asyncio.sleep(TOKEN_POLL_S)
            consumer.pause(*[tp for tp in assigned if await consumer.position(tp) >= ends[tp]])
        except KafkaError as err:
            raise UnavailableError(f"the pull query could not read {topic} from Kafka ({err}); run it again") from err
        async for row in self._read(consumer, ends, "the pull query"):
            yield row

    async def _read(self, consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int] | None,
                    reading: str) -> AsyncIterator[list[Any]]:
        """The result rows of the records ``consumer`` reads, until the LIMIT, and with ``ends``
        until each partition's position has reached its end (``consumer`` pauses those it has)."""
        if self.plan.limit == 0:
            return
        while ends is None or len(consumer.paused()) < len(ends):
            batches = await fetched(consumer, self.fetch_records, self.plan.source.topic, reading)
            for tp, records in batches.items():
                for record in records:
                    if ends is not None and record.offset >= ends[tp]:  # written after the pull began
                        break
                    for row in self._rows(self.plan.source, record):
                        yield row
                        self.delivered += 1
                        if self.plan.limit is not None and self.delivered >= self.plan.limit:
                            return
            if ends is not None:
                consumer.pause(*[tp for tp, end in ends.items() if tp not in consumer.paused() and
                                 await consumer.position(tp) >= end])

    def _rows(self, source: DataSource, record: Any) -> Iterable[list[Any]]:
        """The result rows of one record, each made when it is read: one, none when it is a
        tombstone, does not decode, or does not pass the WHERE, or one per item of its EXPLODEs."""
        if record.value is None:
            return []
        keys = source.key_columns
        try:
            values = self._values(record.value)
            if values is None:
                raise ValueError("value does not decode as the source's columns and types")
            for i, decode in self._bytes:
                if values[i] is not None:
                    values[i] = decode(values[i])
            row = dict(zip(self._names, values, strict=True))
            if keys:
                if record.key is None:
                    raise ValueError("record has no key")
                key = record.key
                if source.window is not None:  # the windowed key: the key, then the window's bounds
                    if len(key) < window_key_bytes(source.window):
                        raise ValueError("record key is too short to hold a window")
                    key, row[WINDOW_START], row[WINDOW_END] = window_bounds(key, source.window)
                decoded = key_decoder(keys)(key)
                if len(keys) > 1 and None in decoded:  # as the persistent queries' readers: no key
                    raise ValueError("a key of several columns lacks one of them")
                row.update(zip((c.name for c in keys), decoded, strict=True))
            # the pseudo-columns, unless a column took the name
            row.setdefault("ROWTIME", record.timestamp)
            row.setdefault("ROWPARTITION", record.partition)
            row.setdefault("ROWOFFSET", record.offset)
        except (ValueError, TypeError, AttributeError, UnicodeDecodeError, struct.error, RecursionError) as err:
            return self._skip(record, err)
        try:
            return self.plan.results(row)
        except RecordFailure as err:  # (CUBE_EXPLODE of too many items: ksqlDB's query skips the record too)
            return self._skip(record, err)

    def _skip(self, record: Any, err: Exception) -> list[list[Any]]:
        """No rows of ``record``, which the push query skips, counted and logged."""
        self.skipped += 1
        log.debug("push query skipped a record", extra={"query": self.query_id, "offset": record.offset,
                                                        "reason": str(err)})
        return []


PRINT_COLUMNS = [("ROWTIME", "BIGINT"), ("PARTITION", "INT"), ("OFFSET", "BIGINT"), ("KEY", "VARCHAR"), ("VALUE", "VARCHAR"),
                 ("KEY_FORMAT", "VARCHAR"), ("VALUE_FORMAT", "VARCHAR")]
"""PRINT's rows: each record's time (epoch ms), partition, offset, key and value as their format
shows them, and the formats that read every key and value so far (``record_formats``)."""


@dataclass
class TopicPrint:
    """One running PRINT (ksqlDB's): a topic's records as they are, whatever wrote them (read_committed,
    every partition, no consumer group), from its end or its beginning, every ``interval``-th
    record, until the LIMIT or until the caller stops iterating."""

    stmt: PrintTopic
    kafka: KafkaConnection
    fetch_records: int = 500
    query_id: str = ""

    def __post_init__(self) -> None:
        self.query_id = self.query_id or f"PRINT_{next(_ids)}"
        self.delivered = 0
        self.topic = self.stmt.topic
        self._consumer: AIOKafkaConsumer | None = None
        self.keys, self.values = PossibleFormats.of_keys(), PossibleFormats.of_values()

    async def start(self) -> None:
        """Find the topic (a bare name: of any case) and open the reader at the beginning or the
        end of every partition."""
        try:
            admin = await started_admin(self.kafka)
            try:
                self.topic = self._named(set(await admin.list_topics()))
                count = await topic_partitions(admin, self.topic) or 0
            finally:
                await admin.close()
        except KafkaError as err:
            raise UnavailableError(f"could not read {self.topic} from Kafka ({err}); is Kafka reachable? "
                                   "Run PRINT again") from err
        if not count:
            raise NotFoundError(f"the topic {self.topic!r} was deleted meanwhile; SHOW TOPICS lists the topics")
        self._consumer = await open_reader(self.kafka, self.topic, count, self.stmt.from_beginning, "PRINT")
        log.info("print started", extra={"query": self.query_id, "topic": self.topic})

    def _named(self, topics: set[str]) -> str:
        """The topic the statement names: exactly the quoted name, else the one topic of that name in any case."""
        if self.topic in topics:
            return self.topic
        alike = sorted(t for t in topics if t.lower() == self.topic.lower()) if not self.stmt.exact else []
        if len(alike) == 1:
            return alike[0]
        if alike:
            raise StatementError(f"{len(alike)} topics are named {self.topic} in some case ({', '.join(alike)}): "
                                 "quote the one to print, PRINT 'name'")
        raise NotFoundError(f"the topic {self.topic!r} does not exist; SHOW TOPICS lists the topics")

    async def stop(self) -> None:
        """Close the reader."""
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()
            log.info("print ended", extra={"query": self.query_id, "rows": self.delivered})

    async def rows(self) -> AsyncIterator[list[Any]]:
        """The records as rows (``PRINT_COLUMNS``), in each partition's offset order."""
        assert self._consumer is not None, "start PRINT first"
        limit, seen = self.stmt.limit, 0
        if limit == 0:
            return
        while True:
            batches = await fetched(self._consumer, self.fetch_records, self.topic, "PRINT")
            for records in batches.values():
                for record in records:
                    seen += 1
                    if (seen - 1) % self.stmt.interval:
                        continue
                    key, value = self.keys.shown(record.key), self.values.shown(record.value)
                    yield [record.timestamp, record.partition, record.offset, key, value, self.keys.names(), self.values.names()]
                    self.delivered += 1
                    if limit is not None and self.delivered >= limit:
                        return
