"""Decoding record values as the push queries read them (the same rules as the Spark decode)."""

from __future__ import annotations

import math

import pytest

from millpond.shared.kafka.serde import deserialize_value, serialize_value, timestamp_text
from millpond.shared.sql.ast import SqlType

COLUMNS = [("AREA", SqlType("VARCHAR")), ("READING", SqlType("INT")), ("OK", SqlType("BOOLEAN")),
           ("SCORE", SqlType("DOUBLE"))]


def test_json_round_trip_case_insensitive_fields_and_missing_ones_null() -> None:
    data = serialize_value([n for n, _ in COLUMNS], ["wheel", 20, True, 1.5], "JSON")
    assert deserialize_value(COLUMNS, data, "JSON") == {"AREA": "wheel", "READING": 20, "OK": True, "SCORE": 1.5}
    assert deserialize_value(COLUMNS, b'{"area": "motor", "reading": 3}', "JSON") == {
        "AREA": "motor", "READING": 3, "OK": None, "SCORE": None}


def test_bytes_are_base64_in_json_as_ksqldb_and_spark_write_them() -> None:
    assert serialize_value(["B", "N"], [b"\x00\xffab", None], "JSON") == b'{"B":"AP9hYg==","N":null}'
    with pytest.raises(TypeError):
        serialize_value(["S"], [{1, 2}], "JSON")


def test_json_nested_too_deeply_is_a_value_error_not_a_crash() -> None:
    # A join task or a standby copy logs such a record and goes on (a RecursionError stopped it).
    with pytest.raises(ValueError, match="nested too deeply"):
        deserialize_value(COLUMNS, b'{"AREA": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "JSON")


def test_delimited_round_trip_with_nulls() -> None:
    data = serialize_value([n for n, _ in COLUMNS], ["a|b", None, False, 2.0], "DELIMITED", "|")
    assert deserialize_value(COLUMNS, data, "DELIMITED", "|") == {"AREA": "a|b", "READING": None, "OK": False,
                                                                  "SCORE": 2.0}


@pytest.mark.parametrize(("data", "fmt", "reason"), [
    (b"{not json", "JSON", "not JSON"),
    (b"[1, 2]", "JSON", "not an object"),
    (b'{"READING": "high"}', "JSON", "READING is INT"),
    (b'{"READING": 3000000000}', "JSON", "READING is INT"),
    (b"wheel,20", "DELIMITED", "2 fields"),
    (b"wheel,x,true,1", "DELIMITED", "READING is INT"),
])
def test_malformed_values_say_why(data: bytes, fmt: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        deserialize_value(COLUMNS, data, fmt)


@pytest.mark.parametrize("value, text", [
    (1700000000123, "2023-11-14T22:13:20.123000"), ("1700000000123", "2023-11-14T22:13:20.123000"),
    ("2026-01-02T03:04:05.678", "2026-01-02T03:04:05.678000"), ("2026-01-02 03:04:05", "2026-01-02T03:04:05"),
    (-1000, "1969-12-31T23:59:59"), ("9999-12-31T23:59:59.999", "9999-12-31T23:59:59.999000"),
    ("2026-01-02T03:04:05+01:00", "2026-01-02T02:04:05"), ("2026-01-02T03:04:05Z", "2026-01-02T03:04:05"),
    ("2026-01-02", "2026-01-02T00:00:00"), ("2026-01-02T03:04", "2026-01-02T03:04:00"),
])
def test_a_timestamp_reads_as_the_persistent_queries_read_it_and_pulls_give_it(value: object, text: str) -> None:
    """Epoch milliseconds (a number, or text of up to 15 digits) or ISO text, as the ISO text
    of the UTC time: the cases and results of the Spark test of the queries' decoding
    (``test_timestamps_read_as_epoch_milliseconds_or_iso_text_and_others_are_logged``), and
    ISO text with an offset, to the minute or of a date alone, which Spark's CAST reads the
    same way (``test_a_standby_decodes_a_joined_timestamp_as_the_active_tasks_spark_does``)."""
    assert timestamp_text(value) == text


@pytest.mark.parametrize("value", ["not a time", 999999999999999, 99999999999999999, 1.7e12, True, [1],
                                   " 2026-01-02", "2026-W01-1", "2026-01-02x03:04", "2026-02-30", "0001-01-01"])
def test_a_timestamp_that_the_queries_set_aside_does_not_read(value: object) -> None:
    """Past 15 digits, not an integer, or text in none of the ISO 8601 forms Spark's CAST and
    Python read alike (Python alone reads a week date), or before the second day of year 1."""
    with pytest.raises(ValueError):
        timestamp_text(value)



def test_delimited_bytes_are_written_as_the_text_they_are_read_as() -> None:
    """A DELIMITED field's text is its BYTES (``values.value_reader``): written back as that
    text, not Python's repr of the bytes; bytes that are not UTF-8 no field can hold."""
    columns = [("B", SqlType("BYTES")), ("N", SqlType("INT"))]
    data = serialize_value(["B", "N"], [bytearray(b"a,\xc3\xa9"), 1], "DELIMITED")
    assert data == '"a,é",1'.encode()
    assert deserialize_value(columns, data, "DELIMITED")["B"] == "a,é"
    with pytest.raises(ValueError, match="column B holds bytes that are not UTF-8"):
        serialize_value(["B", "N"], [b"\xff", 1], "DELIMITED")


def test_delimited_doubles_are_written_as_java_writes_them() -> None:
    """NaN, the infinities and every number as Java writes them (ksqlDB's DELIMITED writer;
    Spark's CSV reader parses a DOUBLE with Java's ``parseDouble``, which refuses Python's
    ``nan`` and ``inf``); read back alike."""
    names = ["A", "B", "C", "D", "E", "F"]
    values = [math.nan, math.inf, -math.inf, 1.5, 1e20, 1.5e-5]
    data = serialize_value(names, values, "DELIMITED")
    assert data == b"NaN,Infinity,-Infinity,1.5,1.0E20,1.5E-5"
    read = deserialize_value([(name, SqlType("DOUBLE")) for name in names], data, "DELIMITED")
    assert math.isnan(read["A"]) and [read[n] for n in names[1:]] == values[1:]


def test_delimited_text_with_line_breaks_and_quotes_is_quoted_as_rfc_4180() -> None:
    """A field holding a line break is quoted (it was written bare, and no reader took the
    record back), a quote doubled; Python reads it back, and so does Spark with the reader's
    escape set to the quote (``QueryRunner._decode``; checked with ``from_csv``)."""
    columns = [("S", SqlType("VARCHAR")), ("N", SqlType("INT"))]
    for text in ("line1\nline2", "a\r\nb", 'say "hi"', "a,b"):
        data = serialize_value(["S", "N"], [text, 1], "DELIMITED")
        assert data.startswith(b'"') and deserialize_value(columns, data, "DELIMITED") == {"S": text, "N": 1}
    assert serialize_value(["S", "N"], ["plain", 2], "DELIMITED") == b"plain,2"
