"""PRINT's guess at a topic's formats (ksqlDB's ``RecordFormatter``): every format that could read
each key and value seen so far, each record shown in the first of them, windowed keys too."""

from __future__ import annotations

import json
import struct

from millpond.services.router.record_formats import UNRECOGNISED, PossibleFormats
from millpond.shared.kafka.serde import session_key, windowed_key


def shown(formats: PossibleFormats, *records: bytes | None) -> list[tuple[str | None, str | None]]:
    """Each record as shown, with the formats still possible after it."""
    return [(formats.shown(record), formats.names()) for record in records]


def test_the_formats_narrow_as_records_rule_them_out_and_each_is_shown_in_the_first_left() -> None:
    # 8 bytes of text read as a BIGINT and a DOUBLE too, and a BIGINT comes first, as in ksqlDB;
    # a key of another length rules both out.
    assert shown(PossibleFormats.of_keys(), b"sensor-1", b"s2", b"sensor-1") == [
        (str(int.from_bytes(b"sensor-1", "big")), "KAFKA_BIGINT or KAFKA_DOUBLE or KAFKA_STRING"),
        ("s2", "KAFKA_STRING"), ("sensor-1", "KAFKA_STRING")]
    assert shown(PossibleFormats.of_values(), b'{"A": 10}', b"7", b"plain") == [
        ('{"A": 10}', "JSON or KAFKA_STRING"), ("7", "JSON or KAFKA_STRING"), ("plain", "KAFKA_STRING")]


def test_kafkas_binary_numbers_are_read_as_their_serializers_write_them() -> None:
    assert shown(PossibleFormats.of_keys(), struct.pack(">i", -7)) == [("-7", "KAFKA_INT")]
    # a DOUBLE's 8 bytes are a BIGINT's too: shown as one until a record tells them apart (never, here)
    assert shown(PossibleFormats.of_values(), struct.pack(">d", 1.5)) == [
        (str(struct.unpack(">q", struct.pack(">d", 1.5))[0]), "KAFKA_BIGINT or KAFKA_DOUBLE")]
    doubles = PossibleFormats.of_values()
    doubles.possible.pop("KAFKA_BIGINT")
    assert shown(doubles, struct.pack(">d", 1e20), struct.pack(">d", float("nan"))) == [
        ("1.0E20", "KAFKA_DOUBLE"), ("NaN", "KAFKA_DOUBLE")]


def test_a_windowed_tables_keys_show_their_key_and_window() -> None:
    tumbling = windowed_key(b"alice", 60_000)
    assert shown(PossibleFormats.of_keys(), tumbling) == [
        ("[alice@60000/-]", "HOPPING(KAFKA_STRING) or TUMBLING(KAFKA_STRING)")]
    session = session_key(struct.pack(">i", 3), 1_000, 5_000)
    assert shown(PossibleFormats.of_keys(), session) == [("[3@1000/5000]", "SESSION(KAFKA_INT)")]
    # text of 9 bytes or more is no windowed key: its last 8 bytes are no time a window has
    assert shown(PossibleFormats.of_keys(), b"sensor-123") == [("sensor-123", "KAFKA_STRING")]
    assert shown(PossibleFormats.of_keys(), session_key(b"k", 5_000, 1_000)) == [
        ("0x" + session_key(b"k", 5_000, 1_000).hex(), UNRECOGNISED)]  # a session that ends before it starts
    # a value is never windowed
    assert shown(PossibleFormats.of_values(), tumbling) == [("0x" + tumbling.hex(), UNRECOGNISED)]


def test_bytes_no_format_reads_are_shown_in_hex_and_a_tombstone_as_none() -> None:
    values = PossibleFormats.of_values()
    assert values.names() is None
    assert shown(values, None) == [(None, None)]
    assert shown(values, b"\xff\xfe", json.dumps({"A": 1}).encode(), b"") == [
        ("0xfffe", UNRECOGNISED), ("0x7b2241223a20317d", UNRECOGNISED), ("0x", UNRECOGNISED)]
    # control characters are no text; tab and line ends are; invalid UTF-8 is none
    assert shown(PossibleFormats.of_values(), b"a\x01b") == [("0x610162", UNRECOGNISED)]
    assert shown(PossibleFormats.of_values(), "é\tx\n".encode()) == [("é\tx\n", "KAFKA_STRING")]
    assert shown(PossibleFormats.of_values(), b"NaN") == [("NaN", "KAFKA_STRING")]
