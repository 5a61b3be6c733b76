"""What reading a JSON record as ksqlDB reads it costs a persistent query, against a plain
parse of the same records by their keys' own spelling (the least any reader pays), in the
same run, on the worker's own Spark session (same settings, one core).

ksqlDB stores an unquoted name in upper case and finds a field by the name as written, else
by a key that upper-cased is the name; Spark's JSON reader matches the case alone. Producers
write keys in their own spelling, usually as the CREATE statement writes the columns. For a
stream declared in lower case (``sensor VARCHAR KEY, area VARCHAR, reading INT``, as the
readings example) and one in camel case (``sensorId VARCHAR KEY, areaName VARCHAR,
readingValue INT``), and a wider camel-case one (nine INT columns: its records' keys are listed to
search them), records spelled four ways are read by production code (``QueryRunner.read``,
every column of each record forced):

- ``as_stored``: the names as ksqlDB stores them (``AREA``; Millpond's INSERT and sinks);
- ``as_statement``: as the CREATE statement writes them;
- ``lower``: every key in lower case;
- ``mixed``: each record's keys each in a spelling of its own.

``python -m bench.json_read [--records 1000000] [--repeats 5]``
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from bench.common import arguments, emit, ratio
from millpond.services.worker.jit import reduction_runner
from millpond.services.worker.query_runner import PERMISSIVE
from millpond.services.worker.reducers import CORRUPT
from millpond.services.worker.spark import create_session
from millpond.shared.config import WorkerSettings

STATEMENTS = {
    "lower": ("sensor", "area", "reading"),
    "camel": ("sensorId", "areaName", "readingValue"),
    "camel_wide": ("sensorId", "areaName", *(f"reading{i}Value" for i in range(9))),
}
"""Each stream's columns as its CREATE statement writes them: a key, a VARCHAR, then INTs (with
ten value columns a record's keys are listed to search them, ``json_reading.KEYS_LISTED_FROM``)."""

SPELLINGS: dict[str, Callable[[str, int], str]] = {
    "as_stored": lambda name, _: name.upper(),
    "as_statement": lambda name, _: name,
    "lower": lambda name, _: name.lower(),
    "mixed": lambda name, row: name.upper() if row % 3 == 0 else name.lower() if row % 3 == 1 else name[0].upper() + name[1:],
}


def records(spark: SparkSession, count: int, written: tuple[str, ...], spelling: str) -> DataFrame:
    """``count`` rows shaped as the Kafka source's, values spelled as ``spelling`` says (the
    mixed ones three ways, by row), cached."""
    _, area, *readings = written
    spell = SPELLINGS[spelling]
    rows = [F.to_json(F.create_map(F.lit(spell(area, row)), F.concat(F.lit("area-"), (F.col("id") % 97).cast("string")),
                                   *(part for i, reading in enumerate(readings)
                                     for part in (F.lit(spell(reading, row)), ((F.col("id") + i) % 1000).cast("string")))))
            for row in range(3)]
    # A MAP<STRING, STRING> writes the INT as text: the number goes back in unquoted.
    text = F.regexp_replace(F.element_at(F.array(*rows), (F.col("id") % 3 + 1).cast("int")), r'"(\d+)"', "$1")
    frame = spark.range(count, numPartitions=1).select(
        F.lit(0).alias("partition"), F.col("id").alias("offset"),
        F.concat(F.lit("sensor-"), F.col("id") % 1000).cast("binary").alias("key"),
        text.cast("binary").alias("value"), F.timestamp_millis(F.lit(1_700_000_000_000) + F.col("id")).alias("timestamp"),
        F.lit("readings").alias("topic"), F.lit(0).alias("timestampType"))
    frame = frame.cache()
    frame.count()
    return frame


def timed(frame: DataFrame, columns: list[Column], repeats: int) -> float:
    """The median seconds of a job that computes ``columns`` of every row of ``frame``."""
    seconds = []
    for _ in range(repeats + 1):  # the first compiles
        started = time.perf_counter()
        frame.select(F.sum(F.hash(*columns))).collect()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds[1:])


def measure(spark: SparkSession, settings: WorkerSettings, statement: str, written: tuple[str, ...], count: int,
            repeats: int) -> list[dict[str, Any]]:
    key, area, *readings = written
    stream = (f"CREATE STREAM readings ({key} VARCHAR KEY, {area} VARCHAR, {', '.join(f'{r} INT' for r in readings)}) "
              "WITH (kafka_topic='readings', partitions=1, value_format='JSON');")
    table = f"CREATE TABLE per_area AS SELECT {area}, COUNT(*) AS n FROM readings GROUP BY {area};"
    runner = reduction_runner(spark, settings, (stream, table), asyncio.new_event_loop())
    schema = runner.read_schema
    results = []
    for spelling in SPELLINGS:
        frame = records(spark, count, written, spelling)
        # The plain parse: the schema spelled as the records are (the mixed ones as the first third).
        as_written = {name.upper(): name for name in written}
        spelled = T.StructType([T.StructField(f.name if f.name == CORRUPT else SPELLINGS[spelling](as_written[f.name], 0),
                                              f.dataType) for f in schema.fields])
        parsed = F.from_json(F.col("value").cast("string"), spelled, PERMISSIVE)
        plain_s = timed(frame, [parsed.getField(f.name) for f in spelled.fields], repeats)
        read = runner.read(frame)
        read_s = timed(read, [F.col("_v").getField(f.name) for f in schema.fields], repeats)
        bad = read.where(F.col("_v").getField("_corrupt").isNotNull() | F.col("_v").getField(area.upper()).isNull()).count()
        frame.unpersist()
        results.append({"statement": statement, "records_spelled": spelling, "plain_s": round(plain_s, 3),
                        "read_s": round(read_s, 3), "read_to_plain": ratio(read_s, plain_s), "records_unread": bad})
    runner.stop()
    return results


def main() -> None:
    args = arguments(__doc__, records=1_000_000, repeats=5)
    count, repeats = (20_000, 1) if args.smoke else (args.records, args.repeats)
    work = Path(tempfile.mkdtemp(prefix="millpond-bench-"))
    settings = WorkerSettings(state_dir=work / "state", spark_master="local[1]")
    spark = create_session(settings)
    try:
        results = [row for statement, written in STATEMENTS.items()
                   for row in measure(spark, settings, statement, written, count, repeats)]
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    emit({"benchmark": "json_read", "smoke": args.smoke, "records": count, "repeats": repeats,
          "spark_master": settings.spark_master, "reads": results})


if __name__ == "__main__":
    main()
