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

from millpond.common.v1 import rows_pb2
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.sources import DataSource
from millpond.shared.catalog.topology import stages
from millpond.shared.errors import LimitError, StatementError, UnavailableError
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.kafka.serde import add_values, from_proto
from millpond.shared.results import Outcome
from millpond.shared.sql import ast
from millpond.shared.sql.planner import key_equality, pinned_key, plan_select, select_row
from millpond.worker.v1 import worker_pb2


@dataclass(frozen=True)
class LookupAnswer:
    """A copy's answer for one key: the table's row as a worker sends it (None: no row) and
    the input position the copy reflects. A remote worker's comes from its ``LookupResponse``
    (``lookup_answer``); the router's own worker gives it in-process, without the protobuf."""

    row: list[Any] | None
    input_offset: int


def lookup_answer(response: worker_pb2.LookupResponse) -> LookupAnswer:
    """A worker's ``LookupResponse`` as an answer."""
    return LookupAnswer([from_proto(v) for v in response.row.values] if response.found else None,
                        response.input_offset)


T = TypeVar("T")
Lookup = Callable[[str, worker_pb2.LookupRequest], Awaitable[LookupAnswer]]
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
    upstream: tuple[tuple[str, str, str], ...] = ()
    """The query's stages before the one that reads ``input_topic``, in data-flow order: each
    one's name, the topic it reads and the topic it writes. A consistency token's positions on
    a topic one reads are carried through it (``StagePositions``) to the topic it writes."""
    row_as_is: bool = False
    """A key lookup whose table row is its result as it is (``row_as_is``): nothing to filter
    or project in the row its copy finds for the key (``lookup_result``)."""

    @property
    def looks_up(self) -> bool:
        """Whether the pull is a key lookup (one partition's copy asked for the key's row); a
        windowed table's key lookup is a scan of the key's rows."""
        return self.partition is not None and self.table.window is None


def row_as_is(table: DataSource, items: tuple[ast.SelectItem, ...], where: ast.Expr | None, key: Any) -> bool:
    """Whether a key lookup's table row is its result as it is: ``SELECT *`` with a WHERE that
    is the key's equality alone, its literal the key as looked up (text or an integer, whose
    equality is Python's)."""
    keys = table.key_columns
    if table.window is not None or len(items) != 1 or not items[0].is_star or len(keys) != 1:
        return False  # (a windowed table's lookup scans the key's rows)
    literal = key_equality(where, keys[0].name)
    return (isinstance(where, ast.Binary) and where.op == "=" and literal is not None
            and type(key) in (str, int) and type(literal.value) is type(key) and literal.value == key)


def plan_pull(query: ast.Query, metastore: Metastore, service_id: str) -> PullPlan:
    """Check a pull query against its table and decide how to answer it."""
    table = metastore.source(query.source)
    if table.kind != "TABLE" or table.query_id is None:
        raise StatementError(
            f"{table.name} is not a materialized table; pull queries read tables created by "
            "CREATE TABLE ... AS SELECT (use EMIT CHANGES for a push query)")
    selected = plan_select(query, table)
    columns = [(name, str(type_)) for name, type_ in selected.columns]
    pinned = pinned_key(query.where, table)
    persistent = metastore.query(table.query_id)
    chain = stages(persistent, metastore.source(persistent.source), table, service_id)
    input_topic = chain[-1].source.topic
    upstream = tuple((stage.name, stage.source.topic, stage.sink.topic) for stage in chain[:-1])
    if pinned is None:
        return PullPlan(table, None, columns, selected.items, selected.where, query.limit, input_topic, upstream=upstream)
    values, key_bytes = pinned
    key = values[0] if len(values) == 1 else values
    return PullPlan(table, key, columns, selected.items, selected.where, query.limit, input_topic, key_bytes,
                    partition_for(key_bytes, table.partitions), upstream,
                    row_as_is(table, query.items, query.where, key))


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
    wait_ms: int = 0
    """How long the copy asked may wait to reach ``min_input_offset`` (0: it answers at once):
    set when the active is asked and no report shows it there (``PullRouter._route``)."""


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


def lookup_request(plan: PullPlan, replica: Replica, way: Route) -> worker_pb2.LookupRequest:
    """What a key lookup asks of ``replica``, one of ``way``'s candidates."""
    return worker_pb2.LookupRequest(table=plan.table.name, partition=plan.partition, key=plan.key_bytes,
                                    allow_standby=replica.standby, min_input_offset=way.min_input_offset,
                                    wait_ms=way.wait_ms)


def lookup_result(plan: PullPlan, text: str, found: LookupAnswer) -> PullResult:
    """A key lookup's result from its copy's answer (one row at most)."""
    assert plan.partition is not None
    result = PullResult(Outcome(text, status="", columns=plan.columns), {plan.partition: found.input_offset})
    if found.row is None:
        return result
    # The row found for the key, as it is when that is the result (and has the table's
    # columns: one of a copy that knows another version of the table takes the general way).
    row = found.row if plan.row_as_is and len(found.row) == len(plan.table.row_columns) \
        else selected_row(plan, found.row)
    if row is not None:
        result.outcome.rows.append(row)
    return result


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
    held = HeldRows(max_rows)

    if plan.looks_up:
        assert plan.partition is not None
        way = route(plan.partition)
        return lookup_result(plan, text, await _first_answer(table, plan.partition, way, lambda r: lookup(
            r.endpoint, lookup_request(plan, r, way))))

    # The workers filter, project and cut the rows themselves (the statement travels with the
    # scan) and stream them a page at a time; the router counts the rows it holds as they come
    # and stops every scan once they pass max_rows, so a scan holds at most that many here.
    bounds = [n for n in (plan.limit, None if max_rows is None else max_rows + 1) if n is not None]
    scan_limit = min(bounds, default=0)
    # A windowed table holds a key's windows as rows of their own: its key lookup is a scan of
    # the key's partition (the worker reads only that key's rows).
    routes = {p: route(p) for p in (range(table.partitions) if plan.partition is None else [plan.partition])}
    columns = [f"{name} {type_}" for name, type_ in plan.columns]

    async def pages(replica: Replica, partitions: list[int], limit: int) -> ScanAnswer:
        """Every page of one worker's scan of ``partitions``; its rows are held (and counted)
        only if the whole call succeeds."""
        answer = ScanAnswer()
        request = worker_pb2.ScanPagesRequest(
            table=table.name, partitions=partitions, limit=limit, allow_standby=replica.standby,
            min_input_offsets={p: routes[p].min_input_offset for p in partitions}, statement=text,
            query_id=table.query_id, wait_ms=max(routes[p].wait_ms for p in partitions), columns=columns)
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

    def wanted() -> int:
        """The limit of a call made now: the cap's (or none) without a LIMIT; with one, what it
        still wants (the rows of the calls before count, a failed call's do not)."""
        return scan_limit if plan.limit is None else scan_limit - held.rows

    def reached() -> bool:
        return plan.limit is not None and held.rows >= scan_limit

    def retry(partition: int) -> Callable[[Replica], Awaitable[ScanAnswer]]:
        return lambda r: pages(r, [partition], wanted())

    by_host: dict[Replica, list[int]] = defaultdict(list)
    for partition, way in routes.items():
        if not way.candidates:
            await _first_answer(table, partition, way, retry(partition))  # raises, naming the exclusions
        by_host[way.candidates[0]].append(partition)

    async def scan_host(replica: Replica, partitions: list[int]) -> list[ScanAnswer]:
        """One call for the partitions ``replica`` is first choice for; a partition whose host
        fails is asked of its other copies one by one, until a LIMIT is reached."""
        try:
            return [await pages(replica, partitions, wanted())]
        except UnavailableError as err:
            failed = [f"{replica.endpoint} ({'standby' if replica.standby else 'active'}): {err.message}"]
            answers = []
            for p in partitions:
                if reached():
                    break
                answers.append(await _first_answer(table, p, replace(routes[p], candidates=routes[p].candidates[1:]),
                                                   retry(p), failed))
            return answers

    hosts = sorted(by_host.items(), key=lambda item: item[0].endpoint)
    if plan.limit is None:
        answers = [a for got in await _together(scan_host(h, ps) for h, ps in hosts) for a in got]
    else:  # host by host, each asked for what the LIMIT still wants
        answers = []
        for host, partitions in hosts:
            answers += await scan_host(host, partitions)
            if reached():
                break
    for answer in answers:
        result.positions.update(answer.positions)
        result.outcome.encoded_rows += answer.pages
    return result


def result_row(plan: PullPlan, row: rows_pb2.Row) -> list[Any] | None:
    """The result row for a table row as a worker sends it, or None when the WHERE drops it:
    for scans of workers too old to answer the statement themselves."""
    return selected_row(plan, [from_proto(v) for v in row.values])


def selected_row(plan: PullPlan, values: list[Any]) -> list[Any] | None:
    """The result row for a table row's values (in the table's column order), or None when
    the WHERE drops it. A row of another version of the table (a copy whose worker has not
    replayed a CREATE OR REPLACE that added columns at the end, or has and the router not
    yet) has those columns NULL, or left out."""
    names = [c.name for c in plan.table.row_columns]
    if len(values) != len(names):
        values = [*values[:len(names)], *[None] * (len(names) - len(values))]
    return select_row(plan.items, plan.where, plan.table, dict(zip(names, values, strict=True)))


def legacy_page(plan: PullPlan, response: worker_pb2.ScanResponse, limit: int) -> worker_pb2.ScanPagesResponse:
    """A unary Scan's whole table rows (a worker of an earlier version) as one ScanPages page:
    filtered, projected and cut to ``limit`` (0: none) here."""
    page = rows_pb2.StatementResult()
    for row in response.rows:
        if 0 < limit <= len(page.rows):
            break
        if (values := result_row(plan, row)) is not None:
            add_values(page.rows.add().values, values)
    return worker_pb2.ScanPagesResponse(rows=page.SerializeToString(), row_count=len(page.rows),
                                        input_offsets=response.input_offsets)


@dataclass
class ScanAnswer:
    """What one worker's scan streamed: each page's result rows as they came (serialized), how
    many, and each partition's position."""

    pages: list[bytes] = field(default_factory=list)
    rows: int = 0
    positions: dict[int, int] = field(default_factory=dict)


class HeldRows:
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
