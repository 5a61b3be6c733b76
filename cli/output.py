"""Rendering statement outcomes as tables or JSON Lines."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from millpond.cli.client import PushStream
from millpond.shared.results import Outcome

PRINT_FORMATS = ("KEY_FORMAT", "VALUE_FORMAT")
"""The columns that end PRINT's rows (the router's ``PRINT_COLUMNS``): the formats read so far."""


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


def print_stream(stream: PushStream, output: str, console: Console) -> None:
    """Print a push query's rows as they arrive, until its LIMIT or Ctrl-C. In a table, PRINT's
    key and value formats are lines of their own, printed when they change, as ksqlDB's CLI does."""
    names = [name for name, _ in stream.columns]
    formats = 2 if output == "table" and names[-2:] == list(PRINT_FORMATS) else 0
    if output == "table":
        console.print(" | ".join(names[:len(names) - formats]), markup=False, highlight=False)
    last: list[Any] = [None, None]
    try:
        for row in stream:
            if output == "json":
                console.print(json.dumps(dict(zip(names, row, strict=True)), default=str), markup=False,
                              highlight=False, soft_wrap=True)
                continue
            for i, label in enumerate(("Key format", "Value format")[:formats]):
                if row[i - 2] is not None and row[i - 2] != last[i]:
                    console.print(f"{label}: {row[i - 2]}", markup=False, highlight=False)
                    last[i] = row[i - 2]
            values = row[:len(row) - formats]
            console.print(" | ".join("null" if v is None else str(v) for v in values), markup=False, highlight=False)
    except KeyboardInterrupt:
        stream.cancel()
        console.print("query cancelled", style="dim")
