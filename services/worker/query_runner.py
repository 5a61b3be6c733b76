"""Runs one persistent query on Spark Structured Streaming over this worker's partitions.

Spark does the data-parallel part of each micro-batch: decode the JSON values, filter,
and reduce the batch to one partial aggregate per (partition, key). Only those partials
reach Python, where each task merges and commits its slice exactly once.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import shutil
import tempfile
import time
from collections import defaultdict
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from millpond.services.worker.task import AggregationTask, BadRecord, BatchSlice, Task
from millpond.shared import metrics
from millpond.shared.catalog.queries import PersistentQuery
from millpond.shared.catalog.sources import DataSource
from millpond.shared.config import WorkerSettings
from millpond.shared.kafka.serde import serialize_key, serialize_value
from millpond.shared.sql.expressions import quote_identifier, spark_type

log = logging.getLogger(__name__)
CORRUPT = "_corrupt"
COMMIT_TIMEOUT_S = 120


class QueryRunner:
    """One Spark streaming query feeding a set of tasks of one persistent query."""

    def __init__(self, spark: SparkSession, settings: WorkerSettings, query: PersistentQuery,
                 source: DataSource, sink: DataSource, tasks: dict[int, Task], loop: asyncio.AbstractEventLoop,
                 stage: str = ""):
        self.spark = spark
        self.name = "-".join(filter(None, (query.query_id, stage, settings.worker_id)))
        self.settings = settings
        self.query = query
        self.source = source
        self.sink = sink
        self.tasks = tasks
        self.loop = loop
        self.stream: StreamingQuery | None = None
        self.error: BaseException | None = None
        self.checkpoint = tempfile.mkdtemp(prefix=f"millpond-{self.name}-")
        self.value_schema = ", ".join(
            [f"{quote_identifier(c.name)} {spark_type(c.type)}" for c in source.value_columns]
            + [f"{CORRUPT} STRING"]
        )

    def start(self) -> None:
        """Start the streaming query from each task's committed input offset. Blocking."""
        topic = self.source.topic
        partitions = sorted(self.tasks)
        starting = {str(p): (self.tasks[p].next_input_offset if self.tasks[p].next_input_offset is not None else -2)
                    for p in partitions}
        reader = (
            self.spark.readStream.format("kafka")
            .options(**self.settings.kafka.spark_options())
            .option("assign", json.dumps({topic: partitions}))
            .option("startingOffsets", json.dumps({topic: starting}))
            .option("kafka.isolation.level", "read_committed")
            .option("failOnDataLoss", "false")
        )
        if self.settings.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(self.settings.max_offsets_per_trigger))
        frame = reader.load()
        self.stream = (
            frame.writeStream.foreachBatch(self._on_batch)
            .trigger(processingTime=f"{self.settings.trigger_interval_ms} milliseconds")
            .option("checkpointLocation", self.checkpoint)
            .queryName(self.name)
            .start()
        )
        log.info("query started", extra={"query": self.name, "partitions": partitions,
                                         "starting": starting})

    def failure(self) -> str | None:
        """Why the streaming query stopped by itself, or None while it runs."""
        if self.stream is None or self.stream.isActive:
            return None
        if self.error is not None:  # raised by our own batch code: say it plainly
            return f"{type(self.error).__name__}: {self.error}"
        error = self.stream.exception()
        return str(error).splitlines()[0] if error is not None else "the Spark query stopped"

    def stop(self) -> None:
        """Stop the streaming query (waits for a running batch). Blocking."""
        if self.stream is not None:
            self.stream.stop()
            self.stream = None
        shutil.rmtree(self.checkpoint, ignore_errors=True)

    def _key_expr(self) -> str:
        key = self.source.key_column
        if key is None:
            return "CAST(NULL AS STRING)"
        if key.type.base == "VARCHAR":
            return f"CAST(_key AS STRING) AS {quote_identifier(key.name)}"
        return f"_key AS {quote_identifier(key.name)}"

    def _on_batch(self, batch: DataFrame, batch_id: int) -> None:
        try:
            self._process(batch)
        except BaseException as error:
            self.error = error
            raise

    def _process(self, batch: DataFrame) -> None:
        started = time.monotonic()
        batch.persist()
        try:
            slices = self._reduce(batch)
        finally:
            batch.unpersist()
        if not slices:
            return
        future = asyncio.run_coroutine_threadsafe(self._commit(slices), self.loop)
        future.result(timeout=COMMIT_TIMEOUT_S)
        metrics.BATCH_SECONDS.labels(self.query.query_id).observe(time.monotonic() - started)

    def _reduce(self, batch: DataFrame) -> dict[int, BatchSlice]:
        ranges = batch.groupBy("partition").agg(F.min("offset").alias("lo"), F.max("offset").alias("hi"),
                                                F.count("*").alias("n")).collect()
        if not ranges:
            return {}
        slices = {r["partition"]: BatchSlice(r["lo"], r["hi"], count=r["n"]) for r in ranges}
        parsed = batch.selectExpr(
            "partition AS _partition", "offset AS `_offset`", "key AS _key",
            "CAST(value AS STRING) AS _raw", f"{self._decode()} AS _v",
        )
        keyed = self.source.key_column is not None
        for row in parsed.where(f"_raw IS NOT NULL AND _v.{CORRUPT} IS NOT NULL") \
                .select("_partition", "_offset", "_raw").collect():
            slices[row["_partition"]].bad.append(BadRecord(
                row["_offset"], f"value is not {self.source.value_format} of the declared columns and types",
                row["_raw"]))
        if keyed:
            for row in parsed.where("_key IS NULL AND _raw IS NOT NULL").select("_partition", "_offset", "_raw").collect():
                slices[row["_partition"]].bad.append(BadRecord(row["_offset"], "record has no key", row["_raw"]))
        if self.query.plan.kind == "MATERIALIZE":
            self._latest(parsed, slices)
            return slices
        if self.query.plan.kind == "PROJECT":
            self._project(parsed, slices)
            return slices
        good = self._decoded(parsed, tombstones=False)
        if self.query.plan.where:
            good = good.where(self.query.plan.where)
        columns: list[Any] = []
        shape: list[int] = []
        for i, call in enumerate(self.query.plan.aggregates):
            partials = self._aggregates[i].partials(call.argument)
            shape.append(len(partials))
            columns += [F.expr(p).alias(f"a{i}_{j}") for j, p in enumerate(partials)]
        grouped = good.groupBy("_partition", "_key_bytes").agg(*columns).collect()
        by_partition: dict[int, list[tuple[bytes, list[list[Any]]]]] = defaultdict(list)
        for row in grouped:
            values = list(row)[2:]
            state, at = [], 0
            for width in shape:
                state.append(_plain(values[at:at + width]))
                at += width
            by_partition[row["_partition"]].append((bytes(row["_key_bytes"]), state))
        for partition, partials in by_partition.items():
            slices[partition].partials = partials
        return slices

    def _decoded(self, parsed: DataFrame, tombstones: bool) -> DataFrame:
        """The records that decoded, as the source's columns (plus ``_partition``, ``_offset``,
        ``_key_bytes``, and ``_deleted`` for a tombstone, kept only when ``tombstones``)."""
        valid = f"_v IS NOT NULL AND _v.{CORRUPT} IS NULL"
        if tombstones:
            valid = f"(_raw IS NULL OR {valid})"
        if self.source.key_column is not None:
            valid += " AND _key IS NOT NULL"
        return parsed.where(valid).selectExpr("_partition", "`_offset`", "_key AS `_key_bytes`", self._key_expr(), "_v.*",
                                              "_raw IS NULL AS _deleted")

    def _decode(self) -> str:
        """Spark SQL that parses the record value into the declared columns, PERMISSIVE: a
        record that does not fit gets the corrupt-record column set instead of failing."""
        options = f"'columnNameOfCorruptRecord', '{CORRUPT}', 'mode', 'PERMISSIVE'"
        if self.source.value_format == "DELIMITED":
            sep = self.source.value_delimiter.replace("\\", "\\\\").replace("'", "\\'")
            return f"from_csv(CAST(value AS STRING), '{self.value_schema}', map({options}, 'sep', '{sep}'))"
        return f"from_json(CAST(value AS STRING), '{self.value_schema}', map({options}))"

    def _latest(self, parsed: DataFrame, slices: dict[int, BatchSlice]) -> None:
        """A source table's batch reduced to each key's last record: its value columns, or
        None when that record is a tombstone (a NULL value deletes the key)."""
        names = [c.name for c in self.source.value_columns]
        last = F.max_by(F.struct(F.expr("_raw IS NULL").alias("_deleted"),
                                 *[F.expr(f"_v.{quote_identifier(n)}").alias(f"c{i}") for i, n in enumerate(names)]),
                        F.col("_offset"))
        rows = (parsed.where(f"_key IS NOT NULL AND (_raw IS NULL OR _v.{CORRUPT} IS NULL)")
                .groupBy("_partition", "_key").agg(last.alias("_last")).collect())
        for row in rows:
            latest = row["_last"]
            values = None if latest["_deleted"] else _plain(list(latest)[1:])
            slices[row["_partition"]].latest.append((bytes(row["_key"]), values))

    def _project(self, parsed: DataFrame, slices: dict[int, BatchSlice]) -> None:
        """Spark filters and computes every output column; Python serializes and the task
        produces (the transactional producer is per record anyway). Over a table, a deleted
        row and a row the filter drops become tombstones of its key, in input order."""
        plan = self.query.plan
        sink = self.sink
        table = self.source.kind == "TABLE"
        frame = self._decoded(parsed, tombstones=table)
        passes = F.expr(f"NOT _deleted AND coalesce(({plan.where}), false)" if plan.where else "NOT _deleted")
        if not table:
            frame = frame.where(passes)
        columns = [F.expr(c.expression).alias(f"c{i}") for i, c in enumerate(plan.columns)]
        rows = frame.select("_partition", "_offset", "_key_bytes", passes.alias("_keep"), *columns).collect()
        rows.sort(key=lambda r: (r[0], r[1]))
        key_index = next((i for i, c in enumerate(plan.columns) if c.key), None)
        value_indexes = [i for i, c in enumerate(plan.columns) if not c.key]
        names = [plan.columns[i].name for i in value_indexes]
        key_type = plan.columns[key_index].type if key_index is not None else None
        for row in rows:
            if not row["_keep"]:  # only tables get here: the key's row is gone downstream too
                slices[row[0]].records.append((bytes(row[2]), None))
                continue
            values = _plain(list(row)[4:])
            if plan.key_expression is None:
                key = bytes(row[2]) if row[2] is not None else None
            elif key_index is not None and values[key_index] is not None and key_type is not None:
                key = serialize_key(values[key_index], key_type)
            else:
                slices[row[0]].bad.append(BadRecord(row[1], f"the new key ({plan.key_expression}) is NULL", None))
                continue
            value = serialize_value(names, [values[i] for i in value_indexes], sink.value_format, sink.value_delimiter)
            slices[row[0]].records.append((key, value))

    @property
    def _aggregates(self) -> list[Any]:
        task = next(iter(self.tasks.values()))
        assert isinstance(task, AggregationTask)
        return task.aggregates

    async def _commit(self, slices: dict[int, BatchSlice]) -> None:
        committed = await asyncio.gather(*(self.tasks[p].commit(s) for p, s in slices.items()))
        for (partition, piece), applied in zip(slices.items(), committed, strict=True):
            if applied:
                labels = (self.query.query_id, str(partition))
                metrics.RECORDS_PROCESSED.labels(*labels).inc(piece.count - len(piece.bad))
                metrics.RECORDS_FAILED.labels(*labels).inc(len(piece.bad))


def _plain(values: list[Any]) -> list[Any]:
    """Spark values as JSON-friendly Python values (Decimal and Row become float and dict)."""
    out: list[Any] = []
    for v in values:
        if hasattr(v, "asDict"):
            v = v.asDict()
        elif isinstance(v, list):
            v = _plain(v)
        elif v is not None and type(v).__name__ == "Decimal":
            v = float(v)
        elif isinstance(v, datetime.date):  # datetime too: ISO text, which from_json reads back
            v = v.isoformat()
        out.append(v)
    return out
