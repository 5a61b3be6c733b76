"""LIKE as Spark reads its pattern (``%``: any text, ``_``: one character, ``\\`` before ``%``,
``_`` or itself: that character), matched in time linear in the value: in Python (pulls,
pushes, joins) and in the Spark SQL of persistent queries.

Spark's own LIKE is a java.util.regex of ``.*`` per ``%``, which backtracks: ten ``%`` before a
letter the value lacks took 8.5 s per row of 30 characters (a pattern column: Spark compiles it
per row) and fails every batch on a pattern it cannot read (a ``\\`` before another character,
or at the end). The pieces between ``%`` have fixed lengths, so the leftmost place of each is
the best for the rest: Python searches them in turn; the Spark form is one Java regex that
does the same, each piece an atomic group (``(?>.*?piece)``: found leftmost, never tried
again). A pattern literal Spark's optimizer turns into a prefix, suffix or containment test
(one ``%`` at most between two pieces without ``_`` or ``\\``) stays Spark's LIKE.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from millpond.shared.errors import StatementError
from millpond.shared.sql import ast

_JAVA_SPECIAL = frozenset("\\^$.|?*+()[]{}")
"""What a java.util.regex outside a class reads as more than the character itself."""
_SIMPLE = re.compile(r"[^%_\\]*|%?[^%_\\]+%?|[^%_\\]+%[^%_\\]+", re.DOTALL)
"""The literal patterns left to Spark's LIKE: its optimizer makes them string tests (and its
regex of them cannot backtrack beyond one ``.*``)."""
_TOKENS = r"\\[%_\\]|[^\\]"
"""A pattern's tokens, as java.util.regex reads them off a pattern column, left to right: an
escaped character, or one other character (a whole code point)."""
_PAIRS = r"\\[%_\\]"


class LikePatternError(StatementError, ValueError):
    """A LIKE pattern with a ``\\`` before a character other than ``%``, ``_`` and ``\\``, or at its end."""


def like(value: Any, pattern: Any) -> bool | None:
    """``value LIKE pattern``; NULL when either is, or when ``pattern`` cannot be read (as the
    Spark form gives: a literal one is refused when the statement is run, ``refusal``)."""
    if value is None or pattern is None:
        return None
    try:
        first, *rest = _pieces(pattern)
    except LikePatternError:
        return None
    if not rest:
        return first[0].fullmatch(value) is not None
    *middle, (last, last_length) = rest
    head = first[0].match(value)
    if head is None:
        return False
    at = head.end()
    for piece, _ in middle:
        found = piece.search(value, at)
        if found is None:
            return False
        at = found.end()
    tail = len(value) - last_length
    return tail >= at and last.fullmatch(value, tail) is not None


def _tokens(pattern: str) -> list[str]:
    """The pattern's tokens: ``%`` and ``_`` the wildcards, any other a character to match
    (an escaped ``%``, ``_`` or ``\\`` written ``\\%``, ``\\_``, ``\\\\``)."""
    tokens: list[str] = []
    chars = iter(pattern)
    for c in chars:
        if c == "\\":
            escaped = next(chars, "")
            if escaped not in ("%", "_", "\\"):
                before = repr(escaped) if escaped else "its end"
                raise LikePatternError(f"the LIKE pattern {pattern!r} has a \\ before {before}: "
                                       "\\ escapes only %, _ and \\ (write \\\\ for a backslash)")
            tokens.append(c + escaped)
        else:
            tokens.append(c)
    return tokens


@functools.lru_cache(maxsize=256)
def _pieces(pattern: str) -> list[tuple[re.Pattern[str], int]]:
    """A LIKE pattern's pieces between its ``%``s, each a regex and the length it matches."""
    pieces: list[tuple[re.Pattern[str], int]] = []
    regex: list[str] = []
    for token in _tokens(pattern):
        if token == "%":
            pieces.append((re.compile("".join(regex), re.DOTALL), len(regex)))
            regex = []
        else:
            regex.append("." if token == "_" else re.escape(token[-1]))
    pieces.append((re.compile("".join(regex), re.DOTALL), len(regex)))
    return pieces


def refusal(pattern: ast.Expr) -> str | None:
    """Why a pattern written as text cannot be a LIKE's (Spark would fail every batch on it)."""
    text = ast.literal_text(pattern)
    if text is None:
        return None
    try:
        _tokens(text)
    except LikePatternError as error:
        return str(error)
    return None


def java_regex(pattern: str) -> str:
    """The java.util.regex that ``RLIKE`` (a search) matches exactly where ``pattern`` LIKEs."""
    out = ["(?s)\\A(?>"]
    for token in _tokens(pattern):
        if token == "%":
            out.append(")(?>.*?")
        elif token == "_":
            out.append(".")
        else:
            out.append("\\" + token[-1] if token[-1] in _JAVA_SPECIAL else token[-1])
    out.append("\\z)")  # inside the last group: its piece is the one that ends the value
    return "".join(out)


def in_spark(value: str, pattern: ast.Expr, pattern_sql: str, literal: Any) -> str:
    """Spark SQL for ``value LIKE pattern`` (``pattern_sql`` its SQL; ``literal`` writes a
    text as a Spark SQL literal). A pattern column is made that regex row by row in Spark,
    NULL where it cannot be read."""
    if (text := ast.literal_text(pattern)) is not None:
        if _SIMPLE.fullmatch(text):
            return f"({value} LIKE {pattern_sql})"
        return f"({value} RLIKE {literal(java_regex(text))})"
    p = pattern_sql
    special = "".join(sorted(_JAVA_SPECIAL))
    regex = (f"array_join(transform(regexp_extract_all({p}, {literal(_TOKENS)}, 0), t -> CASE "
             f"WHEN t = '%' THEN {literal(')(?>.*?')} WHEN t = '_' THEN '.' "
             f"WHEN length(t) = 1 AND instr({literal(special)}, t) > 0 THEN concat({literal(chr(92))}, t) "
             "ELSE t END), '')")  # an escape pair stays: \%, \_ and \\ are those characters to Java too
    readable = f"instr(regexp_replace({p}, {literal(_PAIRS)}, ''), {literal(chr(92))}) = 0"
    return (f"(CASE WHEN {readable} THEN {value} RLIKE concat({literal('(?s)' + chr(92) + 'A(?>')}, {regex}, "
            f"{literal(chr(92) + 'z)')}) END)")
