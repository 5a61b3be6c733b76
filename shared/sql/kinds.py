"""What SQL values are to Spark, for typing and evaluating them the same way in Python: the kinds
of values a function's parameter takes, the type values of several types widen to, how Spark
orders a NaN, a DECIMAL's precision, and how long a text Python makes."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Any

from millpond.shared.sql.ast import SqlType

NUMERIC = frozenset({"INT", "BIGINT", "DECIMAL", "DOUBLE"})

INTEGRAL = frozenset({"INT", "BIGINT"})

# What a parameter accepts: a kind name and the base types it admits (None: any type).
KINDS: dict[str, frozenset[str] | None] = {
    "string": frozenset({"VARCHAR"}),
    "boolean": frozenset({"BOOLEAN"}),
    "numeric": NUMERIC,
    "integer": INTEGRAL,
    "code": frozenset({"INT", "BIGINT", "VARCHAR"}),
    "array": frozenset({"ARRAY"}),
    "map": frozenset({"MAP"}),
    "bigint": INTEGRAL,
    "timestamp": frozenset({"TIMESTAMP"}),
    "date": frozenset({"DATE"}),
    "any": None,
    "orderable": frozenset({"BOOLEAN", "INT", "BIGINT", "DOUBLE", "DECIMAL", "VARCHAR", "TIMESTAMP", "DATE", "TIME"}),
    "listable": None,
}

KIND_NOTES = {"orderable": "BOOLEAN, a number, VARCHAR, DATE, TIME or TIMESTAMP", "code": "INT, BIGINT or VARCHAR"}
"""What a kind admits, where its name does not say it."""

HELD_APART: dict[str, frozenset[str]] = {"listable": frozenset({"MAP"})}
"""Kinds of any type but these, at any depth: Spark orders no map, so COLLECT_LIST, which
orders its values by offset in structs, takes none, nor COLLECT_SET, whose values Spark
compares (``listable``)."""


def holds(type_: SqlType, bases: frozenset[str]) -> bool:
    """Whether ``type_`` is one of ``bases`` or has one inside (an element, a key, a field)."""
    if type_.base in bases:
        return True
    if type_.base == "STRUCT":
        return any(holds(t, bases) for _, t in type_.params)
    return type_.base in ("ARRAY", "MAP") and any(holds(t, bases) for t in type_.params)


def accepts(kind: str, type_: SqlType) -> bool:
    """True if a parameter of ``kind`` takes an argument of ``type_`` (NULL fits anything)."""
    allowed = KINDS[kind]
    if kind in HELD_APART:
        return not holds(type_, HELD_APART[kind])
    return type_.base == "NULL" or allowed is None or type_.base in allowed


def common_type(types: Sequence[SqlType]) -> SqlType | None:
    """The type every one of ``types`` widens to, or None when they do not mix."""
    known = [t for t in types if t.base != "NULL"]
    if not known:
        return SqlType("NULL")
    if all(t == known[0] for t in known):
        return known[0]
    if all(t.base in NUMERIC for t in known):
        if any(t.base == "DECIMAL" for t in known) and not any(t.base == "DOUBLE" for t in known):
            return wider_decimal([t.params if t.base == "DECIMAL" else INTEGRAL_DECIMALS[t.base] for t in known])
        for base in ("DOUBLE", "BIGINT", "INT"):
            widest = next((t for t in known if t.base == base), None)
            if widest is not None:
                return widest
    return None


def is_nan(value: Any) -> bool:
    """Whether a value is a DOUBLE's NaN."""
    return isinstance(value, float) and math.isnan(value)


def spark_ranked(value: Any) -> tuple[bool, Any]:
    """A value as Spark orders it against another of its type: NaN above every number and equal
    to itself (``SQLOrderingUtil.compareDoubles``), where Python's NaN compares as Java's does."""
    return (True, 0.0) if is_nan(value) else (False, value)


def spark_compare(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    """``op`` of two values as Spark's comparison answers it: a NaN equal to itself and above
    every number (``SQLOrderingUtil.compareDoubles``), where Python's NaN is neither; an INT or
    BIGINT beside a DOUBLE compared as a DOUBLE (Spark's common type), where Python compares them
    exactly (2^63 - 1 equals the DOUBLE 2^63 to Spark)."""
    def compare(a: Any, b: Any) -> bool:
        # Inline (a pull's WHERE compares every row): only a float NaN is unequal to itself.
        if a.__class__ is float or b.__class__ is float:
            if a != a or b != b:
                return op(spark_ranked(a), spark_ranked(b))
            return op(float(a) if a.__class__ is int else a, float(b) if b.__class__ is int else b)
        return op(a, b)
    return compare


MAX_DECIMAL_DIGITS = 38
"""A DECIMAL's largest precision, Spark's (``DecimalType.MAX_PRECISION``)."""


def decimal_type(precision: int, scale: int) -> SqlType:
    """DECIMAL(precision, scale) as Spark's arithmetic bounds it (``adjustPrecisionScale``, with
    precision loss allowed, its default): past 38 digits the whole digits are kept and the
    scale cut to what is left, but to no fewer than 6 (nor more than it was)."""
    if precision <= MAX_DECIMAL_DIGITS:
        return SqlType("DECIMAL", (precision, scale))
    whole = precision - scale
    return SqlType("DECIMAL", (MAX_DECIMAL_DIGITS, max(MAX_DECIMAL_DIGITS - whole, min(scale, 6))))


def wider_decimal(types: Sequence[tuple[int, int]]) -> SqlType:
    """The DECIMAL that each (precision, scale) widens to for a CASE, COALESCE or GREATEST:
    the most whole digits and the largest scale, each bounded by 38 (Spark's
    ``widerDecimalType``)."""
    scale = max(s for _, s in types)
    whole = max(p - s for p, s in types)
    return SqlType("DECIMAL", (min(whole + scale, MAX_DECIMAL_DIGITS), min(scale, MAX_DECIMAL_DIGITS)))


DECIMAL_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
"""The text Java's ``BigDecimal`` reads, in ASCII digits: Spark's CAST (after a trim), JSON and
CSV readers take a DECIMAL's text so (Python's ``Decimal`` also takes ``1_0``, ``NaN`` and spaces)."""

INTEGRAL_DECIMALS = {"INT": (10, 0), "BIGINT": (20, 0)}
"""The (precision, scale) of the DECIMAL an INT or BIGINT column widens to beside one, Spark's."""


def fitted_decimal(number: Any, precision: int, scale: int) -> Decimal | None:
    """``number`` (an int, a float read by its shortest digits, a Decimal) rounded half up to
    ``scale`` digits, as Spark makes a value a DECIMAL(precision, scale); None when it has more
    whole digits than the type holds, or is not finite (Spark's NULL outside ANSI mode)."""
    with localcontext(prec=max(precision + 2, 80)):  # quantize must not run out of digits
        exact = number if isinstance(number, Decimal) else Decimal(repr(number) if isinstance(number, float) else number)
        if not exact.is_finite():
            return None
        rounded = exact.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)
    return None if rounded.adjusted() + 1 > precision - scale else rounded


MAX_PADDED_CHARS = 1 << 20
"""The longest text LPAD, RPAD, CONCAT (and ``||``), CONCAT_WS and REPLACE make in Python (a longer one is
NULL): a Kafka record holds at most 1 MB by default, and a length of 2^31 - 1 once built a
21 GB string on the router's loop; REPLACE of each character of a long text by a 60 KB one
would build 60 GB."""


def spark_once(value: str, body: Callable[[str], str], name: str = "millpond_value") -> str:
    """Spark SQL of ``body`` of the Spark SQL ``value``, which it may read several times, with
    ``value`` computed once (RANDOM's one value throughout): a lambda over a one-item ARRAY, its
    variable ``name``, whose body reads no column (a column of that name would not be read)."""
    return f"element_at(transform(array({value}), {name} -> {body(name)}), 1)"


def java_decimal_text(exact: Decimal) -> str:
    """A DECIMAL's text as Java's BigDecimal writes it (Spark's CAST and ``to_json``): its scale's
    digits, ``1E-8`` where Java's writes it so, no negative zero."""
    return str(exact.copy_abs() if exact.is_zero() else exact)
