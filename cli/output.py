"""Rendering statement outcomes as tables or JSON Lines."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from millpond.shared.results import Outcome


def json_lines(outcome: Outcome) -> list[str]:
    """One JSON object per row keyed by column name; a row-less statement gives its status."""
    if outcome.columns:
        names = [name for name, _ in outcome.columns]
        return [json.dumps(dict(zip(names, row, strict=True)), default=str) for row in outcome.rows]
    body: dict[str, Any] = {"status": outcome.status or "SUCCESS", "message": outcome.message,
                            "statement": outcome.statement}
    if outcome.statement.upper().startswith("INSERT"):
        body.update(partition=outcome.partition, offset=outcome.offset)
    return [json.dumps(body)]


def print_outcome(outcome: Outcome, output: str, console: Console) -> None:
    """Print one outcome in the chosen format."""
    if output == "json":
        for line in json_lines(outcome):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    if not outcome.columns:
        console.print(f"{outcome.message}", markup=False, highlight=False)
        return
    if outcome.message:
        console.print(outcome.message, markup=False, highlight=False)
    # Text, not markup: a value holding "[/]" or "[link=...]" is shown as it is.
    table = Table()
    for name, _ in outcome.columns:
        table.add_column(Text(name))
    for row in outcome.rows:
        table.add_row(*[Text("null" if v is None else str(v)) for v in row])
    console.print(table)
    console.print(f"{len(outcome.rows)} row(s)", style="dim")
