"""INSERT ... VALUES: a row produced to its source's topic, once per request id.

The router produces the rows its clients INSERT, as a ksqlDB server does, with no hop to a
coordinator; a coordinator does the same for a client that calls it directly. Either way a
request id names the row across resends: the row carries it in a header, and a resend
(``attempt`` > 0) whose first attempt may have run elsewhere looks for it in the topic's
last records before producing again. A resend that comes while its first attempt is still
being sent here waits for that attempt's answer rather than producing a second row.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    InvalidTimestampError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)

from millpond.shared.catalog.sources import DataSource
from millpond.shared.errors import StatementError, UnavailableError
from millpond.shared.kafka.command_log import EXECUTED_REQUESTS_KEPT, request_reused
from millpond.shared.kafka.connection import KafkaConnection, start_client, started
from millpond.shared.results import Outcome
from millpond.shared.sql import ast
from millpond.shared.sql.planner import EncodedRecord, encode_insert

log = logging.getLogger(__name__)
REFUSED = (InvalidTimestampError, MessageSizeTooLargeError, RecordListTooLargeError, RecordTooLargeError)
"""Kafka's answers that say a record was not written and never will be as it is."""

REQUEST_ID_HEADER = "millpond.request.id"
"""Header of an INSERTed record: the request that inserted it (a resend finds it by this)."""
INSERT_LOOKBACK = 10_000
"""How many of a partition's last records a resent INSERT looks through for its first attempt."""


class RowInserter:
    """Produces INSERTed rows (idempotent, every replica acknowledging) and remembers where
    each named request's row went. ``producer``: one of the caller's (a test's), instead of
    one made from ``kafka``."""

    def __init__(self, kafka: KafkaConnection, producer: AIOKafkaProducer | None = None):
        self.kafka = kafka
        self.producer = producer or AIOKafkaProducer(**kafka.client_args(), enable_idempotence=True, acks="all")
        self._inserted: OrderedDict[str, tuple[str, int, int]] = OrderedDict()
        """The statement and the (partition, offset) of each row inserted here for a named request."""
        self._sending: dict[str, tuple[str, asyncio.Future[Outcome]]] = {}
        """The statement and the insert under way here for each named request: a resend is
        answered by it."""

    async def start(self) -> None:
        await start_client(self.producer)

    async def stop(self) -> None:
        await self.producer.stop()

    async def insert(self, stmt: ast.InsertValues, source: DataSource, request_id: str = "",
                     attempt: int = 0) -> Outcome:
        """Produce ``stmt``'s row to ``source`` (from ``Metastore.insert_target``, read up to
        date); its outcome carries the row's partition and offset. A request id inserted
        before, here or (on a resend) by anyone within ``INSERT_LOOKBACK`` records, is
        answered with that row instead; used before for another row, it is refused (the row
        would be acknowledged and never written)."""
        if not request_id:
            return await self._insert(stmt, source, "", 0)
        sending = self._sending.get(request_id)
        job: asyncio.Future[Outcome]
        if sending is None or sending[1].done():
            job = asyncio.ensure_future(self._insert(stmt, source, request_id, attempt))
            self._sending[request_id] = (stmt.text, job)
            job.add_done_callback(lambda ended: self._forget(request_id, ended))
        else:  # sent once and not yet acknowledged: producing again would write the row twice
            statement, job = sending
            if statement != stmt.text:
                raise request_reused(request_id, statement)
            log.info("row for this request being inserted: answered with it", extra={"request_id": request_id})
        return await asyncio.shield(job)

    def _forget(self, request_id: str, job: asyncio.Future[Outcome]) -> None:
        sending = self._sending.get(request_id)
        if sending is not None and sending[1] is job:
            del self._sending[request_id]

    async def _insert(self, stmt: ast.InsertValues, source: DataSource, request_id: str, attempt: int) -> Outcome:
        record = encode_insert(stmt, source)
        done: tuple[int, int] | None = None
        if request_id and (inserted := self._inserted.get(request_id)) is not None:
            statement, partition, offset = inserted
            if statement != stmt.text:
                raise request_reused(request_id, statement)
            done = (partition, offset)
        if done is None and request_id and attempt > 0:
            try:
                done = await self._find(source, record, request_id)
            except KafkaError as err:
                raise UnavailableError(f"could not look in {source.topic} for the row of request {request_id} ({err}); "
                                       "resend the request with the same request_id") from err
        if done is not None:
            log.info("row already inserted for this request", extra={"request_id": request_id})
            return Outcome(stmt.text, f"Inserted into {source.name}", partition=done[0], offset=done[1])
        headers = [(REQUEST_ID_HEADER, request_id.encode())] if request_id else None
        try:
            meta = await self.producer.send_and_wait(source.topic, record.value, key=record.key,
                                                     partition=record.partition, headers=headers,
                                                     timestamp_ms=record.timestamp)
        except REFUSED as err:  # the broker (or the client, for its size) refused the record: never written
            raise StatementError(f"Kafka refused the row for {source.topic}, which is not written: {err} (a ROWTIME "
                                 "past the broker's log.message.timestamp.after.max.ms, or a row past its "
                                 "max.request.size)") from err
        except KafkaError as err:
            raise UnavailableError(f"Kafka did not take the row for {source.topic} ({err}); it may still be written: "
                                   "resend the request with the same request_id") from err
        if request_id:
            self._inserted[request_id] = (stmt.text, meta.partition, meta.offset)
            while len(self._inserted) > EXECUTED_REQUESTS_KEPT:
                self._inserted.popitem(last=False)
        return Outcome(stmt.text, f"Inserted into {source.name}", partition=meta.partition, offset=meta.offset)

    async def _find(self, source: DataSource, record: EncodedRecord, request_id: str) -> tuple[int, int] | None:
        """Where a row with ``request_id`` in its headers is, among the last ``INSERT_LOOKBACK``
        records of its partition (of every partition for a keyless row): a resend whose first
        attempt, elsewhere, produced it and then failed to answer. A row of that id with another
        key or value is another statement's: the id was used again, and this one is refused."""
        partition = record.partition
        async with started(AIOKafkaConsumer(**self.kafka.client_args(), enable_auto_commit=False)) as consumer:
            found = range(source.partitions) if partition is None else [partition]
            tps = [TopicPartition(source.topic, p) for p in found]
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                consumer.seek(tp, max(ends[tp] - INSERT_LOOKBACK, 0))
            wanted = request_id.encode()
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                for tp, records in (await consumer.getmany(*tps, timeout_ms=1000)).items():
                    for r in records:
                        if r.offset < ends[tp] and (REQUEST_ID_HEADER, wanted) in list(r.headers or ()):
                            if (r.key, r.value) != (record.key, record.value):
                                raise request_reused(request_id, "another row")
                            return tp.partition, r.offset
        return None

