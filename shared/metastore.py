"""The metastore: every stream, table and persistent query, built by replaying statements.

``validate`` checks a statement against the current state without changing it; ``apply``
changes it. Both are deterministic functions of the statements seen so far, so every node
that replays the command topic in order ends with the same metastore (compare ``digest``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from shared.errors import AlreadyExistsError, NotFoundError, StatementError
from shared.serde import KEY_FORMATS, VALUE_FORMATS
from shared.sql import aggregates, ast
from shared.sql.expressions import infer_type, output_name, to_spark


@dataclass(frozen=True)
class Column:
    """A column of a stream or table."""

    name: str
    type: ast.SqlType
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

    @property
    def key_column(self) -> Column | None:
        """The KEY / PRIMARY KEY column, if any."""
        return next((c for c in self.columns if c.key), None)

    @property
    def value_columns(self) -> tuple[Column, ...]:
        """Columns stored in the record value."""
        return tuple(c for c in self.columns if not c.key)

    @property
    def schema(self) -> dict[str, ast.SqlType]:
        """Column name to type."""
        return {c.name: c.type for c in self.columns}


@dataclass(frozen=True)
class AggregateCall:
    """One aggregate of a GROUP BY query: output column, function and its Spark argument."""

    column: str
    function: str
    argument: str


@dataclass(frozen=True)
class AggregationPlan:
    """How a worker executes ``CREATE TABLE ... AS SELECT ... GROUP BY key``."""

    source: str
    sink: str
    key_column: str
    where: str | None
    aggregates: tuple[AggregateCall, ...]


@dataclass(frozen=True)
class PersistentQuery:
    """A running persistent query."""

    query_id: str
    statement: str
    source: str
    sink: str
    plan: AggregationPlan
    state: str = "RUNNING"


@dataclass
class Metastore:
    """Streams, tables and queries, and the offset of the last command applied."""

    sources: dict[str, DataSource] = field(default_factory=dict)
    queries: dict[str, PersistentQuery] = field(default_factory=dict)
    command_offset: int = -1
    queries_created: int = 0

    # ---- lookups
    def source(self, name: str) -> DataSource:
        """The stream or table called ``name``."""
        found = self.sources.get(name)
        if found is None:
            known = ", ".join(sorted(self.sources)) or "none yet"
            raise NotFoundError(f"{name} does not exist; streams and tables: {known}")
        return found

    def digest(self) -> str:
        """A hash of the whole metastore, equal on every node that replayed the same commands."""
        body = {
            "sources": {k: asdict(v) for k, v in sorted(self.sources.items())},
            "queries": {k: asdict(v) for k, v in sorted(self.queries.items())},
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()

    # ---- statements
    def validate(self, stmt: ast.Statement) -> str:
        """Raise if ``stmt`` cannot be applied now; changes nothing. Returns its message."""
        return self._plan(stmt)[2]

    def planned(self, stmt: ast.Statement) -> tuple[list[DataSource], PersistentQuery | None]:
        """What ``stmt`` would add if appended next (for creating its topics first)."""
        sources, query, _ = self._plan(stmt)
        return list(sources.values()), query

    def apply(self, stmt: ast.Statement, offset: int) -> str:
        """Apply a statement read at command-topic ``offset``; returns a status message."""
        new_sources, new_query, message = self._plan(stmt)
        self.sources.update(new_sources)
        if new_query is not None:
            self.queries[new_query.query_id] = new_query
            self.queries_created += 1
        self.command_offset = offset
        return message

    def _plan(
        self, stmt: ast.Statement
    ) -> tuple[dict[str, DataSource], PersistentQuery | None, str]:
        if isinstance(stmt, ast.CreateSource):
            if self._exists(stmt.name, stmt.if_not_exists):
                return {}, None, f"{stmt.name} already exists"
            return {stmt.name: self._declared_source(stmt)}, None, f"{stmt.kind.title()} created"
        if isinstance(stmt, ast.CreateAsSelect):
            if self._exists(stmt.name, stmt.if_not_exists):
                return {}, None, f"{stmt.name} already exists"
            sink, query = self._create_as_select(stmt)
            return {sink.name: sink}, query, f"Created query with ID {query.query_id}"
        raise StatementError(f"{type(stmt).__name__} does not change the metastore")

    def _exists(self, name: str, if_not_exists: bool) -> bool:
        if name not in self.sources:
            return False
        if if_not_exists:
            return True
        raise AlreadyExistsError(f"{name} already exists; choose another name or DROP it first")

    @staticmethod
    def _declared_source(stmt: ast.CreateSource) -> DataSource:
        props = stmt.properties
        topic = props.get("kafka_topic")
        if not topic:
            raise StatementError(f"CREATE {stmt.kind} {stmt.name} needs WITH (kafka_topic='...')")
        value_format = str(props.get("value_format", "")).upper()
        if value_format not in VALUE_FORMATS:
            raise StatementError(f"value_format must be one of {', '.join(VALUE_FORMATS)}; got {value_format or 'nothing'}")
        key_format = str(props.get("key_format", "KAFKA")).upper()
        if key_format not in KEY_FORMATS:
            raise StatementError(f"key_format must be one of {', '.join(KEY_FORMATS)}; got {key_format}")
        partitions = props.get("partitions", 1)
        if not isinstance(partitions, int) or partitions < 1:
            raise StatementError(f"partitions must be a positive integer; got {partitions!r}")
        keys = [c for c in stmt.columns if c.key]
        if len(keys) > 1:
            raise StatementError(f"{stmt.name} declares {len(keys)} key columns; at most one is supported")
        if stmt.kind == "TABLE" and not keys:
            raise StatementError(f"table {stmt.name} needs a PRIMARY KEY column")
        names = [c.name for c in stmt.columns]
        if len(set(names)) != len(names):
            raise StatementError(f"{stmt.name} declares a column twice: {names}")
        columns = tuple(Column(c.name, c.type, c.key) for c in stmt.columns)
        return DataSource(stmt.kind, stmt.name, columns, str(topic), partitions, key_format, value_format)

    def _create_as_select(self, stmt: ast.CreateAsSelect) -> tuple[DataSource, PersistentQuery]:
        query = stmt.query
        source = self.source(query.source)
        if stmt.kind != "TABLE" or not query.group_by:
            raise StatementError("only CREATE TABLE ... AS SELECT ... GROUP BY is supported so far")
        key = source.key_column
        group = query.group_by
        if len(group) != 1 or not isinstance(group[0], ast.ColumnRef) or key is None or group[0].name != key.name:
            raise StatementError(
                f"GROUP BY must name the key column of {source.name} ({key.name if key else 'none'}); "
                "grouping by other columns needs repartitioning, which is not supported yet"
            )
        if query.partition_by is not None or "partitions" in stmt.properties:
            raise StatementError("PARTITION BY and WITH (PARTITIONS=...) are not supported yet")
        schema = source.schema
        columns: list[Column] = [Column(key.name, key.type, key=True)]
        calls: list[AggregateCall] = []
        for index, item in enumerate(query.items):
            if item.is_star:
                raise StatementError("SELECT * cannot be used with GROUP BY; name the columns")
            assert item.expr is not None
            name = output_name(item, index)
            if isinstance(item.expr, ast.ColumnRef) and item.expr.name == key.name:
                continue
            if not isinstance(item.expr, ast.Call) or aggregates.lookup(item.expr.name) is None:
                raise StatementError(f"{name} is neither an aggregate nor the GROUP BY column {key.name}")
            call = item.expr
            if call.star:
                argument = "1"
            elif len(call.args) == 1:
                argument = to_spark(call.args[0])
            else:
                raise StatementError(f"{call.name} takes exactly one argument")
            result_type = infer_type(call, schema)
            columns.append(Column(name, result_type))
            calls.append(AggregateCall(name, call.name, argument))
        if query.where is not None:
            infer_type(query.where, schema)
        where = to_spark(query.where) if query.where is not None else None
        # Numbered by how many queries came before, so the coordinator knows the id (and
        # creates the query's topics) before the command is appended.
        query_id = f"CTAS_{stmt.name}_{self.queries_created}"
        topic = str(stmt.properties.get("kafka_topic", stmt.name))
        sink = DataSource("TABLE", stmt.name, tuple(columns), topic, source.partitions,
                          "KAFKA", str(stmt.properties.get("value_format", source.value_format)).upper(),
                          query_id=query_id)
        plan = AggregationPlan(source.name, sink.name, key.name, where, tuple(calls))
        return sink, PersistentQuery(query_id, stmt.text, source.name, sink.name, plan)

    def describe_rows(self) -> list[dict[str, Any]]:
        """One row per stream or table, for SHOW STREAMS / SHOW TABLES."""
        return [
            {"NAME": s.name, "TYPE": s.kind, "TOPIC": s.topic, "KEY_FORMAT": s.key_format,
             "VALUE_FORMAT": s.value_format, "PARTITIONS": s.partitions}
            for s in sorted(self.sources.values(), key=lambda s: s.name)
        ]
