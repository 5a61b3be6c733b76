"""Statement text from clients, admitted before and while it is parsed.

Parsing is the one step every client statement takes before anything else checks it, and
Lark's time grows with the text: 64K characters of nested parentheses take about a
second of pure Python here, more on a loaded machine, and the gRPC limit allows 4 MB. A
service that parsed on its event loop would stop its heartbeats and its leadership for
that long. So a statement is parsed only after cheap checks (its length, how deep its
parentheses nest: one pass of a regular expression), on a small thread pool, with a time
budget the parser itself checks between tokens, so a slow parse stops instead of holding
its thread. The router keeps what it parsed in a cache bounded by the bytes of the texts.

Replay of the command topic parses without these limits: a statement the cluster once
accepted must replay the same way whatever the limits are today.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from millpond.shared.errors import StatementError
from millpond.shared.sql import ast
from millpond.shared.sql.parser import MAX_DEPTH, ParseTimeoutError, only_statement, parse_script

PARSE_THREADS = 2
"""Parses run at once; more would only share the interpreter lock with the event loop."""
INLINE_PARSE_CHARS = 256
"""Texts up to this long are parsed on the event loop. The grammar is LALR, so a parse takes
time linear in the text: at most about 2 ms at this length (a 243-character SELECT of 48
columns, 1.7 ms here), under the interpreter's 5 ms switch interval, so a thread would not
give the loop the lock back any sooner. The hand-off is what costs: under bench.freshness's
load an INSERT's parse took p50 0.8 ms, p99 14-22 ms through the threads, against 0.2 ms of
parsing."""


@dataclass(frozen=True)
class ParseLimits:
    """What a service accepts of a client's statement text."""

    max_chars: int = 65536
    """Longest text (one request); longer is refused before anything looks inside it."""
    max_depth: int = MAX_DEPTH
    """Deepest nesting of parentheses; deeper is refused before the parser sees it."""
    timeout_s: float = 2.0
    """Longest a parse may take, from the moment it is asked for (waiting for a thread counts)."""


def check_length(text: str, limits: ParseLimits) -> None:
    """StatementError (INVALID_ARGUMENT) when the text is too long."""
    if len(text) > limits.max_chars:
        raise StatementError(f"the statement text is {len(text)} characters; at most {limits.max_chars} are "
                             "accepted (max_statement_chars): send fewer or shorter statements per request")


def check_text(text: str, limits: ParseLimits) -> None:
    """StatementError (INVALID_ARGUMENT) when the text is too long or nests too deep."""
    check_length(text, limits)
    if text.count("(") <= limits.max_depth:
        return  # cannot nest deeper: skip the scan
    where = too_deep_at(text, limits.max_depth)
    if where is not None:
        line = text.count("\n", 0, where) + 1
        column = where - (text.rfind("\n", 0, where) + 1) + 1
        raise StatementError(f"parentheses nest more than {limits.max_depth} levels deep; simplify the expression",
                             line=line, column=column)


_PAREN_OR_SKIPPED = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|`[^`]*`|--[^\n]*|[()]")
"""A parenthesis, or what may hold one that does not count (strings, quoted names, comments),
as the grammar's lexer reads them. No two alternatives match the same text the same way,
so a match fails in linear time."""


def too_deep_at(text: str, limit: int) -> int | None:
    """The offset of the first ``(`` nested more than ``limit`` deep, outside strings, quoted
    names and comments (None when there is none)."""
    depth = 0
    for match in _PAREN_OR_SKIPPED.finditer(text):
        token = match.group()
        if token == "(":
            depth += 1
            if depth > limit:
                return match.start()
        elif token == ")":
            depth = max(depth - 1, 0)
    return None


TREE_BYTES_PER_TEXT_BYTE = 128
"""What a parse is counted to hold per UTF-8 byte of its text: its syntax trees take 27-47
times the text (measured with tracemalloc: a key lookup 39, a CTAS 27, an IN list of 3,000
numbers 47), up to 118 for texts of many function calls."""
CACHED_PLAN_CHARS = 1024
"""Longer statements are planned each time, not kept planned (a plan holds the syntax tree:
a thousand plans of 64 KB texts held gigabytes); a repeated pull is short."""


class ParseCache:
    """Parsed statements by their text, least recently used first out, bounded by the memory
    their syntax trees take (``TREE_BYTES_PER_TEXT_BYTE`` per byte of text)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        """The bytes the parses held now are counted to take."""
        self._entries: OrderedDict[str, tuple[tuple[ast.Statement, ...], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, text: str) -> bool:
        return text in self._entries

    def get(self, text: str) -> tuple[ast.Statement, ...] | None:
        """The statements of ``text`` if held (it becomes the most recently used)."""
        entry = self._entries.get(text)
        if entry is None:
            return None
        self._entries.move_to_end(text)
        return entry[0]

    def put(self, text: str, statements: tuple[ast.Statement, ...]) -> None:
        """Hold the statements of ``text``, dropping the least recently used to stay in bounds;
        a text larger than the whole bound is not held."""
        size = len(text.encode()) * TREE_BYTES_PER_TEXT_BYTE
        if size > self.max_bytes or text in self._entries:
            return
        while self._entries and self.bytes + size > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.bytes -= dropped
        self._entries[text] = (statements, size)
        self.bytes += size


class StatementParser:
    """Parses client statement text within ``ParseLimits``: off the event loop, but for short texts."""

    def __init__(self, limits: ParseLimits, cache_bytes: int = 0):
        self.limits = limits
        self.cache = ParseCache(cache_bytes) if cache_bytes > 0 else None
        """Parsed texts (None: every text is parsed again)."""
        self._pool = ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="millpond-parse")

    def cached(self, text: str) -> bool:
        """Whether ``text`` was parsed and is still held."""
        return self.cache is not None and text in self.cache

    async def parse(self, text: str) -> tuple[ast.Statement, ...]:
        """The statements of ``text``; StatementError (INVALID_ARGUMENT) when it is malformed,
        too long, nests too deep or takes longer than the budget to parse."""
        check_text(text, self.limits)
        if self.cache is not None and (cached := self.cache.get(text)) is not None:
            return cached
        deadline = time.monotonic() + self.limits.timeout_s
        try:
            if len(text) <= INLINE_PARSE_CHARS:
                statements = tuple(parse_script(text, deadline=deadline))
            else:
                statements = tuple(await asyncio.get_running_loop().run_in_executor(
                    self._pool, functools.partial(parse_script, text, deadline=deadline)))
        except ParseTimeoutError as err:
            where = f" (it had reached line {err.line}:{err.column})" if err.line is not None else ""
            raise StatementError(
                f"the statement could not be parsed within {self.limits.timeout_s * 1000:.0f} ms "
                f"(parse_timeout_ms){where}; simplify it or split it into smaller statements") from None
        if self.cache is not None:
            self.cache.put(text, statements)
        return statements

    async def parse_one(self, text: str) -> ast.Statement:
        """Exactly one statement (a trailing ``;`` is allowed)."""
        return only_statement(await self.parse(text))

    def close(self) -> None:
        """Stop the threads once the parses under way end (each within its budget)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
