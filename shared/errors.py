"""The project's one exception root.

Domain code raises these; the gRPC layer maps ``kind`` to a status code in exactly one
place (``millpond.shared.rpc.status``). Messages are meant for the operator or the client: they say
what was wrong and what to do next.
"""

from __future__ import annotations

from enum import Enum


class ErrorKind(Enum):
    """What went wrong, independent of any transport."""

    INVALID = "invalid"
    NOT_FOUND = "not_found"
    ALREADY_EXISTS = "already_exists"
    UNAVAILABLE = "unavailable"
    FAILED_PRECONDITION = "failed_precondition"
    DEADLINE = "deadline"
    """A downstream call ran out of time: ``rpc.status.raise_for_rpc`` maps DEADLINE_EXCEEDED here,
    so the client sees that status rather than INTERNAL."""
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    INTERNAL = "internal"


class MillpondError(Exception):
    """Root of every error Millpond raises on purpose."""

    kind: ErrorKind = ErrorKind.INTERNAL

    def __init__(self, message: str, *, kind: ErrorKind | None = None) -> None:
        super().__init__(message)
        self.message = message
        if kind is not None:
            self.kind = kind


class SetupError(MillpondError):
    """The machine lacks something the project needs (a tool, a jar, a free port)."""

    kind = ErrorKind.FAILED_PRECONDITION


class StatementError(MillpondError):
    """A statement is malformed or refers to something that does not fit.

    ``line`` and ``column`` (1-based) locate the problem in the statement text when known.
    """

    kind = ErrorKind.INVALID

    def __init__(
        self,
        message: str,
        *,
        kind: ErrorKind | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        where = f"line {line}:{column}: " if line is not None and column is not None else ""
        super().__init__(where + message, kind=kind)
        self.line = line
        self.column = column


class NotFoundError(MillpondError):
    """A named stream, table, query or key does not exist."""

    kind = ErrorKind.NOT_FOUND


class AlreadyExistsError(MillpondError):
    """Something with that name exists already."""

    kind = ErrorKind.ALREADY_EXISTS


class UnavailableError(MillpondError):
    """No host can serve the request right now; retrying later may succeed."""

    kind = ErrorKind.UNAVAILABLE


class LimitError(MillpondError):
    """A request goes past one of the service's configured limits."""

    kind = ErrorKind.RESOURCE_EXHAUSTED
