"""What a client's statement can make the router (and a worker's Python evaluation) do is
bounded, and what does not fit is a statement error saying so, never an internal one: LIKE
in time linear in its pattern, padding up to a cap, a function that overflows gives what
Spark gives outside ANSI mode, numbers beyond BIGINT or DOUBLE are refused where they are
written, as are session values that are not plain digits."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millpond.shared.catalog.metastore import Metastore
from millpond.shared.errors import StatementError
from millpond.shared.kafka.serde import coerce
from millpond.shared.session import MAX_OFFSET_LAG, check_property
from millpond.shared.sql import ast
from millpond.shared.sql.expressions import evaluate
from millpond.shared.sql.kinds import MAX_PADDED_CHARS
from millpond.shared.sql.parser import parse_statement
from millpond.shared.sql.planner import MAX_TEXT_BUILDERS, plan_select
from millpond.shared.sql.types import Scope, with_widths


def value_of(expression: str) -> Any:
    """``expression`` (of literals) as the router evaluates it, typed (``with_widths``)."""
    query = parse_statement(f"SELECT {expression} AS X FROM T WHERE K = 'k';")
    assert isinstance(query, ast.Query)
    return evaluate(with_widths(query.items[0].expr, Scope("T", {})), {})


def like(value: str, pattern: str) -> Any:
    return evaluate(ast.Binary("LIKE", ast.Literal(value, ast.SqlType("VARCHAR")),
                               ast.Literal(pattern, ast.SqlType("VARCHAR"))), {})


def like_by_regex(value: str, pattern: str) -> bool:
    """LIKE as one backtracking regex: right, but exponential in the pattern's ``%``s."""
    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.DOTALL) is not None


@given(st.text("ab%_.\n", max_size=10), st.text("ab%_.\n", max_size=8))
def test_like_matches_as_the_regex_reading_of_its_pattern(value: str, pattern: str) -> None:
    assert like(value, pattern) is like_by_regex(value, pattern)


def test_like_with_many_wildcards_answers_at_once() -> None:
    # As one regex this backtracks for minutes (10 %s took 12 s): here each piece is found once.
    assert like("a" * 36, "%" * 30 + "b") is False
    assert like("a" * 36 + "b", "%a%" * 30 + "b") is True
    assert like("ab" * 5_000, "%_%" * 1_000 + "c%") is False


def test_padding_is_exact_up_to_its_cap_and_null_beyond() -> None:
    assert value_of("LPAD('ab', 7, 'xyz')") == "xyzxyab"
    assert value_of("RPAD('ab', 7, 'xyz')") == "abxyzxy"
    assert value_of("LPAD('abc', 2, 'x')") == "ab"
    assert value_of("LPAD('abc', -1, 'x')") == ""
    assert len(value_of(f"LPAD('a', {MAX_PADDED_CHARS}, 'xyz')")) == MAX_PADDED_CHARS
    assert value_of("LPAD('a', 2147483647, 'xxxxxxxxxx')") is None  # not 21 GB on the router's loop


def test_concatenation_and_replace_are_exact_up_to_the_cap_and_null_beyond() -> None:
    """REPLACE of each character of a long text by a long one, or CONCAT (CONCAT_WS) of long texts, would
    build gigabytes on the serving loop: past the padding cap they are NULL, as padding is."""
    half = f"LPAD('', {MAX_PADDED_CHARS // 2}, 'a')"
    assert value_of(f"CONCAT({half}, {half})") == "a" * MAX_PADDED_CHARS
    assert value_of(f"{half} || {half} || 'b'") is None
    assert value_of(f"REPLACE({half}, 'a', 'bb')") == "bb" * (MAX_PADDED_CHARS // 2)
    assert value_of(f"REPLACE({half}, 'a', 'bbb')") is None
    assert value_of("REPLACE('abcabc', 'bc', '')") == "aa" and value_of("REPLACE('abc', '', 'x')") == "abc"
    assert value_of(f"CONCAT_WS('', {half}, {half})") == "a" * MAX_PADDED_CHARS
    assert value_of(f"CONCAT_WS('b', {half}, {half})") is None  # one separator past the cap
    assert value_of(f"CONCAT_WS({half}, 'x', NULL, {half})") is None


def test_a_pull_or_push_query_may_build_text_a_bounded_number_of_times_per_row() -> None:
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM s (k VARCHAR KEY, v VARCHAR) WITH (kafka_topic='s', partitions=1, "
                               "value_format='json')"), 0)
    calls = ", ".join(["LPAD(v, 10, v)"] * (MAX_TEXT_BUILDERS // 2))
    within = parse_statement(f"SELECT CONCAT({calls}) AS c FROM s WHERE v || 'x' = 'y' EMIT CHANGES")
    assert isinstance(within, ast.Query)
    plan_select(within, meta.source("S"))  # 32 pads, a CONCAT and a ||: 34
    beyond = parse_statement("SELECT * FROM s WHERE LEN(v) IN (" + ", ".join(["LEN(LPAD(v, 1048576, v))"] * 65)
                             + ") EMIT CHANGES")
    assert isinstance(beyond, ast.Query)
    with pytest.raises(StatementError, match=re.escape("calls LPAD, RPAD, CONCAT (or ||), CONCAT_WS and REPLACE 65 times; a pull "
                                                       "or push query may call them at most 64 times")):
        plan_select(beyond, meta.source("S"))


def test_functions_that_overflow_give_sparks_value_not_an_error() -> None:
    assert value_of("EXP(1000)") == math.inf
    assert value_of("FLOOR(EXP(1000))") == 2**63 - 1  # Spark's (long) of Infinity
    assert value_of("ROUND(1.5, 100000)") == 1.5
    assert value_of("ROUND(2.5)") == 3.0 and value_of("ROUND(-2.5)") == -3.0
    assert value_of("ROUND(15, -1)") == 20 and value_of("ROUND(123456, -100000)") == 0


@pytest.mark.parametrize(("text", "fragment"), [
    ("SELECT * FROM T WHERE K = 9223372036854775809;", "out of BIGINT's range"),
    ("SELECT * FROM T LIMIT " + "9" * 5_000 + ";", "more digits than a BIGINT holds"),
    ("SELECT * FROM T WHERE D > 1e999;", "out of DOUBLE's range"),
    ("CREATE TABLE W AS SELECT K, COUNT(*) AS N FROM S WINDOW TUMBLING (SIZE " + "1" * 30 + " SECONDS) GROUP BY K;",
     "more digits than a BIGINT holds"),
])
def test_numbers_beyond_their_types_are_statement_errors_where_they_are_written(text: str, fragment: str) -> None:
    with pytest.raises(StatementError) as info:
        parse_statement(text)
    assert fragment in info.value.message and info.value.line == 1


def test_bigints_least_value_is_written_as_a_negated_literal() -> None:
    assert value_of("-9223372036854775808") == -(2**63)


@pytest.mark.parametrize("text", ["9223372036854775808", "-(-9223372036854775808)", "1 + 9223372036854775808"])
def test_two_to_the_63_not_negated_once_is_a_statement_error(text: str) -> None:
    """2^63 parses only to be negated: left so, or negated twice, typing refuses it (a pull of it
    failed with INTERNAL when its value reached protobuf)."""
    meta = Metastore()
    meta.apply(parse_statement("CREATE TABLE t (id INT PRIMARY KEY, v INT) WITH (kafka_topic='t', partitions=1, "
                               "value_format='json')"), 0)
    query = parse_statement(f"SELECT {text} AS x FROM t WHERE id = 5;")
    assert isinstance(query, ast.Query)
    with pytest.raises(StatementError, match="out of BIGINT's range"):
        plan_select(query, meta.source("T"))


@pytest.mark.parametrize(("value", "type_", "ok"), [
    (2**63 - 1, "BIGINT", True), (-(2**63), "BIGINT", True), (2**63, "BIGINT", False), (-(2**63) - 1, "BIGINT", False),
    (2**31 - 1, "INT", True), (2**31, "INT", False),
])
def test_a_key_or_value_outside_its_integer_type_is_refused_saying_so(value: int, type_: str, ok: bool) -> None:
    if ok:
        assert coerce(value, ast.SqlType(type_), "K") == value
    else:
        with pytest.raises(StatementError, match=f"out of {type_}'s range"):
            coerce(value, ast.SqlType(type_), "K")


@pytest.mark.parametrize("value", ["²", "١٢", "9" * 19, "-1", "1.5", ""])
def test_a_count_property_takes_plain_digits_only(value: str) -> None:
    with pytest.raises(StatementError, match="takes a whole number"):
        check_property(MAX_OFFSET_LAG, value)


def test_a_count_property_takes_up_to_eighteen_digits() -> None:
    check_property(MAX_OFFSET_LAG, "0")
    check_property(MAX_OFFSET_LAG, "9" * 18)
