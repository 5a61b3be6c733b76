"""How a persistent query finds a JSON record's fields in Spark as ksqlDB's reader finds them:
by the name as written, else by a key that upper-cased is the name, at any depth
(``JsonReading``). Spark's JSON reader matches a key's case alone; Python's readers find
fields as ksqlDB does (``millpond.shared.kafka.serde.json_fields``).
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Mapping, Sequence

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
    may hold (``_folds``)."""
    if isinstance(data_type, T.ArrayType):
        return folded_names(data_type.elementType)
    if isinstance(data_type, T.MapType):
        return folded_names(data_type.valueType)
    if isinstance(data_type, T.StructType):
        return {f.name for f in data_type.fields if _folds(f.name)}.union(
            *(folded_names(f.dataType) for f in data_type.fields))
    return set()


class JsonReading:
    """How a JSON record (its text) is read into ``schema`` with ``options`` as ksqlDB's reader
    finds fields: by the name as written, else by a key that upper-cased is the name
    (``serde.json_fields``), in nested STRUCTs too (``{"reading": 5}`` fills READING). Spark's
    JSON reader matches the case alone, so a record is parsed by the names spelled several
    ways at once (``spellings``: as declared, as the CREATE statement wrote them, in lower
    case), and takes the first spelling its keys keep to:

    - as declared, where no field is NULL (a few NULL checks);
    - a spelling no key departs from (``_key_in_other_case``, half a parse to one and a half each);
    - else each key found one by one (``_as_found``: three parses more).

    Two stages (``parsed``, then ``found`` of its column): Spark evaluates a parse again at
    each use in a later expression of the same projection."""

    def __init__(self, schema: T.StructType, options: dict[str, str] | None = None,
                 written: Mapping[str, str] | None = None):
        written = written or {}
        self.schema = schema
        self.options = options or {}
        self.fields = T.StructType([f for f in schema.fields if f.name != CORRUPT])
        self.names = sorted(folded_names(self.fields))
        self.flat = not any(folded_names(f.dataType) for f in self.fields)
        """Whether every name of ``names`` is a column's (none a nested STRUCT's field)."""
        self.spellings = _spellings(schema, written) if self.names else [(schema, _as_declared)]
        """Each schema a record is parsed into (one shape, names spelled otherwise), with how it
        spells a name of ``names``: the first as declared."""
        stated = _spelled(schema, lambda name: written.get(name, name))
        merging = isinstance(stated, T.StructType) and stated != schema and not holds(schema, (T.TimeType,))
        self.merged = _merged([spelled for spelled, _ in self.spellings]) if merging else None
        """Where the CREATE statement spells a name otherwise than declared (as producers then
        likely write it): the type a record is parsed into to read it in every spelling at once
        (a STRUCT's fields once per spelling of their names; a fifth more than a parse of the
        names once), and the same with each field named apart by its place (a cast to it lets
        each be picked: a name in two cases is ambiguous to Spark, which casts no TIME: a schema
        with one parses each spelling apart). Elsewhere a record is parsed as declared first,
        and again by another spelling only where its keys keep to none of those before."""

    def parsed(self, text: Column) -> Column:
        """The first stage: ``text`` parsed (into ``merged``, or as declared)."""
        if self.merged is None:
            return F.from_json(text, self.schema, self.options)
        merged, apart = self.merged
        assert isinstance(merged, T.StructType)
        return F.from_json(text, merged, self.options).cast(apart)

    def found(self, parsed: Column, text: Column) -> Column | None:
        """The second stage, of ``parsed``'s column: the record read as ksqlDB reads it; None
        where no name may be found in another case (``parsed`` is the record)."""
        if not self.names:
            return None
        if self.merged is None:
            return self._first_kept(parsed, text, [self._parsed_apart(text, i) for i in range(1, len(self.spellings))])
        types = [spelled for spelled, _ in self.spellings]
        read = [_picked(parsed, types, i, self.schema) for i in range(len(types))]
        fields = _picked(parsed, types, 0, self.schema, bare=True)  # its fields taken straight from ``parsed``
        kept = self._first_kept(read[0], text, read[1:], fields)
        if CORRUPT not in self.schema.fieldNames():
            return kept
        # A key of one spelling that does not read as its type sets the corrupt column, though
        # a spelling that takes another key may read the record: such records are parsed again
        # one spelling at a time.
        apart = _once(F.from_json(text, self.schema, self.options), lambda declared: self._first_kept(
            declared, text, [self._parsed_apart(text, i) for i in range(1, len(types))]))
        return F.when(fields.getField(CORRUPT).isNull(), kept).otherwise(apart)

    def _first_kept(self, declared: Column, text: Column, others: list[Column], fields: Column | None = None) -> Column:
        """The record as the first spelling its keys keep to reads it (``declared`` and ``others``
        each as it reads it, in the order of ``spellings``; each cheap to repeat; ``fields``, a
        struct of the fields as declared reads them, where not ``declared``)."""
        read = F.when(~_folded_field_missing(declared if fields is None else fields, self.fields), declared)
        for (_, spell), other in zip(self.spellings[1:], others, strict=True):
            read = read.when(~_key_in_other_case(text, self.names, spell, self.flat), other)
        read = read.when(~_key_in_other_case(text, self.names, _as_declared, self.flat), declared)
        return read.otherwise(F.from_json(_as_found(None, text, self.fields), self.schema, self.options))

    def _parsed_apart(self, text: Column, index: int) -> Column:
        """``text`` read into the spelling at ``index`` alone, named as declared."""
        spelled = self.spellings[index][0]
        return _once(F.from_json(text, spelled, self.options), lambda read: _renamed(read, spelled, self.schema))


def _as_declared(name: str) -> str:
    return name


def _spellings(schema: T.StructType, written: Mapping[str, str]) -> list[tuple[T.StructType, Callable[[str], str]]]:
    """``JsonReading.spellings``: as declared, as ``written`` (a CREATE statement's spellings,
    ``DataSource.spellings``), in lower case; each once, and none where two fields of a STRUCT
    would then have one name (a quoted name beside an unquoted one spelled as it)."""
    kept: list[tuple[T.StructType, Callable[[str], str]]] = [(schema, _as_declared)]
    for spell in (lambda name: written.get(name, name), str.lower):
        spelled = _spelled(schema, spell)
        if isinstance(spelled, T.StructType) and all(spelled != other for other, _ in kept):
            kept.append((spelled, spell))
    return kept


def _spelled(data_type: T.DataType, spell: Callable[[str], str]) -> T.DataType | None:
    """``data_type`` with each name of ``folded_names`` as ``spell`` writes it, at any depth;
    None where two fields of a STRUCT would then have one name."""
    if isinstance(data_type, T.ArrayType):
        element = _spelled(data_type.elementType, spell)
        return None if element is None else T.ArrayType(element)
    if isinstance(data_type, T.MapType):
        value = _spelled(data_type.valueType, spell)
        return None if value is None else T.MapType(data_type.keyType, value)
    if not isinstance(data_type, T.StructType):
        return data_type
    fields = [(spell(f.name) if _folds(f.name) else f.name, _spelled(f.dataType, spell)) for f in data_type.fields]
    typed = [T.StructField(name, t) for name, t in fields if t is not None]
    return T.StructType(typed) if len(typed) == len({name for name, _ in fields}) == len(fields) else None


def holds(data_type: T.DataType, kinds: tuple[type[T.DataType], ...]) -> bool:
    """Whether values of ``data_type`` hold one of ``kinds`` at any depth (an element, a key,
    a value, a field)."""
    if isinstance(data_type, kinds):
        return True
    if isinstance(data_type, T.ArrayType):
        return holds(data_type.elementType, kinds)
    if isinstance(data_type, T.MapType):
        return holds(data_type.keyType, kinds) or holds(data_type.valueType, kinds)
    if isinstance(data_type, T.StructType):
        return any(holds(f.dataType, kinds) for f in data_type.fields)
    return False


def _merged(types: Sequence[T.DataType]) -> tuple[T.DataType, T.DataType]:
    """``JsonReading.merged`` of ``types`` (one shape, names spelled otherwise): each STRUCT's
    field once per spelling of its name (``_variants``), and the same named by place."""
    first = types[0]
    if all(t == first for t in types):
        return first, first
    if isinstance(first, T.ArrayType):
        merged, apart = _merged([t.elementType for t in types if isinstance(t, T.ArrayType)])
        return T.ArrayType(merged), T.ArrayType(apart)
    if isinstance(first, T.MapType):
        merged, apart = _merged([t.valueType for t in types if isinstance(t, T.MapType)])
        return T.MapType(first.keyType, merged), T.MapType(first.keyType, apart)
    assert isinstance(first, T.StructType)
    merged_fields, apart_fields = [], []
    for place in range(len(first.fields)):
        for variant, (name, spelled) in enumerate(_variants(types, place)):
            merged, apart = _merged(spelled)
            merged_fields.append(T.StructField(name, merged))
            apart_fields.append(T.StructField(f"{place}.{variant}", apart))
    return T.StructType(merged_fields), T.StructType(apart_fields)


def _variants(types: Sequence[T.DataType], place: int) -> list[tuple[str, list[T.DataType]]]:
    """The names the field at ``place`` of STRUCTs ``types`` has, each once, with the types of
    the field under that name."""
    variants: dict[str, list[T.DataType]] = {}
    for struct in types:
        assert isinstance(struct, T.StructType)
        field = struct.fields[place]
        variants.setdefault(field.name, []).append(field.dataType)
    return list(variants.items())


def _picked(value: Column, types: Sequence[T.DataType], index: int, declared: T.DataType, bare: bool = False) -> Column:
    """``value`` (read into ``_merged(types)``'s type named by place; cheap to repeat) as the
    spelling ``types[index]`` reads it, its fields named as ``declared``'s; ``bare``: a STRUCT
    at the top even for a NULL ``value`` (Spark takes a field of it straight from ``value``)."""
    if all(t == types[0] for t in types):
        return value
    if isinstance(declared, T.ArrayType):
        elements = [t.elementType for t in types if isinstance(t, T.ArrayType)]
        return F.transform(value, lambda item: _picked(item, elements, index, declared.elementType))
    if isinstance(declared, T.MapType):
        values = [t.valueType for t in types if isinstance(t, T.MapType)]
        return F.transform_values(value, lambda _, item: _picked(item, values, index, declared.valueType))
    assert isinstance(declared, T.StructType)
    names = [[f.name for f in t.fields] for t in types if isinstance(t, T.StructType)]
    fields = []
    for place, field in enumerate(declared.fields):
        variants = _variants(types, place)
        name = names[index][place]
        variant = [n for n, _ in variants].index(name)
        within = [spelled[place] for spelled in names[:index]].count(name)  # its index among those so named
        fields.append(_picked(value.getField(f"{place}.{variant}"), variants[variant][1], within, field.dataType).alias(field.name))
    return F.struct(*fields) if bare else F.when(value.isNotNull(), F.struct(*fields))


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


KEYS_LISTED_FROM = 5
"""How many names a record is searched for by listing its keys (``_key_in_other_case``) rather
than by taking each name out of its text: 1M records of 2 / 10 / 30 columns, one core, against a
plain parse of 0.43 / 1.03 / 3.27 s: 0.35 / 5.8 / 62 s taken out (it passes over the text twice
per name), 0.62 / 1.55 / 5.5 s listed."""


def _key_in_other_case(text: Column, names: list[str], case: Callable[[str], str], flat: bool = False) -> Column:
    """Whether the JSON ``text`` may have a key that names one of ``names`` in another case than
    ``case`` writes the name (as ksqlDB's reader takes it: a key that upper-cased is the name),
    or has a key written with an escape (``_ESCAPED_KEY``, searched for only in text with one).

    Where each name is a column's (``flat``) and there are ``KEYS_LISTED_FROM`` or more, the
    record's keys are listed (Spark's JSON reader, escapes read), those spelled as ``case``
    writes them set aside, and the others upper-cased and looked up among the names; a record
    that is no JSON object counts as having one. Otherwise the names as ``case`` writes them,
    quoted, are taken out of the text, and what is left is upper-cased and searched for a name
    quoted (a string that names one is taken for a key: the record is read key by key, as it
    then would be). Either costs a fraction of a regular expression of the keys in any other
    case, whose look-arounds at each character, for each name, cost 2 / 27 s per 1M records of
    2 / 10 columns."""
    if flat and len(names) >= KEYS_LISTED_FROM:
        others = F.array_except(F.json_object_keys(text), F.array(*[F.lit(case(name)) for name in names]))
        upper = F.split(F.upper(F.array_join(others, "\u0000")), "\u0000")  # a key holding the separator splits: conservative
        return F.coalesce(F.arrays_overlap(upper, F.array(*[F.lit(name) for name in names])), F.lit(True))
    rest = text
    for name in names:
        rest = F.replace(rest, F.lit(json.dumps(case(name), ensure_ascii=False)), F.lit('""'))
    upper = F.upper(rest)
    found = functools.reduce(operator.or_, [upper.contains(json.dumps(name, ensure_ascii=False).upper()) for name in names])
    return found | (text.contains("\\u") & text.rlike(_ESCAPED_KEY))


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
    at any depth, under their names as ``JsonReading`` finds them: only those, in their
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
