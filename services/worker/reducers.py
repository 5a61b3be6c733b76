"""How Spark reduces one micro-batch of a stage, per plan kind, to a slice per partition.

Each kind's reduction (``Reduction``) comes in two parts. Its ``frame`` is what each record
becomes, computed from the records parsed by ``QueryRunner`` (``_partition``, ``_offset``,
``_key``, ``_raw`` and the decoded value ``_v``): decoded, classified, filtered and
projected, record by record. The runner makes it once, in the definition of its streaming
query, so Spark analyses it when the query starts, not in every batch. Its ``reduce`` takes a
batch of that frame to one slice per input partition in the batch, from ONE Spark job: each
job costs a scheduling round trip of its own (0.1-0.3 s in local mode, whatever its size), so
the offsets, the records that go to the processing log and the results come back in the
same collect, without a persist. Only what a task needs to commit reaches Python: per-key
partial aggregates, each key's latest row, or the serialized result records.
"""

from __future__ import annotations

import base64
import datetime
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors.exceptions.captured import unwrap_spark_exception
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.serializers import ArrowCollectSerializer
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.window import Window
from pyspark.util import _load_from_socket

from millpond.services.worker import reasons
from millpond.services.worker.joining import JoinSlice
from millpond.services.worker.state.table_topic import LeftOut, TableRecords
from millpond.services.worker.table_joining import KeyedSlice, rekeyed
from millpond.services.worker.task import (
    AggregateSlice,
    BadRecord,
    MaterializeSlice,
    ProjectSlice,
    RegroupSlice,
    SessionSlice,
    SliceT,
    WindowSlice,
)
from millpond.shared.catalog.plans import PlanKind
from millpond.shared.catalog.queries import PersistentQuery, QueryPlan
from millpond.shared.catalog.sources import WINDOW_END, WINDOW_START, Column, DataSource, WindowSpec
from millpond.shared.catalog.topology import CHANGED_COLUMN, PLACE_COLUMNS, ROWTIME_COLUMN, join_input
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.serde import (
    WINDOW_START_BYTES,
    composite_key_type,
    encode_key,
    key_decoder,
    serialize_key,
    serialize_value,
    window_key_bytes,
    windowed_key,
)
from millpond.shared.sql import aggregates
from millpond.shared.sql.expressions import quote_identifier
from millpond.shared.sql.planner import exploded_rows

CORRUPT = "_corrupt"
"""The column a record value that does not decode is put in (PERMISSIVE parsing)."""
WINDOW_KEY = "_window_key"
"""A windowed table's record key as it is (the key, then the window's bounds), beside ``_key``,
the key alone."""
KEY_ALONE = "__millpond_key_alone"
"""A windowed table's key without its window, in a classified frame (beside ``_key_bytes``, the whole)."""

GOOD, BAD_VALUE, NO_KEY, SKIPPED, NO_TIME, LATE = 0, 1, 2, 4, 8, 16
"""What a record is to its query (``_kind``): GOOD for one it uses; BAD_VALUE and NO_KEY
(both bits for a record with neither) for one that goes to the processing log; SKIPPED for
one it passes over (a stream's tombstone, or a record a GROUP BY's WHERE drops). A windowed
aggregation adds NO_TIME (a record without a usable event time, to the log) and LATE (a
record and one of its windows, closed before the record came: to the log)."""

_FIXED = ("_partition", "_kind", "_group", "_bad_offset", "_lo", "_hi", "_n", "_bad_raw")
"""The columns every grouped row starts with; a kind's results follow them."""


@dataclass(frozen=True)
class Reduction(Generic[SliceT]):
    """How one query reduces its batches: ``frame``, each record's columns from the parsed
    records (record by record, no shuffle; made and analysed once per Spark query), and
    ``reduce``, a batch of ``frame`` and the tasks it is for (by partition) to each partition's
    slice, in one Spark job."""

    frame: DataFrame
    reduce: Callable[[DataFrame, Mapping[int, Any]], dict[int, SliceT]]


def arrow_table(batch: DataFrame) -> pa.Table:
    """The batch's rows as one Arrow table, from one Spark job: ``DataFrame.toArrow`` less
    what it asks the JVM again in every batch (two settings, the schema as JSON, the job's
    call site set and reset: 22 calls into the JVM against 8, each a wait for the worker's
    interpreter lock and the JVM's threads; a 100-row batch on an idle session 13-15 ms
    against 10.5-12.7 at the median). The columns keep the Arrow types Spark sends, which
    are ``toArrow``'s for the worker's session (UTC, no large string types); an empty batch
    takes them from its schema."""
    collecting = batch._jdf.collectAsArrowToPython()  # a Java array: each item is one more call
    port, secret, server = collecting[0], collecting[1], collecting[2]
    try:
        with _load_from_socket((port, secret), ArrowCollectSerializer()) as stream:  # type: ignore[no-untyped-call]
            results = list(stream)
    finally:
        with unwrap_spark_exception():  # the job's error, as toArrow raises it
            server.getResult()
    batches, order = results[:-1], results[-1]
    if not batches:
        return to_arrow_schema(batch.schema, timezone="UTC").empty_table()
    return pa.Table.from_batches([batches[i] for i in order])


def aggregate_reduction(parsed: DataFrame, query: PersistentQuery, source: DataSource, sink: DataSource,
                        tasks: Mapping[int, Any]) -> Reduction[AggregateSlice]:
    """A GROUP BY batch reduced to one partial state per (partition, key). When every
    aggregate has Arrow forms (``arrow_aggregate``), Spark decodes, filters and computes the
    arguments in one narrow stage and Arrow groups; else the aggregates' partial forms run in
    Spark, grouped by a shuffle, as do a table aggregation's, whose rows are added or
    retracted (``aggregates.Aggregate.undo``)."""
    frame = classify(parsed, source, tombstones=False, where=query.plan.where)
    signed = query.plan.regrouped is not None
    if not signed:
        arguments, arrow = _arguments(frame, query, source)
        if arrow is not None:
            return arrow_aggregate(frame, arguments, arrow, source)
    columns, shape = partial_columns(query.plan, signed)
    # When the records changed the group (a table aggregation's retraction: when its row left).
    changed = f"coalesce({quote_identifier(CHANGED_COLUMN)}, ROWTIME)" if CHANGED_COLUMN in source.schema else "ROWTIME"
    latest = F.max(F.expr(f"IF(_kind = {GOOD}, {changed}, NULL)")).alias("_time")  # after the partials

    def reduce(batch: DataFrame, tasks: Mapping[int, Any]) -> dict[int, AggregateSlice]:
        rows = grouped(batch, [*columns, latest]).collect()
        slices = spans(rows, AggregateSlice, source)
        for row in rows:
            if row["_kind"] == GOOD:
                piece, group = slices[row["_partition"]], bytes(row["_group"])
                piece.partials.append((group, states(row, len(_FIXED), shape)))
                if row["_time"] is not None:
                    piece.times[group] = row["_time"]
        return slices
    return Reduction(frame, reduce)


_ARROW_EXACT = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType, T.StringType, T.BooleanType)
"""Argument types Arrow's min and max order exactly as Spark does (floating point is not:
Spark orders NaN above every number, Arrow skips it)."""
_ARROW_SUMMABLE = (*_ARROW_EXACT, T.FloatType, T.DoubleType)
"""Argument types Arrow's count and sum take with Spark's results."""


_ARGUMENTS: dict[tuple[Any, QueryPlan, DataSource], tuple[list[SparkColumn], T.StructType]] = {}
"""Per (Spark context, plan, source) seen: the aggregates' arguments and their types."""


def _arguments(frame: DataFrame, query: PersistentQuery, source: DataSource) -> tuple[list[SparkColumn], list[tuple[str, ...]] | None]:
    """The aggregates' arguments as Spark columns (``a<i>``), and their Arrow forms when every
    aggregate has them for its argument's type (``arrow_forms``). Made once per plan, not per
    Spark query: a partition that moves in gets a query of its own (``QueryRunner.reduction``),
    and each Column function is a call into the JVM, their types Spark's analysis (~10 ms). A
    Column is an expression, not bound to a DataFrame; a context's are its own."""
    key = (frame.sparkSession.sparkContext, query.plan, source)  # a frame's session object may be its own
    known = _ARGUMENTS.get(key)
    if known is None:
        if len(_ARGUMENTS) >= 256:
            _ARGUMENTS.clear()
        arguments = [F.expr(call.argument).alias(f"a{i}") for i, call in enumerate(query.plan.aggregates)]
        known = _ARGUMENTS[key] = (arguments, frame.select(*arguments).schema)
    return known[0], arrow_forms(known[1], query)


def arrow_forms(arguments: T.StructType, query: PersistentQuery) -> list[tuple[str, ...]] | None:
    """Each aggregate's Arrow forms, when every one has them for its argument's type (the
    ``arguments`` schema, one field per aggregate); None: the batch is reduced in Spark."""
    out = []
    for call, field in zip(query.plan.aggregates, arguments.fields, strict=True):
        forms = aggregates.of(call.function, call.literals).arrow
        exact = all(form in ("count", "sum") for form in forms)
        if not forms or not isinstance(field.dataType, _ARROW_SUMMABLE if exact else _ARROW_EXACT):
            return None
        out.append(forms)
    return out


def arrow_aggregate(frame: DataFrame, arguments: list[Any], forms: list[tuple[str, ...]],
                    source: DataSource) -> Reduction[AggregateSlice]:
    """The batch's records, decoded, classified and with each aggregate's argument computed
    in one narrow Spark stage, come back as one Arrow table (no shuffle, no Python row per
    record); Arrow's hash aggregation gives each partition's offsets and count and each
    (partition, key)'s partials, and the bad records are read out of it."""
    selected = frame.select(
        "_partition", "_offset", "_kind", F.expr(f"IF(_kind = {GOOD}, _key_bytes, NULL)").alias("_group"),
        F.expr(f"IF(_kind IN ({_BAD}), _raw, NULL)").alias("_bad_raw"), F.col("ROWTIME").alias("_time"), *arguments)
    wanted = [(f"a{i}", form) for i, each in enumerate(forms) for form in each] + [("_time", "max")]

    def reduce(batch: DataFrame, tasks: Mapping[int, Any]) -> dict[int, AggregateSlice]:
        table = arrow_table(batch)
        kind = table["_kind"]
        rows: list[dict[str, Any]] = [
            {"_partition": r["_partition"], "_lo": r["_offset_min"], "_hi": r["_offset_max"], "_n": r["_offset_count"],
             "_kind": SKIPPED, "_bad_offset": None, "_bad_raw": None}
            for r in table.group_by("_partition").aggregate(
                [("_offset", "min"), ("_offset", "max"), ("_offset", "count")]).to_pylist()]
        bad = table.filter(pc.and_(pc.not_equal(kind, GOOD), pc.not_equal(kind, SKIPPED)))
        rows += [{"_partition": r["_partition"], "_lo": r["_offset"], "_hi": r["_offset"], "_n": 0,
                  "_kind": r["_kind"], "_bad_offset": r["_offset"], "_bad_raw": r["_bad_raw"]}
                 for r in bad.select(["_partition", "_offset", "_kind", "_bad_raw"]).to_pylist()]
        slices = spans(rows, AggregateSlice, source)
        partials = table.filter(pc.equal(kind, GOOD)).group_by(["_partition", "_group"],
                                                               use_threads=False).aggregate(wanted)
        for row in partials.to_pylist():
            state = [plain([row[f"a{i}_{form}"] for form in each]) for i, each in enumerate(forms)]
            piece, group = slices[row["_partition"]], bytes(row["_group"])
            piece.partials.append((group, state))
            if row["_time_max"] is not None:
                piece.times[group] = row["_time_max"]
        return slices
    return Reduction(selected, reduce)


def project_reduction(parsed: DataFrame, query: PersistentQuery, source: DataSource, sink: DataSource,
                      tasks: Mapping[int, Any]) -> Reduction[ProjectSlice]:
    """Spark filters and computes every output column; Python serializes and the task
    produces (the transactional producer is per record anyway). Over a table, a deleted
    row and a row the filter drops become tombstones of its key, in input order.

    Every record comes back (a skipped one as its partition and offset only), so the one
    job also gives each partition's offsets and count. A table aggregation's regrouping
    (REGROUP) gets a ``RegroupSlice``: each record's offset and table key beside it, and a
    tombstone of the table key for a row whose group key is NULL or cannot be written (logged
    too), as it leaves its group."""
    plan = query.plan
    table = source.kind == "TABLE"
    regroup = plan.kind is PlanKind.REGROUP
    frame = classify(parsed, source, tombstones=table, where=None)
    good = F.expr(f"_kind = {GOOD}")
    passes = F.expr(f"_raw IS NOT NULL AND coalesce(({plan.where}), false)" if plan.where else "_raw IS NOT NULL")
    columns = [F.when(good & passes, F.expr(c.expression)).alias(f"c{i}") for i, c in enumerate(plan.columns)]
    keys = [c for c in plan.columns if c.key]
    if len(keys) > 1 and plan.key_expression is not None:  # a key of several columns, re-keyed: one struct
        columns.append(F.when(good & passes, F.expr(plan.key_expression)).alias(f"c{len(plan.columns)}"))
    selected = frame.select("_partition", "_offset", "_key_bytes", "_kind", (good & passes).alias("_keep"),
                            F.expr(f"IF(_kind IN ({_BAD}), _raw, NULL)").alias("_bad_raw"), "_rowtime", *columns)
    slice_type: type[ProjectSlice] = RegroupSlice if regroup else ProjectSlice
    key_index = next((i for i, c in enumerate(plan.columns) if c.key), None)
    value_indexes = [i for i, c in enumerate(plan.columns) if not c.key]
    exploded = [i for i, c in enumerate(plan.columns) if c.exploded]
    names = [plan.columns[i].name for i in value_indexes]
    key_type = plan.columns[key_index].type if key_index is not None else None
    if len(keys) > 1:
        key_index, key_type = len(plan.columns), composite_key_type([(c.name, c.type) for c in keys])
    decode = key_decoder(source.key_columns) if regroup and len(source.key_columns) > 1 else None

    def reduce(batch: DataFrame, tasks: Mapping[int, Any]) -> dict[int, ProjectSlice]:
        rows = batch.collect()
        rows.sort(key=lambda r: (r[0], r[1]))
        slices = spans([{"_partition": r[0], "_kind": r[3], "_bad_offset": r[1], "_bad_raw": r[5],
                         "_lo": r[1], "_hi": r[1], "_n": 1} for r in rows], slice_type, source)
        for row in rows:
            piece = slices[row[0]]
            if row[3] != GOOD:
                continue
            if regroup:
                assert isinstance(piece, RegroupSlice)
                table_key = bytes(row[2])
                if decode is not None:  # a JSON key as the table's own store writes it: one row, one entry
                    try:
                        table_key = encode_key(decode(table_key), source.key_columns)
                    except (MillpondError, ValueError, TypeError, KeyError, ArithmeticError, RecursionError) as error:
                        piece.bad.append(BadRecord(row[1], f"{reasons.bad_key(source)}: {error}",
                                                   table_key.decode(errors="replace")))
                        continue
                piece.inputs.append((row[1], table_key))
            if not row[4]:
                if table:  # the key's row is gone downstream too
                    piece.records.append((bytes(row[2]), None))
                    piece.timestamps.append(row[6])
                continue
            values = plain(list(row)[7:])
            if plan.key_expression is None:
                key = bytes(row[2]) if row[2] is not None else None
            elif key_index is not None and values[key_index] is not None and key_type is not None:
                try:
                    key = serialize_key(values[key_index], key_type)
                except (MillpondError, ValueError, ArithmeticError) as error:
                    piece.bad.append(BadRecord(row[1], f"the new key ({plan.key_expression}) cannot be written: {error}",
                                               None))
                    key = None
            else:
                piece.bad.append(BadRecord(row[1], f"the new key ({plan.key_expression}) is NULL", None))
                key = None
            if key is None and plan.key_expression is not None:
                if regroup:  # the row is in no group
                    piece.records.append((bytes(row[2]), None))
                    piece.timestamps.append(row[6])
                continue
            try:
                written = [serialize_value(names, [made[i] for i in value_indexes], sink.value_format, sink.value_delimiter)
                           for made in exploded_rows(values, exploded)]
            except ValueError as error:
                piece.bad.append(BadRecord(row[1], f"the row cannot be written as {sink.value_format}: {error}", None))
                continue
            piece.records.extend((key, value) for value in written)
            piece.timestamps.extend(row[6] for _ in written)
        return slices
    return Reduction(selected, reduce)



def join_reduction(parsed: DataFrame, query: PersistentQuery, source: DataSource, sink: DataSource,
                   tasks: Mapping[int, Any]) -> Reduction[JoinSlice]:
    """A stream-table join's batch: every usable stream record in offset order with its join
    key (the record key: the stream's key, or behind a repartition the join expression's
    value), its event time and the stream's columns; the task joins them with the table."""
    spec = query.plan.join
    assert spec is not None
    frame = classify(parsed, source, tombstones=False, where=None)
    # ROWTIME of a join's stream records: the TIMESTAMP column's, else the record's (behind a
    # repartition, the input record's, carried in a column), as ksqlDB's timestamp extractor.
    rowtime = F.col(quote_identifier(ROWTIME_COLUMN) if ROWTIME_COLUMN in source.schema else "_rowtime")
    time = F.coalesce(F.expr(query.plan.event_time), rowtime) if query.plan.event_time else rowtime
    columns = join_input(spec, source)
    selected, read = in_offset_order(frame, [F.col("_key_bytes"), time.alias("_time"), *value_columns(columns)],
                                     JoinSlice, source)
    # Values that are not JSON-ready as they come (decimals, dates, structs) go through ``plain``.
    convert = any(c.type.base not in _PLAIN_TYPES for c in columns)

    def reduce(batch: DataFrame, tasks: Mapping[int, Any]) -> dict[int, JoinSlice]:
        slices, good = read(batch)
        for piece, offset, (key, event_time, *values) in good:
            piece.records.append((offset, bytes(key), event_time, plain(values) if convert else values))
        return slices
    return Reduction(selected, reduce)


def materialize_reduction(parsed: DataFrame, query: PersistentQuery, source: DataSource, sink: DataSource,
                          tasks: Mapping[int, Any]) -> Reduction[MaterializeSlice]:
    """A source table's batch reduced to each key's last record: its value columns, or
    None when that record is a tombstone (a NULL value deletes the key). No shuffle: the
    records come back in offset order and the last one per key wins. A table whose standby
    copies replay its topic (a join's result: ``ReplayedTableTask``) has each record decoded
    in Python, as its copies decode it (``TableRecords``)."""
    if any(getattr(task, "REPLAYS", False) for task in tasks.values()):
        return _replayed_latest(parsed, source)
    frame = classify(parsed, source, tombstones=True, where=None)
    # A windowed table's records' times too: its store lets windows go by them (``TableTask._expired_windows``).
    times = [F.col("_rowtime")] if source.window is not None else []
    selected, read = in_offset_order(frame, [*times, F.col("_key_bytes"), F.expr("_raw IS NULL"),
                                             *value_columns(source.value_columns)], MaterializeSlice, source)
    keys = source.key_columns
    decode = key_decoder(keys) if len(keys) > 1 else None
    window = window_key_bytes(source.window) if source.window is not None else 0  # the bytes after the key

    def reduce(batch: DataFrame, tasks: Mapping[int, Any]) -> dict[int, MaterializeSlice]:
        slices, good = read(batch)
        latest: dict[int, dict[bytes, list[Any] | None]] = defaultdict(dict)  # by id() of the slice: a later record wins
        for piece, offset, record in good:
            if times:
                stamp, *record = record
                piece.stream_time = max(piece.stream_time, -1 if stamp is None else stamp)
            key, deleted, *values = record
            key = bytes(key)
            if decode is not None:  # a JSON key stored as written here (compact, in column order): lookups find it
                try:
                    key = (encode_key(decode(key[:-window]), keys) + key[-window:] if window
                           else encode_key(decode(key), keys))
                except (MillpondError, ValueError, TypeError, KeyError, ArithmeticError, RecursionError) as error:
                    piece.bad.append(BadRecord(offset, f"{reasons.bad_key(source)}: {error}",
                                               key.decode(errors="replace")))
                    continue
            latest[id(piece)][key] = None if deleted else stored(values)
        for piece in slices.values():
            piece.latest = list(latest[id(piece)].items())
        return slices
    return Reduction(selected, reduce)


def _replayed_latest(parsed: DataFrame, source: DataSource) -> Reduction[MaterializeSlice]:
    """``materialize_reduction`` of a table whose copies replay its topic: the records as
    they are from Spark, keyed and decoded here as a copy does (``TableRecords``), the ones
    that do not go to the processing log with the reasons a copy's catch-up gives them."""

    def reduce(batch: DataFrame, tasks: Mapping[int, Any]) -> dict[int, MaterializeSlice]:
        records = TableRecords(source)
        table = arrow_table(batch).sort_by(
            [("_partition", "ascending"), ("_offset", "ascending")])  # no Python row object per record
        rows = zip(*(column.to_pylist() for column in table.columns), strict=True)
        slices: dict[int, MaterializeSlice] = {}
        latest: dict[int, dict[bytes, list[Any] | None]] = defaultdict(dict)
        for partition, offset, key, value in rows:
            piece = slices.get(partition)
            if piece is None:
                piece = slices[partition] = MaterializeSlice(offset, offset)
            piece.last_offset, piece.count = offset, piece.count + 1
            outcome = records.read(key, value)
            if isinstance(outcome, LeftOut):
                piece.bad.append(BadRecord(offset, outcome.reason, outcome.text))
            elif outcome is not None:
                latest[partition][outcome[0]] = outcome[1]
        for partition, piece in slices.items():
            piece.latest = list(latest[partition].items())
        return slices
    whole_key = F.col(WINDOW_KEY if source.window is not None else "_key").alias("_key")  # as the topic has it
    return Reduction(parsed.select("_partition", "_offset", whole_key, "_value"), reduce)


def keyed_reduction(parsed: DataFrame, query: PersistentQuery, source: DataSource, sink: DataSource,
                    tasks: Mapping[int, Any]) -> Reduction[KeyedSlice]:
    """A batch's records as they are (key, value bytes or None, event time), in offset order,
    for a two-topic join's stages: a record without a key goes to the processing log (a
    keyless tombstone is passed over); values are decoded by the join's task. A stream joined
    on another column than its key (the plan's key expression) is re-keyed by that column:
    see ``rekeyed``; a record whose value does not decode, or whose column is NULL, is logged
    and a tombstone passed over."""
    # (The join stage's plan keeps the left stream's key expression: it reads it, it does not re-key.)
    rekey = query.plan.key_expression if query.plan.kind is PlanKind.JOIN_SIDE else None
    frame, time = parsed, "_rowtime"
    if query.plan.event_time or rekey:  # the value's columns, for the TIMESTAMP column or the join column
        frame = parsed.selectExpr("*", "_v.*", *_key_exprs(source)) if source.key_columns else parsed.select("*", "_v.*")
    if query.plan.event_time:  # a stream's TIMESTAMP column: a record without a usable one is logged
        time = f"({query.plan.event_time})"
    no_time = f"_raw IS NOT NULL AND ({time} IS NULL OR {time} < 0 OR {time} > {MAX_EVENT_TIME})"
    kind = (f"CASE WHEN _key IS NULL AND _raw IS NULL THEN {SKIPPED} WHEN _key IS NULL THEN {NO_KEY} "
            if rekey is None else
            f"CASE WHEN _raw IS NULL THEN {SKIPPED} WHEN {CORRUPT} IS NOT NULL THEN {BAD_VALUE} "
            f"WHEN ({rekey}) IS NULL THEN {NO_KEY} ")
    frame = frame.withColumn("_kind", F.expr(f"{kind} WHEN {no_time} THEN {NO_TIME} ELSE {GOOD} END"))
    extra = [F.col("_key").alias("k"), F.col("_value").alias("v"), F.expr(time).alias("t")]
    selected, read = in_offset_order(frame, extra if rekey is None else [*extra, F.expr(rekey).alias("j")],
                                     KeyedSlice, source)
    key_type = next((c.type for c in query.plan.columns if c.key), None)

    def reduce(batch: DataFrame, tasks: Mapping[int, Any]) -> dict[int, KeyedSlice]:
        slices, good = read(batch)
        for piece, offset, (key, value, timestamp, *join) in good:
            if join:
                assert key_type is not None
                key = rekeyed(serialize_key(join[0], key_type), None if key is None else bytes(key))
            piece.records.append((offset, bytes(key), None if value is None else bytes(value), timestamp))
        return slices
    return Reduction(selected, reduce)


def value_columns(columns: Iterable[Column]) -> list[Any]:
    """A source's columns as Spark columns ``c<i>`` (what ``arrow_values`` looks at)."""
    return [F.col(quote_identifier(c.name)).alias(f"c{i}") for i, c in enumerate(columns)]


def in_offset_order(frame: DataFrame, extra: list[Any], slice_type: type[SliceT], source: DataSource
                    ) -> tuple[DataFrame, Callable[[DataFrame], tuple[dict[int, SliceT], list[tuple[SliceT, int, list[Any]]]]]]:
    """The columns a classified frame's records come back with (partition, offset, kind, the
    text of a bad one, then ``extra``), and what reads a batch of them: each partition's
    slice (offsets, count, bad records), and every GOOD record with its slice, offset and
    ``extra`` values, in partition and offset order. One Spark job, no shuffle, the records
    back as one Arrow table when ``arrow_values`` says Arrow gives the same values (else as
    Spark's rows)."""
    selected = frame.select("_partition", "_offset", "_kind", F.expr(f"IF(_kind IN ({_BAD}), _raw, NULL)").alias("_bad_raw"),
                            *extra)
    arrow = arrow_values(selected)  # no Python row object per record

    def read(batch: DataFrame) -> tuple[dict[int, SliceT], list[tuple[SliceT, int, list[Any]]]]:
        if arrow:
            table = arrow_table(batch).sort_by([("_partition", "ascending"), ("_offset", "ascending")])
            rows = [list(r) for r in zip(*(column.to_pylist() for column in table.columns), strict=True)]
        else:
            rows = sorted((list(r) for r in batch.collect()), key=lambda r: (r[0], r[1]))
        slices: dict[int, SliceT] = {}
        good: list[tuple[SliceT, int, list[Any]]] = []
        for partition, offset, kind, raw, *values in rows:
            piece = slices.get(partition)
            if piece is None:
                piece = slices[partition] = slice_type(offset, offset)
            piece.last_offset, piece.count = offset, piece.count + 1
            if kind == GOOD:
                good.append((piece, offset, values))
            elif kind != SKIPPED:
                piece.bad += bad_records(kind, offset, raw, source)
        return slices, good
    return selected, read


_ARROW_VALUES = (T.StringType, T.IntegerType, T.LongType, T.ShortType, T.ByteType, T.DoubleType, T.FloatType,
                 T.BooleanType, T.DecimalType, T.DateType)
"""Value types Arrow gives Python exactly as Spark's rows do (not timestamps, which Arrow
makes zone-aware, binary, or nested types: maps come as pairs)."""


def arrow_values(frame: DataFrame) -> bool:
    """Whether every value column (``c<i>``) of ``frame`` comes back from Arrow as from Spark's rows."""
    return all(isinstance(f.dataType, _ARROW_VALUES) for f in frame.schema.fields if f.name.startswith("c"))


_PLAIN_TYPES = frozenset({"VARCHAR", "INT", "BIGINT", "DOUBLE", "BOOLEAN"})
"""Types whose values Arrow and Spark give as the JSON-ready Python values the task uses."""


_BAD = f"{BAD_VALUE}, {NO_KEY}, {BAD_VALUE | NO_KEY}"
MAX_EVENT_TIME = 2**56 - 1
"""The latest event time a window may have (about 2.3 million years): a windowed key's bytes
after the key then start with 0, which a key's lookup relies on."""


def classify(parsed: DataFrame, source: DataSource, tombstones: bool, where: str | None) -> DataFrame:
    """The batch's records with the source's columns decoded (beside ``_partition``,
    ``_offset``, ``_key_bytes`` and ``_raw``) and ``_kind`` saying what each is to the query.
    A tombstone is GOOD only when ``tombstones`` (it deletes its key's row); a record
    ``where`` drops is SKIPPED."""
    # ROWTIME: the record's timestamp, ROWPARTITION and ROWOFFSET its partition and offset;
    # behind a repartition, the input record's, carried in columns (a source's column of the
    # name is the column).
    own = {"ROWTIME": "_rowtime", "ROWPARTITION": "CAST(_partition AS INT)", "ROWOFFSET": "CAST(`_offset` AS BIGINT)"}
    carried = {"ROWTIME": ROWTIME_COLUMN, **PLACE_COLUMNS}
    taken = {name.upper() for name in source.schema}  # (Spark matches names regardless of case)
    pseudo = [f"{quote_identifier(carried[name]) if carried[name] in source.schema else expr} AS {name}"
              for name, expr in own.items() if name not in taken]
    # A windowed table's records are keyed by the key and the window: its bounds are columns.
    pseudo += [f"{expr} AS {name}" for name, expr in _window_bounds(source.window).items()]
    # A windowed table's key without its window is checked as any key (``_key_alone``); the
    # record's key is written on whole.
    windowed = source.window is not None
    whole_key, keyed = (WINDOW_KEY, f"`{KEY_ALONE}`") if windowed else ("_key", "_key_bytes")
    flat = parsed.selectExpr("_partition", "`_offset`", "_rowtime", f"{whole_key} AS `_key_bytes`",
                             *([f"_key AS {keyed}"] if windowed else []), *_key_exprs(source), "_raw", "_v.*",
                             "_v IS NULL AS `_no_value`", *pseudo)
    bad_value = f"_raw IS NOT NULL AND {CORRUPT} IS NOT NULL"
    keys = source.key_columns
    no_key = f"{keyed} IS NULL AND _raw IS NOT NULL" if keys else "false"
    # A key its type cannot hold: a number's bytes of another width (its column NULL), a VARCHAR's
    # not UTF-8. A table's tombstone with such a key deletes nothing: logged, as a copy's reader does.
    counted = "(_raw IS NOT NULL OR _key_bytes IS NOT NULL)" if tombstones else "_raw IS NOT NULL"
    if len(keys) == 1 and keys[0].type.base in reasons.KEY_WIDTHS:
        no_key = f"{counted} AND {quote_identifier(keys[0].name)} IS NULL"
    elif len(keys) == 1 and keys[0].type.base == "VARCHAR":
        no_key = f"{counted} AND NOT coalesce(is_valid_utf8({keyed}), false)"
    if len(keys) > 1:  # a JSON key that does not parse, or lacks a column, is no key either
        no_key = f"_raw IS NOT NULL AND ({keyed} IS NULL OR " + " OR ".join(
            f"{quote_identifier(c.name)} IS NULL" for c in keys) + ")"
    if windowed and keys:  # a key too short to hold a window is none, a tombstone's too
        no_key = f"({no_key}) OR ({counted} AND {keyed} IS NULL)"
    # A tombstone deletes its key's row: one without a key deletes nothing.
    usable = f"((_raw IS NULL AND {keyed} IS NOT NULL) OR NOT _no_value)" if tombstones else "NOT _no_value"
    if where:
        usable += f" AND (_raw IS NULL OR coalesce(({where}), false))"
    kind = (f"CASE WHEN ({bad_value}) OR ({no_key}) THEN "
            f"IF({bad_value}, {BAD_VALUE}, 0) + IF({no_key}, {NO_KEY}, 0) "
            f"WHEN {usable} THEN {GOOD} ELSE {SKIPPED} END")
    return flat.withColumn("_kind", F.expr(kind))


def grouped(frame: DataFrame, results: list[Any]) -> DataFrame:
    """One row per (partition, key) of the GOOD records with ``results`` over them, one per bad
    record, and one per partition for the skipped ones; every row carries its offsets
    (``_lo``, ``_hi``) and count (``_n``), so a single job gives the whole slice."""
    bad = f"_kind IN ({_BAD})"
    return frame.groupBy(
        F.col("_partition"), F.col("_kind"), F.expr(f"IF(_kind = {GOOD}, _key_bytes, NULL)").alias("_group"),
        F.expr(f"IF({bad}, `_offset`, NULL)").alias("_bad_offset"),
    ).agg(F.min("_offset").alias("_lo"), F.max("_offset").alias("_hi"), F.count(F.lit(1)).alias("_n"),
          F.max(F.expr(f"IF({bad}, _raw, NULL)")).alias("_bad_raw"), *results)


def spans(rows: Iterable[Any], slice_type: type[SliceT], source: DataSource) -> dict[int, SliceT]:
    """Each partition's slice with its offsets and count summed over ``rows`` (which have
    ``_partition``, ``_lo``, ``_hi``, ``_n``, ``_kind``, ``_bad_offset`` and ``_bad_raw``) and
    its bad records, in offset order."""
    bounds: dict[int, tuple[int, int, int]] = {}
    bad: dict[int, list[BadRecord]] = defaultdict(list)
    for row in rows:
        p = row["_partition"]
        lo, hi, n = bounds.get(p, (row["_lo"], row["_hi"], 0))
        bounds[p] = (min(lo, row["_lo"]), max(hi, row["_hi"]), n + row["_n"])
        bad[p] += bad_records(row["_kind"], row["_bad_offset"], row["_bad_raw"], source)
    return {p: slice_type(lo, hi, count=n, bad=sorted(bad[p], key=lambda b: b.offset))
            for p, (lo, hi, n) in bounds.items()}


def bad_records(kind: int, offset: int, raw: str | None, source: DataSource) -> list[BadRecord]:
    """The processing-log entries of one record of ``kind`` (no entry for a GOOD or SKIPPED one)."""
    out = []
    if kind & BAD_VALUE:
        out.append(BadRecord(offset, reasons.bad_value(source), raw))
    if kind & NO_KEY:
        out.append(BadRecord(offset, reasons.bad_key(source), raw))
    if kind & NO_TIME:
        out.append(BadRecord(offset, "record has no event time: its timestamp is NULL, before 1970 or beyond 2**56 ms "
                                     "(a windowed aggregation or a stream-stream join needs one)", raw))
    return out


def windowed_reduction(parsed: DataFrame, query: PersistentQuery, source: DataSource, sink: DataSource,
                       tasks: Mapping[int, Any]) -> Reduction[WindowSlice]:
    """A windowed GROUP BY batch reduced, in one Spark job, to one partial state per
    (partition, key, window), keyed by the windowed key, and the records whose window closed.

    A record's windows are Kafka Streams' (``WindowSpec.starts``); one closes once stream time
    (the partition's latest event time so far, this record's included) reaches its end plus
    grace. Stream time runs over the records in offset order from the task's own
    (``WindowedAggregationTask.stream_time``, read from the batch's tasks before it is reduced,
    between two batches: the slice says which it used, and the task refuses a slice reduced
    against another)."""
    plan = query.plan
    window = plan.window
    assert window is not None
    frame = classify_timed(parsed, source, plan)
    arguments, arrow = _arguments(frame, query, source)
    if arrow is not None:
        return arrow_windowed(frame, arguments, arrow, window, source)
    so_far = Window.partitionBy("_partition").orderBy("_offset").rowsBetween(Window.unboundedPreceding,
                                                                             Window.currentRow)
    size, advance, grace = window.size_ms, window.advance_ms, window.grace_ms
    columns, shape = partial_columns(plan)

    def reduce(batch: DataFrame, tasks: Mapping[int, Any]) -> dict[int, WindowSlice]:
        reduced_at = stream_times(tasks)
        prior = " ".join(f"WHEN {p} THEN {t}" for p, t in reduced_at.items())
        frame = batch.withColumn("_stime", F.greatest(
            F.expr(f"CASE _partition {prior} ELSE -1 END" if prior else "-1"),
            F.coalesce(F.max(F.expr(f"IF(_kind = {GOOD}, _ts, NULL)")).over(so_far), F.lit(-1))))
        frame = frame.withColumn("_last", F.expr(f"IF(_kind = {GOOD}, _ts - _ts % {advance}, NULL)"))
        frame = frame.withColumn("_ws", F.explode_outer(F.expr(
            f"IF(_kind = {GOOD}, sequence(greatest(0, _ts - {size} + {advance}) div {advance} * {advance}, _last, "
            f"CAST({advance} AS BIGINT)), NULL)")))
        frame = frame.withColumn("_k", F.expr(f"IF(_kind = {GOOD} AND _ws + {size + grace} <= _stime, {LATE}, _kind)"))
        bad = f"_k IN ({_BAD}, {NO_TIME}, {LATE})"
        rows = frame.groupBy(
            F.col("_partition"), F.col("_k").alias("_kind"),
            F.expr(f"IF(_k IN ({GOOD}, {LATE}), concat(_key_bytes, unhex(lpad(hex(_ws), 16, '0'))), NULL)").alias("_group"),
            F.expr(f"IF({bad}, `_offset`, NULL)").alias("_bad_offset"),
        ).agg(F.min("_offset").alias("_lo"), F.max("_offset").alias("_hi"),
              F.sum(F.expr("IF(_ws IS NULL OR _ws = _last, 1, 0)")).alias("_n"),
              F.max(F.expr(f"IF({bad}, _raw, NULL)")).alias("_bad_raw"),
              F.max(F.expr(f"IF(_kind = {GOOD}, _ts, NULL)")).alias("_latest"), F.max("_stime").alias("_stime"),
              F.max("_ws").alias("_ws"), *columns).collect()
        slices = spans(rows, WindowSlice, source)
        for partition, piece in slices.items():
            piece.reduced_at = piece.stream_time = reduced_at.get(partition, -1)
        for row in rows:
            piece = slices[row["_partition"]]
            if row["_latest"] is not None:
                piece.stream_time = max(piece.stream_time, row["_latest"])
            if row["_kind"] == GOOD:
                piece.partials.append((bytes(row["_group"]), states(row, len(_WINDOWED_FIXED), shape)))
                piece.times[bytes(row["_group"])] = row["_latest"]
            elif row["_kind"] == LATE:
                start = row["_ws"]
                piece.late.append(BadRecord(row["_bad_offset"], (
                    f"late: its {window.kind} window [{start}, {start + size}) closed at stream time {row['_stime']} "
                    f"(the window end plus its {grace} ms grace period); the record is dropped from that window"),
                    row["_bad_raw"]))
        for piece in slices.values():
            piece.late.sort(key=lambda b: b.offset)
        return slices
    return Reduction(frame, reduce)


def stream_times(tasks: Mapping[int, Any]) -> dict[int, int]:
    """Each windowed task's stream time now (-1 before its first record), by partition."""
    return {p: int(getattr(task, "stream_time", -1)) for p, task in tasks.items()}


def arrow_windowed(frame: DataFrame, arguments: list[Any], forms: list[tuple[str, ...]], window: WindowSpec,
                   source: DataSource) -> Reduction[WindowSlice]:
    """``windowed_reduction`` without Spark's shuffle: Spark decodes, classifies and computes each
    record's event time and aggregate arguments in one narrow stage; numpy runs each
    partition's stream time over the records in offset order (from the task's), puts each
    record in its windows and marks the late ones; Arrow groups the rest per (partition, key,
    window) into the aggregates' partials. The same slices as the Spark path."""
    selected = frame.select(
        "_partition", "_offset", "_kind", "_ts", F.expr(f"IF(_kind = {GOOD}, _key_bytes, NULL)").alias("_group"),
        # Any used record may turn out late (stream time is only known here): each keeps its text.
        F.expr(f"IF(_kind != {SKIPPED}, _raw, NULL)").alias("_bad_raw"), *arguments)

    def reduce(batch: DataFrame, tasks: Mapping[int, Any]) -> dict[int, WindowSlice]:
        reduced_at = stream_times(tasks)
        table = arrow_table(batch).sort_by([("_partition", "ascending"), ("_offset", "ascending")])
        partition = table["_partition"].to_numpy()
        offset = table["_offset"].to_numpy()
        kind = table["_kind"].to_numpy()
        good = kind == GOOD
        ts = np.where(good, table["_ts"].fill_null(-1).to_numpy(), -1).astype(np.int64)
        # Stream time as of each record (its own time included): the running maximum per partition.
        stime = np.empty_like(ts)
        slices: dict[int, WindowSlice] = {}
        bounds = np.flatnonzero(np.diff(partition)) + 1
        raws = table["_bad_raw"]
        for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(partition)]]), strict=True):
            if lo == hi:
                continue
            p = int(partition[lo])
            prior = reduced_at.get(p, -1)
            stime[lo:hi] = np.maximum.accumulate(np.maximum(ts[lo:hi], prior))
            piece = slices[p] = WindowSlice(int(offset[lo]), int(offset[hi - 1]), count=int(hi - lo))
            piece.reduced_at = prior
            piece.stream_time = int(stime[hi - 1])
            for at in np.flatnonzero(~good[lo:hi] & (kind[lo:hi] != SKIPPED)) + lo:
                piece.bad += bad_records(int(kind[at]), int(offset[at]), raws[int(at)].as_py(), source)
        # Each GOOD record in each of its windows (Kafka Streams' windowsFor).
        size, advance, grace = window.size_ms, window.advance_ms, window.grace_ms
        rows = np.flatnonzero(good)
        first = np.maximum(ts[rows] - size + advance, 0) // advance * advance
        count = (ts[rows] - ts[rows] % advance - first) // advance + 1
        record = np.repeat(rows, count)
        step = np.arange(len(record)) - np.repeat(np.cumsum(count) - count, count)
        start = np.repeat(first, count) + step * advance
        late = start + size + grace <= stime[record]
        for at, ws in zip(record[late], start[late], strict=True):
            piece = slices[int(partition[at])]
            piece.late.append(BadRecord(int(offset[at]), (
                f"late: its {window.kind} window [{ws}, {ws + size}) closed at stream time {int(stime[at])} "
                f"(the window end plus its {grace} ms grace period); the record is dropped from that window"),
                raws[int(at)].as_py() if raws[int(at)].is_valid else None))
        kept = record[~late]
        windows = pa.table({"_partition": pa.array(partition[kept]), "_group": table["_group"].take(pa.array(kept)),
                            "_ws": pa.array(start[~late]), "_ts": pa.array(ts[kept]),
                            **{f"a{i}": table[f"a{i}"].take(pa.array(kept)) for i in range(len(forms))}})
        wanted = [(f"a{i}", form) for i, each in enumerate(forms) for form in each] + [("_ts", "max")]
        partials = windows.group_by(["_partition", "_group", "_ws"], use_threads=False).aggregate(wanted)
        for row in partials.to_pylist():
            state = [plain([row[f"a{i}_{form}"] for form in each]) for i, each in enumerate(forms)]
            piece, key = slices[row["_partition"]], windowed_key(bytes(row["_group"]), row["_ws"])
            piece.partials.append((key, state))
            piece.times[key] = row["_ts_max"]
        return slices
    return Reduction(selected, reduce)


_WINDOWED_FIXED = (*_FIXED, "_latest", "_stime", "_ws")
"""The columns every row of ``windowed_reduction`` starts with."""


def sessions_reduction(parsed: DataFrame, query: PersistentQuery, source: DataSource, sink: DataSource,
                       tasks: Mapping[int, Any]) -> Reduction[SessionSlice]:
    """A session-windowed GROUP BY batch: each record's partial state, key and event time, in
    offset order, from one Spark job (each record its own group). Sessions merge record by
    record in the task (``SessionAggregationTask``): which sessions a record bridges, and
    whether it is late, depends on every record before it."""
    plan = query.plan
    frame = classify_timed(parsed, source, plan)
    columns, shape = partial_columns(plan)
    bad = f"_kind IN ({_BAD}, {NO_TIME})"

    def reduce(batch: DataFrame, tasks: Mapping[int, Any]) -> dict[int, SessionSlice]:
        rows = batch.groupBy(
            F.col("_partition"), F.col("_kind"), F.col("_offset"),
            F.expr(f"IF(_kind = {GOOD}, _key_bytes, NULL)").alias("_group"), F.expr(f"IF(_kind = {GOOD}, _ts, NULL)").alias("_t"),
        ).agg(F.max(F.expr(f"IF({bad}, _raw, NULL)")).alias("_bad_raw"), *columns).collect()
        rows.sort(key=lambda r: (r["_partition"], r["_offset"]))
        slices = spans([{"_partition": r["_partition"], "_kind": r["_kind"], "_lo": r["_offset"], "_hi": r["_offset"],
                         "_n": 1, "_bad_offset": r["_offset"], "_bad_raw": r["_bad_raw"]} for r in rows],
                       SessionSlice, source)
        for row in rows:
            if row["_kind"] == GOOD:
                state = states(row, 6, shape)  # after _partition, _kind, _offset, _group, _t and _bad_raw
                slices[row["_partition"]].records.append((row["_offset"], bytes(row["_group"]), row["_t"], state))
        return slices
    return Reduction(frame, reduce)


def classify_timed(parsed: DataFrame, source: DataSource, plan: QueryPlan) -> DataFrame:
    """``classify`` for a windowed aggregation, with each record's event time (``_ts``, epoch
    ms); a GOOD record without a usable one becomes NO_TIME."""
    frame = classify(parsed, source, tombstones=False, where=plan.where)
    frame = frame.withColumn("_ts", F.expr(plan.event_time or "_rowtime").cast("long"))
    usable = f"coalesce(_ts BETWEEN 0 AND {MAX_EVENT_TIME}, false)"
    return frame.withColumn("_kind", F.expr(f"IF(_kind = {GOOD} AND NOT {usable}, {NO_TIME}, _kind)"))


def partial_columns(plan: QueryPlan, signed: bool = False) -> tuple[list[Any], list[int]]:
    """The aggregates' partial forms as Spark columns (``a<i>_<j>``), and how many each has;
    ``signed``: their forms over rows added or retracted (``aggregates.Aggregate.undo``)."""
    columns: list[Any] = []
    shape: list[int] = []
    for i, call in enumerate(plan.aggregates):
        aggregate = aggregates.of(call.function, call.literals)
        undo = aggregate.undo
        if signed and undo is None:
            raise MillpondError(f"{call.function} cannot take back a table's row (the planner admits no such query)")
        forms = undo(call.argument) if signed and undo is not None else aggregate.partials(call.argument)
        shape.append(len(forms))
        columns += [F.expr(p).alias(f"a{i}_{j}") for j, p in enumerate(forms)]
    return columns, shape


def states(row: Any, skip: int, shape: list[int]) -> list[list[Any]]:
    """One partial state per aggregate from a collected row: its values after the first
    ``skip``, ``shape`` values per aggregate, as a store keeps them (``stored``: BYTES as
    base64 text, which the table's rows give back as bytes, ``task.aggregate_rows``)."""
    values, out, at = list(row)[skip:], [], 0
    for width in shape:
        out.append(stored(values[at:at + width]))
        at += width
    return out


def _signed_64(column: str) -> str:
    """Spark SQL of eight big-endian bytes as a signed BIGINT (``conv`` to a negative base reads them signed)."""
    return f"CAST(conv(hex({column}), 16, -10) AS BIGINT)"


_SIGNED_64 = _signed_64("_key")
"""The record key's eight bytes as a BIGINT."""


def _window_bounds(window: WindowSpec | None) -> dict[str, str]:
    """Spark SQL of WINDOWSTART and WINDOWEND from a windowed table's record key (``WINDOW_KEY``,
    as ``serde.window_bounds`` reads it: a time window's start last, its end the start plus its
    size; a session's end, then its start); none for a table without windows."""
    if window is None:
        return {}
    width = WINDOW_START_BYTES
    last = _signed_64(f"substring({WINDOW_KEY}, -{width}, {width})")
    start = f"IF(length({WINDOW_KEY}) >= {window_key_bytes(window)}, {last}, NULL)"
    if window.kind == "SESSION":
        end = (f"IF(length({WINDOW_KEY}) >= {2 * width}, "
               f"{_signed_64(f'substring({WINDOW_KEY}, -{2 * width}, {width})')}, NULL)")
    else:
        end = f"{start} + {window.size_ms}"
    return {WINDOW_START: start, WINDOW_END: end}
KEY_DECODERS = {
    "VARCHAR": "CAST(_key AS STRING)",
    # Java's IntegerSerializer: four big-endian bytes, two's complement.
    "INT": "IF(length(_key) = 4, CAST(CAST(conv(hex(_key), 16, 10) AS BIGINT) "
           "- IF(substr(hex(_key), 1, 1) >= '8', 4294967296, 0) AS INT), NULL)",
    "BIGINT": f"IF(length(_key) = 8, {_SIGNED_64}, NULL)",
    # DoubleSerializer: the IEEE 754 bits as a long (Java's own conversion back, exact).
    "DOUBLE": f"IF(length(_key) = 8, CAST(reflect('java.lang.Double', 'longBitsToDouble', {_SIGNED_64}) AS DOUBLE), "
              "NULL)",
}
"""Spark SQL of a KAFKA-format key column's value from the record key's bytes, by type (a
key of another length is NULL); BYTES keys are the bytes."""


def _key_exprs(source: DataSource) -> list[str]:
    """Spark SQL of the source's key columns from the record key: a KAFKA key decoded by its
    type; each column of a JSON key of several from the ``_keys`` struct the runner parsed."""
    keys = source.key_columns
    if len(keys) > 1:
        return [f"`_keys`.{quote_identifier(c.name)} AS {quote_identifier(c.name)}" for c in keys]
    if not keys:
        return ["CAST(NULL AS STRING)"]
    return [f"{KEY_DECODERS.get(keys[0].type.base, '_key')} AS {quote_identifier(keys[0].name)}"]


def plain(values: list[Any]) -> list[Any]:
    """Spark values as JSON-friendly Python values (Decimal and Row become float and dict; a
    map's values and a list's items made plain too)."""
    out: list[Any] = []
    for v in values:
        if hasattr(v, "asDict"):  # a struct: its fields made plain too
            fields = v.asDict()
            v = dict(zip(fields, plain(list(fields.values())), strict=True))
        elif isinstance(v, list):
            v = plain(v)
        elif isinstance(v, dict):
            v = dict(zip(v, plain(list(v.values())), strict=True))
        elif v is not None and type(v).__name__ == "Decimal":
            v = float(v)
        elif isinstance(v, datetime.date | datetime.time):  # datetime too: ISO text, which from_json reads back
            v = v.isoformat()
        out.append(v)
    return out


def stored(values: list[Any]) -> list[Any]:
    """A table row's values as its store keeps them (JSON): ``plain``, and BYTES as base64
    text wherever they are, also in an array, a map's values or a struct's fields
    (``task.table_rows`` gives them back as bytes)."""
    return [_storable(v) for v in plain(values)]


def _storable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    if isinstance(value, list):
        return [_storable(v) for v in value]
    if isinstance(value, dict):
        return {k: _storable(v) for k, v in value.items()}
    return value
