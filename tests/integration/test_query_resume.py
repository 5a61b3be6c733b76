"""A stage's Spark query resumes from a checkpoint written with its tasks' positions, on a real
Spark session and a real broker: its plan, made once from other positions, serves every start
over the same partitions; a query that Spark began afresh instead commits nothing."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.services.worker import query_runner
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


class Watched:
    """A runner whose batches are looked at, not committed: per batch, its id and each
    partition's first offset and record count."""

    def __init__(self, runner: QueryRunner):
        self.runner = runner
        self.batches: list[tuple[int, dict[int, tuple[int, int]]]] = []
        self.got = threading.Event()
        self.plans = 0
        self.settings: list[dict[str, str]] = []
        """The SQL settings of each batch's offset log entry, up to the first batch with records."""
        made = runner.prepare

        def prepare(positions: dict[int, int | None]) -> None:
            self.plans += 1
            made(positions)
        runner.prepare = prepare  # type: ignore[method-assign]
        runner._process = self._look  # type: ignore[method-assign]
        self._batch_id = -1
        seen = runner._on_batch

        def on_batch(batch: DataFrame, batch_id: int) -> None:
            self._batch_id = batch_id
            seen(batch, batch_id)
        runner._on_batch = on_batch  # type: ignore[method-assign]

    def _look(self, batch: DataFrame) -> None:
        rows = batch.groupBy("_partition").agg(F.min("_offset"), F.count("*")).collect()
        if rows and not self.batches:
            logs = Path(self.runner.checkpoint) / "offsets"
            self.settings = [json.loads((logs / str(n)).read_text().splitlines()[1])["conf"]
                             for n in range(self._batch_id + 1)]
        if rows:
            self.batches.append((self._batch_id, {int(r[0]): (int(r[1]), int(r[2])) for r in rows}))
            self.got.set()

    def first_batch_from(self, positions: dict[int, int | None], timeout_s: float = 60) -> tuple[int, dict[int, tuple[int, int]]]:
        """Start from ``positions``; the first batch with records (the query is stopped after)."""
        self.batches.clear()
        self.got.clear()
        self.runner.start(positions)
        try:
            assert self.got.wait(timeout_s), self.runner.failure()
        finally:
            self.runner.stop()
        return self.batches[0]


@pytest.fixture
def runner(spark: SparkSession, kafka: EmbeddedKafka, tmp_path: Path) -> Iterator[Watched]:
    loop = asyncio.new_event_loop()
    made = reduction_runner(spark, settings(kafka, tmp_path), STATEMENTS, loop)
    made.name = f"resume-test-{time.monotonic_ns()}"
    try:
        yield Watched(made)
    finally:
        made.stop()
        loop.close()


def test_a_plan_made_from_other_positions_starts_the_query_where_its_tasks_resume(runner: Watched) -> None:
    assert offset_log_conf(runner.runner.spark), "this Spark says what its offset log records"
    runner.runner.prepare({0: 10, 1: 20})  # made ahead, before an older owner committed more
    assert runner.runner.fits({0: 30, 1: 50}) and not runner.runner.fits({0: 30})
    batch_id, read = runner.first_batch_from({0: 30, 1: 50})
    assert batch_id == 1, "batch 0 is the one the checkpoint says was committed"
    assert read == {0: (30, RECORDS - 30), 1: (50, RECORDS - 50)}, "each partition from its task's position"
    written, spark_own = runner.settings
    assert written == spark_own, "Spark ran batch 1 with the session's settings, not an old checkpoint's defaults"
    # Started again (a parked query's resume) from elsewhere: the same plan.
    assert runner.first_batch_from({0: 90, 1: 0})[1] == {0: (90, RECORDS - 90), 1: (0, RECORDS)}
    assert runner.plans == 1, "no plan made at the starts"


def test_a_partition_with_no_position_gets_a_plan_from_its_start(runner: Watched) -> None:
    runner.runner.prepare({0: 10, 1: 20})
    assert not runner.runner.fits({0: None, 1: 50})
    batch_id, read = runner.first_batch_from({0: None, 1: 50})
    assert batch_id == 0 and read == {0: (0, RECORDS), 1: (50, RECORDS - 50)}, "the earliest offset, and its own"
    assert runner.plans == 2


def test_a_query_spark_began_afresh_commits_nothing_and_later_plans_hold_their_positions(
        runner: Watched, monkeypatch: pytest.MonkeyPatch) -> None:
    """As if Spark no longer read the checkpoint written for it: its first batch is batch 0,
    from the positions the plan was made with, not the tasks'. It fails the query, and the
    session's plans fit their own positions only from then on."""
    spark = runner.runner.spark
    monkeypatch.setattr(query_runner, "write_resume_point", lambda *_: None)
    runner.runner.prepare({0: 10, 1: 20})
    runner.runner.start({0: 30, 1: 50})
    try:
        deadline = time.monotonic() + 60
        while (failure := runner.runner.failure()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        runner.runner.stop()
        resumable = offset_log_conf(spark)
        fits = runner.runner.fits({0: 30, 1: 50}), runner.runner.fits({0: 10, 1: 20})
        query_runner._OFFSET_LOG_CONF.pop(spark, None)  # the next test's session resumes again
    assert failure is not None and "afresh instead of from the positions {0: 30, 1: 50}" in failure
    assert runner.batches == [], "nothing reached the tasks"
    assert resumable is None and fits == (False, True)
