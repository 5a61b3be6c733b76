"""The JIT warm-up of a worker's Spark session: before the session takes its first query, it
reduces a few batches of made-up JSON records through the GROUP BY path every query's batches
share (JSON decoding, classification, the aggregates' arguments, Arrow out to Python), then
runs a streaming query of many small micro-batches of them through the same reduction.

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
import logging
import tempfile
import threading
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from millpond.services.worker.query_runner import QueryRunner, checkpoint_root
from millpond.services.worker.task import AggregationTask, Task
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import WorkerSettings
from millpond.shared.sql.parser import parse_statement

log = logging.getLogger(__name__)

BATCH_RECORDS = 50_000
"""Records in each warm-up batch: by the fifth of this size a 1-core session reduced a batch in
what a warm one takes (1.03 s, 0.37, 0.28, 0.28, 0.26, then 0.22-0.31)."""
TRIGGER_RECORDS = 1_000
"""Records in each micro-batch of the streaming part: a batch of bench.freshness's size."""
TRIGGERS_TIMEOUT_S = 300
"""The longest the streaming part may take (a busy machine's 60 triggers took about 20 s)."""
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
    """``records`` rows shaped as the Kafka source's (``as_kafka_records``)."""
    return as_kafka_records(spark.range(records, numPartitions=PARTITIONS))


def as_kafka_records(ids: DataFrame) -> DataFrame:
    """A row per number in the ``id`` column, shaped as the Kafka source's (partition, offset,
    key, value, timestamp), each value a JSON object of the warm-up stream's columns, 1,000 keys."""
    return ids.selectExpr(
        f"CAST(id % {PARTITIONS} AS INT) AS partition", "id AS offset",
        "CAST(CONCAT('sensor-', id % 1000) AS BINARY) AS key",
        "CAST(to_json(named_struct('SITE', CONCAT('site-', id % 97), 'READING', id * 0.25, 'TOTAL', id, "
        "'LEVEL', CAST(id % 50 AS INT), 'OK', id % 2 = 0)) AS BINARY) AS value",
        "timestamp_millis(1700000000000 + id) AS timestamp")


def warm_up_jit(spark: SparkSession, settings: WorkerSettings) -> int:
    """Reduce ``settings.spark_warm_up_batches`` batches of ``BATCH_RECORDS`` made-up records
    on ``spark`` (a local master's: its own JVM runs the batches), then
    ``settings.spark_warm_up_triggers`` micro-batches of ``TRIGGER_RECORDS`` in a streaming
    query; the records reduced. Blocking: about 4 s of a core at 5 batches, 9 s more at 60 triggers."""
    batches, triggers = settings.spark_warm_up_batches, settings.spark_warm_up_triggers
    if (batches <= 0 and triggers <= 0) or not settings.spark_local:
        # On a cluster master the batches run in the executors' JVMs, not this one; and
        # a cluster without a free core would hold the warm-up, so the worker, for good.
        return 0
    started = time.monotonic()
    loop = asyncio.new_event_loop()  # the runner's commits would run on it; none does here
    try:
        runner = reduction_runner(spark, settings, (STREAM, TABLE), loop)
        reduced = _reduce_batches(spark, runner, batches) + _reduce_triggers(spark, settings, runner, triggers)
    finally:
        loop.close()
    log.info("Spark warmed up", extra={"records": reduced, "seconds": round(time.monotonic() - started, 1)})
    return reduced


def _reduce_batches(spark: SparkSession, runner: QueryRunner, batches: int) -> int:
    if batches <= 0:
        return 0
    frame = made_up_records(spark, BATCH_RECORDS).cache()
    try:
        frame.count()  # made once: the batches time the reduction, not the making
        return sum(piece.count for _ in range(batches) for piece in runner._reduce(frame).values())
    finally:
        frame.unpersist()


def _reduce_triggers(spark: SparkSession, settings: WorkerSettings, runner: QueryRunner, triggers: int) -> int:
    """Reduce ``triggers`` micro-batches of a streaming query (Spark's rate-micro-batch
    source, shaped as Kafka records); the records reduced. A stop of the session ends it."""
    if triggers <= 0:
        return 0
    reduced: list[int] = []
    done = threading.Event()

    # Defined as a query's stream is (``QueryRunner.start``): the records' columns in the
    # streaming query, each batch of them reduced.
    reduction = runner.reduction(as_kafka_records(
        spark.readStream.format("rate-micro-batch").option("rowsPerBatch", TRIGGER_RECORDS)
        .option("numPartitions", PARTITIONS).load().selectExpr("value AS id")))

    def on_batch(batch: DataFrame, batch_id: int) -> None:
        if len(reduced) < triggers:
            slices = runner._reduced(batch, reduction)
            reduced.append(sum(piece.count for piece in slices.values()))
        if len(reduced) >= triggers:
            done.set()

    root = checkpoint_root(settings)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="warm-up-", dir=root) as checkpoint:
        query = reduction.frame.writeStream.foreachBatch(on_batch).option("checkpointLocation", checkpoint).start()
        try:
            deadline = time.monotonic() + TRIGGERS_TIMEOUT_S
            while not done.wait(0.2) and query.isActive and time.monotonic() < deadline:
                pass
        finally:
            with contextlib.suppress(Exception):  # a stopped session's query has stopped with it
                query.stop()
        if not done.is_set():
            error = query.exception()
            raise error if error is not None else TimeoutError(
                f"the warm-up's streaming query ran {len(reduced)} of its {triggers} micro-batches in "
                f"{TRIGGERS_TIMEOUT_S} s")
    return sum(reduced)
