"""Client statement text is refused cheaply when too long or too deep, parsed within a time
budget (off the event loop but for short texts), and the parse cache stays within its byte bound."""

from __future__ import annotations

import asyncio
import threading
import time
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millpond.shared.errors import ErrorKind, StatementError
from millpond.shared.sql import ast
from millpond.shared.sql.guard import (
    INLINE_PARSE_CHARS,
    TREE_BYTES_PER_TEXT_BYTE,
    ParseCache,
    ParseLimits,
    StatementParser,
    check_text,
    too_deep_at,
)
from millpond.shared.sql.parser import parse_script, parse_statement

NESTED_64K = "SELECT " + "(" * 32000 + "1" + ")" * 32000 + " FROM T;"
"""64K characters of nested parentheses: about a second of Lark on this machine, unguarded."""
WIDE_64K = "SELECT " + ", ".join(["A"] * 21000) + " FROM T;"
"""Flat, so it passes the cheap checks, yet Lark takes a good part of a second over it."""


def test_deep_parentheses_are_refused_before_the_parser_sees_them() -> None:
    started = time.monotonic()
    with pytest.raises(StatementError) as err:
        check_text(NESTED_64K, ParseLimits())
    assert time.monotonic() - started < 0.2
    assert err.value.kind is ErrorKind.INVALID
    assert "parentheses nest more than 200 levels deep" in err.value.message
    assert err.value.column == len("SELECT ") + 201


def test_a_text_longer_than_the_limit_is_refused_naming_the_limit() -> None:
    with pytest.raises(StatementError, match="at most 65536 are accepted \\(max_statement_chars\\)"):
        check_text("SHOW STREAMS;" + " " * 65536, ParseLimits())


def test_parentheses_in_strings_quoted_names_and_comments_do_not_count() -> None:
    limits = ParseLimits(max_depth=3)
    quoted = "SELECT '((((((', \"a((((((\", `b((((((` FROM T -- ((((((\nWHERE ((X = 1));"
    check_text(quoted, limits)
    assert isinstance(parse_statement(quoted), ast.Query)  # the scan reads the text as the grammar does
    assert too_deep_at("SELECT ((((1)))) FROM T", 3) == len("SELECT (((")
    assert too_deep_at("SELECT 'it''s (((((' , (((1))) FROM T", 3) is None


async def test_the_event_loop_keeps_ticking_while_a_slow_parse_runs() -> None:
    parser = StatementParser(ParseLimits(max_chars=10**6, timeout_s=60))
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    try:
        statements = await parser.parse(WIDE_64K)
    finally:
        done.set()
        await ticker
        parser.close()
    took = time.monotonic() - started
    assert isinstance(statements[0], ast.Query)
    assert took > 0.2, "the parse should be slow enough to show the loop ticking through it"
    # On the loop the parse would be one gap as long as itself; off it the loop only waits
    # for the interpreter lock now and then.
    assert len(gaps) >= 5 and max(gaps) < took / 3


async def test_a_short_text_is_parsed_on_the_loop_and_a_longer_one_on_a_parse_thread() -> None:
    parser = StatementParser(ParseLimits())
    threads: list[str] = []
    parse_on = parser._pool.submit

    def submit(call, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        threads.append("submitted")
        return parse_on(lambda: (threads.append(threading.current_thread().name), call(*args, **kwargs))[1])
    parser._pool.submit = submit  # type: ignore[method-assign]
    short = "INSERT INTO readings (sensor, reading) VALUES ('s-1', 42);"
    longer = "SELECT " + ", ".join(f"C{i}" for i in range(60)) + " FROM T;"
    assert len(short) <= INLINE_PARSE_CHARS < len(longer)
    try:
        (inserted,) = await parser.parse(short)
        assert isinstance(inserted, ast.InsertValues) and threads == [], "no hand-off for a short text"
        (selected,) = await parser.parse(longer)
    finally:
        parser.close()
    assert isinstance(selected, ast.Query) and len(selected.items) == 60
    assert threads[0] == "submitted" and threads[1].startswith("millpond-parse")


async def test_a_parse_past_its_budget_stops_with_a_clear_error() -> None:
    parser = StatementParser(ParseLimits(timeout_s=0.05))
    started = time.monotonic()
    try:
        with pytest.raises(StatementError) as err:
            await parser.parse(WIDE_64K)
    finally:
        parser.close()
    assert time.monotonic() - started < 0.5
    assert err.value.kind is ErrorKind.INVALID
    assert "could not be parsed within 50 ms (parse_timeout_ms)" in err.value.message


async def test_parses_are_cached_within_the_byte_bound() -> None:
    bound = 100 * TREE_BYTES_PER_TEXT_BYTE
    parser = StatementParser(ParseLimits(), cache_bytes=bound)
    try:
        first = await parser.parse("SHOW STREAMS;")
        assert await parser.parse("SHOW STREAMS;") is first
        for n in range(20):
            await parser.parse(f"SELECT * FROM TABLE_NUMBER_{n};")
    finally:
        parser.close()
    assert parser.cache is not None and 0 < parser.cache.bytes <= bound
    assert parser.cache.get("SHOW STREAMS;") is None  # the least recently used went first


@given(st.lists(st.text(max_size=40), max_size=60), st.integers(1, 200))
def test_the_cache_never_holds_more_bytes_than_its_bound(texts: list[str], text_bound: int) -> None:
    bound = text_bound * TREE_BYTES_PER_TEXT_BYTE
    cache = ParseCache(bound)
    for text in texts:
        cache.put(text, ())
        assert cache.bytes <= bound
    held = [t for t in dict.fromkeys(texts) if cache.get(t) is not None]
    assert cache.bytes == sum(len(t.encode()) * TREE_BYTES_PER_TEXT_BYTE for t in held) and len(cache) == len(held)
    if texts and len(texts[-1].encode()) * TREE_BYTES_PER_TEXT_BYTE <= bound:
        assert cache.get(texts[-1]) == ()


def test_the_bound_counts_the_syntax_trees_not_the_text() -> None:
    """A parse's trees take 27-118 times its text: the bound holds that much less text."""
    text = "SELECT * FROM t WHERE n IN (" + ",".join(str(i) for i in range(3000)) + ");"
    statements = tuple(parse_script(text))
    tracemalloc.start()
    copies = [tuple(parse_script(text)) for _ in range(3)]
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(copies) == 3 and held / 3 <= len(text.encode()) * TREE_BYTES_PER_TEXT_BYTE
    cache = ParseCache(len(text.encode()) * TREE_BYTES_PER_TEXT_BYTE - 1)
    cache.put(text, statements)
    assert len(cache) == 0
