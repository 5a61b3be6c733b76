"""Metastores the unit tests build from statements."""

from __future__ import annotations

from collections.abc import Iterable

from millpond.shared.catalog.metastore import Metastore
from millpond.shared.sql.parser import parse_statement


def applied(statements: Iterable[str]) -> Metastore:
    """A metastore with ``statements`` applied in order, each at its offset in the command topic
    (``Metastore.apply``: without the coordinator's acceptance checks)."""
    meta = Metastore()
    for offset, statement in enumerate(statements):
        meta.apply(parse_statement(statement), offset)
    return meta
