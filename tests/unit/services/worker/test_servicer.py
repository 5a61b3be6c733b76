"""The worker's Scan over real RocksDB stores: bounded by max_scan_rows (refused past it,
RESOURCE_EXHAUSTED), streamed page by page (the next read only as the caller takes a page)
so the serving loop keeps running through a large scan, holding no iterator between pages
(a store can close and reopen mid-scan), and answering the statement it carries: its
WHERE, SELECT list and LIMIT, planned against the worker's metastore."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from millpond.common.v1 import rows_pb2
from millpond.services.worker import serving
from millpond.services.worker.servicer import WorkerServicer
from millpond.services.worker.serving import LocalCopy, LocalTables
from millpond.services.worker.state.store import INPUT_OFFSET, PartitionStore, encode_state
from millpond.services.worker.task import AggregationTask
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import UnavailableError
from millpond.shared.kafka.serde import as_sent, from_proto
from millpond.shared.sql.guard import ParseLimits, StatementParser
from millpond.shared.sql.parser import parse_statement
from millpond.shared.sql.planner import SelectPlan
from millpond.shared.task_status import RUNNING
from millpond.worker.v1 import worker_pb2


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(code, details)
        self.code, self.details = code, details


class Context:
    def __init__(self, remaining_s: float | None = None):
        self.remaining_s = remaining_s

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)

    def time_remaining(self) -> float | None:
        return self.remaining_s


def metastore() -> Metastore:
    """Table T (K VARCHAR KEY, N BIGINT), as the fake copies' rows are."""
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='s', partitions=2, "
                               "value_format='json')"), 0)
    meta.apply(parse_statement("CREATE TABLE t AS SELECT k, COUNT(*) AS n FROM s GROUP BY k"), 1)
    return meta


class Tables:
    """One store per partition, each counting the rows it hands out."""

    def __init__(self, root: Path, rows_per_partition: dict[int, int]):
        self.read = 0
        self.plans = LocalTables("w", metastore(), None, StatementParser(ParseLimits()))  # type: ignore[arg-type]
        self.stores: dict[int, PartitionStore] = {}
        for partition, count in rows_per_partition.items():
            store = self.stores[partition] = PartitionStore(root / str(partition))
            store.write({b"k%06d" % i: encode_state([i]) for i in range(count)}, {INPUT_OFFSET: 100 + partition})
            store.page = self._counted(store.page)  # type: ignore[method-assign]

    def _counted(self, page: Any) -> Any:
        def counted(after: bytes | None, count: int, prefix: bytes = b"") -> list[tuple[bytes, list[Any]]]:
            items: list[tuple[bytes, list[Any]]] = page(after, count, prefix)
            self.read += len(items)
            return items
        return counted

    def local_table(self, table: str, partition: int, allow_standby: bool, min_input_offset: int = 0) -> LocalCopy:
        store = self.stores[partition]
        if store._db is None:
            raise UnavailableError(f"partition {partition} is not here")
        return LocalCopy(store, lambda key, state: [key.decode(), state[0]], 100 + partition)

    async def select(self, table: str, statement: str, query_id: str = "", columns: tuple[str, ...] = ()) -> SelectPlan:
        return await self.plans.select(table, statement, query_id, columns)

    def set_standby_replay(self, query_id: str, partition: int, paused: bool) -> int:
        raise AssertionError("a scan never pauses a standby's replay")

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        self.plans.parser.close()


class Scanned:
    """Every page of one Scan call."""

    def __init__(self, pages: list[worker_pb2.ScanPagesResponse]):
        self.pages = pages
        self.rows = [r for page in pages for r in rows_pb2.StatementResult.FromString(page.rows).rows]
        assert [page.row_count for page in pages] == [len(rows_pb2.StatementResult.FromString(p.rows).rows) for p in pages]
        self.input_offsets = {p: o for page in pages for p, o in page.input_offsets.items()}

    def values(self) -> list[list[Any]]:
        return [[from_proto(v) for v in row.values] for row in self.rows]


def pages(tables: Tables, max_rows: int, limit: int = 0, partitions: tuple[int, ...] = (0, 1),
          statement: str = "", query_id: str = "", columns: tuple[str, ...] = ()) -> Any:
    servicer = WorkerServicer(tables, max_scan_rows=max_rows)
    request = worker_pb2.ScanPagesRequest(table="T", partitions=partitions, limit=limit, statement=statement,
                                          query_id=query_id, columns=columns)
    return servicer.ScanPages(request, Context())  # type: ignore[arg-type]


async def scan(tables: Tables, max_rows: int, limit: int = 0, partitions: tuple[int, ...] = (0, 1),
               statement: str = "", query_id: str = "", columns: tuple[str, ...] = ()) -> Scanned:
    return Scanned([page async for page in pages(tables, max_rows, limit, partitions, statement, query_id, columns)])


def test_a_scan_over_more_rows_than_the_cap_is_refused_having_read_one_more(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {0: 800, 1: 800})
    with pytest.raises(Aborted) as info:
        asyncio.run(scan(tables, max_rows=1000))
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_scan_rows" in info.value.details and "LIMIT" in info.value.details
    assert tables.read == 1001
    tables.close()


def test_a_scan_within_its_limit_or_the_cap_answers_every_partition(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {0: 800, 1: 800})
    whole = asyncio.run(scan(tables, max_rows=1600))
    assert len(whole.rows) == 1600 and dict(whole.input_offsets) == {0: 100, 1: 101}
    assert [r.values[0].string_value for r in whole.rows[798:802]] == ["k000798", "k000799", "k000000", "k000001"]
    tables.read = 0
    limited = asyncio.run(scan(tables, max_rows=1000, limit=900))
    assert len(limited.rows) == 900 and tables.read == 900 and dict(limited.input_offsets) == {0: 100, 1: 101}
    tables.close()


def test_the_loop_keeps_running_through_a_large_scan(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {0: 6000, 1: 4000})

    async def scan_while_ticking() -> tuple[int, int]:
        ticks = 0
        job = asyncio.ensure_future(scan(tables, max_rows=20_000))
        while not job.done():
            ticks += 1
            await asyncio.sleep(0)
        return ticks, len((await job).rows)

    ticks, rows = asyncio.run(scan_while_ticking())
    assert rows == 10_000
    assert ticks >= 10_000 // serving.SCAN_PAGE_ROWS  # a turn of the loop per page, not one for the whole scan
    tables.close()


def test_the_loop_turns_within_a_page_once_its_where_has_taken_its_slice(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A costly WHERE (an IN list of 3,000 items took a second a page) lets the serving loop turn
    within the page once it has run ``SLICE_S``: here none, so after every row."""
    monkeypatch.setattr(serving, "SLICE_S", 0.0)
    tables = Tables(tmp_path, {0: 400})
    statement = "SELECT n FROM t WHERE n IN (" + ", ".join(str(i) for i in range(0, 3000, 2)) + ")"

    async def scan_while_ticking() -> tuple[int, int]:
        ticks = 0
        job = asyncio.ensure_future(scan(tables, max_rows=1000, partitions=(0,), statement=statement))
        while not job.done():
            ticks += 1
            await asyncio.sleep(0)
        return ticks, len((await job).rows)

    ticks, rows = asyncio.run(scan_while_ticking())
    assert rows == 200 and ticks >= 400  # one page of 400 rows: a turn per row evaluated
    tables.close()


def test_a_store_that_closes_mid_scan_can_reopen_and_the_scan_says_ask_again(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {0: 3000})

    async def scan_while_moving_the_task() -> Any:
        job = asyncio.ensure_future(scan(tables, max_rows=10_000, partitions=(0,)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not job.done()
        tables.stores[0].close()  # the task stops; its next copy opens the same store at once
        PartitionStore(tmp_path / "0").close()
        return await job

    with pytest.raises(Aborted) as info:
        asyncio.run(scan_while_moving_the_task())
    assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_a_scan_answers_its_statement_reading_whole_pages_only_to_filter(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {0: 800, 1: 800})
    filtered = asyncio.run(scan(tables, max_rows=2000, limit=15, statement="SELECT n FROM t WHERE n >= 790 LIMIT 15"))
    assert filtered.values() == [[n] for n in range(790, 800)] + [[n] for n in range(790, 795)]
    assert filtered.input_offsets == {0: 100, 1: 101} and tables.read == 1600
    tables.read = 0
    projected = asyncio.run(scan(tables, max_rows=2000, limit=3, statement="SELECT k, n * 2 AS twice FROM t LIMIT 3"))
    assert projected.values() == [["k000000", 0], ["k000001", 2], ["k000002", 4]] and tables.read == 3
    tables.close()


def test_a_statement_that_is_not_a_pull_query_of_the_table_is_refused(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {0: 10})
    invalid, missing = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    for statement, code, message in (("SELECT * FROM s", invalid, "not a pull query of it"),
                                     ("DROP TABLE t", invalid, "not a pull query"),
                                     ("SELECT * FROM t WHERE " + "(" * 300 + "1=1" + ")" * 300, invalid, "nest"),
                                     ("SELECT nope FROM t", missing, "column NOPE does not exist in T")):
        with pytest.raises(Aborted) as info:
            asyncio.run(scan(tables, max_rows=100, partitions=(0,), statement=statement))
        assert info.value.code == code and message in info.value.details
    tables.close()


def test_a_scan_reads_the_next_page_only_once_the_caller_takes_this_one(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {0: 3000})

    async def first_page() -> int:
        stream = pages(tables, max_rows=10_000, partitions=(0,))
        page = await anext(stream)
        await asyncio.sleep(0.05)  # a caller that has not asked for more
        read = tables.read
        await stream.aclose()
        return read if page.row_count == serving.SCAN_PAGE_ROWS else -1

    assert asyncio.run(first_page()) == serving.SCAN_PAGE_ROWS
    tables.close()


def test_the_unary_scan_of_earlier_routers_answers_every_row_in_one_message(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {0: 700, 1: 300})
    servicer = WorkerServicer(tables, max_scan_rows=2000)
    response = asyncio.run(servicer.Scan(worker_pb2.ScanRequest(table="T", partitions=[0, 1]), Context()))  # type: ignore[arg-type]
    assert len(response.rows) == 1000 and dict(response.input_offsets) == {0: 100, 1: 101}
    assert [from_proto(v) for v in response.rows[700].values] == ["k000000", 0]
    tables.close()


def test_a_limit_reached_reads_no_further_partition_nor_needs_its_copy(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {0: 10, 1: 10})
    tables.stores[1].close()  # partition 1 is moving away: asking for its copy would fail
    limited = asyncio.run(scan(tables, max_rows=100, limit=5, statement="SELECT k FROM t LIMIT 5"))
    assert limited.values() == [[f"k00000{i}"] for i in range(5)] and limited.input_offsets == {0: 100}
    tables.stores[0].close()
    tables.plans.parser.close()


def test_a_scan_planned_for_another_query_of_the_same_table_name_is_refused(tmp_path: Path) -> None:
    tables = Tables(tmp_path, {0: 3})
    known = tables.plans.metastore.source("T").query_id
    assert known is not None
    mine = asyncio.run(scan(tables, max_rows=10, partitions=(0,), statement="SELECT * FROM t", query_id=known))
    assert len(mine.rows) == 3
    with pytest.raises(Aborted) as info:  # the router planned the statement against a newer T
        asyncio.run(scan(tables, max_rows=10, partitions=(0,), statement="SELECT * FROM t", query_id="CTAS_T_9"))
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and f"materialized by query {known}" in info.value.details
    tables.close()


def test_a_scan_planned_with_other_columns_is_refused(tmp_path: Path) -> None:
    """A router that planned the statement with another definition of a custom type it names (one
    of them has not yet read the type made anew) gets UNAVAILABLE, not rows of other types than
    its header's."""
    tables = Tables(tmp_path, {0: 3})
    tables.plans.metastore.apply(parse_statement("CREATE TYPE cents AS INT"), 2)
    statement = "SELECT k, CAST(n AS cents) AS c FROM t"
    mine = asyncio.run(scan(tables, max_rows=10, partitions=(0,), statement=statement, columns=("K VARCHAR", "C INT")))
    assert len(mine.rows) == 3
    with pytest.raises(Aborted) as info:  # the router's CENTS is DECIMAL(12, 2)
        asyncio.run(scan(tables, max_rows=10, partitions=(0,), statement=statement,
                         columns=("K VARCHAR", "C DECIMAL(12, 2)")))
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert "with the columns K VARCHAR, C INT, not K VARCHAR, C DECIMAL(12, 2) as the router planned it" in info.value.details
    tables.close()


class _StageTask:
    """What ``stage_positions`` reads of a task: its stage, state, position and output ends."""

    def __init__(self, stage: str, position: int, ends: dict[int, int]):
        self.stage, self.state, self.next_input_offset, self.output_ends = stage, "RUNNING", position, ends
        self.sink = type("Sink", (), {"topic": "joined"})()


class _Supervisor:
    def __init__(self, *tasks: tuple[int, _StageTask]):
        self.tasks = dict(tasks)
        self.failed = False

    def stage_task(self, stage: str, partition: int) -> _StageTask | None:
        task = self.tasks.get(partition)
        return task if task is not None and task.stage == stage else None


def _stage_tables(**supervisors: _Supervisor) -> LocalTables:
    assignment = type("Assignment", (), {"supervisors": {("Q", int(p.removeprefix("p"))): s
                                                         for p, s in supervisors.items()}})()
    return LocalTables("w", metastore(), assignment, StatementParser(ParseLimits()))  # type: ignore[arg-type]


async def test_stage_positions_wait_for_each_task_to_commit_then_merge_their_output_ends() -> None:
    early, late = _StageTask("side-1", 5, {0: 7, 1: 3}), _StageTask("side-1", 2, {1: 4})
    tables = _stage_tables(p0=_Supervisor((0, early)), p1=_Supervisor((1, late)))

    async def commit_later() -> None:
        await asyncio.sleep(0.05)
        late.output_ends = {1: 9, 2: 1}  # ends first, then the position, as a commit does
        late.next_input_offset = 6

    committing = asyncio.create_task(commit_later())
    topic, ends = await tables.stage_positions("Q", "side-1", {0: 5, 1: 6}, timeout_s=5)
    await committing
    assert (topic, ends) == ("joined", {0: 7, 1: 9, 2: 1})


async def test_stage_positions_refuse_a_task_not_here_not_running_or_not_there_in_time() -> None:
    task = _StageTask("side-1", 5, {0: 7})
    tables = _stage_tables(p0=_Supervisor((0, task)))
    with pytest.raises(UnavailableError, match="stage 'side-0' of query Q is not running"):
        await tables.stage_positions("Q", "side-0", {0: 1}, timeout_s=1)
    with pytest.raises(UnavailableError, match="partition 3 of stage 'side-1'"):
        await tables.stage_positions("Q", "side-1", {3: 1}, timeout_s=1)
    with pytest.raises(UnavailableError, match="up to offset 5; the consistency token needs 8"):
        await tables.stage_positions("Q", "side-1", {0: 8}, timeout_s=0.05)
    supervisor = tables.tasks.supervisors[("Q", 0)]
    supervisor.failed = True  # waiting to restart: its tasks are closed
    with pytest.raises(UnavailableError, match="is not running"):
        await tables.stage_positions("Q", "side-1", {0: 1}, timeout_s=1)
    supervisor.failed, task.state = False, "STARTING"
    with pytest.raises(UnavailableError, match="is not running"):
        await tables.stage_positions("Q", "side-1", {0: 1}, timeout_s=1)


def _lookup_tables(root: Path, position: int) -> tuple[LocalTables, AggregationTask]:
    """Partition 0 of T active here, its store holding k1 (counted 3), its input processed up to ``position``."""
    meta = metastore()
    table = meta.source("T")
    assert table.query_id is not None
    query = meta.queries[table.query_id]
    task = AggregationTask(WorkerSettings(worker_id="w", state_dir=root), query, meta.sources[query.source], table, 0)
    task.store = PartitionStore(root / "store")
    task.store.write({b"k1": encode_state([[3]])}, {INPUT_OFFSET: position})
    task.state, task.next_input_offset = RUNNING, position
    assignment = type("Assignment", (), {"supervisors": {(table.query_id, 0): _Supervisor((0, task))},  # type: ignore[arg-type]
                                         "standbys": {}})()
    return LocalTables("w", meta, assignment, StatementParser(ParseLimits())), task  # type: ignore[arg-type]


async def test_a_lookup_waits_for_its_copy_to_reach_the_token_and_a_copy_not_here_is_refused_at_once(
        tmp_path: Path) -> None:
    tables, task = _lookup_tables(tmp_path, 5)
    servicer = WorkerServicer(tables, max_scan_rows=10)
    context: Any = Context()
    try:
        async def commit_later() -> None:
            await asyncio.sleep(0.05)
            task.next_input_offset = 8  # a commit: the store first, then the position

        committing = asyncio.create_task(commit_later())
        answer = await servicer.Lookup(worker_pb2.LookupRequest(table="T", partition=0, key=b"k1", min_input_offset=8,
                                                                wait_ms=5_000), context)
        await committing
        assert answer.found and answer.input_offset == 8

        # The router in the worker asks in-process, and the lookup waits the same way.
        async def commit_again() -> None:
            await asyncio.sleep(0.05)
            task.next_input_offset = 9

        committing = asyncio.create_task(commit_again())
        found = await servicer.lookup(worker_pb2.LookupRequest(table="T", partition=0, key=b"k1", min_input_offset=9,
                                                               wait_ms=5_000))
        await committing
        assert found.input_offset == 9 and found.row is not None
        task.next_input_offset = 8

        # Without a wait (as a LookupStream's lookups), or once the wait is over, it refuses and says why.
        for wait_ms in (0, 50):
            with pytest.raises(Aborted) as info:
                await servicer.Lookup(worker_pb2.LookupRequest(table="T", partition=0, key=b"k1", min_input_offset=9,
                                                               wait_ms=wait_ms), context)
            assert info.value.code == grpc.StatusCode.UNAVAILABLE
            assert "up to offset 8; the consistency token needs 9" in info.value.details
            assert ("after waiting" in info.value.details) == (wait_ms > 0)

        # A wait ends a little before the call's deadline, so the caller gets the reason.
        with pytest.raises(Aborted) as info:
            await asyncio.wait_for(servicer.Lookup(worker_pb2.LookupRequest(
                table="T", partition=0, key=b"k1", min_input_offset=9, wait_ms=30_000), Context(remaining_s=0.2)), 5)
        assert "the consistency token needs 9 (after waiting" in info.value.details

        # A copy that is not here will not come by waiting: refused at once, whatever the wait.
        refused = servicer.Lookup(worker_pb2.LookupRequest(table="T", partition=1, key=b"k1", min_input_offset=1,
                                                           wait_ms=30_000), context)
        with pytest.raises(Aborted) as info:
            await asyncio.wait_for(refused, 5)
        assert "partition 1 of T is not active" in info.value.details
    finally:
        assert task.store is not None
        task.store.close()
        tables.parser.close()


async def test_a_commit_on_another_thread_wakes_a_waiting_lookup_without_its_recheck(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The processing loop's commit tells ``Progress`` from its thread: the lookup waiting for
    the token looks again then, not at its next recheck (made longer than the test's bound)."""
    monkeypatch.setattr(serving, "RECHECK_S", 60.0)
    tables, task = _lookup_tables(tmp_path, 5)
    servicer = WorkerServicer(tables, max_scan_rows=10)

    def commit() -> None:  # as QueryRunner._commit does on the processing loop's thread
        time.sleep(0.05)
        task.next_input_offset = 8
        tables.progress.moved()

    try:
        committer = threading.Thread(target=commit)
        committer.start()
        found = await asyncio.wait_for(servicer.lookup(worker_pb2.LookupRequest(
            table="T", partition=0, key=b"k1", min_input_offset=8, wait_ms=30_000)), 10)
        committer.join()
        assert found.input_offset == 8 and found.row is not None
        assert tables.progress.waiting == 0
        # With nobody waiting, a move wakes nothing (it crosses no thread).
        with tables.progress.waiter():
            move = tables.progress.next_move()
        tables.progress.moved()
        await asyncio.sleep(0.01)  # a wake it had scheduled would have run
        assert not move.is_set()
    finally:
        assert task.store is not None
        task.store.close()
        tables.parser.close()


async def test_a_move_between_the_look_and_the_wait_still_wakes_the_waiter() -> None:
    """``next_move`` is taken before the look: a move that lands after the look but before the
    wait starts sets that event, so the wait ends at once."""
    progress = serving.Progress()
    with progress.waiter():
        move = progress.next_move()
        # ... the look finds the copy behind; then, before the wait, another thread's commit:
        mover = threading.Thread(target=progress.moved)
        mover.start()
        mover.join()
        await asyncio.wait_for(progress.wait(move, 60.0), 10)
        assert move.is_set()
        assert progress.next_move() is not move  # the next wait waits for the next move


async def test_a_scan_waits_for_its_copies_to_reach_the_token_as_a_lookup_does(tmp_path: Path) -> None:
    tables, task = _lookup_tables(tmp_path, 5)
    servicer = WorkerServicer(tables, max_scan_rows=10)

    async def scanned(wait_ms: int, context: Any = None) -> list[worker_pb2.ScanPagesResponse]:
        request = worker_pb2.ScanPagesRequest(table="T", partitions=[0], min_input_offsets={0: 8}, wait_ms=wait_ms)
        pages = servicer.ScanPages(request, context) if context is not None else servicer.scan(request)
        return [page async for page in pages]

    try:
        async def commit_later() -> None:
            await asyncio.sleep(0.05)
            task.next_input_offset = 8

        for call in (lambda: scanned(5_000, Context()), lambda: scanned(5_000)):  # the ScanPages call, then in-process
            task.next_input_offset = 5
            committing = asyncio.create_task(commit_later())
            (page,) = await call()
            await committing
            assert page.row_count == 1 and dict(page.input_offsets) == {0: 8}

        task.next_input_offset = 5
        for wait_ms, context in ((0, Context()), (30_000, Context(remaining_s=0.2))):
            with pytest.raises(Aborted) as info:
                await asyncio.wait_for(scanned(wait_ms, context), 5)
            assert "up to offset 5; the consistency token needs 8" in info.value.details
            assert ("after waiting" in info.value.details) == (wait_ms > 0)
    finally:
        assert task.store is not None
        task.store.close()
        tables.parser.close()


@pytest.mark.parametrize("row", [
    ["k1", 7], ["k2", None], ["k3", 2.5], ["k4", {"a": [1, b"\x00"]}], ["k5", True], ["k6", b"\xff"],
])
def test_an_in_process_lookup_answers_as_the_lookup_call(tmp_path: Path, row: list[Any]) -> None:
    """The router in a worker reads its copies without the protobuf; the values are those the
    Lookup call's message gives (a nested value as its JSON text reads)."""
    tables = Tables(tmp_path, {0: 3})
    tables.local_table = lambda *_: LocalCopy(tables.stores[0], lambda key, state: list(row), 100)  # type: ignore[method-assign]
    servicer = WorkerServicer(tables, max_scan_rows=10)
    try:
        request = worker_pb2.LookupRequest(table="T", partition=0, key=b"k000001")
        sent = servicer.lookup_now(request)
        answer = asyncio.run(servicer.lookup(request))
        assert answer.row == [from_proto(v) for v in sent.row.values] and sent.found
        assert answer.input_offset == sent.input_offset == 100
        missing = worker_pb2.LookupRequest(table="T", partition=0, key=b"nope")
        assert asyncio.run(servicer.lookup(missing)).row is None and not servicer.lookup_now(missing).found
        tables.local_table = lambda *_: LocalCopy(tables.stores[0], lambda key, state: None, 100)  # type: ignore[method-assign]
        assert asyncio.run(servicer.lookup(request)).row is None and not servicer.lookup_now(request).found  # HAVING
        tables.stores[0].close()
        del tables.local_table  # the fake's own: a closed store is not here
        with pytest.raises(UnavailableError):
            asyncio.run(servicer.lookup(request))
    finally:
        tables.close()


def test_an_in_process_lookup_refuses_an_integer_a_lookup_message_cannot_hold() -> None:
    assert as_sent(-(1 << 63)) == -(1 << 63) and as_sent((1 << 63) - 1) == (1 << 63) - 1
    with pytest.raises(ValueError):
        as_sent(1 << 63)
