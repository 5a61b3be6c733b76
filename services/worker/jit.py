"""The JIT warm-up of a worker's Spark session: before the session takes its first query, it
reduces a few batches of made-up JSON records through the GROUP BY path every query's batches
share (JSON decoding, classification, the aggregates' arguments, Arrow out to Python).

Why: a JVM runs new code interpreted until it is compiled. A worker's first micro-batch took
2.9-6.8 s of Spark for what took 0.4-1.2 s once warm (bench.aggregation, bench.freshness, DEBUG
logs): every batch in a query's first seconds is slow, which set bench.freshness's p99 and
cost bench.aggregation a tenth of its run. The warm-up pays that once, at start, while the
worker offers no copy to take over (``LazySession.ready``), instead of in a query's batches.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from millpond.services.worker.query_runner import QueryRunner
from millpond.services.worker.task import AggregationTask, Task
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import WorkerSettings
from millpond.shared.sql.parser import parse_statement

log = logging.getLogger(__name__)

BATCH_RECORDS = 50_000
"""Records in each warm-up batch: by the fifth of this size a 1-core session reduced a batch in
what a warm one takes (1.03 s, 0.37, 0.28, 0.28, 0.26, then 0.22-0.31)."""
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


def warm_up_jit(spark: SparkSession, settings: WorkerSettings) -> int:
    """Reduce ``settings.spark_warm_up_batches`` batches of ``BATCH_RECORDS`` made-up records
    on ``spark`` (a local master's: its own JVM runs the batches); the records reduced.
    Blocking: about 4 s of a core at 5 batches."""
    batches = settings.spark_warm_up_batches
    if batches <= 0 or not settings.spark_local:
        # On a cluster master the batches run in the executors' JVMs, not this one; and
        # a cluster without a free core would hold the warm-up, so the worker, for good.
        return 0
    started = time.monotonic()
    frame = made_up_records(spark, BATCH_RECORDS).cache()
    loop = asyncio.new_event_loop()  # the runner's commits would run on it; none does here
    try:
        runner = reduction_runner(spark, settings, (STREAM, TABLE), loop)
        frame.count()  # made once: the batches time the reduction, not the making
        reduced = sum(piece.count for _ in range(batches) for piece in runner._reduce(frame).values())
    finally:
        loop.close()
        frame.unpersist()
    log.info("Spark warmed up", extra={"records": reduced, "seconds": round(time.monotonic() - started, 1)})
    return reduced
