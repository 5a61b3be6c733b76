"""Why a record goes to the processing log, in the words every reader of a source uses: the
queries' Spark reducers and the Python readers that apply a table's topic (a standby copy, a
promoted table task's catch-up)."""

from __future__ import annotations

from millpond.shared.catalog.sources import DataSource


def bad_value(source: DataSource) -> str:
    """A value that does not decode to the source's declared columns."""
    return f"value is not {source.value_format} of the declared columns and types"


def bad_key(source: DataSource) -> str:
    """A record without a key, or (a key of several columns) one that is not their JSON object."""
    keys = source.key_columns
    return "record has no key" if len(keys) < 2 else \
        f"key is not a JSON object of {', '.join(c.name for c in keys)}, none of them NULL"
