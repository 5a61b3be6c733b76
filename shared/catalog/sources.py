"""Streams and tables as the metastore holds them: columns, topic and formats.

Plain frozen values, so they hash into the metastore digest and travel between modules
without behaviour attached (persistent queries are in ``queries``).
"""

from __future__ import annotations

from dataclasses import dataclass

from millpond.shared.sql.ast import SqlType


@dataclass(frozen=True)
class Column:
    """A column of a stream or table."""

    name: str
    type: SqlType
    key: bool = False


@dataclass(frozen=True)
class DataSource:
    """A stream or a table over a Kafka topic."""

    kind: str
    name: str
    columns: tuple[Column, ...]
    topic: str
    partitions: int
    key_format: str = "KAFKA"
    value_format: str = "JSON"
    query_id: str | None = None
    """The persistent query that writes it (CREATE ... AS SELECT), if any."""
    value_delimiter: str = ","
    """The field separator of DELIMITED values."""
    timestamp: str | None = None
    """The column that carries event time (WITH (timestamp=...)), if any."""

    @property
    def key_column(self) -> Column | None:
        """The KEY / PRIMARY KEY column, if any."""
        return next((c for c in self.columns if c.key), None)

    @property
    def value_columns(self) -> tuple[Column, ...]:
        """Columns stored in the record value."""
        return tuple(c for c in self.columns if not c.key)

    @property
    def schema(self) -> dict[str, SqlType]:
        """Column name to type."""
        return {c.name: c.type for c in self.columns}

    def schema_text(self) -> str:
        """The columns as ksqlDB prints them: ``A VARCHAR KEY, B INT``."""
        return ", ".join(f"{c.name} {c.type}{' KEY' if c.key else ''}" for c in self.columns)
