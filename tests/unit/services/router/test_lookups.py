"""The key-lookup fast path: a lookup of a known shape asking for another key gets exactly
the statement and plan a parse and plan of its text would give, without a parse; anything
else (another shape, another value of a literal that is not the key, a changed metastore,
a key literal that is not one literal of the text) is parsed as before."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from millpond.services.router import lookups
from millpond.services.router.lookups import LookupTemplates
from millpond.services.router.pull import PullPlan, plan_pull
from millpond.services.router.statements import Statements
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import RouterSettings
from millpond.shared.errors import StatementError
from millpond.shared.results import Outcome
from millpond.shared.sql import ast
from millpond.shared.sql.guard import ParseLimits, StatementParser
from millpond.shared.sql.parser import parse_statement
from millpond.shared.sql.shapes import shape_of


def metastore() -> Metastore:
    meta = Metastore()
    for offset, sql in enumerate([
            "CREATE STREAM readings (sensor VARCHAR KEY, reading INT) "
            "WITH (kafka_topic='readings', partitions=4, value_format='json')",
            "CREATE TABLE counts AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor",
            "CREATE STREAM events (id BIGINT KEY, v INT) WITH (kafka_topic='events', partitions=3, value_format='json')",
            "CREATE TABLE by_id AS SELECT id, COUNT(*) AS n FROM events GROUP BY id"]):
        meta.apply(parse_statement(sql), offset)
    return meta


def planned(meta: Metastore, sql: str) -> tuple[ast.Query, PullPlan]:
    query = parse_statement(sql)
    assert isinstance(query, ast.Query)
    return query, plan_pull(query, meta, "svc")


def sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


STRING_SHAPES = [
    "SELECT * FROM counts WHERE sensor = {k}",
    "SELECT sensor, n FROM counts WHERE n > 3 AND sensor = {k} LIMIT 5",
    "select n as \"it's '?'\" from counts -- 'a comment' 12\n where {k} = sensor",
    "  SELECT * FROM counts WHERE sensor = {k} ;  ",
    "SELECT sensor, -n * 3 AS m FROM counts WHERE n * 1000000000000 > 0 AND sensor = {k}",
]


def widths(tree: Any) -> list[int]:
    """The ``bits`` of every arithmetic in ``tree``, in order (what its evaluation wraps at)."""
    if isinstance(tree, tuple | list):
        return [bits for item in tree for bits in widths(item)]
    if not dataclasses.is_dataclass(tree) or isinstance(tree, type):
        return []
    own = [tree.bits] if isinstance(tree, ast.Binary | ast.Unary) else []
    return own + [bits for f in dataclasses.fields(tree) for bits in widths(getattr(tree, f.name))]


@settings(max_examples=150, deadline=None)
@given(shape=st.sampled_from(STRING_SHAPES), first=st.text(max_size=12), second=st.text(max_size=12))
def test_another_key_of_a_known_shape_is_what_its_parse_and_plan_give(shape: str, first: str, second: str) -> None:
    meta = metastore()
    learned_sql, asked_sql = shape.format(k=sql_string(first)), shape.format(k=sql_string(second))

    async def run() -> tuple[ast.Query, PullPlan] | None:
        templates = LookupTemplates(StatementParser(ParseLimits(), cache_bytes=1 << 20))
        await templates.learn(*planned(meta, learned_sql), meta.command_offset)
        assert len(templates) == 1
        made = templates.match(asked_sql, meta.command_offset)
        again = templates.match(asked_sql, meta.command_offset)  # the same text asked again: as made before
        assert again == made and (again is None or again[0].text == made[0].text)  # type: ignore[index]
        return made

    found = asyncio.run(run())
    assert found is not None
    query, plan = found
    expected_query, expected_plan = planned(meta, asked_sql)
    assert query == expected_query and query.text == expected_query.text
    assert plan == expected_plan and plan.partition == expected_plan.partition and plan.key == second
    # Typed as the plan's own (``with_widths``): its arithmetic wraps as Spark's.
    assert widths((plan.items, plan.where)) == widths((expected_plan.items, expected_plan.where))


@pytest.mark.parametrize("learned,asked", [
    ("SELECT * FROM by_id WHERE id = 5", "SELECT * FROM by_id WHERE id = 3000000000"),  # INT -> BIGINT literal
    ("SELECT * FROM by_id WHERE id = 12 AND n >= 1", "SELECT * FROM by_id WHERE id = 0 AND n >= 1"),
])
async def test_integer_keys(learned: str, asked: str) -> None:
    meta = metastore()
    templates = LookupTemplates(StatementParser(ParseLimits()))
    await templates.learn(*planned(meta, learned), meta.command_offset)
    assert templates.match(asked, meta.command_offset) == planned(meta, asked)


@pytest.mark.parametrize(("asked", "fragment"), [
    ("SELECT * FROM by_id WHERE id = 9223372036854775808", "out of BIGINT's range"),
    ("SELECT * FROM by_id WHERE id = " + "9" * 30, "more digits than a BIGINT holds"),
])
async def test_a_key_beyond_bigint_made_of_a_template_is_the_statements_error(asked: str, fragment: str) -> None:
    meta = metastore()
    templates = LookupTemplates(StatementParser(ParseLimits()))
    await templates.learn(*planned(meta, "SELECT * FROM by_id WHERE id = 5"), meta.command_offset)
    with pytest.raises(StatementError, match=fragment):
        templates.match(asked, meta.command_offset)
    with pytest.raises(StatementError, match=fragment):  # as the parse and plan of the same text say
        planned(meta, asked)


class _CountingParser(StatementParser):
    parses = 0

    async def parse(self, text: str) -> tuple[ast.Statement, ...]:
        self.parses += 1
        return await super().parse(text)


@pytest.mark.parametrize("sql", [
    "SELECT 'a' AS x FROM counts WHERE sensor = 'a'",  # the key's value is written twice
    "SELECT * FROM by_id WHERE id = -0",  # -0 is folded to 0: the literal 0 is not the key as written
    "SELECT * FROM by_id WHERE id = -7",
    "SELECT * FROM counts WHERE n = 1",  # no key
    "SELECT * FROM counts",
])
async def test_what_is_not_a_template(sql: str) -> None:
    meta = metastore()
    parser = _CountingParser(ParseLimits())
    templates = LookupTemplates(parser)
    for _ in range(3):
        await templates.learn(*planned(meta, sql), meta.command_offset)
    assert len(templates) == 0
    assert parser.parses <= 1  # one probe at most, not one per request


@pytest.mark.parametrize("asked", [
    "SELECT sensor, n FROM counts WHERE n > 4 AND sensor = 'b' LIMIT 5",  # another value of a literal not the key
    "SELECT sensor, n FROM counts WHERE n > 3 AND sensor = 'b' LIMIT 6",
    "SELECT sensor, n FROM counts WHERE n > 3 AND sensor = 7 LIMIT 5",  # an integer where the key was a string
    "SELECT sensor, n FROM counts WHERE n > 3 AND sensor = 'b' LIMIT 5; SELECT * FROM counts",
    "SELECT sensor, n FROM counts WHERE n > 3 AND sensor = 'b'  LIMIT 5",  # spaced differently
])
async def test_a_text_of_another_shape_is_parsed(asked: str) -> None:
    meta = metastore()
    templates = LookupTemplates(StatementParser(ParseLimits()))
    await templates.learn(*planned(meta, "SELECT sensor, n FROM counts WHERE n > 3 AND sensor = 'a' LIMIT 5"),
                          meta.command_offset)
    assert len(templates) == 1
    assert templates.match(asked, meta.command_offset) is None


async def test_a_text_made_of_a_template_lately_is_not_taken_apart_again(monkeypatch: pytest.MonkeyPatch) -> None:
    meta = metastore()
    templates = LookupTemplates(StatementParser(ParseLimits(), cache_bytes=1 << 20), size=2)
    await templates.learn(*planned(meta, "SELECT * FROM counts WHERE sensor = 'a'"), meta.command_offset)
    shapes: list[str] = []
    monkeypatch.setattr(lookups, "shape_of", lambda text: shapes.append(text) or shape_of(text))
    texts = ["SELECT * FROM counts WHERE sensor = 'k1'", "SELECT * FROM counts WHERE sensor = 'k2'"]
    made = [templates.match(text, meta.command_offset) for text in texts]
    assert [templates.match(text, meta.command_offset) for text in reversed(texts)] == made[::-1]
    assert shapes == texts  # the second time, as made the first
    assert made[0] == planned(meta, texts[0]) and made[1] == planned(meta, texts[1])
    templates.match("SELECT * FROM counts WHERE sensor = 'k3'", meta.command_offset)  # two kept: k2 is dropped
    assert templates.match(texts[0], meta.command_offset) == made[0] and len(shapes) == 3
    assert templates.match(texts[1], meta.command_offset) == made[1] and len(shapes) == 4
    long = "SELECT * FROM counts WHERE sensor = '" + "x" * lookups.MAX_INSTANCE_CHARS + "'"
    for _ in range(2):
        assert templates.match(long, meta.command_offset) == planned(meta, long)
    assert len(shapes) == 6  # a long text is made again each time


async def test_no_text_is_kept_made_when_the_parser_keeps_no_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    meta = metastore()
    templates = LookupTemplates(StatementParser(ParseLimits(), cache_bytes=0))
    await templates.learn(*planned(meta, "SELECT * FROM counts WHERE sensor = 'a'"), meta.command_offset)
    shapes: list[str] = []
    monkeypatch.setattr(lookups, "shape_of", lambda text: shapes.append(text) or shape_of(text))
    for _ in range(2):
        assert templates.match("SELECT * FROM counts WHERE sensor = 'b'", meta.command_offset) is not None
    assert len(shapes) == 2


async def test_a_template_holds_for_its_metastore_version_only() -> None:
    meta = metastore()
    templates = LookupTemplates(StatementParser(ParseLimits()))
    await templates.learn(*planned(meta, "SELECT * FROM counts WHERE sensor = 'a'"), meta.command_offset)
    assert templates.match("SELECT * FROM counts WHERE sensor = 'b'", meta.command_offset) is not None
    meta.apply(parse_statement("CREATE STREAM other (k VARCHAR KEY) WITH (kafka_topic='o', partitions=1, "
                               "value_format='json')"), meta.command_offset + 1)
    assert templates.match("SELECT * FROM counts WHERE sensor = 'b'", meta.command_offset) is None


def test_shapes_keep_what_only_looks_like_a_literal() -> None:
    shape = shape_of("SELECT x1, 2.5, 1e3, `a'1`, \"b'2\" FROM t WHERE k = 'it''s' AND n = 42 -- '3' 4")
    assert shape.literals == ("'it''s'", "42")
    assert shape.value(0) == ast.Literal("it's", ast.SqlType("VARCHAR"))
    assert shape.text() == "SELECT x1, 2.5, 1e3, `a'1`, \"b'2\" FROM t WHERE k = 'it''s' AND n = 42 -- '3' 4"


class _Pulls:
    """The router's pull path, planning for real and answering with the plan's key."""

    def __init__(self, meta: Metastore):
        self.meta, self.planned = meta, 0

    async def plan(self, stmt: ast.Query) -> PullPlan:
        self.planned += 1
        return plan_pull(stmt, self.meta, "svc")

    async def pull(self, stmt: ast.Query, plan: PullPlan, *_: Any) -> tuple[Outcome, dict[Any, int]]:
        return Outcome(stmt.text, "", rows=[[plan.key]]), {}


async def test_the_router_parses_and_plans_one_lookup_per_shape() -> None:
    meta = metastore()
    router_settings = RouterSettings()
    parser = StatementParser(router_settings.parse_limits, router_settings.parse_cache_bytes)
    pulls = _Pulls(meta)
    statements = Statements(router_settings, meta, None, None, pulls, parser)  # type: ignore[arg-type]
    for n in range(20):
        [outcome] = await statements.execute(f"SELECT * FROM counts WHERE sensor = 'sensor-{n}';", {})
        assert outcome.rows == [[f"sensor-{n}"]] and outcome.statement == f"SELECT * FROM counts WHERE sensor = 'sensor-{n}'"
    assert pulls.planned == 1
    assert parser.cache is not None and len(parser.cache) == 2  # the first text and its proof


async def test_a_key_no_row_can_have_made_of_a_template_is_planned_as_its_text_is() -> None:
    """3000000000 for an INT key: no key equals it, so the text is a scan (finding nothing), not
    a lookup of a key it is not, nor an error: the template gives it to the parser."""
    meta = metastore()
    meta.apply(parse_statement("CREATE STREAM ints (k INT KEY, v INT) WITH (kafka_topic='ints', partitions=3, "
                               "value_format='json')"), meta.command_offset + 1)
    meta.apply(parse_statement("CREATE TABLE by_k AS SELECT k, COUNT(*) AS n FROM ints GROUP BY k"), meta.command_offset + 1)
    templates = LookupTemplates(StatementParser(ParseLimits()))
    await templates.learn(*planned(meta, "SELECT * FROM by_k WHERE k = 5"), meta.command_offset)
    assert len(templates) == 1
    assert templates.match("SELECT * FROM by_k WHERE k = 3000000000", meta.command_offset) is None
    _, plan = planned(meta, "SELECT * FROM by_k WHERE k = 3000000000")
    assert plan.partition is None and plan.key is None
    made = templates.match("SELECT * FROM by_k WHERE k = 7", meta.command_offset)
    assert made is not None and made[1].key == 7
