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
