"""Who may do what: clients present bearer tokens that name a principal with permissions;
services prove who they are with their TLS client certificate.

Pure: no gRPC here. The interceptor in ``millpond.shared.rpc.auth`` reads the call's metadata and
peer certificate and asks this module; the router asks it per statement.

The tokens file (TOML, named by ``MILLPOND_AUTH_TOKENS_FILE``) maps principals to a token
(or its SHA-256, so the file need not hold secrets) and permissions; it is read again
whenever it changes::

    [principals.alice]
    token_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    permissions = ["read", "write"]

    [principals.ops]
    token = "a-long-random-secret"
    permissions = ["admin"]
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import os
import re
import tomllib
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from millpond.shared.errors import ErrorKind, MillpondError, SetupError
from millpond.shared.sql import ast


class Permission(Enum):
    """What a principal may do."""

    READ = "read"
    """Pull and push queries, SHOW, DESCRIBE, EXPLAIN."""
    WRITE = "write"
    """INSERT INTO ... VALUES."""
    ADMIN = "admin"
    """DDL, persistent queries, TERMINATE, cluster status, operator RPCs."""


class AuthenticationError(MillpondError):
    """The caller did not prove who it is (no token, an unknown token)."""

    kind = ErrorKind.UNAUTHENTICATED


class PermissionDeniedError(MillpondError):
    """The caller is known but may not do this."""

    kind = ErrorKind.PERMISSION_DENIED


@dataclass(frozen=True)
class Principal:
    """An authenticated caller."""

    name: str
    permissions: frozenset[Permission]
    service: bool = False
    """True for Millpond's own services (identified by their certificate), which may call
    the internal RPCs: heartbeats, lag reports, assignments, local pull queries."""

    def allows(self, permission: Permission) -> bool:
        """Whether this principal holds ``permission`` (services hold all)."""
        return self.service or permission in self.permissions

    def require(self, permission: Permission, what: str) -> None:
        """PermissionDeniedError unless this principal holds ``permission`` (services hold all)."""
        if not self.allows(permission):
            granted = ", ".join(sorted(p.value for p in self.permissions)) or "none"
            raise PermissionDeniedError(
                f"principal {self.name} may not {what}: that needs the {permission.value} permission "
                f"(it has {granted}); ask an administrator for a token that grants it")


ANONYMOUS = Principal("anonymous", frozenset(Permission), service=True)
"""The caller when security is off: everything is allowed, as on an unsecured cluster."""

CURRENT: contextvars.ContextVar[Principal] = contextvars.ContextVar("millpond_principal", default=ANONYMOUS)
"""The principal of the call being served (set by the server's interceptor)."""


def statement_permission(stmt: ast.Statement) -> Permission | None:
    """The permission a statement needs (None: SET and UNSET, which only change the session)."""
    if isinstance(stmt, (ast.SetProperty, ast.UnsetProperty)):
        return None
    if isinstance(stmt, (ast.Query, ast.Show, ast.Describe, ast.Explain)):
        return Permission.READ
    if isinstance(stmt, ast.InsertValues):
        return Permission.WRITE
    return Permission.ADMIN


def authorize_statement(principal: Principal, stmt: ast.Statement) -> None:
    """PermissionDeniedError when ``principal`` may not run ``stmt``."""
    permission = statement_permission(stmt)
    # The message is made only for a refusal: every pull query passes here.
    if permission is not None and not principal.allows(permission):
        principal.require(permission, f"run {type(stmt).__name__} statements ({_first_words(stmt.text)})")


_LEAST_BY_KEYWORD = {
    "SELECT": Permission.READ, "SHOW": Permission.READ, "LIST": Permission.READ, "DESCRIBE": Permission.READ,
    "EXPLAIN": Permission.READ, "INSERT": Permission.WRITE, "CREATE": Permission.ADMIN, "DROP": Permission.ADMIN,
    "TERMINATE": Permission.ADMIN, "ALTER": Permission.ADMIN,
}
"""The least permission any statement starting with the keyword needs (INSERT ... VALUES
needs write, INSERT ... SELECT admin)."""
_SESSION_KEYWORDS = frozenset({"SET", "UNSET"})
_LEADING_WORD = re.compile(r"(?:\s+|--[^\n]*)*([A-Za-z_]*)")
"""Blanks and comments, then a word. Both parts match the empty text, so a match never
backtracks whatever follows."""


def authorize_text(principal: Principal, text: str) -> None:
    """PermissionDeniedError, before ``text`` is parsed, when ``principal`` may run no
    statement that starts the way it does (nor any statement at all, for text the parser
    would refuse): parsing is the costliest step a caller can make a service take, so one
    who could not run the statement anyway is refused first. ``authorize_statement`` on
    the parsed statement decides."""
    if principal.service:
        return
    keyword = leading_keyword(text)
    if keyword in _SESSION_KEYWORDS:
        return
    permission = _LEAST_BY_KEYWORD.get(keyword)
    if permission is not None:
        principal.require(permission, f"run {keyword} statements")
    elif not principal.permissions:
        raise PermissionDeniedError(f"principal {principal.name} holds no permission, so may run no statement; "
                                    "ask an administrator for a token that grants one")


def leading_keyword(text: str) -> str:
    """The first word of ``text`` after blanks and ``--`` comments, upper-cased ("" when none)."""
    match = _LEADING_WORD.match(text)
    return match.group(1).upper() if match else ""


def _first_words(text: str, n: int = 4) -> str:
    return " ".join(text.split()[:n]) + " ..."


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class _Entry:
    name: str
    digest: str
    permissions: frozenset[Permission]


class TokenBook:
    """The tokens file, read again when it changes on disk."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._entries: list[_Entry] = []
        self._load()

    def _load(self) -> None:
        try:
            stat = os.stat(self.path)
        except OSError as err:
            raise SetupError(f"cannot read the tokens file {self.path}: {err.strerror}; set "
                             "MILLPOND_AUTH_TOKENS_FILE to a readable TOML file") from None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        self._entries = parse_tokens(self.path.read_text(), str(self.path))
        self._stamp = stamp

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``authorization`` metadata value (``Bearer <token>``)."""
        if not authorization:
            raise AuthenticationError("this cluster needs a bearer token: send the metadata "
                                      "'authorization: Bearer <token>' (millpond sql --token, or MILLPOND_TOKEN)")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationError("the authorization metadata must be 'Bearer <token>'")
        try:
            self._load()
        except (SetupError, ValueError):
            pass  # a file being rewritten: keep the last good one
        digest = _sha256(token.strip())
        for entry in self._entries:
            if hmac.compare_digest(entry.digest, digest):
                return Principal(entry.name, entry.permissions)
        raise AuthenticationError("the bearer token is not valid for this cluster")


def parse_tokens(text: str, where: str = "tokens file") -> list[_Entry]:
    """The principals of a tokens file; ValueError naming what to fix."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"{where} is not TOML: {err}") from None
    principals = data.get("principals")
    if not isinstance(principals, dict):
        raise ValueError(f"{where} needs a [principals.<name>] table per principal")
    known = {p.value for p in Permission}
    entries = []
    for name, body in principals.items():
        if not isinstance(body, dict):
            raise ValueError(f"{where}: principals.{name} must be a table")
        token, digest = body.get("token"), body.get("token_sha256")
        if (token is None) == (digest is None):
            raise ValueError(f"{where}: principals.{name} needs exactly one of token and token_sha256")
        permissions = body.get("permissions", [])
        if not isinstance(permissions, list) or not all(isinstance(p, str) for p in permissions) \
                or not set(permissions) <= known:
            raise ValueError(f"{where}: principals.{name}.permissions must be a list drawn from {sorted(known)}")
        entries.append(_Entry(name, _sha256(str(token)) if token is not None else str(digest).lower(),
                              frozenset(Permission(p) for p in permissions)))
    return entries
