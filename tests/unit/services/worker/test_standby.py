"""Standby replay of a changelog slice, with a fake consumer over an in-memory changelog and a
real RocksDB store: the copy ends with each key's last state, the changelog position past the
last commit marker, and the input position from the records' headers, reported (and stored)
only once every record of its transaction is applied; a restarted replica resumes where its
store is; a paused one applies nothing but keeps its lag honest.

Only ``FakeConsumer`` (``fake_changelog.py``) knows how the replica reads Kafka.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from millpond.services.worker import standby
from millpond.services.worker.assignment import TaskAssignment, _stop_all
from millpond.services.worker.standby import StandbyReplica
from millpond.services.worker.state import table_topic
from millpond.services.worker.state.store import (
    CHANGELOG_OFFSET,
    INPUT_OFFSET,
    MARKED_END,
    WRITTEN_MS,
    PartitionStore,
    StoreClosed,
    close_handed,
    open_store,
)
from millpond.services.worker.task import store_path, table_rows
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.sources import Column, DataSource
from millpond.shared.config import WorkerSettings
from millpond.shared.sql.ast import SqlType
from millpond.shared.sql.parser import parse_statement
from tests.unit.services.worker.fake_changelog import Changelog, FakeConsumer, Record
from tests.unit.services.worker.fake_spark import COLD_SPARK

QUERY = "CTAS_T_0"


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting until {what}")


def replica(tmp_path: Path, partition: int = 0) -> StandbyReplica:
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)
    return StandbyReplica(settings, QUERY, partition, lambda key, state: [key, *state])


def stored(tmp_path: Path) -> tuple[dict[bytes, list[Any]], int | None, int | None]:
    """The copy on disk once the replica let it go: states, changelog and input positions."""
    store = PartitionStore(store_path(WorkerSettings(worker_id="w", state_dir=tmp_path), QUERY, 0))
    try:
        return dict(store.items()), store.position(CHANGELOG_OFFSET), store.position(INPUT_OFFSET)
    finally:
        store.close()


async def test_a_standby_replays_the_changelog_to_its_end(changelog: Changelog, tmp_path: Path) -> None:
    changelog.commit_batch({b"s1": [[1]], b"s2": [[1]], b"s3": [[4]]}, reaches=10)
    changelog.commit_batch({b"s1": [[2]], b"s4": [[1]]}, reaches=20)  # offsets 4, 5; marker 6; end 7
    copy = replica(tmp_path)
    assert copy.lag() is None  # it has not looked at the changelog: never "caught up"
    copy.start()
    try:
        await until(lambda: copy.caught_up, "the copy caught up")
        lag = copy.lag()
        assert lag is not None
        assert (lag.active, lag.current_offset, lag.end_offset, lag.lag, lag.input_offset) == (False, 7, 7, 0, 20)
        assert lag.last_applied_ms > 0
    finally:
        await copy.stop()
    assert stored(tmp_path) == ({b"s1": [[2]], b"s2": [[1]], b"s3": [[4]], b"s4": [[1]]}, 6, 20)
    assert FakeConsumer.seeks == [0]


async def test_a_restarted_standby_resumes_where_its_store_is(changelog: Changelog, tmp_path: Path) -> None:
    changelog.commit_batch({b"s1": [[1]], b"s2": [[1]]}, reaches=10)
    first = replica(tmp_path)
    first.start()
    await until(lambda: first.caught_up, "the first copy caught up")
    await first.stop()
    changelog.commit_batch({b"s1": [[5]]}, reaches=30)  # offset 3, marker 4

    second = replica(tmp_path)
    second.start()
    try:
        await until(lambda: second.caught_up, "the second copy caught up")
        lag = second.lag()
        assert lag is not None and (lag.current_offset, lag.end_offset, lag.input_offset) == (5, 5, 30)
    finally:
        await second.stop()
    assert FakeConsumer.seeks == [0, 2]  # the second read only what the first had not applied
    assert stored(tmp_path) == ({b"s1": [[5]], b"s2": [[1]]}, 4, 30)


async def test_a_standby_whose_reader_cannot_be_built_releases_its_store_for_the_retry(
        changelog: Changelog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    changelog.commit_batch({b"s1": [[1]]}, reaches=10)
    built = standby.ChangelogReader
    failures = []

    def reader_once_unbuildable(*args: Any, **kwargs: Any) -> Any:
        if not failures:
            failures.append(1)
            raise OSError("the TLS CA file cannot be read")  # as client_args() raises for a missing file
        return built(*args, **kwargs)

    monkeypatch.setattr(standby, "ChangelogReader", reader_once_unbuildable)
    copy = replica(tmp_path)
    copy.start()
    try:  # held open, the store's RocksDB lock would fail every retry's open
        await until(lambda: copy.caught_up, "the copy caught up after its retry")
    finally:
        await copy.stop()
    assert failures == [1]
    assert stored(tmp_path) == ({b"s1": [[1]]}, 1, 10)


async def test_a_paused_standby_applies_nothing_but_reports_its_lag(changelog: Changelog, tmp_path: Path) -> None:
    changelog.commit_batch({b"s1": [[1]], b"s2": [[1]], b"s3": [[1]]}, reaches=10)
    copy = replica(tmp_path)
    copy.pause(True)
    copy.start()
    try:
        await until(lambda: copy.lag() is not None, "the copy knows the end")
        changelog.commit_batch({b"s4": [[1]]}, reaches=11)  # the end moves while paused
        await until(lambda: (lag := copy.lag()) is not None and lag.end_offset == 6, "the paused copy saw the new end")
        lag = copy.lag()
        assert lag is not None and (lag.current_offset, lag.lag, lag.input_offset) == (0, 6, -1)
        assert not copy.caught_up and copy.store is not None and dict(copy.store.items()) == {}

        copy.pause(False)
        await until(lambda: (lag := copy.lag()) is not None and lag.lag == 0, "the resumed copy caught up")
        assert copy.caught_up
        assert dict(copy.store.items()) == {b"s1": [[1]], b"s2": [[1]], b"s3": [[1]], b"s4": [[1]]}
    finally:
        await copy.stop()


@asynccontextmanager
async def waiting_copy(changelog: Changelog, tmp_path: Path) -> AsyncIterator[StandbyReplica]:
    """A copy caught up with one committed transaction, its next fetch waiting at the broker;
    stopped at the end."""
    FakeConsumer.waits = True
    changelog.commit_batch({b"s1": [[1]]}, reaches=10)
    copy = replica(tmp_path)
    copy.start()
    try:
        await until(lambda: copy.caught_up and copy._fetch is not None, "the copy caught up and waits")
        yield copy
    finally:
        await copy.stop()


async def test_a_standby_paused_while_its_fetch_waits_at_the_broker_applies_nothing_after_the_pause(
        changelog: Changelog, tmp_path: Path) -> None:
    """A caught-up copy's fetch waits up to FETCH_WAIT_MS for the next commit; a pause stops
    it, so a transaction committed after the pause waits for the resume."""
    async with waiting_copy(changelog, tmp_path) as copy:
        copy.pause(True)
        changelog.commit_batch({b"s2": [[1]]}, reaches=11)
        await until(lambda: (lag := copy.lag()) is not None and lag.end_offset == 4, "the paused copy saw the new end")
        assert copy.store is not None and dict(copy.store.items()) == {b"s1": [[1]]}
        copy.pause(False)
        await until(lambda: copy.store is not None and b"s2" in dict(copy.store.items()), "the resumed copy applied it")


async def test_a_standby_paused_and_resumed_at_once_goes_on_replaying(changelog: Changelog, tmp_path: Path) -> None:
    """A pause cancels the fetch waiting at the broker; a resume that comes before the copy sees
    that cancellation is not a stop: the copy goes on (it ended silently, its store closed,
    out of the lag reports until its assignment changed)."""
    async with waiting_copy(changelog, tmp_path) as copy:
        copy.pause(True)
        copy.pause(False)
        changelog.commit_batch({b"s2": [[1]]}, reaches=11)
        await until(lambda: copy.store is not None and b"s2" in dict(copy.store.items()), "the copy applied the next")
        assert copy._job is not None and not copy._job.done() and copy.lag() is not None


async def test_a_standby_passes_the_commit_marker_that_came_with_its_records(changelog: Changelog, tmp_path: Path) -> None:
    """The marker after a transaction's last records comes in the same answer: the copy's
    transaction is complete at once, not after its next fetch, which waits at the broker up
    to FETCH_WAIT_MS (10 s) while nothing is committed."""
    FakeConsumer.waits = True
    changelog.commit_batch({b"s1": [[1]]}, reaches=10)
    copy = replica(tmp_path)
    copy.start()
    try:
        await until(lambda: copy.caught_up and copy.input_offset == 10, "the copy caught up, its transaction complete")
        assert copy._fetch is not None and not copy._fetch.done()  # the next fetch waits at the broker
        assert (lag := copy.lag()) is not None and (lag.current_offset, lag.lag) == (2, 0)
    finally:
        await copy.stop()


async def test_a_standby_of_an_empty_changelog_knows_its_end_while_its_fetch_waits(
        changelog: Changelog, tmp_path: Path) -> None:
    """A copy's fetch goes out as it starts, and with nothing to read the broker holds it up
    to FETCH_WAIT_MS; a question on the same connection would be answered only after it. The
    copy asks its end beside it, so its lag is reported at once."""
    FakeConsumer.waits = True
    copy = replica(tmp_path)
    copy.start()
    try:
        await until(lambda: (lag := copy.lag()) is not None and lag.lag == 0 and copy.caught_up, "the copy knows the end")
        assert copy._fetch is not None and not copy._fetch.done()
    finally:
        await copy.stop()


async def test_a_standby_reports_an_input_offset_only_once_its_whole_transaction_is_applied(
        changelog: Changelog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    changelog.commit_batch({b"s1": [[1]], b"s2": [[1]], b"s3": [[1]]}, reaches=10)  # offsets 0-2, marker 3
    changelog.commit_batch({b"s1": [[2]], b"s2": [[2]], b"s4": [[1]]}, reaches=20)  # offsets 4-6, marker 7
    monkeypatch.setattr(FakeConsumer, "markers_apart", True)  # each answer ends before a marker
    copy = replica(tmp_path)
    seen: list[tuple[int, int | None]] = []  # what the copy reports and stores, as each fetch begins
    monkeypatch.setattr(FakeConsumer, "observe", lambda: seen.append(
        (copy.input_offset, copy.store.position(INPUT_OFFSET) if copy.store is not None else None)))
    copy.start()  # two records a fetch: [0, 1], [2, 4], [5, 6], then nothing but the marker
    try:
        await until(lambda: len(seen) >= 5, "five fetches")
    finally:
        await copy.stop()
    assert seen[:5] == [(-1, None),
                        (-1, None),  # two of the three records of 10: not yet
                        (10, 10),  # a record of 20 completes 10
                        (10, 10),  # every record of 20 applied, but nothing says so yet
                        (20, 20)]  # the fetch reached the last stable offset
    assert stored(tmp_path) == ({b"s1": [[2]], b"s2": [[2]], b"s3": [[1]], b"s4": [[1]]}, 7, 20)


async def _kept_a_day(kafka: Any, table: DataSource) -> int:
    """``table_store_max_age`` of a compacted topic whose tombstones are kept a day."""
    return 86_400_000 - 8_640_000


async def test_a_table_copy_kept_past_its_topics_tombstones_is_built_again(
        changelog: Changelog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of a table replays its compacted topic; while it was away longer than the topic
    keeps a tombstone, the cleaner removed a row's records and their tombstone (every record
    after its position, here): resumed from its position it would keep the deleted row for good.
    Last brought up to date too long ago, and the topic's end moved since, it is built again
    from the topic; away as long with the end where it was (a quiet table), it is kept."""
    monkeypatch.setattr(table_topic, "AIOKafkaConsumer", FakeConsumer)
    monkeypatch.setattr(standby, "table_store_max_age", _kept_a_day)
    FakeConsumer.waits = True
    table = DataSource("TABLE", "T", (Column("ID", SqlType("VARCHAR"), key=True), Column("N", SqlType("INT"))), "t", 1)
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)
    for age_ms, end, kept in ((3_600_000, 4, {b"a", b"b"}), (86_400_000, 4, {b"b"}), (86_400_000, 2, {b"a", b"b"})):
        changelog.records = [Record(0, b"a", b'{"N": 1}', ()), Record(1, b"b", b'{"N": 2}', ())]  # type: ignore[arg-type]
        changelog.end = 2
        copy = StandbyReplica(settings, QUERY, 0, table_rows(table), table)
        copy.start()
        try:
            await until(lambda: copy.caught_up, "the copy caught up")  # noqa: B023
            assert copy.store is not None and set(dict(copy.store.items())) == {b"a", b"b"}
        finally:
            await copy.stop()
        # Away ``age_ms``; with the end at 4, a's record, then its tombstone, were written and cleaned away.
        store = PartitionStore(store_path(settings, QUERY, 0))
        assert store.position(MARKED_END) == 2
        store.write({}, {WRITTEN_MS: int(time.time() * 1000) - age_ms})
        store.close()
        changelog.records = [Record(1, b"b", b'{"N": 2}', ())]  # type: ignore[arg-type]
        changelog.end = end
        again = StandbyReplica(settings, QUERY, 0, table_rows(table), table)
        again.start()
        try:
            await until(lambda: (lag := again.lag()) is not None and lag.current_offset == end, "the copy resumed")  # noqa: B023
            assert again.store is not None and set(dict(again.store.items())) == kept, (age_ms, end)
        finally:
            await again.stop()
        shutil.rmtree(store_path(settings, QUERY, 0))


async def test_a_standby_of_a_materialized_table_replays_the_tables_topic(
        changelog: Changelog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table materialized from its topic (a declared table, a join's result) has no changelog
    of its own: its copy applies the topic as the active task does (each key's latest value,
    tombstones delete, values that do not decode left out, a key of several columns stored in
    its canonical form) and reports the next topic offset as its input offset, past the commit
    marker that came with the last records (its next fetch waits at the broker)."""
    monkeypatch.setattr(table_topic, "AIOKafkaConsumer", FakeConsumer)
    monkeypatch.setattr(standby, "table_store_max_age", _kept_a_day)
    FakeConsumer.waits = True
    varchar, int_ = SqlType("VARCHAR"), SqlType("INT")
    table = DataSource("TABLE", "T", (Column("ID", varchar, key=True), Column("AREA", int_, key=True),
                                      Column("SITE", varchar), Column("N", int_), Column("W", SqlType("DOUBLE"))),
                       "t", 1, key_format="JSON")
    values = [(b'{"ID":"s1","AREA":1}', b'{"SITE":"a","N":1}'), (b'{"AREA": 2, "ID": "s2"}', b'{"site":"b"}'),
              (b'{"ID":"s1","AREA":1}', None), (b'{"ID":"s3","AREA":3}', b"not json"),
              (b'{"ID":"s4","AREA":4}', b'{"SITE":"d","N":"four"}'), (b'{"ID":"s2","AREA":2}', b'{"SITE":"c","N":2}'),
              (b'{"ID":"s5"}', b'{"SITE":"e","N":5}'), (b'{"ID":"s6","AREA":6}', b'{"SITE":"f","N":6,"W":3}')]
    changelog.records = [Record(offset, key, value, ()) for offset, (key, value) in enumerate(values)]  # type: ignore[arg-type]
    changelog.end = len(values) + 1  # a commit marker
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)
    copy = StandbyReplica(settings, QUERY, 0, table_rows(table), table)
    copy.start()
    try:
        await until(lambda: copy.caught_up, "the copy caught up")
        lag = copy.lag()
        assert lag is not None and (lag.active, lag.current_offset, lag.end_offset, lag.input_offset) == (False, 9, 9, 9)
        assert copy.store is not None
        rows = {key: copy.row(key, state) for key, state in copy.store.items()}
        assert rows == {b'{"ID":"s2","AREA":2}': ["s2", 2, "c", 2, None], b'{"ID":"s6","AREA":6}': ["s6", 6, "f", 6, 3.0]}
        assert isinstance(rows[b'{"ID":"s6","AREA":6}'][-1], float)  # as Spark decodes a DOUBLE for the active
    finally:
        await copy.stop()
    changelog.records.append(Record(9, b'{"ID":"s6","AREA":6}', None, ()))  # type: ignore[arg-type]
    changelog.end = 11
    again = StandbyReplica(settings, QUERY, 0, table_rows(table), table)
    again.start()
    try:
        await until(lambda: (lag := again.lag()) is not None and lag.current_offset == 11, "the copy resumed")
        assert again.store is not None and list(dict(again.store.items())) == [b'{"ID":"s2","AREA":2}']
    finally:
        await again.stop()
    assert FakeConsumer.seeks == [0, 9]  # the second copy read only what the first had not applied
    assert stored(tmp_path)[2] == 11


async def test_a_copy_of_another_store_of_the_query_replays_its_changelog_into_that_store(
        changelog: Changelog, tmp_path: Path) -> None:
    """A table aggregation's regroup store beside its standby: the copy lives where the regroup
    task's store does, starts over from a kept copy older than the changelog keeps tombstones,
    and once caught up says so (so its promotion does not take it for a store left behind)."""
    changelog.commit_batch({b"p1": ["YQ==", '{"_SIGN":1}'], b"p2": ["Yg==", '{"_SIGN":1}']}, reaches=4)
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)
    # A copy kept from long ago, which may have missed a delete (its tombstone since compacted
    # away), starts over rather than resume: the ghost row goes.
    kept = PartitionStore(store_path(settings, f"{QUERY}-regroup", 0))
    kept.write({b"ghost": b'["YQ==","{}"]'}, {WRITTEN_MS: 1_000})
    kept.close()
    copy = StandbyReplica(settings, QUERY, 0, lambda _key, _state: None, changelog="svc-regroup-changelog",
                          store=f"{QUERY}-regroup", max_age_ms=3_600_000)
    assert copy.changelog.topic == "svc-regroup-changelog"
    copy.start()
    try:
        await until(lambda: copy.caught_up, "the copy caught up")
    finally:
        await copy.stop()
    store = PartitionStore(store_path(settings, f"{QUERY}-regroup", 0))
    try:
        assert dict(store.items()) == {b"p1": ["YQ==", '{"_SIGN":1}'], b"p2": ["Yg==", '{"_SIGN":1}']}
        assert store.position(INPUT_OFFSET) == 4 and (store.position(WRITTEN_MS) or 0) > 0
    finally:
        store.close()
    assert not store_path(settings, QUERY, 0).exists()


def test_a_table_aggregations_standby_keeps_a_copy_of_its_regroup_store_beside_it(tmp_path: Path) -> None:
    """Which copies a standby of a table aggregation keeps beside the result's: its regroup
    store's, for the partitions the table has (none for a stream's aggregation)."""
    meta = Metastore()
    for offset, sql in enumerate([
            "CREATE TABLE pages (page VARCHAR PRIMARY KEY, owner VARCHAR) WITH (kafka_topic='pages', partitions=2, "
            "value_format='json')",
            "CREATE STREAM visits (page VARCHAR KEY, ms INT) WITH (kafka_topic='visits', partitions=2, "
            "value_format='json')",
            "CREATE TABLE owners WITH (partitions=3) AS SELECT owner, COUNT(*) AS n FROM pages GROUP BY owner",
            "CREATE TABLE per_page AS SELECT page, COUNT(*) AS n FROM visits GROUP BY page"]):
        meta.apply(parse_statement(sql), offset)
    owners = next(q for q in meta.queries.values() if q.sink == "OWNERS").query_id
    per_page = next(q for q in meta.queries.values() if q.sink == "PER_PAGE").query_id
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path, service_id="svc")
    tasks = TaskAssignment(settings, meta, COLD_SPARK)  # type: ignore[arg-type]
    (copy,) = tasks._companions(owners, 1)
    assert (copy.changelog.topic, copy.changelog.partition, copy.store_name) == (
        f"_millpond-svc-{owners}-regroup-changelog", 1, f"{owners}-regroup")
    assert tasks._companions(owners, 2) == []  # the table has two partitions, the result three
    assert tasks._companions(per_page, 0) == []


async def test_a_promoted_standby_hands_its_open_store_to_the_active_task(changelog: Changelog, tmp_path: Path) -> None:
    """The copies of a partition this worker now runs the active of leave their stores open,
    at their replayed position, for the task that opens the same path next; the others close
    theirs, and a store nobody claims is closed when the worker stops."""
    changelog.commit_batch({b"s1": [[1]], b"s2": [[3]]}, reaches=10)  # offsets 0, 1; marker 2
    promoted, kept = replica(tmp_path, 0), replica(tmp_path, 1)
    for copy in (promoted, kept):
        copy.start()
    await until(lambda: promoted.caught_up and kept.caught_up, "both copies caught up")
    held, closed = promoted.store, kept.store
    assert held is not None and closed is not None
    await _stop_all([promoted.stop(hand_over=True), kept.stop()])
    assert promoted.store is None and kept.store is None
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)
    task_store = open_store(store_path(settings, QUERY, 0))
    try:
        assert task_store is held  # not closed and reopened
        assert dict(task_store.items()) == {b"s1": [[1]], b"s2": [[3]]} and task_store.position(CHANGELOG_OFFSET) == 2
    finally:
        task_store.close()
    with pytest.raises(StoreClosed):
        closed.get(b"s1")  # stopped, not promoted: released
    other = open_store(store_path(settings, QUERY, 1))
    assert other is not closed and dict(other.items()) == {b"s1": [[1]], b"s2": [[3]]}
    other.close()

    again = replica(tmp_path, 0)
    again.start()
    await until(lambda: again.caught_up, "a new copy caught up")
    left = again.store
    await again.stop(hand_over=True)  # and no task claims it
    close_handed()
    assert left is not None
    with pytest.raises(StoreClosed):
        left.get(b"s1")
    reopened = open_store(store_path(settings, QUERY, 0))  # the lock was released
    reopened.close()
