"""The CLI's table of a result shows each value as it is: text that looks like Rich markup is
neither styled, dropped, nor a crash."""

from __future__ import annotations

import io

from rich.console import Console

from millpond.cli.output import print_outcome
from millpond.shared.results import Outcome


def test_values_that_look_like_markup_are_shown_as_they_are() -> None:
    out = io.StringIO()
    rows = [["[bold red]ALERT[/] [link=http://x]click[/link]"], ["costs [/] 5"]]
    print_outcome(Outcome("SELECT * FROM t", "", columns=[("[b]V[/b]", "VARCHAR")], rows=rows), "table",
                  Console(file=out, width=200, color_system=None))
    shown = out.getvalue()
    assert "[bold red]ALERT[/] [link=http://x]click[/link]" in shown and "costs [/] 5" in shown and "[b]V[/b]" in shown
