"""Pull queries at the router against fake workers: failover to the next qualified copy, the
UNAVAILABLE message that names every copy and why, positions for the consistency token,
and a LIMIT that stops asking hosts once it has its rows."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from millpond.common.v1 import rows_pb2
from millpond.services.router.pull import Replica, Route, execute_pull, plan_pull
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.errors import UnavailableError
from millpond.shared.kafka.serde import to_proto
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


class Workers:
    """Fake workers: ``down`` endpoints refuse, every other answers from ``rows``."""

    def __init__(self, down: set[str]):
        self.down = down
        self.calls: list[tuple[str, Any]] = []
        self.rows = {0: [row("s0", 1), row("s2", 3)], 1: [row("s1", 2)]}

    async def lookup(self, endpoint: str, request: worker_pb2.LookupRequest) -> worker_pb2.LookupResponse:
        self.calls.append((endpoint, request))
        if endpoint in self.down:
            raise UnavailableError("connection refused")
        return worker_pb2.LookupResponse(found=True, row=row("s1", 2), input_offset=41)

    async def scan(self, endpoint: str, request: worker_pb2.ScanRequest) -> worker_pb2.ScanResponse:
        self.calls.append((endpoint, request))
        if endpoint in self.down:
            raise UnavailableError("connection refused")
        return worker_pb2.ScanResponse(rows=[r for p in request.partitions for r in self.rows[p]],
                                       input_offsets={p: 10 + p for p in request.partitions})


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
    result = pull("SELECT sensor, n FROM counts WHERE n >= 2", workers, {0: Route([A, C], []), 1: Route([B], [])})
    assert sorted(result.outcome.rows) == [["s1", 2], ["s2", 3]] and result.positions == {0: 10, 1: 11}
    assert sorted(e for e, _ in workers.calls) == ["a:1", "b:1", "c:1"]


def test_limit_stops_asking_hosts_once_it_has_its_rows() -> None:
    workers = Workers(down=set())
    result = pull("SELECT * FROM counts LIMIT 1", workers, {0: Route([A], []), 1: Route([B], [])})
    assert len(result.outcome.rows) == 1 and [e for e, _ in workers.calls] == ["a:1"]
    assert workers.calls[0][1].limit == 1


@pytest.mark.parametrize("sql", ["SELECT * FROM counts LIMIT 0", "SELECT * FROM counts WHERE n > 0 LIMIT 0",
                                 "SELECT * FROM counts WHERE sensor = 's1' LIMIT 0"])
def test_limit_0_answers_the_columns_and_no_row(sql: str) -> None:
    workers = Workers(down=set())
    result = pull(sql, workers, {0: Route([A], []), 1: Route([B], [])})
    assert result.outcome.rows == [] and result.outcome.columns == [("SENSOR", "VARCHAR"), ("N", "BIGINT")]
    assert workers.calls == []


def test_a_scan_without_where_asks_no_more_rows_than_a_response_may_hold() -> None:
    workers = Workers(down=set())
    result = pull("SELECT * FROM counts", workers, {0: Route([A], []), 1: Route([A], [])}, max_rows=5)
    assert len(result.outcome.rows) == 3 and [r.limit for _, r in workers.calls] == [6]
    pull("SELECT * FROM counts LIMIT 2", workers, {0: Route([A], []), 1: Route([A], [])}, max_rows=5)
    pull("SELECT * FROM counts WHERE n > 1", workers, {0: Route([A], []), 1: Route([A], [])}, max_rows=5)
    assert [r.limit for _, r in workers.calls] == [6, 2, 0]  # a WHERE is filtered here: the worker's cap bounds it
