"""The join stages' rules, without Kafka. A table-table join: after each record of any side,
the key's result is the join of that key's latest rows of every side (chained left to right
by each JOIN's type), or none; stored rows and a batch's pending ones read alike. A
foreign-key join: after each record, the results written so far, as a table, are the join of
both tables' latest rows. A stream-stream join: what a brute-force reference gives for the
same records in the same order."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import struct
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import RecordMetadata

from millpond.services.worker.joining import VALUES_STORED, JoinTask, TableRecord, rebuilt_if_old
from millpond.services.worker.state.store import INPUT_OFFSET, PartitionStore
from millpond.services.worker.stream_joining import StreamJoinTask
from millpond.services.worker.table_joining import ForeignKeyJoinTask, JoinSideTask, KeyedSlice, TableJoinTask, rekeyed
from millpond.services.worker.task import BadRecord
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.queries import PersistentQuery
from millpond.shared.catalog.topology import stages
from millpond.shared.config import WorkerSettings
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.kafka.serde import deserialize_key, serialize_key
from millpond.shared.sql.ast import SqlType
from tests.metastores import applied
from tests.stream_join_reference import expected_stream_join

TABLES = [
    "CREATE TABLE a (id VARCHAR PRIMARY KEY, x INT) WITH (kafka_topic='a', partitions=1, value_format='json')",
    "CREATE TABLE b (id VARCHAR PRIMARY KEY, y VARCHAR) WITH (kafka_topic='b', partitions=1, value_format='delimited')",
    "CREATE TABLE c (id VARCHAR PRIMARY KEY, z INT) WITH (kafka_topic='c', partitions=1, value_format='json')",
]
JOIN = ("CREATE TABLE abc AS SELECT b.id, a.x, b.y, c.z, a.x + c.z AS total FROM a RIGHT JOIN b ON a.id = b.id "
        "FULL OUTER JOIN c ON c.id = a.id WHERE c.z IS NULL OR c.z <> 13")


def _planned(sink: str, *statements: str) -> tuple[Metastore, PersistentQuery]:
    """A metastore that ran ``statements``, and the query that writes ``sink``."""
    meta = applied(statements)
    return meta, next(q for q in meta.queries.values() if q.sink == sink)


def _task(tmp_path: Path) -> TableJoinTask:
    meta, query = _planned("ABC", *TABLES, JOIN)
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
        task._apply(bytes([side]) + key.encode(), None if value is None else encode[side](value).encode(), overlay,
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
    task._apply(b"\x01k", b"site", overlay, (bad, 0))
    task._apply(b"\x02k", json.dumps({"Z": 4}).encode(), overlay, (bad, 1))
    task._apply(b"\x02k", b"{not json", overlay, (bad, 2))
    task._apply(b"\x02\xff\xfe", b'{"Z": 5}', overlay, (bad, 3))  # a key that is not UTF-8 text
    assert [(b.offset, b.value) for b in bad] == [(2, "{not json"), (3, '{"Z": 5}')]
    assert "C's value is not JSON" in bad[0].reason and "C's key is not KAFKA VARCHAR" in bad[1].reason
    assert b"\x02\xff\xfe" not in overlay
    result = task._result(b"k", overlay, 2, bad)
    assert result is not None and json.loads(result) == {"X": None, "Y": "site", "Z": 4, "TOTAL": None}


FK_TABLES = [
    "CREATE TABLE items (id INT PRIMARY KEY, site VARCHAR, x INT) WITH (kafka_topic='i', partitions=1, value_format='json')",
    "CREATE TABLE sites (id VARCHAR PRIMARY KEY, y INT) WITH (kafka_topic='s', partitions=3, value_format='json')",
]


def _fk_task(tmp_path: Path, kind: str) -> ForeignKeyJoinTask:
    join = (f"CREATE TABLE joined AS SELECT i.id, i.x, s.y, s.id AS sid FROM items i {kind} JOIN sites s "
            "ON i.site = s.id WHERE s.y IS NULL OR s.y <> 13")
    meta, query = _planned("JOINED", *FK_TABLES, join)
    task = ForeignKeyJoinTask(WorkerSettings(worker_id="w", state_dir=tmp_path), query, meta.source("ITEMS"),
                              meta.source("JOINED"), 0, "join")
    task.store = PartitionStore(tmp_path / "store")
    return task


def _fk_reference(items: dict[int, tuple[str | None, int]], sites: dict[str, int], inner: bool) -> dict[int, Any]:
    """Each item joined with the site its SITE names, as the query above."""
    out: dict[int, Any] = {}
    for key, (site, x) in items.items():
        y = None if site is None else sites.get(site)
        if (y is None and inner) or y == 13:
            continue
        out[key] = {"X": x, "Y": y, "SID": None if y is None else site}
    return out


@pytest.mark.parametrize("kind", ["INNER", "LEFT"])
def test_a_foreign_key_join_keeps_every_left_row_joined_with_the_row_it_names(tmp_path: Path, kind: str) -> None:
    """Random changes of both tables (a left row's foreign key changing, set to NULL, naming a
    missing right key; right rows replaced and deleted; values that do not decode), batches
    committed at random points: the results written so far, as a table, are the reference."""
    task = _fk_task(tmp_path, kind)
    rng = random.Random(11 if kind == "INNER" else 12)
    items: dict[int, tuple[str | None, int]] = {}
    sites: dict[str, int] = {}
    sink: dict[int, Any] = {}
    overlay: dict[bytes, list[Any] | None] = {}
    int_key = SqlType("INT")
    for offset in range(800):
        bad: list[BadRecord] = []
        broken = rng.random() < 0.03  # a value that does not decode: changes nothing, logged
        deleted = rng.random() < 0.2
        if rng.random() < 0.5:
            key, site = rng.randrange(8), rng.choice([None, "s0", "s1", "s2", "s3", "s4"])
            record = (b"\0" + serialize_key(key, int_key), json.dumps({"SITE": site, "X": offset}).encode())
            if deleted and not broken:
                items.pop(key, None)
            elif not broken:
                items[key] = (site, offset)
        else:
            site, y = f"s{rng.randrange(5)}", rng.choice([1, 2, 13, offset])
            record = (b"\1" + site.encode(), json.dumps({"Y": y}).encode())
            if deleted and not broken:
                sites.pop(site, None)
            elif not broken:
                sites[site] = y
        side_key, value = record[0], b"{oops" if broken else None if deleted else record[1]
        changed = task._apply(side_key, value, overlay, (bad, offset))
        if side_key[0] == 1 and not broken:  # a right row joins again exactly the left rows that name it
            assert [deserialize_key(k, int_key) for k in changed] == sorted(
                k for k, (named, _) in items.items() if named == side_key[1:].decode())
        for key_bytes in changed:
            result = task._result(key_bytes, overlay, offset, bad)
            key = deserialize_key(key_bytes, int_key)
            if result is None:
                sink.pop(key, None)
            else:
                sink[key] = json.loads(result)
        assert len(bad) == broken
        assert sink == _fk_reference(items, sites, kind == "INNER"), (offset, items, sites)
        if rng.random() < 0.1:  # a committed batch: its rows and index entries move to the store
            task._write(overlay, offset + 1)
            overlay = {}
            task.by_foreign.clear()


STREAMS = [
    "CREATE STREAM l (k VARCHAR KEY, x INT) WITH (kafka_topic='l', partitions=1, value_format='json')",
    "CREATE STREAM r (k VARCHAR KEY, y INT) WITH (kafka_topic='r', partitions=1, value_format='json')",
]


def _stream_task(tmp_path: Path, kind: str, within: str) -> StreamJoinTask:
    join = f"CREATE STREAM lr AS SELECT l.k, l.x, r.y FROM l {kind} JOIN r WITHIN {within} ON l.k = r.k"
    meta, query = _planned("LR", *STREAMS, join)
    return StreamJoinTask(WorkerSettings(worker_id="w", state_dir=tmp_path), query, meta.source("L"),
                          meta.source("LR"), 0)


@pytest.mark.parametrize("kind", ["INNER", "LEFT", "RIGHT", "FULL OUTER"])
@pytest.mark.parametrize("seed", range(4))
def test_a_stream_join_matches_the_brute_force_reference(tmp_path: Path, kind: str, seed: int) -> None:
    """Random records of both sides, out of order within and beyond the grace period, in
    batches cut anywhere (buffers expire between batches)."""
    before, after, grace = 3_000, 5_000, 2_000
    task = _stream_task(tmp_path, kind, "(3 SECONDS, 5 SECONDS) GRACE PERIOD 2 SECONDS")
    rng = random.Random(seed)
    records = []
    now = 0
    for _ in range(300):
        now += rng.randrange(0, 800)
        records.append((rng.randrange(2), f"k{rng.randrange(4)}", rng.randrange(1000), now - rng.randrange(0, 6_000)))
    got = []
    offset = 0
    while offset < len(records):
        cut = offset + rng.randrange(1, 40)
        results: list[tuple[bytes, bytes, int]] = []
        for o in range(offset, min(cut, len(records))):
            side, key, value, time = records[o]
            task._process(bytes([side]) + key.encode(), json.dumps({"XY"[side]: value}).encode(), time, o, results, [])
        task._expire()
        got += [(k.decode(), json.loads(v)["X"], json.loads(v)["Y"], t) for k, v, t in results]
        offset = cut
    want = expected_stream_join(records, before, after, grace, kind.split()[0])
    assert any(left is None or right is None for _, left, right, _ in want) == (kind != "INNER")
    assert sorted(got, key=repr) == want


@pytest.mark.parametrize("kind", ["INNER", "FULL OUTER"])
def test_streams_joined_on_other_columns_match_the_reference_and_keep_their_own_keys(tmp_path: Path,
                                                                                     kind: str) -> None:
    """Both streams re-keyed by a value column (the left one has a KEY, the right one none):
    the same results as the reference over the join column, each side's KEY column its own."""
    meta, query = _planned("LR",
        "CREATE STREAM l (id VARCHAR KEY, g VARCHAR, x INT) WITH (kafka_topic='l', partitions=1, value_format='json')",
        "CREATE STREAM r (g VARCHAR, y INT) WITH (kafka_topic='r', partitions=1, value_format='json')",
        f"CREATE STREAM lr AS SELECT l.g, l.id, l.x, r.y FROM l {kind} JOIN r WITHIN 2 SECONDS "
        "GRACE PERIOD 1 SECOND ON l.g = r.g")
    assert query.plan.key_expression == "`G`" and query.plan.join is not None
    assert query.plan.join.tables[0].rekey == "`G`"
    task = StreamJoinTask(WorkerSettings(worker_id="w", state_dir=tmp_path), query, meta.source("L"),
                          meta.source("LR"), 0)
    rng = random.Random(3)
    records, now = [], 0
    for value in range(200):
        now += rng.randrange(0, 600)
        records.append((rng.randrange(2), f"g{rng.randrange(3)}", value, now - rng.randrange(0, 3_000)))
    results: list[tuple[bytes, bytes, int]] = []
    for offset, (side, group, value, time) in enumerate(records):
        own = f"id{value}".encode() if side == 0 else None
        payload = {"G": group, "XY"[side]: value}
        task._process(bytes([side]) + rekeyed(group.encode(), own), json.dumps(payload).encode(), time, offset,
                      results, [])
    got = []
    for key, value, time in results:
        row = json.loads(value)
        assert row["ID"] == (None if row["X"] is None else f"id{row['X']}"), row
        got.append((key.decode(), row["X"], row["Y"], time))
    want = expected_stream_join(records, 2_000, 2_000, 1_000, kind.split()[0])
    assert len(want) > 20 and sorted(got, key=repr) == want


def _joined(results: list[tuple[bytes, bytes, int]]) -> list[tuple[bytes, dict[str, Any], int]]:
    return [(k, json.loads(v), t) for k, v, t in results]


def test_an_unmatched_record_is_emitted_once_stream_time_passes_its_window_and_grace(tmp_path: Path) -> None:
    task = _stream_task(tmp_path, "LEFT", "(3 SECONDS, 5 SECONDS) GRACE PERIOD 2 SECONDS")
    results: list[tuple[bytes, bytes, int]] = []
    task._process(b"\x00a", b'{"X": 1}', 0, 0, results, [])
    task._process(b"\x01b", b'{"Y": 2}', 7_000, 1, results, [])  # 0 + 5 s after + 2 s grace: still open
    assert results == []
    assert task._process(b"\x01a", b'{"Y": 3}', 5_000, 2, results, [])  # 2 s behind, in a's window
    assert task._process(b"\x00c", b'{"X": 4}', 7_001, 3, results, [])  # a's window closes, but a has joined
    task._process(b"\x01b", b'{"Y": 6}', 14_001, 5, results, [])  # 7,001 + 5 s + 2 s: c's window still open
    assert _joined(results) == [(b"a", {"X": 1, "Y": 3}, 5_000)]
    task._process(b"\x01b", b'{"Y": 7}', 14_002, 6, results, [])  # closed: c alone
    assert _joined(results[1:]) == [(b"c", {"X": 4, "Y": None}, 7_001)]
    task._process(b"\x00d", b'{"X": 8}', 8_000, 7, results, [])  # its window closed before it came: alone at once
    assert _joined(results[2:]) == [(b"d", {"X": 8, "Y": None}, 8_000)]


def test_a_record_behind_stream_time_by_more_than_the_grace_joins_what_is_kept(tmp_path: Path) -> None:
    """Records are kept for the window's span plus the grace (10 s here) behind their side's
    largest time, as Kafka Streams' join store of each side keeps them: a record more than the
    grace behind stream time still joins, and one past the retention is late (not kept) but
    joins what is kept all the same."""
    task = _stream_task(tmp_path, "INNER", "(3 SECONDS, 5 SECONDS) GRACE PERIOD 2 SECONDS")
    assert task.retention == 10_000
    results: list[tuple[bytes, bytes, int]] = []
    assert task._process(b"\x00a", b'{"X": 1}', 1_000, 0, results, [])
    assert task._process(b"\x00c", b'{"X": 2}', 5_000, 1, results, [])
    assert task._process(b"\x00q", b'{"X": 0}', 9_000, 2, results, [])
    assert task._process(b"\x01a", b'{"Y": 3}', 4_000, 3, results, [])  # 5 s behind stream time, in a's window
    assert _joined(results) == [(b"a", {"X": 1, "Y": 3}, 4_000)]
    assert task._process(b"\x00z", b'{"X": 0}', 14_000, 4, results, [])  # left records before 4 s are let go
    assert task._process(b"\x01a", b'{"Y": 4}', 5_000, 5, results, [])  # in a's window, but a is let go
    assert task._process(b"\x01c", b'{"Y": 5}', 3_999, 6, results, [])  # kept: the right side is at 5 s
    assert task._process(b"\x01y", b'{"Y": 0}', 14_000, 7, results, [])  # now at 14 s
    assert not task._process(b"\x01c", b'{"Y": 6}', 3_999, 8, results, [])  # late: joins c, is not kept ...
    assert not task._process(b"\x00c", b'{"X": 7}', 3_500, 9, results, [])  # ... nor is the first now: nothing
    assert _joined(results[1:]) == [(b"c", {"X": 2, "Y": 5}, 5_000), (b"c", {"X": 2, "Y": 6}, 5_000)]


def test_without_a_grace_period_an_unmatched_record_is_emitted_at_once(tmp_path: Path) -> None:
    """ksqlDB's legacy stream-stream join (no GRACE PERIOD): a LEFT join's left record that
    joins nothing when it comes is emitted with NULLs then, and a later right record joins it."""
    task = _stream_task(tmp_path, "LEFT", "5 SECONDS")
    assert task.eager and task.retention == 10_000 + 24 * 3_600_000
    results: list[tuple[bytes, bytes, int]] = []
    task._process(b"\x00a", b'{"X": 1}', 1_000, 0, results, [])
    task._process(b"\x01b", b'{"Y": 2}', 1_000, 1, results, [])  # a right record alone is not emitted
    task._process(b"\x01a", b'{"Y": 3}', 3_000, 2, results, [])
    assert _joined(results) == [(b"a", {"X": 1, "Y": None}, 1_000), (b"a", {"X": 1, "Y": 3}, 3_000)]


@pytest.mark.parametrize("kind", ["INNER", "LEFT", "FULL OUTER"])
@pytest.mark.parametrize("seed", range(3))
def test_a_stream_joined_after_a_stream_join_matches_the_reference_over_its_rows(tmp_path: Path, kind: str,
                                                                                 seed: int) -> None:
    """``l LEFT JOIN r WITHIN ... JOIN q WITHIN ...``: the first stage's rows (its outer ones
    written only once their window closed, far behind its stream time), copied beside q's
    records as they come, join q as a two-stream join would (the brute force reference over
    those rows, the left ones late only past that lag), each side's columns and the left
    record's ROWTIME kept."""
    meta, query = _planned("LRQ", *STREAMS,
        "CREATE STREAM q (k VARCHAR KEY, z INT) WITH (kafka_topic='q', partitions=1, value_format='json')",
        f"CREATE STREAM lrq AS SELECT l.k, l.x, r.y, q.z, l.ROWTIME AS lt FROM l LEFT JOIN r WITHIN 2 SECONDS "
        f"GRACE PERIOD 1 SECOND ON l.k = r.k {kind} JOIN q WITHIN (1 SECOND, 3 SECONDS) GRACE PERIOD 500 MILLISECONDS "
        "ON l.k = q.k")
    steps = {s.name: s for s in stages(query, meta.source("L"), meta.source("LRQ"), "svc")}
    assert list(steps) == ["side-0", "side-1", "join-0", "side-1-0", "side-1-1", ""]
    assert steps["side-1-0"].query.plan.event_time == "`_INPUT_ROWTIME`"
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)
    first, second = (StreamJoinTask(settings, steps[n].query, steps[n].source, steps[n].sink, 0, n)
                     for n in ("join-0", ""))
    assert (first.behind, second.behind) == (0, 2 * 2_000 + 1_000)
    rng = random.Random(seed)
    now, lefts = 0, {}
    # The first stage's rows, each with the stage's stream time when it wrote it: when it reaches the next stage.
    chained: list[tuple[bytes, bytes, int, int]] = []
    for offset in range(300):
        now += rng.randrange(0, 500)
        side, key, value, time = rng.randrange(2), f"k{rng.randrange(3)}", offset, now - rng.randrange(0, 1_500)
        if side == 0:
            lefts[value] = time
        written: list[tuple[bytes, bytes, int]] = []
        first._process(bytes([side]) + key.encode(), json.dumps({"XY"[side]: value}).encode(), time, offset,
                       written, [])
        chained += [(k, v, t, first.join_state.stream_time or 0) for k, v, t in written]
    assert any(json.loads(v)["R_Y"] is None for _, v, _, _ in chained), "the first stage wrote no outer row"
    rows = []
    for key, value, time, written_at in chained:
        row = json.loads(value)
        assert row["_INPUT_ROWTIME"] == time and row["L_ROWTIME"] == lefts[row["L_X"]]
        rows.append(((0, key.decode(), (row["L_X"], row["R_Y"]), time), written_at, value))
    rights = [((1, f"k{rng.randrange(3)}", 1_000 + i, t), t, json.dumps({"Z": 1_000 + i}).encode())
              for i, t in enumerate(rng.randrange(0, now) for _ in range(200))]
    # As they come: by when they were written, some out of order.
    arrivals = sorted(rows + rights, key=lambda r: r[1] + rng.randrange(0, 1_000))
    got: list[tuple[str, Any, Any, int]] = []
    results: list[tuple[bytes, bytes, int]] = []
    for offset, ((side, key, _, time), _, payload) in enumerate(arrivals):
        second._process(bytes([side]) + key.encode(), payload, time, offset, results, [])
        if offset % 50 == 0:
            second._expire()
    for result_key, result, result_time in results:
        out = json.loads(result)
        assert out["LT"] == (None if out["X"] is None else lefts[out["X"]])
        got.append((result_key.decode(), None if out["X"] is None else (out["X"], out["Y"]), out["Z"], result_time))
    want = expected_stream_join([record for record, _, _ in arrivals], 1_000, 3_000, 500, kind.split()[0],
                                behind=5_000)
    assert len(want) > 10 and sorted(got, key=repr) == sorted(want, key=repr)
    # Without the allowance the first stage's outer rows would be late here.
    assert any(right is None or left[1] is None for _, left, right, _ in want if left is not None) or kind == "INNER"


def test_a_stream_joined_after_a_table_joins_the_rows_with_the_stream_records_time(tmp_path: Path) -> None:
    """``l JOIN t ... JOIN q WITHIN ...``: the stream-table stage writes each joined row keyed
    by q's join column with the stream record's time beside the row's; the stream-stream
    stage joins those rows with q, its ROWTIME the left record's."""
    meta, query = _planned("LTQ", STREAMS[0],
        "CREATE TABLE t (k VARCHAR PRIMARY KEY, w INT) WITH (kafka_topic='t', partitions=1, value_format='json')",
        "CREATE STREAM q (qid VARCHAR KEY, lk VARCHAR, z INT) WITH (kafka_topic='q', partitions=1, value_format='json')",
        "CREATE STREAM ltq AS SELECT l.k, l.x, t.w, q.z, l.ROWTIME AS lt FROM l LEFT JOIN t ON l.k = t.k "
        "JOIN q WITHIN 1 SECOND ON l.k = q.lk")
    steps = {s.name: s for s in stages(query, meta.source("L"), meta.source("LTQ"), "svc")}
    assert list(steps) == ["join-0", "side-1-0", "side-1-1", ""]
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)
    first = JoinTask(settings, steps["join-0"].query, steps["join-0"].source, steps["join-0"].sink, 0, "join-0")
    bad: list[BadRecord] = []
    written = first.output.keyed(first._joined_row(b"a", 5_000, ["a", 7], [[3]]), b"a", 5_000, 0, bad)
    assert written is not None and not bad
    assert written == (b"a", json.dumps({"L_K": "a", "L_X": 7, "L_ROWTIME": 5_000, "T_K": "a", "T_W": 3,
                                         "_INPUT_ROWTIME": 5_000}, separators=(",", ":")).encode())
    second = StreamJoinTask(settings, steps[""].query, steps[""].source, steps[""].sink, 0, "")
    results: list[tuple[bytes, bytes, int]] = []
    second._process(b"\x00a", written[1], 5_000, 0, results, [])
    second._process(b"\x01" + rekeyed(b"a", b"q1"), b'{"LK": "a", "Z": 9}', 5_600, 1, results, [])
    assert [(k, json.loads(v), t) for k, v, t in results] == [(b"a", {"X": 7, "W": 3, "Z": 9, "LT": 5_000}, 5_600)]


def test_a_stream_stage_before_the_last_writes_its_rows_keyed_by_the_next_expression(tmp_path: Path) -> None:
    """``l JOIN r WITHIN .. LEFT JOIN q WITHIN .. LEFT JOIN t ON l.x = t.id``: the second
    stream's stage writes each row (its outer ones too) keyed by the table's key type, every
    column so far with the left record's ROWTIME, for the table's stage."""
    meta, query = _planned("LRQT", *STREAMS,
        "CREATE STREAM q (k VARCHAR KEY, z INT) WITH (kafka_topic='q', partitions=1, value_format='json')",
        "CREATE TABLE t (id INT PRIMARY KEY, w INT) WITH (kafka_topic='t', partitions=1, value_format='json')",
        "CREATE STREAM lrqt AS SELECT t.id, r.y, q.z, t.w FROM l JOIN r WITHIN 1 SECOND ON l.k = r.k "
        "LEFT JOIN q WITHIN 1 SECOND GRACE PERIOD 0 SECONDS ON l.k = q.k LEFT JOIN t ON l.x = t.id")
    steps = {s.name: s for s in stages(query, meta.source("L"), meta.source("LRQT"), "svc")}
    assert list(steps) == ["side-0", "side-1", "join-0", "side-1-0", "side-1-1", "join-1", ""]
    stage = steps["join-1"]
    task = StreamJoinTask(WorkerSettings(worker_id="w", state_dir=tmp_path), stage.query, stage.source, stage.sink, 0,
                          "join-1")
    pair = {"L_K": "a", "L_X": 7, "L_ROWTIME": 900, "R_K": "a", "R_Y": 2, "_INPUT_ROWTIME": 1_000}
    results: list[tuple[bytes, bytes, int]] = []
    task._process(b"\x00a", json.dumps(pair).encode(), 1_000, 0, results, [])
    task._process(b"\x01a", b'{"Z": 5}', 1_500, 1, results, [])
    task._process(b"\x01c", b'{"Z": 6}', 3_001, 2, results, [])  # a's window (1 s, grace 0) is past: nothing more
    task._process(b"\x00b", json.dumps({**pair, "L_K": "b", "L_X": 8, "_INPUT_ROWTIME": 4_000}).encode(), 4_000, 3,
                  results, [])
    task._process(b"\x01c", b'{"Z": 9}', 6_000, 4, results, [])  # b's window closes: b alone, with NULLs for q
    assert [(deserialize_key(k, SqlType("INT")), json.loads(v), t) for k, v, t in results] == [
        (7, {**pair, "Q_K": "a", "Q_Z": 5, "_INPUT_ROWTIME": 1_500}, 1_500),
        (8, {**pair, "L_K": "b", "L_X": 8, "Q_K": None, "Q_Z": None, "_INPUT_ROWTIME": 4_000}, 4_000)]


def test_a_stream_stage_keys_its_rows_by_a_next_expression_of_a_function_typed_in_python(tmp_path: Path) -> None:
    """The next JOIN's expression is evaluated in Python typed as Spark types it: TO_JSON_STRING,
    whose Python form takes its argument's type (``Call.arg_types``), keys each row (without
    the type, every row failed and went to the processing log)."""
    meta, query = _planned("LRT", *STREAMS,
        "CREATE TABLE t (id VARCHAR PRIMARY KEY, w INT) WITH (kafka_topic='t', partitions=1, value_format='json')",
        "CREATE STREAM lrt AS SELECT t.id, r.y, t.w FROM l JOIN r WITHIN 1 SECOND ON l.k = r.k "
        "LEFT JOIN t ON TO_JSON_STRING(STRUCT(x := l.x)) = t.id")
    stage = {s.name: s for s in stages(query, meta.source("L"), meta.source("LRT"), "svc")}["join-0"]
    task = StreamJoinTask(WorkerSettings(worker_id="w", state_dir=tmp_path), stage.query, stage.source, stage.sink, 0,
                          "join-0")
    results: list[tuple[bytes, bytes, int]] = []
    bad: list[Any] = []
    task._process(b"\x00a", b'{"X": 7}', 1_000, 0, results, bad)
    task._process(b"\x01a", b'{"Y": 2}', 1_200, 1, results, bad)
    assert bad == [] and [deserialize_key(k, SqlType("VARCHAR")) for k, _, _ in results] == ['{"X":7}']


def test_a_foreign_key_the_right_key_cannot_hold_changes_nothing_and_is_logged(tmp_path: Path) -> None:
    meta, query = _planned("AB",
        "CREATE TABLE a (id VARCHAR PRIMARY KEY, b_id BIGINT) WITH (kafka_topic='a', partitions=2, value_format='json')",
        "CREATE TABLE b (id BIGINT PRIMARY KEY, y INT) WITH (kafka_topic='b', partitions=2, value_format='json')",
        "CREATE TABLE ab AS SELECT a.id, b.y FROM a LEFT JOIN b ON a.b_id = b.id")
    task = ForeignKeyJoinTask(WorkerSettings(worker_id="w", state_dir=tmp_path), query, meta.source("A"),
                              meta.source("AB"), 1, "join")
    task.store = PartitionStore(tmp_path / "store")
    overlay: dict[bytes, list[Any] | None] = {}
    bad: list[BadRecord] = []
    assert task._apply(b"\0k", b'{"B_ID": 5}', overlay, (bad, 0)) == [b"k"]
    assert task._apply(b"\0k", b'{"B_ID": 99999999999999999999}', overlay, (bad, 1)) == []
    # Beyond BIGINT, the value does not decode (as Spark's JSON reader finds it corrupt): logged before the key is made.
    assert [(b.offset, b.reason.split(":")[0]) for b in bad] == [(1, "A's column B_ID is BIGINT")]
    assert task._apply(b"\1" + struct.pack(">q", 5), b'{"Y": 2}', overlay, (bad, 2)) == [b"k"]  # still names 5
    assert task._apply(b"\1" + struct.pack(">q", 6), b"{oops", overlay, (bad, 3)) == []
    assert len(bad) == 1  # a right record is logged by partition 0's task only
    result = task._result(b"k", overlay, 2, bad)
    assert result is not None and json.loads(result) == {"Y": 2}


class _Producer:
    """What a task's commit asks of its producer, with every send kept."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, int]] = []

    @contextlib.asynccontextmanager
    async def transaction(self) -> Any:
        yield

    async def send(self, topic: str, value: bytes | None, key: bytes, partition: int, **_: Any) -> Any:
        self.sent.append((topic, key, partition))
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        offset = sum(1 for sent in self.sent if sent[0] == topic and sent[2] == partition) - 1
        future.set_result(RecordMetadata(topic, partition, TopicPartition(topic, partition), offset, -1, -1, -1))
        return future

    async def flush(self) -> None:
        return None

    async def send_offsets_to_transaction(self, *_: Any) -> None:
        return None


def test_where_one_stream_is_rekeyed_each_side_sends_a_record_to_its_join_keys_partition(tmp_path: Path) -> None:
    meta, query = _planned("AC",
        "CREATE STREAM a (id VARCHAR KEY, x INT) WITH (kafka_topic='a', partitions=4, value_format='json')",
        "CREATE STREAM c (k VARCHAR KEY, ref VARCHAR) WITH (kafka_topic='c', partitions=4, value_format='json')",
        "CREATE STREAM ac AS SELECT a.id, a.x, c.k FROM a JOIN c WITHIN 1 SECOND ON a.id = c.ref")
    side_a, side_c, _ = stages(query, meta.source("A"), meta.source("AC"), "svc")
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)
    # Partition 3 of each stream holds keys another partitioner put there: both go by the join key.
    left = JoinSideTask(settings, side_a.query, side_a.source, side_a.sink, 3, side_a.name)
    right = JoinSideTask(settings, side_c.query, side_c.source, side_c.sink, 3, side_c.name)
    sent = []
    for task, key in ((left, b"s1"), (right, rekeyed(b"s2", b"c9"))):
        task.producer = _Producer()  # type: ignore[assignment]
        assert asyncio.run(task.commit(KeyedSlice(0, 0, count=1, records=[(0, key, b"{}", 5)])))
        sent += task.producer.sent  # type: ignore[attr-defined]
    assert sent == [(side_a.sink.topic, b"\0s1", partition_for(b"s1", 4)),
                    (side_c.sink.topic, b"\1" + rekeyed(b"s2", b"c9"), partition_for(b"s2", 4))]


def test_a_group_by_over_tables_joined_writes_every_column_keyed_by_the_join_key(tmp_path: Path) -> None:
    """GROUP BY over a RIGHT, then FULL OUTER join of three tables (each key declared last): the
    join stage writes each key's joined row, every column of every side, the left key NULL
    where the left row is absent, keyed by the join key into the joined rows the aggregation
    regroups (the regroup stage reads those names)."""
    meta, query = _planned(
        "PER_Y",
        "CREATE TABLE a (x INT, id VARCHAR PRIMARY KEY) WITH (kafka_topic='a', partitions=1, value_format='json')",
        "CREATE TABLE b (y VARCHAR, id VARCHAR PRIMARY KEY) WITH (kafka_topic='b', partitions=1, "
        "value_format='delimited')",
        "CREATE TABLE c (z INT, id VARCHAR PRIMARY KEY) WITH (kafka_topic='c', partitions=1, value_format='json')",
        "CREATE TABLE per_y AS SELECT b.y, COUNT(a.id) AS lefts, SUM(c.z) AS z FROM a RIGHT JOIN b ON a.id = b.id "
        "FULL OUTER JOIN c ON c.id = a.id GROUP BY b.y")
    staged = stages(query, meta.source("A"), meta.source("PER_Y"), "svc")
    join, regroup = next(s for s in staged if s.name == "join"), next(s for s in staged if s.name == "regroup")
    assert regroup.source == join.sink
    task = TableJoinTask(WorkerSettings(worker_id="w", state_dir=tmp_path), join.query, join.source, join.sink, 0,
                         join.name)
    task.store = PartitionStore(tmp_path / "store")
    overlay: dict[bytes, list[Any] | None] = {}
    bad: list[BadRecord] = []
    task._apply(b"\x01k", b"yy", overlay, (bad, 0))  # b's row alone: a RIGHT JOIN keeps it
    result = task._result(b"k", overlay, 0, bad)
    assert result is not None and json.loads(result) == {"A_X": None, "A_ID": None, "B_Y": "yy", "B_ID": "k",
                                                         "C_Z": None, "C_ID": None}
    assert [c.name for c in join.sink.value_columns] == ["A_X", "A_ID", "B_Y", "B_ID", "C_Z", "C_ID"]
    task._apply(b"\x00k", json.dumps({"X": 3}).encode(), overlay, (bad, 1))
    result = task._result(b"k", overlay, 1, bad)
    assert result is not None and json.loads(result)["A_ID"] == "k" and bad == []


def test_tables_joined_on_different_keys_pass_every_column_to_the_next_stage(tmp_path: Path) -> None:
    """pages JOIN owners ON a foreign key, LEFT JOIN teams ON the owner's TEAM: the first stage
    writes every column joined so far (no WHERE, no SELECT list), the next joins those rows with
    the team their O_TEAM names, then the WHERE and the SELECT list."""
    meta, query = _planned(
        "PB",
        "CREATE TABLE pages (page VARCHAR PRIMARY KEY, owner VARCHAR, weight INT) "
        "WITH (kafka_topic='pages', partitions=1, value_format='json')",
        "CREATE TABLE owners (name VARCHAR PRIMARY KEY, team VARCHAR) WITH (kafka_topic='owners', partitions=1, "
        "value_format='json')",
        "CREATE TABLE teams (id VARCHAR PRIMARY KEY, boss VARCHAR) WITH (kafka_topic='teams', partitions=1, "
        "value_format='json')",
        "CREATE TABLE pb AS SELECT p.page, p.weight * 2 AS w2, t.boss FROM pages p JOIN owners o ON p.owner = o.name "
        "LEFT JOIN teams t ON o.team = t.id WHERE p.weight > 0")
    staged = {s.name: s for s in stages(query, meta.source("PAGES"), meta.source("PB"), "svc")}
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)
    first, second = (ForeignKeyJoinTask(settings, staged[n].query, staged[n].source, staged[n].sink, 0, n)
                     for n in ("join", "join-1"))
    first.store, second.store = PartitionStore(tmp_path / "first"), PartitionStore(tmp_path / "second")
    bad: list[BadRecord] = []
    overlay: dict[bytes, list[Any] | None] = {}
    first._apply(b"\x00p1", json.dumps({"OWNER": "o1", "WEIGHT": -5}).encode(), overlay, (bad, 0))
    first._apply(b"\x01o1", json.dumps({"TEAM": "t1"}).encode(), overlay, (bad, 1))
    rows = first._result(b"p1", overlay, 1, bad)  # the WHERE is the last stage's: the row goes on
    assert rows is not None and json.loads(rows) == {"P_PAGE": "p1", "P_OWNER": "o1", "P_WEIGHT": -5, "O_NAME": "o1",
                                                     "O_TEAM": "t1"}
    later: dict[bytes, list[Any] | None] = {}
    second._apply(b"\x00p1", rows, later, (bad, 0))
    assert json.loads(second._result(b"p1", later, 0, bad) or b"null") is None  # WEIGHT -5: the WHERE drops it
    second._apply(b"\x00p1", rows.replace(b"-5", b"5"), later, (bad, 1))
    result = second._result(b"p1", later, 1, bad)
    assert result is not None and json.loads(result) == {"W2": 10, "BOSS": None}  # LEFT: no team row yet
    second._apply(b"\x01t1", json.dumps({"BOSS": "b1"}).encode(), later, (bad, 2))
    assert second._left_keys(b"t1", later) == [b"p1"]
    result = second._result(b"p1", later, 2, bad)
    assert result is not None and json.loads(result) == {"W2": 10, "BOSS": "b1"} and bad == []


CHAIN_TABLES = [
    f"CREATE TABLE {name} ({columns}) WITH (kafka_topic='{name}', partitions={partitions}, value_format='json')"
    for name, columns, partitions in (
        ("a", "id VARCHAR PRIMARY KEY, fk VARCHAR, x INT", 2), ("b", "id VARCHAR PRIMARY KEY, fk2 VARCHAR", 3),
        ("c", "id VARCHAR PRIMARY KEY, y VARCHAR", 2), ("d", "id VARCHAR PRIMARY KEY, z INT", 1),
        ("e", "id VARCHAR PRIMARY KEY, w INT", 2))]
CHAIN = ("CREATE TABLE chained AS SELECT e.id, a.x, c.y, b.fk2, e.w, d.z FROM a JOIN c ON a.id = c.id "
         "LEFT JOIN b ON a.fk = b.id RIGHT JOIN e ON a.id = e.id JOIN d ON b.fk2 = d.id WHERE e.w IS NULL OR e.w > 1")


def _chain_reference(tables: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """CHAIN over the tables' rows, left to right as SQL joins them."""
    a, b, c, d, e = (tables[name] for name in "abcde")
    out = {}
    for key, e_row in e.items():  # RIGHT JOIN e: e's keys
        first = a.get(key) if key in c else None  # a JOIN c
        b_row = b.get(first["FK"]) if first is not None and first["FK"] is not None else None
        d_row = d.get(b_row["FK2"]) if b_row is not None and b_row["FK2"] is not None else None
        if d_row is None or not (e_row["W"] is None or e_row["W"] > 1):
            continue
        out[key] = {"X": None if first is None else first["X"], "Y": c[key]["Y"] if first is not None else None,
                    "FK2": b_row["FK2"] if b_row is not None else None, "W": e_row["W"], "Z": d_row["Z"]}
    return out


def test_a_chain_of_table_joins_on_several_keys_follows_every_table(tmp_path: Path) -> None:
    """a JOIN c on the key, LEFT JOIN b on a foreign key, RIGHT JOIN e on the first key again,
    JOIN d on a foreign key of b: four stages, each later one's left side the rows the one before
    wrote. Random changes of the five tables, each carried through the real join tasks stage
    by stage (a batch each, committed to the store), equal the join of the tables' rows."""
    meta, query = _planned("CHAINED", *CHAIN_TABLES, CHAIN)
    staged = stages(query, meta.source("A"), meta.source("CHAINED"), "svc")
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)
    joins = [TableJoinTask(settings, s.query, s.source, s.sink, 0, s.name)
             if s.query.plan.kind.name == "TABLE_TABLE_JOIN" else
             ForeignKeyJoinTask(settings, s.query, s.source, s.sink, 0, s.name)
             for s in staged if s.name.startswith("join")]
    assert [j.stage for j in joins] == ["join", "join-1", "join-2", "join-3"]
    for join in joins:
        join.store = PartitionStore(tmp_path / join.stage)
    # Where each table's records enter: (join stage, side byte).
    entry = {s.source.name: (0 if s.name.count("-") == 1 else int(s.name.split("-")[1]), int(s.name.split("-")[-1]))
             for s in staged if s.name.startswith("side") and s.source.name in "ABCDE"}
    sink: dict[str, Any] = {}
    bad: list[BadRecord] = []

    def feed(stage: int, key: bytes, value: bytes | None, offset: int) -> None:
        join, overlay = joins[stage], {}
        changed = {k: join._result(k, overlay, offset, bad) for k in join._apply(key, value, overlay, (bad, offset))}
        join._write(overlay, offset + 1)
        for changed_key, result in changed.items():
            if stage + 1 < len(joins):
                feed(stage + 1, b"\0" + changed_key, result, offset)
            elif result is None:
                sink.pop(changed_key.decode(), None)
            else:
                sink[changed_key.decode()] = json.loads(result)

    rng = random.Random(23)
    tables: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in "abcde"}
    values = {"a": lambda: {"FK": rng.choice(["f1", "f2", None]), "X": rng.randrange(5)},
              "b": lambda: {"FK2": rng.choice(["g1", "g2", None])}, "c": lambda: {"Y": rng.choice("xyz")},
              "d": lambda: {"Z": rng.randrange(9)}, "e": lambda: {"W": rng.choice([None, 0, 1, 2, 3])}}
    seen = 0
    for offset in range(3_000):
        name = rng.choice("abcde")
        key = rng.choice({"b": ["f1", "f2", "f3"], "d": ["g1", "g2"]}.get(name, ["k1", "k2", "k3", "k4"]))
        value = None if rng.random() < 0.2 else values[name]()
        if value is None:
            tables[name].pop(key, None)
        else:
            tables[name][key] = value
        stage, side = entry[name.upper()]
        feed(stage, bytes([side]) + key.encode(), None if value is None else json.dumps(value).encode(), offset)
        assert sink == _chain_reference(tables), (offset, name, key, value)
        seen = max(seen, len(sink))
    assert seen >= 3 and bad == []


def test_a_chain_stage_before_the_last_keeps_its_rows_in_its_partition(tmp_path: Path) -> None:
    """The rows a chain's stage writes for the next stay in its own partition, the first
    table's, whatever partition murmur2 of their key would pick (the next stage's tables are
    co-partitioned with the first, not necessarily by murmur2); the last stage's result goes
    to its key's murmur2 partition, where pulls look."""
    meta, query = _planned("CHAINED", *CHAIN_TABLES, CHAIN)
    staged = {s.name: s for s in stages(query, meta.source("A"), meta.source("CHAINED"), "svc")}
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)
    key = next(k for k in (f"k{i}".encode() for i in range(50)) if partition_for(k, 2) == 0)
    for name, partition, expected in (("join", 1, 1), ("join-3", 1, 0)):
        stage = staged[name]
        task = (TableJoinTask if name == "join" else ForeignKeyJoinTask)(settings, stage.query, stage.source,
                                                                         stage.sink, partition, stage.name)
        task.store = PartitionStore(tmp_path / name)
        task.producer = _Producer()  # type: ignore[assignment]
        records = ([(0, b"\0" + key, json.dumps({"FK": "f1", "X": 1}).encode(), 5),
                    (1, b"\1" + key, json.dumps({"Y": "y"}).encode(), 5)] if name == "join" else
                   [(0, b"\0" + key, json.dumps({"A_ID": None, "A_FK": None, "A_X": None, "C_ID": None, "C_Y": None,
                                                 "B_ID": None, "B_FK2": "g1", "E_ID": "k", "E_W": 2}).encode(), 5),
                    (1, b"\1g1", json.dumps({"Z": 4}).encode(), 5)])
        assert asyncio.run(task.commit(KeyedSlice(0, 1, count=2, records=records)))
        sent = [(p, k) for topic, k, p in task.producer.sent if topic == stage.sink.topic]  # type: ignore[attr-defined]
        assert sent and {p for p, _ in sent} == {expected}, (name, sent)


ODD_TABLE = ("CREATE TABLE t (k VARCHAR PRIMARY KEY, v VARCHAR, n INT, d DATE, ts TIMESTAMP, dec DECIMAL(3, 2), "
             "f DOUBLE, b BYTES) WITH (kafka_topic='t', partitions=1, value_format='{}')")
ODD_VALUES = [
    # (the value as written, in JSON and DELIMITED; the table's columns as a pull of it reads them)
    ({"V": 5, "N": 7, "D": "2026-1-2", "TS": 1_700_000_000_000, "DEC": 1.235, "F": "NaN", "B": "AAEC"},
     '5,7,2026-1-2,1700000000000,1.235,NaN,abc',
     {"V": "5", "N": 7, "D": "2026-01-02", "TS": "2023-11-14T22:13:20", "DEC": 1.24, "F": "nan"}),
]


@pytest.mark.parametrize("value_format", ["JSON", "DELIMITED"])
def test_every_join_reads_a_tables_values_as_a_pull_of_the_table_does(tmp_path: Path, value_format: str) -> None:
    """A number for a VARCHAR, a DATE Spark reads loosely, epoch milliseconds for a TIMESTAMP,
    a DECIMAL past its scale, DOUBLE's NaN and BYTES (base64 in JSON, their text in DELIMITED):
    a stream-table join, a table-table join and a foreign-key join give the table's columns
    as its stores keep them (``values.stored``); an INT given as 5.0, which Spark sets aside,
    changes nothing and goes to the processing log."""
    written, delimited, want = ODD_VALUES[0]
    raw = (json.dumps(written) if value_format == "JSON" else delimited).encode()
    want = {**want, "B": [0, 1, 2] if value_format == "JSON" else list(b"abc")}

    def table_columns(value: bytes, prefix: str) -> dict[str, Any]:
        row = json.loads(value, parse_constant=lambda c: c.lower())
        got = {name[len(prefix):]: row[name] for name in row if name.startswith(prefix) and name != f"{prefix}K"}
        got["B"] = list(base64.b64decode(got["B"]))
        return got

    meta, query = _planned("LT", STREAMS[0], ODD_TABLE.format(value_format),
                           "CREATE STREAM lt AS SELECT * FROM l JOIN t ON l.k = t.k")
    stream_table = JoinTask(WorkerSettings(worker_id="w", state_dir=tmp_path), query, meta.source("L"),
                            meta.source("LT"), 0)
    overlay: dict[bytes, list[Any] | None] = {}
    bad: list[BadRecord] = []
    side = stream_table.sides[0]
    side.apply(TableRecord(0, 0, b"a", raw), overlay, bad)
    side.apply(TableRecord(1, 0, b"c", raw.replace(b"7", b"7.0")), overlay, bad)
    assert [b.offset for b in bad] == [1] and "column N is INT" in bad[0].reason and b"\0c" not in overlay
    out = stream_table.output(stream_table._joined_row(b"a", 0, ["a", 1], [overlay[b"\0a"]]), 0, bad)
    assert out is not None and table_columns(out, "T_") == want

    meta, query = _planned("UT", "CREATE TABLE u (k VARCHAR PRIMARY KEY, x INT) WITH (kafka_topic='u', partitions=1, "
                           "value_format='json')", ODD_TABLE.format(value_format),
                           "CREATE TABLE ut AS SELECT * FROM u JOIN t ON u.k = t.k")
    table_table = TableJoinTask(WorkerSettings(worker_id="w", state_dir=tmp_path / "tt"), query, meta.source("U"),
                                meta.source("UT"), 0, "join")
    table_table.store = PartitionStore(tmp_path / "tt-store")
    overlay, bad = {}, []
    table_table._apply(b"\0a", b'{"X": 1}', overlay, (bad, 0))
    table_table._apply(b"\1a", raw, overlay, (bad, 1))
    out = table_table._result(b"a", overlay, 1, bad)
    assert not bad and out is not None and table_columns(out, "T_") == want

    meta, query = _planned("FT", ODD_TABLE.format(value_format), "CREATE TABLE s (id VARCHAR PRIMARY KEY, y INT) "
                           "WITH (kafka_topic='s', partitions=1, value_format='json')",
                           "CREATE TABLE ft WITH (value_format='json') AS SELECT * FROM t JOIN s ON t.v = s.id")
    foreign = ForeignKeyJoinTask(WorkerSettings(worker_id="w", state_dir=tmp_path / "fk"), query, meta.source("T"),
                                 meta.source("FT"), 0, "join")
    foreign.store = PartitionStore(tmp_path / "fk-store")
    overlay, bad = {}, []
    foreign._apply(b"\1" + b"5", b'{"Y": 9}', overlay, (bad, 0))  # the row the number 5 names, as text
    assert foreign._apply(b"\0a", raw, overlay, (bad, 1)) == [b"a"]
    out = foreign._result(b"a", overlay, 1, bad)
    assert not bad and out is not None and table_columns(out, "T_") == want and json.loads(out)["S_Y"] == 9


async def test_a_join_store_written_before_values_were_kept_as_stored_is_built_again(tmp_path: Path) -> None:
    """Stores written before the join tasks kept values as the table's stores do held a
    DELIMITED table's BYTES as their own text, which the joined row now reads as base64 (a
    crash at every batch joining such a row): such a store is emptied, for its task to build it
    again from the topics; one written since, or a new one, is kept."""
    old = PartitionStore(tmp_path / "old")
    old.write({b"\0k": b'["abc"]'}, {INPUT_OFFSET: 4})
    await rebuilt_if_old(old, [INPUT_OFFSET])
    assert (old.get(b"\0k"), old.position(INPUT_OFFSET)) == (None, None)
    new = PartitionStore(tmp_path / "new")
    new.write({b"\0k": b'["YWJj"]'}, {INPUT_OFFSET: 4, VALUES_STORED: 1})
    await rebuilt_if_old(new, [INPUT_OFFSET])
    assert new.get(b"\0k") == ["YWJj"]
    task = _task(tmp_path)  # a table-table join writes the mark with its rows
    assert task.store is not None
    task._write({b"\1k": ["x"]}, 3)
    assert task.store.position(VALUES_STORED) == 1
    for store in (old, new, task.store):
        store.close()
