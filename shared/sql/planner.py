"""Plans SELECTs against the metastore's sources: persistent queries (CSAS, CTAS, INSERT INTO
... SELECT) become a ``QueryPlan`` and the sink they write; pull and push queries become a
``SelectPlan``. Pure functions of the statement and the sources, with no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

from millpond.shared.catalog.plans import PlanKind
from millpond.shared.catalog.queries import AggregateCall, OutputColumn, QueryPlan
from millpond.shared.catalog.sources import WINDOW_END, WINDOW_START, Column, DataSource, WindowSpec
from millpond.shared.errors import NotFoundError, StatementError
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.kafka.serde import (
    JSON_KEY_TYPES,
    KEY_FORMATS,
    KEY_TYPES,
    VALUE_FORMATS,
    base64_bytes,
    coerce,
    encode_key,
    serialize_value,
    timestamp_text,
)
from millpond.shared.kafka.time_patterns import LATEST_TIMESTAMP
from millpond.shared.kafka.values import stored
from millpond.shared.sql import aggregates, arrays, ast
from millpond.shared.sql.ast import SqlType, to_sql
from millpond.shared.sql.expressions import evaluate, output_name, quote_identifier, spark_literal, to_spark
from millpond.shared.sql.functions import TEXT_BUILDERS, whole_constant
from millpond.shared.sql.joins import join_aggregation, plan_join, pre_aggregation
from millpond.shared.sql.types import (
    RECORD_PLACES,
    TABLE_FUNCTIONS,
    Scope,
    check,
    check_condition,
    exploded_item,
    key_typed,
    with_widths,
)

SOURCE_PROPERTIES = ("kafka_topic", "partitions", "replicas", "value_format", "key_format", "timestamp", "timestamp_format",
                     "value_delimiter")
"""WITH properties a CREATE STREAM / TABLE and a CREATE ... AS SELECT accept."""


@dataclass(frozen=True)
class SelectPlan:
    """A pull or push query checked against its source: result columns and the filter."""

    source: DataSource
    columns: tuple[tuple[str, SqlType], ...]
    items: tuple[ast.SelectItem, ...]
    where: ast.Expr | None
    limit: int | None
    exploded: tuple[int, ...] = ()
    """The result columns that are a push query's EXPLODE (``exploded_rows``)."""

    def describe(self) -> list[str]:
        """The plan as EXPLAIN shows it."""
        steps = [f"[ PROJECT ] | Schema: {', '.join(f'{n} {t}' for n, t in self.columns)}"]
        if self.where is not None:
            steps.append(f"[ FILTER ] | {to_sql(self.where)}")
        steps.append(f"[ SOURCE ] | {self.source.kind} {self.source.name} | Topic: {self.source.topic}")
        return [" " * (2 * depth) + "> " + step for depth, step in enumerate(steps)]

    def result(self, row: dict[str, Any]) -> list[Any] | None:
        """The result row for one row of the source (by column name), or None when the WHERE
        drops it."""
        return select_row(self.items, self.where, self.source, row)

    def results(self, row: dict[str, Any]) -> Iterator[list[Any]]:
        """The result rows of one row of the source: one, none when the WHERE drops it, or with
        EXPLODE one per item (``exploded_rows``), each made when it is read."""
        result = self.result(row)
        return iter(()) if result is None else exploded_rows(result, self.exploded)


def select_row(items: tuple[ast.SelectItem, ...], where: ast.Expr | None, source: DataSource,
               row: dict[str, Any]) -> list[Any] | None:
    """The SELECT list's values for one row of ``source`` (by column name), or None when
    ``where`` drops it: a pull or push query's result row."""
    if where is not None and evaluate(where, row) is not True:
        return None
    return project(items, source, row)


def project(items: tuple[ast.SelectItem, ...], source: DataSource, row: dict[str, Any]) -> list[Any]:
    """The SELECT list's values for one row of ``source`` (``*`` expands to its columns; an
    EXPLODE item to its ARRAY, which ``exploded_rows`` makes rows of)."""
    out: list[Any] = []
    for item in items:
        if item.is_star:
            out += [row[c.name] for c in source.row_columns]
        else:
            assert item.expr is not None
            expr = item.expr
            if isinstance(expr, ast.Call) and expr.name in TABLE_FUNCTIONS:
                array = evaluate(expr.args[0], row)
                out.append(arrays.Cube(array) if expr.name == "CUBE_EXPLODE" else array)
            else:
                out.append(evaluate(expr, row))
    return out


def exploded_rows(values: list[Any], exploded: Sequence[int]) -> Iterator[list[Any]]:
    """The rows one row's values make, each when it is read: itself, or with table functions
    (``exploded``: the indexes of EXPLODE's columns, each an ARRAY here) one row per item, the
    columns zipped and the shorter ones NULL past their end, as ksqlDB's; none when every ARRAY
    is empty or NULL."""
    if not exploded:
        yield values
        return
    lengths = [len(values[i] or ()) for i in exploded]
    for n in range(max(lengths)):
        row = list(values)
        for i, length in zip(exploded, lengths, strict=True):
            row[i] = values[i][n] if n < length else None
        yield row


def key_equality(where: ast.Expr | None, key: str) -> ast.Literal | None:
    """The literal ``k`` in a top-level conjunct ``KEY = k`` of ``where``, if any."""
    if where is None:
        return None
    if isinstance(where, ast.Binary) and where.op == "AND":
        return key_equality(where.left, key) or key_equality(where.right, key)
    if isinstance(where, ast.Binary) and where.op == "=":
        for col, lit in ((where.left, where.right), (where.right, where.left)):
            if isinstance(col, ast.ColumnRef) and col.name == key and isinstance(lit, ast.Literal):
                return lit
    return None


def pinned_key(where: ast.Expr | None, source: DataSource) -> tuple[list[Any], bytes] | None:
    """The key a WHERE pins (``KEY = k``, for every column of a key of several, in top-level
    conjuncts): its column values and serialized bytes; else None."""
    keys = source.key_columns
    literals = [key_equality(where, c.name) for c in keys]
    if not keys or any(literal is None for literal in literals):
        return None
    values = [key_literal(literal.value, c) for literal, c in zip(literals, keys, strict=True) if literal is not None]
    if any(value is None for value in values):  # KEY = NULL, or = 5.5 of an INT key: no row, as a scan finds
        return None
    return values, encode_key(values, keys)


def key_literal(value: Any, column: Column) -> Any:
    """A key's literal as its column's type, as a lookup serializes it; None when no key of the
    type equals it (NULL, 5.5 or 3000000000 for an INT key: the WHERE holds for no row). An
    integral number of another type is the key's (5.0 for an INT key is 5), as ``=`` compares."""
    if value is None:
        return None
    base = column.type.base
    if base in ("INT", "BIGINT") and isinstance(value, float):
        if not value.is_integer() or not -(2**63) <= value < 2**63:  # 1e19: no BIGINT equals it either
            return None
        value = int(value)
    if base == "INT" and type(value) is int and -(2**63) <= value < 2**63 and not -(2**31) <= value < 2**31:
        return None  # a BIGINT no INT equals (a number past BIGINT is no literal at all: refused)
    return coerce(value, column.type, column.name)


def key_prefix(plan: SelectPlan) -> bytes | None:
    """For a pull query of a windowed table that names its key (``KEY = k``), the serialized
    key its rows' windowed keys start with; else None."""
    if plan.source.window is None:
        return None
    pinned = pinned_key(plan.where, plan.source)
    return None if pinned is None else pinned[1]


WINDOW_BOUNDS = (WINDOW_START, WINDOW_END)
ROWTIME = "ROWTIME"
"""The pseudo-column of a record's timestamp (epoch milliseconds, BIGINT), as ksqlDB's."""


def _rowtime(source: DataSource) -> tuple[Column, ...]:
    """ROWTIME, for queries over ``source``'s records (unless a column of an older definition
    took the name)."""
    return () if ROWTIME in source.schema else (Column(ROWTIME, SqlType("BIGINT")),)


def record_places(source: DataSource) -> tuple[Column, ...]:
    """ROWPARTITION and ROWOFFSET (``RECORD_PLACES``), for queries over ``source``'s records
    (unless a column took the name, in any case: Spark matches names regardless of case)."""
    taken = {name.upper() for name in source.schema}
    return tuple(Column(name, type_) for name, type_ in RECORD_PLACES.items() if name not in taken)


def _scope(query: ast.Query, source: DataSource, columns: tuple[Column, ...] | None = None) -> Scope:
    return Scope(source.name, {c.name: c.type for c in columns or source.columns}, query.alias)


def _expand(query: ast.Query, source: DataSource, columns: tuple[Column, ...] | None = None) -> list[tuple[str, ast.Expr]]:
    """The SELECT list with ``*`` expanded (to ``columns``, the source's own by default), as
    (output name, expression); names are unique."""
    items: list[tuple[str, ast.Expr]] = []
    for index, item in enumerate(query.items):
        if item.is_star:
            items += [(c.name, ast.ColumnRef(c.name)) for c in columns or source.columns]
        else:
            assert item.expr is not None
            items.append((output_name(item, index), item.expr))
    seen: set[str] = set()
    for name, _ in items:
        if name in seen:
            raise StatementError(f"the result has two columns named {name}; give one of them an alias with AS")
        seen.add(name)
    return items


def plan_select(query: ast.Query, source: DataSource) -> SelectPlan:
    """Check a pull or push query; the result columns with their types."""
    if query.group_by or query.partition_by is not None or query.window is not None or query.having is not None:
        raise StatementError("GROUP BY, HAVING, WINDOW and PARTITION BY need a persistent query: "
                             "CREATE TABLE|STREAM ... AS SELECT")
    if query.joins:
        raise StatementError("a join needs a persistent query: CREATE STREAM ... AS SELECT ... JOIN ..., then "
                             "query its result")
    if query.emit_final:
        raise StatementError("EMIT FINAL is not supported: use EMIT CHANGES for a push query")
    # A push query, and a pull query over a stream, read records, which carry their timestamp; a
    # pull query over a table reads stored rows.
    records = query.emit_changes or source.kind == "STREAM"
    scope = _scope(query, source, (*source.row_columns, *((*_rowtime(source), *record_places(source)) if records else ())))
    columns: list[tuple[str, SqlType]] = []
    exploded: list[int] = []
    for name, expr in _expand(query, source, source.row_columns):
        # A query over a stream's records may EXPLODE (a record's rows); elsewhere ``check`` refuses it.
        item = exploded_item(expr, scope) if source.kind == "STREAM" else None
        if item is not None:
            exploded.append(len(columns))
        columns.append((name, item or check(expr, scope)))
    if query.where is not None:
        check_condition(query.where, scope, "WHERE")
    _check_text_builders(query)
    return SelectPlan(source, tuple(columns), with_widths(query.items, scope), with_widths(query.where, scope), query.limit,
                      tuple(exploded))


MAX_TEXT_BUILDERS = 64
"""The most calls of ``functions.TEXT_BUILDERS`` a pull or push query may make per row: each may
build ``MAX_PADDED_CHARS`` (1 MiB) on the serving loop, and 2,800 of them in a 64 KB text took
1.6 s and 2.8 GB a row."""


def _check_text_builders(query: ast.Query) -> None:
    """Refuse a pull or push query whose expressions may build more text per row than the
    serving loops afford."""
    calls = 0

    def note(node: ast.Expr) -> None:
        nonlocal calls
        calls += isinstance(node, ast.Call) and node.name in TEXT_BUILDERS

    ast.replace_nodes((*(item.expr for item in query.items), query.where), note)
    if calls > MAX_TEXT_BUILDERS:
        raise StatementError(f"the query calls LPAD, RPAD, CONCAT (or ||), CONCAT_WS and REPLACE {calls} times; a pull or push "
                             f"query may call them at most {MAX_TEXT_BUILDERS} times (each may build 1 MiB of text "
                             "per row): compute such columns in a persistent query and read its result")


MAX_ROUND_PLACES = 1000
"""The most places a persistent query's ROUND takes either way: Spark's fails every batch for
about a billion (``BigInteger would overflow supported range``, ``Underflow``), and beyond a
DOUBLE's or a DECIMAL's digits more places change nothing (``ROUND(d, -400)`` is 0 already)."""


def check_round_places(statement: Any) -> None:
    """Refuse a ROUND in ``statement`` (a persistent query's, checked when it is accepted) whose
    places Spark cannot take: Spark rounds every row to one scale fixed when the query starts,
    so its analyzer refuses places that are not a constant (``ROUND(d, i)``, which a pull
    evaluates), and its batches fail past about a billion places."""
    if isinstance(statement, tuple):
        for item in statement:
            check_round_places(item)
        return
    if not is_dataclass(statement) or isinstance(statement, type):
        return
    if isinstance(statement, ast.Query) and statement.group_by:
        # Spark computes the WHERE, the GROUP BY and the aggregates' arguments; Python the
        # expressions over the aggregates and HAVING (``aggregates_over_result``).
        aggregated: list[ast.Expr] = []

        def note(node: ast.Expr) -> ast.Expr | None:
            if _is_aggregate(node):
                aggregated.append(node)
                return node
            return None

        for item in statement.items:
            ast.replace_nodes(item.expr, note)
        check_round_places((statement.where, statement.group_by, tuple(aggregated), statement.joins))
        return
    if isinstance(statement, ast.Call) and statement.name == "ROUND" and len(statement.args) > 1:
        places = statement.args[1]
        value = whole_constant(places)
        if value is None or abs(value) > MAX_ROUND_PLACES:
            raise StatementError(
                f"ROUND's places in a persistent query must be a whole number from -{MAX_ROUND_PLACES} to "
                f"{MAX_ROUND_PLACES} written with literals (ROUND(x, 2), ROUND(x, 1 + 1)), not {ast.to_sql(places)}: "
                "Spark rounds every row to one scale, fixed when the query starts (a pull query may round by a "
                "column)")
    for item in fields(statement):
        check_round_places(getattr(statement, item.name))


def check_properties(properties: dict[str, Any], allowed: tuple[str, ...], statement: str) -> None:
    """Refuse unknown or ill-typed WITH properties with a message that lists the known ones."""
    for name, value in properties.items():
        if name not in allowed:
            raise StatementError(f"{statement} does not take the property {name.upper()}; "
                                 f"it takes {', '.join(p.upper() for p in allowed)}")
        if name in ("partitions", "replicas"):
            most = MAX_PARTITIONS if name == "partitions" else MAX_REPLICAS
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
                raise StatementError(f"{name.upper()} must be an integer from 1 to {most}; got {value!r}")
        if name == "value_format" and str(value).upper() not in VALUE_FORMATS:
            raise StatementError(f"VALUE_FORMAT must be one of {', '.join(VALUE_FORMATS)}; got {value!r}")
        if name == "key_format" and str(value).upper() not in KEY_FORMATS:
            raise StatementError(f"KEY_FORMAT must be one of {', '.join(KEY_FORMATS)}; got {value!r}")
        if name == "value_delimiter" and (not isinstance(value, str) or len(value) != 1):
            raise StatementError(f"VALUE_DELIMITER must be a single character; got {value!r}")
        if name in ("kafka_topic", "timestamp", "timestamp_format") and (not isinstance(value, str) or not value):
            raise StatementError(f"{name.upper()} must be a non-empty string; got {value!r}")
        if name == "kafka_topic":
            check_topic_name(str(value), "; change KAFKA_TOPIC")


_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
MAX_PARTITIONS = 2**31 - 1
MAX_REPLICAS = 2**15 - 1
"""Kafka's protocol carries a topic's partition count in 32 bits and its replication factor in 16."""


def check_topic_name(topic: str, hint: str = "") -> str:
    """``topic`` if Kafka allows it as a topic name (1 to 249 ASCII letters, digits, '.', '_'
    and '-'; not '.' or '..'); else a StatementError saying so, and ``hint`` (what to do)."""
    if _TOPIC.fullmatch(topic) is None or topic in (".", ".."):
        shown = topic if len(topic) <= 60 else f"{topic[:60]}... ({len(topic)} characters)"
        raise StatementError(f"{shown!r} is not a Kafka topic name: Kafka allows 1 to 249 ASCII letters, digits, "
                             f"'.', '_' and '-'{hint}")
    return topic


def check_key_format(key_format: str, keys: tuple[str, ...]) -> str:
    """KAFKA holds one key column; JSON is for a key of several (a GROUP BY of several
    expressions), which KAFKA cannot hold, as in ksqlDB. The format, checked."""
    if len(keys) > 1 and key_format != "JSON":
        raise StatementError(f"the {key_format} key format only supports a single key column; the key is "
                             f"{', '.join(keys)}: use WITH (KEY_FORMAT='JSON')")
    if len(keys) <= 1 and key_format == "JSON":
        raise StatementError("KEY_FORMAT='JSON' is supported for a key of several columns (GROUP BY a, b) only; "
                             "a single key column uses KEY_FORMAT='KAFKA'")
    return key_format


def check_key_type(column: str, type_: SqlType, key_format: str = "KAFKA") -> None:
    """KAFKA keys are primitives the Java serializers know; a JSON key's columns are
    ``JSON_KEY_TYPES``."""
    if key_format == "JSON" and type_.base not in JSON_KEY_TYPES:
        raise StatementError(f"key column {column} is {type_}, which a key of several columns cannot hold; "
                             f"use one of {', '.join(JSON_KEY_TYPES)}")
    if type_.base not in KEY_TYPES:
        raise StatementError(f"key {column} is {type_}, which the KAFKA key format cannot hold; "
                             f"use one of {', '.join(KEY_TYPES)}")


_PATTERN = re.compile(r"(?:[GyMLdDahKkHmsSVzOXxZ \-_:.,/\[\]]|'[^']*')+")
"""A datetime pattern of letters Spark parses with (Java's DateTimeFormatter's, without the
week-based and other letters Spark refuses), separators and quoted text ('T' too)."""


def check_timestamp(properties: dict[str, Any], columns: tuple[Column, ...]) -> str | None:
    """The TIMESTAMP property names a BIGINT or TIMESTAMP column, or with TIMESTAMP_FORMAT a
    VARCHAR one that the format parses."""
    name = properties.get("timestamp")
    text_format = properties.get("timestamp_format")
    if name is None:
        if text_format is not None:
            raise StatementError("TIMESTAMP_FORMAT needs TIMESTAMP='<column>': it says how that column's text is read")
        return None
    name = str(name).upper()
    found = next((c for c in columns if c.name == name), None)
    if text_format is not None:
        if found is None or found.type.base != "VARCHAR":
            raise StatementError(f"TIMESTAMP={name} with TIMESTAMP_FORMAT must name a VARCHAR column of the result")
        if _PATTERN.fullmatch(str(text_format)) is None:
            raise StatementError(f"TIMESTAMP_FORMAT {text_format!r} is not a datetime pattern Millpond can parse with: "
                                 "use the letters G y M L d D a h K k H m s S V z O X x Z, separators and quoted "
                                 "text, as in yyyy-MM-dd'T'HH:mm:ss.SSSXXX")
    elif found is None or found.type.base not in ("BIGINT", "TIMESTAMP"):
        raise StatementError(f"TIMESTAMP={name} must name a BIGINT or TIMESTAMP column of the result "
                             "(or a VARCHAR one with TIMESTAMP_FORMAT)")
    return name


def _result_kind(source: DataSource, grouped: bool) -> str:
    return "TABLE" if grouped or source.kind == "TABLE" else "STREAM"


def plan_materialization(table: DataSource) -> QueryPlan:
    """How a table declared over a topic is kept queryable: the latest row per key, in the
    table's own columns (the plan of its CST query)."""
    columns = tuple(OutputColumn(c.name, c.type, quote_identifier(c.name), c.key) for c in table.columns)
    return QueryPlan(PlanKind.MATERIALIZE, table.name, table.name, columns,
                     key_column=", ".join(c.name for c in table.key_columns) or None)


def plan_persistent(
    kind: str | None, name: str, query: ast.Query, source: DataSource, properties: dict[str, Any],
    query_id: str, target: DataSource | None = None, joined: tuple[DataSource, ...] = (),
) -> tuple[DataSource, QueryPlan]:
    """Plan ``CREATE <kind> name AS <query>`` (or ``INSERT INTO target <query>`` when ``kind`` is
    None): the sink it writes and how to compute it. ``joined``: the sources of the query's
    JOINs, in order."""
    if query.limit is not None:
        raise StatementError("LIMIT is not allowed in a persistent query")
    if query.emit_final and query.window is None:
        raise StatementError("EMIT FINAL needs a windowed aggregation (WINDOW ... GROUP BY): it emits each window "
                             "once it closes; use EMIT CHANGES")
    if source.window is not None and (query.joins or query.group_by):
        # As ksqlDB: a windowed table's rows are filtered and projected, window by window.
        raise StatementError(f"{source.name} is a windowed table; {'joining' if query.joins else 'aggregating'} a "
                             "windowed table is not supported: select from it (WHERE, projections), or read the "
                             "stream it aggregates")
    for read in (source, *joined) if query.joins else ():
        if len(read.key_columns) > 1:
            raise StatementError(f"{read.name} has a key of several columns "
                                 f"({', '.join(c.name for c in read.key_columns)}); joining it is not supported yet: "
                                 "re-key it first (CREATE STREAM ... AS SELECT ... PARTITION BY <column>)")
    if query.having is not None and not query.group_by:
        raise StatementError("HAVING needs GROUP BY: it keeps the groups of an aggregation whose aggregates pass it; "
                             "use WHERE to filter records")
    if query.window is not None and not query.group_by:
        raise StatementError(f"WINDOW {query.window.kind} needs GROUP BY: a window groups the records of each key; "
                             "add GROUP BY <key>")
    if query.joins and query.group_by:
        return _joined_aggregation(kind, name, query, source, joined, properties, query_id, target)
    if query.joins:
        partitions = target.partitions if target is not None else int(properties.get("partitions", source.partitions))
        result_kind, columns, plan = plan_join(kind, name, query, source, joined, partitions)
        if result_kind == "STREAM":
            plan = replace(plan, event_time=event_time(source))
        return _result(result_kind, name, columns, plan, source, properties, query_id, target)
    result_kind = _result_kind(source, bool(query.group_by))
    wanted = kind if kind is not None else "STREAM"
    if result_kind != wanted:
        verb = f"CREATE {result_kind} AS SELECT" if kind is not None else "CREATE TABLE AS SELECT"
        raise StatementError(f"invalid result type: the SELECT produces a {result_kind}; use {verb} instead")
    if kind is None and source.kind != "STREAM":
        raise StatementError("INSERT INTO ... SELECT reads a STREAM")
    # Its records' partition and offset too (a table's: the record that last wrote each row).
    # A windowed table's rows have their window's bounds (WINDOWSTART, WINDOWEND) after the key.
    scope = _scope(query, source, (*source.row_columns, *_rowtime(source), *record_places(source)))
    where = None
    if query.where is not None:
        check_condition(query.where, scope, "WHERE")
        where = to_spark(query.where, scope)
    partitions = target.partitions if target is not None else int(properties.get("partitions", source.partitions))
    if source.window is not None and partitions != source.partitions:
        # Its windows leave it by each partition's latest time, as they leave the source's partition.
        raise StatementError(f"a table over the windowed table {source.name} keeps its {source.partitions} partitions: "
                             f"leave PARTITIONS out (it has {partitions})")
    window = window_spec(query.window, source, query.emit_final) if query.window is not None else None
    if query.group_by:
        columns, key_expr, calls = _aggregation(name, query, source, scope)
        having = _check_having(query, columns, calls)
        plan_kind = (PlanKind.AGGREGATE if window is None else PlanKind.SESSION_AGGREGATE
                     if window.kind == "SESSION" else PlanKind.WINDOWED_AGGREGATE)
    else:
        columns, key_expr = _projection(name, query, source, scope)
        calls, having = (), None
        plan_kind = PlanKind.PROJECT
    same_key = key_expr is None
    plan = QueryPlan(
        kind=plan_kind, source=source.name, sink=name, columns=columns, where=where,
        key_column=", ".join(c.name for c in columns if c.key) or None, key_expression=key_expr,
        # A table's aggregation always regroups: each changed row leaves its old group (topology).
        repartition=not same_key or partitions != source.partitions or (source.kind == "TABLE" and bool(calls)),
        aggregates=calls, window=window,
        event_time=event_time(source) if window is not None else None, having=having,
        regrouped=source.partitions if source.kind == "TABLE" and calls else None,
    )
    return _result(result_kind, name, columns, plan, source, properties, query_id, target)


def _joined_aggregation(
    kind: str | None, name: str, query: ast.Query, source: DataSource, joined: tuple[DataSource, ...],
    properties: dict[str, Any], query_id: str, target: DataSource | None,
) -> tuple[DataSource, QueryPlan]:
    """``CREATE TABLE name AS SELECT ... FROM stream JOIN table ... GROUP BY ...``: the join
    (planned as the joined stream it would be, its WHERE included) keyed by the GROUP BY into
    the aggregation, one query (see ``millpond.shared.sql.joins.JoinAggregation``). Over tables
    joined with tables, the joined table's rows are regrouped by the GROUP BY, as any table's."""
    if kind != "TABLE":
        verb = "CREATE TABLE AS SELECT"
        raise StatementError(f"invalid result type: the SELECT produces a TABLE; use {verb} instead")
    aggregation = join_aggregation(query, source, joined)
    tables = source.kind == "TABLE"  # tables joined with tables: their joined rows are regrouped
    _, _, join = plan_join(source.kind, name, pre_aggregation(query), source, joined, source.partitions)
    columns_in = (*aggregation.source.columns, *_rowtime(aggregation.source))
    scope = _scope(aggregation.query, aggregation.source, columns_in)
    try:
        window = (window_spec(query.window, aggregation.source, query.emit_final) if query.window is not None
                  else None)
        columns, key_expression, calls = _aggregation(name, aggregation.query, aggregation.source, scope)
        having = _check_having(aggregation.query, columns, calls)
    except (StatementError, NotFoundError) as error:  # its columns as the statement names them (side.column)
        owners = {**aggregation.resolved.owners, ROWTIME: f"{aggregation.resolved.stream_prefix}.ROWTIME",
                  aggregation.source.name: f"({' JOIN '.join(s.name for s in (source, *joined))})"}
        raise type(error)(re.sub(r"\b[A-Za-z_][A-Za-z0-9_]*\b", lambda m: owners.get(m.group(0), m.group(0)),
                                 error.message)) from error
    plan = QueryPlan(
        kind=PlanKind.AGGREGATE if window is None else PlanKind.SESSION_AGGREGATE if window.kind == "SESSION"
        else PlanKind.WINDOWED_AGGREGATE, source=source.name, sink=name, columns=columns,
        key_column=", ".join(c.name for c in columns if c.key),
        key_expression=(key_expression or next(c.expression for c in columns if c.key)) if tables
        else join.key_expression, repartition=tables or join.repartition,
        aggregates=calls, window=window, having=having, join=join.join,
        regrouped=source.partitions if tables else None,
    )
    return _result("TABLE", name, columns, plan, source, properties, query_id, target)


def _result(result_kind: str, name: str, columns: tuple[OutputColumn, ...], plan: QueryPlan, source: DataSource,
            properties: dict[str, Any], query_id: str, target: DataSource | None) -> tuple[DataSource, QueryPlan]:
    """The sink a persistent query writes (``target`` for INSERT INTO, checked against the
    result's columns), with the plan."""
    keys = [c for c in columns if c.key]
    key_format = check_key_format(str(properties.get("key_format", "JSON" if len(keys) > 1 else "KAFKA")).upper(),
                                  tuple(c.name for c in keys))
    for key in keys:
        check_key_type(key.name, key.type, key_format)
    sink_columns = tuple(Column(c.name, c.type, c.key) for c in columns)
    if target is not None:
        if sink_columns != target.columns:
            raise StatementError(
                f"INSERT INTO {target.name}: the SELECT gives ({DataSource('', '', sink_columns, '', 1).schema_text()}) "
                f"but {target.name} has ({target.schema_text()}); select the same columns, types and key")
        return target, plan
    sink = DataSource(
        kind=result_kind, name=name, columns=sink_columns,
        topic=check_topic_name(str(properties.get("kafka_topic", name)),
                               f"; {name} needs WITH (KAFKA_TOPIC='...'): its topic is named after it otherwise"),
        partitions=int(properties.get("partitions", source.partitions)),
        key_format=key_format, value_format=str(properties.get("value_format", source.value_format)).upper(),
        query_id=query_id, value_delimiter=str(properties.get("value_delimiter", source.value_delimiter)),
        timestamp=check_timestamp(properties, sink_columns),
        # A windowed table's projection keeps its rows' windows: its keys are the source's.
        window=plan.window if plan.window is not None or plan.kind is not PlanKind.PROJECT else source.window,
        timestamp_format=properties.get("timestamp_format"),
    )
    return sink, plan


MAX_DURATION_MS = 100 * 365 * 86_400_000
"""The longest window duration a statement may give."""
MAX_WINDOWS_PER_RECORD = 10_000
"""The most hopping windows one record may fall in (SIZE / ADVANCE BY)."""
DEFAULT_GRACE_MS = 24 * 3_600_000
"""A window's grace period when the statement gives none (ksqlDB's and Kafka Streams' old default)."""
MIN_RETENTION_MS = 24 * 3_600_000
"""The least default retention of a window store (Kafka Streams': one day)."""


def window_spec(window: ast.Window, source: DataSource, emit_final: bool = False) -> WindowSpec:
    """The windows of ``WINDOW ...`` over ``source``, with ksqlDB's defaults and checks."""
    if source.kind != "STREAM":
        raise StatementError(f"WINDOW applies to streams; {source.name} is a TABLE, whose rows have no window")
    if window.kind == "SESSION" and emit_final:
        raise StatementError("EMIT FINAL applies to TUMBLING and HOPPING windows; a session table emits every "
                             "change (EMIT CHANGES)")
    if window.size_ms <= 0:
        what = "gap" if window.kind == "SESSION" else "SIZE"
        raise StatementError(f"the WINDOW {window.kind} {what} must be a positive duration; got {window.size_ms} ms")
    advance = window.size_ms if window.advance_ms is None else window.advance_ms
    if not 0 < advance <= window.size_ms:
        raise StatementError(f"ADVANCE BY must be a positive duration no longer than the SIZE ({window.size_ms} ms); "
                             f"got {advance} ms")
    grace = DEFAULT_GRACE_MS if window.grace_ms is None else window.grace_ms
    least = window.size_ms + grace
    retention = max(least, MIN_RETENTION_MS) if window.retention_ms is None else window.retention_ms
    for name, ms in (("SIZE" if window.kind != "SESSION" else "gap", window.size_ms), ("ADVANCE BY", advance),
                     ("GRACE PERIOD", grace), ("RETENTION", retention)):
        if ms > MAX_DURATION_MS:
            raise StatementError(f"the WINDOW {window.kind} {name} is {ms} ms; at most {MAX_DURATION_MS} ms "
                                 "(100 years)")
    if (windows := -(-window.size_ms // advance)) > MAX_WINDOWS_PER_RECORD:  # up to ceil(size / advance) each
        raise StatementError(f"WINDOW HOPPING (SIZE {window.size_ms} ms, ADVANCE BY {advance} ms) puts a record in up "
                             f"to {windows} windows; at most {MAX_WINDOWS_PER_RECORD}: advance by more")
    if retention < least:
        raise StatementError(f"RETENTION ({retention} ms) must be at least the window SIZE plus its GRACE PERIOD "
                             f"({least} ms): a window must stay until it closes")
    return WindowSpec(window.kind, window.size_ms, advance, grace, retention, emit_final)


def event_time(source: DataSource) -> str | None:
    """Spark SQL giving a record's event time in epoch milliseconds: the source's TIMESTAMP
    column, or None for the Kafka record's timestamp (ROWTIME)."""
    if source.timestamp is None:
        return None
    column = quote_identifier(source.timestamp)
    if source.timestamp_format is not None:  # text that does not parse has no event time (processing log)
        return f"unix_millis(try_to_timestamp({column}, {spark_literal(source.timestamp_format)}))"
    return f"unix_millis({column})" if source.schema[source.timestamp].base == "TIMESTAMP" else column


def _source_key_ref(expr: ast.Expr, source: DataSource) -> bool:
    """Whether ``expr`` is the source's one key column (a record keyed by it keeps its key)."""
    keys = source.key_columns
    return len(keys) == 1 and isinstance(expr, ast.ColumnRef) and expr.name == keys[0].name


def _key_first(columns: list[OutputColumn]) -> tuple[OutputColumn, ...]:
    return tuple(sorted(columns, key=lambda c: not c.key))


def _missing_key(name: str, what: str, expr: ast.Expr) -> StatementError:
    return StatementError(f"key missing from projection: the query that builds {name} must select "
                          f"the {what} {to_sql(expr)} (for example SELECT {to_sql(expr)}, ...)")


def _aggregation(
    name: str, query: ast.Query, source: DataSource, scope: Scope,
) -> tuple[tuple[OutputColumn, ...], str | None, tuple[AggregateCall, ...]]:
    """A GROUP BY's result columns (one key column per grouping expression, in SELECT order,
    first), the Spark SQL of its key when records must be re-keyed (a key of several columns
    is a ``named_struct`` of them, NULL when any is NULL), and its aggregate calls."""
    if query.partition_by is not None:
        raise StatementError("PARTITION BY cannot be combined with GROUP BY; GROUP BY already keys the result")
    groups = query.group_by
    twice = next((g for i, g in enumerate(groups) if g in groups[:i]), None)
    if twice is not None:
        raise StatementError(f"GROUP BY names {to_sql(twice)} twice; group by it once")
    group_types = {group: check(group, scope) for group in groups}
    columns: list[OutputColumn] = []
    calls: list[AggregateCall] = []
    keys: dict[ast.Expr, str] = {}
    derived, hidden, _ = aggregates_over_result(query)
    for out, expr in _expand(query, source):
        if query.window is not None and out in WINDOW_BOUNDS:  # a key, an aggregate or the bound itself
            raise _window_bound_named(out, expr)
        if out in derived:
            _check_over_aggregates(out, expr, groups, query.window is not None and not any(
                bound in source.schema for bound in WINDOW_BOUNDS))
            columns.append(OutputColumn(out, SqlType("NULL"), ""))  # typed below, over the result
            continue
        if expr in group_types:
            if expr in keys:
                raise StatementError(f"the GROUP BY expression {to_sql(expr)} is selected twice (as {keys[expr]} and "
                                     f"{out}): a key column is selected once")
            keys[expr] = out
            columns.append(OutputColumn(out, *key_typed(group_types[expr], to_spark(expr, scope)), key=True))
            continue
        if query.window is not None and isinstance(expr, ast.ColumnRef) and expr.name in WINDOW_BOUNDS \
                and expr.name not in source.schema:
            # A window bound as a value column of the result (its expression names the bound).
            columns.append(OutputColumn(out, SqlType("BIGINT"), expr.name))
            continue
        if not isinstance(expr, ast.Call) or aggregates.lookup(expr.name) is None:
            raise _not_grouped(out, expr, groups)
        result, call = _aggregate_call(out, expr, source, scope)
        columns.append(OutputColumn(out, result, call.shown()))
        calls.append(call)
    for expr, held in hidden.items():
        assert isinstance(expr, ast.Call)
        result, call = _aggregate_call(held, expr, source, scope)
        calls.append(replace(call, result=result))
    if derived:
        over = Scope("the result of the GROUP BY", {**{c.name: c.type for c in columns if c.expression},
                                                   **{c.column: c.result for c in calls if c.result is not None},
                                                   **dict.fromkeys(WINDOW_BOUNDS, SqlType("BIGINT"))})
        columns = [replace(c, type=check(derived[c.name], over), expression=to_sql(derived[c.name]))
                   if c.name in derived else c for c in columns]
    missing = next((g for g in groups if g not in keys), None)
    if missing is not None:
        raise _missing_key(name, "grouping expression", missing)
    reserved = next((c.name for c in source.columns if c.name in (aggregates.SIGN_COLUMN, "_INPUT_ROWTIME")), None)
    if source.kind == "TABLE" and reserved is not None:
        raise StatementError(f"{source.name} has a column named {reserved}, which an aggregation of a table uses for "
                             "its own; aggregate a copy with the column renamed (CREATE TABLE ... AS SELECT ... AS ...)")
    if source.kind == "TABLE" and not calls:
        raise StatementError(f"a GROUP BY of the TABLE {source.name} needs an aggregate, which says when a group "
                             "has no rows left: select one (SELECT ..., COUNT(*) AS rows)")
    ordered = _key_first(columns)
    if len(groups) == 1:
        moved = not _source_key_ref(groups[0], source)
        return ordered, key_typed(group_types[groups[0]], to_spark(groups[0], scope))[1] if moved else None, tuple(calls)
    for column in ordered:
        if column.key:
            check_key_type(column.name, column.type, "JSON")
    return ordered, _struct_key(ordered), tuple(calls)


def _not_grouped(out: str, expr: ast.Expr, groups: Sequence[ast.Expr]) -> StatementError:
    shown = to_sql(expr) if out == to_sql(expr) else f"{out} ({to_sql(expr)})"
    grouping = ", ".join(to_sql(g) for g in groups)
    return StatementError(f"{shown} is neither an aggregate nor {'the' if len(groups) == 1 else 'a'} GROUP BY "
                          f"expression {grouping}, nor an expression over them; aggregate it or group by it")


def _check_over_aggregates(out: str, expr: ast.Expr, groups: Sequence[ast.Expr], bounds: bool) -> None:
    """Refuse an expression over aggregates that reads a column outside them and the GROUP BY
    expressions (a window's bounds aside, ``bounds``): the result row has no such column."""
    stray: list[ast.Expr] = []

    def note(node: ast.Expr) -> ast.Expr | None:
        if _is_aggregate(node) or node in groups or (bounds and isinstance(node, ast.ColumnRef) and node.name in WINDOW_BOUNDS):
            return node
        if isinstance(node, ast.ColumnRef):
            stray.append(node)
            return node
        return None

    ast.replace_nodes(expr, note)
    if stray:
        raise StatementError(f"{out} ({to_sql(expr)}) reads {to_sql(stray[0])} outside its aggregates, and "
                             f"{to_sql(stray[0])} is not {'the' if len(groups) == 1 else 'a'} GROUP BY expression "
                             f"({', '.join(to_sql(g) for g in groups)}): aggregate it or group by it")


def _aggregate_call(out: str, expr: ast.Call, source: DataSource, scope: Scope) -> tuple[SqlType, AggregateCall]:
    """An aggregate call's result type, and the call as a plan keeps it (in column ``out``)."""
    result = check(expr, scope, aggregates_allowed=True)
    if source.kind == "TABLE" and aggregates.require(expr.name).undo is None:
        undone = ", ".join(a.name for a in aggregates.AGGREGATES.values() if a.undo is not None)
        raise StatementError(f"{expr.name.upper()} cannot aggregate the TABLE {source.name}: a table's row that "
                             f"changes or is deleted is taken back out of its group, which {expr.name.upper()} "
                             f"cannot do; on a table use {undone}, or aggregate the stream it comes from")
    aggregate = aggregates.require(expr.name)
    argument = "1" if expr.star else to_spark(expr.args[0], scope) if aggregate.columns == 1 else \
        aggregates.pair_argument(*(to_spark(arg, scope) for arg in expr.args))
    literals = aggregate.literals(aggregate.name, expr.args[1:]) if aggregate.literals is not None else ()
    return result, AggregateCall(out, expr.name, argument, literals)


def _struct_key(columns: Sequence[OutputColumn]) -> str:
    """Spark SQL of a key of several columns as one value: a ``named_struct`` of them, in
    order (its JSON is the key), NULL when any is NULL."""
    parts = [(c.name, f"({c.expression})") for c in columns if c.key]
    null = " OR ".join(f"{e} IS NULL" for _, e in parts)
    fields = ", ".join(f"{spark_literal(n)}, {e}" for n, e in parts)
    return f"IF({null}, NULL, named_struct({fields}))"


def _is_aggregate(node: ast.Expr) -> bool:
    return isinstance(node, ast.Call) and aggregates.lookup(node.name) is not None


def aggregates_over_result(query: ast.Query) -> tuple[dict[str, ast.Expr], dict[ast.Expr, str], ast.Expr | None]:
    """A GROUP BY query's value columns that compute over its aggregates (``SUM(x) / COUNT(*)``,
    ``ROUND(AVG(x), 2)``), by name, each as an expression over the result row: its aggregate
    calls and GROUP BY expressions replaced by the columns that hold them. Each aggregate call
    no column selects as it is (in those, or in HAVING), with the name of the column held apart
    for it (``KSQL_AGG_VARIABLE_<n>``, as ksqlDB names them; not in the table). And its HAVING
    over the result row the same way. What the planner checks and the workers evaluate on every
    row of the table, from the statement (over a join, from ``join_aggregation``'s query over
    the joined row, where each column is known by its side: ``SUM(o.amount)`` is not
    ``SUM(p.amount)``)."""
    selected = {item.expr: output_name(item, i) for i, item in enumerate(query.items) if item.expr is not None}
    taken = {output_name(item, i) for i, item in enumerate(query.items)}
    groups = set(query.group_by)
    hidden: dict[ast.Expr, str] = {}

    def swap(node: ast.Expr) -> ast.Expr | None:
        if _is_aggregate(node):
            if node in selected:
                return ast.ColumnRef(selected[node])
            if node not in hidden:
                number = len(hidden)
                while f"KSQL_AGG_VARIABLE_{number}" in taken:
                    number += 1
                hidden[node] = f"KSQL_AGG_VARIABLE_{number}"
                taken.add(hidden[node])
            return ast.ColumnRef(hidden[node])
        if node in groups and node in selected:
            return ast.ColumnRef(selected[node])
        return None

    derived: dict[str, ast.Expr] = {}
    for index, item in enumerate(query.items):
        expr = item.expr
        if expr is not None and expr not in groups and not _is_aggregate(expr) and _holds_aggregate(expr):
            derived[output_name(item, index)] = ast.replace_nodes(expr, swap)
    having = None if query.having is None else ast.replace_nodes(query.having, swap)
    return derived, hidden, having


def _holds_aggregate(expr: ast.Expr) -> bool:
    found = False

    def note(node: ast.Expr) -> ast.Expr | None:
        nonlocal found
        found = found or _is_aggregate(node)
        return node if found else None

    ast.replace_nodes(expr, note)
    return found


def having_over_result(query: ast.Query) -> ast.Expr | None:
    """A GROUP BY query's HAVING over its result row (``aggregates_over_result``): each
    aggregate call and the GROUP BY expression replaced by the column that holds it."""
    return aggregates_over_result(query)[2]


def _check_having(query: ast.Query, columns: tuple[OutputColumn, ...], calls: Sequence[AggregateCall]) -> str | None:
    """HAVING checked over the result's columns (and the aggregates held apart, ``calls``): SQL
    text of it for EXPLAIN (None without one)."""
    having = having_over_result(query)
    if having is None:
        return None
    scope = Scope("the result of the GROUP BY", {c.name: c.type for c in columns}
                  | {c.column: c.result for c in calls if c.result is not None})
    try:
        check_condition(having, scope, "HAVING")
    except NotFoundError as error:
        raise StatementError(f"HAVING may use the GROUP BY expression and the aggregates of the SELECT list "
                             f"({', '.join(c.name for c in columns)}): {error.message}") from None
    return to_sql(having)


def _window_bound_named(out: str, expr: ast.Expr) -> StatementError:
    """The error for a windowed table's column named as a window's bound (WINDOWSTART, WINDOWEND)."""
    bound = isinstance(expr, ast.ColumnRef) and expr.name in WINDOW_BOUNDS
    return StatementError(f"{out} is a reserved column name of windowed tables; give "
                          + (f"it an alias (SELECT {out} AS {out[6:].lower()}_time, ...)" if bound
                             else f"{to_sql(expr)} another alias (SELECT ... AS ...)"))


def _projection(
    name: str, query: ast.Query, source: DataSource, scope: Scope,
) -> tuple[tuple[OutputColumn, ...], str | None]:
    partition_by = query.partition_by
    if partition_by is not None and source.kind == "TABLE":
        raise StatementError("PARTITION BY applies to streams; a table is keyed by its PRIMARY KEY")
    if partition_by is not None:
        check(partition_by, scope)
    key_exprs: tuple[ast.Expr, ...] = (partition_by,) if partition_by is not None else tuple(
        ast.ColumnRef(c.name) for c in source.key_columns)
    columns: list[OutputColumn] = []
    chosen: set[ast.Expr] = set()
    for out, expr in _expand(query, source):
        if source.window is not None and out in WINDOW_BOUNDS:  # its rows have their own (``row_columns``)
            raise _window_bound_named(out, expr)
        item = exploded_item(expr, scope)
        if item is not None:
            assert isinstance(expr, ast.Call)
            if source.kind == "TABLE":
                raise StatementError(f"{expr.name} makes several rows of one record: it reads a STREAM, and "
                                     f"{source.name} is a TABLE")
            items = to_spark(expr.args[0], scope)
            columns.append(OutputColumn(out, item, arrays.cube_in_spark(items) if expr.name == "CUBE_EXPLODE" else items,
                                        exploded=True))
            continue
        type_ = check(expr, scope)
        # The same expression selected twice: the first one is the key.
        key = expr in key_exprs and expr not in chosen
        chosen.add(expr)
        spark = to_spark(expr, scope)
        columns.append(OutputColumn(out, *key_typed(type_, spark), key=True) if key else OutputColumn(out, type_, spark))
    missing = next((e for e in key_exprs if e not in chosen), None)
    if missing is not None:
        raise _missing_key(name, "partitioning expression" if partition_by is not None else "key column", missing)
    ordered = _key_first(columns)
    if partition_by is None and len(key_exprs) > 1:
        # A key of several columns selected in another order is written in that order (re-keyed).
        same = [(c.name, c.expression) for c in ordered if c.key] == [
            (c.name, quote_identifier(c.name)) for c in source.key_columns]
        if not same and source.kind == "TABLE":
            raise StatementError(f"select {source.name}'s key columns in its key's order and by their names "
                                 f"({', '.join(c.name for c in source.key_columns)}): a table's rows keep their key")
        return ordered, None if same else _struct_key(ordered)
    moved = partition_by is not None and not _source_key_ref(partition_by, source)
    return ordered, (key_typed(check(partition_by, scope), to_spark(partition_by, scope))[1]
                     if moved and partition_by is not None else None)


@dataclass(frozen=True)
class EncodedRecord:
    """An INSERT ... VALUES row as the Kafka record to produce."""

    key: bytes | None
    value: bytes
    partition: int | None
    """murmur2 of the key, as the Java client picks it; None for a keyless stream."""
    timestamp: int | None = None
    """The record's timestamp when the INSERT sets ROWTIME; None: the producer's clock."""


def _inserted(value: Any, type_: SqlType, name: str, source: DataSource) -> Any:
    """A VALUES value checked against its column's type and given as the record will hold it,
    so a row INSERT acknowledges is one the persistent queries read, not one they set aside:
    BYTES as base64 text (as JSON holds them) decoded to the bytes (a KAFKA key holds them as
    they are, a DELIMITED field as their UTF-8 text), a DATE or TIME as ISO text, a DECIMAL
    rounded half up to its scale and within its precision; an ARRAY's items, a MAP's keys and
    values and a STRUCT's fields (by name, those not given NULL) each so (``name`` says where)."""
    if value is None:
        return None
    base = type_.base
    if base in _COMPOSITE:  # of the column's shape (``_fits``)
        if base == "ARRAY":
            return [_inserted(item, type_.params[0], f"{name}[{i}]", source) for i, item in enumerate(value, 1)]
        if base == "MAP":
            return {_inserted(k, type_.params[0], f"a key of {name}", source):
                    _inserted(v, type_.params[1], f"{name}[{k!r}]", source) for k, v in value.items()}
        fields = dict(type_.params)
        if unknown := [field for field in value if field not in fields]:
            raise StatementError(f"column {name} is {type_}, which has no field {unknown[0]}")
        return {field: _inserted(value.get(field), field_type, f"{name}->{field}", source)
                for field, field_type in type_.params}
    if base == "BYTES":
        try:
            data = base64_bytes(value) if isinstance(value, str) else None
        except ValueError:
            data = None
        if data is None:
            raise StatementError(f"column {name} is BYTES: give its value as base64 text (such as 'AAEC' for the "
                                 f"bytes 00 01 02), not {value!r}")
        if source.value_format == "DELIMITED" and not any(c.name == name for c in source.key_columns):
            try:
                return data.decode()
            except UnicodeDecodeError:
                raise StatementError(f"column {name} is BYTES of a DELIMITED value, which holds them as UTF-8 text: "
                                     f"the bytes of {value!r} are not UTF-8") from None
        return data
    if base in ("DATE", "TIME", "DECIMAL"):
        example = {"DATE": "'2026-01-02'", "TIME": "'03:04:05.678'", "DECIMAL": "a number"}[base]
        if (base == "DECIMAL") == isinstance(value, str):
            raise StatementError(f"column {name} is {type_}: give {example}, not {value!r}")
        try:
            return stored(coerce(value, type_, name), type_)
        except (ValueError, ArithmeticError) as error:
            raise StatementError(f"column {name} is {type_} but {value!r} is not one: {error}") from None
    return coerce(value, type_, name)


_COMPOSITE = frozenset({"ARRAY", "MAP", "STRUCT"})


def _fits(given: SqlType, column: SqlType) -> bool:
    """Whether a VALUES expression of type ``given`` has the shape of ``column``'s ARRAYs, MAPs
    and STRUCTs (a STRUCT's fields those of the column's, or some of them); scalars are checked
    by their values (``_inserted``)."""
    if given.base == "NULL" or (given.base not in _COMPOSITE and column.base not in _COMPOSITE):
        return True
    if given.base != column.base:
        return False
    if given.base == "STRUCT":
        fields = dict(column.params)
        return all(field in fields and _fits(type_, fields[field]) for field, type_ in given.params)
    return all(_fits(a, b) for a, b in zip(given.params, column.params, strict=True))


VALUES_SCOPE = Scope("the VALUES of an INSERT (literals and expressions of them)", {})


LATEST_ROWTIME_MS = 253_402_300_799_999
"""The latest ROWTIME an INSERT gives a record: ``LATEST_TIMESTAMP`` in epoch milliseconds, as
every reader holds it (Spark's Kafka source fails every batch on a record timestamp near 2^63)."""


def encode_insert(stmt: ast.InsertValues, source: DataSource) -> EncodedRecord:
    """Check an INSERT ... VALUES against its target (from ``Metastore.insert_target``) and
    serialize the row per its formats."""
    names = list(stmt.columns) if stmt.columns is not None else [c.name for c in source.columns]
    if len(names) != len(stmt.values):
        raise StatementError(f"INSERT names {len(names)} columns but gives {len(stmt.values)} values")
    schema = {**source.schema, **{c.name: c.type for c in _rowtime(source)}}
    row: dict[str, Any] = {}
    for name, expr in zip(names, stmt.values, strict=True):
        if name not in schema:
            raise NotFoundError(f"{source.name} has no column {name}; its columns are {', '.join(schema)}")
        if name in row:
            raise StatementError(f"INSERT names the column {name} twice")
        given = check(expr, VALUES_SCOPE)  # ill-typed values ('a' - 1) are refused, not computed
        if not _fits(given, schema[name]):  # (a MAP and a STRUCT are both a dict in Python)
            raise StatementError(f"column {name} is {schema[name]}, and {to_sql(expr)} is {given}")
        try:  # (INT and BIGINT arithmetic wrapping as Java's, as ksqlDB computes it)
            value = evaluate(with_widths(expr, VALUES_SCOPE), {})
        except (ArithmeticError, TypeError, ValueError) as error:
            raise StatementError(f"the value for {name}, {to_sql(expr)}, cannot be computed: {error}") from error
        row[name] = _inserted(value, schema[name], name, source)
        if schema[name].base == "TIMESTAMP" and value is not None:
            try:  # as every query reads it: else the record would only reach the processing log
                timestamp_text(value)
            except ValueError as error:
                raise StatementError(f"the value for {name}, {to_sql(expr)}, is not a TIMESTAMP: give epoch "
                                     "milliseconds or ISO 8601 text such as '2026-01-02T03:04:05.678+01:00'") from error
    keys = source.key_columns
    for column in keys:
        if row.get(column.name) is None:
            raise StatementError(f"the key column {column.name} of {source.name} needs a value that is not NULL")
    key = encode_key([row[c.name] for c in keys], keys) if keys else None
    values = source.value_columns
    value = serialize_value([c.name for c in values], [row.get(c.name) for c in values],
                            source.value_format, source.value_delimiter)
    timestamp = row.get(ROWTIME) if ROWTIME not in source.schema else None
    if timestamp is not None and not 0 <= timestamp <= LATEST_ROWTIME_MS:
        raise StatementError(f"ROWTIME must be epoch milliseconds from 0 to {LATEST_ROWTIME_MS} "
                             f"({LATEST_TIMESTAMP.isoformat(timespec='milliseconds')}); got {timestamp}")
    return EncodedRecord(key, value, partition_for(key, source.partitions) if key is not None else None, timestamp)
