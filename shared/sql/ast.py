"""The syntax tree of Millpond's SQL: frozen dataclasses built by ``millpond.shared.sql.parser``."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True)
class SqlType:
    """A SQL type: ``base`` plus parameters (DECIMAL precision, element types, fields)."""

    base: str
    params: tuple[Any, ...] = ()

    def __str__(self) -> str:
        if self.base == "DECIMAL":
            return f"DECIMAL({self.params[0]}, {self.params[1]})"
        if self.base == "ARRAY":
            return f"ARRAY<{self.params[0]}>"
        if self.base == "MAP":
            return f"MAP<{self.params[0]}, {self.params[1]}>"
        if self.base == "STRUCT":
            return "STRUCT<" + ", ".join(f"{n} {t}" for n, t in self.params) + ">"
        return self.base


# ---- expressions ------------------------------------------------------------------------
class Expr:
    """Base of every expression node."""


@dataclass(frozen=True)
class Literal(Expr):
    """A constant; ``type`` is its SQL type (NULL has type ``NULL``)."""

    value: Any
    type: SqlType


@dataclass(frozen=True)
class ColumnRef(Expr):
    """A column by its (already case-normalized) name; ``qualifier`` is ``source.`` if written."""

    name: str
    qualifier: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class LambdaVar(Expr):
    """A lambda's parameter in its body (``x`` in ``x => x + 1``), by its case-normalized name."""

    name: str


@dataclass(frozen=True)
class Lambda(Expr):
    """``x => body`` or ``(x, y) => body``: an argument of TRANSFORM, FILTER or REDUCE."""

    params: tuple[str, ...]
    body: Expr


@dataclass(frozen=True)
class Subscript(Expr):
    """``array[i]`` (1-based, as ksqlDB) or ``map[key]``."""

    operand: Expr
    index: Expr


@dataclass(frozen=True)
class Dereference(Expr):
    """``struct->field``."""

    operand: Expr
    field: str


@dataclass(frozen=True)
class Call(Expr):
    """A function or aggregate call; ``star`` for ``COUNT(*)``."""

    name: str
    args: tuple[Expr, ...] = ()
    star: bool = False
    bits: int = field(default=0, compare=False, repr=False)
    """As ``Binary.bits``, for a call whose integer result may leave its type (``ABS`` of the
    least INT or BIGINT)."""
    decimal: tuple[int, int] | tuple[()] = field(default=(), compare=False, repr=False)
    """As ``Binary.decimal``, for FLOOR, CEIL and ROUND of a DECIMAL."""
    arg_types: tuple[SqlType, ...] = field(default=(), compare=False, repr=False)
    """The arguments' types, for a function whose Python form takes them (``ScalarFunction.typed``:
    TO_JSON_STRING), once typed (``types.with_widths``)."""


@dataclass(frozen=True)
class Binary(Expr):
    """``left op right`` for arithmetic, comparison, AND, OR, LIKE and ``||``."""

    op: str
    left: Expr
    right: Expr
    bits: int = field(default=0, compare=False, repr=False)
    """For arithmetic of INT or BIGINT once typed (``types.with_widths``): the width its
    result wraps at, as Spark's does outside ANSI mode; 0 otherwise."""
    decimal: tuple[int, int] | tuple[()] = field(default=(), compare=False, repr=False)
    """For arithmetic whose result is a DECIMAL, once typed: its (precision, scale), which
    Python's result is rounded to (NULL past the precision), as Spark's is; () otherwise."""


@dataclass(frozen=True)
class Unary(Expr):
    """``NOT x`` or ``-x``."""

    op: str
    operand: Expr
    bits: int = field(default=0, compare=False, repr=False)
    """As ``Binary.bits``, for ``-x``."""


@dataclass(frozen=True)
class IsNull(Expr):
    """``x IS [NOT] NULL``."""

    operand: Expr
    negated: bool = False


@dataclass(frozen=True)
class Between(Expr):
    """``x [NOT] BETWEEN low AND high``."""

    operand: Expr
    low: Expr
    high: Expr
    negated: bool = False


@dataclass(frozen=True)
class InList(Expr):
    """``x [NOT] IN (a, b, ...)``."""

    operand: Expr
    items: tuple[Expr, ...]
    negated: bool = False


@dataclass(frozen=True)
class Cast(Expr):
    """``CAST(x AS type)``."""

    operand: Expr
    type: SqlType
    scale: int = field(default=-1, compare=False, repr=False)
    """For a DECIMAL operand cast to VARCHAR, INT or BIGINT, once typed: its scale (the digits
    its text has after the point, ``1.50``; an integer takes the whole part's low bits, where a
    DOUBLE's saturates); -1 otherwise."""


@dataclass(frozen=True)
class ArrayOf(Expr):
    """ksqlDB's ``ARRAY[a, b, ...]``."""

    items: tuple[Expr, ...]


@dataclass(frozen=True)
class MapOf(Expr):
    """ksqlDB's ``MAP(k := v, ...)``."""

    entries: tuple[tuple[Expr, Expr], ...]


@dataclass(frozen=True)
class StructOf(Expr):
    """ksqlDB's ``STRUCT(name := v, ...)``."""

    fields: tuple[tuple[str, Expr], ...]


@dataclass(frozen=True)
class Case(Expr):
    """``CASE WHEN c THEN v ... [ELSE e] END``."""

    whens: tuple[tuple[Expr, Expr], ...]
    otherwise: Expr | None = None


# ---- statements -------------------------------------------------------------------------
@dataclass(frozen=True)
class Statement:
    """Base of every statement; ``text`` is the statement as written; ``custom_types``: the names
    of the custom types (CREATE TYPE) it names, until the metastore's types replace them
    (``custom_types.resolved``)."""

    text: str = field(default="", kw_only=True, compare=False)
    custom_types: tuple[str, ...] = field(default=(), kw_only=True, compare=False, repr=False)


@dataclass(frozen=True)
class ColumnDef:
    """A declared column; ``key`` is true for KEY / PRIMARY KEY columns."""

    name: str
    type: SqlType
    key: bool = False


@dataclass(frozen=True)
class SelectItem:
    """One projection: an expression and its output name (None for ``*``)."""

    expr: Expr | None
    alias: str | None = None

    @property
    def is_star(self) -> bool:
        """True for ``SELECT *``."""
        return self.expr is None


@dataclass(frozen=True)
class Window:
    """``WINDOW TUMBLING|HOPPING|SESSION (...)`` as written, durations in milliseconds
    (None where the statement leaves it to the default)."""

    kind: str
    """TUMBLING, HOPPING or SESSION."""
    size_ms: int
    """The window size; a session's inactivity gap."""
    advance_ms: int | None = None
    retention_ms: int | None = None
    grace_ms: int | None = None


@dataclass(frozen=True)
class Within:
    """A stream-stream join's ``WITHIN`` window: how long before and after a record the
    other side's records join it (ms), and the grace period (None: the default)."""

    before_ms: int
    after_ms: int
    grace_ms: int | None = None


@dataclass(frozen=True)
class Join:
    """``[INNER|LEFT|RIGHT|FULL] JOIN source [alias] [WITHIN ...] ON condition``."""

    kind: str
    """INNER, LEFT, RIGHT or FULL (OUTER is implied by the last three)."""
    source: str
    on: Expr
    alias: str | None = None
    within: Within | None = None


@dataclass(frozen=True)
class Query(Statement):
    """``SELECT ... FROM source ...``: a pull query, or a push query with EMIT CHANGES."""

    items: tuple[SelectItem, ...]
    source: str
    alias: str | None = None
    where: Expr | None = None
    group_by: tuple[Expr, ...] = ()
    partition_by: Expr | None = None
    emit_changes: bool = False
    limit: int | None = None
    window: Window | None = None
    emit_final: bool = False
    joins: tuple[Join, ...] = ()
    having: Expr | None = None


@dataclass(frozen=True)
class CreateSource(Statement):
    """``CREATE STREAM|TABLE name (columns) WITH (...)``."""

    kind: str
    name: str
    columns: tuple[ColumnDef, ...]
    properties: dict[str, Any]
    or_replace: bool = False
    if_not_exists: bool = False
    spellings: tuple[tuple[str, str], ...] = ()
    """How the statement writes each unquoted column and STRUCT field name that it does not
    write in upper case (the first time it writes it): (the name, its text), ``("SENSORID",
    "sensorId")``. Producers usually write a JSON key as the statement does."""
    read_only: bool = field(default=False, repr=False)
    """``CREATE SOURCE STREAM|TABLE`` (ksqlDB's): no INSERT writes it, only its topic's producers."""


@dataclass(frozen=True)
class AlterSource(Statement):
    """``ALTER STREAM|TABLE name ADD [COLUMN] col TYPE, ...`` (ksqlDB's): value columns added at
    the end of a source that CREATE declared; ``spellings`` as ``CreateSource``'s."""

    kind: str
    name: str
    columns: tuple[ColumnDef, ...]
    spellings: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class CreateAsSelect(Statement):
    """``CREATE STREAM|TABLE name [WITH (...)] AS SELECT ...``: a persistent query."""

    kind: str
    name: str
    properties: dict[str, Any]
    query: Query
    or_replace: bool = False
    if_not_exists: bool = False


@dataclass(frozen=True)
class InsertValues(Statement):
    """``INSERT INTO target [(columns)] VALUES (...)``."""

    target: str
    columns: tuple[str, ...] | None
    values: tuple[Expr, ...]


@dataclass(frozen=True)
class InsertSelect(Statement):
    """``INSERT INTO target SELECT ...``: a persistent query into an existing stream."""

    target: str
    query: Query


@dataclass(frozen=True)
class Show(Statement):
    """``SHOW|LIST [ALL] STREAMS|TABLES|QUERIES|TOPICS|PROPERTIES|FUNCTIONS|TYPES [EXTENDED]``
    (``DESCRIBE STREAMS|TABLES [EXTENDED]`` too)."""

    what: str
    extended: bool = False
    """STREAMS, TABLES, QUERIES: more columns (QUERIES: a row per task)."""
    internal: bool = False
    """TOPICS (``SHOW ALL TOPICS``): the internal topics too."""


@dataclass(frozen=True)
class PrintTopic(Statement):
    """``PRINT 'topic' [FROM BEGINNING] [INTERVAL n] [LIMIT n]``: a topic's records as they are
    (ksqlDB's), every ``interval``-th of them; ``exact`` unless the topic was named by a bare
    identifier, which names a topic of any case."""

    topic: str
    exact: bool = True
    from_beginning: bool = False
    interval: int = 1
    limit: int | None = None


@dataclass(frozen=True)
class Describe(Statement):
    """``DESCRIBE [EXTENDED] name``."""

    name: str
    extended: bool = False


@dataclass(frozen=True)
class CreateType(Statement):
    """``CREATE TYPE [IF NOT EXISTS] name AS type`` (ksqlDB's): a name for a type."""

    name: str
    type: SqlType
    if_not_exists: bool = False


@dataclass(frozen=True)
class DropType(Statement):
    """``DROP TYPE [IF EXISTS] name``."""

    name: str
    if_exists: bool = False


@dataclass(frozen=True)
class DescribeFunction(Describe):
    """``DESCRIBE FUNCTION name`` (ksqlDB's): what a function does and how a call is written."""


@dataclass(frozen=True)
class Drop(Statement):
    """``DROP STREAM|TABLE [IF EXISTS] name [DELETE TOPIC]``."""

    kind: str
    name: str
    if_exists: bool = False
    delete_topic: bool = False


@dataclass(frozen=True)
class Terminate(Statement):
    """``TERMINATE query_id`` or ``TERMINATE ALL`` (``query_id`` None)."""

    query_id: str | None


@dataclass(frozen=True)
class Explain(Statement):
    """``EXPLAIN query_id`` for a running query, or ``EXPLAIN <statement>`` for one not run."""

    query_id: str | None = None
    statement: Statement | None = None


@dataclass(frozen=True)
class SetProperty(Statement):
    """``SET 'name'='value'``."""

    name: str
    value: str


@dataclass(frozen=True)
class UnsetProperty(Statement):
    """``UNSET 'name'``."""

    name: str


def replace_nodes(expr: Any, swap: Any) -> Any:
    """``expr`` with every node for which ``swap(node)`` gives an expression replaced by it
    (its children are not visited then); tuples of expressions are walked too."""
    if isinstance(expr, tuple):
        return tuple(replace_nodes(e, swap) for e in expr)
    if not isinstance(expr, Expr):
        return expr
    swapped = swap(expr)
    if swapped is not None:
        return swapped
    changes = {f.name: replace_nodes(getattr(expr, f.name), swap) for f in fields(expr)  # type: ignore[arg-type]
               if f.name != "type"}
    return replace(expr, **changes)  # type: ignore[type-var]


# ---- rendering ----------------------------------------------------------------------------
def _sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def literal_text(expr: Any) -> str | None:
    """The text of a VARCHAR literal, or None for any other expression: what a function's
    argument written as it is (a pattern, a zone, a path) holds."""
    return expr.value if isinstance(expr, Literal) and isinstance(expr.value, str) else None


def to_sql(expr: Expr) -> str:
    """An expression as ksqlDB SQL text (for messages and EXPLAIN)."""
    if isinstance(expr, Literal):
        return _sql_literal(expr.value)
    if isinstance(expr, ColumnRef | LambdaVar):
        return expr.name
    if isinstance(expr, Lambda):
        params = expr.params[0] if len(expr.params) == 1 else f"({', '.join(expr.params)})"
        return f"{params} => {to_sql(expr.body)}"
    if isinstance(expr, Subscript):
        return f"{to_sql(expr.operand)}[{to_sql(expr.index)}]"
    if isinstance(expr, Dereference):
        return f"{to_sql(expr.operand)}->{expr.field}"
    if isinstance(expr, Call):
        return f"{expr.name}({'*' if expr.star else ', '.join(to_sql(a) for a in expr.args)})"
    if isinstance(expr, Binary):
        return f"({to_sql(expr.left)} {expr.op} {to_sql(expr.right)})"
    if isinstance(expr, Unary):
        return f"(NOT {to_sql(expr.operand)})" if expr.op == "NOT" else f"(-{to_sql(expr.operand)})"
    if isinstance(expr, IsNull):
        return f"({to_sql(expr.operand)} IS {'NOT ' if expr.negated else ''}NULL)"
    if isinstance(expr, Between):
        neg = "NOT " if expr.negated else ""
        return f"({to_sql(expr.operand)} {neg}BETWEEN {to_sql(expr.low)} AND {to_sql(expr.high)})"
    if isinstance(expr, InList):
        neg = "NOT " if expr.negated else ""
        return f"({to_sql(expr.operand)} {neg}IN ({', '.join(to_sql(i) for i in expr.items)}))"
    if isinstance(expr, Cast):
        return f"CAST({to_sql(expr.operand)} AS {expr.type})"
    if isinstance(expr, Case):
        whens = " ".join(f"WHEN {to_sql(c)} THEN {to_sql(v)}" for c, v in expr.whens)
        other = f" ELSE {to_sql(expr.otherwise)}" if expr.otherwise is not None else ""
        return f"CASE {whens}{other} END"
    if isinstance(expr, ArrayOf):
        return f"ARRAY[{', '.join(to_sql(i) for i in expr.items)}]"
    if isinstance(expr, MapOf):
        return f"MAP({', '.join(f'{to_sql(k)} := {to_sql(v)}' for k, v in expr.entries)})"
    if isinstance(expr, StructOf):
        return f"STRUCT({', '.join(f'{name} := {to_sql(v)}' for name, v in expr.fields)})"
    raise TypeError(f"not an expression: {expr!r}")
