"""INSERT ... VALUES against columns of every type: a row INSERT acknowledges is one the
persistent queries read (``values.value_reader``, Spark's reading in Python), and a value of
the wrong kind is refused with a message saying what to give, never an INTERNAL crash."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millpond.shared.catalog.metastore import Metastore
from millpond.shared.errors import StatementError
from millpond.shared.kafka.serde import key_decoder
from millpond.shared.kafka.values import value_reader
from millpond.shared.sql import ast
from millpond.shared.sql.parser import parse_statement
from millpond.shared.sql.planner import EncodedRecord, encode_insert

COLUMNS = "b BYTES, m DECIMAL(4, 2), d DATE, t TIME, a ARRAY<INT>, n INT"
META = Metastore()
for offset, ddl in enumerate([
        f"CREATE STREAM blobs (k BYTES KEY, {COLUMNS}) WITH (kafka_topic='blobs', partitions=2, value_format='json')",
        "CREATE STREAM lines (k BYTES KEY, b BYTES, m DECIMAL(4, 2), d DATE, t TIME, n INT) "
        "WITH (kafka_topic='lines', partitions=2, value_format='delimited')"]):
    META.apply(parse_statement(ddl), offset)


def insert(sql: str) -> EncodedRecord:
    stmt = parse_statement(sql)
    assert isinstance(stmt, ast.InsertValues)
    return encode_insert(stmt, META.insert_target(stmt.target))


def test_bytes_are_given_as_base64_text_and_held_as_each_format_holds_them() -> None:
    record = insert("INSERT INTO blobs (k, b, n) VALUES ('AAEC', '/w==', 1)")
    assert record.key == b"\x00\x01\x02"  # a KAFKA key: the bytes as they are
    assert json.loads(record.value) == {"B": "/w==", "M": None, "D": None, "T": None, "A": None, "N": 1}
    line = insert("INSERT INTO lines (k, b, n) VALUES ('AAEC', 'aMOp', 1)")
    assert line.key == b"\x00\x01\x02" and line.value == "hé,,,,1".encode()  # DELIMITED: the bytes' UTF-8 text


@pytest.mark.parametrize("sql,fragment", [
    ("INSERT INTO blobs (k) VALUES ('abc')", "give its value as base64 text"),
    ("INSERT INTO blobs (k) VALUES (-1)", "give its value as base64 text"),
    ("INSERT INTO blobs (k) VALUES (5)", "give its value as base64 text"),
    ("INSERT INTO blobs (k, b) VALUES ('AA==', 7)", "column B is BYTES"),
    ("INSERT INTO lines (k, b) VALUES ('AA==', '/w==')", "not UTF-8"),
    ("INSERT INTO blobs (k, m) VALUES ('AA==', 123.4)", "does not fit DECIMAL(4, 2)"),
    ("INSERT INTO blobs (k, m) VALUES ('AA==', '1.5')", "give a number"),
    ("INSERT INTO blobs (k, d) VALUES ('AA==', 20000)", "give '2026-01-02'"),
    ("INSERT INTO blobs (k, d) VALUES ('AA==', 'tomorrow')", "is not a DATE"),
    ("INSERT INTO blobs (k, d) VALUES ('AA==', '2026-13-01')", "column D is DATE"),
    ("INSERT INTO blobs (k, t) VALUES ('AA==', '3pm')", "is not an ISO 8601 TIME"),
    ("INSERT INTO blobs (k, a) VALUES ('AA==', '[1, 2]')", "column A is ARRAY<INT>, and '.1, 2.' is VARCHAR"),
])
def test_a_value_the_queries_would_set_aside_is_refused_saying_what_to_give(sql: str, fragment: str) -> None:
    with pytest.raises(StatementError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        insert(sql)


def test_decimals_dates_and_times_are_written_as_the_stores_keep_them() -> None:
    record = insert("INSERT INTO blobs (k, m, d, t, a) VALUES ('AA==', 1.005, '2026-1-2', '03:04', NULL)")
    assert json.loads(record.value) == {"B": None, "M": 1.01, "D": "2026-01-02", "T": "03:04:00", "A": None, "N": None}


LITERALS = ["'AAEC'", "'abc'", "''", "'/w=='", "'aMOp'", "-1", "0", "7", "1.005", "99.999", "123.4", "'1.5'", "NULL",
            "TRUE", "'2026-1-2'", "'2026-02-30'", "'03:04:05.678'", "'25:00'", "'[1]'", "2147483648", "1e308"]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["blobs", "lines"]), st.lists(st.sampled_from(LITERALS), min_size=6, max_size=6))
def test_every_row_insert_acknowledges_is_one_the_queries_read(target: str, literals: list[str]) -> None:
    source = META.source(target.upper())
    names = [c.name for c in source.columns]
    sql = f"INSERT INTO {target} ({', '.join(names)}) VALUES ({', '.join(literals[:len(names)])})"
    try:
        record = insert(sql)
    except StatementError as error:
        assert error.message
        return
    assert record.key is not None and key_decoder(source.key_columns)(record.key)
    assert value_reader(source)(record.value) is not None, (sql, record.value)
