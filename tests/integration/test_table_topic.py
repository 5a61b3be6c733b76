"""A table's store kept past its topic's retention: its position is below the topic's first
offset, so records it never applied are gone (the tombstones of rows it holds among them).
The reader that brings it up to date (the active task's and the standby copies') builds it
again from the topic, as a new copy is built, instead of going on from the first record
kept on top of rows deleted since."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.services.worker.state.store import INPUT_OFFSET, WRITTEN_MS, PartitionStore, encode_state, mark_up_to_date
from millpond.services.worker.state.table_topic import TableTopicReader
from millpond.services.worker.task import table_store_max_age
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.sources import DataSource
from millpond.shared.kafka.admin import ensure_topic
from millpond.shared.kafka.connection import KafkaConnection
from millpond.shared.sql.parser import parse_statement

pytestmark = pytest.mark.kafka

TOPIC = "table-topic-retention"


async def _brought_to(connection: KafkaConnection, table: DataSource, store: PartitionStore, end: int) -> None:
    """``store`` brought up to ``end`` of the table's topic by a reader started as a task's or a copy's is."""
    reader = TableTopicReader(connection, table, 0, store, fetch_max_wait_ms=100)
    await reader.start()
    try:
        for _ in range(200):
            if reader.position >= end:
                return
            await reader.fetch(100)
        raise AssertionError(f"the reader stayed at {reader.position} of {end}")
    finally:
        await reader.stop()


@dataclass
class Kept:
    """A one-partition table of rows a and b, and a store brought up to date with its topic."""

    connection: KafkaConnection
    table: DataSource
    admin: AIOKafkaAdminClient
    producer: AIOKafkaProducer
    store: PartitionStore


@asynccontextmanager
async def kept_table(kafka: EmbeddedKafka, tmp_path: Path, topic: str, compacted: bool) -> AsyncIterator[Kept]:
    connection = KafkaConnection(kafka.bootstrap_servers)
    meta = Metastore()
    meta.apply(parse_statement(f"CREATE TABLE kept (k VARCHAR PRIMARY KEY, v INT) "
                               f"WITH (kafka_topic='{topic}', partitions=1, value_format='json')"), 0)
    table = meta.source("KEPT")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers)
    await producer.start()
    store = PartitionStore(tmp_path / "store")
    try:
        await ensure_topic(admin, topic, 1, compacted=compacted)
        for key, value in ((b"a", 1), (b"b", 2)):
            await producer.send_and_wait(topic, json.dumps({"V": value}).encode(), key=key, partition=0)
        await _brought_to(connection, table, store, 2)
        yield Kept(connection, table, admin, producer, store)
    finally:
        store.close()
        await producer.stop()
        await admin.close()


async def test_a_store_behind_the_topics_retention_is_built_again_from_the_topic(kafka: EmbeddedKafka,
                                                                                  tmp_path: Path) -> None:
    async with kept_table(kafka, tmp_path, TOPIC, compacted=False) as kept:
        connection, table, admin, producer, store = (kept.connection, kept.table, kept.admin, kept.producer,
                                                     kept.store)
        assert dict(store.items()) == {b"a": [1], b"b": [2]}
        # While the store is kept (its worker away), a is deleted and c added; retention then
        # removes everything before c, the tombstone of a among it.
        await producer.send_and_wait(TOPIC, None, key=b"a", partition=0)
        await producer.send_and_wait(TOPIC, json.dumps({"V": 3}).encode(), key=b"c", partition=0)
        await admin.delete_records({TopicPartition(TOPIC, 0): RecordsToDelete(3)})
        await _brought_to(connection, table, store, 4)
        # What a new copy of the table holds: the rows of the records kept.
        assert dict(store.items()) == {b"c": [3]}
        assert store.position(INPUT_OFFSET) == 4


async def test_a_tables_store_may_be_as_old_as_its_compacted_topic_keeps_tombstones(kafka: EmbeddedKafka) -> None:
    """``table_store_max_age`` reads the topic's own ``delete.retention.ms`` (a tenth less), the
    broker's default where the topic sets none, and none for a topic that is not compacted (its
    tombstones go with retention, which the reader's first-offset check covers)."""
    connection = KafkaConnection(kafka.bootstrap_servers)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        await ensure_topic(admin, f"{TOPIC}-kept", 1, compacted=True, configs={"delete.retention.ms": "600000"})
        await ensure_topic(admin, f"{TOPIC}-default", 1, compacted=True)
        await ensure_topic(admin, f"{TOPIC}-deleted", 1)
    finally:
        await admin.close()
    ages = []
    for name in ("kept", "default", "deleted"):
        table = DataSource("TABLE", name.upper(), (), f"{TOPIC}-{name}", 1)
        ages.append(await table_store_max_age(connection, table))
    assert ages == [540_000, 86_400_000 - 8_640_000, None]


async def test_a_store_older_than_the_topics_tombstones_is_kept_only_while_the_topic_is_quiet(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """A store last brought up to date longer ago than ``max_age_ms``: kept (and marked up to
    date now) while its topic's end is where the store last reflected it; built again from the
    topic once records were appended since, which the cleaner may have removed with a tombstone."""
    topic = f"{TOPIC}-quiet"
    async with kept_table(kafka, tmp_path, topic, compacted=True) as kept:
        connection, table, producer, store = kept.connection, kept.table, kept.producer, kept.store
        mark_up_to_date(store, 2)
        store.write({b"ghost": encode_state([9])}, {WRITTEN_MS: int(time.time() * 1000) - 3_600_000})
        # Quiet since: kept as it is (a row only the store has stays: nothing was read again).
        reader = TableTopicReader(connection, table, 0, store, fetch_max_wait_ms=100, max_age_ms=60_000)
        await reader.start()
        await reader.stop()
        assert b"ghost" in dict(store.items()) and store.position(WRITTEN_MS) > time.time() * 1000 - 60_000
        store.write({}, {WRITTEN_MS: int(time.time() * 1000) - 3_600_000})
        await producer.send_and_wait(topic, json.dumps({"V": 3}).encode(), key=b"c", partition=0)
        reader = TableTopicReader(connection, table, 0, store, fetch_max_wait_ms=100, max_age_ms=60_000)
        await reader.start()
        try:
            assert reader.position == 0 and dict(store.items()) == {}  # built again from the topic
            for _ in range(100):
                if reader.position >= 3:
                    break
                await reader.fetch(100)
        finally:
            await reader.stop()
        assert dict(store.items()) == {b"a": [1], b"b": [2], b"c": [3]}
