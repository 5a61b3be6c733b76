"""Pull queries at the router: plan once per statement, route by key, fan out scans.

The key's partition is computed exactly as the Java client does (murmur2 of the
serialized key), so a lookup always lands on the partition that holds the key.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable
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
from millpond.shared.sql.planner import plan_select
from millpond.worker.v1 import worker_pb2

T = TypeVar("T")
Lookup = Callable[[str, worker_pb2.LookupRequest], Awaitable[worker_pb2.LookupResponse]]
Scan = Callable[[str, worker_pb2.ScanRequest], Awaitable[worker_pb2.ScanResponse]]


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


def project(items: tuple[ast.SelectItem, ...], table: DataSource, row: dict[str, Any]) -> list[Any]:
    """The SELECT list's values for one row of ``table`` (``*`` expands to its columns)."""
    out: list[Any] = []
    for item in items:
        if item.is_star:
            out += [row[c.name] for c in table.columns]
        else:
            assert item.expr is not None
            out.append(evaluate(item.expr, row))
    return out


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
    Scans ask one copy per partition, one call per host, all hosts at once; with a LIMIT
    they go host by host and stop once enough rows passed the filter. More than
    ``max_rows`` result rows is a LimitError. ``LIMIT 0`` answers no rows and asks no worker.
    """
    table = plan.table
    names = [c.name for c in table.columns]
    result = PullResult(Outcome(text, status="", columns=plan.columns))
    if plan.limit == 0:
        return result  # the columns and no row; no worker is asked, so no position is read

    def take(values_list: list[list[Any]]) -> bool:
        """Filter and project rows into the result; True once the LIMIT is reached."""
        for values in values_list:
            row = dict(zip(names, values, strict=True))
            if plan.where is not None and evaluate(plan.where, row) is not True:
                continue
            result.outcome.rows.append(project(plan.items, table, row))
            if max_rows is not None and len(result.outcome.rows) > max_rows:
                raise LimitError(f"the pull query returns more than {max_rows} rows, the most one response may "
                                 "hold (max_rows_per_response): add a LIMIT or a narrower WHERE")
            if plan.limit is not None and len(result.outcome.rows) >= plan.limit:
                return True
        return False

    if plan.partition is not None:
        partition, way = plan.partition, route(plan.partition)
        response = await _first_answer(table, partition, way, lambda r: lookup(
            r.endpoint, worker_pb2.LookupRequest(table=table.name, partition=partition, key=plan.key_bytes,
                                                 allow_standby=r.standby, min_input_offset=way.min_input_offset)))
        result.positions[partition] = response.input_offset
        take([[from_proto(v) for v in response.row.values]] if response.found else [])
        return result

    # Without a WHERE every row scanned is a result row: ask for no more than the LIMIT, nor
    # more than one past what a response may hold. With a WHERE (filtered here), the LIMIT
    # cannot bound the workers' scans; their max_scan_rows does.
    bounds = [n for n in (plan.limit, None if max_rows is None else max_rows + 1) if n is not None]
    scan_limit = min(bounds, default=0) if plan.where is None else 0
    routes = {p: route(p) for p in range(table.partitions)}

    def scan_one(partition: int) -> Callable[[Replica], Awaitable[worker_pb2.ScanResponse]]:
        return lambda r: scan(r.endpoint, worker_pb2.ScanRequest(
            table=table.name, partitions=[partition], limit=scan_limit, allow_standby=r.standby,
            min_input_offsets={partition: routes[partition].min_input_offset}))

    by_host: dict[Replica, list[int]] = defaultdict(list)
    for partition, way in routes.items():
        if not way.candidates:
            await _first_answer(table, partition, way, scan_one(partition))  # raises, naming the exclusions
        by_host[way.candidates[0]].append(partition)

    async def scan_host(replica: Replica, partitions: list[int]) -> list[worker_pb2.ScanResponse]:
        """One call for the partitions ``replica`` is first choice for; a partition whose host
        fails is asked of its other copies one by one."""
        try:
            return [await scan(replica.endpoint, worker_pb2.ScanRequest(
                table=table.name, partitions=partitions, limit=scan_limit, allow_standby=replica.standby,
                min_input_offsets={p: routes[p].min_input_offset for p in partitions}))]
        except UnavailableError as err:
            failed = [f"{replica.endpoint} ({'standby' if replica.standby else 'active'}): {err.message}"]
            return [await _first_answer(table, p, replace(routes[p], candidates=routes[p].candidates[1:]),
                                        scan_one(p), failed) for p in partitions]

    hosts = sorted(by_host.items(), key=lambda item: item[0].endpoint)
    if plan.limit is None:
        answers = [r for rs in await asyncio.gather(*(scan_host(h, ps) for h, ps in hosts)) for r in rs]
    else:
        answers = []
        for host, partitions in hosts:
            got = await scan_host(host, partitions)
            answers += got
            if take([[from_proto(v) for v in row.values] for a in got for row in a.rows]):
                break
    for answer in answers:
        result.positions.update(answer.input_offsets)
    if plan.limit is None:
        take([[from_proto(v) for v in row.values] for a in answers for row in a.rows])
    return result
