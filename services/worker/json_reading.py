"""How a persistent query finds a JSON record's fields in Spark as ksqlDB's reader finds them:
by the name as written, else by a key that upper-cased is the name, at any depth
(``found_in_any_case``). Spark's JSON reader matches a key's case alone; Python's readers find
fields as ksqlDB does (``millpond.shared.kafka.serde.json_fields``).
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from millpond.services.worker.reducers import CORRUPT


def _folds(name: str) -> bool:
    """Whether a JSON key in another case may hold the field ``name``: one without a lower-case
    letter, as an unquoted name is (no key upper-cased has one, so a quoted lower-case name is
    found as written only)."""
    return name == name.upper()


def folded_names(data_type: T.DataType) -> set[str]:
    """The names of ``data_type``'s STRUCT fields, at any depth, that a JSON key in another case
    may hold (``found_in_any_case``, ``_folds``)."""
    if isinstance(data_type, T.ArrayType):
        return folded_names(data_type.elementType)
    if isinstance(data_type, T.MapType):
        return folded_names(data_type.valueType)
    if isinstance(data_type, T.StructType):
        return {f.name for f in data_type.fields if _folds(f.name)}.union(
            *(folded_names(f.dataType) for f in data_type.fields))
    return set()


def found_in_any_case(parsed: Column, text: Column, schema: T.StructType, options: dict[str, str] | None = None) -> Column:
    """``parsed`` (``text`` read into ``schema`` with ``options``, fields by their keys' case),
    or where a key names a field in another case, ``text`` read again as ksqlDB's
    reader finds fields: by the name as written, else by a key that upper-cased is the name
    (``serde.json_fields``), in nested STRUCTs too (``{"reading": 5}`` fills READING). Spark's
    JSON reader matches the case alone. Only a record where such a field came out NULL is
    searched for such a key (``_key_in_other_case``, about half a JSON parse); a record that
    names every field as written costs a few NULL checks. One whose keys for the names are
    all in lower case, as many producers write them, is read again by their lower-case names
    (one more parse); any other has its keys found as above (``_as_found``: three parses)."""
    fields = T.StructType([f for f in schema.fields if f.name != CORRUPT])
    names = sorted(folded_names(fields))
    again = F.from_json(_as_found(None, text, fields), schema, options)
    lower = _lower_cased(schema)
    if isinstance(lower, T.StructType):  # None where a quoted name is another's in lower case
        lower_read = _once(F.from_json(text, lower, options), lambda read: _renamed(read, lower, schema))
        again = F.when(_key_in_other_case(text, names, str.lower), again).otherwise(lower_read)
    found = _folded_field_missing(parsed, fields) & _key_in_other_case(text, names, lambda name: name)
    return F.when(found, again).otherwise(parsed)


def _lower_cased(data_type: T.DataType) -> T.DataType | None:
    """``data_type`` with each name of ``folded_names`` in lower case, at any depth; None
    where two fields of a STRUCT would then have one name (a quoted lower-case name beside
    an unquoted one)."""
    if isinstance(data_type, T.ArrayType):
        element = _lower_cased(data_type.elementType)
        return None if element is None else T.ArrayType(element)
    if isinstance(data_type, T.MapType):
        value = _lower_cased(data_type.valueType)
        return None if value is None else T.MapType(data_type.keyType, value)
    if not isinstance(data_type, T.StructType):
        return data_type
    fields = [(f.name.lower() if _folds(f.name) else f.name, _lower_cased(f.dataType)) for f in data_type.fields]
    typed = [T.StructField(name, t) for name, t in fields if t is not None]
    return T.StructType(typed) if len(typed) == len({name for name, _ in fields}) == len(fields) else None


def _renamed(value: Column, data_type: T.DataType, renamed: T.DataType) -> Column:
    """``value`` of ``data_type`` with its STRUCTs' fields named as ``renamed``'s, at any depth
    (Spark casts no STRUCT that holds a TIME); ``value`` is an expression cheap to repeat."""
    if data_type == renamed:
        return value
    if isinstance(data_type, T.ArrayType):
        assert isinstance(renamed, T.ArrayType)
        element, renamed_element = data_type.elementType, renamed.elementType
        return F.transform(value, lambda item: _renamed(item, element, renamed_element))
    if isinstance(data_type, T.MapType):
        assert isinstance(renamed, T.MapType)
        item_type, renamed_item = data_type.valueType, renamed.valueType
        return F.transform_values(value, lambda _, item: _renamed(item, item_type, renamed_item))
    assert isinstance(data_type, T.StructType) and isinstance(renamed, T.StructType)
    fields = [_renamed(value.getField(f.name), f.dataType, r.dataType).alias(r.name)
              for f, r in zip(data_type.fields, renamed.fields, strict=True)]
    return F.when(value.isNotNull(), F.struct(*fields))


_ESCAPED_KEY = r'(?:(?<!\\)"(?:[^"\\]|\\.)*\\u[0-9A-Fa-f]{4}(?:[^"\\]|\\.)*"\s*:)'
"""A Java regular expression of a JSON key written with a ``\\u`` escape, and the colon after
it: it may name a field in another case (``"\\u0072eading"``), which no pattern of the names
finds."""


def _key_in_other_case(text: Column, names: list[str], case: Callable[[str], str]) -> Column:
    """Whether the JSON ``text`` has a key that names one of ``names`` in any other case than
    ``case`` writes the name, or a key written with an escape (``_ESCAPED_KEY``, searched for
    only in text with one: it costs three times the names' search)."""
    def quoted(name: str) -> str:  # as JSON writes it, then as Java's Pattern.quote (a name is any text)
        return r"\Q" + json.dumps(name, ensure_ascii=False)[1:-1].replace(r"\E", r"\E\\E\Q") + r"\E"

    keys = "|".join(rf'(?:(?<!\\)"(?!{quoted(case(name))}")(?iu:{quoted(name)})"\s*:)' for name in names)
    return text.rlike(keys) | (text.contains("\\u") & text.rlike(_ESCAPED_KEY))


def _folded_field_missing(value: Column, data_type: T.DataType) -> Column:
    """Whether a field of ``folded_names`` is NULL in ``value`` at any depth (its key may be in
    another case); never NULL."""
    if isinstance(data_type, T.StructType):
        parts = [value.getField(f.name).isNull() for f in data_type.fields if _folds(f.name)]
        parts += [_folded_field_missing(value.getField(f.name), f.dataType) for f in data_type.fields
                  if folded_names(f.dataType)]
        return F.coalesce(functools.reduce(operator.or_, parts), F.lit(False)) if parts else F.lit(False)
    if isinstance(data_type, T.ArrayType | T.MapType):
        items = value if isinstance(data_type, T.ArrayType) else F.map_values(value)
        item_type = data_type.elementType if isinstance(data_type, T.ArrayType) else data_type.valueType

        def missing(item: Column) -> Column:  # one parameter: Spark's lambda takes as many as it has
            return _folded_field_missing(item, item_type)

        return F.coalesce(F.exists(items, missing), F.lit(False))
    return F.lit(False)


def _as_found(value: Column | None, text: Column, data_type: T.DataType) -> Column:
    """The JSON of a value (``value`` its VARIANT, ``text`` its JSON as Spark's reader gives a
    VARCHAR it, a text unquoted; each an expression cheap to repeat; a record's text alone, as
    ``value`` None) with each STRUCT's fields,
    at any depth, under their names as ``found_in_any_case`` finds them: only those, in their
    order. Each other value is written as the reader gave it, so the reader then reads it as it
    reads any value; a MAP's keys stay as written. A value that is not an object (or an array)
    where its type has one stays as it is, for the reader to set aside."""
    if value is None:  # a record: an object, or text to leave as it is
        written = text
    else:
        written = F.coalesce(F.when(F.schema_of_variant(value) == F.lit("STRING"), F.to_json(value)).otherwise(text),
                             F.lit("null"))
    if not folded_names(data_type):
        return written
    if isinstance(data_type, T.ArrayType):
        assert value is not None  # a record is an object
        element = data_type.elementType

        def items(read: Column) -> Column:
            rebuilt = F.zip_with(read["v"], read["t"], lambda v, t: _as_found(v, t, element))
            return F.when(read["v"].isNull(), written).otherwise(F.concat(F.lit("["), F.array_join(rebuilt, ","), F.lit("]")))

        return _once(F.struct(F.try_variant_get(value, "$", "ARRAY<VARIANT>").alias("v"),
                              F.from_json(text, "ARRAY<STRING>").alias("t")), items)
    if isinstance(data_type, T.MapType):
        item_type = data_type.valueType

        def entries(read: Column) -> Column:
            def entry(key: Column) -> Column:
                quoted = F.regexp_extract(F.to_json(F.array(key)), r"^\[(.*)\]$", 1)
                return F.concat(quoted, F.lit(":"), _as_found(read["v"][key], read["t"][key], item_type))

            rebuilt = F.array_join(F.transform(F.map_keys(read["t"]), entry), ",")
            return F.when(read["v"].isNull(), written).otherwise(F.concat(F.lit("{"), rebuilt, F.lit("}")))

        return _once(_object_read(value, text), entries)
    assert isinstance(data_type, T.StructType)
    names = [f.name for f in data_type.fields]

    def fields(read: Column) -> Column:
        def key(name: str) -> Column:
            key = F.when(F.map_contains_key(read["v"], F.lit(name)), F.lit(name))
            if _folds(name):  # else the last key that upper-cased is the name
                key = F.coalesce(key, F.element_at(F.filter(F.map_keys(read["v"]), lambda k: F.upper(k) == F.lit(name)), -1))
            return key

        def rebuilt(keys: Column) -> Column:
            found = [F.when(keys[i].isNotNull(), F.concat(F.lit(json.dumps(f.name, ensure_ascii=False) + ":"),
                                                           _as_found(read["v"][keys[i]], read["t"][keys[i]], f.dataType)))
                     for i, f in enumerate(data_type.fields)]
            return F.concat(F.lit("{"), F.concat_ws(",", *found), F.lit("}"))

        return F.when(read["v"].isNull(), written).otherwise(_once(F.array(*[key(name) for name in names]), rebuilt))

    return _once(_object_read(value, text), fields)


def _object_read(value: Column | None, text: Column) -> Column:
    """An object's fields: ``v`` as VARIANTs (NULL for a value that is no object), ``t`` as
    the text Spark's reader gives a VARCHAR."""
    fields = F.from_json(text, "MAP<STRING, VARIANT>") if value is None else F.try_variant_get(value, "$", "MAP<STRING, VARIANT>")
    return F.struct(fields.alias("v"), F.from_json(text, "MAP<STRING, STRING>").alias("t"))


def _once(value: Column, body: Callable[[Column], Column]) -> Column:
    """``body`` of ``value``, which it may use many times, evaluated once: Spark evaluates an
    expression again at each use in a condition's branch (a JSON parse, here)."""
    return F.element_at(F.transform(F.array(value), body), 1)
