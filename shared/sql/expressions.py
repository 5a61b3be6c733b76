"""Expressions: compiled to Spark SQL for the workers and evaluated in Python for pull
queries, with the same semantics (ksqlDB's: integer division truncates, NULL propagates,
arrays are 1-based). Typing lives in ``millpond.shared.sql.types``."""

from __future__ import annotations

import math
import operator
import re
from collections import ChainMap
from collections.abc import Callable, Mapping
from decimal import Decimal, localcontext
from typing import Any, cast

from millpond.shared.errors import StatementError
from millpond.shared.sql import aggregates, ast, functions, kinds, likes
from millpond.shared.sql.java_text import java_double_text
from millpond.shared.sql.kinds import INTEGRAL, spark_compare
from millpond.shared.sql.types import LAMBDA_FUNCTIONS, Scope, check, lambda_call


def quote_identifier(name: str) -> str:
    """A column name as a Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def spark_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    escaped = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def _typed_literal(literal: ast.Literal) -> str:
    """A number literal as Spark SQL that Spark reads as the type Millpond gave it: a DECIMAL
    in plain digits to its scale (``0.0000001``, not ``1e-07``, a DOUBLE to Spark), a DOUBLE
    with Spark's ``D`` (``2.5D``; ``2.5`` would be a DECIMAL)."""
    if isinstance(literal.value, float):
        if literal.type.base == "DECIMAL":
            return format(Decimal(repr(literal.value)).quantize(Decimal(1).scaleb(-literal.type.params[1])), "f")
        return f"{literal.value!r}D"
    return spark_literal(literal.value)


_SPARK_TYPES = {"VARCHAR": "STRING", "INT": "INT", "BIGINT": "BIGINT", "DOUBLE": "DOUBLE",
                "BOOLEAN": "BOOLEAN", "BYTES": "BINARY", "TIMESTAMP": "TIMESTAMP", "DATE": "DATE"}


def spark_type(type_: ast.SqlType) -> str:
    """A SQL type as Spark SQL DDL."""
    if type_.base == "DECIMAL":
        return f"DECIMAL({type_.params[0]},{type_.params[1]})"
    if type_.base == "ARRAY":
        return f"ARRAY<{spark_type(type_.params[0])}>"
    if type_.base == "MAP":
        return f"MAP<{spark_type(type_.params[0])},{spark_type(type_.params[1])}>"
    if type_.base == "STRUCT":
        return "STRUCT<" + ",".join(f"{quote_identifier(n)}:{spark_type(t)}" for n, t in type_.params) + ">"
    return _SPARK_TYPES.get(type_.base, type_.base)


def to_spark(expr: ast.Expr, scope: Scope) -> str:
    """Compile a checked scalar expression over ``scope``'s columns to Spark SQL text."""
    def sub(e: ast.Expr) -> str:
        return to_spark(e, scope)

    if isinstance(expr, ast.Literal):
        return _typed_literal(expr)
    if isinstance(expr, ast.ColumnRef):
        return quote_identifier(expr.name)
    if isinstance(expr, ast.Subscript):
        # try_element_at: 1-based for arrays, by key for maps, NULL when absent (as ksqlDB).
        return f"try_element_at({sub(expr.operand)}, {sub(expr.index)})"
    if isinstance(expr, ast.Dereference):
        return f"{sub(expr.operand)}.{quote_identifier(expr.field)}"
    if isinstance(expr, ast.Binary):
        if expr.op == "LIKE":
            return likes.in_spark(sub(expr.left), expr.right, sub(expr.right), spark_literal)
        if expr.op == "/" and all(check(e, scope).base in INTEGRAL for e in (expr.left, expr.right)):
            return f"CAST(({sub(expr.left)} DIV {sub(expr.right)}) AS {spark_type(check(expr, scope))})"
        return f"({sub(expr.left)} {expr.op} {sub(expr.right)})"
    if isinstance(expr, ast.Unary):
        return f"({expr.op} {sub(expr.operand)})"
    if isinstance(expr, ast.IsNull):
        return f"({sub(expr.operand)} IS {'NOT ' if expr.negated else ''}NULL)"
    if isinstance(expr, ast.Between):
        neg = "NOT " if expr.negated else ""
        return f"({sub(expr.operand)} {neg}BETWEEN {sub(expr.low)} AND {sub(expr.high)})"
    if isinstance(expr, ast.InList):
        items = ", ".join(sub(i) for i in expr.items)
        return f"({sub(expr.operand)} {'NOT ' if expr.negated else ''}IN ({items}))"
    if isinstance(expr, ast.Cast):
        return f"CAST({sub(expr.operand)} AS {spark_type(expr.type)})"
    if isinstance(expr, ast.Case):
        whens = " ".join(f"WHEN {sub(c)} THEN {sub(v)}" for c, v in expr.whens)
        other = f" ELSE {sub(expr.otherwise)}" if expr.otherwise is not None else ""
        return f"(CASE {whens}{other} END)"
    if isinstance(expr, ast.ArrayOf):
        return f"array({', '.join(sub(i) for i in expr.items)})"
    if isinstance(expr, ast.MapOf):
        # Spark's map() fails its batch on a NULL key: the entry is left out, as a Python dict
        # of the entries leaves it (a key given twice keeps its last value, ``mapKeyDedupPolicy``).
        entries = ", ".join(f"named_struct('k', {sub(k)}, 'v', {sub(v)})" for k, v in expr.entries)
        return f"map_from_entries(filter(array({entries}), {_ENTRY} -> {_ENTRY}.k IS NOT NULL))"
    if isinstance(expr, ast.StructOf):
        return f"named_struct({', '.join(f'{spark_literal(name)}, {sub(v)}' for name, v in expr.fields)})"
    if isinstance(expr, ast.LambdaVar):
        return scope.variable(expr)[1]
    if isinstance(expr, ast.Call) and expr.name in LAMBDA_FUNCTIONS:
        return _lambda_in_spark(expr, scope)
    if isinstance(expr, ast.Call):
        if aggregates.lookup(expr.name):
            raise StatementError(f"aggregate {expr.name} is not allowed here")
        fn = functions.lookup(expr.name)
        if fn is None:
            raise StatementError(f"unknown function {expr.name}")
        if fn.spark_of is not None and fn.typed:
            types = expr.arg_types or tuple(check(a, scope) for a in expr.args)
            return fn.spark_of([sub(a) for a in expr.args], list(types))
        if fn.spark_of is not None:
            return fn.spark_of([sub(a) for a in expr.args])
        return f"{fn.spark}({', '.join(sub(a) for a in expr.args)})"
    raise StatementError(f"unsupported expression {ast.to_sql(expr)}")


_ENTRY = "millpond_entry"
"""The lambda variable of a MAP(...)'s entries in Spark SQL (no column is read inside its lambda)."""


def _lambda_in_spark(call: ast.Call, scope: Scope) -> str:
    """Spark SQL for TRANSFORM, FILTER and REDUCE (``lambda_call``): its higher-order functions;
    over a MAP's entries (its ``map_entries``) for REDUCE and TRANSFORM, whose entries with a NULL
    key are dropped (Spark's map_from_entries fails on one) and whose last value of a key made
    twice is kept (the session's ``mapKeyDedupPolicy``); REDUCE's NULL initial state NULL and NULL
    collection its initial state, as ksqlDB's."""
    typed = lambda_call(call, scope)
    count = len(typed.bodies)
    args, fns = call.args[:-count], [cast(ast.Lambda, f) for f in call.args[-count:]]
    collection = to_spark(args[0], scope)
    names = typed.spark_params
    if len(names) < len(fns[0].params):  # over the MAP's entries: k and v an entry's fields
        collection = f"map_entries({collection})"
    params = names[0] if len(names) == 1 else f"({', '.join(names)})"
    values = [to_spark(f.body, body) for f, body in zip(fns, typed.bodies, strict=True)]
    if call.name == "TRANSFORM" and count == 2:
        entries = f"transform({collection}, {params} -> struct({values[0]} AS key, {values[1]} AS value))"
        return f"map_from_entries(filter({entries}, {params} -> {params}.key IS NOT NULL))"
    if call.name == "TRANSFORM":
        return f"transform({collection}, {params} -> {values[0]})"
    if call.name == "FILTER":
        return f"{'map_filter' if typed.result.base == 'MAP' else 'filter'}({collection}, {params} -> {values[0]})"
    assert typed.state is not None
    initial, state, value = to_spark(args[1], scope), spark_type(typed.state), values[0]
    if check(args[1], scope) != typed.state:  # (``with_widths`` has cast both already)
        initial = f"CAST({initial} AS {state})"
    if check(fns[0].body, typed.bodies[0]) != typed.state:
        value = f"CAST({value} AS {state})"
    return (f"(CASE WHEN {initial} IS NULL THEN NULL WHEN {to_spark(args[0], scope)} IS NULL THEN {initial} "
            f"ELSE aggregate({collection}, {initial}, {params} -> {value}) END)")


def _lambda_call(call: ast.Call, row: Mapping[str, Any]) -> Any:
    """TRANSFORM, FILTER and REDUCE over one row, as ``_lambda_in_spark``'s Spark SQL: FILTER keeps
    what its lambda gives TRUE for (not NULL); TRANSFORM of a MAP drops a NULL key and keeps the
    last value of a key made twice, where the key was first made."""
    lambdas = [a for a in call.args if isinstance(a, ast.Lambda)]

    def apply(fn: ast.Lambda, *values: Any) -> Any:
        bound = {(LAMBDA_VARIABLE, name): value for name, value in zip(fn.params, values, strict=True)}
        return evaluate(fn.body, ChainMap(bound, row))  # type: ignore[arg-type]

    fn = lambdas[-1]
    collection = evaluate(call.args[0], row)
    if call.name == "REDUCE":
        state = evaluate(call.args[1], row)
        if state is None or collection is None:
            return state
        for item in collection.items() if isinstance(collection, dict) else collection:
            state = apply(fn, state, *item) if isinstance(collection, dict) else apply(fn, state, item)
        return state
    if collection is None:
        return None
    if call.name == "TRANSFORM" and isinstance(collection, dict):
        made: dict[Any, Any] = {}
        for k, v in collection.items():
            if (key := apply(lambdas[0], k, v)) is not None:
                made[key] = apply(fn, k, v)
        return made
    if call.name == "TRANSFORM":
        return [apply(fn, item) for item in collection]
    if isinstance(collection, dict):
        return {k: v for k, v in collection.items() if apply(fn, k, v) is True}
    return [item for item in collection if apply(fn, item) is True]


LAMBDA_VARIABLE = "lambda"
"""A lambda parameter's value in the row ``evaluate`` is given: under (LAMBDA_VARIABLE, name),
where no column's name can be."""


def _divide(a: Any, b: Any) -> Any:
    if b == 0:
        return None  # ksqlDB and Spark (non-ANSI) give NULL, not an error
    if isinstance(a, int) and isinstance(b, int):
        quotient = abs(a) // abs(b)  # truncates toward zero, as Java and Spark's DIV
        return quotient if (a >= 0) == (b >= 0) else -quotient
    return a / b


def _remainder(a: Any, b: Any) -> Any:
    if b == 0:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return a - b * _divide(a, b)  # the sign follows the dividend, as in Java
    if math.isinf(a):
        return math.nan  # as Java and Spark (fmod raises)
    return math.fmod(a, b)


def _subscript(container: Any, index: Any) -> Any:
    if isinstance(container, dict):
        return container.get(index)
    if isinstance(container, list) and isinstance(index, int) and index != 0 and abs(index) <= len(container):
        return container[index - 1] if index > 0 else container[index]
    return None


def _saturated(number: Any, bits: int) -> int:
    """A number as Java's cast of a double to a ``bits`` wide integer has it: NaN is 0, and
    past the range, its nearest bound."""
    if isinstance(number, float) and math.isnan(number):
        return 0
    half = 1 << (bits - 1)
    return -half if number < -half else half - 1 if number >= half else int(number)


def _wrapped(number: Any, bits: int) -> Any:
    """An integer result of ``bits`` wide arithmetic, wrapped as Java's (and Spark's, outside
    ANSI mode) is: 2^63 as a BIGINT is -2^63."""
    if type(number) is not int:
        return number
    half = 1 << (bits - 1)
    return (number + half) % (1 << bits) - half


_EQUAL = spark_compare(operator.eq)
_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": _divide, "%": _remainder, "=": _EQUAL, "!=": spark_compare(operator.ne),
    "<": spark_compare(operator.lt), "<=": spark_compare(operator.le), ">": spark_compare(operator.gt),
    ">=": spark_compare(operator.ge), "LIKE": likes.like,
}
_AT_MOST = _BINARY["<="]


def evaluate(expr: ast.Expr, row: Mapping[str, Any]) -> Any:
    """Evaluate a scalar expression over one row (SQL three-valued logic for NULL)."""
    if isinstance(expr, ast.Literal):
        return expr.value
    if isinstance(expr, ast.ColumnRef):
        if expr.name not in row:
            raise StatementError(f"unknown column {expr.name}; columns are {', '.join(row)}")
        return row[expr.name]
    if isinstance(expr, ast.Subscript):
        container, index = evaluate(expr.operand, row), evaluate(expr.index, row)
        return None if container is None or index is None else _subscript(container, index)
    if isinstance(expr, ast.Dereference):
        struct = evaluate(expr.operand, row)
        return struct.get(expr.field) if isinstance(struct, dict) else None
    if isinstance(expr, ast.Binary):
        left = evaluate(expr.left, row)
        if expr.op == "AND":
            right = evaluate(expr.right, row)
            if left is False or right is False:
                return False
            return None if left is None or right is None else True
        if expr.op == "OR":
            right = evaluate(expr.right, row)
            if left is True or right is True:
                return True
            return None if left is None or right is None else False
        right = evaluate(expr.right, row)
        if left is None or right is None:
            return None
        if expr.decimal:
            return _decimal_arithmetic(expr.op, left, right, expr.decimal)
        result = _BINARY[expr.op](left, right)
        return _wrapped(result, expr.bits) if expr.bits else result
    if isinstance(expr, ast.Unary):
        value = evaluate(expr.operand, row)
        if value is None:
            return None
        return (not value) if expr.op == "NOT" else _wrapped(-value, expr.bits) if expr.bits else -value
    if isinstance(expr, ast.IsNull):
        return (evaluate(expr.operand, row) is None) != expr.negated
    if isinstance(expr, ast.Between):  # Spark's: low <= v AND v <= high, three-valued, then NOT
        v, lo, hi = (evaluate(e, row) for e in (expr.operand, expr.low, expr.high))
        above = None if v is None or lo is None else _AT_MOST(lo, v)
        below = None if v is None or hi is None else _AT_MOST(v, hi)
        within = False if above is False or below is False else None if above is None or below is None else True
        return within if within is None else within != expr.negated
    if isinstance(expr, ast.InList):  # SQL's: no match with a NULL item is NULL, not false
        v = evaluate(expr.operand, row)
        if v is None:
            return None
        items = [evaluate(i, row) for i in expr.items]
        found = True if any(i is not None and _EQUAL(i, v) for i in items) else None if None in items else False
        return found if found is None else found != expr.negated
    if isinstance(expr, ast.Case):
        for cond, value in expr.whens:
            if evaluate(cond, row) is True:
                return evaluate(value, row)
        return evaluate(expr.otherwise, row) if expr.otherwise is not None else None
    if isinstance(expr, ast.ArrayOf):
        return [evaluate(i, row) for i in expr.items]
    if isinstance(expr, ast.MapOf):  # a NULL key's entry left out, a key given twice keeping its last value: as in Spark
        entries = ((evaluate(k, row), v) for k, v in expr.entries)
        return {key: evaluate(v, row) for key, v in entries if key is not None}
    if isinstance(expr, ast.StructOf):
        return {name: evaluate(v, row) for name, v in expr.fields}
    if isinstance(expr, ast.Cast):
        value = evaluate(expr.operand, row)
        if expr.scale >= 0 and value is not None and expr.type.base in kinds.INTEGRAL:
            # A DECIMAL's whole part, its low bits, as Spark's ``Decimal.toInt`` and ``toLong`` (a
            # DOUBLE's saturates): 10^12 as an INT is -727379968.
            return _wrapped(math.trunc(value), 32 if expr.type.base == "INT" else 64)
        if expr.scale >= 0 and value is not None:  # a DECIMAL's text: its scale's digits, as Java's BigDecimal writes it
            exact = kinds.fitted_decimal(value, kinds.MAX_DECIMAL_DIGITS + expr.scale, expr.scale)
            return None if exact is None else kinds.java_decimal_text(exact)
        return _cast(value, expr.type)
    if isinstance(expr, ast.LambdaVar):
        return row[(LAMBDA_VARIABLE, expr.name)]  # type: ignore[index]
    if isinstance(expr, ast.Call) and expr.name in LAMBDA_FUNCTIONS:
        return _lambda_call(expr, row)
    if isinstance(expr, ast.Call):
        fn = functions.lookup(expr.name)
        if fn is None:
            raise StatementError(f"function {expr.name} is not supported here")
        args = [evaluate(a, row) for a in expr.args]
        if expr.name in functions.TAKES_INT:  # a BIGINT argument cast to Spark's INT parameter: its low bits
            args = [_wrapped(a, 32) if isinstance(a, int) and fn.kind_at(i) in ("integer", "code") else a
                    for i, a in enumerate(args)]
        try:
            if fn.typed and len(expr.arg_types) != len(args):
                raise AssertionError(f"{expr.name} was not typed (types.with_widths) before it was evaluated")
            result = fn.python(*args, *expr.arg_types) if fn.typed else fn.python(*args)
            if expr.decimal:
                return _decimal(result, expr.decimal)
            if not expr.bits or result is None:
                return result
            return _saturated(result, expr.bits) if expr.name in functions.SATURATING else _wrapped(result, expr.bits)
        except StatementError:  # a REGEXP call out of time: the pull fails with it
            raise
        except (ArithmeticError, ValueError):  # FLOOR of Infinity, ROUND to 10^5 places: NULL, as Spark outside ANSI mode
            return None
    raise StatementError(f"unsupported expression {expr!r}")


_INTEGER_TEXT = re.compile(r"([+-]?[0-9]*)(?:\.[0-9]*)?")
"""Text Spark's CAST reads as an integer (``UTF8String.toLong``): digits, a fraction it drops."""
_BOOLEAN_TEXT = {**dict.fromkeys(("t", "true", "y", "yes", "1"), True), **dict.fromkeys(("f", "false", "n", "no", "0"), False)}
"""Text Spark's CAST reads as a BOOLEAN (``StringUtils.isTrueString`` and ``isFalseString``)."""


def _decimal(number: Any, type_: tuple[int, int]) -> float | None:
    """A DECIMAL result as Spark's: rounded half up to its scale, NULL past its precision; kept
    as a float, as a table's stores keep a DECIMAL (``values.stored``)."""
    if number is None:
        return None
    exact = kinds.fitted_decimal(number, *type_)
    return None if exact is None else float(exact)


_DECIMAL_OPERATIONS: dict[str, Callable[[Decimal, Decimal], Decimal]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "%": operator.mod}


def _decimal_arithmetic(op: str, left: Any, right: Any, type_: tuple[int, int]) -> float | None:
    """DECIMAL arithmetic as Spark's: on the operands' exact values (a float's shortest digits),
    rounded half up to the result's scale (``_decimal``); by zero NULL. The sign of a remainder
    is the dividend's, as Java's BigDecimal's."""
    with localcontext(prec=80):
        a, b = (Decimal(repr(v)) if isinstance(v, float) else Decimal(v) for v in (left, right))
        if op in ("/", "%") and b.is_zero():
            return None
        return _decimal(_DECIMAL_OPERATIONS[op](a, b), type_)


def _cast(value: Any, type_: ast.SqlType) -> Any:
    """CAST as Spark does it outside ANSI mode: a value that does not convert becomes NULL."""
    if value is None:
        return None
    base = type_.base
    try:
        if base == "VARCHAR":
            if isinstance(value, bool):
                return "true" if value else "false"
            return java_double_text(value) if isinstance(value, float) else str(value)
        if base in ("INT", "BIGINT"):
            bits = 32 if base == "INT" else 64
            if isinstance(value, str):  # Spark's reading: digits (a fraction truncated), else or past the range NULL
                text = value.strip()
                read = _INTEGER_TEXT.fullmatch(text)
                if read is None or not any(c.isdigit() for c in text):
                    return None
                number = int(read[1]) if read[1].lstrip("+-") else 0  # ".5": no whole digits, 0
                return number if -(2 ** (bits - 1)) <= number < 2 ** (bits - 1) else None
            if isinstance(value, float):  # Java's (int) or (long) of a double: truncated, saturated, NaN 0
                return _saturated(value if math.isnan(value) or math.isinf(value) else math.trunc(value), bits)
            return _wrapped(int(value), bits)  # a narrower integer: its low bits, as Java's
        if base == "DECIMAL":
            if isinstance(value, str):  # Spark's reading of text (Java's BigDecimal): the number, else NULL
                if kinds.DECIMAL_TEXT.fullmatch(value.strip()) is None:
                    return None
                value = Decimal(value.strip())
            return _decimal(value, type_.params)
        if base == "DOUBLE":
            return float(value)
        if base == "BOOLEAN":
            if isinstance(value, str):
                return _BOOLEAN_TEXT.get(value.strip().lower())
            return bool(value)
    except (TypeError, ValueError, ArithmeticError):
        return None
    return value


def output_name(item: ast.SelectItem, index: int) -> str:
    """The result column name of a projection: its alias, its column, or KSQL_COL_<i>."""
    if item.alias:
        return item.alias
    if isinstance(item.expr, ast.ColumnRef):
        return item.expr.name
    return f"KSQL_COL_{index}"
