"""The JIT warm-up of a worker's Spark session: before the session takes its first query, it
reduces a few batches of made-up JSON records through the GROUP BY path every query's batches
share (JSON decoding, classification, the aggregates' arguments, Arrow out to Python), then
runs a streaming query of many small micro-batches of them through the same reduction, read
from Kafka as a query's input is (from a topic of the warm-up's own).

Why: a JVM runs new code interpreted until it is compiled. A worker's first micro-batch took
2.9-6.8 s of Spark for what took 0.4-1.2 s once warm (bench.aggregation, bench.freshness, DEBUG
logs): every batch in a query's first seconds is slow, which set bench.freshness's p99 and
cost bench.aggregation a tenth of its run. The big batches compile the per-record code. The
per-batch code (the streaming engine's trigger, the plan's analysis and planning, the job's
scheduling: thousands of methods, each called a few times a batch) needs hundreds of batches:
without the small ones, a worker's JIT compilers took 40-70% of its JVM's CPU for the first
90 s under bench.freshness's load, and a batch of 1k records took 200 ms of Spark at first,
90 ms after. The warm-up pays that once, at start, while the worker offers no copy to take
over (``LazySession.ready``), instead of in a query's batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from pyspark.sql import DataFrame, SparkSession

from millpond.services.worker.query_runner import SOURCE_OPTIONS, QueryRunner, checkpoint_root, for_each_batch
from millpond.services.worker.task import AggregationTask, Task
from millpond.shared.catalog import names
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import WorkerSettings
from millpond.shared.kafka.admin import delete_topics, ensure_topic
from millpond.shared.kafka.connection import KafkaConnection, start_client
from millpond.shared.sql.parser import parse_statement

log = logging.getLogger(__name__)

BATCH_RECORDS = 50_000
"""Records in each warm-up batch: by the fifth of this size a 1-core session reduced a batch in
what a warm one takes (1.03 s, 0.37, 0.28, 0.28, 0.26, then 0.22-0.31)."""
TRIGGER_RECORDS = 1_000
"""Records in each micro-batch of the streaming part: a batch of bench.freshness's size."""
TRIGGERS_TIMEOUT_S = 60
"""The longest the streaming part may take: 250 triggers took about 50 s beside bench.freshness's
load, but more than 190 s on a worker added to bench.failover's cluster, whose pulls keep both
cores busy. A worker offers no copy to take over until its warm-up has ended, so beyond this
it takes over with the part of the per-batch path its triggers so far compiled."""
WARM_UP_RETENTION_MS = 600_000
"""How long a warm-up topic keeps its records: one a crash left behind holds none for long."""
PARTITIONS = 4
STREAM = ("CREATE STREAM warm_up (id VARCHAR KEY, site VARCHAR, reading DOUBLE, total BIGINT, level INT, ok BOOLEAN) "
          f"WITH (kafka_topic='warm_up', partitions={PARTITIONS}, value_format='JSON');")
TABLE = ("CREATE TABLE warm_up_table AS SELECT id, COUNT(*) AS n, AVG(reading) AS r, SUM(total) AS t, "
         "MAX(level) AS l FROM warm_up GROUP BY id;")


def reduction_runner(spark: SparkSession, settings: WorkerSettings, statements: tuple[str, ...],
                     loop: asyncio.AbstractEventLoop) -> QueryRunner:
    """A QueryRunner of the query the last of ``statements`` makes, whose tasks are built but
    not started: only its reduction (``QueryRunner._reduce``) may run. Nothing is opened."""
    meta = Metastore()
    for version, statement in enumerate(statements):
        meta.apply(parse_statement(statement), version)
    query = next(iter(meta.queries.values()))
    source, sink = meta.source(query.source), meta.source(query.sink)
    tasks: dict[int, Task[Any]] = {p: AggregationTask(settings, query, source, sink, p) for p in range(source.partitions)}
    return QueryRunner(spark, settings, query, source, sink, tasks, loop)


def made_up_records(spark: SparkSession, records: int) -> DataFrame:
    """``records`` rows shaped as the Kafka source's (partition, offset, key, value,
    timestamp), each value a JSON object of the warm-up stream's columns, 1,000 keys."""
    return spark.range(records, numPartitions=PARTITIONS).selectExpr(
        f"CAST(id % {PARTITIONS} AS INT) AS partition", "id AS offset",
        "CAST(CONCAT('sensor-', id % 1000) AS BINARY) AS key",
        "CAST(to_json(named_struct('SITE', CONCAT('site-', id % 97), 'READING', id * 0.25, 'TOTAL', id, "
        "'LEVEL', CAST(id % 50 AS INT), 'OK', id % 2 = 0)) AS BINARY) AS value",
        "timestamp_millis(1700000000000 + id) AS timestamp")


def warm_up_jit(spark: SparkSession, settings: WorkerSettings, *, batch_records: int = BATCH_RECORDS,
                trigger_records: int = TRIGGER_RECORDS, triggers_timeout_s: float = TRIGGERS_TIMEOUT_S) -> int:
    """Reduce ``settings.spark_warm_up_batches`` batches of ``batch_records`` made-up records
    on ``spark`` (a local master's: its own JVM runs the batches), then
    ``settings.spark_warm_up_triggers`` micro-batches of ``trigger_records`` that a streaming
    query reads from Kafka (a topic of its own, deleted after), or as many of those as
    ``triggers_timeout_s`` allows; the records reduced. Blocking: on an idle 1-core session,
    cold, 29 s at 5 batches and 250 triggers."""
    batches, triggers = settings.spark_warm_up_batches, settings.spark_warm_up_triggers
    if (batches <= 0 and triggers <= 0) or not settings.spark_local:
        # On a cluster master the batches run in the executors' JVMs, not this one; and
        # a cluster without a free core would hold the warm-up, so the worker, for good.
        return 0
    started = time.monotonic()
    loop = asyncio.new_event_loop()  # the admin client's; the runner's commits would run on it, none does here
    try:
        runner = reduction_runner(spark, settings, (STREAM, TABLE), loop)
        reduced = (_reduce_batches(spark, runner, batches, batch_records)
                   + _reduce_triggers(spark, settings, runner, triggers, trigger_records, loop, triggers_timeout_s))
    finally:
        loop.close()
    log.info("Spark warmed up", extra={"records": reduced, "seconds": round(time.monotonic() - started, 1)})
    return reduced


def _reduce_batches(spark: SparkSession, runner: QueryRunner, batches: int, records: int) -> int:
    if batches <= 0:
        return 0
    frame = made_up_records(spark, records).cache()
    try:
        frame.count()  # made once: the batches time the reduction, not the making
        return sum(piece.count for _ in range(batches) for piece in runner._reduce(frame).values())
    finally:
        frame.unpersist()


def _reduce_triggers(spark: SparkSession, settings: WorkerSettings, runner: QueryRunner, triggers: int,
                     records: int, loop: asyncio.AbstractEventLoop, timeout_s: float) -> int:
    """Reduce ``triggers`` micro-batches of ``records`` made-up records each, read by a
    streaming query over the Kafka source from a topic of the warm-up's own; the records
    reduced. A stop of the session ends it, and so does ``timeout_s``."""
    if triggers <= 0:
        return 0
    reduced: list[int] = []
    done = threading.Event()

    def on_batch(batch: DataFrame, batch_id: int) -> None:
        if len(reduced) < triggers:
            slices = runner._reduced(batch, reduction)
            reduced.append(sum(piece.count for piece in slices.values()))
        if len(reduced) >= triggers:
            done.set()

    root = checkpoint_root(settings)
    root.mkdir(parents=True, exist_ok=True)
    with warm_up_topic(spark, settings, triggers * records, loop) as topic, \
            tempfile.TemporaryDirectory(prefix="warm-up-", dir=root) as checkpoint:
        # Read as a query's input is (``QueryRunner.start``), so the Kafka source's JVM code
        # (offsets, fetches, the records' rows) is compiled too: a warm-up that read Spark's
        # rate source left it cold (bench.freshness p99 after the first 30 s 469-511 ms,
        # against 392-458 reading Kafka, three alternated pairs).
        reduction = runner.reduction(
            spark.readStream.format("kafka").options(**settings.kafka.spark_options())
            .option("assign", json.dumps({topic: list(range(PARTITIONS))})).option("startingOffsets", "earliest")
            .options(**SOURCE_OPTIONS).option("maxOffsetsPerTrigger", str(records)).load())
        query = for_each_batch(reduction.frame.writeStream, spark, on_batch).option("checkpointLocation", checkpoint).start()
        try:
            deadline = time.monotonic() + timeout_s
            while not done.wait(0.2) and query.isActive and time.monotonic() < deadline:
                pass
        finally:
            with contextlib.suppress(Exception):  # a stopped session's query has stopped with it
                query.stop()
        if not done.is_set():
            error = query.exception()
            if error is not None:
                raise error
            log.info("Spark's warm-up reached its time limit", extra={"triggers": len(reduced), "of": triggers,
                                                                      "seconds": timeout_s})
    return sum(reduced)


@contextlib.contextmanager
def warm_up_topic(spark: SparkSession, settings: WorkerSettings, records: int,
                  loop: asyncio.AbstractEventLoop) -> Iterator[str]:
    """A new topic of ``PARTITIONS`` partitions holding ``records`` made-up records (written
    by Spark's Kafka sink, a quarter in each partition, so that a trigger limited to n records
    reads n), deleted when the block ends. The worker's warm-up topics that a
    crash left behind are deleted first."""
    prefix = names.warm_up_topic_prefix(settings.service_id, settings.worker_id)
    topic = prefix + uuid.uuid4().hex[:12]
    loop.run_until_complete(_replace_topics(settings.kafka, prefix, topic))
    try:
        # A producer of its own (Spark caches its Kafka producers by their settings): the cached
        # one of an earlier warm-up still asks for the topics that warm-up deleted, and once
        # re-sent a new topic's first batch from sequence 0 after 62 were in (the broker's
        # OutOfOrderSequenceException for 120 s, then the write failed).
        (made_up_records(spark, records).select("partition", "key", "value").write.format("kafka")
         .options(**settings.kafka.spark_options()).option("kafka.client.id", f"{topic}-writer")
         .option("topic", topic).save())
        yield topic
    finally:
        loop.run_until_complete(_replace_topics(settings.kafka, prefix, None))


async def _replace_topics(kafka: KafkaConnection, prefix: str, topic: str | None) -> None:
    """Delete the topics whose names start with ``prefix``, then create ``topic`` (unless None)."""
    admin = AIOKafkaAdminClient(**kafka.client_args())
    try:
        await start_client(admin)
        await delete_topics(admin, [name for name in await admin.list_topics() if name.startswith(prefix)])
        if topic is not None:
            # A crash's topic keeps no records for long (the topic itself stays until next start).
            await ensure_topic(admin, topic, PARTITIONS, configs={"retention.ms": str(WARM_UP_RETENTION_MS)})
    finally:
        await admin.close()
