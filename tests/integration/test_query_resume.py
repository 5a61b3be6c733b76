"""A stage's Spark query resumes from a checkpoint written with its tasks' positions, on a real
Spark session and a real broker: its plan, made once from other positions, serves every start
over the same partitions."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pyspark.sql import SparkSession

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.services.worker.jit import reduction_runner
from millpond.services.worker.query_runner import QueryRunner, offset_log_conf
from millpond.services.worker.spark import create_session
from millpond.shared.config import WorkerSettings

TOPIC = "resume_readings"
RECORDS = 100
"""Records in each of the topic's two partitions, at offsets 0-99 (no transactions)."""
STATEMENTS = (f"CREATE STREAM resume_readings (id VARCHAR KEY, reading DOUBLE) "
              f"WITH (kafka_topic='{TOPIC}', partitions=2, value_format='JSON');",
              "CREATE TABLE resume_counts AS SELECT id, COUNT(*) AS n FROM resume_readings GROUP BY id;")


async def fill(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(TOPIC, 2, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(RECORDS):
            for partition in (0, 1):
                await producer.send(TOPIC, json.dumps({"READING": i}).encode(), key=b"k%d" % i, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


@pytest.fixture(scope="module")
def spark(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    asyncio.run(fill(kafka.bootstrap_servers))
    session = create_session(settings(kafka, tmp_path_factory.mktemp("state")))
    yield session
    session.stop()


def settings(kafka: EmbeddedKafka, state_dir: Path) -> WorkerSettings:
    return WorkerSettings(worker_id="resume-test", spark_master="local[1]", state_dir=state_dir,
                          kafka_bootstrap_servers=kafka.bootstrap_servers, spark_warm_up_batches=0,
                          spark_warm_up_triggers=0)


def first_batch_from(runner: QueryRunner, positions: dict[int, int | None],
                     timeout_s: float = 60) -> tuple[int, dict[int, int], dict[str, str]]:
    """Start ``runner`` from ``positions`` (its tasks left out: its batches commit nothing) and
    stop it after its first batch with records to read: that batch's id, where it began in each
    partition (Spark's own progress), and the settings its offset log entry records."""
    runner.start(positions)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert runner.stream is not None and runner.failure() is None, runner.failure()
            for progress in runner.stream.recentProgress:
                source = progress["sources"][0]
                began, ended = (offsets(source["startOffset"]), offsets(source["endOffset"]))
                if ended and ended != began:  # the batch had records to read (its job is not run: no task)
                    if progress["batchId"] == 0:  # a fresh query: where its source began, in its own log
                        began = offsets((Path(runner.checkpoint) / "sources" / "0" / "0").read_text().splitlines()[-1])
                    log = (Path(runner.checkpoint) / "offsets" / str(progress["batchId"])).read_text().splitlines()
                    return progress["batchId"], began, json.loads(log[1])["conf"]
            time.sleep(0.05)
        raise AssertionError("no batch had records in time")
    finally:
        runner.stop()


def offsets(reported: Any) -> dict[int, int]:
    """A Kafka source's offsets in Spark's progress (JSON text or parsed; None before any)."""
    read = json.loads(reported) if isinstance(reported, str) else reported
    return {int(p): o for p, o in (read or {}).get(TOPIC, {}).items()}


@pytest.fixture
def runner(spark: SparkSession, kafka: EmbeddedKafka, tmp_path: Path) -> Iterator[QueryRunner]:
    loop = asyncio.new_event_loop()
    made = reduction_runner(spark, settings(kafka, tmp_path), STATEMENTS, loop)
    made.name = f"resume-test-{time.monotonic_ns()}"
    made.prepare({0: 10, 1: 20})  # made ahead, before an older owner committed more
    made.tasks = {}  # what the batches read is looked at through Spark's progress; nothing is committed
    try:
        yield made
    finally:
        made.stop()
        loop.close()


def test_a_plan_made_from_other_positions_starts_the_query_where_its_tasks_resume(runner: QueryRunner) -> None:
    assert offset_log_conf(runner.spark), "this Spark says what its offset log records"
    assert runner.fits({0: 30, 1: 50}) and not runner.fits({0: 30})
    plan = runner._prepared
    batch_id, began, recorded = first_batch_from(runner, {0: 30, 1: 50})
    assert batch_id == 1, "batch 0 is the one the checkpoint says was committed"
    assert began == {0: 30, 1: 50}, "each partition from its task's position"
    assert recorded == offset_log_conf(runner.spark), "Spark ran batch 1 with the session's settings"
    # Started again (a parked query's resume) from elsewhere: the same plan.
    assert first_batch_from(runner, {0: 90, 1: 0})[:2] == (1, {0: 90, 1: 0})
    assert runner._prepared is plan, "no plan made at the starts"


def test_a_partition_with_no_position_gets_a_plan_from_its_start(runner: QueryRunner) -> None:
    plan = runner._prepared
    assert not runner.fits({0: None, 1: 50})
    batch_id, began, _ = first_batch_from(runner, {0: None, 1: 50})
    assert batch_id == 0 and began == {0: 0, 1: 50}, "the earliest offset, and its own"
    assert runner._prepared is not plan
