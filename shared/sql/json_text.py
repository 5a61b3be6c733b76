"""ksqlDB's TO_JSON_STRING: any value written as JSON text, as Spark's ``to_json`` writes it for
the persistent queries, and the same in Python for pulls (its argument's type known:
``Call.arg_types``)."""

from __future__ import annotations

import base64
import datetime
import math
from typing import Any

from millpond.shared.sql.ast import SqlType, to_sql
from millpond.shared.sql.java_text import java_double_text, java_string
from millpond.shared.sql.json_paths import quoted
from millpond.shared.sql.kinds import fitted_decimal, holds, java_decimal_text, spark_once

TO_JSON_OPTIONS = "map('ignoreNullFields', 'false', 'timestampFormat', 'yyyy-MM-dd\\'T\\'HH:mm:ss.SSS')"
"""Spark's ``to_json`` options for TO_JSON_STRING: a STRUCT's NULL fields written (``null``, as
ksqlDB's), a TIMESTAMP as ksqlDB writes it (UTC, milliseconds, no zone)."""


def to_json_in_spark(args: list[str], _: list[SqlType]) -> str:
    """TO_JSON_STRING in Spark SQL: ``to_json`` writes a STRUCT, a MAP or an ARRAY, so the value is
    written as an ARRAY's one item and taken out of its brackets (the text computed once)."""
    return spark_once(f"to_json(array({args[0]}), {TO_JSON_OPTIONS})",
                      lambda written: f"substring({written}, 2, char_length({written}) - 2)")


def refusal(args: tuple[Any, ...], types: list[SqlType]) -> str | None:
    """Spark's ``to_json`` writes no TIME."""
    if not holds(types[0], frozenset({"TIME"})):
        return None
    return (f"TO_JSON_STRING cannot write a TIME (Spark's to_json has none): CAST it to VARCHAR, as in "
            f"TO_JSON_STRING(CAST({to_sql(args[0])} AS VARCHAR))")


def _written_key(key: Any) -> str:
    """A MAP key as Spark writes it as a field name (its text; a BOOLEAN's in lower case)."""
    return ("true" if key else "false") if isinstance(key, bool) else java_string(str(key))


def to_json_string(value: Any, type_: SqlType) -> str:
    """TO_JSON_STRING: a value of ``type_`` as Spark's ``to_json`` writes it (``TO_JSON_OPTIONS``):
    numbers as Java writes them (a DOUBLE's ``1.0E10``; NaN and the infinities quoted; a DECIMAL's
    digits to its scale, ``1E-8`` where Java's BigDecimal writes it so), a TIMESTAMP
    ``"yyyy-MM-ddTHH:mm:ss.SSS"``, a DATE ``"yyyy-MM-dd"``, BYTES in base64, a STRUCT's fields in
    their order, a MAP's entries as an object's, text as Jackson escapes it (a lone UTF-16 half
    ``?``, as Spark holds it), NULL ``null``."""
    if value is None:
        return "null"
    base = type_.base
    if base == "BOOLEAN":
        return "true" if value else "false"
    if base in ("INT", "BIGINT"):
        return str(value)
    if base == "DOUBLE":
        text = java_double_text(float(value))
        return f'"{text}"' if not math.isfinite(value) else text
    if base == "DECIMAL":
        exact = fitted_decimal(value, *type_.params)
        return "null" if exact is None else java_decimal_text(exact)
    if base == "TIMESTAMP":
        t = datetime.datetime.fromisoformat(value)
        return (f'"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}.'
                f'{t.microsecond // 1000:03d}"')
    if base == "BYTES":
        return f'"{base64.b64encode(value).decode()}"'
    if base == "ARRAY":
        return "[" + ",".join(to_json_string(item, type_.params[0]) for item in value) + "]"
    if base == "MAP":
        return "{" + ",".join(f"{quoted(_written_key(k), halves=False)}:{to_json_string(v, type_.params[1])}"
                              for k, v in value.items()) + "}"
    if base == "STRUCT":
        return "{" + ",".join(f"{quoted(name, halves=False)}:{to_json_string(value.get(name), field)}"
                              for name, field in type_.params) + "}"
    return quoted(java_string(str(value)), halves=False)  # VARCHAR; a DATE's ISO text is Spark's yyyy-MM-dd
