"""Session properties: what ``SET 'name'='value'`` may change, checked the same way by the
CLI, the router and the coordinator."""

from __future__ import annotations

from collections.abc import Mapping

from shared.errors import StatementError
from shared.sql import ast

AUTO_OFFSET_RESET = "auto.offset.reset"

PROPERTIES: dict[str, tuple[str, ...]] = {
    AUTO_OFFSET_RESET: ("earliest", "latest"),
}
"""Each known property and the values it takes."""

DEFAULTS: dict[str, str] = {AUTO_OFFSET_RESET: "latest"}
"""As in ksqlDB: a new query starts at the end of its input unless told otherwise."""


def check_property(name: str, value: str) -> None:
    """Raise with the accepted names or values when ``name = value`` is not a valid setting."""
    allowed = PROPERTIES.get(name)
    if allowed is None:
        raise StatementError(f"unknown property '{name}'; known properties: {', '.join(sorted(PROPERTIES))}")
    if value not in allowed:
        raise StatementError(f"property '{name}' takes {' or '.join(repr(v) for v in allowed)}; got {value!r}")


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
        check_property(stmt.name, DEFAULTS.get(stmt.name, ""))
        properties.pop(stmt.name, None)
        return f"Property '{stmt.name}' unset"
    return None
