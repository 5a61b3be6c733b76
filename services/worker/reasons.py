"""Why a record goes to the processing log, in the words every reader of a source uses: the
queries' Spark reducers and the Python readers that apply a table's topic (a standby copy, a
promoted table task's catch-up)."""

from __future__ import annotations

from millpond.shared.catalog.sources import DataSource


def bad_value(source: DataSource) -> str:
    """A value that does not decode to the source's declared columns."""
    return f"value is not {source.value_format} of the declared columns and types"


def bad_key(source: DataSource) -> str:
    """A record without a key, or one its KEY column's type cannot hold (a number's bytes not
    its Java serializer's width, a VARCHAR's not UTF-8: stores keep a key's bytes, and pulls read
    them back as the column), or (a key of several columns) one that is not their JSON object."""
    keys = source.key_columns
    if len(keys) > 1:
        return f"key is not a JSON object of {', '.join(c.name for c in keys)}, none of them NULL"
    if keys and keys[0].type.base == "VARCHAR":
        return "record has no key, or one that is not UTF-8 text"
    width = KEY_WIDTHS.get(keys[0].type.base) if keys else None
    if width is None:
        return "record has no key"
    return f"record has no key, or one that is not a KAFKA-format {keys[0].type.base} ({width} bytes)"


KEY_WIDTHS = {"INT": 4, "BIGINT": 8, "DOUBLE": 8}
"""The bytes of a KAFKA-format key of these types, as Java's serializers write them: a key of
another length does not deserialize (ksqlDB logs it and drops the record)."""
