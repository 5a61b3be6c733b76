"""Pull queries at the router against fake workers: failover to the next qualified copy, the
UNAVAILABLE message that names every copy and why, positions for the consistency token,
a LIMIT that stops asking hosts once it has its rows, and streamed scans whose rows the
router counts as they come (refused past the cap, with the other hosts' scans cancelled)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any

import pytest

from millpond.common.v1 import rows_pb2
from millpond.services.router.pull import (
    LookupAnswer,
    Replica,
    Route,
    execute_pull,
    lookup_answer,
    lookup_result,
    plan_pull,
)
from millpond.services.router.pull_routing import PullRouter
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import RouterSettings
from millpond.shared.errors import LimitError, UnavailableError
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.kafka.serde import to_proto
from millpond.shared.results import Outcome
from millpond.shared.rpc.converters import outcome_from_proto, outcome_to_proto
from millpond.shared.sql import ast
from millpond.shared.sql.guard import CACHED_PLAN_CHARS
from millpond.shared.sql.parser import parse_statement
from millpond.worker.v1 import worker_pb2

A, B, C = Replica("a:1", False), Replica("b:1", True), Replica("c:1", True)


def metastore() -> Metastore:
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM readings (sensor VARCHAR KEY, area VARCHAR, reading INT) "
                               "WITH (kafka_topic='readings', partitions=2, value_format='json')"), 0)
    meta.apply(parse_statement("CREATE TABLE counts AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor"), 1)
    return meta


def row(*values: Any) -> rows_pb2.Row:
    return rows_pb2.Row(values=[to_proto(v) for v in values])


def rows_of(outcome: Outcome) -> list[list[Any]]:
    """Every result row as the client gets them (a scan's pass through as the workers sent them)."""
    return outcome_from_proto(outcome_to_proto(outcome)).rows


class Workers:
    """Fake workers: ``down`` endpoints refuse, ``failing`` ones fail after their first page,
    ``stuck`` ones never send a page; every other streams a page per partition from ``rows``
    (result rows: a real worker filters and projects by the statement), up to the limit."""

    def __init__(self, down: set[str], failing: set[str] = frozenset(), stuck: set[str] = frozenset()):  # type: ignore[assignment]
        self.down, self.failing, self.stuck = down, failing, stuck
        self.calls: list[tuple[str, Any]] = []
        self.closed: list[str] = []
        self.rows = {0: [row("s0", 1), row("s2", 3)], 1: [row("s1", 2)]}

    async def lookup(self, endpoint: str, request: worker_pb2.LookupRequest) -> LookupAnswer:
        self.calls.append((endpoint, request))
        if endpoint in self.down:
            raise UnavailableError("connection refused")
        return lookup_answer(worker_pb2.LookupResponse(found=True, row=row("s1", 2), input_offset=41))

    async def scan(self, endpoint: str, request: worker_pb2.ScanPagesRequest) -> AsyncGenerator[worker_pb2.ScanPagesResponse, None]:
        self.calls.append((endpoint, request))
        try:
            if endpoint in self.down:
                raise UnavailableError("connection refused")
            if endpoint in self.stuck:
                await asyncio.Event().wait()
            sent = 0
            for page, p in enumerate(request.partitions):
                if page and endpoint in self.failing:
                    raise UnavailableError("connection reset")
                rows = self.rows[p][:request.limit - sent] if request.limit else self.rows[p]
                sent += len(rows)
                yield worker_pb2.ScanPagesResponse(rows=rows_pb2.StatementResult(rows=rows).SerializeToString(),
                                              row_count=len(rows), input_offsets={p: 10 + p})
        finally:
            self.closed.append(endpoint)


def pull(sql: str, workers: Workers, routes: dict[int, Route], max_rows: int | None = None) -> Any:
    plan = plan_pull(parse_statement(sql), metastore(), "svc")  # type: ignore[arg-type]
    return asyncio.run(execute_pull(plan, sql, routes.__getitem__, workers.lookup, workers.scan, max_rows))


def test_lookup_fails_over_and_reports_the_position_it_read() -> None:
    workers = Workers(down={"a:1"})
    plan = plan_pull(parse_statement("SELECT * FROM counts WHERE sensor = 's1'"), metastore(), "svc")  # type: ignore[arg-type]
    assert plan.input_topic == "readings"
    result = pull("SELECT * FROM counts WHERE sensor = 's1'", workers,
                  {plan.partition: Route([A, B], [], min_input_offset=40)})  # type: ignore[dict-item]
    assert result.outcome.rows == [["s1", 2]] and result.positions == {plan.partition: 41}
    assert [(e, r.allow_standby, r.min_input_offset) for e, r in workers.calls] == [("a:1", False, 40),
                                                                                  ("b:1", True, 40)]


def test_a_key_of_several_columns_is_looked_up_only_when_the_where_names_all_of_them() -> None:
    meta = metastore()
    meta.apply(parse_statement("CREATE TABLE pairs WITH (partitions=5) AS SELECT area, sensor, COUNT(*) AS n "
                               "FROM readings GROUP BY sensor, area"), 2)
    plan = plan_pull(parse_statement("SELECT n FROM pairs WHERE sensor = 's1' AND n > 0 AND area = 'a'"), meta, "svc")
    assert plan.key == ["a", "s1"] and plan.key_bytes == b'{"AREA":"a","SENSOR":"s1"}'
    assert plan.partition == partition_for(plan.key_bytes, 5)
    scan = plan_pull(parse_statement("SELECT n FROM pairs WHERE sensor = 's1' OR area = 'a'"), meta, "svc")
    half = plan_pull(parse_statement("SELECT n FROM pairs WHERE sensor = 's1'"), meta, "svc")
    assert scan.key_bytes is None and scan.partition is None and half.key_bytes is None and half.partition is None
    for sql in ("SELECT n FROM pairs WHERE sensor = 's1' AND area = NULL", "SELECT n FROM counts WHERE sensor = NULL"):
        assert plan_pull(parse_statement(sql), meta, "svc").partition is None  # no row has a NULL key: a scan


def test_unavailable_names_every_copy_and_why() -> None:
    workers = Workers(down={"a:1", "b:1"})
    routes = {p: Route([A, B], ["c:1 (standby): lag 40 over the bound of 10 (max allowed offset lag)"])
              for p in range(2)}
    with pytest.raises(UnavailableError) as err:
        pull("SELECT * FROM counts WHERE sensor = 's1'", workers, routes)
    message = err.value.message
    assert message.startswith("no worker could answer for partition ")
    assert "of COUNTS (query CTAS_COUNTS_0)" in message
    for reason in ("c:1 (standby): lag 40 over the bound of 10", "a:1 (active): connection refused",
                   "b:1 (standby): connection refused"):
        assert reason in message


def test_scan_merges_one_copy_per_partition_and_fails_over_per_partition() -> None:
    workers = Workers(down={"a:1"})
    sql = "SELECT sensor, n FROM counts WHERE n >= 1"
    result = pull(sql, workers, {0: Route([A, C], []), 1: Route([B], [])})
    assert sorted(rows_of(result.outcome)) == [["s0", 1], ["s1", 2], ["s2", 3]] and result.positions == {0: 10, 1: 11}
    assert sorted(e for e, _ in workers.calls) == ["a:1", "b:1", "c:1"]
    assert {(r.statement, r.query_id) for _, r in workers.calls} == {(sql, "CTAS_COUNTS_0")}  # the workers filter and project
    assert {tuple(r.columns) for _, r in workers.calls} == {("SENSOR VARCHAR", "N BIGINT")}  # as the router planned them


def test_a_scan_call_may_wait_for_its_token_as_long_as_the_longest_wait_of_its_partitions_routes() -> None:
    workers = Workers(down=set())
    pull("SELECT * FROM counts", workers, {0: Route([A], [], 50, wait_ms=400), 1: Route([A], [], 30)})
    assert [(e, dict(r.min_input_offsets), r.wait_ms) for e, r in workers.calls] == [("a:1", {0: 50, 1: 30}, 400)]
    workers.calls.clear()
    pull("SELECT * FROM counts", workers, {0: Route([A], [], 50, wait_ms=400), 1: Route([B], [], 30)})
    assert sorted((e, r.wait_ms) for e, r in workers.calls) == [("a:1", 400), ("b:1", 0)]


def test_a_host_failing_mid_scan_has_its_rows_dropped_and_its_partitions_asked_elsewhere() -> None:
    workers = Workers(down=set(), failing={"a:1"})
    result = pull("SELECT * FROM counts", workers, {0: Route([A, B], []), 1: Route([A, C], [])})
    assert sorted(rows_of(result.outcome)) == [["s0", 1], ["s1", 2], ["s2", 3]]  # partition 0's rows once
    assert [(e, list(r.partitions)) for e, r in workers.calls] == [("a:1", [0, 1]), ("b:1", [0]), ("c:1", [1])]


def test_a_scan_past_the_cap_is_refused_as_it_streams_and_ends_every_other_scan() -> None:
    workers = Workers(down=set(), stuck={"b:1"})
    sql = "SELECT * FROM counts"
    plan = plan_pull(parse_statement(sql), metastore(), "svc")  # type: ignore[arg-type]
    routes = {0: Route([A], []), 1: Route([B], [])}

    async def refused() -> list[str]:
        with pytest.raises(LimitError, match="max_rows_per_response"):
            await execute_pull(plan, sql, routes.__getitem__, workers.lookup, workers.scan, max_rows=1)
        return sorted(workers.closed)  # before the loop ends (which would cancel what is left)

    assert asyncio.run(refused()) == ["a:1", "b:1"]  # the stuck host's scan was cancelled, not left running


def test_limit_stops_asking_hosts_once_it_has_its_rows() -> None:
    workers = Workers(down=set())
    result = pull("SELECT * FROM counts LIMIT 1", workers, {0: Route([A], []), 1: Route([B], [])})
    assert len(rows_of(result.outcome)) == 1 and [e for e, _ in workers.calls] == ["a:1"]
    assert workers.calls[0][1].limit == 1


@pytest.mark.parametrize("sql, rows, calls", [
    ("SELECT * FROM counts LIMIT 1", 1, [("a:1", [0, 1], 1), ("b:1", [0], 1)]),
    ("SELECT * FROM counts LIMIT 2", 2, [("a:1", [0, 1], 2), ("b:1", [0], 2)]),
    ("SELECT * FROM counts LIMIT 3", 3, [("a:1", [0, 1], 3), ("b:1", [0], 3), ("c:1", [1], 1)]),
])
def test_a_limit_asks_the_copies_of_a_failed_host_only_for_what_it_still_wants(
        sql: str, rows: int, calls: list[tuple[str, list[int], int]]) -> None:
    for workers in (Workers(down={"a:1"}), Workers(down=set(), failing={"a:1"})):
        result = pull(sql, workers, {0: Route([A, B], []), 1: Route([A, C], [])})
        assert len(rows_of(result.outcome)) == rows
        assert [(e, list(r.partitions), r.limit) for e, r in workers.calls] == calls


def test_limit_asks_the_next_host_for_what_it_still_wants() -> None:
    workers = Workers(down=set())
    result = pull("SELECT * FROM counts LIMIT 3", workers, {0: Route([A], []), 1: Route([B], [])})
    assert len(rows_of(result.outcome)) == 3 and [(e, r.limit) for e, r in workers.calls] == [("a:1", 3), ("b:1", 1)]


@pytest.mark.parametrize("sql", ["SELECT * FROM counts LIMIT 0", "SELECT * FROM counts WHERE n > 0 LIMIT 0",
                                 "SELECT * FROM counts WHERE sensor = 's1' LIMIT 0"])
def test_limit_0_answers_the_columns_and_no_row(sql: str) -> None:
    workers = Workers(down=set())
    result = pull(sql, workers, {0: Route([A], []), 1: Route([B], [])})
    assert result.outcome.rows == [] and result.outcome.columns == [("SENSOR", "VARCHAR"), ("N", "BIGINT")]
    assert workers.calls == []


def test_a_scan_asks_no_more_rows_than_a_response_may_hold() -> None:
    workers = Workers(down=set())
    result = pull("SELECT * FROM counts", workers, {0: Route([A], []), 1: Route([A], [])}, max_rows=5)
    assert len(rows_of(result.outcome)) == 3 and [r.limit for _, r in workers.calls] == [6]
    pull("SELECT * FROM counts LIMIT 2", workers, {0: Route([A], []), 1: Route([A], [])}, max_rows=5)
    pull("SELECT * FROM counts WHERE n > 1", workers, {0: Route([A], []), 1: Route([A], [])}, max_rows=5)
    assert [r.limit for _, r in workers.calls] == [6, 2, 6]  # the workers filter a WHERE, so the cap bounds it too


@pytest.mark.parametrize("sql, as_is", [
    ("SELECT * FROM counts WHERE sensor = 's1'", True),
    ("SELECT * FROM counts WHERE 's1' = sensor", True),
    ("SELECT sensor, n FROM counts WHERE sensor = 's1'", False),
    ("SELECT * FROM counts WHERE sensor = 's1' AND n > 5", False),
    ("SELECT * FROM counts WHERE n > 5 AND sensor = 's1'", False),
])
def test_a_lookup_whose_row_is_its_result_is_answered_as_it_is_and_the_same(sql: str, as_is: bool) -> None:
    """``SELECT *`` by the key alone answers the copy's row as it is; any other WHERE or
    SELECT list is evaluated (the row below has n = 2: ``n > 5`` drops it)."""
    plan = plan_pull(parse_statement(sql), metastore(), "svc")  # type: ignore[arg-type]
    assert plan.row_as_is is as_is
    general = replace(plan, row_as_is=False)
    for values in (["s1", 2], ["s1", 9]):
        found = LookupAnswer(values, 3)
        assert lookup_result(plan, sql, found).outcome.rows == lookup_result(general, sql, found).outcome.rows
    assert pull(sql, Workers(set()), {plan.partition: Route([A], [])}).outcome.rows == (
        [["s1", 2]] if "n > 5" not in sql else [])


def test_a_row_is_never_taken_as_it_is_by_a_scan_or_when_it_has_other_columns() -> None:
    """A windowed table's lookup scans its key's rows (whose WHERE is evaluated, as any
    scan's), and a row of another width than the table's is not passed on as it is: a copy
    of another version of the table (columns added at the end by CREATE OR REPLACE) has
    those columns NULL, or left out; it was a ValueError, INTERNAL to the client."""
    meta = metastore()
    meta.apply(parse_statement("CREATE TABLE per_minute AS SELECT sensor, COUNT(*) AS n FROM readings "
                               "WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY sensor"), 2)
    windowed = plan_pull(parse_statement("SELECT * FROM per_minute WHERE sensor = 's1'"), meta, "svc")  # type: ignore[arg-type]
    assert not windowed.row_as_is
    sql = "SELECT * FROM counts WHERE sensor = 's1'"
    plan = plan_pull(parse_statement(sql), metastore(), "svc")  # type: ignore[arg-type]
    assert plan.row_as_is
    assert lookup_result(plan, sql, LookupAnswer(["s1", 2, "more"], 3)).outcome.rows == [["s1", 2]]
    assert lookup_result(plan, sql, LookupAnswer(["s1"], 3)).outcome.rows == [["s1", None]]
    projected = "SELECT n FROM counts WHERE sensor = 's1'"
    assert lookup_result(plan_pull(parse_statement(projected), metastore(), "svc"),  # type: ignore[arg-type]
                         projected, LookupAnswer(["s1"], 3)).outcome.rows == [[None]]


async def test_a_long_statement_is_planned_each_time_not_kept_planned() -> None:
    """A plan holds its syntax tree (27-118 times its text): a thousand kept plans of 64 KB
    statements held gigabytes. A short statement's plan is kept; a long one's is not."""
    router = PullRouter(RouterSettings(), metastore(), None, None, None, None)  # type: ignore[arg-type]
    short = parse_statement("SELECT * FROM counts WHERE sensor = 'a'")
    long = parse_statement("SELECT * FROM counts WHERE n IN (" + ",".join(["1"] * (CACHED_PLAN_CHARS // 2)) + ")")
    assert isinstance(short, ast.Query) and isinstance(long, ast.Query) and len(long.text) > CACHED_PLAN_CHARS
    assert await router.plan(short) is await router.plan(short)
    assert await router.plan(long) is not await router.plan(long)
    assert len(router._plans) == 1



@pytest.mark.parametrize("where, key", [("k = 5.0", 5), ("k = 5", 5), ("k = 5.5", None), ("k = 3000000000", None),
                                        ("k = NULL", None), ("k = 1e19", None), ("k = -1e19", None)])
def test_a_key_literal_of_another_numeric_type_is_looked_up_as_equality_reads_it(where: str, key: int | None) -> None:
    """An INT key compared with 5.0 is the key 5 (``=`` compares numbers); with 5.5, a BIGINT
    past INT or a DOUBLE past BIGINT, no key equals it: a scan, which finds no row, rather than an
    error (1e19 was refused as out of BIGINT's range)."""
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM ints (k INT KEY, v INT) WITH (kafka_topic='ints', partitions=3, "
                               "value_format='json')"), 0)
    meta.apply(parse_statement("CREATE TABLE by_k AS SELECT k, COUNT(*) AS n FROM ints GROUP BY k"), 1)
    stmt = parse_statement(f"SELECT * FROM by_k WHERE {where}")
    assert isinstance(stmt, ast.Query)
    plan = plan_pull(stmt, meta, "svc")
    assert plan.key == key and (plan.partition is None) == (key is None)
