"""Statement outcomes as domain values (their protobuf form: ``millpond.shared.rpc.converters``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Outcome:
    """What a statement returned: a status message, or columns and rows."""

    statement: str
    message: str = ""
    status: str = "SUCCESS"
    columns: list[tuple[str, str]] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    partition: int = 0
    offset: int = 0
    consistency_token: str = ""
    encoded_rows: list[bytes] = field(default_factory=list)
    """More rows, after ``rows``, already encoded: serialized ``millpond.common.v1.StatementResult``
    messages that set only their rows (a pull scan's pages, passed on as the workers streamed
    them rather than decoded and encoded again)."""


def row_bytes(row: list[Any]) -> int:
    """About the bytes a result row takes in a response (its text), against the most one may carry."""
    return len(repr(row))
