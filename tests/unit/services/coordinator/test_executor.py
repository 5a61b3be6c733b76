"""The executor's refusals: before the parse, text too long, nested too deep, or from a
caller who may not run what it starts with; before the append, a CREATE OR REPLACE that
the query's state could not survive. None of them reaches Kafka."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest
from aiokafka.errors import KafkaError

from millpond.services.coordinator.executor import StatementExecutor
from millpond.shared import security
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import CoordinatorSettings
from millpond.shared.errors import StatementError, UnavailableError
from millpond.shared.rpc.status import status_code
from millpond.shared.security import Permission, PermissionDeniedError, Principal
from millpond.shared.sql import ast
from millpond.shared.sql.parser import parse_statement
from millpond.shared.sql.planner import check_round_places

NESTED_64K = "SELECT " + "(" * 32000 + "1" + ")" * 32000 + " FROM T;"


def _executor() -> StatementExecutor:
    unused = cast(Any, None)  # the Kafka parts: a refused statement never reaches them
    return StatementExecutor(CoordinatorSettings(), Metastore(), unused, unused, unused, unused, unused)


async def test_64k_of_nested_parentheses_is_refused_fast_with_invalid_argument() -> None:
    executor = _executor()
    started = time.monotonic()
    with pytest.raises(StatementError) as err:
        await executor.execute(NESTED_64K, {})
    assert time.monotonic() - started < 0.5
    assert status_code(err.value.kind) is grpc.StatusCode.INVALID_ARGUMENT
    assert "parentheses nest more than 200 levels deep" in err.value.message


async def test_a_statement_past_the_length_limit_is_refused_naming_it() -> None:
    with pytest.raises(StatementError, match="max_statement_chars"):
        await _executor().execute("CREATE STREAM S (A INT) WITH (kafka_topic='t');" + " " * 4_000_000, {})


async def test_a_caller_who_may_not_run_the_statement_is_refused_before_it_is_parsed() -> None:
    executor = _executor()

    async def no_parse(text: str) -> ast.Statement:
        raise AssertionError("parsed before authorizing")

    executor.parser.parse_one = no_parse  # type: ignore[method-assign]
    token = security.CURRENT.set(Principal("reader", frozenset({Permission.READ})))
    try:
        with pytest.raises(PermissionDeniedError, match="needs the admin permission"):
            await executor.execute("CREATE TABLE T AS SELECT " + "(" * 500 + "1" + ")" * 500 + " FROM S;", {})
    finally:
        security.CURRENT.reset(token)


class FakeReader:
    async def catch_up(self, offset: int | None = None) -> None:
        pass


class FakeTransaction:
    async def append(self, command: Any) -> int:
        raise AssertionError("an incompatible replacement was appended")


class FakeWriter:
    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[FakeTransaction]:
        yield FakeTransaction()


class FakeOffsets:
    async def end_offsets(self, partitions: list[Any]) -> dict[Any, int]:
        return dict.fromkeys(partitions, 0)


async def test_a_replacement_that_changes_the_aggregates_is_refused_before_it_is_appended() -> None:
    metastore = Metastore()
    metastore.apply(parse_statement("CREATE STREAM readings (sensor VARCHAR KEY, area VARCHAR, reading INT) "
                                    "WITH (kafka_topic='readings', partitions=4, value_format='json')"), 0)
    metastore.apply(parse_statement("CREATE TABLE by_area AS SELECT area, COUNT(*) AS n FROM readings GROUP BY area"), 1)
    unused = cast(Any, None)
    executor = StatementExecutor(CoordinatorSettings(), metastore, cast(Any, FakeReader()), cast(Any, FakeWriter()),
                                 unused, unused, cast(Any, FakeOffsets()))
    with pytest.raises(StatementError) as err:
        await executor.execute("CREATE OR REPLACE TABLE by_area AS SELECT area, COUNT(*) AS n, SUM(reading) AS total "
                               "FROM readings GROUP BY area", {})
    assert err.value.message.startswith(
        "cannot replace query CTAS_BY_AREA_0: its aggregates change from [N = COUNT(1)] to [N = COUNT(1), "
        "TOTAL = SUM(`READING`)]; ksqlDB-style upgrades keep the aggregate list and GROUP BY; drop the table and "
        "create it again")


async def test_a_topic_name_kafka_refuses_is_refused_before_the_broker_is_asked() -> None:
    unused = cast(Any, None)  # no admin client: asking the broker about the topic would fail otherwise
    executor = StatementExecutor(CoordinatorSettings(), Metastore(), cast(Any, FakeReader()), cast(Any, FakeWriter()),
                                 unused, unused, cast(Any, FakeOffsets()))
    with pytest.raises(StatementError, match=r"is not a Kafka topic name") as err:
        await executor.execute(f"CREATE STREAM s (a INT) WITH (kafka_topic='{'t' * 60_000}', value_format='json')", {})
    assert status_code(err.value.kind) is grpc.StatusCode.INVALID_ARGUMENT


class SlowReader:
    def __init__(self, seconds: float):
        self.seconds, self.started, self.finished = seconds, asyncio.Event(), False

    async def catch_up(self, offset: int | None = None) -> None:
        self.started.set()
        await asyncio.sleep(self.seconds)
        self.finished = True


async def test_a_started_statement_runs_to_its_end_when_its_caller_goes() -> None:
    # Cut short, its Kafka clients were left half-connected (the full fuzz's router deadlines).
    reader = SlowReader(0.3)
    unused = cast(Any, None)
    executor = StatementExecutor(CoordinatorSettings(), Metastore(), cast(Any, reader), unused, unused, unused, unused)
    call = asyncio.create_task(executor.execute("SHOW STREAMS;", {}))
    await reader.started.wait()
    call.cancel()  # as gRPC cancels a handler whose caller's deadline passed
    with pytest.raises(asyncio.CancelledError):
        await call
    assert reader.finished


async def test_a_statement_past_its_time_is_called_off_as_unavailable() -> None:
    reader = SlowReader(5)
    unused = cast(Any, None)
    executor = StatementExecutor(CoordinatorSettings(statement_timeout_ms=50), Metastore(), cast(Any, reader),
                                 unused, unused, unused, unused)
    with pytest.raises(UnavailableError, match=r"did not finish in 0\.05 s"):
        await executor.execute("SHOW STREAMS;", {})
    assert not reader.finished


class FlakyTransaction:
    """The first append is not delivered (as when a racing coordinator's fence shows as an
    unexpected delivery error); the next ones are."""

    appends = 0

    async def append(self, command: Any) -> int:
        FlakyTransaction.appends += 1
        if FlakyTransaction.appends == 1:
            raise KafkaError("Unexpected error during batch delivery")
        return 7


class FlakyWriter:
    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[FlakyTransaction]:
        yield FlakyTransaction()


async def test_a_command_not_delivered_in_its_transaction_is_validated_and_appended_again() -> None:
    metastore = Metastore()
    metastore.apply(parse_statement("CREATE STREAM s (a INT) WITH (kafka_topic='s', partitions=1, value_format='json')"), 0)
    unused = cast(Any, None)
    executor = StatementExecutor(CoordinatorSettings(), metastore, cast(Any, FakeReader()), cast(Any, FlakyWriter()),
                                 unused, unused, cast(Any, FakeOffsets()))
    outcome = await executor.execute("DROP STREAM s;", {})
    assert outcome.message and FlakyTransaction.appends == 2 and executor.fenced_retries == 1


@pytest.mark.parametrize("sql, columns", [
    ("CREATE STREAM s (k VARCHAR KEY, \"a\" INT, A INT) WITH (kafka_topic='s', partitions=1, value_format='json')",
     '`a` and `A`'),
    ("CREATE STREAM t AS SELECT sensor, reading AS \"Reading\", reading AS READING FROM readings EMIT CHANGES",
     '`Reading` and `READING`'),
])
async def test_columns_whose_names_differ_only_in_case_are_refused_before_they_are_appended(sql: str,
                                                                                           columns: str) -> None:
    """Spark resolves column names regardless of case: a stream or table with "a" and A failed
    every query over it. Refused when the statement is run; a replayed one stays."""
    metastore, error = await _refused_when_run(sql, "reading INT")
    assert f"would have the columns {columns}, whose names differ only in case" in error.message
    assert status_code(error.kind) is grpc.StatusCode.INVALID_ARGUMENT
    metastore.apply(parse_statement(sql), 1)  # as replay finds a statement accepted before
    assert len(metastore.sources) == 2


async def _refused_when_run(sql: str, columns: str) -> tuple[Metastore, StatementError]:
    """The StatementError running ``sql`` gives, over a stream ``readings (sensor VARCHAR KEY,
    <columns>)``, and the metastore it ran on (unchanged)."""
    metastore = Metastore()
    metastore.apply(parse_statement(f"CREATE STREAM readings (sensor VARCHAR KEY, {columns}) "
                                    "WITH (kafka_topic='readings', partitions=1, value_format='json')"), 0)
    unused = cast(Any, None)
    executor = StatementExecutor(CoordinatorSettings(), metastore, cast(Any, FakeReader()), cast(Any, FakeWriter()),
                                 unused, unused, cast(Any, FakeOffsets()))
    with pytest.raises(StatementError) as err:
        await executor.execute(sql, {})
    return metastore, err.value


@pytest.mark.parametrize("sql, places", [
    ("CREATE STREAM t AS SELECT sensor, ROUND(reading, places) AS r FROM readings EMIT CHANGES", "PLACES"),
    ("CREATE TABLE t AS SELECT sensor, COUNT(*) AS n FROM readings WHERE ROUND(reading, 2147483647) > 0 GROUP BY sensor "
     "EMIT CHANGES", "2147483647"),
    ("CREATE STREAM t AS SELECT sensor FROM readings WHERE ROUND(reading, 1 + places) > 0 EMIT CHANGES", "(1 + PLACES)"),
    ("CREATE STREAM t AS SELECT sensor FROM readings WHERE ROUND(reading, 999 + 2) > 0 EMIT CHANGES", "(999 + 2)"),
    ("CREATE STREAM t AS SELECT sensor, ROUND(reading, -1001) AS r FROM readings EMIT CHANGES", "-1001"),
    ("CREATE TABLE t AS SELECT sensor, MAX(ROUND(reading, places)) AS m FROM readings GROUP BY sensor EMIT CHANGES", "PLACES"),
])
async def test_a_persistent_query_rounding_by_places_spark_cannot_take_is_refused_before_it_is_appended(
        sql: str, places: str) -> None:
    """Spark's analyzer refuses ROUND by a column (the scale is fixed when the query starts),
    and its batches fail past about a billion places: such a query was accepted, then failed
    on its worker. Refused when the statement is run; a replayed one stays, and a pull query
    may still round by a column (Python evaluates it)."""
    metastore, error = await _refused_when_run(sql, "reading DOUBLE, places INT")
    assert "ROUND's places in a persistent query must be a whole number from -1000 to 1000 written with literals " \
           f"(ROUND(x, 2), ROUND(x, 1 + 1)), not {places}" in error.message
    assert status_code(error.kind) is grpc.StatusCode.INVALID_ARGUMENT
    metastore.apply(parse_statement(sql), 1)  # as replay finds a statement accepted before
    assert len(metastore.queries) == 1


def test_a_round_by_places_spark_folds_to_a_constant_is_taken() -> None:
    check_round_places(parse_statement(
        "CREATE STREAM t AS SELECT sensor, ROUND(reading, 1 + 1) AS r FROM readings WHERE ROUND(reading, -(2 * 3)) > 0"))


def test_a_round_python_evaluates_over_aggregates_may_take_places_from_a_column() -> None:
    """Over a GROUP BY, the expressions over aggregates and HAVING are evaluated in Python (the
    workers' rows), not by Spark: ROUND there takes any places, as a pull's does."""
    check_round_places(parse_statement(
        "CREATE TABLE t AS SELECT sensor, ROUND(AVG(reading), CAST(MAX(places) AS INT)) AS r FROM readings "
        "GROUP BY sensor HAVING ROUND(SUM(reading), 1 + 1) > 0 EMIT CHANGES"))


class RecordingAdmin:
    """The admin calls a CREATE makes: no topic exists; each one created is recorded."""

    def __init__(self) -> None:
        self.created: dict[str, int] = {}

    async def list_topics(self) -> list[str]:
        return list(self.created)

    async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        return [{"topic": name, "error_code": 3, "partitions": []} for name in names]

    async def create_topics(self, topics: list[Any]) -> Any:
        self.created |= {topic.name: topic.replication_factor for topic in topics}
        return SimpleNamespace(topic_errors=[(topic.name, 0, None) for topic in topics])


class AcceptingTransaction:
    async def append(self, command: Any) -> int:
        return 1


class AcceptingWriter:
    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AcceptingTransaction]:
        yield AcceptingTransaction()


@pytest.mark.parametrize("with_replicas, replicas", [("", 3), (", replicas=2", 2)])
async def test_a_topic_made_for_a_statement_has_the_internal_topics_replication_unless_replicas_says(
        with_replicas: str, replicas: int) -> None:
    metastore = Metastore()
    metastore.apply(parse_statement("CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='s', partitions=1, "
                                    "value_format='json')"), 0)
    admin = RecordingAdmin()
    executor = StatementExecutor(CoordinatorSettings(), metastore, cast(Any, FakeReader()), cast(Any, AcceptingWriter()),
                                 cast(Any, admin), cast(Any, None), cast(Any, FakeOffsets()))
    executor.replicas = 3  # as a coordinator finds on a cluster of three brokers or more
    await executor.execute(f"CREATE TABLE t WITH (kafka_topic='t'{with_replicas}) AS SELECT k, COUNT(*) AS n FROM s "
                           "GROUP BY k;", {})
    await executor.execute(f"CREATE STREAM u (k VARCHAR KEY) WITH (kafka_topic='u', partitions=1{with_replicas}, "
                           "value_format='json');", {})
    assert admin.created["t"] == admin.created["u"] == replicas
    assert {n for n, r in admin.created.items() if r == 3} >= {n for n in admin.created if n.startswith("_millpond-")}
