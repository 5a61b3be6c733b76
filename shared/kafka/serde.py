"""Key and value formats: KAFKA keys, JSON keys of several columns, JSON and DELIMITED
values, and protobuf ``Value``s."""

from __future__ import annotations

import base64
import csv
import datetime
import io
import json
import math
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from millpond.common.v1 import rows_pb2
from millpond.shared.catalog.sources import Column, WindowSpec
from millpond.shared.errors import StatementError
from millpond.shared.kafka.time_patterns import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from millpond.shared.sql.ast import SqlType
from millpond.shared.sql.java_text import java_double_text
from millpond.shared.sql.kinds import DECIMAL_TEXT

KEY_FORMATS = ("KAFKA", "JSON")
"""KAFKA: one key column, as Kafka's Java serializers write it; JSON: a key of several
columns (a GROUP BY of several expressions), a JSON object by column name, as ksqlDB's."""
VALUE_FORMATS = ("JSON", "DELIMITED")
KEY_TYPES = ("VARCHAR", "INT", "BIGINT", "DOUBLE", "BYTES")
"""Key column types the KAFKA key format serializes (as Kafka's Java serializers do)."""
JSON_KEY_TYPES = ("VARCHAR", "INT", "BIGINT", "DOUBLE")
"""Types a column of a JSON key may have."""


def composite_key_type(columns: Sequence[tuple[str, SqlType]]) -> SqlType:
    """The type of a key of several columns as one value: a STRUCT of them, which
    ``serialize_key`` writes as a JSON object (a dict in Python, ``named_struct`` in Spark)."""
    return SqlType("STRUCT", tuple(columns))


def encode_key(values: Sequence[Any], columns: Sequence[Column]) -> bytes:
    """The key bytes of a row's key column values: one column's in the KAFKA format, several
    columns' as a JSON object by column name."""
    if len(columns) == 1:
        return serialize_key(values[0], columns[0].type)
    type_ = composite_key_type([(c.name, c.type) for c in columns])
    return serialize_key(dict(zip((c.name for c in columns), values, strict=True)), type_)


def key_decoder(columns: Sequence[Column]) -> Callable[[bytes], list[Any]]:
    """How key bytes become the key columns' values, in order (``encode_key``'s inverse),
    with the format looked up once (a scan decodes thousands of keys)."""
    if len(columns) == 1:
        type_ = columns[0].type
        if type_.base == "VARCHAR":
            return lambda data: [data.decode()]
        return lambda data: [deserialize_key(data, type_)]
    names = [c.name for c in columns]

    def decode(data: bytes) -> list[Any]:
        fields = json.loads(data)
        if not isinstance(fields, dict):
            raise ValueError(f"a key of the columns {', '.join(names)} is not a JSON object")
        field = json_fields(fields)  # in any case, as a value's columns are found
        return [_typed(field(c.name), c.type, c.name) for c in columns]

    return decode


def serialize_key(value: Any, type_: SqlType) -> bytes:
    """Serialize a key column in the KAFKA format, as the Java serializers do."""
    if value is None:
        raise StatementError("a KEY column cannot be NULL")
    base = type_.base
    if base == "VARCHAR":
        return str(value).encode()
    if base == "INT":
        return struct.pack(">i", int(value))
    if base == "BIGINT":
        return struct.pack(">q", int(value))
    if base == "DOUBLE":
        return struct.pack(">d", float(value))
    if base == "BYTES":
        return bytes(value)
    if base == "STRUCT":  # a key of several columns: a compact JSON object in UTF-8
        return json.dumps({name: _key_field(value[name], field, name) for name, field in type_.params},
                          separators=(",", ":"), ensure_ascii=False).encode()
    raise StatementError(f"KAFKA key format does not support {type_}; use VARCHAR, INT, BIGINT or DOUBLE")


def _key_field(value: Any, type_: SqlType, name: str) -> Any:
    """A JSON key's field as its declared type writes it, whatever numeric type the value came
    as (Spark gives a DECIMAL expression's value as a Decimal, an integral one maybe too), so
    the worker's key bytes and a pull query's agree; StatementError for a value of another
    type (a producer's key with "3" or 3.7 for an INT column)."""
    if value is None:
        raise StatementError(f"the key column {name} cannot be NULL")
    if type(value).__name__ == "Decimal":
        value = float(value)
    try:
        typed = _typed(value, type_, name)
    except (ValueError, ArithmeticError) as error:
        raise StatementError(f"key column {name}: {error}") from None
    if type_.base == "BIGINT" and not -(2**63) <= typed < 2**63:
        raise StatementError(f"key column {name} is BIGINT but {value!r} is out of its range")
    return typed


def deserialize_key(data: bytes, type_: SqlType) -> Any:
    """Inverse of ``serialize_key`` (UnicodeDecodeError for a VARCHAR's bytes that are not
    UTF-8: the readers set such a record aside, ``reasons.bad_key``)."""
    base = type_.base
    if base == "VARCHAR":
        return data.decode()
    if base == "INT":
        return struct.unpack(">i", data)[0]
    if base == "BIGINT":
        return struct.unpack(">q", data)[0]
    if base == "DOUBLE":
        return struct.unpack(">d", data)[0]
    if base == "STRUCT":
        return json.loads(data)
    return data


def _base64(value: Any) -> str:
    """BYTES in JSON: base64 text, as ksqlDB's JSON serializer and Spark's ``to_json`` write them."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _delimited_bytes(value: bytes | bytearray, column: str) -> str:
    """BYTES in a DELIMITED field: their UTF-8 text, as a DELIMITED value is read (its field's
    text is the bytes); ValueError for bytes that are not UTF-8."""
    try:
        return bytes(value).decode()
    except UnicodeDecodeError:
        raise ValueError(f"column {column} holds bytes that are not UTF-8 text, which is all a DELIMITED field "
                         "holds: write the result as JSON (BYTES as base64)") from None


def serialize_value(columns: Sequence[str], values: Sequence[Any], value_format: str, delimiter: str = ",") -> bytes:
    """Serialize value columns: JSON objects keyed by column name, or DELIMITED lines (CSV
    with ``delimiter``; NULL is an empty field, as ksqlDB writes it; BYTES their UTF-8 text; a
    DOUBLE Java's text, as ksqlDB writes it and Spark's CSV reader reads it: ``1.0E20``, ``NaN``).
    ValueError for a value the format cannot hold (non-UTF-8 BYTES in DELIMITED)."""
    if value_format == "JSON":
        return json.dumps(dict(zip(columns, values, strict=True)), separators=(",", ":"), default=_base64).encode()
    if value_format == "DELIMITED":
        out = io.StringIO()
        # The line terminator's characters are what makes the writer quote a field holding a
        # line break (RFC 4180, as ksqlDB writes it); the record holds no terminator.
        csv.writer(out, delimiter=delimiter, lineterminator="\r\n").writerow(
            ["" if v is None else ("true" if v is True else "false" if v is False else
                                   _delimited_bytes(v, name) if isinstance(v, bytes | bytearray) else
                                   java_double_text(v) if isinstance(v, float) else v)
             for name, v in zip(columns, values, strict=True)])
        return out.getvalue().removesuffix("\r\n").encode()
    raise StatementError(f"unknown value format {value_format!r}; use one of {VALUE_FORMATS}")


def coerce(value: Any, type_: SqlType, column: str) -> Any:
    """Check and convert a literal to a column's type; say which column and types clash."""
    if value is None:
        return None
    base = type_.base
    ok = {
        "VARCHAR": isinstance(value, str),
        "INT": isinstance(value, int) and not isinstance(value, bool) and -(2**31) <= value < 2**31,
        "BIGINT": isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63,
        "DOUBLE": isinstance(value, int | float) and not isinstance(value, bool),
        "DECIMAL": isinstance(value, int | float) and not isinstance(value, bool),
        "BOOLEAN": isinstance(value, bool),
    }.get(base, True)
    if not ok:
        given = {bool: "BOOLEAN", int: "an integer", float: "DOUBLE", str: "VARCHAR"}.get(type(value), type(value).__name__)
        if type(value) is int and base in ("INT", "BIGINT"):
            given = f"out of {base}'s range"
        raise StatementError(f"column {column} is {type_} but the value {value!r} is {given}")
    if base == "DOUBLE":
        try:
            return float(value)
        except OverflowError:  # an integer past a DOUBLE's range: an infinity, as Java's (and Spark's) reading of it
            return math.inf if value > 0 else -math.inf
    return value


def bytes_decoder(type_: SqlType) -> Callable[[Any], Any] | None:
    """What gives a value of ``type_`` decoded from JSON its BYTES back: JSON (and a store,
    ``reducers.stored``) keeps them as base64 text, also inside arrays, maps and structs;
    None when the type holds none."""
    if type_.base == "BYTES":
        return base64_bytes
    if type_.base == "ARRAY":
        item = bytes_decoder(type_.params[0])
        return None if item is None else lambda v: [None if x is None else item(x) for x in v]
    if type_.base == "MAP":
        entry = bytes_decoder(type_.params[1])
        return None if entry is None else lambda v: {k: None if x is None else entry(x) for k, x in v.items()}
    if type_.base == "STRUCT":
        fields = {name: f for name, field_type in type_.params if (f := bytes_decoder(field_type)) is not None}
        if not fields:
            return None
        return lambda v: {k: x if x is None or k not in fields else fields[k](x) for k, x in v.items()}
    return None


def base64_bytes(value: Any) -> Any:
    """BYTES from the base64 text JSON keeps them as (bytes as they are); ValueError for other values."""
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise ValueError(f"BYTES must be base64 text, not {value!r}")
    # Strict, but line-wrapped base64 reads, as Spark's JSON reader (Jackson) takes it.
    return base64.b64decode("".join(value.split()), validate=True)


MILLIS_TEXT = r"-?[0-9]{1,15}"
"""A TIMESTAMP given as epoch milliseconds (a JSON number, or text of digits): at most 15
digits, more would overflow Spark's timestamp_millis."""
ISO_TIMESTAMP_TEXT = (r"[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,6})?"
                      r"(?:Z|[+-](?:(?:0[0-9]|1[0-7]):[0-5][0-9]|18:00))?)?)?")
"""A TIMESTAMP given as text: ISO 8601 as ksqlDB and Millpond write it (a date, then
optionally a time to the minute, or to the second or microsecond with an optional UTC offset
of at most 18 hours, as Java's time zones go). Spark's CAST and Python's ``fromisoformat``
each read more forms, differently (Spark guesses ``2026-1-2`` and trims a line break, Python
reads week dates, an offset after the minutes and offsets up to 24 hours); within this one
they agree, so the persistent queries (``query_runner.timestamp_of``), push queries and
standby copies (``timestamp_text``) read the same instants."""
_MILLIS = re.compile(MILLIS_TEXT)
_ISO_TIMESTAMP = re.compile(ISO_TIMESTAMP_TEXT)
_EPOCH = datetime.datetime(1970, 1, 1)


def timestamp_text(value: Any) -> str:
    """A TIMESTAMP value as a record holds it, as the text a pull gives for it: what the
    persistent queries read (``query_runner.timestamp_of``: ``MILLIS_TEXT``, a JSON number or
    text, is epoch milliseconds; ``ISO_TIMESTAMP_TEXT`` an ISO 8601 time, one with an offset
    moved to UTC), in Python's ISO form of the UTC time, as the stores keep it. ValueError
    when it does not read or lies outside ``EARLIEST_TIMESTAMP``..``LATEST_TIMESTAMP``, where
    the queries set the record aside."""
    text = value if isinstance(value, str) else None if isinstance(value, bool) else str(value) \
        if isinstance(value, int) else None
    if text is None:
        raise ValueError(f"a TIMESTAMP must be epoch milliseconds or ISO 8601 text, not {value!r}")
    try:
        if _MILLIS.fullmatch(text):
            time = _EPOCH + datetime.timedelta(milliseconds=int(text))
        elif _ISO_TIMESTAMP.fullmatch(text):
            time = datetime.datetime.fromisoformat(text)
            if time.tzinfo is not None:
                time = time.astimezone(datetime.UTC).replace(tzinfo=None)
        else:
            raise ValueError("neither epoch milliseconds nor ISO 8601 (2026-01-02T03:04:05.678+01:00)")
        if not EARLIEST_TIMESTAMP <= time <= LATEST_TIMESTAMP:
            raise ValueError(f"outside {EARLIEST_TIMESTAMP.isoformat()} to {LATEST_TIMESTAMP.isoformat()}")
        return time.isoformat()
    except (ValueError, OverflowError) as error:
        raise ValueError(f"{value!r} is not a TIMESTAMP Millpond reads: {error}") from None


def to_proto(value: Any) -> rows_pb2.Value:
    """A Python value as a protobuf ``Value`` (None is SQL NULL)."""
    if value is None:
        return rows_pb2.Value()
    if isinstance(value, bool):
        return rows_pb2.Value(bool_value=value)
    if isinstance(value, int):
        return rows_pb2.Value(int_value=value)
    if isinstance(value, float):
        return rows_pb2.Value(double_value=value)
    if isinstance(value, str):
        return rows_pb2.Value(string_value=value)
    if isinstance(value, bytes):
        return rows_pb2.Value(bytes_value=value)
    return rows_pb2.Value(json_value=json.dumps(value, default=_base64))


def add_values(field: Any, values: Iterable[Any]) -> None:
    """Append ``values`` to a repeated ``Value`` field (``Row.values``) as ``to_proto`` makes
    them, without building each message first (a scan page's thousands of rows)."""
    add = field.add
    for value in values:
        if value is None:
            add()
        elif isinstance(value, str):
            add(string_value=value)
        elif isinstance(value, bool):
            add(bool_value=value)
        elif isinstance(value, int):
            add(int_value=value)
        elif isinstance(value, float):
            add(double_value=value)
        elif isinstance(value, bytes):
            add(bytes_value=value)
        else:
            add(json_value=json.dumps(value, default=_base64))


def as_sent(value: Any) -> Any:
    """``value`` as it reads after ``to_proto`` and ``from_proto`` (a row passed in-process
    reads as one sent over gRPC): values of other types than those a ``Value`` holds as
    they are go through their JSON text, and an integer past 64 bits fails as it would
    there (ValueError). (A text with a lone surrogate passes here; it fails once the
    result is built.)"""
    if value is None or type(value) in _SENT_AS_THEY_ARE:
        return value
    if type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
        return value
    return from_proto(to_proto(value))


_SENT_AS_THEY_ARE = (str, float, bool, bytes)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def from_proto(value: rows_pb2.Value) -> Any:
    """Inverse of ``to_proto``."""
    kind = value.WhichOneof("kind")
    if kind is None:
        return None
    if kind == "json_value":
        return json.loads(value.json_value)
    return getattr(value, kind)


def _typed(value: Any, type_: SqlType, column: str) -> Any:
    """A decoded JSON value checked against its column's type (ValueError when it does not fit)."""
    if value is None:
        return None
    base = type_.base
    if base in ("INT", "BIGINT") and isinstance(value, float) and value.is_integer():
        value = int(value)
    if base in ("ARRAY", "MAP", "STRUCT"):
        expected: type | tuple[type, ...] = list if base == "ARRAY" else dict
        if not isinstance(value, expected):
            raise ValueError(f"column {column} is {type_} but the record has {value!r}")
        return value
    try:
        return coerce(value, type_, column)
    except StatementError as err:
        raise ValueError(err.message) from None


def _from_text(text: str, type_: SqlType, column: str) -> Any:
    """A DELIMITED field as its column's type; an empty field is NULL."""
    if text == "":
        return None
    base = type_.base
    try:
        if base in ("INT", "BIGINT"):  # Java's parseInt and parseLong: a sign and digits, no spaces
            if _INTEGER_FIELD.fullmatch(text) is None:
                raise ValueError(text)
            return _typed(int(text), type_, column)
        if base == "DOUBLE":
            return _java_double(text)
        if base == "DECIMAL":  # Java's BigDecimal of the text without its grouping commas (Spark's, in Locale.US)
            if DECIMAL_TEXT.fullmatch(text.replace(",", "")) is None:
                raise ValueError(text)
            return float(text.replace(",", ""))
        if base == "BOOLEAN":  # Scala's toBoolean: either word, in any case, no spaces
            return {"true": True, "false": False}[text.lower()]
    except (KeyError, ValueError):
        raise ValueError(f"column {column} is {type_} but the field is {text!r}") from None
    return text


_INTEGER_FIELD = re.compile(r"[+-]?[0-9]+")
_DOUBLE_FIELD = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)")
_HEX_DOUBLE_FIELD = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+[fFdD]?")
_CSV_DOUBLE_WORDS = {"NaN": math.nan, "Inf": math.inf, "-Inf": -math.inf}
"""Spark's CSV reader's words for a DOUBLE that is not a number (its ``nanValue``, ``positiveInf``
and ``negativeInf``), before Java's reading."""


def _java_double(text: str) -> float:
    """A DELIMITED DOUBLE field as Spark's CSV reader reads it: its words (``_CSV_DOUBLE_WORDS``),
    else Java's ``Double.parseDouble``: spaces around, a sign, ``NaN``, ``Infinity``, decimal or
    hexadecimal digits (``0x1p3``), a type letter after (``1.5d``); ValueError for other text."""
    if text in _CSV_DOUBLE_WORDS:
        return _CSV_DOUBLE_WORDS[text]
    number = text.strip("".join(map(chr, range(33))))  # Java's trim: every character up to the space
    if _DOUBLE_FIELD.fullmatch(number):
        return float(number.rstrip("fFdD"))
    if _HEX_DOUBLE_FIELD.fullmatch(number):
        return float.fromhex(number.rstrip("fFdD"))
    raise ValueError(text)


def json_fields(fields: dict[str, Any]) -> Callable[[str], Any]:
    """How ksqlDB's JSON reader finds a column's field in an object: by the column's name as
    written, else by a key that upper-cased is the name (``reading`` for READING; the last of
    several), so a quoted lower-case column ``"id"`` takes ``id`` alone. The persistent queries'
    Spark reading finds the same (``json_reading.JsonReading``)."""
    upper: dict[str, Any] = {}  # made at the first name not found as written (a record's keys usually are)

    def field(name: str) -> Any:
        if name in fields:
            return fields[name]
        if not upper:
            upper.update((str(key).upper(), value) for key, value in fields.items())
        return upper.get(name)

    return field


def deserialize_value(columns: Sequence[tuple[str, SqlType]], data: bytes, value_format: str,
                      delimiter: str = ",") -> dict[str, Any]:
    """Decode a record value into its value columns (as Spark reads it for the persistent
    queries: JSON fields by name, as ``json_fields`` finds them, missing ones NULL; DELIMITED
    fields by position). ValueError says what does not fit."""
    if value_format == "JSON":
        try:
            parsed = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"value is not JSON: {err}") from None
        except RecursionError:
            raise ValueError("value is JSON nested too deeply to decode") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"value is JSON {type(parsed).__name__}, not an object")
        field = json_fields(parsed)
        return {name: _typed(field(name), type_, name) for name, type_ in columns}
    if value_format == "DELIMITED":
        try:
            texts = next(csv.reader([data.decode()], delimiter=delimiter))
        except (UnicodeDecodeError, csv.Error, StopIteration) as err:
            raise ValueError(f"value is not a DELIMITED line: {err}") from None
        if len(texts) != len(columns):
            raise ValueError(f"value has {len(texts)} fields; the schema has {len(columns)}")
        return {name: _from_text(text, type_, name) for (name, type_), text in zip(columns, texts, strict=True)}
    raise ValueError(f"unknown value format {value_format!r}")


WINDOW_START_BYTES = 8
"""A windowed key ends with its window's start, big-endian (ksqlDB's windowed KAFKA key)."""


def windowed_key(key: bytes, start: int) -> bytes:
    """A windowed table's key: the serialized key, then the window start in 8 bytes,
    big-endian, as Kafka Streams' ``TimeWindowedSerializer`` writes it, so a store's keys
    sort by key, then window."""
    return key + start.to_bytes(WINDOW_START_BYTES, "big", signed=True)


def split_windowed_key(windowed: bytes) -> tuple[bytes, int]:
    """The serialized key and the window start of a windowed key."""
    return windowed[:-WINDOW_START_BYTES], int.from_bytes(windowed[-WINDOW_START_BYTES:], "big", signed=True)


def session_key(key: bytes, start: int, end: int) -> bytes:
    """A session-windowed table's key: the serialized key, then the session's end and start in
    8 bytes each, big-endian, as Kafka Streams' ``SessionWindowedSerializer`` writes it."""
    return key + end.to_bytes(WINDOW_START_BYTES, "big", signed=True) + start.to_bytes(WINDOW_START_BYTES, "big",
                                                                                        signed=True)


def window_bounds(windowed: bytes, window: WindowSpec) -> tuple[bytes, int, int]:
    """The serialized key, window start and window end of a windowed table's key (a session's
    end is its last record's time; a time window's, its start plus its size)."""
    if window.kind == "SESSION":
        width = 2 * WINDOW_START_BYTES
        return (windowed[:-width], int.from_bytes(windowed[-WINDOW_START_BYTES:], "big", signed=True),
                int.from_bytes(windowed[-width:-WINDOW_START_BYTES], "big", signed=True))
    key, start = split_windowed_key(windowed)
    return key, start, start + window.size_ms


def window_key_bytes(window: WindowSpec) -> int:
    """How many bytes a windowed key has after the serialized key."""
    return 2 * WINDOW_START_BYTES if window.kind == "SESSION" else WINDOW_START_BYTES
