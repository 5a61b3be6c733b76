"""Record values as the persistent queries read them, decoded in Python.

Spark reads a source's values for the persistent queries (``from_json``, ``from_csv``); a
few paths read the same records in Python instead: a table's standby copies and its active
task when it is materialized from a topic, and push queries at the router. They decode each
value here (``value_reader``), as Spark reads it and the stores keep it (``stored``), so a
push query's rows agree with the tables and pulls over the same records.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
import re
from collections.abc import Callable
from typing import Any

from millpond.shared.catalog.sources import DataSource
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.serde import base64_bytes, bytes_decoder, coerce, deserialize_value, json_fields, timestamp_text
from millpond.shared.sql.ast import SqlType
from millpond.shared.sql.java_text import java_double_text
from millpond.shared.sql.kinds import DECIMAL_TEXT, fitted_decimal


def value_reader(source: DataSource) -> Callable[[bytes], list[Any] | None]:
    """How a record value of ``source`` becomes its value columns, in order, as a store keeps
    them (``stored``); None when the value does not decode (Spark sets such a record aside)."""
    decode = value_decoder(source)

    def read(value: bytes) -> list[Any] | None:
        try:
            return decode(value)
        except ValueError:
            return None

    return read


def value_decoder(source: DataSource) -> Callable[[bytes], list[Any]]:
    """``value_reader``'s decoding, with a ValueError that says what does not fit (for the
    processing log) where that gives None."""
    columns = [(c.name, c.type) for c in source.value_columns]
    value_format, delimiter = source.value_format, source.value_delimiter

    def fields_of(value: bytes) -> list[Any]:
        if value_format == "JSON":  # fields by name as ksqlDB's reader, and the persistent queries', find them
            parsed = json.loads(value)
            if not isinstance(parsed, dict):
                raise ValueError(f"a JSON {type(parsed).__name__}, not an object")
            field = json_fields(parsed)
            return [field(name) for name, _ in columns]
        decoded = deserialize_value(columns, value, value_format, delimiter)
        # A DELIMITED BYTES field's text is its bytes: base64, as JSON's.
        return [base64.b64encode(decoded[name].encode()).decode()
                if type_.base == "BYTES" and isinstance(decoded[name], str) else decoded[name]
                for name, type_ in columns]

    def decode(value: bytes) -> list[Any]:
        try:
            fields = fields_of(value)
        except (ValueError, TypeError, ArithmeticError, MillpondError) as error:
            raise ValueError(f"value is not {value_format}: {error}") from None
        except RecursionError:
            raise ValueError(f"value is {value_format} nested too deeply to decode") from None
        try:
            return [stored(field, type_) for field, (_, type_) in zip(fields, columns, strict=True)]
        except (ValueError, TypeError, ArithmeticError, MillpondError, RecursionError):
            for field, (name, type_) in zip(fields, columns, strict=True):  # which column, for the message
                try:
                    stored(field, type_)
                except (ValueError, TypeError, ArithmeticError, MillpondError, RecursionError) as error:
                    raise ValueError(f"column {name} is {type_}: {_shown(str(error))}") from None
            raise

    return decode


def _shown(value: str) -> str:
    return value if len(value) <= 200 else f"{value[:197]}..."


def stored_bytes(types: list[SqlType]) -> Callable[[list[Any]], list[Any]] | None:
    """What turns values as a store keeps them (``stored``) into a row's values as the
    persistent queries' Spark rows give them: BYTES as bytes wherever they are; None when
    ``types`` hold no BYTES (the stored values are the row's)."""
    decoders = [bytes_decoder(t) for t in types]
    if not any(decoders):
        return None
    return lambda values: [v if d is None or v is None else d(v) for d, v in zip(decoders, values, strict=True)]


_SPARK_DATE = re.compile(r"\s*\+?([0-9]{4})(?:-([0-9]{1,2})(?:-([0-9]{1,2})(?:[ T].*)?)?)?\s*", re.DOTALL)
"""The date texts Spark's JSON reader takes (its ``stringToDate``: a year, + before it or not,
then optionally a month and a day of one or two digits, then anything after a space or a T)."""
_TIME = re.compile(r"[0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,6})?)?")
"""The TIME texts a store keeps (ISO 8601, as Spark's values are written): Python's
``fromisoformat`` alone reads more forms."""
_DOUBLE_WORDS = {"NaN": math.nan, "Infinity": math.inf, "+Infinity": math.inf, "-Infinity": -math.inf,
                 "INF": math.inf, "+INF": math.inf, "-INF": -math.inf}
"""The texts Spark's JSON reader takes for a DOUBLE that is not a number."""
_LONG = 2**63
_INT = 2**31


def spark_json_text(value: Any) -> str:
    """A JSON value that is not text as Spark's reader keeps it in a VARCHAR: its JSON as Jackson
    writes it again, compact, with a number with a point or an exponent written as Java writes
    the DOUBLE it reads (``1.5e-07`` is ``1.5E-7``, ``1e+20`` is ``1.0E20``), at any depth."""
    if isinstance(value, float):
        return java_double_text(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k), ensure_ascii=False)}:{spark_json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(spark_json_text(item) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def stored(value: Any, type_: SqlType) -> Any:
    """A value read from a table's JSON as the table's stores keep it, at any depth: what they
    keep of Spark's JSON reading of it (``reducers.stored``), where Spark reads it, and a
    ValueError (or TypeError, ArithmeticError) where Spark sets the record aside. An INT or
    BIGINT is an integer in its range (not 5.0); a DOUBLE any number (5 is 5.0), or Spark's
    words for the others (``_DOUBLE_WORDS``); a DECIMAL the exact reading of the number's text
    (the shortest text of the float), or of a text, rounded half up to the scale, then a
    float, refused past its precision; a VARCHAR text, or a number's,
    a boolean's or a nested value's JSON; a TIMESTAMP the ISO text of its UTC time
    (``timestamp_text``); a DATE read as Spark reads one (``_SPARK_DATE``) and a TIME, each as
    ISO text; BYTES base64 text; a STRUCT its declared fields, in order, each found as a
    column is (``serde.json_fields``; a missing one NULL);
    ARRAY and MAP items alike."""
    if value is None:
        return None
    base = type_.base
    if base == "ARRAY":
        if not isinstance(value, list):
            raise ValueError(f"{value!r} is not an ARRAY")
        return [stored(item, type_.params[0]) for item in value]
    if base == "MAP":
        if not isinstance(value, dict):
            raise ValueError(f"{value!r} is not a MAP")
        return {key: stored(item, type_.params[1]) for key, item in value.items()}
    if base == "STRUCT":
        if not isinstance(value, dict):
            raise ValueError(f"{value!r} is not a STRUCT")
        field_of = json_fields(value)  # in any case, as ksqlDB's reader finds a nested field too
        return {name: stored(field_of(name), field) for name, field in type_.params}
    if base == "VARCHAR":
        if isinstance(value, str):
            return value
        return spark_json_text(value)
    if base in ("INT", "BIGINT"):
        bound = _INT if base == "INT" else _LONG
        if not isinstance(value, int) or isinstance(value, bool) or not -bound <= value < bound:
            raise ValueError(f"{value!r} is not a {base}")
        return value
    if base == "TIMESTAMP":
        return timestamp_text(value)
    if base == "DATE":
        read = _SPARK_DATE.fullmatch(value) if isinstance(value, str) else None
        if read is None:
            raise ValueError(f"{value!r} is not a DATE")
        return datetime.date(int(read[1]), int(read[2] or 1), int(read[3] or 1)).isoformat()
    if base == "TIME":
        if not isinstance(value, str) or not _TIME.fullmatch(value):
            raise ValueError(f"{value!r} is not an ISO 8601 TIME")
        return datetime.time.fromisoformat(value).isoformat()
    if base == "BYTES":
        return base64.b64encode(base64_bytes(value)).decode()
    if base == "DOUBLE" and isinstance(value, str) and value in _DOUBLE_WORDS:
        return _DOUBLE_WORDS[value]
    if base == "DECIMAL" and isinstance(value, str):  # Spark reads a decimal's text too, as Java's BigDecimal: no spaces
        if DECIMAL_TEXT.fullmatch(value) is None:
            raise ValueError(f"{value!r} is not a DECIMAL")
        value = decimal.Decimal(value)
    else:
        value = coerce(value, type_, "value")  # BOOLEAN, DOUBLE and DECIMAL: the JSON type checked
    if base != "DECIMAL":
        return value
    precision, scale = type_.params
    rounded = fitted_decimal(value, precision, scale)
    if rounded is None:
        finite = value.is_finite() if isinstance(value, decimal.Decimal) else math.isfinite(value)
        raise ValueError(f"{value} does not fit DECIMAL({precision}, {scale})" if finite else f"{value} is not a DECIMAL")
    return float(rounded)
