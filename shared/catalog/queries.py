"""Persistent queries as the metastore holds them: the statement, its plan, and the Kafka
facts looked up for it.

Plain frozen values, so they hash into the metastore digest and travel between modules
without behaviour attached.
"""

from __future__ import annotations

from dataclasses import dataclass

from millpond.shared.catalog.plans import PlanKind
from millpond.shared.catalog.sources import DataSource, WindowSpec
from millpond.shared.sql.ast import SqlType


@dataclass(frozen=True)
class OutputColumn:
    """One result column of a persistent query and the Spark SQL that computes it."""

    name: str
    type: SqlType
    expression: str
    key: bool = False
    exploded: bool = False
    """A table function's column (``EXPLODE(items)``): ``expression`` gives the ARRAY, and each
    record is written once per item, this column holding the item (several such columns are
    zipped, the shorter ones NULL past their end)."""


@dataclass(frozen=True)
class AggregateCall:
    """One aggregate of a GROUP BY query: output column, function and its Spark argument."""

    column: str
    function: str
    argument: str
    literals: tuple[int | bool, ...] = ()
    """The literal arguments after the column (``LATEST_BY_OFFSET(x, 3, false)``: 3 and False),
    which ``aggregates.of`` makes the aggregate with."""
    result: SqlType | None = None
    """The type of an aggregate no column selects as it is, held apart for the expressions over
    it (``ROUND(AVG(x), 2)``: ``planner.aggregates_over_result``); None for a selected one (its
    column's type)."""

    def shown(self) -> str:
        """The call as SQL, for EXPLAIN and messages."""
        literals = "".join(f", {str(p).lower() if isinstance(p, bool) else p}" for p in self.literals)
        return f"{self.function}({self.argument}{literals})"


@dataclass(frozen=True)
class JoinedTable:
    """One table a stream joins: as it was when the query was planned, and the name its
    columns take in the joined row (``<prefix>_<column>``)."""

    type: str
    """INNER or LEFT."""
    table: DataSource
    prefix: str
    condition: str
    """The ON condition (``side.column``), for EXPLAIN."""
    within: JoinWindow | None = None
    """A stream-stream join's window (None for a table)."""
    foreign_key: str | None = None
    """A foreign-key table-table join's column of the left table (ON left.column = right's
    PRIMARY KEY), as the stage's left rows name it: the first table's own name in the first
    stage, the joined row's in a later one (of tables joined on several keys); None when the
    join matches both sides' keys."""
    rekey: str | None = None
    """A stream-stream join on a column of this stream other than its key: Spark SQL of that
    column, by which its records are re-keyed (None: joined on its key)."""
    step: int = 0
    """Which join stage joins this table. A stream joined with tables on several expressions
    joins each run of JOINs on one expression in a stage of its own, the joined rows re-keyed
    between them (ksqlDB's repartition between joins)."""


@dataclass(frozen=True)
class JoinWindow:
    """A stream-stream join's ``WITHIN``: a right record joins a left one ``before_ms``
    before it to ``after_ms`` after it. Each record is kept (to be joined by later ones)
    until its side's largest time is more than ``retention_ms`` past it, and an outer join's unmatched
    record is emitted once its window and ``grace_ms`` have passed (Kafka Streams'
    ``JoinWindows.ofTimeDifferenceAndGrace``)."""

    before_ms: int
    after_ms: int
    grace_ms: int
    eager: bool = False
    """No GRACE PERIOD was given: an outer side's record that joins nothing when it comes is
    emitted with NULLs at once, and joins later records all the same (ksqlDB's legacy
    ``JoinWindows.of``, its grace 24 hours)."""

    @property
    def retention_ms(self) -> int:
        """How far behind its side's largest time a record is still kept: the window's whole span and the
        grace period (Kafka Streams' join store retention)."""
        return self.before_ms + self.after_ms + self.grace_ms


@dataclass(frozen=True)
class JoinSpec:
    """A join: its first source (``FROM``) as it was when the query was planned, its prefix in
    the joined row, and what it joins, in order."""

    stream: DataSource
    stream_prefix: str
    tables: tuple[JoinedTable, ...]
    where: str | None = None
    """The WHERE (``side.column``), for EXPLAIN: the task evaluates it over the joined row."""
    step: int = 0
    """In a stage's plan: which of the join's stages it runs (the tables of that ``step``)."""

    @property
    def steps(self) -> int:
        """How many join stages the join runs in (one per run of JOINs on one expression)."""
        return 1 + max((t.step for t in self.tables), default=0)

    def stage_tables(self, step: int | None = None) -> list[JoinedTable]:
        """The tables join stage ``step`` joins (None: the stage this plan runs, ``self.step``)."""
        step = self.step if step is None else step
        return [t for t in self.tables if t.step == step]

    def behind(self, step: int | None = None) -> int:
        """How far behind their stream time the stream-stream stages before join stage
        ``step`` may write a row, summed: each writes a pair when its later record comes, up
        to its retention behind, and an outer row once its window and grace passed."""
        step = self.step if step is None else step
        return sum(t.within.retention_ms for t in self.tables if t.step < step and t.within is not None)


@dataclass(frozen=True)
class QueryPlan:
    """How workers execute a persistent query: its kind (``PlanKind`` says what each needs),
    and Spark SQL expressions over the source's columns."""

    kind: PlanKind
    source: str
    sink: str
    columns: tuple[OutputColumn, ...]
    where: str | None = None
    key_column: str | None = None
    """The sink's key column (a key of several columns: their names, comma-separated), or
    None for a stream without a key."""
    key_expression: str | None = None
    """Spark SQL of the sink key; None keeps each input record's key as it is."""
    repartition: bool = False
    """True when records change partition: a new key, or a different partition count."""
    aggregates: tuple[AggregateCall, ...] = ()
    window: WindowSpec | None = None
    """A windowed aggregation's windows (WINDOW TUMBLING / HOPPING)."""
    event_time: str | None = None
    """Spark SQL giving a windowed aggregation's event time in epoch milliseconds (the
    source's TIMESTAMP column); None: the record's timestamp."""
    having: str | None = None
    """A GROUP BY's HAVING over the result row, for EXPLAIN; the workers evaluate it from the
    statement (``millpond.shared.sql.planner.having_over_result``)."""
    regrouped: int | None = None
    """A GROUP BY over a TABLE: the table's partition count (its regroup stage keeps a
    changelog of as many partitions, ``names.regroup_changelog_topic``); None otherwise."""
    join: JoinSpec | None = None
    """A join's table and naming. A join's column expressions and WHERE are evaluated by the
    task over the joined row, from the statement (``millpond.shared.sql.joins``)."""


@dataclass(frozen=True)
class PersistentQuery:
    """A persistent query: the statement that created it and its plan."""

    query_id: str
    kind: str
    """CSAS, CTAS or INSERT."""
    statement: str
    source: str
    sink: str
    plan: QueryPlan
    start_offsets: tuple[int, ...] | None = None
    """Per input partition, where a query created with auto.offset.reset=latest starts;
    None starts from the earliest offset."""
    types: tuple[tuple[str, SqlType], ...] = ()
    """The custom types the statement names, as they were when the query was created: what the
    statement means (``statement_query``) whatever becomes of the names."""


@dataclass(frozen=True)
class Resolved:
    """Facts about Kafka the coordinator looked up for a statement and stored in its command,
    so that every node replays the statement to the same result."""

    start_offsets: tuple[int, ...] | None = None
    """Where a new query starts, per input partition (auto.offset.reset=latest); None: earliest."""
    partitions: int | None = None
    """The partition count of an existing topic a CREATE STREAM / TABLE did not declare."""
