"""The router refuses statement text that is too long or nested too deep before parsing it,
and a caller who may not run what the text starts with."""

from __future__ import annotations

import time
from typing import Any, cast

import pytest

from millpond.services.router.statements import Statements
from millpond.shared import security
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import RouterSettings
from millpond.shared.errors import ErrorKind, StatementError
from millpond.shared.security import PermissionDeniedError, Principal
from millpond.shared.sql.guard import StatementParser

NESTED_64K = "SELECT " + "(" * 32000 + "1" + ")" * 32000 + " FROM T;"


def _statements() -> Statements:
    settings = RouterSettings()
    unused = cast(Any, None)  # reader, coordinators, pulls: a refused request never reaches them
    return Statements(settings, Metastore(), unused, unused, unused,
                      StatementParser(settings.parse_limits, settings.parse_cache_bytes))


async def test_64k_of_nested_parentheses_is_refused_fast() -> None:
    statements = _statements()
    started = time.monotonic()
    with pytest.raises(StatementError) as err:
        await statements.execute(NESTED_64K, {})
    assert time.monotonic() - started < 0.5
    assert err.value.kind is ErrorKind.INVALID and "nest more than 200 levels" in err.value.message
    assert statements.parser.cache is not None and len(statements.parser.cache) == 0


async def test_a_caller_with_no_permission_is_refused_before_the_parse() -> None:
    statements = _statements()
    token = security.CURRENT.set(Principal("nobody", frozenset()))
    try:
        with pytest.raises(PermissionDeniedError, match="needs the read permission"):
            await statements.execute("SELECT " + ", ".join(["A"] * 20000) + " FROM T;", {})
    finally:
        security.CURRENT.reset(token)
    assert statements.parser.cache is not None and len(statements.parser.cache) == 0
