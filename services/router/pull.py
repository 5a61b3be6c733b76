"""Pull queries at the router: plan once per statement, route by key, fan out scans.

The key's partition is computed exactly as the Java client does (murmur2 of the
serialized key), so a lookup always lands on the partition that holds the key.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from millpond.worker.v1 import worker_pb2

from shared.catalog import DataSource
from shared.errors import StatementError, UnavailableError
from shared.metastore import Metastore
from shared.partitioner import partition_for
from shared.results import Outcome
from shared.serde import coerce, from_proto, serialize_key
from shared.sql import ast
from shared.sql.expressions import evaluate
from shared.sql.planner import plan_select

T = TypeVar("T")
Lookup = Callable[[str, worker_pb2.LookupRequest], Awaitable[worker_pb2.LookupResponse]]
Scan = Callable[[str, worker_pb2.ScanRequest], Awaitable[worker_pb2.ScanResponse]]


@dataclass(frozen=True)
class PullPlan:
    """A pull query resolved against the metastore."""

    table: DataSource
    key: Any | None
    columns: list[tuple[str, str]]
    items: tuple[ast.SelectItem, ...]
    where: ast.Expr | None
    limit: int | None


def _key_equality(where: ast.Expr | None, key: str) -> ast.Literal | None:
    """The literal ``k`` in a top-level conjunct ``KEY = k`` of ``where``, if any."""
    if where is None:
        return None
    if isinstance(where, ast.Binary) and where.op == "AND":
        return _key_equality(where.left, key) or _key_equality(where.right, key)
    if isinstance(where, ast.Binary) and where.op == "=":
        for col, lit in ((where.left, where.right), (where.right, where.left)):
            if isinstance(col, ast.ColumnRef) and col.name == key and isinstance(lit, ast.Literal):
                return lit
    return None


def plan_pull(query: ast.Query, metastore: Metastore) -> PullPlan:
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
    literal = _key_equality(query.where, key_col.name)
    key = coerce(literal.value, key_col.type, key_col.name) if literal is not None else None
    return PullPlan(table, key, columns, query.items, query.where, query.limit)


def _project(plan: PullPlan, row: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    for item in plan.items:
        if item.is_star:
            out += [row[c.name] for c in plan.table.columns]
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
"""Per partition, the workers to ask in order (the active first)."""


async def _first_answer(table: DataSource, partition: int, candidates: list[Replica],
                        call: Callable[[Replica], Awaitable[T]]) -> T:
    """Ask the partition's replicas in order until one answers; UnavailableError naming
    every replica tried and why, when none does."""
    reasons = []
    for replica in candidates:
        try:
            return await call(replica)
        except UnavailableError as err:
            reasons.append(f"{replica.endpoint} ({'standby' if replica.standby else 'active'}): {err.message}")
    raise UnavailableError(
        f"no worker could answer for partition {partition} of {table.name} (query {table.query_id}): "
        + ("; ".join(reasons) if reasons else "no replica is assigned"))


async def execute_pull(plan: PullPlan, text: str, replicas: Replicas, lookup: Lookup, scan: Scan) -> Outcome:
    """Answer a planned pull query from the replicas of the table's partitions.

    ``lookup`` and ``scan`` raise ``UnavailableError`` when a replica cannot answer (it is
    down, or no longer holds the partition); the next replica is asked then.
    """
    table = plan.table
    names = [c.name for c in table.columns]
    raw_rows: list[list[Any]] = []
    if plan.key is not None:
        key_col = table.key_column
        assert key_col is not None
        key_bytes = serialize_key(plan.key, key_col.type)
        partition = partition_for(key_bytes, table.partitions)
        response = await _first_answer(table, partition, replicas.get(partition, []), lambda r: lookup(
            r.endpoint, worker_pb2.LookupRequest(table=table.name, partition=partition, key=key_bytes,
                                                 allow_standby=r.standby)))
        if response.found:
            raw_rows.append([from_proto(v) for v in response.row.values])
    else:
        scan_limit = plan.limit if plan.where is None and plan.limit else 0

        def scan_one(partition: int) -> Callable[[Replica], Awaitable[worker_pb2.ScanResponse]]:
            return lambda r: scan(r.endpoint, worker_pb2.ScanRequest(
                table=table.name, partitions=[partition], limit=scan_limit, allow_standby=r.standby))

        # One call per host for the partitions it is first choice for; a partition whose
        # host fails is asked of its other replicas one by one.
        by_host: dict[Replica, list[int]] = defaultdict(list)
        for partition in range(table.partitions):
            first = replicas.get(partition, [])
            if not first:
                await _first_answer(table, partition, [], scan_one(partition))  # raises
            by_host[first[0]].append(partition)
        for replica, partitions in sorted(by_host.items(), key=lambda item: item[0].endpoint):
            try:
                responses = [await scan(replica.endpoint, worker_pb2.ScanRequest(
                    table=table.name, partitions=partitions, limit=scan_limit, allow_standby=replica.standby))]
            except UnavailableError:
                responses = [await _first_answer(table, p, replicas[p][1:], scan_one(p)) for p in partitions]
            raw_rows += [[from_proto(v) for v in r.values] for response in responses for r in response.rows]
    rows: list[list[Any]] = []
    for values in raw_rows:
        row = dict(zip(names, values, strict=True))
        if plan.where is not None and evaluate(plan.where, row) is not True:
            continue
        rows.append(_project(plan, row))
        if plan.limit is not None and len(rows) >= plan.limit:
            break
    return Outcome(text, status="", columns=plan.columns, rows=rows)
