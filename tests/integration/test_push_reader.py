"""A push query's reader against the real broker: one started from the earliest record whose
next record is deleted (retention, ``DeleteRecords``) while it is behind goes on from the first
record kept, as ``auto.offset.reset=earliest`` says, not from the end of the topic."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.services.router.push import PushQuery
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.kafka.admin import ensure_topic
from millpond.shared.kafka.connection import KafkaConnection
from millpond.shared.sql import ast
from millpond.shared.sql.parser import parse_statement
from millpond.shared.sql.planner import plan_select

pytestmark = pytest.mark.kafka

TOPIC = "push-reader-retention"
RECORDS = 20
DELETED_BEFORE = 10
PAD = "x" * 300_000
"""Each record is larger than the reader's fetch per partition (256 KiB): it holds one or two
records ahead of the client at most, so the deletion lands ahead of what it has fetched."""


async def _next(rows: Any) -> list[Any]:
    return await asyncio.wait_for(rows.__anext__(), 30)  # type: ignore[no-any-return]


async def test_a_push_from_the_earliest_record_goes_on_from_the_first_kept_after_its_next_is_deleted(
        kafka: EmbeddedKafka) -> None:
    connection = KafkaConnection(kafka.bootstrap_servers)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, max_request_size=1 << 20)
    await producer.start()
    meta = Metastore()
    meta.apply(parse_statement(f"CREATE STREAM kept (k VARCHAR KEY, v INT, pad VARCHAR) "
                               f"WITH (kafka_topic='{TOPIC}', partitions=1, value_format='json')"), 0)
    query = parse_statement("SELECT v FROM kept EMIT CHANGES")
    assert isinstance(query, ast.Query)
    push = PushQuery(plan_select(query, meta.source("KEPT")), connection, from_beginning=True, fetch_records=1)
    try:
        await ensure_topic(admin, TOPIC, 1)
        for v in range(RECORDS):
            await producer.send_and_wait(TOPIC, json.dumps({"V": v, "PAD": PAD}).encode(), key=b"k", partition=0)
        await push.start()
        rows = push.rows()
        assert await _next(rows) == [0]
        await admin.delete_records({TopicPartition(TOPIC, 0): RecordsToDelete(DELETED_BEFORE)})
        await producer.send_and_wait(TOPIC, json.dumps({"V": RECORDS, "PAD": ""}).encode(), key=b"k", partition=0)
        seen: list[int] = []
        while not seen or seen[-1] != RECORDS:
            seen.append((await _next(rows))[0])
        # Fetched before the deletion: a record or two; then every record kept, in order.
        assert seen[-(RECORDS + 1 - DELETED_BEFORE):] == list(range(DELETED_BEFORE, RECORDS + 1)), seen
        assert len(seen) <= RECORDS + 1 - DELETED_BEFORE + 2, seen
        await rows.aclose()
    finally:
        await push.stop()
        await producer.stop()
        await admin.close()
