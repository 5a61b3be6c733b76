"""Expressions: compiled to Spark SQL for the workers, evaluated in Python for pull queries,
and typed against a schema."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from shared.errors import StatementError
from shared.sql import aggregates, ast

# ksqlDB scalar functions and their Spark SQL names.
_SPARK_FUNCTIONS = {
    "UCASE": "upper", "LCASE": "lower", "LEN": "length", "SUBSTRING": "substring",
    "CONCAT": "concat", "TRIM": "trim", "LTRIM": "ltrim", "RTRIM": "rtrim", "ABS": "abs",
    "ROUND": "round", "FLOOR": "floor", "CEIL": "ceil", "COALESCE": "coalesce",
    "IFNULL": "ifnull", "SQRT": "sqrt", "EXP": "exp", "LN": "ln", "SIGN": "sign",
    "REPLACE": "replace", "INSTR": "instr", "LPAD": "lpad", "RPAD": "rpad",
}

_PY_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "UCASE": lambda s: None if s is None else str(s).upper(),
    "LCASE": lambda s: None if s is None else str(s).lower(),
    "LEN": lambda s: None if s is None else len(s),
    "SUBSTRING": lambda s, pos, n=None: None if s is None else (s[pos - 1:] if n is None else s[pos - 1:pos - 1 + n]),
    "CONCAT": lambda *a: None if any(x is None for x in a) else "".join(str(x) for x in a),
    "TRIM": lambda s: None if s is None else s.strip(),
    "LTRIM": lambda s: None if s is None else s.lstrip(),
    "RTRIM": lambda s: None if s is None else s.rstrip(),
    "ABS": lambda x: None if x is None else abs(x),
    "ROUND": lambda x, d=0: None if x is None else round(x, d),
    "FLOOR": lambda x: None if x is None else math.floor(x),
    "CEIL": lambda x: None if x is None else math.ceil(x),
    "COALESCE": lambda *a: next((x for x in a if x is not None), None),
    "IFNULL": lambda x, y: y if x is None else x,
    "SQRT": lambda x: None if x is None else math.sqrt(x),
}

_STRING_RESULT = {"UCASE", "LCASE", "SUBSTRING", "CONCAT", "TRIM", "LTRIM", "RTRIM", "REPLACE", "LPAD", "RPAD"}
_INT_RESULT = {"LEN", "INSTR"}


def quote_identifier(name: str) -> str:
    """A column name as a Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def _spark_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    escaped = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


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


def to_spark(expr: ast.Expr) -> str:
    """Compile a scalar expression to Spark SQL text."""
    if isinstance(expr, ast.Literal):
        return _spark_literal(expr.value)
    if isinstance(expr, ast.ColumnRef):
        return quote_identifier(expr.name)
    if isinstance(expr, ast.Binary):
        op = {"=": "=", "!=": "!="}.get(expr.op, expr.op)
        return f"({to_spark(expr.left)} {op} {to_spark(expr.right)})"
    if isinstance(expr, ast.Unary):
        return f"({expr.op} {to_spark(expr.operand)})"
    if isinstance(expr, ast.IsNull):
        return f"({to_spark(expr.operand)} IS {'NOT ' if expr.negated else ''}NULL)"
    if isinstance(expr, ast.Between):
        neg = "NOT " if expr.negated else ""
        return f"({to_spark(expr.operand)} {neg}BETWEEN {to_spark(expr.low)} AND {to_spark(expr.high)})"
    if isinstance(expr, ast.InList):
        items = ", ".join(to_spark(i) for i in expr.items)
        return f"({to_spark(expr.operand)} {'NOT ' if expr.negated else ''}IN ({items}))"
    if isinstance(expr, ast.Cast):
        return f"CAST({to_spark(expr.operand)} AS {spark_type(expr.type)})"
    if isinstance(expr, ast.Case):
        whens = " ".join(f"WHEN {to_spark(c)} THEN {to_spark(v)}" for c, v in expr.whens)
        other = f" ELSE {to_spark(expr.otherwise)}" if expr.otherwise is not None else ""
        return f"(CASE {whens}{other} END)"
    if isinstance(expr, ast.Call):
        if aggregates.lookup(expr.name):
            raise StatementError(f"aggregate {expr.name} is not allowed here")
        fn = _SPARK_FUNCTIONS.get(expr.name)
        if fn is None:
            raise StatementError(f"unknown function {expr.name}")
        return f"{fn}({', '.join(to_spark(a) for a in expr.args)})"
    raise StatementError(f"unsupported expression {expr!r}")


def _like(value: Any, pattern: Any) -> bool | None:
    if value is None or pattern is None:
        return None
    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.DOTALL) is not None


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: (a // b if isinstance(a, int) and isinstance(b, int) else a / b),
    "%": lambda a, b: a % b, "=": lambda a, b: a == b, "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "LIKE": _like,
}


def evaluate(expr: ast.Expr, row: Mapping[str, Any]) -> Any:
    """Evaluate a scalar expression over one row (SQL three-valued logic for NULL)."""
    if isinstance(expr, ast.Literal):
        return expr.value
    if isinstance(expr, ast.ColumnRef):
        if expr.name not in row:
            raise StatementError(f"unknown column {expr.name}; columns are {', '.join(row)}")
        return row[expr.name]
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
        return _BINARY[expr.op](left, right)
    if isinstance(expr, ast.Unary):
        value = evaluate(expr.operand, row)
        if value is None:
            return None
        return (not value) if expr.op == "NOT" else -value
    if isinstance(expr, ast.IsNull):
        return (evaluate(expr.operand, row) is None) != expr.negated
    if isinstance(expr, ast.Between):
        v, lo, hi = (evaluate(e, row) for e in (expr.operand, expr.low, expr.high))
        if v is None or lo is None or hi is None:
            return None
        return (lo <= v <= hi) != expr.negated
    if isinstance(expr, ast.InList):
        v = evaluate(expr.operand, row)
        if v is None:
            return None
        return (v in [evaluate(i, row) for i in expr.items]) != expr.negated
    if isinstance(expr, ast.Case):
        for cond, value in expr.whens:
            if evaluate(cond, row) is True:
                return evaluate(value, row)
        return evaluate(expr.otherwise, row) if expr.otherwise is not None else None
    if isinstance(expr, ast.Cast):
        v = evaluate(expr.operand, row)
        casts: dict[str, Callable[[Any], Any]] = {"VARCHAR": str, "INT": int, "BIGINT": int,
                                                  "DOUBLE": float, "BOOLEAN": bool}
        return None if v is None else casts.get(expr.type.base, lambda x: x)(v)
    if isinstance(expr, ast.Call):
        fn = _PY_FUNCTIONS.get(expr.name)
        if fn is None:
            raise StatementError(f"function {expr.name} is not supported in pull queries")
        return fn(*(evaluate(a, row) for a in expr.args))
    raise StatementError(f"unsupported expression {expr!r}")


def infer_type(expr: ast.Expr, schema: Mapping[str, ast.SqlType]) -> ast.SqlType:
    """The SQL type of ``expr`` over columns typed by ``schema``."""
    if isinstance(expr, ast.Literal):
        return expr.type
    if isinstance(expr, ast.ColumnRef):
        if expr.name not in schema:
            raise StatementError(f"unknown column {expr.name}; columns are {', '.join(schema)}",
                                 kind=None)
        return schema[expr.name]
    if isinstance(expr, ast.Call):
        agg = aggregates.lookup(expr.name)
        if agg is not None:
            arg = infer_type(expr.args[0], schema) if expr.args else ast.SqlType("BIGINT")
            return agg.result_type(arg)
        if expr.name in _STRING_RESULT:
            return ast.SqlType("VARCHAR")
        if expr.name in _INT_RESULT:
            return ast.SqlType("INT")
        return infer_type(expr.args[0], schema) if expr.args else ast.SqlType("VARCHAR")
    if isinstance(expr, ast.Binary):
        if expr.op in {"+", "-", "*", "/", "%"}:
            types = {infer_type(expr.left, schema).base, infer_type(expr.right, schema).base}
            if "DOUBLE" in types:
                return ast.SqlType("DOUBLE")
            return ast.SqlType("BIGINT" if "BIGINT" in types else "INT")
        return ast.SqlType("BOOLEAN")
    if isinstance(expr, ast.Unary) and expr.op == "-":
        return infer_type(expr.operand, schema)
    if isinstance(expr, ast.Cast):
        return expr.type
    if isinstance(expr, ast.Case):
        return infer_type(expr.whens[0][1], schema)
    return ast.SqlType("BOOLEAN")


def output_name(item: ast.SelectItem, index: int) -> str:
    """The result column name of a projection: its alias, its column, or KSQL_COL_<i>."""
    if item.alias:
        return item.alias
    if isinstance(item.expr, ast.ColumnRef):
        return item.expr.name
    return f"KSQL_COL_{index}"
