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
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from services.worker.task import AggregationTask, BadRecord, BatchSlice, Task
from shared import metrics
from shared.catalog import DataSource, PersistentQuery
from shared.config import WorkerSettings
from shared.serde import serialize_key, serialize_value
from shared.sql.expressions import quote_identifier, spark_type

log = logging.getLogger(__name__)
CORRUPT = "_corrupt"
GOOD, BAD_VALUE, NO_KEY, SKIPPED = 0, 1, 2, 3
"""What a record is to its query (``_kind``): used, or to the processing log, or passed over."""
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
        slices = self._reduce(batch)
        if not slices:
            return
        future = asyncio.run_coroutine_threadsafe(self._commit(slices), self.loop)
        future.result(timeout=COMMIT_TIMEOUT_S)
        metrics.BATCH_SECONDS.labels(self.query.query_id).observe(time.monotonic() - started)

    def _reduce(self, batch: DataFrame) -> dict[int, BatchSlice]:
        """The micro-batch as one slice per partition, from a single Spark job: each job
        costs a scheduling round trip of its own (about 0.1-0.3 s in local mode, whatever
        its size), so the offsets, the bad records and the results come back together."""
        frame = self._classified(batch)
        if self.query.plan.kind == "PROJECT":
            return self._project(frame)
        return self._grouped(frame)

    def _classified(self, batch: DataFrame) -> DataFrame:
        """The batch's records with the source's columns decoded and ``_kind``: GOOD for a
        record the query uses, BAD_VALUE or NO_KEY for one that goes to the processing log,
        SKIPPED for one it passes over (a filtered-out or NULL-valued stream record)."""
        plan = self.query.plan
        flat = batch.selectExpr(
            "partition AS _partition", "offset AS `_offset`", "key AS _key", "CAST(value AS STRING) AS _raw",
            f"{self._decode()} AS _v",
        ).selectExpr("_partition", "`_offset`", "_key AS `_key_bytes`", self._key_expr(), "_raw", "_v.*",
                     "_v IS NOT NULL AS _has_value")
        keyed = self.source.key_column is not None
        decoded = f"_has_value AND {CORRUPT} IS NULL"
        if plan.kind == "MATERIALIZE" or (plan.kind == "PROJECT" and self.source.kind == "TABLE"):
            decoded = f"(_raw IS NULL OR {decoded})"  # a tombstone deletes the key's row
        if keyed:
            decoded += " AND _key_bytes IS NOT NULL"
        if plan.kind == "AGGREGATE" and plan.where:
            decoded += f" AND coalesce(({plan.where}), false)"
        no_key = "_key_bytes IS NULL AND _raw IS NOT NULL" if keyed else "false"
        kind = (f"CASE WHEN _raw IS NOT NULL AND {CORRUPT} IS NOT NULL THEN {BAD_VALUE} WHEN {no_key} THEN {NO_KEY} "
                f"WHEN {decoded} THEN {GOOD} ELSE {SKIPPED} END")
        return flat.withColumn("_kind", F.expr(kind))

    def _decode(self) -> str:
        """Spark SQL that parses the record value into the declared columns, PERMISSIVE: a
        record that does not fit gets the corrupt-record column set instead of failing."""
        options = f"'columnNameOfCorruptRecord', '{CORRUPT}', 'mode', 'PERMISSIVE'"
        if self.source.value_format == "DELIMITED":
            sep = self.source.value_delimiter.replace("\\", "\\\\").replace("'", "\\'")
            return f"from_csv(CAST(value AS STRING), '{self.value_schema}', map({options}, 'sep', '{sep}'))"
        return f"from_json(CAST(value AS STRING), '{self.value_schema}', map({options}))"

    def _bad(self, kind: int, offset: int, raw: str | None) -> BadRecord:
        if kind == NO_KEY:
            return BadRecord(offset, "record has no key", raw)
        return BadRecord(offset, f"value is not {self.source.value_format} of the declared columns and types", raw)

    def _grouped(self, frame: DataFrame) -> dict[int, BatchSlice]:
        """GROUP BY queries and source tables: one row per (partition, key) of the GOOD
        records with their partial aggregates or last value, one per bad record, and one
        per partition for the skipped ones; every row carries its offsets and count."""
        bad = f"_kind IN ({BAD_VALUE}, {NO_KEY})"
        results: list[Any] = []
        shape: list[int] = []
        if self.query.plan.kind == "MATERIALIZE":
            names = [c.name for c in self.source.value_columns]
            results = [F.max_by(F.struct(F.expr("_raw IS NULL").alias("_deleted"),
                                         *[F.expr(quote_identifier(n)).alias(f"c{i}") for i, n in enumerate(names)]),
                                F.col("_offset")).alias("_last")]
        else:
            for i, call in enumerate(self.query.plan.aggregates):
                partials = self._aggregates[i].partials(call.argument)
                shape.append(len(partials))
                results += [F.expr(p).alias(f"a{i}_{j}") for j, p in enumerate(partials)]
        rows = frame.groupBy(
            F.col("_partition"), F.col("_kind"), F.expr(f"IF(_kind = {GOOD}, _key_bytes, NULL)").alias("_group"),
            F.expr(f"IF({bad}, `_offset`, NULL)").alias("_bad_offset"),
        ).agg(F.min("_offset").alias("_lo"), F.max("_offset").alias("_hi"), F.count(F.lit(1)).alias("_n"),
              F.max(F.expr(f"IF({bad}, _raw, NULL)")).alias("_bad_raw"), *results).collect()
        slices = _slices(rows)
        for row in rows:
            piece = slices[row["_partition"]]
            if row["_kind"] in (BAD_VALUE, NO_KEY):
                piece.bad.append(self._bad(row["_kind"], row["_bad_offset"], row["_bad_raw"]))
            elif row["_kind"] != GOOD:
                continue
            elif self.query.plan.kind == "MATERIALIZE":
                latest = row["_last"]
                piece.latest.append((bytes(row["_group"]), None if latest["_deleted"] else _plain(list(latest)[1:])))
            else:
                values, state, at = list(row)[8:], [], 0
                for width in shape:
                    state.append(_plain(values[at:at + width]))
                    at += width
                piece.partials.append((bytes(row["_group"]), state))
        for piece in slices.values():
            piece.bad.sort(key=lambda b: b.offset)
        return slices

    def _project(self, frame: DataFrame) -> dict[int, BatchSlice]:
        """Spark filters and computes every output column; Python serializes and the task
        produces (the transactional producer is per record anyway). Over a table, a deleted
        row and a row the filter drops become tombstones of its key, in input order."""
        plan = self.query.plan
        sink = self.sink
        table = self.source.kind == "TABLE"
        passes = F.expr(f"_raw IS NOT NULL AND coalesce(({plan.where}), false)" if plan.where else "_raw IS NOT NULL")
        good = F.expr(f"_kind = {GOOD}")
        columns = [F.when(good, F.expr(c.expression)).alias(f"c{i}") for i, c in enumerate(plan.columns)]
        rows = frame.select("_partition", "_offset", "_key_bytes", "_kind", (good & passes).alias("_keep"),
                            F.expr(f"IF(_kind IN ({BAD_VALUE}, {NO_KEY}), _raw, NULL)"), *columns).collect()
        rows.sort(key=lambda r: (r[0], r[1]))
        slices = _slices([{"_partition": r[0], "_lo": r[1], "_hi": r[1], "_n": 1} for r in rows])
        key_index = next((i for i, c in enumerate(plan.columns) if c.key), None)
        value_indexes = [i for i, c in enumerate(plan.columns) if not c.key]
        names = [plan.columns[i].name for i in value_indexes]
        key_type = plan.columns[key_index].type if key_index is not None else None
        for row in rows:
            piece = slices[row[0]]
            if row[3] in (BAD_VALUE, NO_KEY):
                piece.bad.append(self._bad(row[3], row[1], row[5]))
                continue
            if row[3] != GOOD or not (row[4] or table):
                continue
            if not row[4]:  # only tables get here: the key's row is gone downstream too
                piece.records.append((bytes(row[2]), None))
                continue
            values = _plain(list(row)[6:])
            if plan.key_expression is None:
                key = bytes(row[2]) if row[2] is not None else None
            elif key_index is not None and values[key_index] is not None and key_type is not None:
                key = serialize_key(values[key_index], key_type)
            else:
                piece.bad.append(BadRecord(row[1], f"the new key ({plan.key_expression}) is NULL", None))
                continue
            value = serialize_value(names, [values[i] for i in value_indexes], sink.value_format, sink.value_delimiter)
            piece.records.append((key, value))
        return slices

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


def _slices(rows: Any) -> dict[int, BatchSlice]:
    """Each partition's slice, its offsets and count summed over rows that have
    ``_partition``, ``_lo``, ``_hi`` and ``_n``."""
    spans: dict[int, tuple[int, int, int]] = {}
    for row in rows:
        p = row["_partition"]
        lo, hi, n = spans.get(p, (row["_lo"], row["_hi"], 0))
        spans[p] = (min(lo, row["_lo"]), max(hi, row["_hi"]), n + row["_n"])
    return {p: BatchSlice(lo, hi, count=n) for p, (lo, hi, n) in spans.items()}


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
