"""What the metastore holds: streams and tables, persistent queries, and their plans.

Plain frozen values, so they hash into the metastore digest and travel between modules
without behaviour attached.
"""

from __future__ import annotations

from dataclasses import dataclass

from millpond.shared.sql.ast import SqlType


@dataclass(frozen=True)
class Column:
    """A column of a stream or table."""

    name: str
    type: SqlType
    key: bool = False


@dataclass(frozen=True)
class DataSource:
    """A stream or a table over a Kafka topic."""

    kind: str
    name: str
    columns: tuple[Column, ...]
    topic: str
    partitions: int
    key_format: str = "KAFKA"
    value_format: str = "JSON"
    query_id: str | None = None
    """The persistent query that writes it (CREATE ... AS SELECT), if any."""
    value_delimiter: str = ","
    """The field separator of DELIMITED values."""
    timestamp: str | None = None
    """The column that carries event time (WITH (timestamp=...)), if any."""

    @property
    def key_column(self) -> Column | None:
        """The KEY / PRIMARY KEY column, if any."""
        return next((c for c in self.columns if c.key), None)

    @property
    def value_columns(self) -> tuple[Column, ...]:
        """Columns stored in the record value."""
        return tuple(c for c in self.columns if not c.key)

    @property
    def schema(self) -> dict[str, SqlType]:
        """Column name to type."""
        return {c.name: c.type for c in self.columns}

    def schema_text(self) -> str:
        """The columns as ksqlDB prints them: ``A VARCHAR KEY, B INT``."""
        return ", ".join(f"{c.name} {c.type}{' KEY' if c.key else ''}" for c in self.columns)


@dataclass(frozen=True)
class OutputColumn:
    """One result column of a persistent query and the Spark SQL that computes it."""

    name: str
    type: SqlType
    expression: str
    key: bool = False


@dataclass(frozen=True)
class AggregateCall:
    """One aggregate of a GROUP BY query: output column, function and its Spark argument."""

    column: str
    function: str
    argument: str


@dataclass(frozen=True)
class QueryPlan:
    """How workers execute a persistent query.

    ``PROJECT`` queries filter and project each record (CSAS, INSERT INTO ... SELECT, and
    CTAS without GROUP BY over a table); ``AGGREGATE`` queries keep per-key state (CTAS
    with GROUP BY). Expressions are Spark SQL over the source's columns.
    """

    kind: str
    source: str
    sink: str
    columns: tuple[OutputColumn, ...]
    where: str | None = None
    key_column: str | None = None
    """The sink's key column, or None for a stream without a key."""
    key_expression: str | None = None
    """Spark SQL of the sink key; None keeps each input record's key as it is."""
    repartition: bool = False
    """True when records change partition: a new key, or a different partition count."""
    aggregates: tuple[AggregateCall, ...] = ()


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


@dataclass(frozen=True)
class Resolved:
    """Facts about Kafka the coordinator looked up for a statement and stored in its command,
    so that every node replays the statement to the same result."""

    start_offsets: tuple[int, ...] | None = None
    """Where a new query starts, per input partition (auto.offset.reset=latest); None: earliest."""
    partitions: int | None = None
    """The partition count of an existing topic a CREATE STREAM / TABLE did not declare."""
