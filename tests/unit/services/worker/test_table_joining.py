"""A table-table join task's rule, without Kafka: after each record of any side, the key's
result is the join of that key's latest rows of every side (chained left to right by each
JOIN's type), or none; stored rows and a batch's pending ones read alike."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from millpond.services.worker.state.store import PartitionStore
from millpond.services.worker.table_joining import TableJoinTask
from millpond.services.worker.task import BadRecord
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import WorkerSettings
from millpond.shared.sql.parser import parse_statement

TABLES = [
    "CREATE TABLE a (id VARCHAR PRIMARY KEY, x INT) WITH (kafka_topic='a', partitions=1, value_format='json')",
    "CREATE TABLE b (id VARCHAR PRIMARY KEY, y VARCHAR) WITH (kafka_topic='b', partitions=1, value_format='delimited')",
    "CREATE TABLE c (id VARCHAR PRIMARY KEY, z INT) WITH (kafka_topic='c', partitions=1, value_format='json')",
]
JOIN = ("CREATE TABLE abc AS SELECT b.id, a.x, b.y, c.z, a.x + c.z AS total FROM a RIGHT JOIN b ON a.id = b.id "
        "FULL OUTER JOIN c ON c.id = a.id WHERE c.z IS NULL OR c.z <> 13")


def _task(tmp_path: Path) -> TableJoinTask:
    meta = Metastore()
    for offset, sql in enumerate([*TABLES, JOIN]):
        meta.apply(parse_statement(sql), offset)
    query = next(q for q in meta.queries.values() if q.sink == "ABC")
    stage = "join"
    task = TableJoinTask(WorkerSettings(worker_id="w", state_dir=tmp_path), query, meta.source("A"),
                         meta.source("ABC"), 0, stage)
    task.store = PartitionStore(tmp_path / "store")
    return task


def _reference(rows: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    a, b, c = (side.get(key) for side in rows)
    present = b is not None  # a RIGHT JOIN b: b's keys
    present = present or c is not None  # FULL OUTER JOIN c
    if not present or (c is not None and c == 13):
        return None
    total = None if a is None or c is None else a + c
    return {"X": a, "Y": b, "Z": c, "TOTAL": total}


def test_each_change_gives_the_join_of_the_keys_latest_rows(tmp_path: Path) -> None:
    task = _task(tmp_path)
    rng = random.Random(5)
    rows: list[dict[str, Any]] = [{}, {}, {}]
    overlay: dict[bytes, list[Any] | None] = {}
    encode = [lambda v: json.dumps({"X": v}), lambda v: v, lambda v: json.dumps({"Z": v})]
    for offset in range(600):
        side, key = rng.randrange(3), f"k{rng.randrange(6)}"
        value = None if rng.random() < 0.25 else (f"y{offset}" if side == 1 else rng.choice([1, 2, 13, offset]))
        rows[side][key] = value
        bad: list[BadRecord] = []
        task._apply(bytes([side]) + key.encode(), None if value is None else encode[side](value), overlay,
                    (bad, offset))
        result = task._result(key.encode(), overlay, offset, bad)
        assert bad == []
        assert (None if result is None else json.loads(result)) == _reference(rows, key), (offset, key, rows)
        if rng.random() < 0.1:  # a committed batch: its rows move to the store
            task._write(overlay, offset + 1)
            overlay = {}


def test_a_value_that_does_not_decode_changes_nothing_and_is_logged(tmp_path: Path) -> None:
    task = _task(tmp_path)
    overlay: dict[bytes, list[Any] | None] = {}
    bad: list[BadRecord] = []
    task._apply(b"\x01k", "site", overlay, (bad, 0))
    task._apply(b"\x02k", json.dumps({"Z": 4}), overlay, (bad, 1))
    task._apply(b"\x02k", "{not json", overlay, (bad, 2))
    assert [(b.offset, b.value) for b in bad] == [(2, "{not json")]
    assert "C's value is not JSON" in bad[0].reason
    result = task._result(b"k", overlay, 2, bad)
    assert result is not None and json.loads(result) == {"X": None, "Y": "site", "Z": 4, "TOTAL": None}
