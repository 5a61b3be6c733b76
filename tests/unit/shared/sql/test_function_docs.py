"""DESCRIBE FUNCTION's overviews cover every function the dialect has, and no other."""

from __future__ import annotations

from millpond.shared.sql import aggregates, functions
from millpond.shared.sql.function_docs import OVERVIEWS
from millpond.shared.sql.types import LAMBDA_FUNCTIONS, TABLE_FUNCTIONS


def test_every_function_has_an_overview_and_every_overview_a_function() -> None:
    names = {*functions.FUNCTIONS, *aggregates.AGGREGATES, *LAMBDA_FUNCTIONS, *TABLE_FUNCTIONS}
    assert names - OVERVIEWS.keys() == set(), "functions without an overview"
    assert OVERVIEWS.keys() - names == set(), "overviews of no function"
