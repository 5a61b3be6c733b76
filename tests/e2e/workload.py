"""The readings workload the end-to-end aggregation tests share: generated events whose
per-key results are computed here, independently of Millpond, and the checks against them."""

from __future__ import annotations

import asyncio
import json
import random
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from aiokafka import AIOKafkaProducer

from millpond.cli.client import RouterClient
from millpond.deploy.local.launcher import LocalCluster
from millpond.shared.kafka import admin
from millpond.shared.kafka.partitioner import partition_for

PARTITIONS = 4


@dataclass
class Expected:
    """Per key: count, sum, min and max of the valid readings, computed independently."""

    count: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    total: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    low: dict[str, int] = field(default_factory=dict)
    high: dict[str, int] = field(default_factory=dict)

    def add(self, sensor: str, reading: int) -> None:
        self.count[sensor] += 1
        self.total[sensor] += reading
        self.low[sensor] = min(self.low.get(sensor, reading), reading)
        self.high[sensor] = max(self.high.get(sensor, reading), reading)


async def produce(bootstrap: str, topic: str, events: list[tuple[bytes | None, bytes]]) -> list[tuple[int, int]]:
    """Send (key, value) records, partitioned by murmur2 of the key as the Java client; each
    one's partition and offset."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=256 * 1024)
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key, partition=partition_for(key, PARTITIONS) if key else 0)
                   for key, value in events]
        await producer.flush()
        return [(meta.partition, meta.offset) for meta in await asyncio.gather(*futures)]
    finally:
        await producer.stop()


def area_of(sensor: str) -> str:
    """Each sensor's area: seven areas, so GROUP BY area re-keys the input."""
    return f"area-{int(sensor[-5:]) % 7}"


def readings(rng: random.Random, count: int, keys: int, expected: Expected) -> list[tuple[bytes | None, bytes]]:
    events: list[tuple[bytes | None, bytes]] = []
    for _ in range(count):
        sensor = f"sensor-{rng.randrange(keys):05d}"
        reading = rng.randrange(-500, 1000)
        expected.add(sensor, reading)
        events.append((sensor.encode(), json.dumps({"AREA": area_of(sensor), "READING": reading}).encode()))
    return events


def create_table(cluster: LocalCluster, stream: str, table: str) -> str:
    """The input stream and the CTAS over it (from the earliest offset); returns the query id."""
    client = RouterClient(cluster.router, timeout=120)
    try:
        outcomes = list(client.run_script(f"""
            SET 'auto.offset.reset'='earliest';
            CREATE STREAM IF NOT EXISTS {stream} (sensor VARCHAR KEY, area VARCHAR, reading INT)
              WITH (kafka_topic='{stream}', partitions={PARTITIONS}, value_format='json');
            CREATE TABLE {table} AS SELECT sensor, COUNT(*) AS n, SUM(reading) AS total, MIN(reading) AS lo,
              MAX(reading) AS hi, AVG(reading) AS mean FROM {stream} GROUP BY sensor;
        """))
    finally:
        client.close()
    return outcomes[-1].message.rsplit(" ", 1)[-1]


def ensure_stream(cluster: LocalCluster, stream: str) -> None:
    client = RouterClient(cluster.router, timeout=120)
    try:
        client.execute(f"CREATE STREAM IF NOT EXISTS {stream} (sensor VARCHAR KEY, area VARCHAR, reading INT) "
                       f"WITH (kafka_topic='{stream}', partitions={PARTITIONS}, value_format='json');")
    finally:
        client.close()


async def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The stream's last stable offsets (read_committed)."""
    return await admin.end_offsets(bootstrap, topic, PARTITIONS, isolation_level="read_committed")


def table_rows(cluster: LocalCluster, table: str) -> dict[str, dict[str, object]]:
    client = RouterClient(cluster.router, timeout=120)
    try:
        (outcome,) = client.execute(f"SELECT * FROM {table};")
    finally:
        client.close()
    names = [n for n, _ in outcome.columns]
    return {str(row[0]): dict(zip(names, row, strict=True)) for row in outcome.rows}


def check_table(rows: dict[str, dict[str, object]], expected: Expected) -> None:
    assert sorted(rows) == sorted(expected.count), "the table's keys differ from the input's"
    for sensor, n in expected.count.items():
        row = rows[sensor]
        total = expected.total[sensor]
        assert (row["N"], row["TOTAL"], row["LO"], row["HI"]) == (
            n, total, expected.low[sensor], expected.high[sensor]), sensor
        assert row["MEAN"] == pytest.approx(total / n), sensor
