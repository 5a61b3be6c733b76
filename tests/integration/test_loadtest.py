"""The load generator's events, as a broker holds them: every key once first, then random
keys, each in its key's partition, in the order made, at no more than the rate asked."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from millpond.cli import loadtest
from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.shared.kafka.partitioner import partition_for

PARTITIONS = 4
KEYS = 300


async def topic(kafka: EmbeddedKafka) -> str:
    name = f"load-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, PARTITIONS, 1)])
    finally:
        await admin.close()
    return name


async def read_all(kafka: EmbeddedKafka, name: str, count: int) -> dict[int, list[tuple[bytes, bytes]]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(name, p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        read: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in range(PARTITIONS)}
        deadline = time.monotonic() + 30
        while sum(map(len, read.values())) < count and time.monotonic() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                read[tp.partition] += [(r.key, r.value) for r in records]
        return read
    finally:
        await consumer.stop()


def config(kafka: EmbeddedKafka, name: str, events_per_s: float) -> loadtest.Config:
    return loadtest.Config(server="unused:1", kafka=kafka.bootstrap_servers, stream=name, keys=KEYS,
                           partitions=PARTITIONS, events_per_s=events_per_s)


async def test_a_limited_load_sends_every_key_first_then_random_ones_each_to_its_partition(kafka: EmbeddedKafka) -> None:
    # Two ticks, the first of whose record batches fill (256 KiB, about 4,700 events each).
    name, limit = await topic(kafka), 50_000
    stats = loadtest.Stats()
    await loadtest.produce(config(kafka, name, 0.0), stats, asyncio.Event(), random.Random(3), limit=limit,
                           tick_max=40_000)
    assert stats.produced == limit
    read = await read_all(kafka, name, limit)
    assert sum(map(len, read.values())) == limit, "every event once"
    first = [f"sensor-{k:05d}".encode() for k in range(KEYS)]
    later: set[bytes] = set()
    for partition, records in read.items():
        assert all(partition_for(key, PARTITIONS) == partition for key, _ in records)
        mine = [key for key in first if partition_for(key, PARTITIONS) == partition]
        assert [key for key, _ in records[:len(mine)]] == mine, "each key once, in order, before any random one"
        later |= {key for key, _ in records[len(mine):]}
        for _, value in records:
            event = json.loads(value)
            assert event["AREA"] in loadtest.AREAS and 0 <= event["READING"] < 100
    assert len(later) > KEYS // 2, "then random keys"


async def test_a_rate_limited_load_sends_no_more_than_its_rate(kafka: EmbeddedKafka) -> None:
    name, rate, stop = await topic(kafka), 2_000.0, asyncio.Event()
    stats = loadtest.Stats()
    started = time.monotonic()
    load = asyncio.create_task(loadtest.produce(config(kafka, name, rate), stats, stop, random.Random(4)))
    await asyncio.sleep(1.5)
    stop.set()
    await asyncio.wait_for(load, 30)
    elapsed = time.monotonic() - started
    assert 0 < stats.produced <= rate * elapsed + 1
    assert sum(map(len, (await read_all(kafka, name, stats.produced)).values())) == stats.produced
