"""A windowed table's key lookup at the worker (``serving.scan`` with a plan naming the key):
it reads that key's windows and nothing else, not even the windows of longer keys that start
with it, so the scan cap counts that key's rows alone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from millpond.services.worker.serving import LocalCopy, scan
from millpond.services.worker.state.store import INPUT_OFFSET, PartitionStore, encode_state
from millpond.services.worker.task import aggregate_rows
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.kafka.serde import windowed_key
from millpond.shared.sql import aggregates, ast
from millpond.shared.sql.parser import parse_statement
from millpond.shared.sql.planner import plan_select


def test_a_lookup_reads_only_its_own_keys_windows(tmp_path: Path) -> None:
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='s', partitions=1, "
                               "value_format='json')"), 0)
    meta.apply(parse_statement("CREATE TABLE w AS SELECT k, COUNT(*) AS n FROM s WINDOW TUMBLING (SIZE 1 MINUTE) "
                               "GROUP BY k"), 1)
    table = meta.source("W")
    store = PartitionStore(tmp_path / "store")
    rows = {windowed_key(b"1", 0): [[2]], windowed_key(b"1", 60_000): [[1]]}
    rows |= {windowed_key(b"1" + str(i).encode(), 0): [[i]] for i in range(50)}  # "10", "11", ...: longer keys
    store.write({k: encode_state(v) for k, v in rows.items()}, {INPUT_OFFSET: 7})
    read: list[int] = []
    page = store.page

    def counted(after: bytes | None, count: int, prefix: bytes = b"") -> list[tuple[bytes, list[Any]]]:
        items = page(after, count, prefix)
        read.append(len(items))
        return items

    store.page = counted  # type: ignore[method-assign]
    copy = LocalCopy(store, aggregate_rows(table, [aggregates.require("COUNT")]), 7)
    query = parse_statement("SELECT * FROM w WHERE k = '1' AND WINDOWSTART >= 0")
    assert isinstance(query, ast.Query)

    async def lookup() -> list[list[Any]]:
        return [row async for piece in scan("W", lambda _: copy, [0], 0, 2, plan_select(query, table))
                for row in piece.rows]

    try:
        # At most 2 rows may be read: the key's 2 windows, none of the 50 keys "10" to "149".
        assert asyncio.run(lookup()) == [["1", 0, 60_000, 2], ["1", 60_000, 120_000, 1]]
        assert sum(read) == 2
    finally:
        store.close()
