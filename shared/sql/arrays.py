"""The ARRAY and MAP functions' values in Python, as Spark's (NaN equal to itself and above every
number, -0.0 equal to 0.0, NULLs last in a sort, items compared in linear time), their Spark SQL
where it is not a call of the same arguments, and what Spark's analyzer refuses of them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, overload

from millpond.shared.sql.ast import Literal, SqlType, to_sql
from millpond.shared.sql.java_text import java_double_text
from millpond.shared.sql.kinds import KIND_NOTES, KINDS, MAX_PADDED_CHARS, common_type, holds, spark_ranked

JOINED = frozenset({"VARCHAR", "INT", "BIGINT", "BOOLEAN", "DOUBLE"})
"""The items ARRAY_JOIN writes as Spark's CAST to text does in Python too."""


def _item_text(item: Any) -> str:
    """An item of an ARRAY as ARRAY_JOIN writes it: Spark's CAST to text, NULL as ``null`` (ksqlDB's)."""
    if item is None:
        return "null"
    if isinstance(item, bool):
        return "true" if item else "false"
    return java_double_text(item) if isinstance(item, float) else str(item)


def array_join(items: list[Any] | None, delimiter: str | None = ",") -> str | None:
    """ksqlDB's ARRAY_JOIN: the items as text between delimiters (a NULL one: none), NULL items
    ``null``; bounded as CONCAT is."""
    if items is None:
        return None
    texts = [_item_text(item) for item in items]
    between = delimiter or ""
    if sum(map(len, texts)) + len(between) * max(len(texts) - 1, 0) > MAX_PADDED_CHARS:
        return None
    return between.join(texts)


def array_join_in_spark(args: list[str]) -> str:
    delimiter = f"coalesce({args[1]}, '')" if len(args) > 1 else "','"
    return f"array_join(CAST({args[0]} AS ARRAY<STRING>), {delimiter}, 'null')"


def join_refusal(args: tuple[Any, ...], types: list[SqlType]) -> str | None:
    array = types[0]
    if array.base == "NULL" or (array.base == "ARRAY" and array.params[0].base in JOINED):
        return None
    return f"ARRAY_JOIN joins an ARRAY of {', '.join(sorted(JOINED))}, not {array}"


def element(types: list[SqlType]) -> SqlType:
    """The element type of the first argument, an ARRAY (NULL for a NULL literal)."""
    return types[0].params[0] if types[0].base == "ARRAY" else SqlType("NULL")


def same_elements(types: list[SqlType]) -> bool:
    """Whether the second argument mixes with the ARRAY's elements (Spark's ``array_contains``
    and ``array_remove`` compare them)."""
    return common_type([element(types), types[1]]) is not None


def sorted_items(items: list[Any], descending: bool = False) -> list[Any]:
    """Spark's order of an array's items: NaN above every number, -0.0 equal to 0.0, NULLs last
    either way (``array_sort``, ``sort_array(a, false)``)."""
    values = sorted((x for x in items if x is not None), key=spark_ranked, reverse=descending)
    return values + [None] * (len(items) - len(values))


def contains(items: list[Any] | None, value: Any) -> bool | None:
    """Spark's ``array_contains``: NULL for a NULL value, or where no item matches and one is NULL."""
    if items is None or value is None:
        return None
    if any(x is not None and spark_ranked(x) == spark_ranked(value) for x in items):
        return True
    return None if None in items else False


def distinct(items: list[Any]) -> list[Any]:
    """Spark's ``array_distinct``: each item once (NaN once, NULL once, -0.0 as 0.0), in the order
    first seen; in time linear in the items (a pull's array may hold a megabyte of them)."""
    seen: set[Any] = set()
    kept: list[Any] = []
    for x in (x + 0.0 if isinstance(x, float) else x for x in items):
        key = _hashed(x)
        if key not in seen:
            seen.add(key)
            kept.append(x)
    return kept


def _kept(first: list[Any], second: list[Any], present: bool) -> list[Any]:
    """The distinct items of ``first`` that are (or are not) in ``second``, in time linear in both."""
    keys = {_hashed(x) for x in second}
    return [x for x in distinct(first) if (_hashed(x) in keys) == present]


def array_concat(first: list[Any] | None, second: list[Any] | None) -> list[Any] | None:
    """ksqlDB's ARRAY_CONCAT: the items of both, NULL only when both are; past ``MAX_PADDED_CHARS``
    items NULL in Python (nested, each call could double them)."""
    if first is None or second is None:
        return second if first is None else first
    return None if len(first) + len(second) > MAX_PADDED_CHARS else first + second


SETS: dict[str, Callable[[list[Any], list[Any]], list[Any]]] = {
    "ARRAY_UNION": lambda a, b: distinct(a + b),
    "ARRAY_INTERSECT": lambda a, b: _kept(a, b, present=True),
    "ARRAY_EXCEPT": lambda a, b: _kept(a, b, present=False),
}
"""Spark's ``array_union``, ``array_intersect`` and ``array_except``: distinct items (as
``array_distinct``'s) in the order first seen."""


def two_arrays(name: str) -> Callable[[tuple[Any, ...], list[SqlType]], str | None]:
    """Two ARRAYs of one element type, whose items Spark compares."""
    def refuses(args: tuple[Any, ...], types: list[SqlType]) -> str | None:
        arrays = [t for t in types if t.base != "NULL"]
        if len(arrays) < len(types):  # Spark types no concat of an ARRAY with a NULL
            return f"{name} takes two ARRAYs; a bare NULL has no element type"
        if any(t != arrays[0] for t in arrays):
            return f"{name} takes two ARRAYs of one type, not {types[0]} and {types[1]}"
        return None if name == "ARRAY_CONCAT" else array_call_error(name, arrays)
    return refuses


def evaluated_once(args: list[str], body: Callable[[list[str]], str]) -> str:
    """Spark SQL of ``body`` over ``args`` where it reads an argument more than once: each
    argument evaluated once (one may be costly, or random), and the text as long as the
    arguments' once (a call nested in another's argument does not grow it threefold a level)."""
    fields = [f"__once.a{i}" for i in range(len(args))]
    values = ", ".join(f"'a{i}', {arg}" for i, arg in enumerate(args))
    return f"element_at(transform(array(named_struct({values})), __once -> {body(fields)}), 1)"


def _either_or_both(both: str) -> Callable[[list[str]], str]:
    """The second where the first is NULL, the first where the second is, else ``both`` of them."""
    return lambda a: f"CASE WHEN {a[0]} IS NULL THEN {a[1]} WHEN {a[1]} IS NULL THEN {a[0]} ELSE {both}({a[0]}, {a[1]}) END"


def array_concat_in_spark(args: list[str]) -> str:
    return evaluated_once(args, _either_or_both("concat"))


def map_refusal(name: str) -> Callable[[tuple[Any, ...], list[SqlType]], str | None]:
    return lambda args, types: f"{name} takes a MAP; a bare NULL has no key type (CAST it)" if types[0].base != "MAP" else None


def map_union(first: dict[Any, Any] | None, second: dict[Any, Any] | None) -> dict[Any, Any] | None:
    """ksqlDB's MAP_UNION: the entries of both MAPs, the second's value where both have a key (at
    the first's place, as Spark's ``map_concat`` keeps the last value); a NULL MAP counts as none."""
    if first is None or second is None:
        return first if second is None else second
    return {**first, **second}


def map_union_in_spark(args: list[str]) -> str:
    return evaluated_once(args, _either_or_both("map_concat"))


def map_union_refusal(args: tuple[Any, ...], types: list[SqlType]) -> str | None:
    """MAP_UNION takes two MAPs of one type."""
    if any(t.base != "MAP" for t in types):
        return "MAP_UNION takes two MAPs; a bare NULL has no key type (CAST it)"
    if types[0] != types[1]:
        return f"MAP_UNION takes two MAPs of one type, not {types[0]} and {types[1]}"
    return None


def _hashed(value: Any) -> Any:
    """``value`` as a set's key, equal where Spark's values are: NaN one value, lists and
    structs by their items."""
    if isinstance(value, float):
        return ("NaN",) if math.isnan(value) else value + 0.0
    if isinstance(value, list):
        return tuple(_hashed(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _hashed(v)) for k, v in value.items())
    return value


_ORDERING = frozenset({"ARRAY_SORT", "ARRAY_MAX", "ARRAY_MIN"})

_TAKEN_INTO = {"INT": ("BIGINT", "DOUBLE"), "BIGINT": ("DOUBLE",)}
"""The element types a value of each type is taken into as it is (Spark's tightest common type)."""


def array_refusal(name: str) -> Callable[[tuple[Any, ...], list[SqlType]], str | None]:
    """``ScalarFunction.refuses`` of the ARRAY function ``name``."""
    return lambda args, types: array_call_error(name, types)


def array_call_error(name: str, types: list[SqlType]) -> str | None:
    """Why Spark cannot take the ARRAY function ``name`` of arguments of ``types``, or None."""
    if types[0].base != "ARRAY":
        return f"{name} takes an ARRAY; a bare NULL has no element type (CAST it)"
    element = types[0].params[0]
    if holds(element, frozenset({"MAP"})):
        return f"{name} cannot compare the items of an ARRAY of {element}: Spark compares no MAP"
    if name in _ORDERING and element.base not in KINDS["orderable"]:  # type: ignore[operator]
        return f"{name} orders the items of an ARRAY of {KIND_NOTES['orderable']}, not {element}"
    if len(types) > 1 and name in ("ARRAY_CONTAINS", "ARRAY_REMOVE"):
        value = types[1]
        if value.base == "NULL":
            return f"{name} looks for a value of the ARRAY's type ({element}); a bare NULL has none (CAST it)"
        if name == "ARRAY_REMOVE" and value != element and element.base not in _TAKEN_INTO.get(value.base, ()):
            return f"ARRAY_REMOVE takes out values of the ARRAY's type ({element}), not {value}"
    return None


def sort_refusal(args: tuple[Any, ...], types: list[SqlType]) -> str | None:
    if len(args) > 1 and not (isinstance(args[1], Literal) and str(args[1].value).upper() in ("ASC", "DESC")):
        return f"ARRAY_SORT's order must be 'ASC' or 'DESC' written as it is, not {to_sql(args[1])}"
    return array_call_error("ARRAY_SORT", types)


def array_sort_in_spark(args: list[str]) -> str:
    return f"sort_array({args[0]}, false)" if len(args) > 1 and args[1].strip("'").upper() == "DESC" else f"array_sort({args[0]})"


def entries(items: dict[Any, Any], ordered: bool) -> list[dict[str, Any]]:
    """ksqlDB's ENTRIES: a MAP's entries as STRUCTs of K and V, in the order of their keys
    when ``ordered`` (Spark's: NaN last), else in the map's."""
    pairs = sorted(items.items(), key=lambda kv: spark_ranked(kv[0])) if ordered else items.items()
    return [{"K": key, "V": value} for key, value in pairs]


def entries_in_spark(args: list[str]) -> str:
    """ENTRIES in Spark SQL: ``map_entries`` as STRUCTs of K and V, sorted by K (its keys are
    unique) when asked; NULL when the order is."""
    as_kv = f"transform(map_entries({args[0]}), __entry -> named_struct('K', __entry.key, 'V', __entry.value))"
    by_key = f"array_sort({as_kv}, (__a, __b) -> CASE WHEN __a.K < __b.K THEN -1 WHEN __a.K > __b.K THEN 1 ELSE 0 END)"
    return f"(CASE WHEN {args[1]} IS NULL THEN NULL WHEN {args[1]} THEN {by_key} ELSE {as_kv} END)"


def entries_type(types: list[SqlType]) -> SqlType:
    key, value = types[0].params if types[0].base == "MAP" else (SqlType("NULL"), SqlType("NULL"))
    return SqlType("ARRAY", (SqlType("STRUCT", (("K", key), ("V", value))),))


def entries_refusal(args: tuple[Any, ...], types: list[SqlType]) -> str | None:
    if types[0].base != "MAP":
        return "ENTRIES takes a MAP; a bare NULL has no key type (CAST it)"
    if types[0].params[0].base not in KINDS["orderable"]:  # type: ignore[operator]
        return f"ENTRIES orders a MAP's entries by keys of {KIND_NOTES['orderable']}, not {types[0]}"
    return None


MAP_KEY_TYPES = frozenset({"VARCHAR", "INT", "BIGINT", "BOOLEAN"})
"""What a MAP made of values may be keyed by (a key Python hashes as Spark compares it)."""


def as_map(keys: list[Any], values: list[Any]) -> dict[Any, Any]:
    """ksqlDB's AS_MAP: each key with the value at its position (NULL past the values' end); a
    key given twice keeps its first place and its last value (Spark's map, with the session's
    ``mapKeyDedupPolicy``, as Python's dict), a NULL key is left out (a Spark map has none)."""
    return {key: values[i] if i < len(values) else None for i, key in enumerate(keys) if key is not None}


def as_map_in_spark(args: list[str]) -> str:
    """AS_MAP in Spark SQL: ``zip_with`` pads the values with NULLs to the keys' length (and
    past it, cut off), the entries with a NULL key are dropped (``map_from_entries`` fails on one)."""
    keys, values = args
    zipped = f"zip_with({keys}, {values}, (__key, __value) -> named_struct('key', __key, 'value', __value))"
    return f"map_from_entries(filter(slice({zipped}, 1, size({keys})), __entry -> __entry.key IS NOT NULL))"


def as_map_type(types: list[SqlType]) -> SqlType:
    return SqlType("MAP", (element(types), element(types[1:])))


def as_map_refusal(args: tuple[Any, ...], types: list[SqlType]) -> str | None:
    if any(t.base != "ARRAY" for t in types):
        return "AS_MAP takes two ARRAYs, its keys and its values; a bare NULL has no element type (CAST it)"
    if types[0].params[0].base not in MAP_KEY_TYPES:
        return f"AS_MAP's keys must be {', '.join(sorted(MAP_KEY_TYPES))}, not {types[0].params[0]}"
    return None


def generate_series(start: int, end: int, step: int | None = None) -> list[int] | None:
    """ksqlDB's GENERATE_SERIES: ``start``, then each ``step`` on up to ``end`` (included; by
    default 1 or -1, towards it). NULL where ksqlDB fails (a step of 0, or away from ``end``)
    and past ``MAX_PADDED_CHARS`` items (Spark would make any number, to the JVM's end)."""
    if step is None:
        step = 1 if end > start else -1
    if step == 0 or (end > start and step < 0) or (end < start and step > 0):
        return None
    if abs(end - start) >= MAX_PADDED_CHARS * abs(step):
        return None
    return list(range(start, end + (1 if step > 0 else -1), step))


def generate_series_in_spark(args: list[str]) -> str:
    """GENERATE_SERIES in Spark SQL: ``sequence``, which fails the batch on a step of 0 or away
    from the end, NULL there and past ``MAX_PADDED_CHARS`` items as in Python (a difference of
    two BIGINTs in DECIMAL: it would wrap around as a BIGINT)."""
    start, end = args[:2]
    step = args[2] if len(args) > 2 else f"(CASE WHEN {end} > {start} THEN 1 ELSE -1 END)"
    span = f"abs(CAST({end} AS DECIMAL(20,0)) - CAST({start} AS DECIMAL(20,0)))"
    wrong = f"{step} = 0 OR ({end} > {start} AND {step} < 0) OR ({end} < {start} AND {step} > 0)"
    return (f"(CASE WHEN {wrong} OR {span} >= {MAX_PADDED_CHARS} * abs(CAST({step} AS DECIMAL(20,0))) THEN NULL "
            f"ELSE sequence({', '.join(args)}) END)")


def series_type(types: list[SqlType]) -> SqlType:
    """An ARRAY of the arguments' common type, INT or BIGINT (Spark's ``sequence`` widens them)."""
    return SqlType("ARRAY", (common_type(types) or SqlType("BIGINT"),))


def series_refusal(args: tuple[Any, ...], types: list[SqlType]) -> str | None:
    if all(t.base == "NULL" for t in types[:2]):
        return "GENERATE_SERIES needs a start or an end of a type, INT or BIGINT; both are a bare NULL (CAST one)"
    return None


CUBE_MAX_ITEMS = 20
"""The most items CUBE_EXPLODE takes, as ksqlDB's (2^20 rows already)."""
CUBE_TOO_MANY = f"CUBE_EXPLODE takes at most {CUBE_MAX_ITEMS} items: its 2^N rows would exhaust memory"


class RecordFailure(ValueError):
    """A record a query's expression cannot make rows of (ksqlDB's query logs it and goes on)."""


class Cube(Sequence[list[Any]]):
    """ksqlDB's CUBE_EXPLODE rows of ``items``, each made when it is read (2^20 of them took 3 s
    and a gigabyte made at once on a pull or push query's loop, before its LIMIT): every
    combination of the items, each there or NULL, in the order of the bit masks that keep them
    (the first item the highest bit), a combination that only differs by a NULL item's place
    made once; none for a NULL ARRAY."""

    def __init__(self, items: list[Any] | None):
        if items is not None and len(items) > CUBE_MAX_ITEMS:
            raise RecordFailure(f"{CUBE_TOO_MANY} (it has {len(items)})")
        self.items = items or []
        n = len(self.items)
        # The bits of the items there, highest first: the masks kept are their subsets, in order.
        self._bits = [1 << (n - 1 - i) for i, item in enumerate(self.items) if item is not None][::-1]
        self._count = 0 if items is None else 1 << len(self._bits)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> list[Any]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[list[Any]]: ...

    def __getitem__(self, index: int | slice) -> list[Any] | Sequence[list[Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if not -self._count <= index < self._count:
            raise IndexError(index)
        index %= self._count
        # The index-th subset of the bits there, in ascending order: its bits deposited on theirs.
        mask = sum(bit for at, bit in enumerate(self._bits) if index >> at & 1)
        n = len(self.items)
        return [item if mask >> (n - 1 - i) & 1 else None for i, item in enumerate(self.items)]


def cube(items: list[Any] | None) -> list[list[Any]]:
    """``Cube``'s rows, all of them."""
    return list(Cube(items))


def _cube_rows() -> str:
    """Spark SQL of ``cube`` of ``__cube_all``, the ARRAY evaluated once (its expression may be
    costly or not deterministic); lambda names of their own, so that no column its expression
    reads is hidden."""
    n = "size(__cube_all)"
    keeps = f"shiftright(__cube_mask, {n} - 1 - __cube_at) & 1 = 1"
    rows = (f"transform(filter(sequence(0, shiftleft(1, {n}) - 1), __cube_mask -> size(filter(__cube_all, "
            f"(__cube_item, __cube_at) -> __cube_item IS NULL AND {keeps})) = 0), "
            f"__cube_mask -> transform(__cube_all, (__cube_item, __cube_at) -> IF({keeps}, __cube_item, NULL)))")
    return f"IF(__cube_all IS NULL, NULL, IF({n} > {CUBE_MAX_ITEMS}, raise_error('{CUBE_TOO_MANY}'), {rows}))"


_CUBE_OPEN, _CUBE_CLOSE = "element_at(transform(array(", f"), __cube_all -> {_cube_rows()}), 1)"


def cube_in_spark(items: str) -> str:
    """Spark SQL of ``cube`` of the ARRAY ``items``: an ARRAY of its rows (a record with too many
    items fails, and the query sets it aside to the processing log, as ksqlDB's logs it)."""
    return f"{_CUBE_OPEN}{items}{_CUBE_CLOSE}"


def cubed_items(spark: str) -> str | None:
    """The ARRAY's Spark SQL of a ``cube_in_spark``, or None for any other expression."""
    if spark.startswith(_CUBE_OPEN) and spark.endswith(_CUBE_CLOSE):
        return spark[len(_CUBE_OPEN):len(spark) - len(_CUBE_CLOSE)]
    return None
