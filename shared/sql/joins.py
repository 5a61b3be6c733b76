"""Planning of joins, as ksqlDB's: ``SELECT ... FROM stream [alias] [INNER|LEFT] JOIN table
[alias] ON <stream expression> = <table's PRIMARY KEY>``, ``SELECT ... FROM table [alias]
[INNER|LEFT|RIGHT|FULL OUTER] JOIN table [alias] ON <PRIMARY KEY> = <PRIMARY KEY>``, its
foreign-key form ``FROM t1 [INNER|LEFT] JOIN t2 ON t1.column = t2.<PRIMARY KEY>``, and two
streams joined ``WITHIN`` a window on their keys.

Both sides' columns live in one joined row, each named ``<side>_<column>`` (the side's alias,
else its name: ksqlDB's names for ``SELECT *``). A query's column references are rewritten
to those names once (``resolve_join``), so the type checker, the Spark compiler and the
Python evaluator read a join as they read one source. The planner and the worker's join
task both call ``resolve_join`` on the same statement and the sources stored in the plan, so
they agree on every name. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from millpond.shared.catalog.plans import PlanKind
from millpond.shared.catalog.queries import JoinedTable, JoinSpec, JoinWindow, OutputColumn, QueryPlan
from millpond.shared.catalog.sources import Column, DataSource
from millpond.shared.errors import NotFoundError, StatementError
from millpond.shared.sql import ast
from millpond.shared.sql.ast import SqlType, to_sql
from millpond.shared.sql.expressions import output_name, quote_identifier, to_spark
from millpond.shared.sql.types import (
    RECORD_PLACES,
    RECORD_PLACES_READ,
    Scope,
    check,
    check_condition,
    key_typed,
    with_widths,
)

ROWTIME = "ROWTIME"
STREAM_TABLE_TYPES = ("INNER", "LEFT")
"""The join types ksqlDB allows between a stream and a table."""
TABLE_TABLE_TYPES = ("INNER", "LEFT", "RIGHT", "FULL")
"""The join types ksqlDB allows between two tables (and two streams)."""
DEFAULT_JOIN_GRACE_MS = 24 * 3_600_000
"""A stream-stream join's grace period without GRACE PERIOD (ksqlDB's and Kafka Streams' legacy default)."""


@dataclass(frozen=True)
class ResolvedJoin:
    """A join query with every column reference named in the joined row."""

    stream_prefix: str
    table_prefixes: tuple[str, ...]
    """Each joined table's prefix, in the order of the JOINs."""
    scope: Scope
    """The joined row's columns: the stream's (and its ROWTIME), then each table's."""
    items: tuple[tuple[str, ast.Expr], ...]
    """The SELECT list with ``*`` expanded: (output name, expression over the joined row)."""
    where: ast.Expr | None
    stream_key: ast.Expr
    """The first JOIN's left side (an expression of the stream), over the joined row."""
    stream_key_spark: str
    """The same over the stream's own columns, as Spark SQL (what a repartition keys by)."""
    table_keys: tuple[str, ...]
    """Each table's PRIMARY KEY column in the joined row."""
    key_item: int
    """Which SELECT item is the result's key (the last join's expression, of either side)."""
    conditions: tuple[ast.Expr, ...]
    """Each JOIN's ON condition over the joined row."""
    owners: dict[str, str]
    """Each column of the joined row as the query names it (``side.column``)."""
    foreign_key: str | None = None
    """A foreign-key join's column of the left table in the joined row (the result is keyed
    by the left table's key); None when the join matches keys."""
    rename: Callable[[ast.Expr], ast.Expr] | None = field(default=None, compare=False, repr=False)
    """An expression of the query's (its columns as it names them) over the joined row."""
    step_keys: tuple[ast.Expr, ...] = ()
    """Each join stage's expression of the joined row so far (its left side), which keys its
    records: the stream's (``stream_key``) first, then each other a later JOIN matches."""
    steps: tuple[int, ...] = ()
    """Each JOIN's stage: the place of its left side among ``step_keys``."""
    foreign_keys: tuple[str | None, ...] = ()
    """Each JOIN's foreign key, in the joined row: for tables joined with tables, the column of
    the rows joined before that it matches with the table's PRIMARY KEY; None for a JOIN on the
    first table's key (and for a stream's)."""

    def shown(self, expr: ast.Expr) -> str:
        """An expression over the joined row as SQL text (``side.column``)."""
        return qualified(expr, self.owners)

    @staticmethod
    def names(prefix: str, side: DataSource) -> list[str]:
        """The joined row's names of one side's columns, in that side's order."""
        return [joined(prefix, c.name) for c in side.columns]


def joined(prefix: str, column: str) -> str:
    """A side's column as the joined row names it."""
    return f"{prefix}_{column}"


def _sides(query: ast.Query, stream: DataSource, tables: tuple[DataSource, ...]) -> tuple[str, tuple[str, ...]]:
    """Each side's prefix, with ksqlDB's checks of the join's shape."""
    if len(tables) != len(query.joins):
        raise StatementError("every JOIN needs the source it names")
    for join, table in zip(query.joins, tables, strict=True):
        if stream.kind == "TABLE" and table.kind == "STREAM":
            raise StatementError(f"invalid join order: {stream.name} is a TABLE and {table.name} a STREAM; "
                                 f"a stream-table join reads the stream first: FROM {table.name} JOIN {stream.name}")
        if stream.kind == "STREAM" and table.kind == "STREAM":
            if join.within is None:
                raise StatementError(f"stream-stream joins need a join window: add WITHIN <duration> before ON "
                                     f"({stream.name} and {table.name} are both streams)")
            continue
        if join.within is not None:
            raise StatementError(f"WITHIN applies to stream-stream joins; {table.name} is a TABLE, whose current row "
                                 "each record joins: remove WITHIN")
        if stream.kind == "STREAM" and join.kind not in STREAM_TABLE_TYPES:
            raise StatementError(f"{join.kind} OUTER joins between a stream and a table are not supported (as "
                                 "ksqlDB); use INNER or LEFT JOIN")
        for side in (stream, table):
            if side.window is not None:
                raise StatementError(f"{side.name} is a windowed table; joining a windowed table is not supported")
    if stream.name in (table.name for table in tables):
        raise StatementError(f"{stream.name} is joined with itself; a self-join is not supported yet: copy it into "
                             "another stream or table first (CREATE ... AS SELECT * FROM ...)")
    names = [table.name for table in tables]
    for name in names:
        if names.count(name) > 1:
            raise StatementError(f"{name} is joined twice; a query may join each source once: copy it into "
                                 "another stream or table first (CREATE ... AS SELECT * FROM ...)")
    topics = [side.topic for side in (stream, *tables)]
    # Two sides each copied by a stage (tables joined with tables, or a stream joined anywhere).
    for topic in topics if stream.kind == tables[0].kind or "STREAM" in (t.kind for t in tables[1:]) else ():
        if topics.count(topic) > 1:
            raise StatementError(f"two sides of the join read the topic {topic}; join sources of different topics")
    stream_prefix = query.alias or stream.name
    prefixes = tuple(join.alias or table.name for join, table in zip(query.joins, tables, strict=True))
    named = [stream_prefix, *prefixes]
    for prefix in named:
        if named.count(prefix) > 1:
            raise StatementError(f"two sides of the join are named {prefix}; give each an alias of its own "
                                 f"(FROM {stream.name} a JOIN {tables[0].name} b ...)")
    return stream_prefix, prefixes


def resolve_join(query: ast.Query, stream: DataSource, tables: tuple[DataSource, ...]) -> ResolvedJoin:
    """``query``'s joins checked and its columns named in the joined row (see the module)."""
    stream_prefix, prefixes = _sides(query, stream, tables)
    stream_columns = {c.name: c.type for c in stream.columns}
    if ROWTIME not in stream_columns and stream.kind == "STREAM":  # a table's rows keep no time
        stream_columns[ROWTIME] = SqlType("BIGINT")
    sides = ((stream_prefix, stream.name, stream_columns),
             *((prefix, table.name, {c.name: c.type for c in table.columns})
               for prefix, table in zip(prefixes, tables, strict=True)))
    schema: dict[str, SqlType] = {}
    owners: dict[str, str] = {}
    for prefix, _, columns in sides:
        for name, type_ in columns.items():
            flat = joined(prefix, name)
            if flat in owners:
                raise StatementError(f"{owners[flat]} and {prefix}.{name} would both be {flat} in the joined row; "
                                     "give one side another alias")
            owners[flat], schema[flat] = f"{prefix}.{name}", type_
    scope = Scope(" JOIN ".join(side[1] for side in sides), schema)
    shown = partial(qualified, owners=owners)
    stream_names = {joined(stream_prefix, name) for name in stream_columns}

    def name_of(ref: ast.ColumnRef) -> ast.ColumnRef:
        if ref.qualifier is not None:
            side = next((s for s in sides if ref.qualifier in (s[0], s[1])), None)
            if side is None:
                raise NotFoundError(f"{ref.qualifier}.{ref.name}: the query joins "
                                    f"{', '.join(s[0] for s in sides)}, not {ref.qualifier}")
            if ref.name not in side[2]:
                raise NotFoundError(f"column {ref.qualifier}.{ref.name} does not exist; " + (
                    RECORD_PLACES_READ if ref.name in RECORD_PLACES
                    else f"{side[1]}'s columns are {', '.join(c for c in side[2] if c != ROWTIME)}"))
            return ast.ColumnRef(joined(side[0], ref.name))
        found = [s for s in sides if ref.name in s[2]]
        if ref.name == ROWTIME:
            found = found[:1]  # the stream record's time: table rows keep none
        if len(found) > 1:
            raise StatementError(f"column {ref.name} is ambiguous: {' and '.join(s[0] for s in found)} have it; "
                                 f"qualify it ({' or '.join(f'{s[0]}.{ref.name}' for s in found)})")
        if not found:
            raise NotFoundError(f"column {ref.name} does not exist in {' or '.join(s[1] for s in sides)}"
                                + (f": {RECORD_PLACES_READ}" if ref.name in RECORD_PLACES else ""))
        return ast.ColumnRef(joined(found[0][0], ref.name))

    conditions: list[ast.Expr] = []
    table_keys: list[str] = []
    step_keys: list[ast.Expr] = []
    steps: list[int] = []
    foreign_keys: list[str | None] = []
    left_names = set(stream_names)  # what a JOIN's left side may read: the stream's columns and those joined before
    left_key = None if stream.key_column is None else ast.ColumnRef(joined(stream_prefix, stream.key_column.name))
    for join, table, prefix in zip(query.joins, tables, prefixes, strict=True):
        condition = _map_columns(join.on, name_of)
        this_key, table_key = _condition(condition, shown, left_names, stream_prefix, prefix, stream, table,
                                         first=not conditions)
        left_type, right_type = check(this_key, scope), schema[table_key]
        if left_type != right_type:
            raise StatementError(f"invalid join condition {shown(condition)}: the two sides must have the same "
                                 f"type; {shown(this_key)} is {left_type} and {shown(ast.ColumnRef(table_key))} is "
                                 f"{right_type}: CAST one side")
        after_streams = bool(conditions) and tables[len(conditions) - 1].kind == "STREAM"
        matched = next((j.kind for j, k, f in zip(query.joins, table_keys, foreign_keys, strict=False)
                        if f is None and ast.ColumnRef(k) == this_key), None) if stream.kind == "TABLE" else None
        if matched == "INNER":  # the key of a table INNER JOINed on the first table's key: the same values
            this_key = left_key if left_key is not None else this_key
        elif matched is not None:
            raise StatementError(f"invalid join condition {shown(condition)}: {shown(this_key)} is the key of a table "
                                 f"{matched} JOINed on {stream.name}'s key, NULL where it has no row; join on "
                                 f"{shown(left_key) if left_key is not None else stream.name + ' key'} instead")
        # Tables joined with tables stay keyed by the first table's key: the JOINs on it share a
        # stage; one on another column (a foreign key of the rows joined so far) has a stage of
        # its own, and so has every JOIN after it.
        foreign = stream.kind == "TABLE" and this_key != left_key
        if stream.kind == "TABLE":
            another = not step_keys or foreign or any(f is not None for f, s in zip(foreign_keys, steps, strict=True)
                                                       if s == len(step_keys) - 1)
        else:
            # The rows re-keyed by it; a stream joins them in a stage of its own (both copied).
            another = not step_keys or this_key != step_keys[-1] or after_streams or table.kind == "STREAM"
        if another:
            step_keys.append(this_key)
        if foreign:
            assert isinstance(this_key, ast.ColumnRef)
            if join.kind not in STREAM_TABLE_TYPES:
                raise StatementError(f"{join.kind} OUTER foreign-key joins are not supported (as ksqlDB); "
                                     "use INNER or LEFT JOIN")
            if schema[this_key.name].base == "BYTES":
                raise StatementError(f"{shown(this_key)} is BYTES; a foreign key of type BYTES is not supported: "
                                     "join on a VARCHAR, INT, BIGINT or DOUBLE key")
        foreign_keys.append(this_key.name if foreign and isinstance(this_key, ast.ColumnRef) else None)
        steps.append(len(step_keys) - 1)
        conditions.append(condition)
        table_keys.append(table_key)
        left_names |= set(ResolvedJoin.names(prefix, table))
    stream_key = step_keys[0]
    foreign_key = foreign_keys[0]
    items: list[tuple[str, ast.Expr]] = []
    for index, item in enumerate(query.items):
        if item.is_star:
            items += [(name, ast.ColumnRef(name)) for prefix, side in ((stream_prefix, stream), *zip(prefixes, tables, strict=True))
                      for name in ResolvedJoin.names(prefix, side)]
        else:
            assert item.expr is not None
            items.append((output_name(item, index), _map_columns(item.expr, name_of)))
    seen: set[str] = set()
    for name, expr in items:
        if name in seen:
            raise StatementError(f"the result has two columns named {name}; give one of them an alias with AS")
        seen.add(name)
        check(expr, scope)
    where = None
    if query.where is not None:
        where = _map_columns(query.where, name_of)
        check_condition(where, scope, "WHERE")
    # The result is keyed by the last join's expression (what its stage's records are keyed by).
    keys: tuple[ast.Expr, ...] = (step_keys[-1], *(ast.ColumnRef(k) for k, step in zip(table_keys, steps, strict=True)
                                                    if step == len(step_keys) - 1))
    if stream.kind == "TABLE" and (foreign_key is not None or len(step_keys) > 1):
        # Keyed by the first table's key: it, or a key of a table joined on it.
        assert left_key is not None
        keys = (left_key, *(ast.ColumnRef(k) for k, f in zip(table_keys, foreign_keys, strict=True) if f is None))
    key_item = next((i for i, (_, e) in enumerate(items) if e in keys), None)
    if key_item is None:
        key_of = ("left table's PRIMARY KEY (a foreign-key join)" if any(foreign_keys)
                  else "last JOIN's expression" if len(step_keys) > 1 else "join expression")
        raise StatementError(f"key missing from projection: a join's result is keyed by its {key_of}; "
                             f"select {shown(keys[0])} (for example SELECT {shown(keys[0])}, ...)")
    stream_scope = Scope(stream.name, stream_columns)
    # Evaluated in Python by the join tasks: integer arithmetic wraps as Spark's (``with_widths``).
    return ResolvedJoin(stream_prefix, prefixes, scope, with_widths(tuple(items), scope), with_widths(where, scope),
                        stream_key,
                        to_spark(_unjoined(stream_key, stream_prefix), stream_scope), tuple(table_keys), key_item,
                        tuple(conditions), owners, foreign_key, partial(_map_columns, rename=name_of),
                        with_widths(tuple(step_keys), scope),
                        tuple(steps), tuple(foreign_keys))


@dataclass(frozen=True)
class JoinAggregation:
    """A GROUP BY over a join: the join stage computes every column of the joined row
    (``resolved``, of ``SELECT *`` with the query's WHERE) and keys it by the GROUP BY
    (``keys``); the aggregation (``query``) then reads those rows as a stream (``source``).
    Over tables joined with tables, the join stage writes each key's joined row keyed by the
    join key, a table (``source``) that the aggregation regroups by the GROUP BY."""

    resolved: ResolvedJoin
    query: ast.Query
    """The statement's aggregation over the joined row's columns: no JOIN, no WHERE."""
    source: DataSource
    """The joined row as a stream (a table, keyed by the join key, over tables): every column of
    each side, named as in the joined row."""
    keys: tuple[tuple[str, ast.Expr], ...]
    """The result's key columns in order: (name, expression over the joined row)."""


def pre_aggregation(query: ast.Query) -> ast.Query:
    """The join a GROUP BY over a join aggregates: every column of the joined row (``SELECT *``)
    of the records its WHERE keeps."""
    return replace(query, items=(ast.SelectItem(None),), group_by=(), having=None, window=None, emit_final=False)


def join_aggregation(query: ast.Query, stream: DataSource, tables: tuple[DataSource, ...]) -> JoinAggregation:
    """How a GROUP BY over a join is computed (see ``JoinAggregation``): what the planner plans
    and what the join task evaluates, from the same statement."""
    streams = [t for t in tables if t.kind == "STREAM"]
    if stream.kind == "TABLE" and streams:
        raise StatementError(f"GROUP BY over a join reads a stream joined with streams (WITHIN) and tables in any "
                             f"order, or tables joined with tables; {stream.name} is a TABLE joined with the STREAM "
                             f"{streams[0].name}: read the stream first (FROM {streams[0].name} ... JOIN {stream.name})")
    if query.partition_by is not None:
        raise StatementError("PARTITION BY cannot be combined with GROUP BY; GROUP BY already keys the result")
    resolved = resolve_join(pre_aggregation(query), stream, tables)
    rename = resolved.rename
    assert rename is not None
    items = tuple(ast.SelectItem(None if item.expr is None else rename(item.expr), output_name(item, index))
                  for index, item in enumerate(query.items))
    groups = tuple(rename(g) for g in query.group_by)
    # The join task keys each joined row by the GROUP BY over the joined row; the aggregation
    # reads those rows, whose ROWTIME is the joined row's: the stream record's over tables,
    # where the stream's own time is then read. Where streams are joined, the row's time is
    # the latest of its records', and the stream's own time travels as a column of the rows.
    keys = with_widths(tuple((str(item.alias), item.expr) for item in items if item.expr is not None and item.expr in groups),
                       resolved.scope)
    stream_time = ast.ColumnRef(joined(resolved.stream_prefix, ROWTIME))
    own_time = bool(streams) and ROWTIME not in stream.schema

    def aggregated(expr: ast.Expr) -> ast.Expr:
        if own_time:
            return expr
        renamed: ast.Expr = _map_columns(expr, lambda ref: ast.ColumnRef(ROWTIME) if ref == stream_time else ref)
        return renamed

    aggregation = replace(query, items=tuple(replace(i, expr=None if i.expr is None else aggregated(i.expr))
                                             for i in items),
                          group_by=tuple(map(aggregated, groups)),
                          having=None if query.having is None else aggregated(rename(query.having)), where=None,
                          joins=(), alias=None, source=f"{stream.name}_JOINED")
    names = [name for _, expr in resolved.items if isinstance(expr, ast.ColumnRef) for name in (expr.name,)]
    # Tables joined with tables give a table keyed by the join key, which the aggregation
    # regroups (a changed joined row leaves its old group); a stream's join gives a stream.
    key = None if stream.kind == "STREAM" or resolved.key_item is None else names[resolved.key_item]
    carried = (*names, *([stream_time.name] if own_time and stream_time.name not in names else []))
    source = DataSource(stream.kind, aggregation.source,
                        tuple(Column(n, resolved.scope.schema[n], key=n == key) for n in carried), "", stream.partitions)
    return JoinAggregation(resolved, aggregation, source, keys)


def qualified(expr: ast.Expr, owners: dict[str, str]) -> str:
    """An expression over the joined row as SQL text with each column as ``side.column``."""
    text = to_sql(_map_columns(expr, lambda ref: ast.ColumnRef(owners[ref.name])))
    return text[1:-1] if isinstance(expr, ast.Binary) else text


def _condition(condition: ast.Expr, shown: Callable[[ast.Expr], str], stream_names: set[str], stream_prefix: str,
               table_prefix: str, stream: DataSource, table: DataSource, first: bool = True) -> tuple[ast.Expr, str]:
    """The left side of the ON equality (an expression of ``stream_names``: the left source's
    columns, and after the ``first`` JOIN those of the tables joined before) and the joined
    name of the right side's column: the table's key, or for a stream any of its columns."""
    if not (isinstance(condition, ast.Binary) and condition.op == "="):
        raise StatementError(f"invalid join condition {shown(condition)}: a join needs an equality, "
                             f"ON <{stream.name} expression> = <{table.name} column>")
    sides = ((condition.left, condition.right), (condition.right, condition.left))
    if table.kind == "STREAM":  # each stream on its key, or on another column it is re-keyed by
        right_names = {joined(table_prefix, c.name) for c in table.columns}
        for left, right in sides:
            if isinstance(right, ast.ColumnRef) and right.name in right_names and _only(left, stream_names):
                _check_rekey(left, shown, stream, stream_prefix)
                return left, right.name
        raise StatementError(f"invalid join condition {shown(condition)}: a stream-stream join matches an expression "
                             f"of {stream.name}'s columns with a column of {table.name} (ON {stream_prefix}.<column> "
                             f"= {table_prefix}.<column>)")
    key = table.key_column
    if key is None:
        raise StatementError(f"{table.name} has no PRIMARY KEY to join on")
    table_key = joined(table_prefix, key.name)
    if stream.kind == "TABLE":
        left_key = stream.key_column.name if stream.key_column is not None else "<key>"
        for left, right in sides:
            if right == ast.ColumnRef(table_key) and left == ast.ColumnRef(joined(stream_prefix, left_key)):
                return left, table_key
        for left, right in sides:
            if right == ast.ColumnRef(table_key) and isinstance(left, ast.ColumnRef) and left.name in stream_names:
                return left, table_key  # a foreign key of the left table
        raise StatementError(f"invalid join condition {shown(condition)}: a table-table join matches both sides' "
                             f"keys (ON {stream_prefix}.{left_key} = {table_prefix}.{key.name}), or a column of "
                             f"{stream.name} with {table.name}'s PRIMARY KEY (a foreign-key join: ON "
                             f"{stream_prefix}.<column> = {table_prefix}.{key.name}); a foreign key is a column "
                             f"of the left table ({stream.name}), not an expression or a column of the right")
    for left, right in sides:
        if right == ast.ColumnRef(table_key) and _only(left, stream_names):
            _check_rekey(left, shown, stream, stream_prefix, rowtime=True)
            return left, table_key
    of = f"{stream.name}'s columns" if first else f"the columns of {stream.name} and of the tables joined before"
    raise StatementError(f"invalid join condition {shown(condition)}: a stream-table join matches the table's "
                         f"PRIMARY KEY {table_prefix}.{key.name} with an expression of {of} "
                         f"(ON {stream_prefix}.<column> = {table_prefix}.{key.name})")


def _check_rekey(expr: ast.Expr, shown: Callable[[ast.Expr], str], stream: DataSource, prefix: str,
                 rowtime: bool = False) -> None:
    """A join's stream side, when it is not the stream's key: an expression a stage can
    re-key by (of the value's columns or the key's, which Spark decodes), and of ROWTIME only
    where ``rowtime`` says so."""
    key = stream.key_column
    if key is not None and expr == ast.ColumnRef(joined(prefix, key.name)):
        return
    refs = _refs(expr)
    if joined(prefix, ROWTIME) in refs and not rowtime:
        raise StatementError(f"invalid join condition on {shown(expr)}: a stream-stream join cannot match on ROWTIME; "
                             "join on columns (the window already bounds the records' times)")
    if key is not None and key.type.base == "BYTES" and joined(prefix, key.name) in refs:
        raise StatementError(f"invalid join condition on {shown(expr)}: an expression of {stream.name}'s BYTES KEY "
                             f"column {key.name} is not supported; join on {key.name} itself or on other columns")


def _only(expr: ast.Expr, names: set[str]) -> bool:
    """Whether ``expr`` reads columns, and only columns among ``names`` (one side's)."""
    refs = _refs(expr)
    return bool(refs) and all(r in names for r in refs)


def _refs(expr: ast.Expr) -> list[str]:
    found: list[str] = []

    def note(ref: ast.ColumnRef) -> ast.ColumnRef:
        found.append(ref.name)
        return ref

    _map_columns(expr, note)
    return found


def _unjoined(expr: ast.Expr, prefix: str) -> ast.Expr:
    """An expression over one side's joined names, over that side's own column names."""
    unjoined: ast.Expr = _map_columns(expr, lambda ref: ast.ColumnRef(ref.name[len(prefix) + 1:]))
    return unjoined


def _map_columns(expr: Any, rename: Any) -> Any:
    """``expr`` with every column reference replaced by ``rename(reference)``."""
    return ast.replace_nodes(expr, lambda node: rename(node) if isinstance(node, ast.ColumnRef) else None)


def plan_join(
    kind: str | None, name: str, query: ast.Query, left: DataSource, tables: tuple[DataSource, ...], partitions: int,
) -> tuple[str, tuple[OutputColumn, ...], QueryPlan]:
    """The result's kind (STREAM or TABLE), columns and plan of a persistent join into ``name``
    (``kind`` None for INSERT INTO; ``partitions`` the sink's); the caller makes the sink."""
    if query.group_by or query.window is not None or query.partition_by is not None or query.having is not None:
        raise StatementError("GROUP BY, HAVING, WINDOW and PARTITION BY over a join are not supported yet: create the "
                             "joined stream or table first (CREATE ... AS SELECT ... JOIN ...), then aggregate it")
    resolved = resolve_join(query, left, tables)
    result = left.kind
    if kind != result and (kind is not None or result == "TABLE"):  # INSERT INTO a stream takes a stream's join
        raise StatementError(f"invalid result type: a {left.kind.lower()}-{tables[0].kind.lower()} join produces a "
                             f"{result}; use CREATE {result} AS SELECT")
    for table, foreign in zip(tables, resolved.foreign_keys, strict=True):
        if left.partitions != table.partitions and foreign is None:  # a foreign key names any right key
            raise StatementError(f"Can't join {left.name} with {table.name} since the number of partitions don't "
                                 f"match. {left.name} partitions = {left.partitions}; {table.name} partitions = "
                                 f"{table.partitions}. Please repartition either one so that the number of "
                                 "partitions match.")
        if left.key_format != table.key_format:
            raise StatementError(f"{left.name} and {table.name} must have the same KEY_FORMAT to be joined")
    if partitions != left.partitions and (result == "TABLE" or tables[0].kind == "STREAM"):
        raise StatementError(f"a {left.kind.lower()}-{tables[0].kind.lower()} join's result has its sources' "
                             f"partitions ({left.partitions}); remove PARTITIONS={partitions}")
    columns = []
    for index, (out, expr) in enumerate(resolved.items):
        type_ = check(expr, resolved.scope)  # evaluated in Python: a DECIMAL key's value is its DOUBLE's already
        columns.append(OutputColumn(out, key_typed(type_, "")[0] if index == resolved.key_item else type_,
                                    resolved.shown(expr), key=index == resolved.key_item))
    keyed_by_stream_key = (left.key_column is not None
                           and resolved.stream_key == ast.ColumnRef(joined(resolved.stream_prefix,
                                                                           left.key_column.name)))
    key_expression = None if keyed_by_stream_key or resolved.foreign_key else resolved.stream_key_spark
    # A foreign key as the stage's left rows name it: the first table's column, unprefixed, in
    # the first stage; the joined row's name in the later ones (they read the rows joined so far).
    foreign_keys = [None if f is None else f[len(resolved.stream_prefix) + 1:] if step == 0 else f
                    for f, step in zip(resolved.foreign_keys, resolved.steps, strict=True)]
    joined_tables = tuple(JoinedTable(join.kind, table, prefix, resolved.shown(condition), _window(join.within),
                                      foreign, _rekey(table, prefix, on), step)
                          for join, table, prefix, condition, on, step, foreign in zip(
                              query.joins, tables, resolved.table_prefixes, resolved.conditions, resolved.table_keys,
                              resolved.steps, foreign_keys, strict=True))
    spec = JoinSpec(left, resolved.stream_prefix, joined_tables,
                    None if resolved.where is None else resolved.shown(resolved.where))
    key = columns[resolved.key_item]
    columns = [key, *(c for c in columns if not c.key)]
    plan_kind = (PlanKind.FOREIGN_KEY_JOIN if resolved.foreign_key else PlanKind.TABLE_TABLE_JOIN
                 if result == "TABLE" else PlanKind.STREAM_STREAM_JOIN
                 if tables[0].kind == "STREAM" else PlanKind.STREAM_TABLE_JOIN)
    plan = QueryPlan(plan_kind, left.name, name, tuple(columns), key_column=key.name,
                     key_expression=key_expression, repartition=key_expression is not None, join=spec)
    return result, tuple(columns), plan


def started_sources(source: DataSource, joined: Sequence[DataSource]) -> tuple[DataSource, ...]:
    """The sources whose partitions a query's start offsets cover (``auto.offset.reset=latest``),
    in order: its source, then the other stream of a stream-stream join."""
    return (source, *(j for j in joined if source.kind == "STREAM" and j.kind == "STREAM"))


def _rekey(side: DataSource, prefix: str, on: str) -> str | None:
    """A stream-stream join's re-keying of its right stream: Spark SQL of the column it joins
    on (in the joined row: ``on``), when that is not its key."""
    if side.kind != "STREAM" or (side.key_column is not None and on == joined(prefix, side.key_column.name)):
        return None
    return quote_identifier(on[len(prefix) + 1:])


def _window(within: ast.Within | None) -> JoinWindow | None:
    if within is None:
        return None
    if within.grace_ms is None:
        return JoinWindow(within.before_ms, within.after_ms, DEFAULT_JOIN_GRACE_MS, eager=True)
    return JoinWindow(within.before_ms, within.after_ms, within.grace_ms)
