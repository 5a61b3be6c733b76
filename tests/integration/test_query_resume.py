"""A stage's Spark query resumes from a checkpoint written with its tasks' positions, on a real
Spark session and a real broker: its plan, made once from other positions, serves every start
over the same partitions; and one started ahead of its tasks (standing by) takes them over
where each resumes."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pyspark.sql import SparkSession

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.services.worker.jit import reduction_runner
from millpond.services.worker.query_runner import QueryRunner, offset_log_conf, source_offsets
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
    await append(bootstrap, RECORDS)


async def append(bootstrap: str, records: int) -> dict[int, int]:
    """``records`` more records in each partition; the partitions' ends after them."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for i in range(records):
            for partition in (0, 1):
                await producer.send(TOPIC, json.dumps({"READING": i}).encode(), key=b"k%d" % i, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(TOPIC, p) for p in (0, 1)])
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        await consumer.stop()


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
    """The test topic's offsets in Spark's progress or logs (``source_offsets``)."""
    return source_offsets(reported, TOPIC)


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


class Recording:
    """The side of a task that a query's batches reach (``QueryRunner._commit``): the slices
    it is given, and its position moved past each, as a task's commit moves it."""

    def __init__(self, position: int):
        self.next_input_offset: int | None = position
        self.slices: list[tuple[int, int, int]] = []

    async def apply(self, piece: Any) -> bool:
        self.slices.append((piece.first_offset, piece.last_offset, piece.count))
        self.next_input_offset = piece.last_offset + 1
        return True


@pytest.fixture
def standing(spark: SparkSession, kafka: EmbeddedKafka, tmp_path: Path) -> Iterator[QueryRunner]:
    """A runner whose commits run on a loop of their own, its plan made from other positions."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    made = reduction_runner(spark, settings(kafka, tmp_path), STATEMENTS, loop)
    made.name = f"stand-by-test-{time.monotonic_ns()}"
    made.prepare({0: 0, 1: 0})
    try:
        yield made
    finally:
        made.stop()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def committed_through(tasks: dict[int, Recording], ends: dict[int, int], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while any(task.next_input_offset != ends[p] for p, task in tasks.items()):
        assert time.monotonic() < deadline, {p: task.slices for p, task in tasks.items()}
        time.sleep(0.05)


def take_over(standing: QueryRunner, positions: dict[int, int]) -> dict[int, Recording]:
    """Tasks at ``positions`` given to ``standing``, as a move's are (``StageStream._made``)."""
    tasks = {p: Recording(o) for p, o in positions.items()}
    standing.tasks = dict(tasks)  # type: ignore[arg-type]
    standing.start(standing.positions())
    return tasks


def processed(task: Recording) -> tuple[int, int]:
    """Where the first slice a task got began, and how many records all its slices held."""
    return task.slices[0][0], sum(count for *_, count in task.slices)


def test_a_query_standing_by_takes_its_tasks_over_from_where_each_resumes(standing: QueryRunner,
                                                                           kafka: EmbeddedKafka) -> None:
    ends = asyncio.run(append(kafka.bootstrap_servers, 0))
    standing.stand_by({0: 10, 1: 20})
    assert standing.warmed.wait(60), "its first batch was reduced, and is held"
    stream = standing.stream
    assert stream is not None and stream.isActive and not standing.progressed(), "no batch has ended"
    # The tasks that take over resume inside that batch (partition 0) and where it began (1).
    tasks = take_over(standing, {0: ends[0] - 50, 1: 20})
    assert standing.stream is stream, "the query standing by took them over: none was started"
    committed_through(tasks, ends)
    assert processed(tasks[0]) == (ends[0] - 50, 50), "each record from the task's position on, once"
    assert processed(tasks[1]) == (20, ends[1] - 20)
    deadline = time.monotonic() + 30  # a batch's progress is reported once its callback has returned
    while not stream.recentProgress and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stream.recentProgress[0]["batchId"] == 1, "the held batch, then on"


def test_tasks_that_resume_where_it_began_get_its_batches_as_they_are(standing: QueryRunner,
                                                                       kafka: EmbeddedKafka) -> None:
    """A kill's new owner resumes where the group's offsets were when its query stood by: no
    record is set aside (the batches are not filtered), and each is processed once."""
    ends = asyncio.run(append(kafka.bootstrap_servers, 0))
    standing.stand_by({0: 10, 1: 20})
    assert standing.warmed.wait(60), "its first batch was reduced, and is held"
    tasks = take_over(standing, {0: 10, 1: 20})
    assert standing._from is None, "no filter"
    committed_through(tasks, ends)
    assert processed(tasks[0]) == (10, ends[0] - 10) and processed(tasks[1]) == (20, ends[1] - 20)


def test_tasks_that_resume_past_the_held_batch_get_none_of_it(standing: QueryRunner, kafka: EmbeddedKafka) -> None:
    standing.stand_by({0: 10, 1: 20})
    assert standing.warmed.wait(60)
    held = asyncio.run(append(kafka.bootstrap_servers, 0))
    # An older owner went on past the held batch before the move: the next batch holds records
    # from before the tasks' positions and after them.
    ends = asyncio.run(append(kafka.bootstrap_servers, 50))
    tasks = take_over(standing, {0: held[0] + 20, 1: held[1]})
    committed_through(tasks, ends)
    assert processed(tasks[0]) == (held[0] + 20, 30) and processed(tasks[1]) == (held[1], 50)


def test_tasks_that_resume_before_where_it_stood_by_get_a_query_of_their_own(standing: QueryRunner,
                                                                             kafka: EmbeddedKafka) -> None:
    standing.stand_by({0: 10, 1: 20})
    assert standing.warmed.wait(60)
    stream = standing.stream
    tasks = take_over(standing, {0: 5, 1: 20})
    assert standing.stream is not stream and not stream.isActive, "it stopped; a new query started"  # type: ignore[union-attr]
    ends = asyncio.run(append(kafka.bootstrap_servers, 0))
    committed_through(tasks, ends)
    assert processed(tasks[0]) == (5, ends[0] - 5) and processed(tasks[1]) == (20, ends[1] - 20)


def test_a_stop_ends_a_query_standing_by_at_once(standing: QueryRunner) -> None:
    standing.stand_by({0: 10, 1: 20})
    assert standing.warmed.wait(60)
    stream = standing.stream
    started = time.monotonic()
    standing.stop()
    assert time.monotonic() - started < 10 and stream is not None and not stream.isActive
