"""A router whose metastore is behind its workers': a scan planned with a custom type the
workers know defined anew is refused by every copy (they plan other columns); the router reads
the command topic then, plans the statement again as written, and answers with the new type,
instead of asking again with the old plan until the deadline."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

from millpond.services.router.coordinators import Coordinators
from millpond.services.router.hosts import HostTable
from millpond.services.router.pull import Replica
from millpond.services.router.pull_routing import PullRouter
from millpond.services.router.statements import Statements
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import RouterSettings
from millpond.shared.errors import UnavailableError
from millpond.shared.results import Outcome
from millpond.shared.rpc.tls import ChannelFactory
from millpond.shared.sql.guard import StatementParser
from millpond.shared.sql.parser import parse_statement
from millpond.worker.v1 import worker_pb2

HERE = "here:1"
PULL = "SELECT sensor, CAST(n AS amount) AS a FROM counts;"


class Worker:
    """The router's own worker, whose metastore has AMOUNT as a BIGINT: it refuses a scan
    planned with other columns, as ``serving.select`` does."""

    endpoint = HERE

    def __init__(self) -> None:
        self.asked: list[tuple[str, ...]] = []

    async def lookup(self, request: worker_pb2.LookupRequest) -> Any:
        raise AssertionError("a scan was expected")

    async def scan(self, request: worker_pb2.ScanPagesRequest) -> AsyncIterator[worker_pb2.ScanPagesResponse]:
        self.asked.append(tuple(request.columns))
        if tuple(request.columns) != ("SENSOR VARCHAR", "A BIGINT"):
            raise UnavailableError(f"worker w plans {request.statement!r} with the columns SENSOR VARCHAR, A BIGINT, "
                                   f"not {', '.join(request.columns)} as the router planned it")
        for p in request.partitions:
            yield worker_pb2.ScanPagesResponse(input_offsets={p: 3})


class Reader:
    """The router's command reader: ``unread`` is applied by its next catch-up."""

    def __init__(self, metastore: Metastore, unread: list[str]):
        self.metastore, self.unread = metastore, unread
        self.catch_ups = 0

    async def catch_up(self) -> None:
        self.catch_ups += 1
        for text in self.unread:
            self.metastore.apply(parse_statement(text), self.metastore.command_offset + 1)
        self.unread.clear()


async def test_a_scan_refused_for_a_type_defined_anew_is_planned_again_once_the_router_has_read_it() -> None:
    meta = Metastore()
    for offset, text in enumerate([
            "CREATE STREAM readings (sensor VARCHAR KEY, reading INT) WITH (kafka_topic='readings', partitions=2, "
            "value_format='json')",
            "CREATE TABLE counts AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor",
            "CREATE TYPE amount AS INT"]):
        meta.apply(parse_statement(text), offset)
    reader = Reader(meta, ["DROP TYPE amount", "CREATE TYPE amount AS BIGINT"])
    settings = RouterSettings(coordinator="127.0.0.1:1")
    channels = ChannelFactory(None)
    worker = Worker()
    pulls = PullRouter(settings, meta, cast(Any, reader), channels, Coordinators(settings, channels), HostTable(1.0),
                       worker)
    (query_id,) = meta.queries
    pulls.replicas = {query_id: {p: [Replica(HERE, False)] for p in range(2)}}
    statements = Statements(settings, meta, cast(Any, reader), cast(Any, None), pulls,
                            StatementParser(settings.parse_limits, settings.parse_cache_bytes))
    try:
        (outcome,) = await statements.execute(PULL, {})
    finally:
        await channels.close()
    assert outcome.columns == [("SENSOR", "VARCHAR"), ("A", "BIGINT")]
    assert worker.asked[0] == ("SENSOR VARCHAR", "A INT") and worker.asked[-1] == ("SENSOR VARCHAR", "A BIGINT")
    assert reader.catch_ups >= 1


async def test_a_table_made_anew_as_a_stream_is_pulled_as_a_stream_once_the_router_has_read_it() -> None:
    """The copies refuse the router's plan of a table that a newer metastore has as a stream
    (dropped and declared again): planned again, the pull reads the stream's records."""
    meta = Metastore()
    for offset, text in enumerate([
            "CREATE STREAM readings (sensor VARCHAR KEY, reading INT) WITH (kafka_topic='readings', partitions=2, "
            "value_format='json')",
            "CREATE TABLE counts AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor"]):
        meta.apply(parse_statement(text), offset)
    (query_id,) = meta.queries
    reader = Reader(meta, ["DROP TABLE counts", "CREATE STREAM counts (sensor VARCHAR KEY, n BIGINT) "
                                                "WITH (kafka_topic='counts', partitions=2, value_format='json')"])
    settings = RouterSettings(coordinator="127.0.0.1:1")
    channels = ChannelFactory(None)
    worker = Worker()
    pulls = PullRouter(settings, meta, cast(Any, reader), channels, Coordinators(settings, channels), HostTable(1.0),
                       worker)
    pulls.replicas = {query_id: {p: [Replica(HERE, False)] for p in range(2)}}
    statements = Statements(settings, meta, cast(Any, reader), cast(Any, None), pulls,
                            StatementParser(settings.parse_limits, settings.parse_cache_bytes))
    read: list[str] = []

    async def answer(stmt: Any, source: Any, positions: Any, deadline: float) -> Any:
        read.append(source.kind)
        return Outcome(stmt.text, status="")

    statements.stream_pulls.answer = answer  # type: ignore[method-assign]
    try:
        await statements.execute("SELECT sensor, n FROM counts;", {})
    finally:
        await channels.close()
    assert read == ["STREAM"] and worker.asked  # asked with the table's plan first, then read as a stream
