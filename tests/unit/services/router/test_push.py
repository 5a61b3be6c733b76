"""Push queries (and PRINT) at the router without a broker: ``LIMIT 0`` ends the stream at once,
after the header, with no row and no reader opened; a LIMIT stops after its rows."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from millpond.services.router.push import PushHeader, PushQuery, TopicPrint
from millpond.services.router.streaming import PushQueries
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import RouterSettings
from millpond.shared.errors import NotFoundError, StatementError, UnavailableError
from millpond.shared.kafka.serde import windowed_key
from millpond.shared.sql import arrays, ast
from millpond.shared.sql.guard import ParseLimits, StatementParser
from millpond.shared.sql.parser import parse_statement
from millpond.shared.sql.planner import plan_select


def metastore() -> Metastore:
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM readings (sensor VARCHAR KEY, reading INT) "
                               "WITH (kafka_topic='readings', partitions=1, value_format='json')"), 0)
    return meta


class FakeConsumer:
    """Hands out the same records at every fetch."""

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[int, list[Any]]:
        records = [SimpleNamespace(key=b"s%d" % i, value=json.dumps({"READING": i}).encode(), offset=i, timestamp=1000 + i,
                                   partition=0)
                   for i in range(3)]
        return {0: records}


async def rows_of(sql: str) -> list[list[Any]]:
    meta = metastore()
    stmt = parse_statement(sql)
    assert isinstance(stmt, ast.Query)
    push = PushQuery(plan_select(stmt, meta.source(stmt.source)), RouterSettings().kafka, from_beginning=True)
    push._consumer = FakeConsumer()  # type: ignore[assignment]
    return [row async for row in push.rows()]


def test_limit_0_pushes_no_row() -> None:
    assert asyncio.run(rows_of("SELECT * FROM readings EMIT CHANGES LIMIT 0")) == []


def test_a_limit_stops_after_its_rows() -> None:
    assert asyncio.run(rows_of("SELECT * FROM readings EMIT CHANGES LIMIT 2")) == [["s0", 0], ["s1", 1]]


def test_limit_0_streams_the_header_then_ends_without_opening_a_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_reader(self: PushQuery) -> None:
        raise AssertionError("LIMIT 0 opened a reader")

    monkeypatch.setattr(PushQuery, "start", no_reader)
    pushes = PushQueries(RouterSettings(), metastore(), None, StatementParser(ParseLimits()))  # type: ignore[arg-type]

    async def stream() -> list[PushHeader | list[Any]]:
        return [item async for item in pushes.stream("SELECT * FROM readings EMIT CHANGES LIMIT 0;", {}, "me")]

    items = asyncio.run(stream())
    assert len(items) == 1 and isinstance(items[0], PushHeader)
    assert items[0].columns == [("SENSOR", "VARCHAR"), ("READING", "INT")]
    assert pushes.pushes == {}


def test_a_push_query_sees_each_record_timestamp_as_rowtime() -> None:
    rows = asyncio.run(rows_of("SELECT sensor, ROWTIME AS t FROM readings WHERE ROWTIME > 1000 EMIT CHANGES LIMIT 2"))
    assert rows == [["s1", 1001], ["s2", 1002]]


def pushed(ddl: str, sql: str, values: list[bytes]) -> tuple[list[list[Any] | None], PushQuery]:
    """The push rows of ``sql`` over the one source ``ddl`` declares, for records of ``values``
    keyed k0, k1, ... (None: skipped), and the push query."""
    meta = Metastore()
    meta.apply(parse_statement(ddl), 0)
    stmt = parse_statement(sql)
    assert isinstance(stmt, ast.Query)
    push = PushQuery(plan_select(stmt, meta.source(stmt.source)), RouterSettings().kafka, from_beginning=True)
    records = [SimpleNamespace(partition=0, key=b"k%d" % i, value=value, offset=i, timestamp=i) for i, value in enumerate(values)]
    return [next(iter(push._rows(push.plan.source, record)), None) for record in records], push


def test_a_push_querys_explode_makes_a_row_of_each_item() -> None:
    """EXPLODE in a push query over a stream: each record a row per item, two EXPLODEs zipped
    (the shorter NULL past its end), none for an empty or NULL ARRAY; a LIMIT counts rows."""
    values = [{"A": [1, 2, 3], "B": ["x"]}, {"A": [], "B": None}, {"A": None, "B": ["y", "z"]}]
    ddl = ("CREATE STREAM arrays (k VARCHAR KEY, a ARRAY<INT>, b ARRAY<VARCHAR>) "
           "WITH (kafka_topic='arrays', partitions=1, value_format='json')")
    _, push = pushed(ddl, "SELECT k, EXPLODE(a) AS a, EXPLODE(b) AS b FROM arrays EMIT CHANGES", [])
    records = [SimpleNamespace(partition=0, key=b"k%d" % i, value=json.dumps(v).encode(), offset=i, timestamp=i)
               for i, v in enumerate(values)]
    assert [list(push._rows(push.plan.source, r)) for r in records] == [
        [["k0", 1, "x"], ["k0", 2, None], ["k0", 3, None]], [], [["k2", None, "y"], ["k2", None, "z"]]]
    assert push.plan.columns == (("K", ast.SqlType("VARCHAR")), ("A", ast.SqlType("INT")), ("B", ast.SqlType("VARCHAR")))
    _, limited = pushed(ddl, "SELECT k, EXPLODE(a) AS a FROM arrays EMIT CHANGES LIMIT 2", [])
    limited._consumer = ListConsumer(records)  # type: ignore[assignment]
    assert asyncio.run(collected(limited.rows())) == [["k0", 1], ["k0", 2]]
    with pytest.raises(StatementError, match="EXPLODE is a table function"):
        pushed(ddl.replace("STREAM", "TABLE").replace("k VARCHAR KEY", "k VARCHAR PRIMARY KEY"),
               "SELECT k, EXPLODE(a) AS a FROM arrays EMIT CHANGES", [])


def test_a_push_querys_cube_explode_skips_a_record_of_too_many_items_and_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUBE_EXPLODE in a push query: a row of each combination; a record of more than 20 items
    is skipped (ksqlDB's query logs it), not the end of the push stream."""
    ddl = "CREATE STREAM arrays (k VARCHAR KEY, a ARRAY<INT>) WITH (kafka_topic='arrays', partitions=1, value_format='json')"
    _, push = pushed(ddl, "SELECT k, CUBE_EXPLODE(a) AS c FROM arrays EMIT CHANGES", [])
    records = [SimpleNamespace(partition=0, key=b"k%d" % i, value=json.dumps({"A": a}).encode(), offset=i, timestamp=i)
               for i, a in enumerate([[1, None], list(range(21)), [2]])]
    assert [list(push._rows(push.plan.source, r)) for r in records] == [
        [["k0", [None, None]], ["k0", [1, None]]], [], [["k2", [None]], ["k2", [2]]]]
    assert push.skipped == 1
    # Of 20 items, 2^20 rows: made as they are read, so a LIMIT ends it after its rows (all of
    # them at once took 3 s and a gigabyte on the loop that serves every query).
    _, limited = pushed(ddl, "SELECT k, CUBE_EXPLODE(a) AS c FROM arrays EMIT CHANGES LIMIT 3", [])
    twenty = SimpleNamespace(partition=0, key=b"k", value=json.dumps({"A": list(range(20))}).encode(), offset=0, timestamp=0)
    limited._consumer = ListConsumer([twenty])  # type: ignore[assignment]
    made: list[int] = []
    row_at = arrays.Cube.__getitem__
    monkeypatch.setattr(arrays.Cube, "__getitem__", lambda cube, at: made.append(at) or row_at(cube, at))
    rows = asyncio.run(collected(limited.rows()))
    assert [row[1][-2:] for row in rows] == [[None, None], [None, 19], [18, None]] and all(len(r[1]) == 20 for r in rows)
    assert made == [0, 1, 2], "rows past the LIMIT were made"


def test_a_push_over_a_windowed_table_reads_each_records_window_and_skips_a_key_without_one() -> None:
    """A windowed table's record key is the key, then its window: its bounds are WINDOWSTART and
    WINDOWEND; a key too short to hold a window is skipped (the persistent queries' readers set
    it aside), not read as a made-up window."""
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM r (sensor VARCHAR KEY, reading INT) "
                               "WITH (kafka_topic='r', partitions=1, value_format='json')"), 0)
    meta.apply(parse_statement("CREATE TABLE per_minute AS SELECT sensor, COUNT(*) AS n FROM r "
                               "WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY sensor"), 1)
    stmt = parse_statement("SELECT * FROM per_minute EMIT CHANGES")
    assert isinstance(stmt, ast.Query)
    push = PushQuery(plan_select(stmt, meta.source("PER_MINUTE")), RouterSettings().kafka, from_beginning=True)
    records = [SimpleNamespace(partition=0, key=key, value=b'{"N": 2}', offset=i, timestamp=i)
               for i, key in enumerate([windowed_key(b"s1", 60_000), b"s1", windowed_key(b"", 0)])]
    assert [list(push._rows(push.plan.source, r)) for r in records] == [[["s1", 60_000, 120_000, 2]], [], [["", 0, 60_000, 2]]]
    assert push.skipped == 1


class ListConsumer:
    """Hands out the given records at the first fetch, then none."""

    def __init__(self, records: list[Any]):
        self.records = records

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[int, list[Any]]:
        records, self.records = self.records, []
        return {0: records} if records else {}


def test_a_push_query_gives_bytes_as_bytes_as_a_pull_does() -> None:
    """JSON holds BYTES as base64 text (top level and nested): a push row has the bytes, as
    the persistent queries read them and a pull answers them; a value that is not base64 is
    skipped as a record that does not decode."""
    values = [{"B": "AAEC", "BS": ["/w==", None], "N": 1}, {"B": None, "BS": None, "N": 2}, {"B": "%%", "N": 3},
              {"B": "AA\nEC", "N": 4}, {"B": 5, "N": 5}]
    rows, push = pushed("CREATE STREAM blobs (k VARCHAR KEY, b BYTES, bs ARRAY<BYTES>, n INT) "
                        "WITH (kafka_topic='blobs', partitions=1, value_format='json')",
                        "SELECT k, b, bs, n FROM blobs EMIT CHANGES", [json.dumps(v).encode() for v in values])
    assert rows == [["k0", b"\x00\x01\x02", [b"\xff", None], 1], ["k1", None, None, 2], None,
                    ["k3", b"\x00\x01\x02", None, 4], None]
    assert push.skipped == 2
    # DELIMITED: a BYTES field is its text's UTF-8 bytes, as Spark's CSV reader gives it.
    rows, _ = pushed("CREATE STREAM lines (k VARCHAR KEY, b BYTES, n INT) "
                     "WITH (kafka_topic='lines', partitions=1, value_format='delimited')",
                     "SELECT * FROM lines EMIT CHANGES", [b"AAEC,7"])
    assert rows == [["k0", b"AAEC", 7]]


def test_a_push_query_gives_a_timestamp_as_a_pull_does() -> None:
    """A TIMESTAMP the record holds as epoch milliseconds or ISO text is pushed as the ISO text
    of the UTC time, as a pull gives it (the store's form); one that does not read is skipped,
    as the persistent queries set the record aside."""
    values = [{"T": 1700000000123, "N": 1}, {"T": "2026-01-02T03:04:05+01:00", "N": 2}, {"T": None, "N": 3},
              {"T": "not a time", "N": 4}]
    rows, push = pushed("CREATE STREAM times (k VARCHAR KEY, t TIMESTAMP, n INT) "
                        "WITH (kafka_topic='times', partitions=1, value_format='json')",
                        "SELECT * FROM times EMIT CHANGES", [json.dumps(v).encode() for v in values])
    assert rows == [["k0", "2023-11-14T22:13:20.123000", 1], ["k1", "2026-01-02T02:04:05", 2], ["k2", None, 3], None]
    assert push.skipped == 1


def test_a_key_nested_too_deep_to_decode_is_skipped_and_the_push_goes_on() -> None:
    """A key of several columns is a JSON object; one nested 100,000 deep (json's RecursionError)
    is a record that does not decode, as the worker finds it, not the end of the push stream."""
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM pairs (a VARCHAR KEY, b INT KEY, n INT) "
                               "WITH (kafka_topic='pairs', partitions=1, value_format='json')"), 0)
    stmt = parse_statement("SELECT * FROM pairs EMIT CHANGES")
    assert isinstance(stmt, ast.Query)
    push = PushQuery(plan_select(stmt, meta.source("PAIRS")), RouterSettings().kafka, from_beginning=True)
    keys = [b"[" * 100_000 + b"]" * 100_000, b'{"A":"x","B":2}']
    records = [SimpleNamespace(partition=0, key=key, value=b'{"N":1}', offset=i, timestamp=i) for i, key in enumerate(keys)]
    assert [list(push._rows(push.plan.source, record)) for record in records] == [[], [["x", 2, 1]]]
    assert push.skipped == 1


def test_a_push_skips_the_keys_the_persistent_queries_set_aside_and_reads_the_others_as_they_do() -> None:
    """A key of several columns that lacks one, and a number key of another width than Java's
    serializer writes, and a VARCHAR key that is not UTF-8, are no key to the persistent queries
    (the processing log): a push skips them."""
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM pairs (a VARCHAR KEY, b INT KEY, n INT) "
                               "WITH (kafka_topic='pairs', partitions=1, value_format='json')"), 0)
    meta.apply(parse_statement("CREATE STREAM ints (id INT KEY, n INT) WITH (kafka_topic='ints', partitions=1, "
                               "value_format='json')"), 1)
    meta.apply(parse_statement("CREATE STREAM texts (id VARCHAR KEY, n INT) WITH (kafka_topic='texts', partitions=1, "
                               "value_format='json')"), 2)
    for name, keys, want in (("PAIRS", [b'{"A":"x"}', b'{"A":"x","B":2}'], [None, ["x", 2, 1]]),
                             ("INTS", [b"\x00\x00\x00\x00\x00\x00\x00\x07", b"\x00\x00\x00\x07"], [None, [7, 1]]),
                             ("TEXTS", [b"a\xffb", b"ab"], [None, ["ab", 1]])):
        stmt = parse_statement(f"SELECT * FROM {name} EMIT CHANGES")
        assert isinstance(stmt, ast.Query)
        push = PushQuery(plan_select(stmt, meta.source(name)), RouterSettings().kafka, from_beginning=True)
        records = [SimpleNamespace(partition=0, key=key, value=b'{"N":1}', offset=i, timestamp=i) for i, key in enumerate(keys)]
        assert [list(push._rows(push.plan.source, record)) for record in records] == [[] if w is None else [w] for w in want], name


def test_a_push_query_reads_values_as_the_tables_and_pulls_over_them_do() -> None:
    """A push decodes a value as Spark reads it for the persistent queries and a store keeps
    it (``values.stored``): a number for a VARCHAR is its text, Spark's words for a DOUBLE
    that is not a number are read, 5.0 is not an INT, a DECIMAL is rounded half up to its
    scale and refused past its precision, a DATE is the ISO text of the day Spark reads."""
    values = [{"C": 5, "D": "NaN", "I": 5, "M": 1.005, "T": "2026-1-2"}, {"C": "x", "I": 5.0},
              {"C": "y", "M": 12345.6}, {"C": {"a": 1}, "D": "-Infinity"}]
    rows, push = pushed("CREATE STREAM kinds (k VARCHAR KEY, c VARCHAR, d DOUBLE, i INT, m DECIMAL(4, 2), t DATE) "
                        "WITH (kafka_topic='kinds', partitions=1, value_format='json')",
                        "SELECT * FROM kinds EMIT CHANGES", [json.dumps(v).encode() for v in values])
    assert str(rows[0]) == str(["k0", "5", float("nan"), 5, 1.01, "2026-01-02"])
    assert rows[1:] == [None, None, ["k3", '{"a":1}', float("-inf"), None, None, None]]
    assert push.skipped == 2


def test_a_bigint_expression_that_overflows_is_pushed_wrapped_as_spark_computes_it() -> None:
    """``v * 3`` of a BIGINT near 2^63 wraps (Spark's arithmetic outside ANSI mode), rather than
    giving a number no BIGINT holds, which failed the stream with INTERNAL as it was sent."""
    rows, push = pushed("CREATE STREAM big (k VARCHAR KEY, v BIGINT) "
                        "WITH (kafka_topic='big', partitions=1, value_format='json')",
                        "SELECT k, v * 3 AS t, -v - 2 AS u FROM big WHERE v + 1 < 0 EMIT CHANGES",
                        [json.dumps({"V": 2**63 - 1}).encode(), json.dumps({"V": 5}).encode()])
    assert rows == [["k0", 2**63 - 3, 2**63 - 1], None]
    assert push.skipped == 0


def test_a_push_query_that_cannot_reach_kafka_is_unavailable_not_internal() -> None:
    """Nothing listens at the bootstrap address: the client is told UNAVAILABLE with the reason."""
    stmt = parse_statement("SELECT * FROM readings EMIT CHANGES")
    assert isinstance(stmt, ast.Query)
    push = PushQuery(plan_select(stmt, metastore().source("READINGS")),
                     RouterSettings(kafka_bootstrap_servers="127.0.0.1:1").kafka, from_beginning=True)
    with pytest.raises(UnavailableError, match="could not read readings from Kafka"):
        asyncio.run(asyncio.wait_for(push.start(), 60))
    assert push._consumer is None


@pytest.mark.parametrize("text, expected", [
    ("PRINT 'my-topic'", ast.PrintTopic(topic="my-topic")),
    ("print Page_Views.v1 from beginning interval 2 limit 5",
     ast.PrintTopic(topic="Page_Views.v1", exact=False, from_beginning=True, interval=2, limit=5)),
    ("PRINT 'it''s' SAMPLE 3", ast.PrintTopic(topic="it's", interval=3)),
])
def test_print_parses_its_topic_start_interval_and_limit(text: str, expected: ast.PrintTopic) -> None:
    assert parse_statement(text) == ast.PrintTopic(text=text, **{f: getattr(expected, f) for f in
                                                                ("topic", "exact", "from_beginning", "interval", "limit")})


@pytest.mark.parametrize("text, fragment", [("PRINT 'x' INTERVAL 0", "INTERVAL must be 1 or more"),
                                            ("PRINT", "expected one of"), ("PRINT 'x' LIMIT", "expected one of: INT")])
def test_a_malformed_print_says_what_is_wrong(text: str, fragment: str) -> None:
    with pytest.raises(StatementError, match=re.escape(fragment)):
        parse_statement(text)


def test_print_shows_every_interval_th_record_and_its_formats_until_its_limit() -> None:
    printing = TopicPrint(ast.PrintTopic(topic="readings", interval=2, limit=2), RouterSettings().kafka)
    printing._consumer = FakeConsumer()  # type: ignore[assignment]
    rows = asyncio.run(collected(printing.rows()))
    assert rows == [[1000, 0, 0, "s0", '{"READING": 0}', "KAFKA_STRING", "JSON or KAFKA_STRING"],
                    [1002, 0, 2, "s2", '{"READING": 2}', "KAFKA_STRING", "JSON or KAFKA_STRING"]]


def test_print_finds_a_quoted_topic_exactly_and_a_bare_one_in_any_case() -> None:
    def named(topic: str, exact: bool, topics: set[str]) -> str:
        return TopicPrint(ast.PrintTopic(topic=topic, exact=exact), RouterSettings().kafka)._named(topics)

    assert named("PAGEVIEWS", False, {"pageviews", "other"}) == "pageviews"
    assert named("Views", False, {"Views", "views"}) == "Views"
    with pytest.raises(NotFoundError, match="the topic 'PAGEVIEWS' does not exist; SHOW TOPICS lists"):
        named("PAGEVIEWS", True, {"pageviews"})
    with pytest.raises(StatementError, match=re.escape("2 topics are named VIEWS in some case (Views, views): quote")):
        named("VIEWS", False, {"Views", "views"})


async def collected(rows: AsyncIterator[list[Any]]) -> list[list[Any]]:
    return [row async for row in rows]
