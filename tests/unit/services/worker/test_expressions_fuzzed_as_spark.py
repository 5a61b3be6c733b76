"""Random well-typed expressions, evaluated by Spark (as a persistent query compiles them) and
by Python (as pulls, pushes, joins and HAVING evaluate them) over rows of edge values: the
types the checker gives must be Spark's, and every value Spark's. Seeded, so a failure is
replayed by its seed; each expression that differed once is a case in
``test_expressions_as_spark.py``."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import SparkSession

from millpond.shared.sql import ast
from millpond.shared.sql.expressions import evaluate, to_spark
from millpond.shared.sql.functions import OF_A_DOUBLE
from millpond.shared.sql.parser import parse_statement
from millpond.shared.sql.types import Scope, check, with_widths

COLUMNS = {"I": ast.SqlType("INT"), "J": ast.SqlType("INT"), "B": ast.SqlType("BIGINT"), "D": ast.SqlType("DOUBLE"),
           "E": ast.SqlType("DOUBLE"), "M": ast.SqlType("DECIMAL", (6, 2)), "S": ast.SqlType("VARCHAR"),
           "T": ast.SqlType("VARCHAR"), "F": ast.SqlType("BOOLEAN")}
SCOPE = Scope("T", COLUMNS)
ROWS = [
    {"I": 3, "J": -7, "B": 10**12, "D": 2.5, "E": -0.0, "M": 12.34, "S": "ab", "T": " x1 ", "F": True},
    {"I": 2**31 - 1, "J": 0, "B": -(2**63), "D": math.nan, "E": math.inf, "M": -9999.99, "S": "", "T": "12", "F": False},
    dict.fromkeys(COLUMNS),
    {"I": -(2**31), "J": 1, "B": 2**63 - 1, "D": 1e20, "E": 1.5e-7, "M": 0.01, "S": "a%b_c", "T": "true", "F": True},
    {"I": 0, "J": -1, "B": 7, "D": -3.75, "E": 0.1, "M": 0.0, "S": "Hello World", "T": "-4.5", "F": False},
]
LEAVES = {
    "INT": ["I", "J", "0", "1", "-1", "7", "2147483647", "-2147483648"],
    "BIGINT": ["B", "9223372036854775807", "10000000000", "-5000000000"],
    "DOUBLE": ["D", "E", "2.5E0", "-1.0E0", "0.0E0", "1.0E300", "3.0E-5", "PI()"],
    "DECIMAL": ["M", "1.5", "0.01", "-2.25", "100.0", "0.0000001", "CAST(7 AS DECIMAL(6, 2))"],
    "VARCHAR": ["S", "T", "'ab'", "''", "' x '", "'%'", "'12'", "'true'", "'3.7'", "'hELLO wORLD'"],
    "BOOLEAN": ["F", "TRUE", "FALSE"],
}
NUMBERS = ["INT", "BIGINT", "DOUBLE", "DECIMAL"]


class Expressions:
    """Random SQL text of a given type, from the forms of the dialect that type can take."""

    def __init__(self, seed: int):
        self.draw = random.Random(seed)
        self.forms = _forms(self.pick)

    def of(self, type_: str, depth: int) -> str:
        if depth <= 0 or self.draw.random() < 0.25:
            return self.draw.choice(LEAVES[type_])
        return self.draw.choice(self.forms[type_])(lambda t: self.of(self.draw.choice(NUMBERS) if t == "NUMBER" else t, depth - 1))

    def pick(self, *options: str) -> str:
        return self.draw.choice(options)


ARITHMETIC = ("+", "-", "*", "/", "%")
TIME_PATTERNS = ("'yyyy-MM-dd HH:mm:ss.SSS'", "'yyyy-MM-dd'", "'d/M/yy h:mm a'", "'yyyyMMddHHmmss'")
TIME_ZONES = (", 'America/New_York'", ", '+05:30'", ", 'UTC'")
MASKED_ENDS = ("MASK_LEFT", "MASK_RIGHT", "MASK_KEEP_LEFT", "MASK_KEEP_RIGHT")
JAVA_PATTERNS = ("'a.'", "'[0-9]+$'", "'(?i)x*'", "'\\s|\\W'", "''")
Form = Callable[[Callable[[str], str]], str]
"""An expression's text around its operands' (``x(type)`` gives one of that type, "NUMBER" any number)."""


def _forms(draw: Callable[..., str]) -> dict[str, list[Form]]:
    return {
        "INT": [
            lambda x: f"({x('INT')} {draw(*ARITHMETIC)} {x('INT')})", lambda x: f"(- {x('INT')})", lambda x: f"ABS({x('INT')})",
            lambda x: f"LEN({x('VARCHAR')})", lambda x: f"INSTR({x('VARCHAR')}, {x('VARCHAR')})",
            lambda x: f"CAST({x(draw('BIGINT', 'DOUBLE', 'DECIMAL', 'VARCHAR', 'BOOLEAN'))} AS INT)",
            lambda x: f"CASE WHEN {x('BOOLEAN')} THEN {x('INT')} ELSE {x('INT')} END",
            lambda x: f"{draw('GREATEST', 'LEAST', 'COALESCE', 'IFNULL')}({x('INT')}, {x('INT')})",
            lambda x: f"ROUND({x('INT')}, {draw('-1', '0', '2')})",
            lambda x: f"REDUCE(SPLIT({x('VARCHAR')}, ''), {x('INT')}, (ls, lc) => ls * {x('INT')} + LEN(lc))",
        ],
        "BIGINT": [
            lambda x: f"({x('BIGINT')} {draw(*ARITHMETIC)} {x(draw('INT', 'BIGINT'))})",
            lambda x: f"{draw('FLOOR', 'CEIL')}({x('DOUBLE')})", lambda x: f"ABS({x('BIGINT')})",
            lambda x: f"CAST({x(draw('INT', 'DOUBLE', 'DECIMAL', 'VARCHAR'))} AS BIGINT)",
            lambda x: f"CASE WHEN {x('BOOLEAN')} THEN {x('BIGINT')} ELSE {x('INT')} END",
            lambda x: f"STRINGTOTIMESTAMP({x('VARCHAR')}, {draw(*TIME_PATTERNS)}{draw('', *TIME_ZONES)})",
            lambda x: f"UNIX_TIMESTAMP(FROM_UNIXTIME({x(draw('INT', 'BIGINT'))}))",
        ],
        "DOUBLE": [
            lambda x: f"({x('DOUBLE')} {draw(*ARITHMETIC)} {x('NUMBER')})",
            lambda x: f"{draw('SQRT', 'EXP', 'LN', 'SIGN')}({x('NUMBER')})",
            lambda x: f"{draw(*OF_A_DOUBLE)}({x('NUMBER')})", lambda x: f"{draw('POWER', 'ATAN2')}({x('NUMBER')}, {x('NUMBER')})",
            lambda x: f"ROUND({x('DOUBLE')}, {draw('-1', '0', '2')})", lambda x: f"ABS({x('DOUBLE')})",
            lambda x: f"CAST({x(draw('INT', 'BIGINT', 'DECIMAL', 'VARCHAR'))} AS DOUBLE)", lambda x: f"(- {x('DOUBLE')})",
            lambda x: f"{draw('GREATEST', 'LEAST', 'COALESCE')}({x('DOUBLE')}, {x('NUMBER')})",
            lambda x: f"CASE WHEN {x('BOOLEAN')} THEN {x('DOUBLE')} ELSE {x('NUMBER')} END",
        ],
        "DECIMAL": [
            lambda x: f"({x('DECIMAL')} {draw(*ARITHMETIC)} {x(draw('DECIMAL', 'INT'))})",
            lambda x: f"CAST({x(draw('INT', 'DOUBLE', 'VARCHAR', 'DECIMAL'))} AS DECIMAL({draw('6, 2', '10, 4', '3, 0', '38, 10')}))",
            lambda x: f"{draw('FLOOR', 'CEIL', 'ABS')}({x('DECIMAL')})", lambda x: f"(- {x('DECIMAL')})",
            lambda x: f"ROUND({x('DECIMAL')}, {draw('-1', '0', '1', '3')})",
            lambda x: f"{draw('GREATEST', 'LEAST', 'COALESCE')}({x('DECIMAL')}, {x(draw('DECIMAL', 'INT', 'BIGINT'))})",
        ],
        "VARCHAR": [
            lambda x: f"{draw('UCASE', 'LCASE', 'TRIM', 'LTRIM', 'RTRIM', 'INITCAP')}({x('VARCHAR')})",
            lambda x: f"CONCAT_WS({x('VARCHAR')}, {x('VARCHAR')}, {x('VARCHAR')})",
            lambda x: f"CONCAT({x('VARCHAR')}, {x('VARCHAR')})", lambda x: f"({x('VARCHAR')} || {x('VARCHAR')})",
            lambda x: f"SUBSTRING({x('VARCHAR')}, {x('INT')})", lambda x: f"SUBSTRING({x('VARCHAR')}, {x('INT')}, {x('INT')})",
            lambda x: f"REPLACE({x('VARCHAR')}, {x('VARCHAR')}, {x('VARCHAR')})",
            lambda x: f"{draw('LPAD', 'RPAD')}({x('VARCHAR')}, {draw('0', '3', '5', '-1')}, {x('VARCHAR')})",
            lambda x: f"CAST({x(draw('INT', 'BIGINT', 'DOUBLE', 'DECIMAL', 'BOOLEAN'))} AS VARCHAR)",
            lambda x: f"CASE WHEN {x('BOOLEAN')} THEN {x('VARCHAR')} END", lambda x: f"COALESCE({x('VARCHAR')}, {x('VARCHAR')})",
            lambda x: f"TIMESTAMPTOSTRING({x(draw('INT', 'BIGINT'))}, {draw(*TIME_PATTERNS)}{draw('', *TIME_ZONES)})",
            lambda x: f"{draw(*MASKED_ENDS)}({x('VARCHAR')}, {x(draw('INT', 'BIGINT'))})",
            lambda x: f"ARRAY_JOIN(SPLIT({x('VARCHAR')}, {x('VARCHAR')}), {x('VARCHAR')})",
            lambda x: f"ARRAY_JOIN(TRANSFORM(SPLIT({x('VARCHAR')}, 'a'), lp => CONCAT(lp, {x('VARCHAR')})), '|')",
            lambda x: f"REGEXP_REPLACE({x('VARCHAR')}, {draw(*JAVA_PATTERNS)}, '<$0>')",
            lambda x: f"COALESCE(REGEXP_EXTRACT({draw(*JAVA_PATTERNS)}, {x('VARCHAR')}), '-')",
            lambda x: f"ARRAY_JOIN(REGEXP_SPLIT_TO_ARRAY({x('VARCHAR')}, {draw(*JAVA_PATTERNS)}), '|')",
        ],
        "BOOLEAN": [
            lambda x: f"({x('NUMBER')} {draw('=', '!=', '<', '<=', '>', '>=')} {x('NUMBER')})",
            lambda x: f"({x('VARCHAR')} {draw('=', '!=', '<', '>=')} {x('VARCHAR')})",
            lambda x: f"({x('BOOLEAN')} {draw('AND', 'OR', '=', '<')} {x('BOOLEAN')})", lambda x: f"(NOT {x('BOOLEAN')})",
            lambda x: f"({x(draw('INT', 'VARCHAR', 'DOUBLE'))} IS {draw('', 'NOT ')}NULL)",
            lambda x: f"({x('VARCHAR')} LIKE {draw(*(chr(39) + p + chr(39) for p in ('%a%', 'a_', '_%', '%a%_b%')))})",
            lambda x: f"({x('VARCHAR')} LIKE {x('VARCHAR')})",  # a pattern made row by row (NULL if Spark cannot read it)
            lambda x: f"(ARRAY_LENGTH(FILTER(SPLIT({x('VARCHAR')}, ','), lp => lp > {x('VARCHAR')})) > {x('INT')})",
            lambda x: f"({x('NUMBER')} {draw('', 'NOT ')}BETWEEN {x('NUMBER')} AND {x('NUMBER')})",
            lambda x: f"({x('NUMBER')} {draw('', 'NOT ')}IN ({x('NUMBER')}, {x('NUMBER')}))",
            lambda x: f"CAST({x(draw('VARCHAR', 'INT'))} AS BOOLEAN)",
        ],
    }


def same(python: Any, spark: Any) -> bool:
    """Python's value is Spark's: of the same type (a DECIMAL is a float in Python, as a table's
    stores keep it), NaN equal to NaN, the sign of a zero too, and the last bit of EXP, LN and
    SQRT let go (Java's StrictMath against the C library)."""
    if isinstance(spark, Decimal):
        spark = float(spark)
    if python is None or spark is None or type(python) is not type(spark):
        return python is None and spark is None
    if isinstance(python, float):
        if math.isnan(python) or math.isnan(spark):
            return math.isnan(python) and math.isnan(spark)
        return (python == spark and math.copysign(1, python) == math.copysign(1, spark)) or \
            math.isclose(python, spark, rel_tol=1e-14)
    return bool(python == spark)


def spark_type_name(data_type: Any) -> str:
    return str(data_type.simpleString()).upper().replace("STRING", "VARCHAR").replace(",", ", ")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_expressions_have_sparks_types_and_values(spark: SparkSession, seed: int) -> None:
    generator = Expressions(seed)
    texts = [generator.of(generator.draw.choice(list(LEAVES)), generator.draw.randint(1, 3)) for _ in range(300)]
    exprs = []
    for text in texts:
        query = parse_statement(f"SELECT {text} AS X FROM T;")
        assert isinstance(query, ast.Query)
        assert query.items[0].expr is not None
        exprs.append(with_widths(query.items[0].expr, SCOPE))
    frame = spark.createDataFrame(
        [tuple(Decimal(repr(row["M"])) if name == "M" and row["M"] is not None else row[name] for name in COLUMNS) for row in ROWS],
        "I INT, J INT, B BIGINT, D DOUBLE, E DOUBLE, M DECIMAL(6, 2), S STRING, T STRING, F BOOLEAN",
    ).selectExpr(*(f"{to_spark(e, SCOPE)} AS c{i}" for i, e in enumerate(exprs)))
    types = {text: str(check(e, SCOPE)) for text, e in zip(texts, exprs, strict=True)}
    assert types == {text: spark_type_name(f.dataType) for text, f in zip(texts, frame.schema.fields, strict=True)}
    differing = [(text, index, evaluate(e, row), spark_row[i])
                 for index, (row, spark_row) in enumerate(zip(ROWS, frame.collect(), strict=True))
                 for i, (text, e) in enumerate(zip(texts, exprs, strict=True)) if not same(evaluate(e, row), spark_row[i])]
    assert differing == []
