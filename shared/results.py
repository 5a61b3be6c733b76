"""Statement outcomes as domain values, and their protobuf form."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from millpond.common.v1 import rows_pb2
from millpond.shared.kafka.serde import from_proto, to_proto


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

    def to_proto(self) -> rows_pb2.StatementResult:
        """The protobuf ``StatementResult``."""
        return rows_pb2.StatementResult(
            statement_text=self.statement,
            status=self.status,
            message=self.message,
            columns=[rows_pb2.Column(name=n, type=t) for n, t in self.columns],
            rows=[rows_pb2.Row(values=[to_proto(v) for v in row]) for row in self.rows],
            partition=self.partition,
            offset=self.offset,
            consistency_token=self.consistency_token,
        )

    @classmethod
    def from_proto(cls, result: rows_pb2.StatementResult) -> Outcome:
        """Inverse of ``to_proto``."""
        return cls(
            statement=result.statement_text,
            message=result.message,
            status=result.status,
            columns=[(c.name, c.type) for c in result.columns],
            rows=[[from_proto(v) for v in row.values] for row in result.rows],
            partition=result.partition,
            offset=result.offset,
            consistency_token=result.consistency_token,
        )
