"""Pull queries at the router: plan once per statement, route by key, fan out scans.

The key's partition is computed exactly as the Java client does (murmur2 of the
serialized key), so a lookup always lands on the partition that holds the key.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.sources import DataSource
from millpond.shared.catalog.topology import stages
from millpond.shared.errors import LimitError, StatementError, UnavailableError
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.kafka.serde import coerce, from_proto, serialize_key
from millpond.shared.results import Outcome
from millpond.shared.sql import ast
from millpond.shared.sql.expressions import evaluate
from millpond.shared.sql.planner import plan_select, project
from millpond.worker.v1 import worker_pb2

T = TypeVar("T")
Lookup = Callable[[str, worker_pb2.LookupRequest], Awaitable[worker_pb2.LookupResponse]]
Scan = Callable[[str, worker_pb2.ScanPagesRequest], AsyncGenerator[worker_pb2.ScanPagesResponse, None]]
"""A worker's scan: its pages as they come (UnavailableError when it cannot answer)."""


@dataclass(frozen=True)
class PullPlan:
    """A pull query resolved against the metastore (cached per statement text and metastore
    version, so a repeated query is not planned again)."""

    table: DataSource
    key: Any | None
    columns: list[tuple[str, str]]
    items: tuple[ast.SelectItem, ...]
    where: ast.Expr | None
    limit: int | None
    input_topic: str
    """The topic the table's partitions are computed from: consistency tokens name its offsets."""
    key_bytes: bytes | None = None
    partition: int | None = None
    """For a key lookup: the serialized key and the partition that holds it."""


def key_equality(where: ast.Expr | None, key: str) -> ast.Literal | None:
    """The literal ``k`` in a top-level conjunct ``KEY = k`` of ``where``, if any."""
    if where is None:
        return None
    if isinstance(where, ast.Binary) and where.op == "AND":
        return key_equality(where.left, key) or key_equality(where.right, key)
    if isinstance(where, ast.Binary) and where.op == "=":
        for col, lit in ((where.left, where.right), (where.right, where.left)):
            if isinstance(col, ast.ColumnRef) and col.name == key and isinstance(lit, ast.Literal):
                return lit
    return None


def plan_pull(query: ast.Query, metastore: Metastore, service_id: str) -> PullPlan:
    """Check a pull query against its table and decide how to answer it."""
    table = metastore.source(query.source)
    if table.kind != "TABLE" or table.query_id is None:
        raise StatementError(
            f"{table.name} is not a materialized table; pull queries read tables created by "
            "CREATE TABLE ... AS SELECT (use EMIT CHANGES for a push query)")
    selected = plan_select(query, table)
    columns = [(name, str(type_)) for name, type_ in selected.columns]
    key_col = table.key_column
    assert key_col is not None
    literal = key_equality(query.where, key_col.name)
    key = coerce(literal.value, key_col.type, key_col.name) if literal is not None else None
    persistent = metastore.query(table.query_id)
    input_topic = stages(persistent, metastore.source(persistent.source), table, service_id)[-1].source.topic
    if key is None:
        return PullPlan(table, None, columns, query.items, query.where, query.limit, input_topic)
    key_bytes = serialize_key(key, key_col.type)
    return PullPlan(table, key, columns, query.items, query.where, query.limit, input_topic, key_bytes,
                    partition_for(key_bytes, table.partitions))


@dataclass(frozen=True)
class Replica:
    """A worker that can answer for a partition."""

    endpoint: str
    standby: bool
    """Whether it holds a standby copy rather than the active."""


Replicas = dict[int, list[Replica]]
"""Per partition, the workers that hold a copy (the active first)."""


@dataclass(frozen=True)
class Route:
    """Whom to ask for one partition, and why the others are not asked."""

    candidates: list[Replica]
    """The copies that pass the request's filters, best first."""
    excluded: list[str]
    """One line per copy that does not, with the reason."""
    min_input_offset: int = 0
    """The position the consistency token requires (0: none)."""


Router = Callable[[int], Route]
"""A partition's route for this request."""


@dataclass
class PullResult:
    """A pull query's rows and the input position per partition they reflect."""

    outcome: Outcome
    positions: dict[int, int] = field(default_factory=dict)


async def _first_answer(table: DataSource, partition: int, route: Route, call: Callable[[Replica], Awaitable[T]],
                        failed: list[str] | None = None) -> T:
    """Ask the partition's qualified copies in order until one answers; UnavailableError
    naming every copy scanned and why it did not answer, when none does."""
    reasons = list(route.excluded) + (failed or [])
    for replica in route.candidates:
        try:
            return await call(replica)
        except UnavailableError as err:
            reasons.append(f"{replica.endpoint} ({'standby' if replica.standby else 'active'}): {err.message}")
    raise UnavailableError(
        f"no worker could answer for partition {partition} of {table.name} (query {table.query_id}): "
        + ("; ".join(reasons) if reasons else "no copy is assigned"))


async def execute_pull(plan: PullPlan, text: str, route: Router, lookup: Lookup, scan: Scan,
                       max_rows: int | None = None) -> PullResult:
    """Answer a planned pull query from qualified copies of the table's partitions.

    ``lookup`` and ``scan`` raise ``UnavailableError`` when a copy cannot answer (it is down,
    no longer holds the partition, or is behind the token); the next qualified copy is asked.
    Scans carry the statement ``text``: the workers answer its SELECT list for the rows its
    WHERE keeps, up to its LIMIT. They ask one copy per partition, one call per host, all hosts
    at once; with a LIMIT they go host by host and stop once it is reached. More than
    ``max_rows`` result rows is a LimitError, raised as soon as the router holds that many.
    ``LIMIT 0`` answers no rows and asks no worker.
    """
    table = plan.table
    result = PullResult(Outcome(text, status="", columns=plan.columns))
    if plan.limit == 0:
        return result  # the columns and no row; no worker is asked, so no position is read
    held = _Held(max_rows)

    if plan.partition is not None:
        partition, way = plan.partition, route(plan.partition)
        response = await _first_answer(table, partition, way, lambda r: lookup(
            r.endpoint, worker_pb2.LookupRequest(table=table.name, partition=partition, key=plan.key_bytes,
                                                 allow_standby=r.standby, min_input_offset=way.min_input_offset)))
        result.positions[partition] = response.input_offset
        if response.found:
            row = dict(zip((c.name for c in table.columns), map(from_proto, response.row.values), strict=True))
            if plan.where is None or evaluate(plan.where, row) is True:
                held.add(1)
                result.outcome.rows.append(project(plan.items, table, row))
        return result

    # The workers filter, project and cut the rows themselves (the statement travels with the
    # scan) and stream them a page at a time; the router counts the rows it holds as they come
    # and stops every scan once they pass max_rows, so a scan holds at most that many here.
    bounds = [n for n in (plan.limit, None if max_rows is None else max_rows + 1) if n is not None]
    scan_limit = min(bounds, default=0)
    routes = {p: route(p) for p in range(table.partitions)}

    async def pages(replica: Replica, partitions: list[int], limit: int) -> ScanAnswer:
        """Every page of one worker's scan of ``partitions``; its rows are held (and counted)
        only if the whole call succeeds."""
        answer = ScanAnswer()
        request = worker_pb2.ScanPagesRequest(
            table=table.name, partitions=partitions, limit=limit, allow_standby=replica.standby,
            min_input_offsets={p: routes[p].min_input_offset for p in partitions}, statement=text)
        try:
            async with contextlib.aclosing(scan(replica.endpoint, request)) as stream:
                async for page in stream:
                    answer.pages.append(page.rows)
                    answer.positions.update(page.input_offsets)
                    answer.rows += page.row_count
                    held.add(page.row_count)
        except UnavailableError:
            held.add(-answer.rows)
            raise
        return answer

    def retry(partition: int, limit: int) -> Callable[[Replica], Awaitable[ScanAnswer]]:
        return lambda r: pages(r, [partition], limit)

    by_host: dict[Replica, list[int]] = defaultdict(list)
    for partition, way in routes.items():
        if not way.candidates:
            await _first_answer(table, partition, way, retry(partition, scan_limit))  # raises, naming the exclusions
        by_host[way.candidates[0]].append(partition)

    async def scan_host(replica: Replica, partitions: list[int], limit: int) -> list[ScanAnswer]:
        """One call for the partitions ``replica`` is first choice for; a partition whose host
        fails is asked of its other copies one by one."""
        try:
            return [await pages(replica, partitions, limit)]
        except UnavailableError as err:
            failed = [f"{replica.endpoint} ({'standby' if replica.standby else 'active'}): {err.message}"]
            return [await _first_answer(table, p, replace(routes[p], candidates=routes[p].candidates[1:]),
                                        retry(p, limit), failed) for p in partitions]

    hosts = sorted(by_host.items(), key=lambda item: item[0].endpoint)
    if plan.limit is None:
        answers = [a for got in await _together(scan_host(h, ps, scan_limit) for h, ps in hosts) for a in got]
    else:  # host by host, each asked for what the LIMIT still wants
        answers = []
        for host, partitions in hosts:
            answers += await scan_host(host, partitions, scan_limit - held.rows)
            if held.rows >= scan_limit:
                break
    for answer in answers:
        result.positions.update(answer.positions)
        result.outcome.encoded_rows += answer.pages
    return result


@dataclass
class ScanAnswer:
    """What one worker's scan streamed: each page's result rows as they came (serialized), how
    many, and each partition's position."""

    pages: list[bytes] = field(default_factory=list)
    rows: int = 0
    positions: dict[int, int] = field(default_factory=dict)


class _Held:
    """The result rows a pull query's scans hold at the router, against the most it may return."""

    def __init__(self, max_rows: int | None):
        self.max_rows = max_rows
        self.rows = 0

    def add(self, count: int) -> None:
        """Count ``count`` more rows (fewer, when a failed call's rows are dropped); LimitError
        once they pass ``max_rows``."""
        self.rows += count
        if self.max_rows is not None and self.rows > self.max_rows:
            raise LimitError(f"the pull query returns more than {self.max_rows} rows, the most one response may "
                             "hold (max_rows_per_response): add a LIMIT or a narrower WHERE")


async def _together(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Every call's result, run at once; the first failure cancels the others (and waits for
    them to end, so no scan outlives the request) and is raised."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
