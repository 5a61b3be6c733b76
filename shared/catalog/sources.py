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
class WindowSpec:
    """How a windowed table's rows are windowed, as ksqlDB's TUMBLING, HOPPING and SESSION
    windows (a tumbling window advances by its size; a session's ``size_ms`` is its inactivity
    gap). Times are milliseconds of event time."""

    kind: str
    size_ms: int
    advance_ms: int
    grace_ms: int
    """How long after a window's end a record may still enter it (per partition stream time)."""
    retention_ms: int
    """How long a window stays in the store and changelog after its start (a session: its end),
    by stream time."""
    emit_final: bool = False
    """EMIT FINAL: the sink gets each window once, when it closes (its end plus grace reached
    by stream time), instead of every change (EMIT CHANGES)."""

    def describe(self) -> str:
        """The windows as DESCRIBE and EXPLAIN show them."""
        if self.kind == "SESSION":
            return (f"SESSION ({self.size_ms} MILLISECONDS, GRACE PERIOD {self.grace_ms} MILLISECONDS, "
                    f"RETENTION {self.retention_ms} MILLISECONDS) EMIT CHANGES")
        advance = f", ADVANCE BY {self.advance_ms} MILLISECONDS" if self.kind == "HOPPING" else ""
        return (f"{self.kind} (SIZE {self.size_ms} MILLISECONDS{advance}, GRACE PERIOD {self.grace_ms} MILLISECONDS, "
                f"RETENTION {self.retention_ms} MILLISECONDS) EMIT {'FINAL' if self.emit_final else 'CHANGES'}")

    def starts(self, timestamp: int) -> range:
        """The starts of the windows a record at ``timestamp`` falls in (none before 0), as Kafka
        Streams' ``TimeWindows.windowsFor``."""
        first = max(0, timestamp - self.size_ms + self.advance_ms) // self.advance_ms * self.advance_ms
        return range(first, timestamp - timestamp % self.advance_ms + 1, self.advance_ms)


WINDOW_START, WINDOW_END = "WINDOWSTART", "WINDOWEND"
"""The pseudo-columns a windowed table's rows carry after the key: their window's bounds."""


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
    window: WindowSpec | None = None
    """For a windowed table: its windows (its rows are keyed by key and window start)."""
    timestamp_format: str | None = None
    """How the TIMESTAMP column's text is read (WITH (timestamp_format=...)), if it is text."""
    spellings: tuple[tuple[str, str], ...] = ()
    """A declared source's unquoted names, at any depth, as its CREATE statement writes them
    where not in upper case (``ast.CreateSource.spellings``): a JSON record is parsed by them
    first, as its producers likely write the keys."""
    read_only: bool = False
    """Declared with CREATE SOURCE (ksqlDB's): no INSERT writes it, only its topic's producers."""

    @property
    def key_columns(self) -> tuple[Column, ...]:
        """The KEY / PRIMARY KEY columns: none, one, or several for a table keyed by a GROUP BY
        of several expressions (KEY_FORMAT JSON)."""
        return tuple(c for c in self.columns if c.key)

    @property
    def key_column(self) -> Column | None:
        """The KEY / PRIMARY KEY column, if any; ValueError for a key of several columns,
        which the operations that ask for one column do not take (their planners refuse it
        first, naming the operation)."""
        keys = self.key_columns
        if len(keys) > 1:
            raise ValueError(f"{self.name} has a key of several columns ({', '.join(c.name for c in keys)})")
        return keys[0] if keys else None

    @property
    def value_columns(self) -> tuple[Column, ...]:
        """Columns stored in the record value."""
        return tuple(c for c in self.columns if not c.key)

    @property
    def row_columns(self) -> tuple[Column, ...]:
        """The columns of a row as pull and push queries see it: a windowed table's carry
        WINDOWSTART and WINDOWEND (BIGINT, epoch milliseconds) after the key columns, as ksqlDB's."""
        if self.window is None:
            return self.columns
        bounds = (Column(WINDOW_START, SqlType("BIGINT")), Column(WINDOW_END, SqlType("BIGINT")))
        at = max((i + 1 for i, c in enumerate(self.columns) if c.key), default=0)
        return (*self.columns[:at], *bounds, *self.columns[at:])

    @property
    def schema(self) -> dict[str, SqlType]:
        """Column name to type."""
        return {c.name: c.type for c in self.columns}

    def schema_text(self) -> str:
        """The columns as ksqlDB prints them: ``A VARCHAR KEY, B INT``."""
        return ", ".join(f"{c.name} {c.type}{' KEY' if c.key else ''}" for c in self.columns)
