"""The router's Python evaluation (pulls, pushes) and a worker's (HAVING, joins) answer as
the Spark SQL that persistent queries compile the same expression to: LIKE with its wildcards
and escapes, padding, and functions that overflow."""

from __future__ import annotations

import datetime
import json
import math
import random
import re
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from pyspark.sql import Row, SparkSession

from millpond.services.worker import query_runner
from millpond.shared.errors import MillpondError, StatementError
from millpond.shared.sql import aggregates, ast
from millpond.shared.sql.arrays import cube, cube_in_spark, cubed_items
from millpond.shared.sql.expressions import evaluate, quote_identifier, spark_type, to_spark
from millpond.shared.sql.parser import parse_statement
from millpond.shared.sql.regexes import PatternTimeout, java_pattern
from millpond.shared.sql.types import Scope, check, with_widths
from tests.unit.services.worker.test_expressions_fuzzed_as_spark import same, spark_type_name

NO_COLUMNS = Scope("T", {})


def expression(text: str) -> ast.Expr:
    query = parse_statement(f"SELECT {text} AS X FROM T;")
    assert isinstance(query, ast.Query)
    return query.items[0].expr


def as_spark(spark: SparkSession, exprs: list[ast.Expr]) -> list[Any]:
    """Each expression's value in one Spark query."""
    row = spark.sql("SELECT " + ", ".join(f"{to_spark(e, NO_COLUMNS)} AS c{i}" for i, e in enumerate(exprs))).collect()[0]
    return list(row)


def like(value: str, pattern: str) -> ast.Expr:
    return ast.Binary("LIKE", ast.Literal(value, ast.SqlType("VARCHAR")), ast.Literal(pattern, ast.SqlType("VARCHAR")))


LIKE_CASES = [("a%b", "a\\%b"), ("axb", "a\\%b"), ("a_b", "a\\_b"), ("axb", "a\\_b"), ("a\\b", "a\\\\b"),
              ("a\\b", "a_b"), ("", "%"), ("", "_"), ("ab", "%%b"), ("a\nb", "a_b"), ("a\nb", "a%"),
              ("abcabc", "%bc%bc"), ("abc", "%bc%bc"), ("a.c", "a.c"), ("abc", "a.c"), ("a(b)*", "%(b)*"),
              ("x$y^z", "%$_^%"), ("a😀b", "a_b"), ("😀", "__"), ("a%b", "%\\%%"), ("\\%", "\\\\\\%"),
              ("ab", "a%b%"), ("ab", "%a%b%"), ("", ""), ("abab", "a%b"), ("abab", "%a%")]
BACKTRACKING = [("x" * 30, "%" * 10 + "y"), ("a" * 3000, "%a%a%a%a%a%a%a%a%a%y"), ("ab" * 1000, "%a_%b_%a_%b_%c")]
"""Rows on which Spark's own LIKE backtracks without end (its regex: one .* per %)."""


def test_like_answers_as_sparks_like_in_linear_time(spark: SparkSession) -> None:
    # Spark's own LIKE of a pattern column gives the values; Millpond's Spark form (a pattern
    # column's, and a literal's) and Python give the same, and as fast on the backtracking rows.
    draw = random.Random(7)
    pairs = [*LIKE_CASES, *((_text(draw, "ab%_\\", 6), _text(draw, "ab%_", 5)) for _ in range(500))]
    sparks = [row[0] for row in spark.createDataFrame(pairs, "v STRING, p STRING").selectExpr("v LIKE p").collect()]
    columns = Scope("T", {"V": ast.SqlType("VARCHAR"), "P": ast.SqlType("VARCHAR")})
    by_column = with_widths(expression("v LIKE p"), columns)
    pairs += BACKTRACKING
    ours = spark.createDataFrame(pairs, "V STRING, P STRING").selectExpr(to_spark(by_column, columns)).collect()
    pythons = [evaluate(by_column, {"V": v, "P": p}) for v, p in pairs]
    assert pythons == [row[0] for row in ours] == [*sparks, False, False, False]
    literals = [like(v, p) for v, p in pairs[:len(LIKE_CASES)] + BACKTRACKING]
    assert as_spark(spark, literals) == [evaluate(e, {}) for e in literals] == [*sparks[:len(LIKE_CASES)], False, False, False]


def _text(draw: random.Random, alphabet: str, most: int) -> str:
    return "".join(draw.choice(alphabet) for _ in range(draw.randint(0, most)))


@pytest.mark.parametrize("pattern", ["a\\", "a\\x", "\\a%"])
def test_a_like_pattern_that_spark_cannot_read_is_refused_or_null(spark: SparkSession, pattern: str) -> None:
    # Spark's own LIKE fails the batch on it: written as text the statement is refused, from a
    # column it is NULL (in Spark and in Python), not a batch that fails again at every retry.
    with pytest.raises(StatementError, match="escapes only"):
        check(like("a", pattern), NO_COLUMNS)
    with pytest.raises(Exception, match=r"(?i)escape"):
        spark.createDataFrame([("a", pattern)], "v STRING, p STRING").selectExpr("v LIKE p").collect()
    columns = Scope("T", {"V": ast.SqlType("VARCHAR"), "P": ast.SqlType("VARCHAR")})
    by_column = with_widths(expression("v LIKE p"), columns)
    assert spark.createDataFrame([("a", pattern)], "V STRING, P STRING").selectExpr(
        to_spark(by_column, columns)).collect()[0][0] is None
    assert evaluate(by_column, {"V": "a", "P": pattern}) is None


def test_padding_and_overflowing_functions_answer_as_spark(spark: SparkSession) -> None:
    texts = ["LPAD('ab', 7, 'xyz')", "RPAD('ab', 7, 'xyz')", "LPAD('abc', 2, 'x')", "LPAD('abc', -1, 'x')",
             "LPAD('ab', 5, '')", "EXP(1000)", "ROUND(1.5, 100000)", "ROUND(2.5)", "ROUND(-2.5)", "ROUND(15, -1)",
             "ROUND(1234.5678, 2)", "CAST(ROUND(-3.75E0, -1) AS VARCHAR)", "CAST(ROUND(-0.0E0) AS VARCHAR)",
             "CAST(ROUND(-0.4E0) AS VARCHAR)", "CAST(ROUND(-0.04, 1) AS VARCHAR)"]  # no negative zero: BigDecimal's
    exprs = [with_widths(expression(text), NO_COLUMNS) for text in texts]
    # Spark reads 1.5 as a DECIMAL, Python as a DOUBLE: compared as numbers.
    spark_values = [float(v) if isinstance(v, Decimal) else v for v in as_spark(spark, exprs)]
    assert dict(zip(texts, (evaluate(e, {}) for e in exprs), strict=True)) == dict(zip(texts, spark_values, strict=True))


def test_trigonometry_powers_and_text_functions_answer_as_sparks(spark: SparkSession) -> None:
    """ksqlDB's SIN ... CBRT, ATAN2, POWER, PI, INITCAP and CONCAT_WS at the edges where Python's
    math or text differs from Java's and Spark's: a domain error or an overflow raises in Python
    (NaN or Infinity in Java), POWER of NaN, of 1 to an infinite power, of a zero to a negative
    one, ATAN2 of negative zeros, COT of a zero, INITCAP's words (after spaces only), full case
    mapping of their first characters (not lowered first: ``İ`` stays) and final sigma, CONCAT_WS's NULLs."""
    texts = ["SIN(CAST('Infinity' AS DOUBLE))", "ACOS(2)", "ASIN(-1.5E0)", "COSH(1000)", "SINH(-1000)", "SINH(1000)",
             "COT(0.0E0)", "COT(-0.0E0)", "COT(CAST('Infinity' AS DOUBLE))", "TAN(-0.0E0)", "TANH(-0.0E0)", "COS(1E300)",
             "ATAN(CAST('-Infinity' AS DOUBLE))", "CBRT(-8)", "CBRT(-0.0E0)", "CBRT(CAST(27 AS DECIMAL(6, 2)))",
             "DEGREES(1E308)", "DEGREES(1)", "RADIANS(-0.0E0)", "RADIANS(180)", "PI()", "COT(1.25)", "SIN(1.0E-300)",
             "ATAN2(0.0E0, -0.0E0)", "ATAN2(-0.0E0, -0.0E0)", "ATAN2(-1, -0.0E0)", "ATAN2(CAST('Infinity' AS DOUBLE), 1)",
             "POWER(1, CAST('NaN' AS DOUBLE))", "POWER(-1, CAST('Infinity' AS DOUBLE))", "POWER(CAST('NaN' AS DOUBLE), 0)",
             "POWER(0.0E0, -1)", "POWER(-0.0E0, -1)", "POWER(-0.0E0, -2)", "POWER(-0.0E0, -3.0E0)", "POWER(-8, 1.0E0 / 3)",
             "POWER(10, 400)", "POWER(-10, 401)", "POWER(-10, 400)", "POWER(0.0E0, CAST('-Infinity' AS DOUBLE))",
             "POWER(-2, CAST('Infinity' AS DOUBLE))", "POWER(0.5E0, CAST('-Infinity' AS DOUBLE))",
             "POWER(CAST('-Infinity' AS DOUBLE), -3)", "POWER(CAST('-Infinity' AS DOUBLE), 3)", "POWER(-1.0E-300, 3)",
             "POWER(2, 3)", "POWER(9223372036854775807, 2)", "POWER(CAST(2 AS DECIMAL(6, 2)), 0.5)",
             "INITCAP('hELLO wORLD  x-y z_a')", "INITCAP('  a\tb\nc')", "INITCAP('ǆemal ßtraße ﬁsh ΣΑΣ ΑΣ İx xİ İİ ẞx ǅA ﬀi')",
             "INITCAP('')", "INITCAP('1abc Ábc ')", "CONCAT_WS(', ', 'a', NULL, 'b')", "CONCAT_WS(NULL, 'a')",
             "CONCAT_WS(',', NULL)", "CONCAT_WS('', 'a', 'b')", "CONCAT_WS('-', '', NULL, '')"]
    exprs = [with_widths(expression(text), NO_COLUMNS) for text in texts]
    python = [evaluate(e, {}) for e in exprs]
    differing = {text: (ours, theirs) for text, ours, theirs in zip(texts, python, as_spark(spark, exprs), strict=True)
                 if not same(ours, theirs)}
    assert differing == {}
    assert python[texts.index("POWER(1, CAST('NaN' AS DOUBLE))")] != python[texts.index("POWER(1, CAST('NaN' AS DOUBLE))")]


def test_split_and_mask_answer_as_sparks(spark: SparkSession) -> None:
    """SPLIT takes its delimiter as it is (Spark's ``split`` a pattern: quoted, ``\\E`` inside
    too), keeps empty parts, and an empty delimiter splits into characters (one beyond the BMP
    whole); MASK replaces each UTF-16 unit by its class (Lu, Ll, Nd, other: ``²`` and ``Ⓐ`` are
    other, a character beyond the BMP two), keeping a class whose replacement is NULL. Random
    texts and delimiters as columns, beside literal edge cases."""
    draw = random.Random(5)
    alphabet = "ab,.*\\E|Q$^ À²٣ǅⒶß😀\U0001d400"  # the last: MATHEMATICAL BOLD CAPITAL A (Lu, beyond the BMP)
    pairs = [("a,,b,", ","), ("", ","), ("", ""), ("a😀b", ""), ("a.b.c", "."), ("a\\Eb\\E", "\\E"), ("x|y", "|"),
             ("My Test $123", ","), *((_text(draw, alphabet, 8), _text(draw, alphabet[:8], 2)) for _ in range(300))]
    columns = Scope("T", {"S": ast.SqlType("VARCHAR"), "D": ast.SqlType("VARCHAR")})
    texts = ["SPLIT(s, d)", "MASK(s)", "MASK(s, '*', NULL, '1', NULL)", "MASK(s, NULL, NULL, NULL, '.')", "MASK(s, '#')",
             "ARRAY_LENGTH(SPLIT(s, d))", "MASK_LEFT(s, LEN(d) * 2 - 2)", "MASK_RIGHT(s, LEN(d) - 1, '*', NULL, '1', NULL)",
             "MASK_KEEP_LEFT(s, LEN(d) - 1)", "MASK_KEEP_RIGHT(s, 3, NULL, NULL, NULL, '.')", "MASK_LEFT(s, 4294967298)",
             "MASK_KEEP_RIGHT(s, -2147483648)", "MASK_RIGHT(s, 2147483647)"]
    exprs = [with_widths(expression(text), columns) for text in texts]
    rows = spark.createDataFrame(pairs, "S STRING, D STRING").selectExpr(*(to_spark(e, columns) for e in exprs)).collect()
    differing = [(pair, text, evaluate(e, {"S": pair[0], "D": pair[1]}), row[i])
                 for pair, row in zip(pairs, rows, strict=True) for i, (text, e) in enumerate(zip(texts, exprs, strict=True))
                 if evaluate(e, {"S": pair[0], "D": pair[1]}) != row[i]]
    assert differing == []
    assert evaluate(exprs[0], {"S": "a,,b,", "D": ","}) == ["a", "", "b", ""]
    assert evaluate(exprs[1], {"S": "My Test $123", "D": ""}) == "Xx-Xxxx--nnn"


def test_a_bigint_beside_a_double_is_compared_as_a_double(spark: SparkSession) -> None:
    # Spark's common type: 2^63 - 1 is the DOUBLE 2^63 there; Python compared them exactly (found
    # by the random expression test's seed 11, an IN).
    texts = ["9.223372036854776E18 = 9223372036854775807", "9223372036854775807 < 9.223372036854776E18",
             "(-1.0E0 + POWER(9223372036854775807, 1)) NOT IN (9223372036854775807, 1)",
             "9007199254740993 BETWEEN 9.007199254740992E15 AND 1.0E16", "CAST(9007199254740993 AS DOUBLE) > 9007199254740992",
             "2.5E0 > 2", "0.0E0 = 0", "(0.0E0 / 0) = 1"]
    exprs = [with_widths(expression(text), NO_COLUMNS) for text in texts]
    assert [evaluate(e, {}) for e in exprs] == as_spark(spark, exprs) == [True, False, False, True, False, True, True, None]


def test_unix_timestamp_and_unix_date_without_an_argument_are_now(spark: SparkSession) -> None:
    # ksqlDB's: the time now; a persistent query's is its micro-batch's (Spark's current_timestamp).
    exprs = [expression("UNIX_TIMESTAMP()"), expression("UNIX_DATE()")]
    assert [str(check(e, NO_COLUMNS)) for e in exprs] == ["BIGINT", "INT"]
    before = time.time_ns() // 1_000_000
    pythons, sparks = [evaluate(e, {}) for e in exprs], as_spark(spark, exprs)
    after = time.time_ns() // 1_000_000
    assert before <= pythons[0] <= after and before <= sparks[0] <= after
    assert before // 86_400_000 <= pythons[1] <= after // 86_400_000
    assert before // 86_400_000 <= sparks[1] <= after // 86_400_000
    assert evaluate(expression("UNIX_TIMESTAMP(FROM_UNIXTIME(1700000000123))"), {}) == 1700000000123


def _alike(python: Any, spark: Any) -> bool:
    """``same``, item by item through ARRAYs and MAPs (a MAP's entries in any order: PySpark
    collects a MAP through a java.util.HashMap)."""
    if isinstance(python, list) and isinstance(spark, list):
        return len(python) == len(spark) and all(_alike(a, b) for a, b in zip(python, spark, strict=True))
    if isinstance(python, dict) and isinstance(spark, dict):
        return python.keys() == spark.keys() and all(_alike(python[k], spark[k]) for k in python)
    return same(python, spark)


LAMBDAS = [
    "TRANSFORM(a, x => x * 2147483647)", "TRANSFORM(a, x => x + n)", "TRANSFORM(a, x => CAST(x AS VARCHAR))",
    "TRANSFORM(a, x => TRANSFORM(a, y => x - y))", "TRANSFORM(a, x => FILTER(a, x => x > 1))",
    "TRANSFORM(a, x => x + REDUCE(a, 0, (s, y) => s + y))", "TRANSFORM(d, x => x / 0)",
    "FILTER(a, x => x > 1)", "FILTER(a, x => x IS NULL)", "FILTER(a, x => x > NULL)", "FILTER(d, x => x <> x)",
    "FILTER(m, (k, v) => v % 2 = 0 OR k = 'a')", "FILTER(m, (k, v) => v > n)",
    "REDUCE(a, 0, (s, x) => s + x)", "REDUCE(a, n, (s, x) => s * 31 + x)", "REDUCE(d, 0, (s, x) => s + x)",
    "REDUCE(a, 0.5, (s, x) => s + x)", "REDUCE(a, 1.25, (s, x) => s * x)", "REDUCE(a, '', (s, x) => CONCAT(s, CAST(x AS VARCHAR)))",
    "REDUCE(m, '', (s, k, v) => CONCAT(s, k, '=', CAST(v AS VARCHAR), ';'))", "REDUCE(m, 0, (s, k, v) => s + v * LEN(k))",
    "REDUCE(a, CAST(NULL AS INT), (s, x) => COALESCE(s, 0) + x)", "REDUCE(a, 0, (s, x) => NULL)",
    "ARRAY_LENGTH(FILTER(a, x => x IS NOT NULL))", "REDUCE(FILTER(a, x => x > 0), 1, (s, x) => s * x)",
    "TRANSFORM(m, (k, v) => UCASE(k), (k, v) => v * 2)", "TRANSFORM(m, (k, v) => LEN(k) > 1, (k, v) => k)",
    "TRANSFORM(m, (k, v) => v, (k, v) => CONCAT(k, '!'))", "TRANSFORM(m, (k, v) => CASE WHEN k = 'b' THEN k END, (k, v) => v)",
    "TRANSFORM(m, (k, v) => k, (x, y) => TRANSFORM(a, z => z + y))",
]
"""ksqlDB's lambda functions over ARRAYs and MAPs with NULLs, as Spark computes them."""


def test_lambda_functions_answer_as_spark(spark: SparkSession) -> None:
    # Each lambda's arithmetic wraps, widens and rounds as Spark's; REDUCE's state takes the
    # type the lambda gives (0 and a BIGINT sum: BIGINT); a NULL initial state is NULL and a
    # NULL collection the initial state (ksqlDB's); FILTER keeps what its lambda gives TRUE for.
    draw = random.Random(13)
    ints, doubles, keys = [None, 0, 1, -1, 3, 2**31 - 1, -(2**31)], [None, 0.5, -0.0, 2.25, math.nan], ["a", "b", "cc", "é"]
    rows = [([draw.choice(ints) for _ in range(draw.randint(0, 4))], [draw.choice(doubles) for _ in range(draw.randint(0, 3))],
             {k: draw.choice(ints) for k in draw.sample(keys, draw.randint(0, 3))}, draw.choice([None, 0, 7, 2**40]))
            for _ in range(150)]
    rows += [(None, None, None, 1), ([], [], {}, None)]
    columns = Scope("T", {"A": ast.SqlType("ARRAY", (ast.SqlType("INT"),)), "D": ast.SqlType("ARRAY", (ast.SqlType("DOUBLE"),)),
                          "M": ast.SqlType("MAP", (ast.SqlType("VARCHAR"), ast.SqlType("INT"))), "N": ast.SqlType("BIGINT")})
    exprs = [with_widths(expression(text), columns) for text in LAMBDAS]
    frame = spark.createDataFrame(rows, "A ARRAY<INT>, D ARRAY<DOUBLE>, M MAP<STRING, INT>, N BIGINT")
    results = frame.selectExpr("A", "D", "M", "N", *(f"{to_spark(e, columns)} AS c{i}" for i, e in enumerate(exprs)))
    assert [spark_type_name(f.dataType) for f in results.schema.fields[4:]] == [str(check(e, columns)) for e in exprs]
    # Python reads each row as Spark gives it back (a MAP's entries in the order Spark's REDUCE
    # meets them: the order the same java.util.HashMap made both).
    differing = [(row[:4], text, python, row[4 + i]) for row in results.collect()
                 for i, (text, e) in enumerate(zip(LAMBDAS, exprs, strict=True))
                 if not _alike(python := evaluate(e, dict(zip("ADMN", row[:4], strict=True))), row[4 + i])]
    assert differing == []


def _plain(value: Any) -> Any:
    """A value Spark gave back as Python's evaluation gives it: a STRUCT's Row as a dict."""
    if isinstance(value, Row):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


MAPS_AND_SERIES = [
    "ENTRIES(m, true)", "ENTRIES(m, false)", "ENTRIES(m, b)", "ENTRIES(q, true)", "ENTRIES(AS_MAP(s, a), true)",
    "AS_MAP(s, a)", "AS_MAP(a, s)", "AS_MAP(s, SPLIT(t, ''))", "AS_MAP(SPLIT(t, ''), a)", "MAP_KEYS(AS_MAP(s, a))",
    "GENERATE_SERIES(i, j)", "GENERATE_SERIES(i, j, k)", "GENERATE_SERIES(j, i, k)", "GENERATE_SERIES(l, l + k)",
    "GENERATE_SERIES(i, l, -1)", "GENERATE_SERIES(2147483640, 2147483647, k)", "GENERATE_SERIES(i, i)",
    "GENERATE_SERIES(-9223372036854775807 - 1, 9223372036854775807)", "GENERATE_SERIES(9223372036854775807, l, -9)",
    "ARRAY_LENGTH(GENERATE_SERIES(i, i + 1048575))", "ARRAY_LENGTH(GENERATE_SERIES(i, i + 1048576))",
    "ARRAY_LENGTH(GENERATE_SERIES(i, i - 2097151, -2))", "ARRAY_LENGTH(GENERATE_SERIES(i, i - 2097152, -2))",
]
"""ksqlDB's ENTRIES, AS_MAP and GENERATE_SERIES, with NULLs, duplicate and NULL keys, steps of 0,
away from the end and past the INT and BIGINT bounds, and series of the most items or one more."""


def test_entries_as_map_and_generate_series_answer_as_spark(spark: SparkSession) -> None:
    # A step of 0 or away from the end is NULL (ksqlDB fails the record; Spark's sequence the
    # batch), so is a series past 2^20 items; a key given twice keeps its first place and last
    # value, a NULL key is left out, missing values are NULL.
    draw = random.Random(21)
    ints, texts = [None, 0, 1, -3, 5, 2**31 - 1, -(2**31)], [None, "a", "b", "a", "é", ""]
    rows = [([draw.choice(ints) for _ in range(draw.randint(0, 4))], [draw.choice(texts) for _ in range(draw.randint(0, 4))],
             {k: draw.choice(ints) for k in draw.sample(["b", "a", "cc", "é", ""], draw.randint(0, 4))},
             {k: draw.choice([None, 0.5, -2.0]) for k in draw.sample([3, -1, 0, 2**31 - 1], draw.randint(0, 3))},
             draw.choice([None, True, False]), draw.choice(texts), draw.choice([None, -2, 0, 1, 3, 40]),
             draw.choice([None, -5, 0, 4, 37]), draw.choice([None, -3, -1, 0, 2, 7]), draw.choice([None, 0, 2**40, -(2**63)]))
            for _ in range(120)]
    rows += [(None, None, None, None, None, None, 1, 2, 1, 1)]
    columns = Scope("T", {"A": ast.SqlType("ARRAY", (ast.SqlType("INT"),)), "S": ast.SqlType("ARRAY", (ast.SqlType("VARCHAR"),)),
                          "M": ast.SqlType("MAP", (ast.SqlType("VARCHAR"), ast.SqlType("INT"))),
                          "Q": ast.SqlType("MAP", (ast.SqlType("INT"), ast.SqlType("DOUBLE"))), "B": ast.SqlType("BOOLEAN"),
                          "T": ast.SqlType("VARCHAR"), "I": ast.SqlType("INT"), "J": ast.SqlType("INT"), "K": ast.SqlType("INT"),
                          "L": ast.SqlType("BIGINT")})
    exprs = [with_widths(expression(text), columns) for text in MAPS_AND_SERIES]
    frame = spark.createDataFrame(rows, "A ARRAY<INT>, S ARRAY<STRING>, M MAP<STRING, INT>, Q MAP<INT, DOUBLE>, B BOOLEAN, "
                                        "T STRING, I INT, J INT, K INT, L BIGINT")
    names = list(columns.schema)
    results = frame.selectExpr(*names, *(f"{to_spark(e, columns)} AS c{i}" for i, e in enumerate(exprs)))
    assert [spark_type_name(f.dataType).replace(":", " ") for f in results.schema.fields[len(names):]] == [
        str(check(e, columns)) for e in exprs]
    differing = [(row[:len(names)], text, python, row[len(names) + i]) for row in results.collect()
                 for i, (text, e) in enumerate(zip(MAPS_AND_SERIES, exprs, strict=True))
                 if not _alike(python := evaluate(e, dict(zip(names, row[:len(names)], strict=True))),
                               _plain(row[len(names) + i]))]
    assert differing == []
    assert evaluate(expression("ARRAY_LENGTH(GENERATE_SERIES(0, 1048575))"), {}) == 1048576
    assert evaluate(expression("GENERATE_SERIES(0, 1048576)"), {}) is None
    assert evaluate(expression("ENTRIES(AS_MAP(SPLIT('b,a,b', ','), SPLIT('1,2,3', ',')), true)"), {}) == [
        {"K": "a", "V": "2"}, {"K": "b", "V": "3"}]
    assert str(check(expression("GENERATE_SERIES(1, 2147483648)"), NO_COLUMNS)) == "ARRAY<BIGINT>"


@pytest.mark.parametrize(("text", "error"), [
    ("TRANSFORM(m, (k, v) => v)", "TRANSFORM takes 3 arguments, the last two lambdas: TRANSFORM(map, (k, v) => key, (k, v)"),
    ("TRANSFORM(a, (x, y) => x)", "TRANSFORM's lambda takes 1 parameter(s) here, TRANSFORM(array, x => ...); not (X, Y) => X"),
    ("TRANSFORM(m, (k, v) => a, (k, v) => v)", "the keys TRANSFORM makes must be BIGINT, BOOLEAN, INT, VARCHAR"),
    ("TRANSFORM(a, x => x, x => x)", "TRANSFORM takes 2 arguments"), ("FILTER(a)", "FILTER takes 2 arguments"),
    ("FILTER(a, x => x + 1)", "FILTER's lambda needs BOOLEAN"), ("REDUCE(a, (s, x) => s)", "REDUCE takes 3 arguments"),
    ("REDUCE(a, NULL, (s, x) => s)", "REDUCE's initial state NULL has no type"),
    ("REDUCE(a, '', (s, x) => s + x)", "arithmetic + needs numbers"), ("ABS(x => x)", "is only an argument of TRANSFORM"),
    ("TRANSFORM(a, x => y)", "column Y does not exist"), ("TRANSFORM(a, (x, x) => x)", "names X twice"),
    ("REDUCE(a, 0, (s, x) => ARRAY_CONTAINS(a, x))", "REDUCE's lambda gives another type than its state"),
])
def test_a_lambda_function_that_cannot_be_typed_is_refused(text: str, error: str) -> None:
    columns = Scope("T", {"A": ast.SqlType("ARRAY", (ast.SqlType("INT"),)),
                          "M": ast.SqlType("MAP", (ast.SqlType("VARCHAR"), ast.SqlType("INT")))})
    with pytest.raises(MillpondError, match=re.escape(error)):
        check(expression(text), columns)


def _exactly(value: Any) -> Any:
    """``value`` with each DOUBLE as its text (NaN equal to NaN, -0.0 apart from 0.0)."""
    if isinstance(value, list):
        return [_exactly(v) for v in value]
    return repr(value) if isinstance(value, float) else value


def _differing(frame: Any, rows: list[Any], names: str, texts: list[str], columns: Scope,
               same: Callable[[Any, Any], bool] = lambda ours, theirs: _exactly(ours) == _exactly(theirs),
               ) -> list[tuple[Any, str, Any, Any]]:
    """Each call of ``texts`` over ``rows`` (``frame``'s, as Python has them: its columns ``names``,
    one letter each) whose value in Python and in Spark are not the ``same``."""
    exprs = [with_widths(expression(text), columns) for text in texts]
    spark_rows = frame.selectExpr(*(to_spark(e, columns) for e in exprs)).collect()
    return [(row, text, ours, theirs) for row, spark_row in zip(rows, spark_rows, strict=True)
            for text, e, theirs in zip(texts, exprs, spark_row, strict=True)
            if not same(ours := evaluate(e, dict(zip(names, row, strict=True))), theirs)]


def test_array_functions_answer_as_sparks(spark: SparkSession) -> None:
    """ARRAY_CONTAINS, ARRAY_REMOVE, ARRAY_DISTINCT, ARRAY_SORT, ARRAY_MAX and ARRAY_MIN over
    random arrays with NULLs, NaN, -0.0 and the infinities, as Spark's: NaN equal to itself and
    above every number, -0.0 equal to 0.0, NULLs last in a sort either way, a NULL item making a
    failed ARRAY_CONTAINS NULL."""
    draw = random.Random(9)
    doubles = [None, math.nan, -0.0, 0.0, 1.5, -2.0, math.inf, -math.inf, 3.0]
    ints, texts = [None, 0, 1, -1, 7, 2**31 - 1], [None, "", "a", "b", "ab", "B", "é"]
    rows = [([draw.choice(ints) for _ in range(draw.randint(0, 5))], [draw.choice(doubles) for _ in range(draw.randint(0, 5))],
             [draw.choice(texts) for _ in range(draw.randint(0, 5))], draw.choice(ints), draw.choice(doubles), draw.choice(texts))
            for _ in range(200)]
    rows += [(None, None, None, 1, 1.0, "a")]
    columns = Scope("T", {"A": ast.SqlType("ARRAY", (ast.SqlType("INT"),)), "D": ast.SqlType("ARRAY", (ast.SqlType("DOUBLE"),)),
                          "S": ast.SqlType("ARRAY", (ast.SqlType("VARCHAR"),)), "I": ast.SqlType("INT"),
                          "X": ast.SqlType("DOUBLE"), "T": ast.SqlType("VARCHAR")})
    exprs_text = [f"{f}({a})" for f in ("ARRAY_DISTINCT", "ARRAY_SORT", "ARRAY_MAX", "ARRAY_MIN") for a in "ads"]
    exprs_text += [f"{f}({a}, {v})" for f in ("ARRAY_CONTAINS", "ARRAY_REMOVE") for a, v in (("a", "i"), ("d", "x"), ("s", "t"))]
    exprs_text += ["ARRAY_SORT(d, 'DESC')", "ARRAY_SORT(s, 'desc')", "ARRAY_SORT(a, 'ASC')", "ARRAY_CONTAINS(a, x)",
                   "ARRAY_LENGTH(ARRAY_DISTINCT(SPLIT(t, '')))", "ARRAY_JOIN(a)", "ARRAY_JOIN(d, t)", "ARRAY_JOIN(s, NULL)",
                   "ARRAY_JOIN(s, '')", "ARRAY_JOIN(ARRAY_SORT(d), ' | ')", "ARRAY_UNION(s, SPLIT(t, ''))",
                   "ARRAY_UNION(d, ARRAY_REMOVE(d, x))", "ARRAY_INTERSECT(d, ARRAY_SORT(d, 'DESC'))",
                   "ARRAY_INTERSECT(s, SPLIT(t, ''))",
                   "ARRAY_EXCEPT(a, ARRAY_REMOVE(a, i))", "ARRAY_EXCEPT(d, ARRAY_REMOVE(d, x))", "ARRAY_CONCAT(a, ARRAY_REMOVE(a, i))",
                   "ARRAY_CONCAT(s, SPLIT(t, ''))"]
    frame = spark.createDataFrame(rows, "A ARRAY<INT>, D ARRAY<DOUBLE>, S ARRAY<STRING>, I INT, X DOUBLE, T STRING")
    differing = _differing(frame, rows, "ADSIXT", exprs_text, columns)
    assert differing == []
    assert [str(check(with_widths(expression(text), columns), columns)) for text in exprs_text[6:9]] == [
        "INT", "DOUBLE", "VARCHAR"]  # ARRAY_MAX: the element type


def test_map_keys_and_values_answer_as_sparks(spark: SparkSession) -> None:
    """In the order of the map's entries (a map read from JSON keeps its text's, in Spark and in Python)."""
    maps = ['{"b": 2, "a": null, "c": 3}', "{}", None, '{"x": 1}']
    columns = Scope("T", {"M": ast.SqlType("MAP", (ast.SqlType("VARCHAR"), ast.SqlType("INT")))})
    texts = ["MAP_KEYS(m)", "MAP_VALUES(m)", "ARRAY_JOIN(MAP_VALUES(m), '/')"]
    exprs = [with_widths(expression(text), columns) for text in texts]
    frame = spark.createDataFrame([(m,) for m in maps], "J STRING").selectExpr("from_json(J, 'MAP<STRING, INT>') AS M")
    rows = frame.selectExpr(*(to_spark(e, columns) for e in exprs)).collect()
    python = [[evaluate(e, {"M": m and json.loads(m)}) for e in exprs] for m in maps]
    assert python == [list(row) for row in rows]
    assert python[0] == [["b", "a", "c"], [2, None, 3], "2/null/3"]


@pytest.mark.parametrize("text, message", [
    ("ARRAY_CONTAINS(a, 'x')", "the arguments of ARRAY_CONTAINS have different types"),
    ("ARRAY_SORT(a, 'UP')", "ARRAY_SORT's order must be 'ASC' or 'DESC'"),
    ("ARRAY_SORT(a, t)", "ARRAY_SORT's order must be 'ASC' or 'DESC'"),
    ("ARRAY_CONTAINS(a, NULL)", "ARRAY_CONTAINS looks for a value of the ARRAY's type (INT); a bare NULL has none"),
    ("ARRAY_MAX(NULL)", "ARRAY_MAX takes an ARRAY; a bare NULL has no element type"),
    ("ARRAY_DISTINCT(m)", "ARRAY_DISTINCT cannot compare the items of an ARRAY of MAP<VARCHAR, INT>: Spark compares no MAP"),
    ("ARRAY_SORT(n)", "ARRAY_SORT orders the items of an ARRAY of BOOLEAN, a number, VARCHAR, DATE, TIME or TIMESTAMP, "
                      "not ARRAY<INT>"),
    ("ARRAY_REMOVE(a, 1.5)", "ARRAY_REMOVE takes out values of the ARRAY's type (INT), not DECIMAL(2, 1)"),
    ("ARRAY_UNION(a, n)", "ARRAY_UNION takes two ARRAYs of one type, not ARRAY<INT> and ARRAY<ARRAY<INT>>"),
    ("ARRAY_EXCEPT(NULL, NULL)", "ARRAY_EXCEPT takes two ARRAYs; a bare NULL has no element type"),
    ("ARRAY_CONCAT(a, NULL)", "ARRAY_CONCAT takes two ARRAYs; a bare NULL has no element type"),
    ("ARRAY_INTERSECT(m, m)", "ARRAY_INTERSECT cannot compare the items of an ARRAY of MAP<VARCHAR, INT>"),
    ("MAP_KEYS(NULL)", "MAP_KEYS takes a MAP; a bare NULL has no key type"), ("MAP_VALUES(a)", "argument 1 of MAP_VALUES must be map"),
    ("ARRAY_JOIN(n)", "ARRAY_JOIN joins an ARRAY of BIGINT, BOOLEAN, DOUBLE, INT, VARCHAR, not ARRAY<ARRAY<INT>>"),
    ("ARRAY_JOIN(a, 1)", "argument 2 of ARRAY_JOIN must be string"),
    ("MASK_LEFT(t, 2, 'XY')", "MASK_LEFT's replacement characters must each be one character"),
    ("MASK_KEEP_RIGHT(t, t)", "argument 2 of MASK_KEEP_RIGHT must be integer"),
    ("ENTRIES(NULL, true)", "ENTRIES takes a MAP; a bare NULL has no key type"),
    ("ENTRIES(AS_MAP(a, a), 1)", "argument 2 of ENTRIES must be boolean"),
    ("ENTRIES(k, t = '')", "ENTRIES orders a MAP's entries by keys of BOOLEAN, a number, VARCHAR, DATE, TIME or TIMESTAMP, not "
                           "MAP<ARRAY<INT>, INT>"),
    ("AS_MAP(a, NULL)", "AS_MAP takes two ARRAYs, its keys and its values; a bare NULL has no element type"),
    ("AS_MAP(n, a)", "AS_MAP's keys must be BIGINT, BOOLEAN, INT, VARCHAR, not ARRAY<INT>"),
    ("AS_MAP(t, a)", "argument 1 of AS_MAP must be array"),
    ("GENERATE_SERIES(1.5, 2)", "argument 1 of GENERATE_SERIES must be bigint"),
    ("GENERATE_SERIES(NULL, NULL, 1)", "GENERATE_SERIES needs a start or an end of a type, INT or BIGINT; both are a bare NULL"),
])
def test_array_functions_refuse_what_spark_cannot_take(text: str, message: str) -> None:
    """Each of these Spark's analyzer refuses (or types otherwise): a persistent query would be
    accepted, then fail on its worker."""
    int_array = ast.SqlType("ARRAY", (ast.SqlType("INT"),))
    scope = Scope("T", {"A": int_array, "T": ast.SqlType("VARCHAR"), "N": ast.SqlType("ARRAY", (int_array,)),
                        "M": ast.SqlType("ARRAY", (ast.SqlType("MAP", (ast.SqlType("VARCHAR"), ast.SqlType("INT"))),)),
                        "K": ast.SqlType("MAP", (int_array, ast.SqlType("INT")))})
    with pytest.raises(StatementError, match=re.escape(message)):
        check(expression(text), scope)


JAVA_PATTERNS = ["a.b", "a$", "^a", "\\d+", "\\w+", "\\s+", "\\S\\W", "(?i)ab", "(?i:a)B", "[^a-z\\d]+", "x*", "(?s)a.b",
                 "(?s:a.)b.", "(a)|(b)", "(?<y>\\d)(?<z>\\d)?", "\\Qa.b\\E", "[\\Q]\\E-]", "a{2}", "a{1,}b?", "a{1,2}+",
                 "(?>ab|a)b", "(?=b).", "(?<!a)b", "\\x41|\\u00e9|\\x{1F600}", "\\0101|\\e|\\cA", "\\Z", "b\\z", "$", "", ".",
                 "é+", "[é-ü]", "\\t|\\n|\\r|\\f|\\a", "(a)\\1", "(?<n>a)\\k<n>", "a*?", "[]a]", "\\.\\*\\$\\^\\{\\}", "#| ",
                 "[$.]", "(?s).$", "(?i)[A-C]+É", "(?<!^).", "(?<!a)\\W", "\\x{1F600}|(?<!^).", "😀|(?<!^).", "(?i:a)(?-i:a)",
                 "(?m)^.", "(?m).$", "(?m)^$", "(?m)^", "(?m)$", "(?m:a$)|^b", "(?ms)^.+$", "(?m)(?-m:^.)|b$", "(?im)^A",
                 "(?m)b?^?", "a", "\\.", "\\-"]
"""Java patterns of every construct Millpond reads, with Java's meaning where Python's differs."""


def test_regular_expressions_answer_as_sparks(spark: SparkSession) -> None:
    """REGEXP_EXTRACT (NULL without a match, as ksqlDB's), REGEXP_EXTRACT_ALL, REGEXP_REPLACE (Java's
    ``$n`` and ``${name}``) and REGEXP_SPLIT_TO_ARRAY (Java's split: no empty first part from a
    zero-width match at the start) over random texts with Java's five line terminators, non-ASCII
    letters and a character beyond the BMP, as Spark's over Java's patterns."""
    draw = random.Random(19)
    texts = ["a\r\n", "a\n", "a\r", "ab\n\n", "", "aa", "ab", "AB", "2024", *(_text(draw, "abAB01 é\n\r\u0085\u2028.\t$😀x{}É#", 8)
                                                                        for _ in range(200))]
    columns = Scope("T", {"S": ast.SqlType("VARCHAR")})
    calls = []
    for pattern in JAVA_PATTERNS:
        p = "'" + pattern.replace("'", "''") + "'"
        groups = java_pattern(pattern).regex.groups
        calls += [f"REGEXP_EXTRACT({p}, s)", f"REGEXP_EXTRACT_ALL({p}, s)", f"REGEXP_REPLACE(s, {p}, '<$0>')",
                  f"REGEXP_SPLIT_TO_ARRAY(s, {p})", *([f"REGEXP_EXTRACT({p}, s, {groups})", f"REGEXP_EXTRACT_ALL({p}, s, 1)",
                                                       f"REGEXP_REPLACE(s, {p}, '[${groups}1\\$\\\\]')"] if groups else [])]
    calls += ["REGEXP_REPLACE(s, '(?<y>\\d)(?<z>\\d)?', '${z}${y}')"]
    exprs = [with_widths(expression(text), columns) for text in calls]
    rows = spark.createDataFrame([(t,) for t in texts], "S STRING").selectExpr(*(to_spark(e, columns) for e in exprs)).collect()
    differing = [(text, call, ours, theirs) for text, row in zip(texts, rows, strict=True)
                 for call, e, theirs in zip(calls, exprs, row, strict=True) if (ours := evaluate(e, {"S": text})) != theirs]
    assert differing == []
    assert evaluate(expression("REGEXP_EXTRACT('x', 'abc')"), {}) is None


BOUNDARY_PATTERNS = ["\\b", "\\B", "\\bab", "a\\b", "\\b\\w+\\b", "\\B.", "(?<=\\b).", "\\b?a", "x\\b|\\by", "\\b.\\B",
                     "(?i)\\bA", "(?<!\\b)_", "[\\u0301]\\b", "\\b[\\u0301]", "\\b\\S"]
"""Word boundaries, each side of a position a word's by Java 17's reading: a letter or digit of
any script or ``_``, or a non-spacing mark after one."""


def test_word_boundaries_answer_as_javas(spark: SparkSession) -> None:
    """``\\b`` and ``\\B`` over letters and digits of other scripts, ``_``, non-spacing marks after
    letters, after digits, after spaces and after each other, and characters beyond the BMP (a
    letter, a mark, an emoji): Python's reading (the JVM's Unicode, ``java_unicode``) as Java's in Spark."""
    draw = random.Random(29)
    alphabet = "ab_1 é\u0301\u0300xÉ\u0663\u02b0\u4e00\U0001D400\U0001D167😀.-\u00b2\u2164"
    texts = ["", "a", "_", "\u0301", "a\u0301b", " \u0301x", "\U0001D400\u0301 ", "a\U0001D167 ",
             *(_text(draw, alphabet, 7) for _ in range(250))]
    columns = Scope("T", {"S": ast.SqlType("VARCHAR")})
    calls = []
    for pattern in BOUNDARY_PATTERNS:
        p = "'" + pattern + "'"
        calls += [f"REGEXP_EXTRACT_ALL({p}, s)", f"REGEXP_REPLACE(s, {p}, '<$0>')", f"REGEXP_SPLIT_TO_ARRAY(s, {p})"]
    exprs = [with_widths(expression(text), columns) for text in calls]
    rows = spark.createDataFrame([(t,) for t in texts], "S STRING").selectExpr(*(to_spark(e, columns) for e in exprs)).collect()
    differing = [(text, call, ours, theirs) for text, row in zip(texts, rows, strict=True)
                 for call, e, theirs in zip(calls, exprs, row, strict=True) if (ours := evaluate(e, {"S": text})) != theirs]
    assert differing == []


PROPERTY_PATTERNS = ["\\p{L}+", "\\P{L}", "\\pL", "\\PN", "\\p{Lu}", "(?i)\\p{Lu}", "(?i)\\P{Ll}", "\\p{IsLt}", "\\p{Lm}|\\p{Lo}",
                     "\\p{gc=Nd}", "\\p{general_category=Mn}", "\\p{M}", "\\p{Mc}|\\p{Me}", "\\p{N}", "\\p{Nl}|\\p{No}", "\\p{Z}",
                     "\\p{Zl}|\\p{Zp}", "\\p{C}", "\\p{Cn}", "\\p{Co}|\\p{Cf}", "\\p{Cc}", "\\p{P}", "\\p{Pd}\\p{Ps}?",
                     "\\p{Pi}|\\p{Pf}",
                     "\\p{Pe}|\\p{Pc}|\\p{Po}", "\\p{S}", "\\p{Sc}|\\p{Sk}", "\\p{Sm}|\\p{So}", "\\p{LC}", "\\p{LD}+", "\\p{L1}",
                     "\\p{all}", "\\p{ASCII}", "\\p{Alnum}", "\\p{Alpha}", "\\p{Blank}", "\\p{Cntrl}", "\\p{Digit}", "\\p{Graph}",
                     "(?i)\\p{Lower}", "\\p{Lower}", "\\p{Print}", "\\p{Punct}", "\\p{Space}", "\\p{Upper}", "(?i:\\p{Upper})",
                     "\\p{XDigit}", "[\\p{L}\\d]", "[^\\p{L}]", "[\\P{L}a]", "[a-c\\p{Nd}]+", "\\p{gc=Alpha}", "(?i)[\\p{Lt}]",
                     "(?i)[^\\P{Lu}]", "\\p{IsL}\\b", "\\p{IsLatin}+", "\\p{IsHan}", "\\p{script=Cyrillic}", "\\p{sc=Grek}",
                     "\\p{IsCommon}", "\\P{IsLatin}", "[\\p{IsArabic}\\d]", "(?i)\\p{IsLatin}", "\\p{IsUnknown}", "\\p{Iszyyy}+",
                     "\\p{IsInherited}",
                     # Whether Java's search tries between the halves of a character beyond the BMP:
                     *(f"(?=[{c}])x|(?<!^)." for c in ("^a", "\\W", "\\D", "\\S", "\\p{Nd}", "\\p{Alpha}", "\\P{Alpha}", "a-z",
                                                       "\\w")),
                     "(?i)(?=[a-z])x|(?<!^).", "(?=\\p{Punct}|\\p{all})x|(?<!^).", "(?=.)x|(?<!^)."]
"""Java's ``\\p{..}`` classes Millpond reads: every general category and group of them, scripts, POSIX's;
and classes that have Java's search go from character to character, or not."""


def test_character_classes_answer_as_javas(spark: SparkSession) -> None:
    """``\\p{..}`` and ``\\P{..}`` over characters of every general category (and characters Java
    17's Unicode 13.0 has not assigned, which later ones have), in and out of classes and (?i):
    Python's reading (the JVM's categories, ``java_unicode``) as Java's in Spark."""
    draw = random.Random(31)
    alphabet = ("Aa\u03b1\u0416\u0634ǅʰ中\u0301\u0903\u20dd1\u2163²\u0663 \u2028\u2029\u00a0\t\x01\x7f\x85\u200b\ue000"
                "\u0870\U0001E290-()_«»!+$^©\U0001D400😀\U0001D167\U000E0001\u0378éÉ\u00b5\u01c5\u3000\U00010400")
    texts = ["", *alphabet, *(_text(draw, alphabet, 6) for _ in range(150))]
    columns = Scope("T", {"S": ast.SqlType("VARCHAR")})
    calls = [call for pattern in PROPERTY_PATTERNS
             for call in (f"REGEXP_EXTRACT_ALL('{pattern}', s)", f"REGEXP_REPLACE(s, '{pattern}', '<$0>')")]
    exprs = [with_widths(expression(text), columns) for text in calls]
    rows = spark.createDataFrame([(t,) for t in texts], "S STRING").selectExpr(*(to_spark(e, columns) for e in exprs)).collect()
    differing = [(text, call, ours, theirs) for text, row in zip(texts, rows, strict=True)
                 for call, e, theirs in zip(calls, exprs, row, strict=True) if (ours := evaluate(e, {"S": text})) != theirs]
    assert differing == []


def test_the_regexp_functions_with_a_time_are_sparks_own(spark: SparkSession) -> None:
    """The persistent queries' REGEXP functions (``regexes.SPARK_FUNCTIONS``: each call within its
    time) give what Spark's own regexp_extract (NULL without a match, as ksqlDB's),
    regexp_extract_all, regexp_replace and split give, over every pattern above and random texts."""
    draw = random.Random(23)
    texts = ["", "a", "ab\n", "a\r\n", *(_text(draw, "abAB01 é\n\r\u0085.\t$😀-x", 8) for _ in range(40))]
    ours_and_sparks = [
        ("millpond_regexp_extract(s, p, 0, 500)", "CASE WHEN s RLIKE p THEN regexp_extract(s, p, 0) END"),
        ("millpond_regexp_extract(s, p, 1, 500)", "CASE WHEN s RLIKE p THEN regexp_extract(s, p, 1) END"),
        ("millpond_regexp_extract_all(s, p, 0, 500)", "regexp_extract_all(s, p, 0)"),
        ("millpond_regexp_replace(s, p, '<$0>', 500)", "regexp_replace(s, p, '<$0>')"),
        ("millpond_regexp_split(s, p, 500)", "split(s, p, -1)")]
    for grouped in (False, True):  # group 1 only where the pattern has one
        rows = [(t, p) for p in JAVA_PATTERNS if (java_pattern(p).regex.groups > 0) == grouped for t in [*texts, None]]
        calls = [pair for pair in ours_and_sparks if grouped or ", 1, " not in pair[0]]
        frame = spark.createDataFrame(rows, "s STRING, p STRING").selectExpr("s", "p", *(f"{a} = {b} OR {a} IS NULL AND {b} IS NULL"
                                                                                         for a, b in calls))
        differing = [(row[0], row[1], calls[i]) for row in frame.collect() for i, same in enumerate(row[2:]) if not same]
        assert differing == []


@pytest.mark.parametrize("pattern, message", [
    ("[\\b]", "\\b is not an escape Millpond reads as Java does (Java refuses it inside a class)"),
    ("\\b{g}", "a grapheme cluster's boundary"), ("[a[b]]", "a class inside a class"),
    ("[a&&b]", "&& inside a class"), ("(?x)a", "the flags 'x' are not read here"), ("a{,2}", "a { starts a repetition"),
    ("\\p{IsLatn1}", "\\p{IsLatn1} is not read here: a general category"), ("\\p{InGreek}", "\\p{InGreek} is not read"),
    ("\\p{block=Greek}", "is not read here"), ("\\p{IsAlpha}", "is not read here"),
    ("\\p{javaLowerCase}", "is not read here"), ("\\p{lu}", "is not read here"), ("\\p{L", "\\p{ is not closed"),
    ("(?<n_1>a)", "a named group is (?<name>...)"), ("a)", "a ) closes no group"),
    ("(a", "a ( is not closed"), ("\\1(a)", "the back reference"), ("a(?m)b", "read at its start only"),
    ("\\ud83d", "is a surrogate"), ("(?<=a+)b", "look-behind requires fixed-width pattern"),
    ("a{1001}", "a repetition counts at most 1000 times"), ("(?:a{1000}){1000}", "over 100000 items large"),
    ("(?i-i)a", "turn one flag both on and off"), ("(a)b(?<=\\1b)", "a back reference inside a look-behind"),
    ("\\c\\Q.", "\\c needs a character after it, not a backslash"),
])
def test_a_pattern_python_would_not_read_as_java_is_refused(pattern: str, message: str) -> None:
    p = "'" + pattern + "'"
    with pytest.raises(StatementError, match=re.escape(message)):
        check(expression(f"REGEXP_EXTRACT({p}, s)"), Scope("T", {"S": ast.SqlType("VARCHAR")}))


@pytest.mark.parametrize("text, message", [
    ("REGEXP_REPLACE(s, '(a)', '$2')", "$2 names no group of the pattern (it has 1)"),
    ("REGEXP_REPLACE(s, 'a', 'x$')", "a $ is a group"), ("REGEXP_REPLACE(s, 'a', 'x\\')", "lone backslash"),
    ("REGEXP_REPLACE(s, '(a)', '${b}')", "${name} must name a group"), ("REGEXP_REPLACE(s, 'a', s)", "written as it is"),
    ("REGEXP_EXTRACT('(a)', s, 2)", "group must be a number from 0 (the whole match) to 1"),
    ("REGEXP_EXTRACT_ALL('a', s, -1)", "group must be a number from 0"), ("REGEXP_SPLIT_TO_ARRAY(s, s)", "written as it is"),
])
def test_a_replacement_or_group_spark_would_fail_on_is_refused(text: str, message: str) -> None:
    with pytest.raises(StatementError, match=re.escape(message)):
        check(expression(text), Scope("T", {"S": ast.SqlType("VARCHAR")}))


def test_a_pattern_that_backtracks_without_end_fails_the_pull_and_is_no_value_elsewhere() -> None:
    """``(a|aa)+c`` over 60 characters would take Python (and Java) for ever: the call stops at
    its time limit; a pull gets the error (INVALID_ARGUMENT), a join's or a table's computation
    a ValueError (the processing log, or NULL) instead of a failed task."""
    call = with_widths(expression("REGEXP_EXTRACT('(a|aa)+c', s)"), Scope("T", {"S": ast.SqlType("VARCHAR")}))
    with pytest.raises(PatternTimeout, match=re.escape("took over 0.5 s on a text of 61 characters")) as stopped:
        evaluate(call, {"S": "a" * 60 + "!"})
    assert isinstance(stopped.value, StatementError) and isinstance(stopped.value, ValueError)
    assert evaluate(call, {"S": "aac"}) == "aac"


def _json_value(draw: random.Random, depth: int = 0) -> str:
    """Random JSON text in the forms Jackson reads and writes differently: single quotes, escapes,
    control characters, numbers Java re-writes, duplicate names, nulls, white space."""
    kind = draw.choice(["object", "array"] * (depth < 3) + ["string", "number", "literal"])
    space = draw.choice(["", "", " ", "\n\t"])
    if kind == "object":
        names = [draw.choice(["a", "b", "a b", "é", "x"]) for _ in range(draw.randint(0, 3))]
        quote = draw.choice(['"', '"', "'"])
        fields = [f"{space}{quote}{n}{quote}{space}:{space}{_json_value(draw, depth + 1)}" for n in names]
        return "{" + ",".join(fields) + space + "}"
    if kind == "array":
        return "[" + ",".join(space + _json_value(draw, depth + 1) for _ in range(draw.randint(0, 3))) + "]"
    if kind == "string":
        quote = draw.choice(['"', "'"])
        body = "".join(draw.choice(["a", "é", "\\n", "\\u00e9", "\\ud83d\\ude00", "\\'", '\\"', "\t", "😀", "\\/", "\\\\", " "])
                       for _ in range(draw.randint(0, 4)))
        return quote + (body.replace("'", "\\'") if quote == "'" else body.replace('"', '\\"').replace('\\\\"', '\\"')) + quote
    if kind == "number":
        return draw.choice(["0", "-0", "12", "1.50", "1e2", "-2.5E-3", "123456789012345678901234", "1e400", "0.1", "-0.0",
                            "01", "1.", "+1", ".5"])
    return draw.choice(["true", "false", "null", "nul", "truex"])


def _json_texts(draw: random.Random) -> list[str]:
    """Random JSON, some cut short or with a character put in, and text at the edges of Jackson's
    reading."""
    texts = [_json_value(draw) for _ in range(300)]
    texts += [t[:draw.randint(0, len(t))] for t in texts[:100]] + [
        (lambda at: t[:at] + draw.choice(",:}]x\u00a0\x01") + t[at:])(draw.randint(0, len(t))) for t in texts[100:200]]
    return [*texts, "", "  ", '{"a":1} junk', "123x", "123 x", '{"a":null,"a":3}', "[" * 1000 + "]" * 1000,
                    "[" * 1001 + "]" * 1001, '{"a":"\\ud83d"}', '{"a":["\\ud83d"]}', "{'a':'b'}", '{"a":1,}', "[1,]",
                    "/*c*/1", "null", '"x"', '{"\\ud83d\\ude00":1,"\\ud83d":2,"a":3,"a":4}', "[1,[2,3],{'a':[]}] x",
                    '[1 2]', "[1,\x01]", '["\x01"]', "{a:1}", "[\"\\x\"]", "[]", "{}"]


def test_extractjsonfield_answers_as_sparks_get_json_object(spark: SparkSession) -> None:
    """EXTRACTJSONFIELD over random JSON (valid, and cut short or with a character put in) at
    paths of names, quoted names and indexes: Python's reading follows Jackson's as Spark's
    ``get_json_object`` does (what it reads, what it allows, how it writes a value again)."""
    texts = _json_texts(random.Random(31))
    paths = ["$", "$.a", "$.a.b", "$['a']", "$.a[0]", "$[0]", "$[1].a", "$.a[1]", "$['a b']", "$.é", "$.x[0][0]"]
    columns = Scope("T", {"S": ast.SqlType("VARCHAR")})
    calls = [f"EXTRACTJSONFIELD(s, '{p.replace(chr(39), chr(39) * 2)}')" for p in paths]
    exprs = [with_widths(expression(call), columns) for call in calls]
    rows = spark.createDataFrame([(t,) for t in texts], "S STRING").selectExpr(*(to_spark(e, columns) for e in exprs)).collect()
    differing = [(text, call, ours, theirs) for text, row in zip(texts, rows, strict=True)
                 for call, e, theirs in zip(calls, exprs, row, strict=True) if (ours := evaluate(e, {"S": text})) != theirs]
    assert differing == []
    assert evaluate(expression("""EXTRACTJSONFIELD('{"a": {"b": [1, 2.50, "x"]}}', '$.a')"""), {}) == '{"b":[1,2.5,"x"]}'


def test_the_json_functions_read_text_as_spark(spark: SparkSession) -> None:
    """IS_JSON_STRING, JSON_ARRAY_LENGTH and JSON_KEYS over the same random JSON: Python reads
    the text as Jackson does for Spark's ``get_json_object``, ``json_array_length`` and
    ``json_object_keys`` (an item or a field read to its end, what follows the value not read,
    a name's lone UTF-16 half ``?``)."""
    texts: list[str | None] = [*_json_texts(random.Random(37)), None]
    columns = Scope("T", {"S": ast.SqlType("VARCHAR")})
    calls = ["IS_JSON_STRING(s)", "JSON_ARRAY_LENGTH(s)", "JSON_KEYS(s)"]
    exprs = [with_widths(expression(call), columns) for call in calls]
    frame = spark.createDataFrame([(t,) for t in texts], "S STRING").selectExpr(*(to_spark(e, columns) for e in exprs))
    assert [spark_type_name(f.dataType) for f in frame.schema.fields] == [str(check(e, columns)) for e in exprs]
    differing = [(text, call, ours, theirs) for text, row in zip(texts, frame.collect(), strict=True)
                 for call, e, theirs in zip(calls, exprs, row, strict=True) if (ours := evaluate(e, {"S": text})) != theirs]
    assert differing == []
    answers = {call: [evaluate(e, {"S": t}) for t in texts] for call, e in zip(calls, exprs, strict=True)}
    assert answers["IS_JSON_STRING(s)"].count(True) > 100 and answers["IS_JSON_STRING(s)"].count(False) > 100
    assert len({n for n in answers["JSON_ARRAY_LENGTH(s)"] if n is not None}) >= 4
    assert evaluate(exprs[1], {"S": "[1,[2,3],{'a':[]}] x"}) == 3 and evaluate(exprs[1], {"S": "[1 2]"}) is None
    assert sum(1 for keys in answers["JSON_KEYS(s)"] if keys) > 30
    keys = evaluate(exprs[2], {"S": '{"\\ud83d\\ude00":1,"\\ud83d":2,"a":3,"a":4}'})
    assert keys == ["\U0001f600", "?", "a", "a"]


_VARIANT_EDGES = ["1", '"a"', '{"b":2, "a":1}', "[1,2]", "null", "true", "1.50", "1e2", "1E20", "-0.0", "-0", "0.1",
                  "123456789012345678901234", "1" * 44, "1e400", "-1e400", "2.5E-3", "100000000000000000000.0", "1.0",
                  "10.00", "0.0000001", "1e-400", "1." + "0" * 41, "0." + "0" * 41 + "1",
                  "1" + "0" * 41 + ".0", "9" * 39, "0." + "9" * 38,
                  "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
                  '"\\u00e9\\n\\"/\\t\\u0001\\u007f\\u2028\\u001f"', '"\\ud83d"', '"\\ud83d\\ude00"',
                  '{"\\ue000":1,"😀":2,"é":3,"a":4,"B":5,"":6}', "1 x", "{}", "[]", '"\\u0000"', "'a'", '"\\\'"',
                  '{"a":1,"a":2}', '["\\ud83d"]', '"\x01"', "[1,]", "01", "NaN", "/*c*/1"]
"""JSON values where Spark's VARIANT reads or writes its own way: numbers it holds as BIGINT,
DECIMAL or DOUBLE, strings it escapes, names it orders, text it refuses."""


def _strict_json(draw: random.Random, depth: int = 0) -> str:
    """Random JSON as ``parse_json`` reads it, its items from a few values so that many are equal."""
    kind = draw.choice(["object", "array"] * (depth < 3) + ["scalar"] * 3)
    space = draw.choice(["", "", " ", "\n"])
    if kind == "object":
        names = draw.sample(["a", "b", "é", "😀", "\ue000", "A"], draw.randint(0, 4))
        return "{" + ",".join(f'{space}"{n}"{space}:{_strict_json(draw, depth + 1)}' for n in names) + "}"
    if kind == "array":
        return "[" + ",".join(space + _strict_json(draw, depth + 1) for _ in range(draw.randint(0, 4))) + "]"
    return draw.choice(_SCALARS)


_SCALARS = ['"a"', '"😀"', '""', '"1"', "1", "0", "-1", "1.0", "1.5", "1.50", "15e-1", "1e0", "true", "false", "null",
            "9223372036854775807", "1e20", "100000000000000000000", "-0.0"]


def test_json_items_records_concat_and_array_contains_read_json_as_sparks_variant(spark: SparkSession) -> None:
    """JSON_ITEMS, JSON_RECORDS, JSON_CONCAT and JSON_ARRAY_CONTAINS over JSON at VARIANT's edges,
    random JSON and broken text, looking for values of every type they take: Python reads and
    writes the text as Spark's ``parse_json`` and ``to_json`` of a VARIANT do (an item found, and
    texts joined, as Spark finds and joins them)."""
    draw = random.Random(43)
    texts: list[str | None] = [*(f"[{t}]" for t in _VARIANT_EDGES), *_VARIANT_EDGES,
                               *(f'{{"k":{t}, "j": 1}}' for t in _VARIANT_EDGES), "[" * 1000 + "]" * 1000,
                               "[" * 1001 + "]" * 1001, *(_strict_json(draw) for _ in range(300)), *_json_texts(draw)[:200],
                               *("[" + ",".join(draw.choices(_SCALARS, k=draw.randint(1, 8))) + "]" for _ in range(300)),
                               None]
    columns = Scope("T", {"S": ast.SqlType("VARCHAR"), "V": ast.SqlType("VARCHAR"), "I": ast.SqlType("BIGINT"),
                          "N": ast.SqlType("INT"), "D": ast.SqlType("DOUBLE"), "B": ast.SqlType("BOOLEAN")})
    calls = ["JSON_ITEMS(s)", "JSON_RECORDS(s)", "JSON_ARRAY_CONTAINS(s, v)", "JSON_ARRAY_CONTAINS(s, i)",
             "JSON_ARRAY_CONTAINS(s, n)", "JSON_ARRAY_CONTAINS(s, d)", "JSON_ARRAY_CONTAINS(s, b)",
             "JSON_ARRAY_CONTAINS(s, NULL)", "JSON_ARRAY_CONTAINS(s, CAST(NULL AS DOUBLE))", "JSON_ITEMS(s)[1]",
             "JSON_CONCAT(s)", "JSON_CONCAT(s, v)", "JSON_CONCAT(s, '{\"a\": 1.50, \"z\": [1e2]}', s)", "JSON_CONCAT(s, '[]')",
             "JSON_CONCAT(JSON_RECORDS(s)['k'], s, '{}')"]
    exprs = [with_widths(expression(call), columns) for call in calls]
    rows = [(text, draw.choice(["a", "😀", "", "1", None]), draw.choice([1, 0, -1, 2**63 - 1, None]),
             draw.choice([1, 0, None]), draw.choice([1.5, 1.0, 0.0, -0.0, 1e20, math.inf, math.nan, None]),
             draw.choice([True, False, None])) for text in texts]
    assert differing_from_spark(spark, calls, exprs, columns, rows) == []
    answers = {call: [evaluate(e, dict(zip(columns.schema, row, strict=True))) for row in rows]
               for call, e in zip(calls, exprs, strict=True)}
    assert sum(1 for items in answers["JSON_ITEMS(s)"] if items) > 80
    assert sum(1 for records in answers["JSON_RECORDS(s)"] if records) > 50
    assert sum(1 for joined in answers["JSON_CONCAT(s, '{\"a\": 1.50, \"z\": [1e2]}', s)"] if joined and joined[0] == "{") > 30
    assert sum(1 for joined in answers["JSON_CONCAT(s, '[]')"] if joined) > 300
    assert all(answers[call].count(True) > 10 for call in calls[2:7]), {c: answers[c].count(True) for c in calls[2:7]}
    assert evaluate(expression("""JSON_ITEMS('[1.50, "a", {"b": 1, "a": [1e2, 1.0]}] x')"""), {}) == [
        "1.5", '"a"', '{"a":[100.0,1],"b":1}']
    assert evaluate(expression("""JSON_RECORDS('{"z": 10.00, "a": null}')"""), {}) == {"a": "null", "z": "10"}
    contains = [with_widths(expression(f"JSON_ARRAY_CONTAINS('[1, 2.5, \"x\", null, true]', {v})"), NO_COLUMNS)
                for v in ("1", "2.5E0", "'x'", "NULL", "true", "CAST(1 AS DOUBLE)", "'1'")]
    assert [evaluate(e, {}) for e in contains] == [True, True, True, True, True, False, False]
    assert evaluate(expression("""JSON_CONCAT('{"b": 1, "a": 2}', '{"a": 3.50}')"""), {}) == '{"a":3.5,"b":1}'
    assert evaluate(expression("""JSON_CONCAT('[1]', '2', '{}', 'null')"""), {}) == "[1,2,{},null]"
    assert evaluate(expression("""JSON_CONCAT('[1]', 'oops')"""), {}) is None


@pytest.mark.parametrize("call, message", [
    ("JSON_ARRAY_CONTAINS(s, 1.5)", "1.5 is DECIMAL(2, 1): CAST it AS DOUBLE, as in JSON_ARRAY_CONTAINS(S, CAST(1.5 AS DOUBLE))"),
    ("JSON_ARRAY_CONTAINS(s, ARRAY[1])", "looks for a VARCHAR, BOOLEAN, INT, BIGINT or DOUBLE value in the JSON array; "
                                         "ARRAY[1] is ARRAY<INT>"),
])
def test_json_array_contains_refuses_a_value_json_does_not_hold(call: str, message: str) -> None:
    with pytest.raises(StatementError, match=re.escape(message)):
        check(expression(call), Scope("T", {"S": ast.SqlType("VARCHAR")}))


@pytest.mark.parametrize("path, message", [
    ("$.*", "is not a step"), ("$['*']", "Spark's wildcard"), ("$[*]", "is not a step"), ("$. a", "is not a step"),
    ("a", "a path starts with $"), ("$..a", "is not a step"),
])
def test_a_json_path_millpond_does_not_follow_as_spark_is_refused(path: str, message: str) -> None:
    with pytest.raises(StatementError, match=re.escape(message)):
        check(expression(f"EXTRACTJSONFIELD(s, '{path.replace(chr(39), chr(39) * 2)}')"), Scope("T", {"S": ast.SqlType("VARCHAR")}))


@pytest.mark.parametrize("text", ["MASK(s, 'XY')", "MASK(s, s)", "MASK(s, '😀')"])
def test_a_mask_by_other_than_one_character_written_as_it_is_is_refused(text: str) -> None:
    with pytest.raises(StatementError, match="MASK's replacement characters must each be one character"):
        check(expression(text), Scope("T", {"S": ast.SqlType("VARCHAR")}))


def test_integer_arithmetic_that_overflows_wraps_as_sparks(spark: SparkSession) -> None:
    """INT and BIGINT arithmetic past their range wraps in Spark outside ANSI mode; typed
    (``with_widths``, as every plan Python evaluates is), Python's does the same, so a pull or
    a push of ``v * 3`` gives the persistent query's value, not a number no BIGINT holds."""
    columns = Scope("T", {"I": ast.SqlType("INT"), "B": ast.SqlType("BIGINT")})
    row = {"I": 2**31 - 1, "B": 2**63 - 1}
    texts = ["i * 1000000", "i + 1", "-(i + 1)", "b * 3", "b + b", "b - (-b) - 1", "-(b + 1)", "i * 2 + b",
             "(b + 1) / -1", "i * 3 % 7", "i + 1.5", "ABS(i + 1)", "ABS(b + 1)", "ABS(-i)", "ABS(i + 1) + 0.5",
             "ROUND(b, -1)", "ROUND(i, -1)", "ROUND(-b - 1, -2)", "ROUND(i, -9)"]
    exprs = [with_widths(expression(text), columns) for text in texts]
    spark_row = spark.createDataFrame([(row["I"], row["B"])], "I INT, B BIGINT").selectExpr(
        *(to_spark(e, columns) for e in exprs)).collect()[0]
    assert dict(zip(texts, (evaluate(e, row) for e in exprs), strict=True)) == dict(zip(texts, spark_row, strict=True))
    assert evaluate(exprs[3], row) == 2**63 - 3  # not 3 * (2^63 - 1)
    assert evaluate(exprs[12], row) == -(2**63)  # ABS of the least BIGINT is itself, as Java's Math.abs


@pytest.mark.parametrize("d", [1e19, -1e19, math.nan, math.inf, -math.inf, 2.5, -2.5])
def test_floor_and_ceil_of_a_double_past_bigint_are_its_nearest_bound_as_sparks(spark: SparkSession, d: float) -> None:
    """FLOOR and CEIL of a DOUBLE are BIGINT: Spark's ``(long)`` cast of the result saturates
    (NaN is 0); Python's unbounded int ended a push stream in protobuf, and NaN and the
    infinities gave NULL."""
    columns = Scope("T", {"D": ast.SqlType("DOUBLE")})
    texts = ["FLOOR(d)", "CEIL(d)"]
    exprs = [with_widths(expression(text), columns) for text in texts]
    spark_row = spark.createDataFrame([(d,)], "D DOUBLE").selectExpr(*(to_spark(e, columns) for e in exprs)).collect()[0]
    assert [evaluate(e, {"D": d}) for e in exprs] == list(spark_row)


@pytest.mark.parametrize("d", [1e19, -1e19, math.nan, math.inf, 3.7, -3.7, 2.0**31 + 0.5])
def test_casts_to_int_and_bigint_wrap_or_saturate_as_sparks(spark: SparkSession, d: float) -> None:
    """Outside ANSI mode Spark casts a wider integer to INT by its low 32 bits (Java's), and a
    DOUBLE by truncating and saturating (NaN is 0); Python gave NULL for both past the range."""
    columns = Scope("T", {"I": ast.SqlType("INT"), "B": ast.SqlType("BIGINT"), "D": ast.SqlType("DOUBLE")})
    row = {"I": 2**31 - 1, "B": 2**63 - 1, "D": d}
    texts = ["CAST(b AS INT)", "CAST(b - 5000000000 AS INT)", "CAST(d AS INT)", "CAST(d AS BIGINT)",
             "CAST(i AS BIGINT)", "CAST('12' AS INT)"]
    exprs = [with_widths(expression(text), columns) for text in texts]
    spark_row = spark.createDataFrame([(row["I"], row["B"], d)], "I INT, B BIGINT, D DOUBLE").selectExpr(
        *(to_spark(e, columns) for e in exprs)).collect()[0]
    assert dict(zip(texts, (evaluate(e, row) for e in exprs), strict=True)) == dict(zip(texts, spark_row, strict=True))


def test_bigints_for_int_parameters_and_decimals_cast_to_integers_keep_their_low_bits_as_sparks(spark: SparkSession) -> None:
    """Spark takes SUBSTRING's, LPAD's, RPAD's and ROUND's places as an INT, casting a BIGINT
    to its low 32 bits, and a DECIMAL cast to INT or BIGINT is its whole part's low bits (a
    DOUBLE's saturates). Python took the BIGINT whole and saturated the DECIMAL as a DOUBLE, so
    ``SUBSTRING(s, - -2147483648)`` or ``CAST(GREATEST(7.00, b) AS INT)`` at a pull was not the
    persistent query's value (both found by random expressions of other seeds)."""
    texts = ["SUBSTRING('abcdef', 4294967298, 4294967298)", "SUBSTRING('abcdef', 2, 4294967295)", "SUBSTRING('abc', - -2147483648)",
             "LPAD('ab', 4294967299, 'x')", "RPAD('ab', -4294967293, 'x')", "ROUND(1234, 4294967295)", "ROUND(2.5E0, 4294967297)",
             "CAST(CAST('1e20' AS DECIMAL(38, 0)) AS BIGINT)", "CAST(CAST('1e20' AS DECIMAL(38, 0)) AS INT)",
             "CAST(CAST(-2.7 AS DECIMAL(6, 2)) AS INT)", "CAST(CAST('4294967296.5' AS DECIMAL(20, 2)) AS INT)",
             "CAST(CAST('-4294967297.9' AS DECIMAL(20, 2)) AS INT)", "CAST(CAST('9223372036854775808' AS DECIMAL(20, 0)) AS BIGINT)",
             "CAST(CAST('2147483648' AS DECIMAL(12, 2)) AS INT)", "CAST(GREATEST(CAST(7 AS DECIMAL(6, 2)), 1000000000000) AS INT)"]
    exprs = [with_widths(expression(text), NO_COLUMNS) for text in texts]
    assert dict(zip(texts, (evaluate(e, {}) for e in exprs), strict=True)) == dict(zip(texts, as_spark(spark, exprs), strict=True))


def test_strings_casts_and_null_logic_answer_as_spark(spark: SparkSession) -> None:
    """SUBSTRING's positions 0 and before the start, TRIM of spaces only, text read as an integer
    (digits, a fraction dropped; exponents and underscores NULL) or a BOOLEAN (Spark's words), IN
    and BETWEEN with a NULL (three-valued, as Spark), and % of an infinity (NaN, where Python's
    fmod raised and a pull failed with INTERNAL)."""
    texts = ["SUBSTRING('abc', 0, 2)", "SUBSTRING('abc', 0)", "SUBSTRING('abc', -5, 3)", "SUBSTRING('abc', -5, 2)",
             "SUBSTRING('abc', 2)", "SUBSTRING('abc', -1)", "SUBSTRING('abc', 4)", "SUBSTRING('abc', 2, -1)",
             "TRIM('\t x\n ')", "LTRIM('  x ')", "RTRIM(' x  ')",
             "CAST('9007199254740993' AS BIGINT)", "CAST('9223372036854775807' AS BIGINT)", "CAST(' 12.9 ' AS INT)",
             "CAST('1e3' AS INT)", "CAST('1_000' AS INT)", "CAST('+7' AS INT)", "CAST('5.' AS INT)",
             "CAST('2147483648' AS INT)", "CAST('abc' AS INT)",
             "CAST('yes' AS BOOLEAN)", "CAST(' T ' AS BOOLEAN)", "CAST('1' AS BOOLEAN)", "CAST('no' AS BOOLEAN)",
             "CAST('0' AS BOOLEAN)", "CAST('maybe' AS BOOLEAN)",
             "2 IN (1, NULL)", "2 NOT IN (1, NULL)", "1 IN (1, NULL)", "1 NOT IN (1, NULL)",
             "2 BETWEEN NULL AND 1", "2 NOT BETWEEN NULL AND 1", "0 BETWEEN NULL AND 1", "0 NOT BETWEEN 1 AND NULL",
             "CAST('Infinity' AS DOUBLE) % 2.0"]
    exprs = [with_widths(expression(text), NO_COLUMNS) for text in texts]
    python = [evaluate(e, {}) for e in exprs]
    spark_values = as_spark(spark, exprs)
    assert str(dict(zip(texts, python, strict=True))) == str(dict(zip(texts, spark_values, strict=True)))


def test_nan_compares_as_in_spark(spark: SparkSession) -> None:
    """Spark's NaN is equal to itself and above every number, in comparisons, IN, BETWEEN,
    GREATEST and LEAST; Python's (as Java's) is neither, so a pull's or a push's WHERE kept
    other rows than the persistent query's filter over the same values."""
    columns = Scope("T", {"D": ast.SqlType("DOUBLE"), "E": ast.SqlType("DOUBLE"), "Z": ast.SqlType("DOUBLE")})
    texts = ["d = d", "d != d", "d > e", "d < e", "d >= e", "e <= d", "d = e", "d > CAST('Infinity' AS DOUBLE)",
             "d IN (1.0, d)", "d NOT IN (e)", "e IN (d)", "d BETWEEN e AND d", "e BETWEEN d AND d",
             "GREATEST(e, d)", "GREATEST(d, e)", "LEAST(d, e)", "LEAST(e, d)", "CASE WHEN d > 1e300 THEN 'big' END",
             "e < e", "e = 1.0", "LN(d)", "SIGN(d)", "SIGN(z)", "CAST(SIGN(z) AS VARCHAR)", "z = 0.0", "z < 0.0",
             "CAST(z AS VARCHAR)"]
    exprs = [with_widths(expression(text), columns) for text in texts]
    spark_row = spark.createDataFrame([(math.nan, 1.0, -0.0)], "D DOUBLE, E DOUBLE, Z DOUBLE").selectExpr(
        *(to_spark(e, columns) for e in exprs)).collect()[0]
    python = [evaluate(e, {"D": math.nan, "E": 1.0, "Z": -0.0}) for e in exprs]
    assert str(dict(zip(texts, python, strict=True))) == str(dict(zip(texts, spark_row, strict=True)))


def test_a_double_as_text_is_written_as_sparks_cast(spark: SparkSession) -> None:
    """CAST of a DOUBLE to VARCHAR writes Java's ``Double.toString`` in Spark (``1.0E20``,
    ``1.5E-4``, ``100.0``); Python wrote its own (``1e+20``, ``0.00015``, ``100.0``), so a pull's
    or a push's text of a number was not the persistent query's."""
    draw = random.Random(11)
    values = [100.0, 0.001, 1e7, 9999999.0, 1e20, 1.5e-4, 0.0009, -2.5, 0.1, 1e22, 12345678.9, 1234567.0, -0.0,
              0.0, 1.7976931348623157e308, 2.0**-1022, math.nan, math.inf, -math.inf, 123.456, 1e-3 - 1e-19,
              *(draw.uniform(-1, 1) * 10 ** draw.randint(-12, 12) for _ in range(300)),
              *(float(draw.randint(-10**9, 10**9)) for _ in range(50))]
    columns = Scope("T", {"D": ast.SqlType("DOUBLE")})
    cast = with_widths(expression("CAST(d AS VARCHAR)"), columns)
    rows = spark.createDataFrame([(v,) for v in values], "D DOUBLE").selectExpr(to_spark(cast, columns)).collect()
    assert {repr(v): evaluate(cast, {"D": v}) for v in values} == {repr(v): row[0] for v, row in zip(values, rows, strict=True)}


def test_a_number_literal_as_text_is_written_as_spark_reads_it(spark: SparkSession) -> None:
    """Spark reads a literal written with a point and no exponent as a DECIMAL (its digits as
    written), one with an exponent as a DOUBLE (Java's text)."""
    texts = ["CAST(0.0001 AS VARCHAR)", "CAST(10000000.0 AS VARCHAR)", "CAST(-0.0001 AS VARCHAR)", "CAST(1e20 AS VARCHAR)",
             "CAST(1.5 AS VARCHAR)", "CAST(1e-4 AS VARCHAR)", "CAST(-(2.5) AS VARCHAR)", "CAST(1E300 AS VARCHAR)"]
    exprs = [with_widths(expression(text), NO_COLUMNS) for text in texts]
    assert dict(zip(texts, (evaluate(e, {}) for e in exprs), strict=True)) == dict(zip(texts, as_spark(spark, exprs), strict=True))


def test_a_case_or_greatest_that_picks_an_integer_gives_the_double_it_is_typed_as_spark(spark: SparkSession) -> None:
    """A CASE, GREATEST, LEAST, COALESCE or IFNULL over an INT or BIGINT and a DOUBLE is a
    DOUBLE; Spark's analyzer casts the integer, so the picked 3 is 3.0. Python's gave the int 3:
    a pull's row sent it as an integer in a DOUBLE column, and its text was ``3``, not ``3.0``."""
    columns = Scope("T", {"I": ast.SqlType("INT"), "B": ast.SqlType("BIGINT"), "D": ast.SqlType("DOUBLE")})
    row = {"I": 3, "B": 5, "D": 2.5}
    texts = ["GREATEST(i, d)", "LEAST(b, d, i)", "COALESCE(i, d)", "IFNULL(b, d)", "CASE WHEN i > 0 THEN i ELSE d END",
             "CASE WHEN i < 0 THEN d WHEN i > 0 THEN b END", "CASE WHEN i > 0 THEN b ELSE i END",
             "CAST(GREATEST(i, d) AS VARCHAR)", "CAST(CASE WHEN i > 0 THEN i ELSE d END AS VARCHAR)",
             "CAST(COALESCE(b, d) AS VARCHAR)", "GREATEST(i, b)"]
    exprs = [with_widths(expression(text), columns) for text in texts]
    spark_row = spark.createDataFrame([(row["I"], row["B"], row["D"])], "I INT, B BIGINT, D DOUBLE").selectExpr(
        *(to_spark(e, columns) for e in exprs)).collect()[0]
    python = [evaluate(e, row) for e in exprs]
    assert dict(zip(texts, python, strict=True)) == dict(zip(texts, spark_row, strict=True))
    assert [type(v) for v in python] == [type(v) for v in spark_row]  # 3.0 == 3 in Python: the types too
    assert python[0] == 3.0 and python[7] == "3.0"
    # A literal DOUBLE beside an INT: Spark reads 2.5 as a DECIMAL, the result a DECIMAL; Python's a float of it.
    greatest = with_widths(expression("GREATEST(i, 2.5)"), columns)
    assert type(evaluate(greatest, row)) is float and evaluate(greatest, row) == 3.0


DECIMALS = Scope("T", {"A": ast.SqlType("DECIMAL", (5, 2)), "B": ast.SqlType("DECIMAL", (5, 2)),
                       "T": ast.SqlType("DECIMAL", (10, 8)), "W": ast.SqlType("DECIMAL", (38, 10)), "I": ast.SqlType("INT"),
                       "L": ast.SqlType("BIGINT"), "D": ast.SqlType("DOUBLE")})
DECIMAL_ROW = {"A": 1.5, "B": 999.99, "T": 1e-8, "W": 123.0, "I": 2, "L": 3, "D": 2.5}


def _decimal_frame(spark: SparkSession) -> Any:
    return spark.createDataFrame([tuple(Decimal(repr(v)) if isinstance(v, float) and k != "D" else v
                                        for k, v in DECIMAL_ROW.items())],
                                 "A DECIMAL(5,2), B DECIMAL(5,2), T DECIMAL(10,8), W DECIMAL(38,10), I INT, L BIGINT, D DOUBLE")


def test_decimal_arithmetic_is_typed_as_sparks(spark: SparkSession) -> None:
    """A DECIMAL expression's precision and scale are Spark's (``DecimalPrecision``: a product
    has both operands' digits, a quotient at least 6 places, past 38 digits the whole digits
    kept; an integer literal its own digits, an INT 10). They were the first DECIMAL operand's,
    so ``b * 2`` of a DECIMAL(5, 2) 999.99 did not fit its declared type: a table reading the
    sink set it aside, where Spark's own result fit."""
    texts = ["a * a", "a + b", "a - b", "a / b", "b % a", "a * i", "a + l", "a * d", "-a", "b * 2", "a / 3", "a * -5",
             "a + NULL", "w * w", "w / a", "w + w", "a / w", "w % a", "GREATEST(a, i)", "GREATEST(a, 2)", "COALESCE(a, l)",
             "CASE WHEN i > 0 THEN a ELSE 7 END", "IFNULL(t, a)", "LEAST(a, t, w)", "ABS(a)", "ROUND(a)", "ROUND(a, 1)",
             "ROUND(a, -1)", "ROUND(a, 5)", "ROUND(a, 1 + 1)", "ROUND(a, -(1 * 2))", "FLOOR(a)", "CEIL(t)", "FLOOR(w)",
             "(a + i) * (b - 2)"]
    exprs = [with_widths(expression(text), DECIMALS) for text in texts]
    schema = _decimal_frame(spark).selectExpr(*(to_spark(e, DECIMALS) for e in exprs)).schema
    ours = {text: str(check(e, DECIMALS)).replace(" ", "").lower() for text, e in zip(texts, exprs, strict=True)}
    assert ours == {text: f.dataType.simpleString() for text, f in zip(texts, schema.fields, strict=True)}
    summed = _decimal_frame(spark).selectExpr("sum(a)").schema.fields[0].dataType.simpleString()
    assert str(aggregates.require("SUM").result_type(DECIMALS.schema["A"])).replace(" ", "").lower() == summed


def test_decimal_values_and_their_text_are_sparks(spark: SparkSession) -> None:
    """Python's DECIMAL arithmetic is exact and rounded half up to its type's scale, NULL past
    its precision; a CAST to DECIMAL rounds and checks as well, and a DECIMAL's text has its
    scale's digits (``1.50``, ``1E-8``, as Java's BigDecimal). Python's were a float's: 1.5,
    ``0.30000000000000004``, a CAST that kept 1.555 in a DECIMAL(5, 2)."""
    texts = ["a * a", "a / b", "b % a", "a / 3", "w / a", "b * 2", "CAST(a AS VARCHAR)", "CAST(a * a AS VARCHAR)",
             "CAST(t AS VARCHAR)", "CAST(t * t AS VARCHAR)", "CAST(a / b AS VARCHAR)", "CAST(w AS VARCHAR)", "CAST(b * b AS VARCHAR)",
             "CAST(a - a AS VARCHAR)", "CAST(FLOOR(a) AS VARCHAR)", "CAST(ROUND(b, 1) AS VARCHAR)", "CAST(GREATEST(a, i) AS VARCHAR)",
             "CAST(a / 3 AS VARCHAR)", "CAST('1.555' AS DECIMAL(5, 2))", "CAST('abc' AS DECIMAL(5, 2))",
             "CAST('1_0' AS DECIMAL(5, 2))",
             "CAST(1000 AS DECIMAL(5, 2))", "CAST(d AS DECIMAL(5, 2))", "CAST(CAST(-0.001 AS DECIMAL(5, 2)) AS VARCHAR)",
             "CAST(' 2.5e1 ' AS DECIMAL(5, 2))", "CAST(TRUE AS DECIMAL(5, 2))", "b * b * b * b * b * b * b * b", "a / (a - a)",
             "CAST(CAST(0.1 AS DECIMAL(3, 1)) * 3 AS VARCHAR)", "FLOOR(a)"]
    exprs = [with_widths(expression(text), DECIMALS) for text in texts]
    spark_row = _decimal_frame(spark).selectExpr(*(to_spark(e, DECIMALS) for e in exprs)).collect()[0]
    python = [evaluate(e, DECIMAL_ROW) for e in exprs]
    # A DECIMAL is a float in Python, as a table's stores keep it.
    expected = [float(v) if isinstance(v, Decimal) else v for v in spark_row]
    assert dict(zip(texts, python, strict=True)) == dict(zip(texts, expected, strict=True))
    assert [type(v) for v in python] == [type(v) for v in expected]
    assert python[6] == "1.50" and python[8] == "1E-8" and python[28] == "0.3"


CONSTRUCTORS = [
    "ARRAY[i, l]", "ARRAY[i, d, NULL]", "ARRAY[i, m]", "ARRAY[m, 2.5]", "ARRAY[t, 'x', NULL]", "ARRAY[a, a]",
    "ARRAY[STRUCT(x := i, y := t), STRUCT(x := 7, y := 'z')]", "ARRAY[i, 2][2]", "ARRAY_LENGTH(ARRAY[a, NULL])",
    "MAP(t := i, 'k' := l)", "MAP(t := i, t := 5, 'k' := 6)", "MAP(i := d, 1 := 2)", "MAP('a' := ARRAY[i], 'b' := a)",
    "MAP(b := t)", "MAP(t := m, 'z' := 1)['z']", "MAP_KEYS(MAP(l := t))",
    "STRUCT(a := i, b := ARRAY[t], c := MAP(t := m))", "STRUCT(a := i, `Mixed` := d)->`Mixed`", "STRUCT(n := NULL + i)",
]
"""ksqlDB's ARRAY[...], MAP(k := v) and STRUCT(f := v): items of types that widen (INT, BIGINT,
DOUBLE, DECIMAL), NULL items, NULL and repeated MAP keys, nested constructors, subscripts."""


def test_array_map_and_struct_constructors_answer_as_spark(spark: SparkSession) -> None:
    # A NULL MAP key's entry is left out (Spark's map() would fail the batch), a key given twice
    # keeps its last value; items of several numeric types are cast to the type they widen to.
    draw = random.Random(5)
    rows = [(draw.choice([None, 0, -7, 2**31 - 1]), draw.choice([None, 3, -(2**63)]), draw.choice([None, 0.5, -1e300]),
             draw.choice([None, 1.25, -999.99]), draw.choice([None, "a", "k", ""]), draw.choice([None, [], [1, None, 3]]),
             draw.choice([None, True, False]))
            for _ in range(60)]
    columns = Scope("T", {"I": ast.SqlType("INT"), "L": ast.SqlType("BIGINT"), "D": ast.SqlType("DOUBLE"),
                          "M": ast.SqlType("DECIMAL", (5, 2)), "T": ast.SqlType("VARCHAR"),
                          "A": ast.SqlType("ARRAY", (ast.SqlType("INT"),)), "B": ast.SqlType("BOOLEAN")})
    exprs = [with_widths(expression(text), columns) for text in CONSTRUCTORS]
    frame = spark.createDataFrame([(*row[:3], None if row[3] is None else Decimal(repr(row[3])), *row[4:]) for row in rows],
                                  "I INT, L BIGINT, D DOUBLE, M DECIMAL(5, 2), T STRING, A ARRAY<INT>, B BOOLEAN")
    names = list(columns.schema)
    results = frame.selectExpr(*(f"{to_spark(e, columns)} AS c{i}" for i, e in enumerate(exprs)))
    assert [spark_type_name(f.dataType).replace(":", " ") for f in results.schema.fields] == [
        str(check(e, columns)) for e in exprs]
    differing = [(row, text, python, answer[i]) for row, answer in zip(rows, results.collect(), strict=True)
                 for i, (text, e) in enumerate(zip(CONSTRUCTORS, exprs, strict=True))
                 if not _alike(python := evaluate(e, dict(zip(names, row, strict=True))), _plain(answer[i]))]
    assert differing == []


@pytest.mark.parametrize(("text", "error"), [
    ("ARRAY[]", "ARRAY[] needs at least one item"), ("MAP()", "MAP() needs at least one entry"),
    ("ARRAY[NULL, NULL]", "NULL alone has no type; give it one, CAST(NULL AS INT)"),
    ("ARRAY[1, 'a']", "ARRAY[...]'s items have different types: 1 is INT, 'a' is VARCHAR"),
    ("MAP(1.5 := 1)", "MAP(...)'s keys must be BIGINT, BOOLEAN, INT, VARCHAR, not DECIMAL(2, 1)"),
    ("STRUCT(a := 1, a := 2)", "STRUCT(...) names the field A twice"), ("STRUCT()", "STRUCT() needs at least one field"),
])
def test_a_constructor_without_one_type_is_refused(text: str, error: str) -> None:
    with pytest.raises(StatementError, match=re.escape(error)):
        check(expression(text), NO_COLUMNS)


def differing_from_spark(spark: SparkSession, texts: list[str], exprs: list[ast.Expr], columns: Scope,
                         rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Each expression over ``rows`` of ``columns`` in Python and in Spark (its type Spark's too,
    asserted): (row, text, Python's, Spark's) where the values differ."""
    schema = ", ".join(f"{quote_identifier(name)} {spark_type(type_)}" for name, type_ in columns.schema.items())
    results = spark.createDataFrame(rows, schema).selectExpr(*(f"{to_spark(e, columns)} AS c{i}" for i, e in enumerate(exprs)))
    assert [spark_type_name(f.dataType) for f in results.schema.fields] == [str(check(e, columns)) for e in exprs]
    return [(row, text, python, answer[i]) for row, answer in zip(rows, results.collect(), strict=True)
            for i, (text, e) in enumerate(zip(texts, exprs, strict=True))
            if not same(python := evaluate(e, dict(zip(columns.schema, row, strict=True))), answer[i])]


def test_elt_field_uuid_nullif_and_random_answer_as_sparks(spark: SparkSession) -> None:
    """ksqlDB's ELT (NULL out of range, a BIGINT place taking its low 32 bits as Spark's INT
    parameter), FIELD (0 for none and for NULL, NULLs among the texts never matching), UUID,
    NULLIF (NaN equal to NaN, an INT beside a DOUBLE compared as a DOUBLE) and RANDOM."""
    texts = ["ELT(i, a, b)", "ELT(l, a, b, 'c')", "ELT(1, NULL, a)", "FIELD(a, b, 'x', a)", "FIELD(a, NULL)",
             "FIELD(NULL, a, b)", "FIELD(b, a, NULL, b)", "LEN(UUID())", "NULLIF(a, b)", "NULLIF(i, 1)", "NULLIF(d, i)",
             "NULLIF(d, d)", "NULLIF(l, d)", "NULLIF(i, NULL)", "RANDOM() >= 0 AND RANDOM() < 1"]
    draw = random.Random(3)
    rows = [(draw.choice([None, -1, 0, 1, 2, 3]), draw.choice([None, 1, 2**32 + 2, -(2**32) + 1]),
             draw.choice([None, "x", "y", ""]), draw.choice([None, "x", "z"]), draw.choice([None, 1.0, 2.5, math.nan]))
            for _ in range(60)]
    columns = Scope("T", {"I": ast.SqlType("INT"), "L": ast.SqlType("BIGINT"), "A": ast.SqlType("VARCHAR"),
                          "B": ast.SqlType("VARCHAR"), "D": ast.SqlType("DOUBLE")})
    exprs = [with_widths(expression(text), columns) for text in texts]
    assert differing_from_spark(spark, texts, exprs, columns, rows) == []
    made = evaluate(expression("UUID()"), {})
    assert re.fullmatch("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", made)
    assert made != evaluate(expression("UUID()"), {})


def test_split_to_map_chr_and_url_params_answer_as_sparks(spark: SparkSession) -> None:
    """ksqlDB's SPLIT_TO_MAP (empty entries and those without the pair delimiter left out, a key's
    last value kept, a value up to the next pair delimiter, delimiters taken as they are, NULL for
    an empty one or the two the same), CHR (NULL outside the code points and for a surrogate, a
    BIGINT's low 32 bits; of text, its ``\\uXXXX`` escapes, a pair of halves one character, any
    other text NULL), URL_ENCODE_PARAM and URL_DECODE_PARAM as Java's ``URLEncoder`` and
    ``URLDecoder`` (a sign or a digit of another script in an escape, bytes that are no UTF-8, a
    ``%`` without a byte, a digit beyond the BMP, two UTF-16 units to Java: NULL). The columns are
    named as the lambda variables of the Spark SQL (which reads no argument inside a lambda)."""
    texts = ["SPLIT_TO_MAP(a, millpond_value, millpond_item)", "CHR(i)", "CHR(l)", "URL_ENCODE_PARAM(a)",
             "URL_DECODE_PARAM(a)", "URL_DECODE_PARAM(URL_ENCODE_PARAM(a))", "TO_JSON_STRING(millpond_value)",
             "CHR(LEN(millpond_item) + i)", "CHR(a)", "CHR(millpond_value)"]
    draw = random.Random(7)
    pieces = ["a", "=", ",", "", ".*", "\\E", "k", "é", "😀", "+", "%", "%41", "%c3%A9", "%+4", "%-1", "%-0", "%\uff14\uff11",
              "%F0%9F", "%ZZ", " ", "~", "*", "/", "%C3", "%e2%82%ac", "\U0001d7cf", "%4"]
    rows = [("".join(draw.choice(pieces) for _ in range(draw.randint(0, 8))), draw.choice([None, ",", "", "=", ".*", "\\E"]),
             draw.choice([None, "=", "", ",", "+"]), draw.choice([None, 0, 65, 233, 0xD800, 0xDFFF, 0xE000, 0xFFFF, 0x10000,
                                                                 0x1F600, 0x10FFFF, 0x110000, -1]),
             draw.choice([None, 2**32 + 75, -(2**32) + 0x1F600, 2**40])) for _ in range(150)]
    rows += [("a=1,,b=2=3,c,a=4,=5", ",", "=", 75, 75), (None, ",", "=", None, None)]
    escapes = ["\\u004b", "\\u004B\\u00e9", "\\ud83d\\ude00", "\\uD83D\\uDE00x", "\\ud83d", "\\ude00\\ud83d", "\\u004",
               "\\u004bx", "x\\u004b", "\\uuuu004b", "\\U004b", "\\u00zz", "", "\\u0000", "\\uffff\\uE000", "\\u004b\n",
               "\\n", "\\u12345"]
    rows += [(text, draw.choice(escapes), None, None, None) for text in escapes]
    columns = Scope("T", {"A": ast.SqlType("VARCHAR"), "MILLPOND_VALUE": ast.SqlType("VARCHAR"),
                          "MILLPOND_ITEM": ast.SqlType("VARCHAR"), "I": ast.SqlType("INT"), "L": ast.SqlType("BIGINT")})
    exprs = [with_widths(expression(text), columns) for text in texts]
    assert differing_from_spark(spark, texts, exprs, columns, rows) == []
    assert evaluate(exprs[0], {"A": "a=1,,b=2=3,c,a=4,=5", "MILLPOND_VALUE": ",", "MILLPOND_ITEM": "="}) == {
        "a": "4", "b": "2", "": "5"}
    assert evaluate(exprs[4], {"A": "%-1"}) is None and evaluate(exprs[4], {"A": "%+41"}) == "\x041"
    assert evaluate(exprs[4], {"A": "%4\U0001d7cf"}) is None, "a digit beyond the BMP is two UTF-16 units to Java"
    assert [evaluate(exprs[8], {"A": text}) for text in escapes[:6]] == ["K", "Ké", "\U0001f600", None, None, None]
    # A lone UTF-16 half, which Spark's text holds as ``?``, is ``?`` here too.
    assert evaluate(exprs[3], {"A": "a\ud83d"}) == "a%3F" and evaluate(exprs[6], {"MILLPOND_VALUE": "a\ud83d"}) == '"a?"'
    # A value computed once, not once per place the Spark SQL reads it.
    once = [with_widths(expression(text), NO_COLUMNS) for text in ("TO_JSON_STRING(RANDOM())", "CHR(CAST(RANDOM() * 50000 AS INT))")]
    random_json, random_chr = as_spark(spark, once)
    assert 0 <= float(random_json) < 1 and len(random_chr or "x") == 1


def test_to_json_string_writes_values_as_sparks_to_json(spark: SparkSession) -> None:
    """TO_JSON_STRING of every type Millpond has, nested too, over random rows with NULLs: as Spark's
    ``to_json`` writes it (a DOUBLE as Java's text, NaN and the infinities quoted, a DECIMAL's
    digits to its scale and Java's ``1E-8``, a TIMESTAMP in milliseconds without a zone, BYTES in
    base64, a STRUCT's NULL fields written, text escaped as Jackson escapes it)."""
    draw = random.Random(41)
    doubles = [None, 0.0, -0.0, 1.5, 1e10, 1e-5, 123456789.0, math.nan, math.inf, -math.inf, 2.0**70]
    texts = [None, "", "x", 'a"b\\c', "\n\t\x01\x7f", "é😀", "/", "\u2028"]
    stamps = [None, "2024-03-10T02:30:00.123456", "0001-01-02T00:00:00", "9999-12-31T23:59:59.999999", "1970-01-01T00:00:00"]
    rows = [(draw.choice([None, 0, -1, 2**31 - 1]), draw.choice([None, 2**63 - 1, -(2**63)]), draw.choice(doubles),
             draw.choice([None, 0.0, -0.0, 1.25, -99999999.99, 0.01]), draw.choice([None, 0.0, 1e-8, 0.00000123, -0.5]),
             draw.choice(texts), draw.choice([None, True, False]), draw.choice(stamps),
             draw.choice([None, "2024-02-29", "0001-01-01"]), draw.choice([None, b"", b"\x00\xffab"]),
             draw.choice([None, [], [1, None, 3]]), draw.choice([None, {}, {"k": 1.5, "é": None}]),
             draw.choice([None, {"A": None, "B": None}, {"A": 1, "B": ["x", None]}]))
            for _ in range(80)]
    schema = ("I INT, L BIGINT, D DOUBLE, M DECIMAL(10,2), N DECIMAL(12,10), S STRING, B BOOLEAN, T TIMESTAMP, "
              "DT DATE, Y BINARY, A ARRAY<INT>, P MAP<STRING,DOUBLE>, R STRUCT<A:INT,B:ARRAY<STRING>>")
    columns = Scope("T", {"I": ast.SqlType("INT"), "L": ast.SqlType("BIGINT"), "D": ast.SqlType("DOUBLE"),
                          "M": ast.SqlType("DECIMAL", (10, 2)), "N": ast.SqlType("DECIMAL", (12, 10)),
                          "S": ast.SqlType("VARCHAR"), "B": ast.SqlType("BOOLEAN"), "T": ast.SqlType("TIMESTAMP"),
                          "DT": ast.SqlType("DATE"), "Y": ast.SqlType("BYTES"),
                          "A": ast.SqlType("ARRAY", (ast.SqlType("INT"),)),
                          "P": ast.SqlType("MAP", (ast.SqlType("VARCHAR"), ast.SqlType("DOUBLE"))),
                          "R": ast.SqlType("STRUCT", (("A", ast.SqlType("INT")),
                                                      ("B", ast.SqlType("ARRAY", (ast.SqlType("VARCHAR"),)))))})
    calls = [f"TO_JSON_STRING({name})" for name in columns.schema] + [
        "TO_JSON_STRING(NULL)", "TO_JSON_STRING(STRUCT(x := i, y := MAP(1 := d), z := ARRAY[t]))", "TO_JSON_STRING(MAP(TRUE := s))",
        "TO_JSON_STRING(TRANSFORM(a, e => TO_JSON_STRING(e)))", "TO_JSON_STRING(1.5E0)", "TO_JSON_STRING(CAST(-0.0 AS DECIMAL(3, 1)))"]
    exprs = [with_widths(expression(call), columns) for call in calls]
    spark_rows = [[Decimal(repr(v)) if name in ("M", "N") and v is not None else
                   datetime.datetime.fromisoformat(v) if name == "T" and v is not None else
                   datetime.date.fromisoformat(v) if name == "DT" and v is not None else v
                   for name, v in zip(columns.schema, row, strict=True)] for row in rows]
    frame = spark.createDataFrame(spark_rows, schema).selectExpr("P", *(to_spark(e, columns) for e in exprs))
    # A MAP's entries in the order Spark holds them, as Python reads them from what Spark wrote.
    differing = [(row, call, ours, theirs) for row, (held, *answer) in zip(rows, frame.collect(), strict=True)
                 for call, e, theirs in zip(calls, exprs, answer, strict=True)
                 if (ours := evaluate(e, {**dict(zip(columns.schema, row, strict=True)), "P": held})) != theirs]
    assert differing == []
    assert evaluate(exprs[-4], {"S": "x"}) == '{"true":"x"}'
    assert evaluate(exprs[-1], {}) == "0.0"
    written = {call: e for call, e in zip(calls, exprs, strict=True)}
    assert evaluate(written["TO_JSON_STRING(N)"], {"N": 1e-8}) == "1.00E-8"
    assert evaluate(written["TO_JSON_STRING(D)"], {"D": math.nan}) == '"NaN"'
    assert evaluate(written["TO_JSON_STRING(T)"], {"T": "2024-03-10T02:30:00.123456"}) == '"2024-03-10T02:30:00.123"'
    assert evaluate(written["TO_JSON_STRING(R)"], {"R": {"A": None, "B": None}}) == '{"A":null,"B":null}'
    assert evaluate(written["TO_JSON_STRING(S)"], {"S": None}) == "null"
    with pytest.raises(StatementError, match=re.escape("TO_JSON_STRING cannot write a TIME (Spark's to_json has none)")):
        check(expression("TO_JSON_STRING(ARRAY[c])"), Scope("T", {"C": ast.SqlType("TIME")}))


def test_cube_explode_makes_the_rows_ksqldb_makes_in_spark_and_in_python(spark: SparkSession) -> None:
    """CUBE_EXPLODE's rows (ksqlDB's order: the bit masks ascending, the first item the highest
    bit; a NULL item's combinations once; none for a NULL ARRAY) alike from Spark's SQL and from
    Python; past 20 items Spark fails the record (set aside) and Python says why."""
    rng = random.Random(5)
    arrays = [None, [], [1], [None], [1, 2], [1, None, 3], [None, None], [7, 7, 7]]
    arrays += [[rng.choice([None, *range(4)]) for _ in range(rng.randrange(7))] for _ in range(30)]
    frame = spark.createDataFrame([(a, 5) for a in arrays], "a ARRAY<INT>, m INT")
    got = [row[0] for row in frame.selectExpr(cube_in_spark("a")).collect()]
    assert [[list(r) for r in rows] if rows is not None else [] for rows in got] == [cube(a) for a in arrays]
    # Columns the ARRAY's expression reads keep their values inside its lambdas (M is no mask).
    (shifted,) = frame.limit(1).selectExpr(cube_in_spark("array(m, m + 1)")).collect()
    assert [list(r) for r in shifted[0]] == cube([5, 6])
    assert cube([1, 2]) == [[None, None], [None, 2], [1, None], [1, 2]]
    assert cube([1, None, 3]) == [[None, None, None], [None, None, 3], [1, None, None], [1, None, 3]]
    assert len(cube(list(range(20)))) == 2**20
    with pytest.raises(ValueError, match="at most 20 items"):
        cube(list(range(21)))
    with pytest.raises(Exception, match="at most 20 items") as caught:
        spark.createDataFrame([(list(range(21)),)], "a ARRAY<INT>").selectExpr(cube_in_spark("a")).collect()
    # A record's own failure: the query sets it aside to the processing log and goes on.
    assert query_runner.fails_on_a_record(caught.value)
    assert query_runner.record_failure(caught.value).startswith("CUBE_EXPLODE takes at most 20 items")
    # The ARRAY is evaluated once per record: every row of a combination has the same UUID.
    (rows,) = spark.range(1).selectExpr(cube_in_spark("array(uuid(), uuid())")).collect()
    assert len({r[1] for r in rows[0] if r[1] is not None}) == 1 and len({r[0] for r in rows[0] if r[0]}) == 1
    assert cubed_items(cube_in_spark("array(`A`, 1)")) == "array(`A`, 1)" and cubed_items("array(1)") is None


def test_geo_distance_answers_as_sparks_and_as_ksqldb(spark: SparkSession) -> None:
    """GEO_DISTANCE (ksqlDB's haversine distance, kilometres or miles) over random points and
    the edges, in Python and in Spark alike: NULL for a coordinate out of range, NaN for a NaN
    one, a distance within two units in the last place (Java's ``Math.asin`` is fdlibm's, which
    rounds about one result in twenty the other way from the C library's); and ksqlDB's own figures."""
    draw = random.Random(44)
    rows = [(draw.uniform(-90, 90), draw.uniform(-180, 180), draw.uniform(-90, 90), draw.uniform(-180, 180))
            for _ in range(300)]
    rows += [(0.0, 0.0, 0.0, 0.0), (90.0, 180.0, -90.0, -180.0), (0.0, 0.0, 0.0, 180.0), (45.0, 10.0, -45.0, -170.0),
             (90.5, 0.0, 0.0, 0.0), (0.0, -180.5, 0.0, 0.0), (math.nan, 0.0, 0.0, 0.0), (math.inf, 0.0, 0.0, 0.0),
             (None, 0.0, 0.0, 0.0), (-0.0, -0.0, 1e-300, 5e-324)]
    columns = Scope("T", {name: ast.SqlType("DOUBLE") for name in ("A", "B", "C", "D")})
    texts = ["GEO_DISTANCE(a, b, c, d)", "GEO_DISTANCE(a, b, c, d, ' Miles ')", "GEO_DISTANCE(a, b, c, d, '')",
             "GEO_DISTANCE(CAST(a AS DECIMAL(10, 4)), b, 1, CAST(d AS INT), 'KM')"]
    exprs = [with_widths(expression(text), columns) for text in texts]
    frame = spark.createDataFrame(rows, "A DOUBLE, B DOUBLE, C DOUBLE, D DOUBLE")
    differing = _differing(frame, rows, "ABCD", texts, columns, lambda ours, theirs: _exactly(ours) == _exactly(theirs) or (
        isinstance(ours, float) and isinstance(theirs, float) and abs(ours - theirs) <= 2 * math.ulp(theirs)))
    assert differing == []
    answers = [evaluate(exprs[0], dict(zip("ABCD", row, strict=True))) for row in rows[-10:]]
    assert answers[:4] == [0.0, 20015.086796020572, 20015.086796020572, 20015.086796020572]
    assert answers[4:6] == [None, None] and math.isnan(answers[6]) and answers[7:9] == [None, None]
    # Units as ksqlDB reads them: NULL is kilometres, the case is Java's lower case (the Kelvin sign's is k).
    same_units = [with_widths(expression(f"GEO_DISTANCE(a, b, c, d{units})"), columns)
                  for units in ("", ", NULL", ", '\u212aM'", ", ' \t MILES'")]
    point = dict(zip("ABCD", rows[0], strict=True))
    assert [evaluate(e, point) for e in same_units[:3]] == [evaluate(same_units[0], point)] * 3
    assert evaluate(same_units[3], point) == evaluate(exprs[1], point)
    assert as_spark(spark, [with_widths(expression(f"GEO_DISTANCE(1, 2, 3, 4{units})"), NO_COLUMNS)
                            for units in ("", ", NULL")]) == [evaluate(expression("GEO_DISTANCE(1, 2, 3, 4)"), {})] * 2
    with pytest.raises(StatementError, match="GEO_DISTANCE's units are a text literal"):
        check(expression("GEO_DISTANCE(a, b, c, d, 'm\u0131les')"), columns)
    # ksqlDB's own test figures (to half a unit): Palo Alto to London, London to Cape Town, Cape Town to Sydney.
    for points, km, miles in (("37.4439, -122.1663, 51.5257, -0.1122", 8634.6528, 5365.66),
                              ("51.5257, -0.1122, -33.9323, 18.4197", 9673.4042, 6011.1453),
                              ("-33.9323, 18.4197, -33.8666, 151.1", 11005.2330, 6838.7564)):
        calls = [f"GEO_DISTANCE({points})", f"GEO_DISTANCE({points}, 'KM')", f"GEO_DISTANCE({points}, 'MI')"]
        values = as_spark(spark, [with_widths(expression(call), NO_COLUMNS) for call in calls])
        assert [abs(v - want) < 0.5 for v, want in zip(values, (km, km, miles), strict=True)] == [True] * 3, values


def test_map_union_answers_as_sparks(spark: SparkSession) -> None:
    """MAP_UNION (ksqlDB's) over random MAPs, in Python and Spark alike, entries in the same order:
    the second's value where both have a key, at the first's place; a NULL MAP counts as none, two
    give NULL; MAPs of another type refused."""
    draw = random.Random(12)
    keys, values = ["a", "b", "c", "d", ""], [None, 0, 1, -7, 2**31 - 1]

    def a_map() -> dict[str, int | None] | None:
        return None if draw.random() < 0.15 else {draw.choice(keys): draw.choice(values) for _ in range(draw.randint(0, 4))}

    rows = [(a_map(), a_map()) for _ in range(200)] + [(None, None), ({}, None), ({"a": 1, "b": 2}, {"b": 3, "c": 4})]
    columns = Scope("T", {name: ast.SqlType("MAP", (ast.SqlType("VARCHAR"), ast.SqlType("INT"))) for name in ("M", "N")})
    # Their entries in order: PySpark gives a collected MAP's entries in an order of its own.
    texts = [f"{part}({union})" for union in ("MAP_UNION(m, n)", "MAP_UNION(n, m)", "MAP_UNION(m, MAP('z' := 9))",
                                              "MAP_UNION(m, m)") for part in ("MAP_KEYS", "MAP_VALUES")]
    # Read from JSON text, which keeps its entries' order in Spark as in Python.
    frame = spark.createDataFrame([tuple(None if m is None else json.dumps(m) for m in row) for row in rows],
                                  "J STRING, K STRING").selectExpr("from_json(J, 'MAP<STRING, INT>') AS M",
                                                                   "from_json(K, 'MAP<STRING, INT>') AS N")
    differing = _differing(frame, rows, "MN", texts, columns, lambda ours, theirs: ours == theirs)
    assert differing == []
    union = with_widths(expression("MAP_UNION(m, n)"), columns)
    assert list(evaluate(union, {"M": {"a": 1, "b": 2}, "N": {"b": 3, "c": 4}}).items()) == [("a", 1), ("b", 3), ("c", 4)]
    assert evaluate(union, {"M": None, "N": None}) is None
    for text, error in (("MAP_UNION(m, MAP(1 := 2))", "two MAPs of one type"), ("MAP_UNION(NULL, m)", "a bare NULL")):
        with pytest.raises(StatementError, match=error):
            check(expression(text), columns)
    # Each argument evaluated once: a random one is NULL or not for the whole call (three
    # evaluations gave NULL where the test saw a MAP and the union then did not), and calls
    # nested in arguments grow the Spark SQL by their own length, not threefold a level.
    maybe = with_widths(expression("MAP_UNION(m, CASE WHEN RANDOM() < 0.5 THEN n END)"), columns)
    both = spark.createDataFrame([('{"a": 1}', '{"b": 2}')] * 200, "J STRING, K STRING").selectExpr(
        "from_json(J, 'MAP<STRING, INT>') AS M", "from_json(K, 'MAP<STRING, INT>') AS N")
    assert {tuple(sorted(row[0])) for row in both.selectExpr(f"map_keys({to_spark(maybe, columns)})").collect()} == {
        ("a",), ("a", "b")}
    nested = "m"
    for _ in range(8):
        nested = f"MAP_UNION({nested}, n)"
    assert len(to_spark(with_widths(expression(nested), columns), columns)) < 2_000
