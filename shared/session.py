"""Session properties: what ``SET 'name'='value'`` may change, checked the same way by the
CLI, the router and the coordinator."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from millpond.shared.errors import StatementError
from millpond.shared.sql import ast

AUTO_OFFSET_RESET = "auto.offset.reset"
ENABLE_STANDBY_READS = "ksql.query.pull.enable.standby.reads"
MAX_OFFSET_LAG = "ksql.query.pull.max.allowed.offset.lag"
MAX_STALENESS_MS = "millpond.query.pull.max.staleness.ms"


def _one_of(*values: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in values else f"takes {' or '.join(repr(v) for v in values)}"
    return check


def _count(value: str) -> str | None:
    # isdigit alone takes "²" and other digits int() refuses; 18 digits fit any BIGINT.
    return None if value.isascii() and value.isdigit() and len(value) <= 18 else "takes a whole number of 0 or more"


PROPERTIES: dict[str, Callable[[str], str | None]] = {
    AUTO_OFFSET_RESET: _one_of("earliest", "latest"),
    ENABLE_STANDBY_READS: _one_of("true", "false"),
    MAX_OFFSET_LAG: _count,
    MAX_STALENESS_MS: _count,
}
"""Each known property and its check (what the value should be, or None when it is fine)."""

DEFAULTS: dict[str, str] = {AUTO_OFFSET_RESET: "latest"}
"""As in ksqlDB: a new query starts at the end of its input unless told otherwise. (The
pull-query bounds default to the router's settings.)"""


MAX_REQUEST_ID_CHARS = 128
"""The longest request id a client may give (a UUID has 36 characters): each statement's id
(``<id>/<n>``) is kept in memory and in an INSERT's record header."""
STATEMENT_ID_CHARS = MAX_REQUEST_ID_CHARS + 8
"""The longest id of one statement of a request, as the router forwards it (``<id>/<n>``)."""


def check_request_id(request_id: str, most: int = MAX_REQUEST_ID_CHARS) -> None:
    """Refuse a request id too long to keep."""
    if len(request_id) > most:
        raise StatementError(f"request_id has {len(request_id)} characters; give one of at most {most} (a UUID is 36)")


def check_name(name: str) -> None:
    """Raise with the accepted names when ``name`` is not a property."""
    if name not in PROPERTIES:
        raise StatementError(f"unknown property '{name}'; known properties: {', '.join(sorted(PROPERTIES))}")


def check_property(name: str, value: str) -> None:
    """Raise with the accepted names or values when ``name = value`` is not a valid setting."""
    check_name(name)
    problem = PROPERTIES[name](value)
    if problem is not None:
        raise StatementError(f"property '{name}' {problem}; got {value!r}")


def check_properties(properties: Mapping[str, str]) -> None:
    """Check every property of a request."""
    for name, value in properties.items():
        check_property(name, value)


def effective(properties: Mapping[str, str], defaults: Mapping[str, str] = DEFAULTS) -> dict[str, str]:
    """The defaults overlaid with the session's own settings."""
    return {**defaults, **properties}


def apply_session_statement(properties: dict[str, str], stmt: ast.Statement) -> str | None:
    """Apply a SET or UNSET to ``properties`` and say what changed; None for other statements."""
    if isinstance(stmt, ast.SetProperty):
        check_property(stmt.name, stmt.value)
        properties[stmt.name] = stmt.value
        return f"Property '{stmt.name}' set to '{stmt.value}'"
    if isinstance(stmt, ast.UnsetProperty):
        check_name(stmt.name)
        properties.pop(stmt.name, None)
        return f"Property '{stmt.name}' unset"
    return None
