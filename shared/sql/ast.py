"""The syntax tree of Millpond's SQL: frozen dataclasses built by ``shared.sql.parser``."""

from __future__ import annotations

from dataclasses import dataclass, field
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
    """A column by its (already case-normalized) name."""

    name: str


@dataclass(frozen=True)
class Call(Expr):
    """A function or aggregate call; ``star`` for ``COUNT(*)``."""

    name: str
    args: tuple[Expr, ...] = ()
    star: bool = False


@dataclass(frozen=True)
class Binary(Expr):
    """``left op right`` for arithmetic, comparison, AND, OR, LIKE and ``||``."""

    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Unary(Expr):
    """``NOT x`` or ``-x``."""

    op: str
    operand: Expr


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


@dataclass(frozen=True)
class Case(Expr):
    """``CASE WHEN c THEN v ... [ELSE e] END``."""

    whens: tuple[tuple[Expr, Expr], ...]
    otherwise: Expr | None = None


# ---- statements -------------------------------------------------------------------------
@dataclass(frozen=True)
class Statement:
    """Base of every statement; ``text`` is the statement as written."""

    text: str = field(default="", kw_only=True, compare=False)


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
class Query(Statement):
    """``SELECT ... FROM source ...``: a pull query, or a push query with EMIT CHANGES."""

    items: tuple[SelectItem, ...]
    source: str
    where: Expr | None = None
    group_by: tuple[Expr, ...] = ()
    partition_by: Expr | None = None
    emit_changes: bool = False
    limit: int | None = None


@dataclass(frozen=True)
class CreateSource(Statement):
    """``CREATE STREAM|TABLE name (columns) WITH (...)``."""

    kind: str
    name: str
    columns: tuple[ColumnDef, ...]
    properties: dict[str, Any]
    or_replace: bool = False
    if_not_exists: bool = False


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
    """``SHOW|LIST STREAMS|TABLES|QUERIES|TOPICS|PROPERTIES``."""

    what: str


@dataclass(frozen=True)
class Describe(Statement):
    """``DESCRIBE [EXTENDED] name``."""

    name: str
    extended: bool = False


@dataclass(frozen=True)
class Drop(Statement):
    """``DROP STREAM|TABLE [IF EXISTS] name [DELETE TOPIC]``."""

    kind: str
    name: str
    if_exists: bool = False
    delete_topic: bool = False


@dataclass(frozen=True)
class Terminate(Statement):
    """``TERMINATE query_id``."""

    query_id: str


@dataclass(frozen=True)
class Explain(Statement):
    """``EXPLAIN query_id``."""

    query_id: str


@dataclass(frozen=True)
class SetProperty(Statement):
    """``SET 'name'='value'``."""

    name: str
    value: str


@dataclass(frozen=True)
class UnsetProperty(Statement):
    """``UNSET 'name'``."""

    name: str
