"""How Spark reduces one micro-batch of a stage, per plan kind, to a slice per partition.

Each reducer takes the batch parsed by ``QueryRunner`` (``_partition``, ``_offset``,
``_key``, ``_raw`` and the decoded value ``_v``) and fills the slices it is given, one per
input partition in the batch, already holding their offsets and the records that failed
to decode. Only what a task needs to commit reaches Python: per-key partial aggregates,
each key's latest row, or the serialized result records.
"""

from __future__ import annotations

import datetime
from collections import defaultdict
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from millpond.services.worker.task import AggregateSlice, BadRecord, MaterializeSlice, ProjectSlice
from millpond.shared.catalog.queries import PersistentQuery
from millpond.shared.catalog.sources import DataSource
from millpond.shared.kafka.serde import serialize_key, serialize_value
from millpond.shared.sql import aggregates
from millpond.shared.sql.expressions import quote_identifier

CORRUPT = "_corrupt"
"""The column a record value that does not decode is put in (PERMISSIVE parsing)."""


def reduce_aggregate(parsed: DataFrame, query: PersistentQuery, source: DataSource, sink: DataSource,
                     slices: dict[int, AggregateSlice]) -> None:
    """A GROUP BY batch reduced to one partial state per (partition, key): the filter and the
    aggregates' partial forms run in Spark; the task merges the partials into its store."""
    good = decoded(parsed, source, tombstones=False)
    if query.plan.where:
        good = good.where(query.plan.where)
    columns: list[Any] = []
    shape: list[int] = []
    for i, call in enumerate(query.plan.aggregates):
        forms = aggregates.require(call.function).partials(call.argument)
        shape.append(len(forms))
        columns += [F.expr(p).alias(f"a{i}_{j}") for j, p in enumerate(forms)]
    grouped = good.groupBy("_partition", "_key_bytes").agg(*columns).collect()
    by_partition: dict[int, list[tuple[bytes, list[list[Any]]]]] = defaultdict(list)
    for row in grouped:
        values = list(row)[2:]
        state, at = [], 0
        for width in shape:
            state.append(plain(values[at:at + width]))
            at += width
        by_partition[row["_partition"]].append((bytes(row["_key_bytes"]), state))
    for partition, partials in by_partition.items():
        slices[partition].partials = partials


def reduce_project(parsed: DataFrame, query: PersistentQuery, source: DataSource, sink: DataSource,
                   slices: dict[int, ProjectSlice]) -> None:
    """Spark filters and computes every output column; Python serializes and the task
    produces (the transactional producer is per record anyway). Over a table, a deleted
    row and a row the filter drops become tombstones of its key, in input order."""
    plan = query.plan
    table = source.kind == "TABLE"
    frame = decoded(parsed, source, tombstones=table)
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
        values = plain(list(row)[4:])
        if plan.key_expression is None:
            key = bytes(row[2]) if row[2] is not None else None
        elif key_index is not None and values[key_index] is not None and key_type is not None:
            key = serialize_key(values[key_index], key_type)
        else:
            slices[row[0]].bad.append(BadRecord(row[1], f"the new key ({plan.key_expression}) is NULL", None))
            continue
        value = serialize_value(names, [values[i] for i in value_indexes], sink.value_format, sink.value_delimiter)
        slices[row[0]].records.append((key, value))


def reduce_materialize(parsed: DataFrame, query: PersistentQuery, source: DataSource, sink: DataSource,
                       slices: dict[int, MaterializeSlice]) -> None:
    """A source table's batch reduced to each key's last record: its value columns, or
    None when that record is a tombstone (a NULL value deletes the key)."""
    names = [c.name for c in source.value_columns]
    last = F.max_by(F.struct(F.expr("_raw IS NULL").alias("_deleted"),
                             *[F.expr(f"_v.{quote_identifier(n)}").alias(f"c{i}") for i, n in enumerate(names)]),
                    F.col("_offset"))
    rows = (parsed.where(f"_key IS NOT NULL AND (_raw IS NULL OR _v.{CORRUPT} IS NULL)")
            .groupBy("_partition", "_key").agg(last.alias("_last")).collect())
    for row in rows:
        latest = row["_last"]
        values = None if latest["_deleted"] else plain(list(latest)[1:])
        slices[row["_partition"]].latest.append((bytes(row["_key"]), values))


def decoded(parsed: DataFrame, source: DataSource, tombstones: bool) -> DataFrame:
    """The records that decoded, as the source's columns (plus ``_partition``, ``_offset``,
    ``_key_bytes``, and ``_deleted`` for a tombstone, kept only when ``tombstones``)."""
    valid = f"_v IS NOT NULL AND _v.{CORRUPT} IS NULL"
    if tombstones:
        valid = f"(_raw IS NULL OR {valid})"
    if source.key_column is not None:
        valid += " AND _key IS NOT NULL"
    return parsed.where(valid).selectExpr("_partition", "`_offset`", "_key AS `_key_bytes`", _key_expr(source), "_v.*",
                                          "_raw IS NULL AS _deleted")


def _key_expr(source: DataSource) -> str:
    key = source.key_column
    if key is None:
        return "CAST(NULL AS STRING)"
    if key.type.base == "VARCHAR":
        return f"CAST(_key AS STRING) AS {quote_identifier(key.name)}"
    return f"_key AS {quote_identifier(key.name)}"


def plain(values: list[Any]) -> list[Any]:
    """Spark values as JSON-friendly Python values (Decimal and Row become float and dict)."""
    out: list[Any] = []
    for v in values:
        if hasattr(v, "asDict"):
            v = v.asDict()
        elif isinstance(v, list):
            v = plain(v)
        elif v is not None and type(v).__name__ == "Decimal":
            v = float(v)
        elif isinstance(v, datetime.date):  # datetime too: ISO text, which from_json reads back
            v = v.isoformat()
        out.append(v)
    return out
