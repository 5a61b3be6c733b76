"""The router's statement path: text too long or nested too deep is refused before it is
parsed, and so is a caller who may not run what the text starts with; statements forwarded to
a (fake) coordinator share the request's deadline and keep their request id on resends; an
INSERT's row is produced here (to a fake producer), once per request id."""

from __future__ import annotations

import asyncio
import base64
import time
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest
from aiokafka.errors import InvalidTimestampError, MessageSizeTooLargeError

from millpond.common.v1 import rows_pb2
from millpond.coordinator.v1 import coordinator_pb2
from millpond.services.router.pull import plan_pull
from millpond.services.router.statements import Statements
from millpond.shared import consistency, security
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import RouterSettings
from millpond.shared.errors import ErrorKind, MillpondError, StatementError
from millpond.shared.kafka.inserts import REQUEST_ID_HEADER, RowInserter
from millpond.shared.results import Outcome
from millpond.shared.rpc.converters import outcome_to_proto
from millpond.shared.security import PermissionDeniedError, Principal
from millpond.shared.sql.guard import StatementParser
from millpond.shared.sql.parser import parse_statement

NESTED_64K = "SELECT " + "(" * 32000 + "1" + ")" * 32000 + " FROM T;"


def _statements() -> Statements:
    settings = RouterSettings()
    unused = cast(Any, None)  # reader, coordinators, pulls: a refused request never reaches them
    return Statements(settings, Metastore(), unused, unused, unused,
                      StatementParser(settings.parse_limits, settings.parse_cache_bytes))


async def test_64k_of_nested_parentheses_is_refused_fast() -> None:
    statements = _statements()
    started = time.monotonic()
    with pytest.raises(StatementError) as err:
        await statements.execute(NESTED_64K, {})
    assert time.monotonic() - started < 0.5
    assert err.value.kind is ErrorKind.INVALID and "nest more than 200 levels" in err.value.message
    assert statements.parser.cache is not None and len(statements.parser.cache) == 0


async def test_a_caller_with_no_permission_is_refused_before_the_parse() -> None:
    statements = _statements()
    token = security.CURRENT.set(Principal("nobody", frozenset()))
    try:
        with pytest.raises(PermissionDeniedError, match="needs the read permission"):
            await statements.execute("SELECT " + ", ".join(["A"] * 20000) + " FROM T;", {})
    finally:
        security.CURRENT.reset(token)
    assert statements.parser.cache is not None and len(statements.parser.cache) == 0


class _Coordinator:
    """A coordinator stub: records each request; the first ``fail`` calls answer UNAVAILABLE."""

    def __init__(self, calls: list[Any], fail: int):
        self.calls, self.fail = calls, fail

    async def ExecuteStatement(self, request: Any, **options: Any) -> Any:
        self.calls.append((self, request.request_id, request.attempt))
        if self.fail > 0:
            self.fail -= 1
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       "committed, then the catch-up timed out")
        return coordinator_pb2.ExecuteStatementResponse(
            result=outcome_to_proto(Outcome(request.sql, "Stream created")))


async def test_a_resend_to_the_next_coordinator_names_the_same_request() -> None:
    """Each statement of a request gets an id (``<request>/<n>``) that its resends keep, with
    the attempt number, so the coordinator that gets the resend can answer as the first did."""
    calls: list[Any] = []
    first, second = _Coordinator(calls, fail=1), _Coordinator(calls, fail=0)
    settings = RouterSettings()
    unused = cast(Any, None)
    coordinators = SimpleNamespace(leader=0, stubs=[first, second])
    statements = Statements(settings, Metastore(), unused, cast(Any, coordinators), unused,
                            StatementParser(settings.parse_limits))
    sql = "CREATE STREAM A (X INT) WITH (kafka_topic='a', value_format='json'); " \
          "CREATE STREAM B (X INT) WITH (kafka_topic='b', value_format='json');"
    await statements.execute(sql, {}, request_id="client-7")
    # The client named it, so even a first call may repeat one that ran before: attempts count from 1.
    assert calls == [(first, "client-7/0", 1), (second, "client-7/0", 2), (first, "client-7/1", 1)]
    calls.clear()
    await statements.execute(sql, {})  # no id from the client: the router makes one, unique per request
    ids = {request_id.split("/")[0] for _, request_id, _ in calls}
    assert len(ids) == 1 and "client-7" not in ids
    assert [attempt for _, _, attempt in calls] == [0, 0]  # an id made here: first calls, nothing to look for


class SlowCoordinator:
    """Answers every statement after ``delay_s``, honouring the caller's timeout as gRPC would."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s
        self.timeouts: list[float] = []

    async def ExecuteStatement(self, request: coordinator_pb2.ExecuteStatementRequest,
                               timeout: float) -> coordinator_pb2.ExecuteStatementResponse:  # noqa: ASYNC109 (a stub)
        self.timeouts.append(timeout)
        await asyncio.sleep(min(self.delay_s, timeout))
        if self.delay_s > timeout:
            raise grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       "Deadline Exceeded")
        return coordinator_pb2.ExecuteStatementResponse()


class FakeCoordinators:
    def __init__(self, stub: SlowCoordinator):
        self.leader = 0
        self.stubs = [stub]


def statements(stub: SlowCoordinator) -> Statements:
    settings = RouterSettings()
    return Statements(settings, Metastore(), None, FakeCoordinators(stub), None,  # type: ignore[arg-type]
                      StatementParser(settings.parse_limits))


async def test_a_forwarded_statement_gets_the_time_left_not_the_routers_whole_timeout() -> None:
    stub = SlowCoordinator(0.0)
    await statements(stub).execute("SHOW STREAMS; SHOW TABLES;", {}, time_remaining=1.0)
    assert len(stub.timeouts) == 2 and all(t <= 1.0 for t in stub.timeouts)


async def test_a_request_that_outlasts_its_deadline_ends_with_deadline_exceeded() -> None:
    started = time.monotonic()
    with pytest.raises(MillpondError) as raised:
        await statements(SlowCoordinator(5.0)).execute("SHOW STREAMS; SHOW TABLES;", {}, time_remaining=0.5)
    error: Any = raised.value
    assert error.kind is ErrorKind.DEADLINE, error.message
    assert "did not answer within the request's time left" in error.message and "before you retry" in error.message
    # The router's own request id is not sent back: the client is told to look, and to name its requests.
    assert "look before you retry (the request had no request_id" in error.message
    assert "send the same request_id" not in error.message
    assert time.monotonic() - started < 0.5
    with pytest.raises(MillpondError) as named:
        await statements(SlowCoordinator(5.0)).execute("SHOW STREAMS;", {}, time_remaining=0.5, request_id="mine")
    assert "before you retry, send the same request_id again" in named.value.message


async def test_a_statement_is_not_sent_once_the_request_is_out_of_time() -> None:
    stub = SlowCoordinator(0.0)
    with pytest.raises(MillpondError) as raised:
        await statements(stub).execute("SHOW STREAMS;", {}, time_remaining=0.01)
    assert raised.value.kind is ErrorKind.DEADLINE and "send fewer statements" in raised.value.message
    assert stub.timeouts == []


class _Pulls:
    """Pull queries answered as if every row reflected ``seen`` (no worker asked)."""

    def __init__(self, seen: dict[tuple[str, int], int]):
        self.seen = seen

    async def plan(self, stmt: Any) -> Any:
        return SimpleNamespace(partition=None, table=SimpleNamespace(key_columns=[]))  # a scan: not a template

    async def pull(self, stmt: Any, plan: Any, properties: Any, positions: Any, deadline: float) -> Any:
        return Outcome(stmt.text, status=""), dict(self.seen)


async def test_a_pull_sends_back_the_token_it_came_with_when_that_already_covers_what_it_read() -> None:
    """The token merged with what a pull read, re-encoded only when that moved a position: a
    token that covers it comes back as it came; a position past it gives a new token."""
    settings = RouterSettings()
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='s', partitions=2, "
                               "value_format='json')"), 0)
    meta.apply(parse_statement("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k"), 1)
    unused = cast(Any, None)

    def statements(seen: dict[tuple[str, int], int]) -> Statements:
        return Statements(settings, meta, unused, unused, cast(Any, _Pulls(seen)),
                          StatementParser(settings.parse_limits, settings.parse_cache_bytes))

    # Two positions in one token, the second written first: a valid token, not in encode's order.
    vector = rows_pb2.ConsistencyVector(positions=[rows_pb2.Position(topic="s", partition=1, offset=9),
                                                   rows_pb2.Position(topic="s", partition=0, offset=5)])
    token = "v1." + base64.urlsafe_b64encode(vector.SerializeToString()).decode()
    (covered,) = await statements({("s", 0): 4}).execute("SELECT * FROM t;", {}, token)
    assert covered.consistency_token == token
    (moved,) = await statements({("s", 0): 7}).execute("SELECT * FROM t;", {}, token)
    assert consistency.decode(moved.consistency_token) == {("s", 0): 7, ("s", 1): 9}
    (fresh,) = await statements({("s", 1): 3}).execute("SELECT * FROM t;", {})
    assert fresh.consistency_token == consistency.encode({("s", 1): 3})
    (nothing,) = await statements({}).execute("SELECT * FROM t;", {})
    assert nothing.consistency_token == ""


class _Lookups(_Pulls):
    """Key lookups planned for real (so they become templates), counted."""

    def __init__(self, seen: dict[tuple[str, int], int], meta: Metastore):
        super().__init__(seen)
        self.meta = meta
        self.planned = 0

    async def plan(self, stmt: Any) -> Any:
        self.planned += 1
        return plan_pull(stmt, self.meta, "svc")


async def test_another_key_of_a_known_lookup_carries_the_token_as_any_pull() -> None:
    """A key of a learned lookup (answered without a parse or a plan) sends back the token it
    came with when that covers what it read, and a new one when it read past it."""
    settings = RouterSettings()
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='s', partitions=2, "
                               "value_format='json')"), 0)
    meta.apply(parse_statement("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k"), 1)
    pulls = _Lookups({("s", 0): 4}, meta)
    statements = Statements(settings, meta, cast(Any, None), cast(Any, None), cast(Any, pulls),
                            StatementParser(settings.parse_limits, settings.parse_cache_bytes))
    await statements.execute("SELECT * FROM t WHERE k = 'a';", {})
    assert pulls.planned == 1 and len(statements.lookups) == 1
    token = consistency.encode({("s", 0): 5, ("s", 1): 9})
    (covered,) = await statements.execute("SELECT * FROM t WHERE k = 'b';", {}, token)
    assert covered.consistency_token is token and covered.statement == "SELECT * FROM t WHERE k = 'b'"
    pulls.seen = {("s", 0): 7}
    (moved,) = await statements.execute("SELECT * FROM t WHERE k = 'c';", {}, token)
    assert consistency.decode(moved.consistency_token) == {("s", 0): 7, ("s", 1): 9}
    assert pulls.planned == 1  # neither was planned again


class _Producer:
    """Takes each row after ``delay_s``, at the next offset of its partition."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.sent: list[dict[str, Any]] = []

    async def send_and_wait(self, topic: str, value: bytes, **options: Any) -> Any:
        await asyncio.sleep(self.delay_s)
        self.sent.append({"topic": topic, "value": value, **options})
        return SimpleNamespace(partition=options["partition"], offset=41 + len(self.sent))


class _NoCoordinator:
    async def ExecuteStatement(self, request: Any, **options: Any) -> Any:
        raise AssertionError(f"sent to a coordinator: {request.sql}")


class _Reader:
    async def catch_up(self) -> None:
        pass


class _Inserter(RowInserter):
    """Finds no earlier row in the topic (there is no Kafka here), noting who looked."""

    def __init__(self, producer: _Producer):
        super().__init__(RouterSettings().kafka, cast(Any, producer))
        self.looked_for: list[str] = []

    async def _find(self, source: Any, record: Any, request_id: str) -> tuple[int, int] | None:
        self.looked_for.append(request_id)
        return None


def _inserting(producer: _Producer) -> Statements:
    """A router whose INSERTs go to ``producer``, over a metastore with the readings stream."""
    settings = RouterSettings()
    metastore = Metastore()
    metastore.apply(parse_statement("CREATE STREAM readings (sensor VARCHAR KEY, reading INT) "
                                    "WITH (kafka_topic='readings', partitions=4, value_format='json')"), 0)
    inserts = _Inserter(producer)
    coordinators = SimpleNamespace(leader=0, stubs=[_NoCoordinator()])
    return Statements(settings, metastore, cast(Any, _Reader()), cast(Any, coordinators), cast(Any, None),
                      StatementParser(settings.parse_limits), inserts)


async def test_an_insert_is_produced_by_the_router_with_its_request_id_and_a_token_for_its_row() -> None:
    producer = _Producer()
    statements = _inserting(producer)
    (outcome,) = await statements.execute("INSERT INTO readings (sensor, reading) VALUES ('s-1', 7);", {})
    (sent,) = producer.sent
    assert sent["topic"] == "readings" and sent["key"] == b"s-1" and sent["value"] == b'{"READING":7}'
    request_id = dict(sent["headers"])[REQUEST_ID_HEADER].decode()
    assert request_id.endswith("/0") and len(request_id) > 2  # made here: the request's first statement
    assert consistency.decode(outcome.consistency_token) == {("readings", sent["partition"]): 43}
    assert outcome.message == "Inserted into READINGS"


async def test_an_insert_past_the_requests_deadline_still_lands_once_and_its_resend_is_answered_with_it() -> None:
    producer = _Producer(delay_s=0.3)
    statements = _inserting(producer)
    insert = "INSERT INTO readings (sensor, reading) VALUES ('s-2', 1);"
    with pytest.raises(MillpondError) as raised:
        await statements.execute(insert, {}, time_remaining=0.15, request_id="client-9")
    assert raised.value.kind is ErrorKind.DEADLINE and "send the same request_id again" in raised.value.message
    assert producer.sent == []
    await asyncio.sleep(0.4)  # the row goes on to Kafka after the request gave up on it
    assert len(producer.sent) == 1
    (again,) = await statements.execute(insert, {}, request_id="client-9")
    assert len(producer.sent) == 1  # answered with the row, not produced again
    # A client's id may name a row inserted elsewhere: the first call looked; the resend
    # found the row in the router's memory.
    assert cast(_Inserter, statements.inserts).looked_for == ["client-9/0"]
    assert consistency.decode(again.consistency_token) == {("readings", producer.sent[0]["partition"]): 43}
    await statements.execute(insert, {})  # another request
    assert len(producer.sent) == 2


async def test_a_resend_while_the_first_insert_is_still_being_sent_is_answered_by_it_not_produced_again() -> None:
    producer = _Producer(delay_s=0.3)
    statements = _inserting(producer)
    insert = "INSERT INTO readings (sensor, reading) VALUES ('s-3', 1);"
    with pytest.raises(MillpondError) as raised:
        await statements.execute(insert, {}, time_remaining=0.15, request_id="client-7")
    assert raised.value.kind is ErrorKind.DEADLINE and producer.sent == []
    # The first send is not acknowledged yet, so the topic shows no row: the resend waits for it.
    (again,) = await statements.execute(insert, {}, request_id="client-7")
    assert len(producer.sent) == 1
    assert consistency.decode(again.consistency_token) == {("readings", producer.sent[0]["partition"]): 43}
    assert cast(_Inserter, statements.inserts).looked_for == ["client-7/0"]


async def test_a_request_id_used_again_for_another_insert_is_refused_not_answered_with_the_first_row() -> None:
    producer = _Producer(delay_s=0.3)
    statements = _inserting(producer)
    first = "INSERT INTO readings (sensor, reading) VALUES ('s-4', 1);"
    pending = asyncio.ensure_future(statements.execute(first, {}, request_id="client-5"))
    await asyncio.sleep(0.1)
    for value in (2, 3):
        with pytest.raises(StatementError, match="already used for another statement"):  # while in flight
            await statements.execute(f"INSERT INTO readings (sensor, reading) VALUES ('s-4', {value});", {},
                                     request_id="client-5")
    await pending
    with pytest.raises(StatementError, match="already used for another statement"):  # once inserted
        await statements.execute("INSERT INTO readings (sensor, reading) VALUES ('s-4', 2);", {}, request_id="client-5")
    assert len(producer.sent) == 1


async def test_a_request_id_too_long_to_keep_is_refused_before_anything_runs() -> None:
    producer = _Producer()
    statements = _inserting(producer)
    insert = "INSERT INTO readings (sensor, reading) VALUES ('s-6', 1);"
    with pytest.raises(StatementError, match="request_id has 129 characters; give one of at most 128"):
        await statements.execute(insert * 3, {}, request_id="r" * 129)
    assert producer.sent == []
    await statements.execute(insert, {}, request_id="r" * 128)
    assert len(producer.sent) == 1


class _BigPulls(_Pulls):
    """Each pull answers 1 MiB of encoded rows."""

    async def pull(self, stmt: Any, plan: Any, properties: Any, positions: Any, deadline: float) -> Any:
        self.seen[("s", len(self.seen))] = 1  # (counted in seen: how many pulls ran)
        return Outcome(stmt.text, status="", encoded_rows=[b"x" * (1 << 20)]), {}


async def test_the_results_of_one_request_are_bounded_by_what_one_response_may_carry() -> None:
    """Each pull may return up to max_rows_per_response rows, but a request of many of them
    is refused once its results pass max_message_bytes (4 MiB), saying what to do, rather than
    holding them all and failing to send them."""
    settings = RouterSettings()
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='s', partitions=2, "
                               "value_format='json')"), 0)
    meta.apply(parse_statement("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k"), 1)
    pulls = _BigPulls({})
    statements = Statements(settings, meta, cast(Any, None), cast(Any, None), cast(Any, pulls),
                            StatementParser(settings.parse_limits, settings.parse_cache_bytes))
    assert len(await statements.execute("SELECT * FROM t; SELECT * FROM t;", {})) == 2
    with pytest.raises(MillpondError) as raised:
        await statements.execute("SELECT * FROM t;" * 100, {})
    assert raised.value.kind is ErrorKind.RESOURCE_EXHAUSTED
    assert raised.value.message.startswith("statement 5 failed (earlier ones were applied): the results pass "
                                           f"{settings.max_message_bytes} bytes")
    assert len(pulls.seen) == 2 + 5  # it stopped there


async def test_a_coordinators_refusal_of_a_later_statement_says_which_failed() -> None:
    class Refusing:
        async def ExecuteStatement(self, request: Any, **options: Any) -> Any:
            if request.sql.startswith("DROP"):
                raise grpc.aio.AioRpcError(grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                           "NOPE does not exist")
            return coordinator_pb2.ExecuteStatementResponse(result=outcome_to_proto(Outcome(request.sql, "done")))

    settings = RouterSettings()
    statements = Statements(settings, Metastore(), cast(Any, _Reader()),
                            cast(Any, SimpleNamespace(leader=0, stubs=[Refusing()])), cast(Any, None),
                            StatementParser(settings.parse_limits))
    with pytest.raises(MillpondError) as raised:
        await statements.execute("TERMINATE ALL; DROP STREAM nope;", {})
    assert raised.value.message == "statement 2 failed (earlier ones were applied): NOPE does not exist"


class _Refusing(_Producer):
    """Refuses every row as the broker refuses a timestamp past its bound (or the client a
    record past max.request.size)."""

    def __init__(self, error: Exception):
        super().__init__()
        self.error = error

    async def send_and_wait(self, topic: str, value: bytes, **options: Any) -> Any:
        raise self.error


@pytest.mark.parametrize("error", [InvalidTimestampError(), MessageSizeTooLargeError()])
async def test_an_insert_kafka_refuses_is_not_written_and_not_to_be_resent(error: Exception) -> None:
    """A refusal is final: INVALID_ARGUMENT saying the row is not written (it was UNAVAILABLE,
    "it may still be written: resend", and every resend failed alike)."""
    statements = _inserting(_Refusing(error))
    with pytest.raises(StatementError, match="which is not written"):
        await statements.execute("INSERT INTO readings (sensor, reading) VALUES ('s-1', 7);", {})
