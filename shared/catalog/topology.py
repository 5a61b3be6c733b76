"""How a persistent query runs: one stage, or two stages chained through a topic.

A stage is one Spark stream over one input topic with one task per input partition. Most
queries are a single stage (read the source partition, write the sink, keep the store).
Two kinds need two, each with its own stream, tasks and transactional ids:

- **GROUP BY anything but the source's key** (or into another partition count), and a
  **stream-table join on anything but the stream's key**. Stage 1 re-keys every record by
  the grouping (or the stream's join) expression into the query's repartition topic
  (murmur2 over the table's partitions, as the Java client); stage 2 aggregates partition
  ``p`` of that topic into partition ``p`` of the table, so input, state and changelog are
  co-partitioned (ksqlDB's repartition step); a join's stage 2 joins partition ``p`` of it
  with partition ``p`` of the table.
- **A stream joined with tables on several expressions** (a multi-way join whose JOINs
  match different columns) runs one join stage per run of JOINs on one expression, after
  the stream's re-key when the first needs one. Each writes every column of its joined rows
  and their time, keyed by the next expression, into a topic of the query's
  (``chained_topic``), which the next join stage reads as a re-keyed stream. A stream
  joined after another JOIN (``s1 JOIN s2 WITHIN ... JOIN s3 WITHIN ...``, or after tables)
  has a stage of its own, a stream-stream join (below) of those rows with it, the rows' time
  their event time.
- **A table-table join** runs as one stage per table, then the join, then the result's
  materialization. Each table's stage copies its records (tombstones too) into the query's
  compacted joined topic, partition for partition, keyed by the side's place in the join
  (one byte) before the table's key; the join stage keeps both sides' rows, rebuilt from
  that topic, and writes each changed key's joined row (or a tombstone) to the sink topic;
  the last stage materializes the sink topic, as below, so the result can be pulled.
- **Tables joined on several keys** (``t1 JOIN t2 ON t1.fk = t2.id JOIN t3 ON t2.x = t3.id``)
  run one such join per key: the first table's with the tables joined on its key (or on a
  foreign key), then each later one joins the rows joined so far (every column, kept keyed
  by the first table's key in a compacted topic of the query's, ``chained_rows``) with the
  next table on a column of them (a foreign key) or on that key. Only the last applies the
  WHERE and the SELECT list.
- **A foreign-key table-table join** (``ON t1.column = t2.key``) runs the same stages, but
  the right table's stage copies each of its records into every partition of the joined
  topic (which has the left table's partitions, whatever the right table's count): each
  join task keeps the whole right table beside its partition of the left one, as a
  foreign key may name any right key.
- **A stream-stream join** runs the same way without the last stage: each stream's records
  (re-keyed by the join column, when it is not the stream's key, and sent to that key's
  partition) go into the joined topic (not compacted: it keeps what the join window and grace need,
  and a day more), stamped with their event time; the join stage joins them in that
  topic's order.
- **GROUP BY over a table** runs the same two stages, the first a regrouping: its task keeps
  the row it last added to a group for each key of the table (in RocksDB, restored from a
  changelog topic of its own), and for each changed row writes that row again, retracted, to its group, then
  the new row, added, to its group (ksqlDB's undo); the aggregation adds or subtracts each.
- **GROUP BY over tables joined with tables** runs the join's stages (each table copied into
  the joined topic, the join), whose task writes each key's joined row, every column, into a
  compacted topic of the query's (``<query>-joined-rows``): the joined table, which the
  aggregation regroups as above.
- **CREATE TABLE AS SELECT without GROUP BY over a table.** Stage 1 projects every row
  into the sink topic (a deleted row, or one the WHERE no longer passes, becomes a
  tombstone); stage 2 materializes the sink topic as a table declared over it would be,
  so the result can be pulled. The sink topic is the table's changelog.

Task ``p`` of a query runs partition ``p`` of every stage that has one, so the number of
tasks is the largest partition count of its stages. Pure functions, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from millpond.shared.catalog.names import (
    chained_rows_topic,
    chained_topic,
    changelog_topic,
    grouped_topic,
    joined_rows_topic,
    joined_topic,
    regroup_changelog_topic,
    repartition_topic,
    streams_topic,
)
from millpond.shared.catalog.plans import PlanKind
from millpond.shared.catalog.queries import JoinSpec, OutputColumn, PersistentQuery, QueryPlan
from millpond.shared.catalog.sources import Column, DataSource
from millpond.shared.kafka.serde import composite_key_type
from millpond.shared.sql.aggregates import SIGN_COLUMN
from millpond.shared.sql.ast import SqlType
from millpond.shared.sql.expressions import quote_identifier
from millpond.shared.sql.joins import joined, started_sources
from millpond.shared.sql.planner import event_time, plan_materialization, record_places
from millpond.shared.sql.types import RECORD_PLACES

AGGREGATES = (PlanKind.AGGREGATE, PlanKind.WINDOWED_AGGREGATE, PlanKind.SESSION_AGGREGATE)
"""The GROUP BY kinds (a plan of one with a join aggregates the joined rows)."""
TABLE_JOINS = (PlanKind.TABLE_TABLE_JOIN, PlanKind.FOREIGN_KEY_JOIN)
"""The joins of two tables into a table: the joined topic is compacted, the result materialized."""
CHAINED_JOINS = (PlanKind.STREAM_TABLE_JOIN, PlanKind.STREAM_STREAM_JOIN)
"""The joins that tables may follow on other expressions, each in a stage of its own."""
JOINED_TOMBSTONES_MS = 7 * 24 * 3_600_000
"""How long a table-table join's joined topic keeps a tombstone."""
WINDOWED_EXTRA_MS = 24 * 3_600_000
"""How much longer than its windows a windowed changelog keeps records (Kafka Streams' default)."""
ROWTIME_COLUMN = "_INPUT_ROWTIME"
"""The column of a repartition topic's records that carries the input record's timestamp."""
PLACE_COLUMNS = {"ROWPARTITION": "_INPUT_ROWPARTITION", "ROWOFFSET": "_INPUT_ROWOFFSET"}
"""The columns of a repartition topic's records that carry the input record's partition and
offset (``RECORD_PLACES``), when the query reads them."""
CHANGED_COLUMN = "_CHANGED_ROWTIME"
"""In a table aggregation's regrouped rows: when the change that adds or retracts the row
happened (an added row's own time; a retraction's, the change that takes its row out, while
``ROWTIME_COLUMN`` keeps the row's own for the aggregates to take back): what the group's new
result is stamped with, as Kafka Streams' table aggregation stamps it."""
JOIN_KEY_COLUMN = "_JOIN_KEY"
"""The key column of joined table rows another stage reads (``chained_rows``: a GROUP BY's, or
the rows a chain of table joins joined so far): the join key."""
REPARTITION_KEY = "_REPARTITION_KEY"
"""The key column of a repartition topic's records (the grouping expression's value)."""


@dataclass(frozen=True)
class Stage:
    """One Spark stream of a persistent query, as tasks over ``source``'s partitions."""

    name: str
    """Empty for the stage that produces the query's result; else what the stage does."""
    query: PersistentQuery
    """The query with this stage's plan (and start offsets only when it reads the source)."""
    source: DataSource
    sink: DataSource
    replayed: bool = False
    """A materialization whose standby copies replay the table's topic, its changelog: a
    table-table join's result (its active task and its copies decode each record alike, in
    Python: ``table_topic.TableRecords``)."""

    @property
    def partitions(self) -> int:
        """How many tasks the stage has: one per partition of its input."""
        return self.source.partitions

    @property
    def has_standbys(self) -> bool:
        """True when standbys can replicate the stage's store: its tasks keep a changelog of
        their own, or it is ``replayed``."""
        return self.query.plan.kind.spec.changelog or self.replayed


@dataclass(frozen=True)
class InternalTopic:
    """A topic a persistent query owns besides its sink: created and deleted with the query."""

    name: str
    compacted: bool
    """True for a changelog (only each key's latest state matters)."""
    configs: tuple[tuple[str, str], ...] = ()
    """Topic configs besides the cleanup policy."""
    partitions: int | None = None
    """Its partition count, where it is not the sink's: a join's stages read topics of its
    tables' partitions, whatever the sink has."""


def stages(query: PersistentQuery, source: DataSource, sink: DataSource, service_id: str) -> list[Stage]:
    """The stages of ``query`` in data-flow order; the last one produces its result."""
    plan = query.plan
    if plan.join is not None and plan.kind in AGGREGATES:
        return _joined_aggregate(query, source, sink, service_id)
    if plan.kind in CHAINED_JOINS and plan.join is not None and plan.join.steps > 1:
        return _chained_join(query, source, sink, service_id)
    if plan.kind.spec.repartition_topic and plan.repartition:
        return _repartitioned_aggregate(query, source, sink, service_id)
    if plan.kind in (*TABLE_JOINS, PlanKind.STREAM_STREAM_JOIN):
        return _two_sided_join(query, source, sink, service_id)
    if plan.kind is PlanKind.PROJECT and source.kind == "TABLE" and sink.kind == "TABLE":
        materialize = replace(query, plan=plan_materialization(sink), start_offsets=None)
        return [Stage("project", query, source, sink), Stage("", materialize, sink, sink)]
    return [Stage("", query, source, sink)]


def internal_topics(service_id: str, query: PersistentQuery) -> list[InternalTopic]:
    """The topics a persistent query owns besides its sink (deleted with the query)."""
    spec = query.plan.kind.spec
    topics = []
    window = query.plan.window
    if spec.changelog and window is not None:
        # As Kafka Streams' windowed changelogs: compacted, and deleted a day after the store
        # has let the window go, so a window the store expired while its tombstone is still
        # uncompacted disappears either way.
        configs = (("cleanup.policy", "compact,delete"), ("retention.ms", str(window.retention_ms + WINDOWED_EXTRA_MS)))
        topics.append(InternalTopic(changelog_topic(service_id, query.query_id), compacted=True, configs=configs))
    elif spec.changelog:
        topics.append(InternalTopic(changelog_topic(service_id, query.query_id), compacted=True))
    join = query.plan.join
    tables_joined = join is not None and query.plan.kind in AGGREGATES and join.stream.kind == "TABLE"
    if spec.repartition_topic and query.plan.repartition and not (join is not None and _joins_streams(join)):
        # A stream re-keyed for a join goes to its tables' partitions (``_repartitioned_aggregate``).
        topics.append(InternalTopic(repartition_topic(service_id, query.query_id), compacted=False,
                                    partitions=None if join is None or tables_joined else
                                    join.tables[0].table.partitions))
    if query.plan.regrouped is not None:  # a table's aggregation: the row each key last added
        # A regroup store kept on a worker the task left must not miss a delete (it would take
        # the row out of its group again): tombstones stay a week, and an older store is dropped.
        topics.append(InternalTopic(regroup_changelog_topic(service_id, query.query_id), compacted=True,
                                    configs=(("delete.retention.ms", str(JOINED_TOMBSTONES_MS)),),
                                    partitions=query.plan.regrouped))
    if query.plan.kind in AGGREGATES and join is not None and _joins_streams(join):  # a GROUP BY's joined rows
        topics.append(InternalTopic(grouped_topic(service_id, query.query_id), compacted=False))
    elif tables_joined:  # the tables gathered, and their joined rows (a table of the left's partitions)
        assert join is not None
        topics += [InternalTopic(name, compacted=True, configs=(("delete.retention.ms", str(JOINED_TOMBSTONES_MS)),),
                                 partitions=join.stream.partitions)
                   for name in (joined_topic(service_id, query.query_id), joined_rows_topic(service_id, query.query_id),
                                *_chain_topics(service_id, query.query_id, join))]
    elif query.plan.kind in AGGREGATES and join is not None:
        topics.append(InternalTopic(joined_topic(service_id, query.query_id), compacted=False))
    if join is not None and query.plan.kind in (*CHAINED_JOINS, *AGGREGATES) and join.stream.kind == "STREAM":
        topics += [InternalTopic(chained_topic(service_id, query.query_id, step), compacted=False,
                                 partitions=join.stage_tables(step)[0].table.partitions)
                   for step in range(1, join.steps)]
    if query.plan.kind in TABLE_JOINS:
        # A join task away for longer than a tombstone is kept would miss the delete when it
        # replays from its store's position: a week, not the broker's default day (an older
        # store is rebuilt from the start).
        assert join is not None
        topics += [InternalTopic(name, compacted=True, configs=(("delete.retention.ms", str(JOINED_TOMBSTONES_MS)),),
                                 partitions=None if name == joined_topic(service_id, query.query_id)
                                 else join.stream.partitions)
                   for name in (joined_topic(service_id, query.query_id),
                                *_chain_topics(service_id, query.query_id, join))]
    if join is not None and _joins_streams(join) and query.plan.kind in (PlanKind.STREAM_STREAM_JOIN, *AGGREGATES):
        topics.append(_streams_topic(service_id, query.query_id, join, 0,
                                     # The streams' count: a GROUP BY's table may have another.
                                     join.stream.partitions if query.plan.kind in AGGREGATES else None))
    if join is not None and query.plan.kind in (*CHAINED_JOINS, *AGGREGATES) and join.stream.kind == "STREAM":
        # streams joined after another JOIN (also before a GROUP BY)
        topics += [_streams_topic(service_id, query.query_id, join, step, join.stage_tables(step)[0].table.partitions)
                   for step in range(1, join.steps) if join.stage_tables(step)[0].within is not None]
    return topics


def _streams_topic(service_id: str, query_id: str, join: JoinSpec, step: int, partitions: int | None) -> InternalTopic:
    """The topic stream-stream join stage ``step`` gathers both sides in."""
    within = join.stage_tables(step)[0].within
    assert within is not None
    # Retention runs on the records' event times: at least a week, so a backlog of older
    # records is read (and a rebuild finds the window's records) unless it is older than
    # that; the broker must not stamp them with its own time.
    keep = max(within.retention_ms + join.behind(step) + WINDOWED_EXTRA_MS, JOINED_TOMBSTONES_MS)
    return InternalTopic(streams_topic(service_id, query_id, step), compacted=False,
                         configs=(("retention.ms", str(keep)), ("message.timestamp.type", "CreateTime")),
                         partitions=partitions)


def _chain_topics(service_id: str, query_id: str, join: JoinSpec) -> list[str]:
    """A chain of table-table joins' topics after its first stage: each later stage's gathered
    topic, and the rows joined before it."""
    return [name for step in range(1, join.steps)
            for name in (chained_topic(service_id, query_id, step), chained_rows_topic(service_id, query_id, step - 1))]


REGROUP_STAGE = "regroup"
"""A table aggregation's regroup stage (its store ``<query>-regroup``)."""
JOIN_SIDE_STAGE = "side-"
"""A table-table join's stage that copies one table into the joined topic, with its place in the join."""


def _two_sided_join(query: PersistentQuery, left: DataSource, sink: DataSource, service_id: str) -> list[Stage]:
    spec = query.plan.join
    assert spec is not None
    tables = query.plan.kind in TABLE_JOINS
    if tables:
        materialize = replace(query, plan=plan_materialization(sink), start_offsets=None)
        return [*_table_joins(query, left, sink, service_id), Stage("", materialize, sink, sink, replayed=True)]
    return _join_stage(query, left, sink, joined_topic(service_id, query.query_id), "")


def _table_joins(query: PersistentQuery, left: DataSource, sink: DataSource, service_id: str) -> list[Stage]:
    """Tables joined with tables into ``sink``, a stage per run of JOINs on one key (``sides``
    and ``join``, then ``side-<step>-<n>`` and ``join-<step>``): the first table's with the
    tables joined on its key, each later one the rows joined so far (kept keyed by the first
    table's key in a topic of the query's, ``chained_rows``) with the table joined on a column
    of them (a foreign key) or on that key."""
    spec = query.plan.join
    assert spec is not None
    out: list[Stage] = []
    for step in range(spec.steps):
        last = step == spec.steps - 1
        into = sink if last else chained_rows(query.query_id, spec, step, service_id, left.partitions)
        table = spec.stage_tables(step)[0]
        kind = PlanKind.FOREIGN_KEY_JOIN if table.foreign_key is not None else PlanKind.TABLE_TABLE_JOIN
        plan = query.plan if last else _rows_plan(left, into)
        staged = replace(query, plan=replace(plan, kind=kind, join=replace(spec, step=step)), start_offsets=None)
        gathered = joined_topic(service_id, query.query_id) if step == 0 else chained_topic(service_id, query.query_id,
                                                                                              step)
        out += _join_stage(staged, left, into, gathered, "" if step == 0 else f"{step}-")
        left = into
    return out


def chained_rows(query_id: str, spec: JoinSpec, step: int, service_id: str, partitions: int) -> DataSource:
    """The rows a chain of table-table joins joined up to stage ``step``, keyed by the join key
    (``JOIN_KEY_COLUMN``): every column of the first table and of each table joined so far, a
    value, named as in the joined row (the first table's key NULL where a RIGHT or FULL join
    has no row of it)."""
    left_key = spec.stream.key_column
    assert left_key is not None
    columns = (Column(JOIN_KEY_COLUMN, left_key.type, key=True),
               *(Column(joined(spec.stream_prefix, c.name), c.type) for c in spec.stream.columns),
               *(Column(joined(t.prefix, c.name), c.type) for t in spec.tables if t.step <= step
                 for c in t.table.columns))
    last = step == spec.steps - 1
    return DataSource(kind="TABLE", name=f"{query_id}_JOINED" if last else f"{query_id}_JOINED_{step}",
                      columns=columns, topic=(joined_rows_topic(service_id, query_id) if last
                                              else chained_rows_topic(service_id, query_id, step)),
                      partitions=partitions, value_format="JSON", query_id=query_id)


def _rows_plan(left: DataSource, rows: DataSource) -> QueryPlan:
    """A table join stage's plan that writes ``rows`` (``chained_rows``), every column as it is
    (each stage's own kind is ``_table_joins``')."""
    return QueryPlan(PlanKind.TABLE_TABLE_JOIN, left.name, rows.name,
                     tuple(OutputColumn(c.name, c.type, quote_identifier(c.name), key=c.key) for c in rows.columns),
                     key_column=JOIN_KEY_COLUMN)


def _join_stage(query: PersistentQuery, left: DataSource, sink: DataSource, topic: str, step: str,
                starts: tuple[tuple[int, ...] | None, ...] | None = None, left_time: str | None = None) -> list[Stage]:
    """One join stage and its sides' stages: each side copied into the gathered ``topic``, then
    the join of it into ``sink`` (``step``: a later stage's number and a dash, in its stages' names).
    ``starts``: each side's start offsets, where not the query's in order; ``left_time``: Spark
    SQL of the left side's event time, where not its source's."""
    spec = query.plan.join
    assert spec is not None
    tables = query.plan.kind in TABLE_JOINS
    gathered = DataSource(
        kind=left.kind, name=f"{query.query_id}_JOINED", columns=(), topic=topic,
        partitions=left.partitions, query_id=query.query_id,
    )
    # Tables are read whole, whatever auto.offset.reset says: a join needs both tables' rows.
    # Each stream starts where the query was created to start (its start offsets hold both
    # streams' partitions, the source's first).
    # A stream joined on another column than its key is re-keyed by it as its stage copies it.
    joined_tables = spec.stage_tables()  # a chain's later tables have stages of their own
    rekeys = (query.plan.key_expression, *(t.rekey for t in joined_tables)) if not tables else (None,) * (
        1 + len(joined_tables))
    # What the stage matches (the plan's key column is the result's, which a GROUP BY's is not).
    key_type = None if tables else _join_key_type(spec, spec.step)
    if starts is None:
        offsets, count = query.start_offsets, left.partitions
        starts = tuple(None if offsets is None else offsets[i * count:(i + 1) * count] for i in range(len(rekeys)))
    sides = [Stage(f"{JOIN_SIDE_STAGE}{step}{index}",
                   replace(query, plan=QueryPlan(
                       PlanKind.JOIN_SIDE, side.name, gathered.name,
                       () if rekey is None or key_type is None else (OutputColumn(REPARTITION_KEY, key_type, rekey,
                                                                                  key=True),),
                       join=spec, event_time=None if tables else left_time if index == 0 and left_time
                       else event_time(side), key_expression=rekey,
                       # Where either stream is re-keyed, both go to their join key's partition.
                       repartition=any(r is not None for r in rekeys)),
                           start_offsets=None if tables else starts[index]), side, gathered)
             for index, (side, rekey) in enumerate(zip((left, *(t.table for t in joined_tables)), rekeys, strict=True))]
    # The join stage's records carry their event time as their timestamp (the sides set it).
    join = Stage(f"join-{step[:-1]}" if step else "join" if tables else "",
                 replace(query, plan=replace(query.plan, event_time=None, repartition=False), start_offsets=None),
                 gathered, sink)
    return [*sides, join]


def _joined_aggregate(query: PersistentQuery, source: DataSource, sink: DataSource, service_id: str) -> list[Stage]:
    """A GROUP BY over a stream-table join: the join's stages (the stream re-keyed by its join
    expression first, when that is not its key), whose tasks write every column of each joined
    row keyed by the GROUP BY into the query's joined topic, then the aggregation of that topic."""
    plan = query.plan
    spec = plan.join
    assert spec is not None
    if spec.stream.kind == "TABLE":
        return _table_joined_aggregate(query, source, sink, service_id)
    keys = [c for c in plan.columns if c.key]
    key_type = keys[0].type if len(keys) == 1 else composite_key_type([(c.name, c.type) for c in keys])
    # Where streams are joined, the stream's own time too (``join_aggregation``: the rows' time is the latest).
    own_time = "ROWTIME" not in spec.stream.schema and any(t.within is not None for t in spec.tables)
    carried = (*(Column(joined(spec.stream_prefix, c.name), c.type) for c in spec.stream.columns),
               *(Column(joined(t.prefix, c.name), c.type) for t in spec.tables for c in t.table.columns),
               *([Column(joined(spec.stream_prefix, "ROWTIME"), SqlType("BIGINT"))] if own_time else []),
               Column(ROWTIME_COLUMN, SqlType("BIGINT")))
    streams = _joins_streams(spec)
    rows = DataSource(
        kind="STREAM", name=f"{query.query_id}_JOINED", columns=(Column(REPARTITION_KEY, key_type, key=True), *carried),
        topic=(grouped_topic if streams else joined_topic)(service_id, query.query_id), partitions=sink.partitions,
        value_format="JSON", query_id=query.query_id,
    )
    join = QueryPlan(PlanKind.STREAM_STREAM_JOIN if streams else PlanKind.STREAM_TABLE_JOIN, source.name, rows.name,
                     (OutputColumn(REPARTITION_KEY, _join_key_type(spec, 0), plan.key_expression or "", key=True),),
                     key_column=REPARTITION_KEY, key_expression=plan.key_expression,
                     repartition=plan.key_expression is not None, join=spec,
                     event_time=None if streams else event_time(source))
    joining = [replace(stage, name=stage.name or "join") for stage in stages(replace(query, plan=join), source, rows,
                                                                              service_id)]
    aggregate = replace(plan, source=rows.name, where=None, key_expression=None, repartition=False, join=None,
                        event_time=quote_identifier(ROWTIME_COLUMN) if plan.window is not None else None)
    return [*joining, Stage("", replace(query, plan=aggregate, start_offsets=None), rows, sink)]


def _table_joined_aggregate(query: PersistentQuery, source: DataSource, sink: DataSource,
                            service_id: str) -> list[Stage]:
    """A GROUP BY over tables joined with tables: the join's stages (each table copied into the
    joined topic, then the join) write each key's joined row, every column of it, into a
    compacted topic of the query's (``joined_rows_topic``), the joined table, which the
    aggregation then regroups as any table's (its regroup stage, then the aggregation)."""
    plan = query.plan
    spec = plan.join
    assert spec is not None
    # Keyed by the join key; every column of each side a value, in the order the joined row
    # (SELECT *) has them: the left key's too, which is NULL where the left row is absent
    # (RIGHT and FULL joins), not the join key.
    rows = chained_rows(query.query_id, spec, spec.steps - 1, service_id, source.partitions)
    joining = _table_joins(replace(query, plan=replace(_rows_plan(source, rows), join=spec), start_offsets=None),
                           source, rows, service_id)
    aggregate = replace(plan, source=rows.name, where=None, join=None)
    return [*joining, *_repartitioned_aggregate(replace(query, plan=aggregate, start_offsets=None), rows, sink,
                                                service_id)]


def _joins_streams(spec: JoinSpec) -> bool:
    """Whether a join matches two streams (``WITHIN``) rather than a stream with tables."""
    return spec.tables[0].within is not None


def _join_key_type(spec: JoinSpec, step: int) -> SqlType:
    """The type of what stage ``step`` of a chained join matches: its tables' key, or the
    column a stream joined first (``WITHIN``) is matched on."""
    joined_table = spec.stage_tables(step)[0]
    columns = joined_table.table.columns
    if joined_table.rekey is not None:
        return next(c.type for c in columns if quote_identifier(c.name) == joined_table.rekey)
    key = joined_table.table.key_column
    assert key is not None
    return key.type


def join_input(spec: JoinSpec, source: DataSource) -> tuple[Column, ...]:
    """The columns a stream-table join's stage reads of each record of ``source``: the
    stream's, or in a later stage of a multi-way join the joined row's so far."""
    if spec.step == 0:
        return spec.stream.columns
    return tuple(c for c in source.value_columns if c.name != ROWTIME_COLUMN)


def chained_stream(query_id: str, spec: JoinSpec, step: int, service_id: str) -> DataSource:
    """The topic stage ``step`` (1 or more) of a stream's multi-way join reads: the rows the
    stages before it joined, keyed by what it matches (``REPARTITION_KEY``), every column of
    the stream and of the sources joined so far named as in the joined row, then the rows'
    time (``ROWTIME_COLUMN``). Where a stream is joined, the stream record's own time too:
    the rows' time is then the later record's."""
    carried = [Column(joined(spec.stream_prefix, c.name), c.type) for c in spec.stream.columns]
    if "ROWTIME" not in spec.stream.schema and any(t.within is not None for t in spec.tables):
        carried.append(Column(joined(spec.stream_prefix, "ROWTIME"), SqlType("BIGINT")))
    carried += [Column(joined(t.prefix, c.name), c.type) for t in spec.tables if t.step < step
                for c in t.table.columns]
    return DataSource(
        kind="STREAM", name=f"{query_id}_JOINED_{step}",
        columns=(Column(REPARTITION_KEY, _join_key_type(spec, step), key=True), *carried,
                 Column(ROWTIME_COLUMN, SqlType("BIGINT"))),
        topic=chained_topic(service_id, query_id, step), partitions=spec.stage_tables(step)[0].table.partitions,
        value_format="JSON", query_id=query_id,
    )


def _stage_kind(spec: JoinSpec, step: int) -> PlanKind:
    """What stage ``step`` of a stream's multi-way join joins: a stream (WITHIN), or tables."""
    return PlanKind.STREAM_STREAM_JOIN if spec.stage_tables(step)[0].within is not None else PlanKind.STREAM_TABLE_JOIN


def _stream_starts(query: PersistentQuery, spec: JoinSpec, step: int) -> tuple[tuple[int, ...] | None, ...]:
    """The start offsets of a later stream-stream stage's sides: the rows joined so far from
    their topic's start, the stream from the query's start offsets (``started_sources``'s order)."""
    if query.start_offsets is None:
        return None, None
    stream = spec.stage_tables(step)[0].table
    place = started_sources(spec.stream, [t.table for t in spec.tables]).index(stream)
    count = spec.stream.partitions
    return None, query.start_offsets[place * count:(place + 1) * count]


def _chained_join(query: PersistentQuery, source: DataSource, sink: DataSource, service_id: str) -> list[Stage]:
    """A stream joined on several expressions (``ON r.sensor = s.id JOIN sites t ON s.site =
    t.id``), or with a stream after another JOIN: one join stage per run of JOINs on one
    expression, and one per stream joined after the first JOIN, the first behind the stream's
    re-key when it needs one. Each stage but the last writes every column of its joined rows,
    and their time, keyed by the next stage's expression into that stage's topic (of the next
    sources' partitions); the next joins it as a stream re-keyed by that expression, with its
    tables, or through a stream-stream join's stages with its stream."""
    plan = query.plan
    spec = plan.join
    assert spec is not None
    inputs = [chained_stream(query.query_id, spec, step, service_id) for step in range(1, spec.steps)]

    def keyed_plan(step: int, into: DataSource, key_expression: str | None = None, repartition: bool = False,
                   event_time: str | None = None) -> QueryPlan:
        """Stage ``step``'s plan when it writes into the next stage's topic (``into``, whose key
        type its task writes). Its own records are keyed as its tables are: what the stream's
        re-key before the first stage writes."""
        kind = plan.kind if step == 0 else _stage_kind(spec, step)
        return QueryPlan(kind, source.name if step == 0 else inputs[step - 1].name, into.name,
                         (OutputColumn(REPARTITION_KEY, _join_key_type(spec, step), key_expression or "", key=True),),
                         key_column=REPARTITION_KEY, key_expression=key_expression, repartition=repartition,
                         join=replace(spec, step=step), event_time=event_time)

    first = replace(query, plan=keyed_plan(0, inputs[0], plan.key_expression, plan.repartition, plan.event_time))
    if plan.kind is not PlanKind.STREAM_STREAM_JOIN and query.start_offsets is not None:  # the stream's own, first
        first = replace(first, start_offsets=query.start_offsets[:source.partitions])
    result = (_two_sided_join(first, source, inputs[0], service_id) if plan.kind is PlanKind.STREAM_STREAM_JOIN
              else _repartitioned_aggregate(first, source, inputs[0], service_id) if plan.repartition
              else [Stage("", first, source, inputs[0])])
    result[-1] = replace(result[-1], name="join-0")
    for step, reads in enumerate(inputs, start=1):
        last, kind = step == spec.steps - 1, _stage_kind(spec, step)
        staged = replace(query, start_offsets=None, plan=replace(
            plan, kind=kind, source=reads.name, join=replace(spec, step=step), key_expression=None,
            repartition=False, event_time=None) if last else keyed_plan(step, inputs[step]))
        into = sink if last else inputs[step]
        if kind is PlanKind.STREAM_STREAM_JOIN:
            # The rows so far and the stream, each copied into the stage's topic, stamped with their event time.
            stage = _join_stage(staged, reads, into,
                                streams_topic(service_id, query.query_id, step), f"{step}-",
                                starts=_stream_starts(query, spec, step), left_time=quote_identifier(ROWTIME_COLUMN))
        else:
            stage = [Stage("", staged, reads, into)]
        result += [*stage[:-1], replace(stage[-1], name="" if last else f"join-{step}")]
    return result


def _places_read(plan: QueryPlan, source: DataSource) -> tuple[str, ...]:
    """Which of ROWPARTITION and ROWOFFSET the aggregates, the result's columns or the HAVING
    of ``plan`` read of ``source``'s records (its Spark SQL names them; a column of the source
    that took the name is the column)."""
    spark = " ".join((*(c.expression for c in plan.columns), *(a.argument for a in plan.aggregates),
                      plan.having or "", plan.event_time or ""))
    return tuple(c.name for c in record_places(source) if quote_identifier(c.name) in spark)


def _repartitioned_aggregate(query: PersistentQuery, source: DataSource, sink: DataSource,
                             service_id: str) -> list[Stage]:
    plan = query.plan
    keys = [c for c in plan.columns if c.key]
    # A key of several columns travels as one STRUCT value: its JSON bytes are the sink's key.
    key = keys[0] if len(keys) == 1 else OutputColumn(
        REPARTITION_KEY, composite_key_type([(c.name, c.type) for c in keys]), plan.key_expression or "", key=True)
    # Every source column travels in the value, so the aggregates' Spark SQL (over the
    # source's column names) runs unchanged on the repartitioned records.
    carried = tuple(Column(c.name, c.type) for c in source.columns)
    carried_expressions = tuple(quote_identifier(c.name) for c in carried)
    # The input's record timestamp travels in the value (ROWTIME of the second stage, and the
    # event time of windows by record timestamp), as the repartition topic's records are
    # stamped when written: an input's old timestamps there would let the topic's retention
    # delete them before the second stage reads them.
    carried += (Column(ROWTIME_COLUMN, SqlType("BIGINT")),)
    carried_expressions += ("_rowtime",)
    # So do its partition and offset, when the aggregation reads them (ROWPARTITION, ROWOFFSET).
    places = _places_read(plan, source)
    carried += tuple(Column(PLACE_COLUMNS[name], RECORD_PLACES[name]) for name in places)
    carried_expressions += tuple(quote_identifier(name) for name in places)
    # A table's rows change: its first stage regroups each changed row, retracted from the
    # group it was counted in and added to its new one, which the first value column says
    # (the task writes a retraction as the row it added, with -1 there: REGROUP).
    regroup = plan.regrouped is not None
    if regroup:
        carried = (Column(SIGN_COLUMN, SqlType("INT")), *carried, Column(CHANGED_COLUMN, SqlType("BIGINT")))
        carried_expressions = ("1", *carried_expressions, "_rowtime")
    if plan.window is not None and plan.event_time is None:
        plan = replace(plan, event_time=quote_identifier(ROWTIME_COLUMN))
    # A join's stage 2 reads partition p of it with partition p of each table: it has the
    # tables' partitions (the sink may have others); an aggregation's has the table's.
    partitions = plan.join.tables[0].table.partitions if plan.join is not None else sink.partitions
    topic = DataSource(
        kind="STREAM", name=f"{query.query_id}_REPARTITION", columns=(Column(REPARTITION_KEY, key.type, key=True), *carried),
        topic=repartition_topic(service_id, query.query_id), partitions=partitions, value_format="JSON",
        query_id=query.query_id,
    )
    rekey = QueryPlan(
        kind=PlanKind.REGROUP if regroup else PlanKind.PROJECT, source=source.name, sink=topic.name,
        columns=(OutputColumn(REPARTITION_KEY, key.type, plan.key_expression or key.expression, key=True),
                 *(OutputColumn(c.name, c.type, e) for c, e in zip(carried, carried_expressions, strict=True))),
        where=plan.where, key_column=REPARTITION_KEY, key_expression=key.expression, repartition=True,
    )
    aggregate = replace(plan, source=topic.name, where=None, key_expression=None, repartition=False)
    return [
        # A table is read whole, whatever auto.offset.reset says: a row counted must have been added.
        Stage(REGROUP_STAGE, replace(query, plan=rekey, start_offsets=None), source, topic) if regroup else
        Stage("repartition", replace(query, plan=rekey), source, topic),
        Stage("", replace(query, plan=aggregate, start_offsets=None), topic, sink),
    ]
