"""ksqlDB's custom types (``CREATE TYPE address AS STRUCT<...>``): a statement that names one has
the type written out in its place, as the metastore defines it when the statement is run, so
a stream declared with it keeps its columns whatever becomes of the name later."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from millpond.shared.errors import NotFoundError, StatementError
from millpond.shared.sql import ast

BUILT_IN = frozenset({"BOOLEAN", "INT", "BIGINT", "DOUBLE", "DECIMAL", "VARCHAR", "BYTES", "TIMESTAMP", "DATE", "TIME",
                      "ARRAY", "MAP", "STRUCT", "INTEGER", "STRING", "NULL"})
"""Type names a custom type may not take."""

S = TypeVar("S", bound=ast.Statement)


def resolved(stmt: S, types: Mapping[str, ast.SqlType]) -> S:
    """``stmt`` with each custom type it names replaced by its definition in ``types``; the same
    statement when it names none. NotFoundError for a name no CREATE TYPE defined."""
    if not stmt.custom_types:
        return stmt
    missing = [name for name in stmt.custom_types if name not in types]
    if missing:
        raise NotFoundError(f"type {missing[0]} does not exist; define it with CREATE TYPE {missing[0]} AS <type> "
                            "(SHOW TYPES lists the types)")
    return _replaced(stmt, types)  # type: ignore[no-any-return]


def expanded(type_: ast.SqlType, types: Mapping[str, ast.SqlType]) -> ast.SqlType:
    """``type_`` with the custom types in it (an ARRAY's element, a STRUCT's field) written out."""
    if type_.base in types:
        return types[type_.base]
    if type_.base in ("ARRAY", "MAP"):
        return ast.SqlType(type_.base, tuple(expanded(t, types) for t in type_.params))
    if type_.base == "STRUCT":
        return ast.SqlType("STRUCT", tuple((name, expanded(t, types)) for name, t in type_.params))
    return type_


def _replaced(value: Any, types: Mapping[str, ast.SqlType]) -> Any:
    if isinstance(value, ast.SqlType):
        return expanded(value, types)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # a statement, clause or expression
        changes = {f.name: new for f in dataclasses.fields(value) if f.init
                   and (new := _replaced(old := getattr(value, f.name), types)) is not old}
        if isinstance(value, ast.Statement) and value.custom_types:
            changes["custom_types"] = ()
        return dataclasses.replace(value, **changes) if changes else value
    if isinstance(value, tuple | list):
        items = [_replaced(v, types) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else type(value)(items)
    if isinstance(value, dict):
        entries = {k: _replaced(v, types) for k, v in value.items()}
        return value if all(entries[k] is v for k, v in value.items()) else entries
    return value


def check_new_type(stmt: ast.CreateType, types: Mapping[str, ast.SqlType]) -> ast.SqlType | None:
    """The type ``stmt`` defines, written out; None when it exists and IF NOT EXISTS says leave it."""
    if stmt.name in BUILT_IN:
        raise StatementError(f"{stmt.name} is a built-in type's name; give the type another name")
    if stmt.name in types:
        if stmt.if_not_exists:
            return None
        raise StatementError(f"type {stmt.name} already exists as {types[stmt.name]}; DROP TYPE {stmt.name} first, "
                             "or use CREATE TYPE IF NOT EXISTS")
    return expanded(stmt.type, types)


def missing(stmt: ast.Statement, types: Mapping[str, ast.SqlType]) -> bool:
    """Whether ``stmt`` names a custom type ``types`` lacks (one made just before, which a node
    that reads the command topic may not have read yet)."""
    return any(name not in types for name in stmt.custom_types)
