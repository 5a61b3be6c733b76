"""ksqlDB's JSON_ITEMS, JSON_RECORDS, JSON_ARRAY_CONTAINS and JSON_CONCAT: JSON text read as Spark's
``parse_json`` reads it into a VARIANT for the persistent queries, and the same in Python for
pulls and push queries.

The text is JSON as Jackson reads it by default (no single quotes, comments, NaN, leading zeros or
trailing commas; a control character in a string escaped), nested at most 1,000 deep, a field
name at most once per object, no lone UTF-16 half escaped in a string; what follows the value the
text starts with is not read (``[1] x`` is ``[1]``). Anything else is not JSON: JSON_ITEMS,
JSON_RECORDS and JSON_CONCAT give NULL, JSON_ARRAY_CONTAINS FALSE.

A VARIANT holds a number as Spark's ``VariantBuilder`` does: an integer as a BIGINT when it fits
one; else, written without an exponent, as a DECIMAL of at most 38 digits (its trailing zeros
dropped: ``1.50`` is ``1.5``, ``1.0`` is ``1``); else as a DOUBLE (``1e2`` is ``100.0``). Each item
or field is written again as VARIANT's ``to_json`` writes it: compact, an object's fields in the
order of their names (as Java compares text), a DOUBLE as Java writes it (an infinite one quoted),
a string as Jackson escapes it (ksqlDB writes what Jackson read, fields in their order, ``1.50``
as it was).
"""

from __future__ import annotations

import math
from decimal import Context, Decimal
from typing import Any

from millpond.shared.sql.ast import SqlType, to_sql
from millpond.shared.sql.java_text import java_double_text, java_string, utf16_units
from millpond.shared.sql.json_paths import Reader, Unreadable, quoted, whole
from millpond.shared.sql.kinds import spark_once

MAX_DECIMAL_DIGITS = 38
_WIDE = Context(prec=2 * MAX_DECIMAL_DIGITS + 2)
_LONG = 2**63

_ITEM = "millpond_item"
"""The lambda variable of an array's items in Spark SQL."""


def items_in_spark(args: list[str]) -> str:
    """JSON_ITEMS in Spark SQL: the VARIANT's items, each written as JSON."""
    return f"transform(try_variant_get(try_parse_json({args[0]}), '$', 'array<variant>'), {_ITEM} -> to_json({_ITEM}))"


def records_in_spark(args: list[str]) -> str:
    """JSON_RECORDS in Spark SQL: the VARIANT's fields, each value written as JSON."""
    return (f"transform_values(try_variant_get(try_parse_json({args[0]}), '$', 'map<string,variant>'), "
            f"(millpond_name, {_ITEM}) -> to_json({_ITEM}))")


_KIND_OF = {"VARCHAR": ("{0} = 'STRING'", "string"), "BOOLEAN": ("{0} = 'BOOLEAN'", "boolean"),
            "INT": ("{0} = 'BIGINT'", "bigint"), "BIGINT": ("{0} = 'BIGINT'", "bigint"),
            "DOUBLE": ("({0} = 'DOUBLE' OR startswith({0}, 'DECIMAL'))", "double")}
"""Per type of the value looked for: which items can equal it (of their ``schema_of_variant``),
and the type each is read as to compare."""


def concat_in_spark(args: list[str]) -> str:
    """JSON_CONCAT in Spark SQL: the texts read once into VARIANTs (an ARRAY of them, one lambda's
    variable); NULL if one is not JSON; objects' fields merged, a later one's value kept (the
    session's ``mapKeyDedupPolicy``, LAST_WIN), else arrays' items, any other value one item."""
    def concat(values: str) -> str:
        if len(args) == 1:
            return f"to_json({values}[0])"
        fields = f"try_variant_get({_ITEM}, '$', 'map<string,variant>')"
        merged = f"aggregate({values}, CAST(map() AS map<string,variant>), (millpond_fields, {_ITEM}) -> " \
                 f"map_concat(millpond_fields, {fields}))"
        joined = f"flatten(transform({values}, {_ITEM} -> coalesce(try_variant_get({_ITEM}, '$', 'array<variant>'), " \
                 f"array({_ITEM}))))"
        return (f"CASE WHEN exists({values}, {_ITEM} -> {_ITEM} IS NULL) THEN NULL "
                f"WHEN forall({values}, {_ITEM} -> {fields} IS NOT NULL) THEN to_json(to_variant_object({merged})) "
                f"ELSE to_json(to_variant_object({joined})) END")
    return spark_once(f"array({', '.join(f'try_parse_json({a})' for a in args)})", concat, name="millpond_values")


def contains_in_spark(args: list[str], types: list[SqlType]) -> str:
    """JSON_ARRAY_CONTAINS in Spark SQL: the text and the value computed once (one lambda's
    variable); an item equals the value when it is JSON's kind of the value's type and equal as
    that type; a NULL value matches a JSON null."""
    def contains(pair: str) -> str:
        items = f"try_variant_get(try_parse_json({pair}.t), '$', 'array<variant>')"
        nulls = f"exists({items}, {_ITEM} -> is_variant_null({_ITEM}))"
        if types[1].base == "NULL":
            found = nulls
        else:
            kind, read = _KIND_OF[types[1].base]
            same = (f"coalesce({kind.format(f'schema_of_variant({_ITEM})')} AND "
                    f"try_variant_get({_ITEM}, '$', '{read}') = {pair}.v, false)")
            found = f"CASE WHEN {pair}.v IS NULL THEN {nulls} ELSE exists({items}, {_ITEM} -> {same}) END"
        return f"CASE WHEN {pair}.t IS NOT NULL THEN coalesce({found}, false) END"
    return spark_once(f"named_struct('t', {args[0]}, 'v', {args[1]})", contains, name="millpond_pair")


def contains_refusal(args: tuple[Any, ...], types: list[SqlType]) -> str | None:
    """The value looked for is one JSON has: text, a BOOLEAN, an INT, BIGINT or DOUBLE (ksqlDB's
    never finds any other)."""
    if types[1].base == "NULL" or types[1].base in _KIND_OF:
        return None
    hint = (f": CAST it AS DOUBLE, as in JSON_ARRAY_CONTAINS({to_sql(args[0])}, CAST({to_sql(args[1])} AS DOUBLE))"
            if types[1].base == "DECIMAL" else "")
    return (f"JSON_ARRAY_CONTAINS looks for a VARCHAR, BOOLEAN, INT, BIGINT or DOUBLE value in the JSON array; "
            f"{to_sql(args[1])} is {types[1]}{hint}")


class _Raw(str):
    """Written output, as opposed to a JSON string value still to write."""


_NOT_JSON = object()
"""What ``_parsed`` gives for text that is not JSON (None is JSON's null)."""


def _number(text: str) -> int | Decimal | float:
    """A JSON number as a VARIANT holds it: a BIGINT, a DECIMAL of at most 38 digits (written
    without an exponent), else a DOUBLE."""
    if not any(c in text for c in ".eE"):
        whole_number = int(text)
        if -_LONG <= whole_number < _LONG:
            return whole_number
    if "e" not in text and "E" not in text:
        exact = Decimal(text)
        _, digits, exponent = exact.as_tuple()
        assert isinstance(exponent, int)
        if len(digits) <= MAX_DECIMAL_DIGITS and -exponent <= MAX_DECIMAL_DIGITS:
            return exact
    return float(text)


def _scalar(token: tuple[str, str]) -> Any:
    """A string, number or literal token's value."""
    kind, text = token
    if kind == "string":
        return whole(text)  # a pair of escaped UTF-16 halves the character they make; a lone one Unreadable
    if kind == "number":
        return _number(text)
    return {"true": True, "false": False, "null": None}[text]


def _parsed(text: str) -> Any:
    """The value ``text`` starts with, as Spark's ``parse_json`` reads it: dicts, lists, str,
    bool, None, and numbers as a VARIANT holds them (int, Decimal, float); ``_NOT_JSON`` for text
    it refuses. Read by a stack, not recursion: 1,000 levels are JSON."""
    reader = Reader(java_string(text), strict=True)
    try:
        containers: list[tuple[list[Any] | dict[str, Any], str, list[str]]] = []
        token = reader.value()
        while True:
            if token in ("[", "{"):
                closing = "]" if token == "[" else "}"
                opened: list[Any] | dict[str, Any] = [] if token == "[" else {}
                if not reader.first_or_close(closing):
                    containers.append((opened, closing, [whole(reader.name())] if closing == "}" else []))
                    token = reader.value()
                    continue
                value = opened
            else:
                value = _scalar(token)
            while containers:  # the value is an item of the innermost container
                container, closing, name = containers[-1]
                if isinstance(container, dict):
                    if name[0] in container:
                        raise Unreadable("a field name given twice")
                    container[name[0]] = value
                else:
                    container.append(value)
                if not reader.close_or_comma(closing):
                    if closing == "}":
                        name[0] = whole(reader.name())
                    token = reader.value()
                    break
                containers.pop()
                value = container
            else:
                return value
    except Unreadable:
        return _NOT_JSON


def written(value: Any) -> str:
    """A VARIANT's value as its ``to_json`` writes it."""
    out: list[str] = []
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, _Raw):
            out.append(item)
        elif item is None or isinstance(item, bool):
            out.append("null" if item is None else "true" if item else "false")
        elif isinstance(item, int):
            out.append(str(item))
        elif isinstance(item, Decimal):
            out.append("0" if item.is_zero() else format(item.normalize(_WIDE), "f"))
        elif isinstance(item, float):
            out.append(java_double_text(item) if math.isfinite(item) else f'"{java_double_text(item)}"')
        elif isinstance(item, str):
            out.append(quoted(item, halves=False))
        elif isinstance(item, list):
            pending.append(_Raw("]"))
            for at, inner in enumerate(reversed(item)):
                pending.append(inner)
                if at < len(item) - 1:
                    pending.append(_Raw(","))
            pending.append(_Raw("["))
        else:
            names = sorted(item, key=utf16_units)
            pending.append(_Raw("}"))
            for at, name in enumerate(reversed(names)):
                pending += [item[name], _Raw(quoted(name, halves=False) + ":")]
                if at < len(names) - 1:
                    pending.append(_Raw(","))
            pending.append(_Raw("{"))
    return "".join(out)


def json_items(text: str) -> list[str] | None:
    """JSON_ITEMS: the items of the JSON array, each written as JSON; NULL for anything else."""
    value = _parsed(text)
    return [written(item) for item in value] if isinstance(value, list) else None


def json_records(text: str) -> dict[str, str] | None:
    """JSON_RECORDS: the fields of the JSON object, by name (in VARIANT's order), each value written
    as JSON; NULL for anything else."""
    value = _parsed(text)
    if not isinstance(value, dict):
        return None
    return {name: written(value[name]) for name in sorted(value, key=utf16_units)}


def json_concat(*texts: str | None) -> str | None:
    """JSON_CONCAT (PostgreSQL's ``||``, as ksqlDB's): objects' fields merged, a later one's value
    kept; else arrays' items one after the other, any other value as one item; one text written
    again; NULL if a text is NULL or not JSON."""
    values: list[Any] = []
    for text in texts:
        value = _NOT_JSON if text is None else _parsed(text)
        if value is _NOT_JSON:
            return None
        values.append(value)
    if len(values) == 1:
        return written(values[0])
    if all(isinstance(value, dict) for value in values):
        return written({name: field for value in values for name, field in value.items()})
    return written([item for value in values for item in (value if isinstance(value, list) else [value])])


def json_array_contains(text: str | None, wanted: Any, _: SqlType, wanted_type: SqlType) -> bool | None:
    """JSON_ARRAY_CONTAINS: whether the JSON array has an item equal to ``wanted`` (of JSON's kind
    for its type: a string for a VARCHAR, an integer for an INT or a BIGINT, a number with a point
    or an exponent, or an integer beyond a BIGINT, for a DOUBLE, true or false for a BOOLEAN, null
    for a NULL); FALSE for text that is not a JSON array, NULL for NULL text."""
    if text is None:
        return None
    value = _parsed(text)
    if not isinstance(value, list):
        return False
    if wanted is None:
        return any(item is None for item in value)
    base = wanted_type.base
    if base == "VARCHAR":
        return any(isinstance(item, str) and item == wanted for item in value)
    if base == "BOOLEAN":
        return any(isinstance(item, bool) and item == wanted for item in value)
    if base == "DOUBLE":
        return any(isinstance(item, (float, Decimal)) and float(item) == wanted for item in value)
    return any(type(item) is int and item == wanted for item in value)
