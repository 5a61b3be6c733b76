"""The JIT warm-up a worker's Spark session runs before it takes a query, on a real Spark
session and a real broker: its batches, then its micro-batches read over the Kafka source from
a topic of its own, which it deletes (as it does those a crash left behind)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pyspark.sql import SparkSession

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.services.worker.jit import STREAM, TABLE, made_up_records, reduction_runner, warm_up_jit
from millpond.services.worker.spark import create_session
from millpond.shared.catalog import names
from millpond.shared.config import WorkerSettings


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="module")
def spark(kafka: EmbeddedKafka, state_dir: Path) -> Iterator[SparkSession]:
    """The worker's own session settings, in local[1]."""
    session = create_session(settings(kafka, state_dir))
    yield session
    session.stop()


def settings(kafka: EmbeddedKafka, state_dir: Path, batches: int = 0, triggers: int = 0) -> WorkerSettings:
    return WorkerSettings(worker_id="jit-test", spark_master="local[1]", state_dir=state_dir,
                          kafka_bootstrap_servers=kafka.bootstrap_servers, spark_warm_up_batches=batches,
                          spark_warm_up_triggers=triggers)


async def warm_up_topics(kafka: EmbeddedKafka, create: str | None = None, timeout_s: float = 30) -> list[str]:
    """The worker's warm-up topics the broker lists (after making ``create``, if given, once it
    is listed: a new topic reaches the metadata a moment after its creation is accepted)."""
    prefix = names.warm_up_topic_prefix("millpond", "jit-test")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        if create is not None:
            await admin.create_topics([NewTopic(prefix + create, 1, 1)])
        deadline = time.monotonic() + timeout_s
        while True:
            listed = [name for name in await admin.list_topics() if name.startswith(prefix)]
            if create is None or prefix + create in listed or time.monotonic() > deadline:
                return listed
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


def eventually_none(kafka: EmbeddedKafka, timeout_s: float = 30) -> list[str]:
    """The warm-up topics left, once there are none or ``timeout_s`` has passed (a deletion
    reaches the brokers' metadata a moment after it is accepted)."""
    deadline = time.monotonic() + timeout_s
    while (left := asyncio.run(warm_up_topics(kafka))) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_made_up_records_are_good_records_of_every_partition_and_key(spark: SparkSession, state_dir: Path) -> None:
    # A warm-up of bad records would compile the processing log's path, not the batches'.
    loop = asyncio.new_event_loop()
    try:
        runner = reduction_runner(spark, WorkerSettings(state_dir=state_dir), (STREAM, TABLE), loop)
        slices = runner._reduce(made_up_records(spark, 4_000))
    finally:
        loop.close()
    assert sorted(slices) == [0, 1, 2, 3]
    assert sum(piece.count for piece in slices.values()) == 4_000
    assert not any(piece.bad for piece in slices.values())
    keys = {key for piece in slices.values() for key, _ in piece.partials}
    assert len(keys) == 1_000
    # sensor-7's records are ids 7, 1007, 2007 and 3007, all of partition 3: COUNT, AVG(reading), SUM(total), MAX(level)
    (state,) = [state for key, state in slices[3].partials if key == b"sensor-7"]
    assert state[0] == [4] and state[2] == [6_028] and state[3] == [7]
    assert state[1][0] == pytest.approx((7 + 1_007 + 2_007 + 3_007) * 0.25)


def test_warm_up_reads_its_own_topic_and_leaves_nothing_behind(spark: SparkSession, kafka: EmbeddedKafka,
                                                               state_dir: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    assert asyncio.run(warm_up_topics(kafka, create="left-by-a-crash"))
    with caplog.at_level(logging.INFO):
        reduced = warm_up_jit(spark, settings(kafka, state_dir, batches=3, triggers=4), batch_records=2_000,
                              trigger_records=100)
    assert reduced == 3 * 2_000 + 4 * 100
    assert "Spark warmed up" in caplog.text
    created = [r.topic for r in caplog.records if r.getMessage() == "created topic"]  # type: ignore[attr-defined]
    assert len(created) == 1 and created[0].startswith(names.warm_up_topic_prefix("millpond", "jit-test"))
    assert eventually_none(kafka) == []  # its own topic and the crash's, deleted
    assert spark.sparkContext._jsc.getPersistentRDDs().isEmpty()  # type: ignore[union-attr]
    assert not spark.streams.active  # its streaming query stopped
    assert not any((state_dir / "jit-test" / "checkpoints").iterdir())  # and its checkpoint went with it
    assert warm_up_jit(spark, settings(kafka, state_dir, triggers=2), trigger_records=100) == 200
    assert warm_up_jit(spark, settings(kafka, state_dir, batches=2), batch_records=2_000) == 4_000
    assert warm_up_jit(spark, settings(kafka, state_dir)) == 0


def test_a_warm_up_whose_triggers_overrun_ends_at_its_time_limit_and_stops_its_query(
        spark: SparkSession, kafka: EmbeddedKafka, state_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="millpond.services.worker.jit")
    assert warm_up_jit(spark, settings(kafka, state_dir, triggers=1_000), trigger_records=1, triggers_timeout_s=0) < 1_000
    assert "Spark's warm-up reached its time limit" in caplog.text and "Spark warmed up" in caplog.text
    assert not spark.streams.active
    assert eventually_none(kafka) == []

