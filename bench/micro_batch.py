"""Where a micro-batch's time goes, for the readings AVG-by-sensor query at several batch
sizes, on the worker's own Spark session (same settings) over a real broker:

- ``trigger_outside_batch_ms``: Spark's phases of each trigger around the batch, from the
  streaming query's progress (latestOffset, walCommit, commitOffsets, ...: the checkpoint
  bookkeeping every trigger pays);
- ``kafka_read_ms``: a job that only reads the batch's records from Kafka (``count``);
- ``read_and_decode_ms``: a job that reads and parses every JSON value;
- ``reduce_ms``: the worker's whole reduction of a batch (production code: the streaming
  query defined over ``QueryRunner.reduction``'s frame, each batch through
  ``QueryRunner._reduced``): the Spark job that returns each partition's offsets, bad
  records and per-key partials, and Python's grouping of them.

The first two are measured over the same batches, by a streaming query of their own; the
reduction over batches of the same size and offsets, by the worker's. Each includes its own
read of the batch; the differences are the cost of each step. The transactional commit to
Kafka comes after and is not in these figures. ``python -m bench.micro_batch [--sizes 1000,10000,50000]``
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pyspark.sql import DataFrame

from bench.common import arguments, emit, produce_readings
from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.services.worker.jit import reduction_runner
from millpond.services.worker.query_runner import SOURCE_OPTIONS, QueryRunner, for_each_batch
from millpond.services.worker.spark import create_session
from millpond.shared.config import WorkerSettings

PARTITIONS = 4
STREAM = ("CREATE STREAM readings (sensor VARCHAR KEY, area VARCHAR, reading INT) "
          f"WITH (kafka_topic='readings', partitions={PARTITIONS}, value_format='JSON');")
TABLE = "CREATE TABLE avg_readings AS SELECT sensor, AVG(reading) AS avg_reading FROM readings GROUP BY sensor;"


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


def measure(spark: Any, runner: QueryRunner, bootstrap: str, size: int, batches: int, work: Path) -> dict[str, Any]:
    reads: list[dict[str, float]] = []
    reductions: list[dict[str, float]] = []

    def on_read(batch: DataFrame, batch_id: int) -> None:
        timings: dict[str, float] = {}
        started = time.perf_counter()
        records = batch.count()
        timings["kafka_read"] = time.perf_counter() - started
        started = time.perf_counter()
        runner.read(batch).where("_v._corrupt IS NULL").count()
        timings["read_and_decode"] = time.perf_counter() - started
        if records:
            reads.append(timings)

    def records() -> DataFrame:
        frame: DataFrame = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                .option("assign", json.dumps({"readings": list(range(PARTITIONS))}))
                .option("startingOffsets", "earliest").options(**SOURCE_OPTIONS)
                .option("maxOffsetsPerTrigger", str(size)).load())
        return frame

    run(records(), on_read, reads, batches, work / f"read-{size}")
    # The worker's own stream: the records' columns in the streaming query, each batch reduced.
    reduction = runner.reduction(records())

    def on_reduce(batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        slices = runner._reduced(batch, reduction)
        if slices:
            reductions.append({"reduce": time.perf_counter() - started})

    progress = run(reduction.frame, on_reduce, reductions, batches, work / f"reduce-{size}")
    # The first batch pays for code generation and the consumers.
    steady = [read | reduced for read, reduced in zip(reads[1:], reductions[1:], strict=False)]
    outside = [sum(v for k, v in p.items() if k not in ("addBatch", "triggerExecution")) / 1000 for p in progress[1:]]
    return {"batch_records": size, "batches": len(steady),
            "trigger_outside_batch_ms": median_ms(outside) if outside else None,
            **{f"{name}_ms": median_ms([s[name] for s in steady]) for name in steady[0]},
            "reduce_us_per_record": round(statistics.median([s["reduce"] for s in steady]) / size * 1e6, 2)}


def run(frame: DataFrame, on_batch: Any, steps: list[Any], batches: int, checkpoint: Path) -> list[dict[str, Any]]:
    """Run a streaming query of ``frame`` through ``on_batch`` until ``steps`` has ``batches``
    (10 minutes at most); the phases of each trigger with input."""
    stream = (for_each_batch(frame.writeStream, frame.sparkSession, on_batch).trigger(processingTime="100 milliseconds")
              .option("checkpointLocation", str(checkpoint)).start())
    deadline = time.monotonic() + 600
    try:
        while len(steps) < batches and time.monotonic() < deadline and stream.isActive:
            time.sleep(0.1)
        progress = [p["durationMs"] for p in stream.recentProgress if p.get("numInputRows")]
    finally:
        stream.stop()
    if len(steps) < 2:
        raise SystemExit(f"only {len(steps)} batches ran: {stream.exception()}")
    return progress


def main() -> None:
    args = arguments(__doc__, sizes="1000,10000,50000", keys=1000)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.smoke:
        sizes = [1000]
    batches = 3 if args.smoke else 6
    work = Path(tempfile.mkdtemp(prefix="millpond-bench-"))
    broker = EmbeddedKafka(work / "kafka")
    broker.start()
    try:
        async def load() -> float:
            admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
            await admin.start()
            try:
                await admin.create_topics([NewTopic("readings", PARTITIONS, 1)])
            finally:
                await admin.close()
            return await produce_readings(broker.bootstrap_servers, "readings", max(sizes) * (batches + 2),
                                          args.keys, PARTITIONS)

        asyncio.run(load())
        settings = WorkerSettings(state_dir=work / "state")
        spark = create_session(settings)
        runner = reduction_runner(spark, settings, (STREAM, TABLE), asyncio.new_event_loop())
        results = [measure(spark, runner, broker.bootstrap_servers, size, batches, work) for size in sizes]
        spark.stop()
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    emit({"benchmark": "micro_batch", "smoke": args.smoke, "spark_master": settings.spark_master,
          "partitions": PARTITIONS, "keys": args.keys, "sizes": results})


if __name__ == "__main__":
    main()
