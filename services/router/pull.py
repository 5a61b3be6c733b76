"""Pull queries at the router: plan once per statement, route by key, fan out scans.

The key's partition is computed exactly as the Java client does (murmur2 of the
serialized key), so a lookup always lands on the partition that holds the key.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

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


async def execute_pull(plan: PullPlan, text: str, hosts: dict[int, str], lookup: Lookup, scan: Scan) -> Outcome:
    """Answer a planned pull query from the hosts of the table's partitions."""
    table = plan.table
    names = [c.name for c in table.columns]
    raw_rows: list[list[Any]] = []

    def host(partition: int) -> str:
        endpoint = hosts.get(partition)
        if endpoint is None:
            raise UnavailableError(
                f"no worker is active for partition {partition} of {table.name} (query {table.query_id})")
        return endpoint

    if plan.key is not None:
        key_col = table.key_column
        assert key_col is not None
        key_bytes = serialize_key(plan.key, key_col.type)
        partition = partition_for(key_bytes, table.partitions)
        response = await lookup(host(partition), worker_pb2.LookupRequest(
            table=table.name, partition=partition, key=key_bytes))
        if response.found:
            raw_rows.append([from_proto(v) for v in response.row.values])
    else:
        by_host: dict[str, list[int]] = defaultdict(list)
        for partition in range(table.partitions):
            by_host[host(partition)].append(partition)
        scan_limit = plan.limit if plan.where is None and plan.limit else 0
        for endpoint, partitions in sorted(by_host.items()):
            response = await scan(endpoint, worker_pb2.ScanRequest(
                table=table.name, partitions=partitions, limit=scan_limit))
            raw_rows += [[from_proto(v) for v in r.values] for r in response.rows]
    rows: list[list[Any]] = []
    for values in raw_rows:
        row = dict(zip(names, values, strict=True))
        if plan.where is not None and evaluate(plan.where, row) is not True:
            continue
        rows.append(_project(plan, row))
        if plan.limit is not None and len(rows) >= plan.limit:
            break
    return Outcome(text, status="", columns=plan.columns, rows=rows)
