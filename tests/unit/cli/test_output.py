"""The CLI's table of a result shows each value as it is: text that looks like Rich markup is
neither styled, dropped, nor a crash; a PRINT's formats are lines of their own."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

from rich.console import Console

from millpond.cli.output import print_outcome, print_stream
from millpond.shared.results import Outcome


def test_values_that_look_like_markup_are_shown_as_they_are() -> None:
    out = io.StringIO()
    rows = [["[bold red]ALERT[/] [link=http://x]click[/link]"], ["costs [/] 5"]]
    print_outcome(Outcome("SELECT * FROM t", "", columns=[("[b]V[/b]", "VARCHAR")], rows=rows), "table",
                  Console(file=out, width=200, color_system=None))
    shown = out.getvalue()
    assert "[bold red]ALERT[/] [link=http://x]click[/link]" in shown and "costs [/] 5" in shown and "[b]V[/b]" in shown


class Stream:
    """A push stream's columns and rows, as ``PushStream`` hands them out."""

    def __init__(self, columns: list[str], rows: list[list[object]]):
        self.columns, self.rows = [(name, "VARCHAR") for name in columns], rows

    def __iter__(self) -> Iterator[list[object]]:
        return iter(self.rows)

    def cancel(self) -> None:
        raise AssertionError("not cancelled")


def test_prints_formats_are_lines_of_their_own_printed_when_they_change() -> None:
    """As ksqlDB's CLI shows a PRINT: ``Key format: ...`` and ``Value format: ...`` before the first
    row and again when they narrow, not in every row; JSON Lines keep them in each row."""
    columns = ["ROWTIME", "PARTITION", "OFFSET", "KEY", "VALUE", "KEY_FORMAT", "VALUE_FORMAT"]
    rows: list[list[object]] = [[1, 0, 0, "12345678", "7", "KAFKA_BIGINT or KAFKA_STRING", "JSON or KAFKA_STRING"],
                                [2, 0, 1, "s2", None, "KAFKA_STRING", "JSON or KAFKA_STRING"],
                                [3, 0, 2, "s3", "x", "KAFKA_STRING", "KAFKA_STRING"]]
    out = io.StringIO()
    print_stream(Stream(columns, rows), "table", Console(file=out, width=200, color_system=None))  # type: ignore[arg-type]
    assert out.getvalue().splitlines() == [
        "ROWTIME | PARTITION | OFFSET | KEY | VALUE",
        "Key format: KAFKA_BIGINT or KAFKA_STRING", "Value format: JSON or KAFKA_STRING", "1 | 0 | 0 | 12345678 | 7",
        "Key format: KAFKA_STRING", "2 | 0 | 1 | s2 | null",
        "Value format: KAFKA_STRING", "3 | 0 | 2 | s3 | x"]
    out = io.StringIO()
    print_stream(Stream(columns, rows[:1]), "json", Console(file=out, width=200, color_system=None))  # type: ignore[arg-type]
    assert json.loads(out.getvalue())["KEY_FORMAT"] == "KAFKA_BIGINT or KAFKA_STRING"
    out = io.StringIO()
    print_stream(Stream(["K", "V"], [["a", 1]]), "table", Console(file=out, width=200, color_system=None))  # type: ignore[arg-type]
    assert out.getvalue().splitlines() == ["K | V", "a | 1"]
