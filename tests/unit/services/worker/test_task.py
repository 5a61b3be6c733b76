"""The exactly-once commit of a task's micro-batch slice, with a fake transactional producer and
a real RocksDB store in a temporary directory: every record goes inside one Kafka transaction
that ends with the input offsets, the store changes only after that transaction committed (in
one write batch with its positions), a replayed batch does nothing, and a transaction that
fails leaves the store and the task's position as they were. The restore from the changelog
(over ``fake_changelog.py``) stores an input offset only once its whole transaction is applied,
and resumes after a crash mid-transaction.

The slices are built by ``aggregate_slice``, ``projection_slice`` and ``table_slice`` only, so a
change of the slice types touches those three functions.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import InvalidProducerEpoch, KafkaError, ProducerFenced
from aiokafka.structs import OffsetAndMetadata
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from millpond.services.worker import task as task_module
from millpond.services.worker.joining import JoinSlice, JoinTask, committed_table_offsets, event_time_reader
from millpond.services.worker.state.store import (
    CHANGELOG_OFFSET,
    INPUT_OFFSET,
    INPUT_OFFSET_HEADER,
    PENDING_INPUT_OFFSET,
    STREAM_TIME,
    STREAM_TIME_HEADER,
    WRITTEN_MS,
    PartitionStore,
    encode_state,
)
from millpond.services.worker.task import (
    AggregateSlice,
    AggregationTask,
    BadRecord,
    BatchSlice,
    MaterializeSlice,
    ProjectionTask,
    ProjectSlice,
    SessionAggregationTask,
    SessionSlice,
    TableTask,
    Task,
    WindowedAggregationTask,
    WindowSlice,
    aggregate_rows,
    group_rows,
)
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.serde import encode_key, session_key, windowed_key
from millpond.shared.kafka.values import value_decoder
from millpond.shared.sql import aggregates
from millpond.shared.sql.parser import parse_statement
from tests.metastores import applied
from tests.unit.services.worker.fake_changelog import Changelog, FakeConsumer

STATEMENTS = [
    "CREATE STREAM r (sensor VARCHAR KEY, area VARCHAR, reading INT) WITH (kafka_topic='r', partitions=2, value_format='json')",
    "CREATE TABLE t AS SELECT sensor, COUNT(*) AS n, SUM(reading) AS total, AVG(reading) AS mean FROM r GROUP BY sensor",
    "CREATE STREAM hot AS SELECT sensor, area, reading * 2 AS doubled FROM r WHERE reading > 10",
    "CREATE TABLE s (id VARCHAR PRIMARY KEY, name VARCHAR, size INT) WITH (kafka_topic='s', partitions=2, value_format='json')",
    "CREATE TABLE w AS SELECT sensor, COUNT(*) AS n FROM r "
    "WINDOW TUMBLING (SIZE 10 MILLISECONDS, RETENTION 30 MILLISECONDS, GRACE PERIOD 5 MILLISECONDS) GROUP BY sensor",
    "CREATE TABLE wf AS SELECT sensor, COUNT(*) AS n FROM r "
    "WINDOW TUMBLING (SIZE 10 MILLISECONDS, RETENTION 30 MILLISECONDS, GRACE PERIOD 5 MILLISECONDS) GROUP BY sensor "
    "EMIT FINAL",
    "CREATE TABLE ss AS SELECT sensor, COUNT(*) AS n, SUM(reading) AS total FROM r "
    "WINDOW SESSION (10 MILLISECONDS, GRACE PERIOD 5 MILLISECONDS) GROUP BY sensor",
    "CREATE TABLE sb AS SELECT sensor, COUNT(*) AS n, SUM(reading) AS total FROM r WINDOW SESSION (10 MILLISECONDS) "
    "GROUP BY sensor",
    "CREATE TABLE keys AS SELECT sensor FROM r "
    "WINDOW TUMBLING (SIZE 10 MILLISECONDS, RETENTION 30 MILLISECONDS, GRACE PERIOD 5 MILLISECONDS) GROUP BY sensor "
    "EMIT FINAL",
    "CREATE STREAM named AS SELECT r.sensor, r.reading, s.name FROM r LEFT JOIN s ON r.sensor = s.id",
    "CREATE TABLE st (id VARCHAR PRIMARY KEY, name VARCHAR, at BIGINT) "
    "WITH (kafka_topic='st', partitions=2, value_format='json', timestamp='at')",
    "CREATE STREAM named_at AS SELECT r.sensor, r.reading, st.name FROM r LEFT JOIN st ON r.sensor = st.id",
    "CREATE TABLE sts (id VARCHAR PRIMARY KEY, at TIMESTAMP) WITH (kafka_topic='sts', partitions=2, value_format='json', "
    "timestamp='at')",
    "CREATE TABLE wp AS SELECT sensor, n FROM w WHERE n > 1",
    "CREATE TABLE sp AS SELECT sensor, n FROM ss",
]
NO_KEY = BadRecord(4, "record has no key", '{"AREA": "a", "READING": 1}')


def aggregate_slice(last_offset: int, partials: list[tuple[bytes, list[list[Any]]]],
                    bad: Iterable[BadRecord] = ()) -> AggregateSlice:
    """A GROUP BY query's slice: per-key partials of COUNT(*), SUM and AVG."""
    return AggregateSlice(0, last_offset, count=len(partials), partials=partials, bad=list(bad))


def projection_slice(last_offset: int, records: list[tuple[bytes | None, bytes | None]],
                     bad: Iterable[BadRecord] = ()) -> ProjectSlice:
    """A projection's slice: result records in input order."""
    return ProjectSlice(0, last_offset, count=len(records), records=records, bad=list(bad))


def table_slice(last_offset: int, latest: list[tuple[bytes, list[Any] | None]],
                bad: Iterable[BadRecord] = ()) -> MaterializeSlice:
    """A source table's slice: each key's last value columns, None for a tombstone."""
    return MaterializeSlice(0, last_offset, count=len(latest), latest=latest, bad=list(bad))


@dataclass(frozen=True)
class Sent:
    """One record the task produced."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int | None = None
    """The record's timestamp as the task set it (None: the producer stamps it)."""


@dataclass(frozen=True)
class Metadata:
    """What a delivered send resolves to (the part the task reads)."""

    offset: int


class FakeProducer:
    """A transactional producer that records every call in ``log``; ``fail_at`` ("send",
    "offsets" or "commit") makes that step raise as a fenced or failed producer would."""

    def __init__(self, log: list[Any], fail_at: str | None = None):
        self.log = log
        self.fail_at = fail_at
        self.offsets: Counter[tuple[str, int | None]] = Counter()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        self.log.append("begin")
        try:
            yield
        except BaseException:
            self.log.append("abort")
            raise
        if self.fail_at == "commit":
            self.log.append("commit failed")
            raise KafkaError("commit failed")
        self.log.append("commit")

    async def send(self, topic: str, value: bytes | None, key: bytes | None = None, partition: int | None = None,
                   headers: list[tuple[str, bytes]] | None = None,
                   timestamp_ms: int | None = None) -> asyncio.Future[Metadata]:
        if self.fail_at == "send":
            raise KafkaError("fenced")
        offset = self.offsets[(topic, partition)]
        self.offsets[(topic, partition)] += 1
        self.log.append(Sent(topic, key, value, partition, tuple(headers or ()), timestamp_ms))
        future: asyncio.Future[Metadata] = asyncio.get_running_loop().create_future()
        future.set_result(Metadata(offset))
        return future

    async def flush(self) -> None:
        self.log.append("flush")

    async def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int], group: str) -> None:
        if self.fail_at == "offsets":
            raise KafkaError("fenced")
        self.log.append(("offsets", dict(offsets), group))


class RecordingStore(PartitionStore):
    """A real store that also logs each write batch, in the same log as the producer."""

    def __init__(self, path: Path, log: list[Any]):
        super().__init__(path)
        self.log = log

    def write(self, states: Mapping[bytes, bytes], positions: Mapping[bytes, int], deleted: Iterable[bytes] = ()) -> None:
        deleted = list(deleted)
        self.log.append(("store.write", dict(states), dict(positions), deleted))
        super().write(states, positions, deleted)


def make_task(kind: type[Task], query_id: str, tmp_path: Path, log: list[Any], fail_at: str | None = None,
              partition: int = 0) -> Any:
    """A task of ``query_id`` on ``partition``, started by hand: fake producer, real store."""
    meta = applied(STATEMENTS)
    query = meta.queries[query_id]
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)
    task = kind(settings, query, meta.sources[query.source], meta.sources[query.sink], partition)
    task.producer = FakeProducer(log, fail_at)
    if kind is not ProjectionTask:
        task.store = RecordingStore(tmp_path / "store", log)
    return task


def steps(log: list[Any]) -> list[str]:
    """The log as step names: every send is "send"."""
    return ["send" if isinstance(e, Sent) else e if isinstance(e, str) else e[0] for e in log]


def assert_committed_in_order(log: list[Any], store_write: bool) -> None:
    """begin, the sends, their delivery, the input offsets, commit, and (for a store) one
    write batch last."""
    tail = ["flush", "offsets", "commit", "store.write"] if store_write else ["flush", "offsets", "commit"]
    names = steps(log)
    assert names[0] == "begin"
    assert names[-len(tail):] == tail
    assert set(names[1:-len(tail)]) <= {"send"}


async def test_an_aggregation_commits_kafka_first_then_state_and_positions_in_one_write(tmp_path: Path) -> None:
    log: list[Any] = []
    task = make_task(AggregationTask, "CTAS_T_0", tmp_path, log)
    piece = aggregate_slice(5, [(b"s1", [[2], [20], [20, 2]]), (b"s2", [[1], [None], [None, 0]])], [NO_KEY])
    assert await task.commit(piece)

    assert_committed_in_order(log, store_write=True)
    sent = [e for e in log if isinstance(e, Sent)]
    changelog, sink = task.changelog.topic, task.sink.topic
    processing_log = task.settings.processing_log_topic
    assert Counter(s.topic for s in sent) == {changelog: 2, sink: 2, processing_log: 1}
    # The changelog records carry the state and the input position their batch reaches.
    assert {s.key: s.value for s in sent if s.topic == changelog} == {
        b"s1": encode_state([[2], [20], [20, 2]]), b"s2": encode_state([[1], [None], [None, 0]])}
    assert all(s.partition == 0 and s.headers == ((INPUT_OFFSET_HEADER, b"6"),) for s in sent if s.topic == changelog)
    assert {s.key: json.loads(s.value or b"") for s in sent if s.topic == sink} == {
        b"s1": {"N": 2, "TOTAL": 20, "MEAN": 10.0}, b"s2": {"N": 1, "TOTAL": None, "MEAN": None}}
    (bad,) = [json.loads(s.value or b"") for s in sent if s.topic == processing_log]
    assert (bad["SOURCE_PARTITION"], bad["SOURCE_OFFSET"], bad["REASON"]) == (0, 4, "record has no key")
    assert log[-3] == ("offsets", {TopicPartition("r", 0): OffsetAndMetadata(6, "")}, task.group)
    # After the commit: states and both positions in one write batch.
    assert log[-1] == ("store.write", {b"s1": encode_state([[2], [20], [20, 2]]),
                                       b"s2": encode_state([[1], [None], [None, 0]])},
                       {INPUT_OFFSET: 6, CHANGELOG_OFFSET: 2}, [])
    assert task.store.get(b"s1") == [[2], [20], [20, 2]]
    assert (task.store.position(INPUT_OFFSET), task.store.position(CHANGELOG_OFFSET)) == (6, 2)
    assert task.next_input_offset == 6
    task.store.close()


async def test_an_aggregate_row_its_sink_format_cannot_hold_is_logged_and_its_state_kept(tmp_path: Path) -> None:
    """A DELIMITED field holds BYTES only as UTF-8 text: a row whose bytes are not is not
    written to the sink (it wrote Python's repr of them), but to the processing log, in the
    same transaction; the state and the changelog go on as for any row."""
    meta = Metastore()
    for offset, statement in enumerate([
            "CREATE STREAM blobs (id VARCHAR KEY, data BYTES) WITH (kafka_topic='blobs', partitions=1, value_format='json')",
            "CREATE TABLE last_blob WITH (value_format='delimited') AS SELECT id, LATEST_BY_OFFSET(data) AS last "
            "FROM blobs GROUP BY id"]):
        meta.apply(parse_statement(statement), offset)
    (query,) = meta.queries.values()
    log: list[Any] = []
    task = AggregationTask(WorkerSettings(worker_id="w", state_dir=tmp_path), query, meta.sources["BLOBS"],
                           meta.sources["LAST_BLOB"], 0)
    task.producer, task.store = FakeProducer(log), RecordingStore(tmp_path / "store", log)
    assert await task.commit(aggregate_slice(3, [(b"a", [["YSxi", 1]]), (b"b", [["/w==", 3]])]))
    sent = [e for e in log if isinstance(e, Sent)]
    assert [(s.key, s.value) for s in sent if s.topic == task.sink.topic] == [(b"a", b'"a,b"')]
    (bad,) = [json.loads(s.value or b"") for s in sent if s.topic == task.settings.processing_log_topic]
    assert bad["SOURCE_OFFSET"] == 3 and "column LAST holds bytes that are not UTF-8" in bad["REASON"]
    assert task.store.get(b"b") == [["/w==", 3]] and len([s for s in sent if s.topic == task.changelog.topic]) == 2
    task.store.close()


async def test_a_task_expects_to_resume_where_its_store_is_without_asking_kafka(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A promoted standby's store has applied the committed changelog: its input position is
    where the task is expected to resume (its Spark plan is made with it while the task fences
    and restores). A store that has applied nothing asks the group's committed position."""
    asked: list[str] = []

    async def committed_positions(_: Any, group: str, tps: list[TopicPartition]) -> dict[Any, tuple[int, str]]:
        asked.append(group)
        return {tps[0]: (3, "")}
    monkeypatch.setattr(task_module, "committed_positions", committed_positions)
    task = make_task(AggregationTask, "CTAS_T_0", tmp_path, [])
    try:
        assert await task.expected_input_offset() == 3 and asked == [task.group]
        await task.commit(aggregate_slice(5, [(b"s1", [[2], [20], [20, 2]])]))
        assert await task.expected_input_offset() == 6 and len(asked) == 1
    finally:
        task.store.close()


async def test_the_next_batch_merges_into_the_stored_state(tmp_path: Path) -> None:
    log: list[Any] = []
    task = make_task(AggregationTask, "CTAS_T_0", tmp_path, log)
    await task.commit(aggregate_slice(5, [(b"s1", [[2], [20], [20, 2]])]))
    log.clear()
    assert await task.commit(aggregate_slice(9, [(b"s1", [[1], [5], [5, 1]])]))

    assert_committed_in_order(log, store_write=True)
    changelog = [e for e in log if isinstance(e, Sent) and e.topic == task.changelog.topic]
    assert [(s.value, s.headers) for s in changelog] == [(encode_state([[3], [25], [25, 3]]), ((INPUT_OFFSET_HEADER, b"10"),))]
    assert task.store.get(b"s1") == [[3], [25], [25, 3]]
    assert (task.store.position(INPUT_OFFSET), task.store.position(CHANGELOG_OFFSET)) == (10, 2)
    task.store.close()


async def test_an_aggregations_rows_are_stamped_with_the_latest_time_of_their_records(tmp_path: Path) -> None:
    """As Kafka Streams stamps an aggregation's result: the latest timestamp of every record
    merged into the row, kept with its state across batches (an older batch does not set it
    back); a state stored without one takes the batch's."""
    log: list[Any] = []
    task = make_task(AggregationTask, "CTAS_T_0", tmp_path, log)
    task.store.write({b"old": encode_state([[1], [5], [5, 1]])}, {INPUT_OFFSET: 0})  # as stored before states kept it
    first = aggregate_slice(5, [(b"s1", [[2], [20], [20, 2]]), (b"old", [[1], [1], [1, 1]])])
    first.times.update({b"s1": 9_000, b"old": 3_000})
    assert await task.commit(first)
    second = aggregate_slice(9, [(b"s1", [[1], [5], [5, 1]])])
    second.times[b"s1"] = 4_000  # out of order: the row keeps 9,000
    assert await task.commit(second)
    stamped = [(e.key, e.timestamp) for e in log if isinstance(e, Sent) and e.topic == task.sink.topic]
    assert stamped == [(b"s1", 9_000), (b"old", 3_000), (b"s1", 9_000)]
    assert task.store.get(b"s1") == [[3], [25], [25, 3], 9_000]
    assert task.store.get(b"old") == [[2], [6], [6, 2], 3_000]
    assert task.row(b"s1", task.store.get(b"s1")) == ["s1", 3, 25, 25 / 3]
    task.store.close()


@pytest.mark.parametrize("kind, query_id, piece", [
    (AggregationTask, "CTAS_T_0", aggregate_slice(5, [(b"s1", [[1], [7], [7, 1]])])),
    (ProjectionTask, "CSAS_HOT_1", projection_slice(5, [(b"s1", b"{}")])),
    (TableTask, "CST_S_2", table_slice(5, [(b"a", ["x", 1])])),
])
async def test_a_replayed_batch_is_skipped(kind: type[Task], query_id: str, piece: BatchSlice, tmp_path: Path) -> None:
    log: list[Any] = []
    task = make_task(kind, query_id, tmp_path, log)
    task.next_input_offset = 6  # the store (or the group) already reflects offsets up to 5
    assert not await task.commit(piece)
    assert log == []
    assert task.next_input_offset == 6
    if task.store is not None:
        task.store.close()


@pytest.mark.parametrize("fail_at", ["send", "offsets", "commit"])
async def test_a_failed_transaction_leaves_the_store_and_the_position_as_they_were(fail_at: str, tmp_path: Path) -> None:
    log: list[Any] = []
    task = make_task(AggregationTask, "CTAS_T_0", tmp_path, log)
    await task.commit(aggregate_slice(5, [(b"s1", [[2], [20], [20, 2]])]))
    task.producer.fail_at = fail_at
    log.clear()

    with pytest.raises(KafkaError):
        await task.commit(aggregate_slice(9, [(b"s1", [[1], [5], [5, 1]]), (b"s2", [[1], [1], [1, 1]])]))
    assert "store.write" not in steps(log)
    assert steps(log)[-1] == ("commit failed" if fail_at == "commit" else "abort")
    assert task.store.get(b"s1") == [[2], [20], [20, 2]]
    assert task.store.get(b"s2") is None
    assert (task.store.position(INPUT_OFFSET), task.store.position(CHANGELOG_OFFSET)) == (6, 1)
    assert task.next_input_offset == 6
    task.store.close()


@pytest.mark.parametrize(("error", "fenced"), [(ProducerFenced(), True), (InvalidProducerEpoch(), True),
                                               (KafkaError("the broker went away"), False)])
async def test_a_transaction_that_another_producer_fenced_marks_its_task_fenced(
        error: Exception, fenced: bool, tmp_path: Path) -> None:
    """What the supervisor waits on before it restarts the task (``FENCED_RETRY_S``)."""
    log: list[Any] = []
    task = make_task(AggregationTask, "CTAS_T_0", tmp_path, log)

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise error

    task.producer.send_offsets_to_transaction = refused
    with pytest.raises(type(error)):
        await task.commit(aggregate_slice(5, [(b"s1", [[2], [20], [20, 2]])]))
    assert task.fenced is fenced
    task.store.close()


async def test_a_projection_sends_its_records_in_order_then_the_offsets(tmp_path: Path) -> None:
    log: list[Any] = []
    task = make_task(ProjectionTask, "CSAS_HOT_1", tmp_path, log, partition=1)
    records: list[tuple[bytes | None, bytes | None]] = [(b"s2", b'{"AREA":"a","DOUBLED":40}'), (b"s1", b'{"AREA":"b","DOUBLED":22}'),
                                                        (b"s2", b'{"AREA":"a","DOUBLED":24}')]
    assert await task.commit(projection_slice(12, records, [NO_KEY]))

    assert_committed_in_order(log, store_write=False)
    sent = [e for e in log if isinstance(e, Sent)]
    assert [(s.key, s.value, s.partition) for s in sent if s.topic == task.sink.topic] == [(k, v, 1) for k, v in records]
    assert [s.topic for s in sent].count(task.settings.processing_log_topic) == 1
    assert log[-2] == ("offsets", {TopicPartition("r", 1): OffsetAndMetadata(13, "")}, task.group)
    assert task.next_input_offset == 13


async def test_a_source_table_writes_rows_deletions_and_its_input_position_after_the_commit(tmp_path: Path) -> None:
    log: list[Any] = []
    task = make_task(TableTask, "CST_S_2", tmp_path, log)
    task.store.write({b"b": encode_state(["old", 0])}, {INPUT_OFFSET: 3})
    log.clear()
    task.next_input_offset = 3
    assert await task.commit(table_slice(7, [(b"a", ["x", 1]), (b"b", None)], [NO_KEY]))

    assert_committed_in_order(log, store_write=True)
    assert [e.topic for e in log if isinstance(e, Sent)] == [task.settings.processing_log_topic]
    name, rows, positions, deleted = log[-1]
    # With when it was brought up to date: a store kept past its topic's tombstones is built again.
    assert (name, rows, deleted) == ("store.write", {b"a": encode_state(["x", 1])}, [b"b"])
    assert positions[INPUT_OFFSET] == 8 and abs(positions[WRITTEN_MS] - time.time() * 1000) < 60_000
    assert dict(task.store.items()) == {b"a": ["x", 1]}
    assert task.store.position(INPUT_OFFSET) == 8
    task.store.close()


async def restore(task: AggregationTask) -> None:
    """The task's restore, as its start runs it."""
    reader = task._changelog_reader()
    await reader.start()
    try:
        await task._restore(reader)
    finally:
        await reader.stop()


def two_transactions(changelog: Changelog) -> None:
    """10's records at offsets 0-2 (marker 3), 20's at 4-6 (marker 7): the end is 8."""
    changelog.commit_batch({b"s1": [[1], [1], [1, 1]], b"s2": [[1], [2], [2, 1]], b"s3": [[1], [3], [3, 1]]}, reaches=10)
    changelog.commit_batch({b"s1": [[2], [5], [5, 2]], b"s2": [[2], [4], [4, 2]], b"s4": [[1], [1], [1, 1]]}, reaches=20)


async def test_a_restore_stores_an_input_offset_only_once_its_whole_transaction_is_applied(
        changelog: Changelog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    two_transactions(changelog)
    monkeypatch.setattr(FakeConsumer, "markers_apart", True)  # each answer ends before a marker
    log: list[Any] = []
    task = make_task(AggregationTask, "CTAS_T_0", tmp_path, log)
    seen: list[int | None] = []  # the stored input offset as each fetch begins
    monkeypatch.setattr(FakeConsumer, "observe", lambda: seen.append(task.store.position(INPUT_OFFSET)))
    await restore(task)  # two records a fetch: [0, 1], [2, 4], [5, 6], then nothing but the marker

    assert seen == [None, None, 10, 10]
    written = [positions for step, _, positions, _ in log if step == "store.write"]
    assert [w.get(INPUT_OFFSET) for w in written] == [None, 10, 10, 20]  # the last: the fetch reached the end
    assert [w.get(PENDING_INPUT_OFFSET) for w in written] == [10, 20, 20, None]
    assert task.store.position(INPUT_OFFSET) == 20 and task.store.position(CHANGELOG_OFFSET) == 7
    assert task.restored_records == 6 and task.changelog_position == 7 and task.changelog_end == 8
    assert dict(task.store.items())[b"s1"] == [[2], [5], [5, 2]]
    task.store.close()


@pytest.mark.parametrize("crash_at, restored_after", [(3, 2), (4, 0)])
async def test_a_restore_cut_mid_transaction_resumes_with_the_complete_input_offset(
        crash_at: int, restored_after: int, changelog: Changelog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut as fetch 3 begins (20's record 4 applied, 5 and 6 not) or as fetch 4 begins (all of 20
    applied, its end not yet seen): the next restore starts from 10 and ends at 20."""
    two_transactions(changelog)
    monkeypatch.setattr(FakeConsumer, "markers_apart", True)  # each answer ends before a marker
    task = make_task(AggregationTask, "CTAS_T_0", tmp_path, [])
    fetches = 0

    def crash() -> None:
        nonlocal fetches
        fetches += 1
        if fetches == crash_at:
            raise RuntimeError("the worker dies")
    monkeypatch.setattr(FakeConsumer, "observe", crash)
    with pytest.raises(RuntimeError):
        await restore(task)
    assert task.store.position(INPUT_OFFSET) == 10
    task.store.close()

    again = make_task(AggregationTask, "CTAS_T_0", tmp_path, [])
    seen: list[int | None] = []
    monkeypatch.setattr(FakeConsumer, "observe", lambda: seen.append(again.store.position(INPUT_OFFSET)))
    await restore(again)
    assert FakeConsumer.seeks == [0, 5 if crash_at == 3 else 7]
    assert again.restored_records == restored_after
    assert set(seen) == {10} and again.store.position(INPUT_OFFSET) == 20
    assert dict(again.store.items()) == {b"s1": [[2], [5], [5, 2]], b"s2": [[2], [4], [4, 2]], b"s3": [[1], [3], [3, 1]],
                                         b"s4": [[1], [1], [1, 1]]}
    again.store.close()


def test_a_group_by_row_is_its_decoded_key_and_each_finalized_aggregate() -> None:
    meta = Metastore()
    for offset, statement in enumerate((
            "CREATE STREAM r (id INT KEY, name VARCHAR, v INT) WITH (kafka_topic='r', partitions=1, value_format='json')",
            "CREATE TABLE by_id AS SELECT id, COUNT(*) AS n, AVG(v) AS a FROM r GROUP BY id",
            "CREATE TABLE by_name AS SELECT name, SUM(v) AS s FROM r GROUP BY name")):
        meta.apply(parse_statement(statement), offset)
    avg, count, total = (aggregates.require(f) for f in ("AVG", "COUNT", "SUM"))
    by_id = aggregate_rows(meta.source("BY_ID"), [count, avg])
    assert by_id((7).to_bytes(4, "big"), [[3], [9.0, 3]]) == [7, 3, 3.0]
    assert by_id((-2).to_bytes(4, "big", signed=True), [[0], [0, 0]]) == [-2, 0, None]
    assert aggregate_rows(meta.source("BY_NAME"), [total])("né".encode(), [[5]]) == ["né", 5]
    with pytest.raises(ValueError):  # a state that does not match the aggregates is an error, not a short row
        by_id(b"\x00\x00\x00\x01", [[3]])


def test_a_group_by_row_computes_its_expressions_over_aggregates_including_those_no_column_selects() -> None:
    """``SUM(v) / COUNT(*)``, ``ROUND(AVG(v), 2)`` and the like are evaluated over the row's
    aggregates (those no column selects kept apart in the state, ``KSQL_AGG_VARIABLE_<n>``) and
    its GROUP BY columns, their INT arithmetic wrapping as Spark's; a windowed row's bounds are
    there too, and a HAVING sees the computed columns."""
    meta = Metastore()
    for offset, statement in enumerate((
            "CREATE STREAM r (id INT KEY, name VARCHAR, v INT) WITH (kafka_topic='r', partitions=1, value_format='json')",
            "CREATE TABLE t AS SELECT id, COUNT(*) AS n, SUM(v) / COUNT(*) AS mean, ROUND(AVG(v), 2) AS avg2, "
            "COUNT(*) * 2 + id AS odd, CONCAT(CAST(id AS VARCHAR), ':', CAST(MAX(v) AS VARCHAR)) AS tag, "
            "MAX(v) * 2 AS doubled FROM r GROUP BY id HAVING COUNT(*) > 1",
            "CREATE TABLE w AS SELECT id, WINDOWSTART AS ws, MAX(v) - MIN(v) AS spread, (WINDOWEND - WINDOWSTART) / COUNT(*) AS per "
            "FROM r WINDOW TUMBLING (SIZE 10 SECONDS) GROUP BY id")):
        meta.apply(parse_statement(statement), offset)
    t, w = (next(q for q in meta.queries.values() if q.sink == name) for name in ("T", "W"))
    assert [a.column for a in t.plan.aggregates] == ["N", "KSQL_AGG_VARIABLE_0", "KSQL_AGG_VARIABLE_1", "KSQL_AGG_VARIABLE_2"]
    assert [c.name for c in meta.source("T").columns] == ["ID", "N", "MEAN", "AVG2", "ODD", "TAG", "DOUBLED"]
    row = group_rows(t, meta.source("T"))
    key = (7).to_bytes(4, "big")
    # COUNT 3, SUM 10, AVG (10, 3), MAX 2^30 + 1: the mean truncates, MAX * 2 wraps at 32 bits.
    assert row(key, [[3], [10], [10.0, 3], [2**30 + 1]]) == [7, 3, 3, 3.33, 13, f"7:{2**30 + 1}", -(2**31) + 2]
    assert row(key, [[1], [10], [10.0, 1], [10]]) is None  # HAVING COUNT(*) > 1
    assert row(key, [[2], [None], [0.0, 0], [None]]) == [7, 2, None, None, 11, None, None]
    windowed = group_rows(w, meta.source("W"))
    start = 1_700_000_000_000
    assert windowed(key + start.to_bytes(8, "big"), [[9], [4], [4]]) == [7, start, start + 10_000, start, 5, 2_500]


def test_a_having_over_aggregates_no_column_selects_keeps_them_apart_in_the_state() -> None:
    """``HAVING COUNT(*) > 1`` where the SELECT list has no COUNT(*) (ksqlDB takes it): the
    count is kept in the state beside the selected aggregates, not in the table; the row
    passes by it."""
    meta = Metastore()
    for offset, statement in enumerate((
            "CREATE STREAM r (id INT KEY, v INT) WITH (kafka_topic='r', partitions=1, value_format='json')",
            "CREATE TABLE t AS SELECT id, MAX(v) AS top FROM r GROUP BY id HAVING COUNT(*) > 1 AND MIN(v) >= 0")):
        meta.apply(parse_statement(statement), offset)
    query = next(q for q in meta.queries.values() if q.sink == "T")
    assert [(a.column, a.function) for a in query.plan.aggregates] == [
        ("TOP", "MAX"), ("KSQL_AGG_VARIABLE_0", "COUNT"), ("KSQL_AGG_VARIABLE_1", "MIN")]
    assert [c.name for c in meta.source("T").columns] == ["ID", "TOP"]
    row, key = group_rows(query, meta.source("T")), (3).to_bytes(4, "big")
    assert row(key, [[9], [2], [1]]) == [3, 9]
    assert row(key, [[9], [1], [1]]) is None and row(key, [[9], [2], [-1]]) is None


def test_expressions_over_aggregates_tell_the_sides_of_a_join_apart_and_keep_the_names_the_result_uses() -> None:
    """Over a join, SUM(o.amount) and SUM(p.amount) are two aggregates (the worker read the
    statement, where a column's qualifier does not count: the difference was 0; it reads the
    aggregation over the joined row, as the planner does), and a HAVING over one is not the
    other's; a name the SELECT list gives (twice-selected aggregates too) is never the name an
    aggregate held apart takes."""
    meta = Metastore()
    for offset, statement in enumerate((
            "CREATE STREAM orders (id VARCHAR KEY, pid VARCHAR, amount INT) WITH (kafka_topic='o', partitions=2, "
            "value_format='json')",
            "CREATE TABLE products (pid VARCHAR PRIMARY KEY, amount INT) WITH (kafka_topic='p', partitions=2, "
            "value_format='json')",
            "CREATE TABLE t AS SELECT o.pid, SUM(o.amount) AS a, SUM(p.amount) AS b, SUM(o.amount) - SUM(p.amount) AS diff "
            "FROM orders o JOIN products p ON o.pid = p.pid GROUP BY o.pid HAVING MAX(o.amount) > 1",
            "CREATE STREAM r (id INT KEY, v INT) WITH (kafka_topic='r', partitions=1, value_format='json')",
            "CREATE TABLE u AS SELECT id, SUM(v) AS KSQL_AGG_VARIABLE_0, SUM(v) AS s2, MAX(v) + 1 AS x FROM r GROUP BY id")):
        meta.apply(parse_statement(statement), offset)
    t, u = (next(q for q in meta.queries.values() if q.sink == name) for name in ("T", "U"))
    assert [(a.column, a.argument) for a in t.plan.aggregates] == [("A", "`O_AMOUNT`"), ("B", "`P_AMOUNT`"),
                                                                   ("KSQL_AGG_VARIABLE_0", "`O_AMOUNT`")]
    row = group_rows(t, meta.source("T"))
    assert row(b"k", [[10], [3], [4]]) == ["k", 10, 3, 7]
    assert row(b"k", [[10], [3], [1]]) is None  # MAX(o.amount) is 1
    assert [a.column for a in u.plan.aggregates] == ["KSQL_AGG_VARIABLE_0", "S2", "KSQL_AGG_VARIABLE_1"]
    assert group_rows(u, meta.source("U"))((1).to_bytes(4, "big"), [[10], [10], [3]]) == [1, 10, 10, 4]


def test_a_having_over_integers_wraps_as_javas_arithmetic() -> None:
    """HAVING runs in Python over the result's row: its INT arithmetic wraps at 32 bits, as
    Spark's and ksqlDB's Java does (2^30 + 1 doubled is negative), and ABS of the least INT is
    itself; unwrapped, both rows passed."""
    meta = Metastore()
    for offset, statement in enumerate((
            "CREATE STREAM r (id INT KEY, v INT) WITH (kafka_topic='r', partitions=1, value_format='json')",
            "CREATE TABLE doubled AS SELECT id, SUM(v) AS s FROM r GROUP BY id HAVING SUM(v) * 2 > 0",
            "CREATE TABLE least AS SELECT id, MIN(v) AS m FROM r GROUP BY id HAVING ABS(MIN(v)) >= 0")):
        meta.apply(parse_statement(statement), offset)
    doubled, least = (next(q for q in meta.queries.values() if q.sink == name) for name in ("DOUBLED", "LEAST"))
    key = (1).to_bytes(4, "big")
    assert group_rows(doubled, meta.source("DOUBLED"))(key, [[2**30 + 1]]) is None
    assert group_rows(doubled, meta.source("DOUBLED"))(key, [[2**30 - 1]]) == [1, 2**30 - 1]
    assert group_rows(least, meta.source("LEAST"))(key, [[-(2**31)]]) is None
    assert group_rows(least, meta.source("LEAST"))(key, [[-5]]) == [1, -5]


def test_a_row_keyed_by_several_columns_decodes_each_from_its_json_key() -> None:
    meta = Metastore()
    for offset, statement in enumerate((
            "CREATE STREAM r (id INT KEY, name VARCHAR, v INT) WITH (kafka_topic='r', partitions=1, value_format='json')",
            "CREATE TABLE by_both AS SELECT name, id, COUNT(*) AS n FROM r GROUP BY id, name",
            "CREATE TABLE by_minute AS SELECT name, id, COUNT(*) AS n FROM r WINDOW TUMBLING (SIZE 1 MINUTE) "
            "GROUP BY id, name")):
        meta.apply(parse_statement(statement), offset)
    count = aggregates.require("COUNT")
    key = encode_key(["né", 7], meta.source("BY_BOTH").key_columns)
    assert key == '{"NAME":"né","ID":7}'.encode()
    assert aggregate_rows(meta.source("BY_BOTH"), [count])(key, [[3]]) == ["né", 7, 3]
    windowed = meta.source("BY_MINUTE")
    assert [c.name for c in windowed.row_columns] == ["NAME", "ID", "WINDOWSTART", "WINDOWEND", "N"]
    assert aggregate_rows(windowed, [count])(windowed_key(key, 120_000), [[2]]) == ["né", 7, 120_000, 180_000, 2]
    with pytest.raises(ValueError):  # a key that is not the JSON object of its columns
        aggregate_rows(meta.source("BY_BOTH"), [count])(b"[1, 2]", [[3]])


async def test_a_windowed_aggregation_keeps_stream_time_drops_late_records_and_lets_old_windows_go(
        tmp_path: Path) -> None:
    """Windows of 10 ms kept 30 ms: the stream time rides on every changelog record and in the
    store; late records go to the processing log; a window whose start is 30 ms or more behind
    stream time leaves the store and gets a changelog tombstone, even one the same batch
    updated (its update still reaches the sink); a slice reduced against another stream time
    is refused."""

    log: list[Any] = []
    task = make_task(WindowedAggregationTask, "CTAS_W_3", tmp_path, log)
    late = BadRecord(3, "late: its TUMBLING window [0, 10) closed at stream time 25", '{"READING": 1}')
    first = WindowSlice(0, 5, count=5, partials=[(windowed_key(b"s1", 0), [[2]]), (windowed_key(b"s1", 10), [[1]]),
                                                 (windowed_key(b"s1", 20), [[1]])],
                        reduced_at=-1, stream_time=25, late=[late])
    assert await task.commit(first)
    sent = [e for e in log if isinstance(e, Sent)]
    changelog, sink = task.changelog.topic, task.sink.topic
    assert all(e.headers == ((INPUT_OFFSET_HEADER, b"6"), (STREAM_TIME_HEADER, b"25")) for e in sent if e.topic == changelog)
    (logged,) = [json.loads(e.value or b"") for e in sent if e.topic == task.settings.processing_log_topic]
    assert (logged["SOURCE_OFFSET"], logged["REASON"]) == (3, late.reason)
    assert (task.stream_time, task.store.position(STREAM_TIME)) == (25, 25)
    assert task.row(windowed_key(b"s1", 10), [[1]]) == ["s1", 10, 20, 1]

    with pytest.raises(MillpondError, match="reduced at stream time 7"):
        await task.commit(WindowSlice(6, 7, count=1, reduced_at=7, stream_time=30))

    log.clear()
    second = WindowSlice(6, 9, count=2, partials=[(windowed_key(b"s1", 40), [[1]]), (windowed_key(b"s1", 20), [[1]])],
                         reduced_at=25, stream_time=50)
    assert await task.commit(second)
    sent = [e for e in log if isinstance(e, Sent)]
    assert {e.key: e.value for e in sent if e.topic == changelog} == {
        windowed_key(b"s1", 40): encode_state([[1]]), windowed_key(b"s1", 0): None, windowed_key(b"s1", 10): None,
        windowed_key(b"s1", 20): None}
    assert {e.key: json.loads(e.value or b"") for e in sent if e.topic == sink} == {
        windowed_key(b"s1", 40): {"N": 1}, windowed_key(b"s1", 20): {"N": 2}}
    assert [key for key, _ in task.store.items()] == [windowed_key(b"s1", 40)]
    assert (task.stream_time, task.store.position(STREAM_TIME)) == (50, 50)
    task.store.close()


async def test_emit_final_sends_each_window_once_when_stream_time_closes_it_even_after_a_restart(
        tmp_path: Path) -> None:
    """EMIT FINAL over windows of 10 ms with 5 ms of grace: nothing reaches the sink while a
    window is open; the commit whose stream time reaches its end plus grace sends its final
    row, once; a task restarted on the same store (its stream time from the store) sends no
    window again."""
    log: list[Any] = []
    task = make_task(WindowedAggregationTask, "CTAS_WF_4", tmp_path, log)

    async def commit(last: int, partials: list[tuple[bytes, list[list[Any]]]], stream_time: int) -> dict[bytes, Any]:
        log.clear()
        piece = WindowSlice(last, last, count=1, partials=partials, reduced_at=task.stream_time, stream_time=stream_time)
        assert await task.commit(piece)
        return {e.key: json.loads(e.value or b"") for e in log if isinstance(e, Sent) and e.topic == task.sink.topic}

    assert await commit(0, [(windowed_key(b"s1", 0), [[2]]), (windowed_key(b"s1", 10), [[1]])], 14) == {}
    assert await commit(1, [(windowed_key(b"s1", 10), [[1]])], 16) == {windowed_key(b"s1", 0): {"N": 2}}
    assert await commit(2, [(windowed_key(b"s2", 20), [[1]])], 40) == {
        windowed_key(b"s1", 10): {"N": 2}, windowed_key(b"s2", 20): {"N": 1}}
    task.store.close()

    task = make_task(WindowedAggregationTask, "CTAS_WF_4", tmp_path, log)
    task.stream_time = task.store.position(STREAM_TIME)
    assert task.stream_time == 40
    assert await commit(3, [(windowed_key(b"s2", 30), [[1]])], 41) == {}
    assert await commit(4, [], 45) == {windowed_key(b"s2", 30): {"N": 1}}
    task.store.close()


def session_rows(task: Any) -> dict[tuple[str, int, int], list[Any]]:
    """The task's stored sessions as (key, start, end) -> [COUNT, SUM]."""
    return {tuple(row[:3]): row[3:] for row in (task.row(k, state) for k, state in task.store.items())}


async def test_sessions_merge_when_a_record_bridges_them_and_the_merged_away_ones_are_tombstoned(
        tmp_path: Path) -> None:
    log: list[Any] = []
    task = make_task(SessionAggregationTask, "CTAS_SB_6", tmp_path, log)
    one = [[1], [1]]
    records = [(0, b"a", 30, [[1], [3]]), (1, b"a", 50, [[1], [5]]), (2, b"b", 45, one)]
    assert await task.commit(SessionSlice(0, 2, count=3, records=records))
    assert session_rows(task) == {("a", 30, 30): [1, 3], ("a", 50, 50): [1, 5], ("b", 45, 45): [1, 1]}
    log.clear()
    # 40 is within 10 ms of both of a's sessions: they merge with it into [30, 50].
    assert await task.commit(SessionSlice(3, 3, count=1, records=[(3, b"a", 40, [[1], [4]])]))
    assert session_rows(task) == {("a", 30, 50): [3, 12], ("b", 45, 45): [1, 1]}
    sink = {e.key: (e.value, e.timestamp) for e in log if isinstance(e, Sent) and e.topic == task.sink.topic}
    # Stamped as Kafka Streams stamps them: a session with its end, the ones merged away with the record's time.
    assert sink == {session_key(b"a", 30, 30): (None, 40), session_key(b"a", 50, 50): (None, 40),
                    session_key(b"a", 30, 50): (b'{"N":3,"TOTAL":12}', 50)}
    changelog = {e.key: e.value for e in log if isinstance(e, Sent) and e.topic == task.changelog.topic}
    assert changelog[session_key(b"a", 30, 30)] is None and changelog[session_key(b"a", 30, 50)] is not None
    task.store.close()


async def test_a_record_whose_merged_session_ended_before_stream_time_minus_grace_is_late(tmp_path: Path) -> None:
    log: list[Any] = []
    task = make_task(SessionAggregationTask, "CTAS_SS_5", tmp_path, log)
    one = [[1], [1]]
    assert await task.commit(SessionSlice(0, 3, count=4, records=[
        (0, b"a", 0, one), (1, b"a", 100, one),
        (2, b"a", 20, one),   # its session [20, 20] ended before 100 - 5: late
        (3, b"a", 96, one),   # joins [100, 100]: [96, 100] is not late
    ]))
    assert session_rows(task) == {("a", 0, 0): [1, 1], ("a", 96, 100): [2, 2]}
    (late,) = [json.loads(e.value or b"") for e in log if isinstance(e, Sent)
               and e.topic == task.settings.processing_log_topic]
    assert late["SOURCE_OFFSET"] == 2 and late["REASON"].startswith("late: its session [20, 20] closed at stream time 100")
    assert task.store.position(STREAM_TIME) == 100
    task.store.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(times=st.lists(st.tuples(st.sampled_from([b"a", b"b"]), st.integers(0, 200)), min_size=1, max_size=40),
       cuts=st.lists(st.integers(0, 40), max_size=5))
def test_sessions_are_the_runs_of_records_within_the_gap_whatever_their_order_and_batches(
        tmp_path_factory: pytest.TempPathFactory, times: list[tuple[bytes, int]], cuts: list[int]) -> None:
    """With no record late (a day of grace), a key's sessions are the runs of its event times,
    sorted, split where two neighbours are more than the gap (10 ms) apart: whatever order the
    records come in and however the batches are cut."""
    tmp_path = tmp_path_factory.mktemp("sessions")
    expected: dict[tuple[str, int, int], list[Any]] = {}
    for key in {k for k, _ in times}:
        run: list[int] = []
        for t in [*sorted(t for k, t in times if k == key), 10**9]:
            if run and t - run[-1] > 10:
                expected[(key.decode(), run[0], run[-1])] = [len(run), sum(run)]
                run = []
            run.append(t)

    async def go() -> dict[tuple[str, int, int], list[Any]]:
        log: list[Any] = []
        task = make_task(SessionAggregationTask, "CTAS_SB_6", tmp_path, log)
        records = [(i, key, t, [[1], [t]]) for i, (key, t) in enumerate(times)]
        bounds = sorted({0, len(records), *(c % (len(records) + 1) for c in cuts)})
        for a, b in pairwise(bounds):
            if b > a:
                assert await task.commit(SessionSlice(a, b - 1, count=b - a, records=records[a:b]))
        rows = session_rows(task)
        # The sink's last record per session key: each live session's row; a merged-away one's tombstone.
        last = {e.key: e.value for e in log if isinstance(e, Sent) and e.topic == task.sink.topic}
        live = {k for k, v in last.items() if v is not None}
        assert live == {k for k, _ in task.store.items()}
        task.store.close()
        return rows

    assert asyncio.run(go()) == expected


async def test_emit_final_of_a_table_without_aggregates_emits_a_window_opened_and_closed_in_one_batch(
        tmp_path: Path) -> None:
    """A window's state is an empty list when the table has no aggregate: still a window."""
    log: list[Any] = []
    task = make_task(WindowedAggregationTask, "CTAS_KEYS_7", tmp_path, log)
    piece = WindowSlice(0, 1, count=2, partials=[(windowed_key(b"s1", 0), []), (windowed_key(b"s1", 20), [])],
                        reduced_at=-1, stream_time=29)
    assert await task.commit(piece)
    assert [e.key for e in log if isinstance(e, Sent) and e.topic == task.sink.topic] == [windowed_key(b"s1", 0)]
    task.store.close()


def test_a_windowed_row_places_selected_window_bounds_among_its_values() -> None:
    meta = Metastore()
    meta.apply(parse_statement(STATEMENTS[0]), 0)
    meta.apply(parse_statement("CREATE TABLE b AS SELECT sensor, WINDOWEND AS we, COUNT(*) AS n, WINDOWSTART AS ws "
                               "FROM r WINDOW TUMBLING (SIZE 10 MILLISECONDS) GROUP BY sensor"), 1)
    (query,) = meta.queries.values()
    row = aggregate_rows(meta.source("B"), [aggregates.require("COUNT")], query.plan.columns)
    # Key, the pseudo-columns WINDOWSTART and WINDOWEND, then the values in the SELECT's order.
    assert row(windowed_key(b"s1", 20), [[3]]) == ["s1", 20, 30, 30, 3, 20]
    assert [c.name for c in meta.source("B").row_columns] == ["SENSOR", "WINDOWSTART", "WINDOWEND", "WE", "N", "WS"]


def test_commit_metadata_of_either_form_gives_a_stream_table_joins_table_offsets() -> None:
    assert committed_table_offsets('{"tables":[4,9],"ends":[3]}') == [4, 9]
    assert committed_table_offsets("[4,9]") == [4, 9]  # as versions before the output positions wrote it
    assert committed_table_offsets("") is None
    assert committed_table_offsets("{broken") is None
    assert committed_table_offsets('{"ends":[3]}') is None


def join_task(tmp_path: Path, log: list[Any], sink: str = "NAMED") -> JoinTask:
    """The task of the stream-table join into ``sink``, on partition 0."""
    meta = applied(STATEMENTS)
    query_id = next(q.query_id for q in meta.queries.values() if q.sink == sink)
    task: JoinTask = make_task(JoinTask, query_id, tmp_path, log)
    return task


class _Fetching:
    """A join's table consumer, always with a fetch in flight: asking it the end offsets
    would wait behind that fetch."""

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        raise AssertionError("end offsets asked on the fetching consumer")


class _Ends:
    """The consumer that only asks end offsets."""

    def __init__(self, ends: dict[TopicPartition, int]):
        self.ends = ends
        self.asked = 0

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        self.asked += 1
        return {tp: self.ends[tp] for tp in partitions}


async def test_a_join_asks_its_tables_end_offsets_on_a_consumer_that_does_not_fetch(tmp_path: Path) -> None:
    """Each commit reads the tables up to their ends first; the ends come from a consumer
    of their own (the table consumer may have a fetch in flight, which the broker holds while
    the table is quiet: a commit would wait for it)."""
    log: list[Any] = []
    task = join_task(tmp_path, log)
    (side,) = task.sides
    side.fetched_to = 3  # the table read up to its end already
    task.consumer, task._table_ends = _Fetching(), _Ends({side.input: 3})
    for offset in (0, 1):  # batch after batch
        assert await task.commit(JoinSlice(offset, offset, count=1, records=[(offset, b'"s1"', 1000, ["s1", "a", 5])]))
    assert task._table_ends.asked == 2 and steps(log).count("commit") == 2


@dataclass(frozen=True)
class _TableRecord:
    offset: int
    timestamp: int
    key: bytes
    value: bytes


class _TableConsumer:
    """A join's table consumer that fails a fetch of a paused partition, as the real one
    returns nothing for it: the task must resume what it reads."""

    def __init__(self, tp: TopicPartition, records: list[_TableRecord]):
        self.tp, self.records = tp, records
        self.paused = {tp}  # as ``start`` leaves it
        self.fetched = 0

    def resume(self, *partitions: TopicPartition) -> None:
        self.paused -= set(partitions)

    def pause(self, *partitions: TopicPartition) -> None:
        self.paused |= set(partitions)

    async def getmany(self, tp: TopicPartition, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[_TableRecord]]:
        assert tp not in self.paused, "a paused partition fetched"
        records, self.records = self.records, []
        self.fetched += len(records)
        return {tp: records} if records else {}

    async def position(self, tp: TopicPartition) -> int:
        return 1 + max((r.offset for r in self.records), default=self.fetched - 1)


async def test_a_joins_table_partition_is_fetched_only_while_a_batch_catches_up(tmp_path: Path) -> None:
    """Between batches the table partition is paused: a consumer keeps fetching its unpaused
    partitions in the background, one request per fetch wait while the table is quiet."""
    log: list[Any] = []
    task = join_task(tmp_path, log)
    (side,) = task.sides
    table = _TableConsumer(side.input, [_TableRecord(0, 500, b'"s1"', b'{"NAME": "first", "SIZE": 1}')])
    task.consumer, task._table_ends = table, _Ends({side.input: 1})
    assert await task.commit(JoinSlice(0, 0, count=1, records=[(0, b'"s1"', 1000, ["s1", "a", 5])]))
    assert table.fetched == 1 and table.paused == {side.input}
    assert await task.commit(JoinSlice(1, 1, count=1, records=[(1, b'"s1"', 2000, ["s1", "a", 6])]))  # no fetch: caught up
    sent = [json.loads(e.value) for e in log if isinstance(e, Sent) and e.topic == task.sink.topic]
    assert [(row["READING"], row["NAME"]) for row in sent] == [(5, "first"), (6, "first")]
    task.store.close()


async def test_a_tables_timestamp_column_orders_its_records_among_the_streams(tmp_path: Path) -> None:
    """A table declared WITH (TIMESTAMP='at'): its records are applied by that column's time, as
    ksqlDB's timestamp extractor gives it, not by the record's own (which is earlier here); one
    whose column is NULL keeps the record's."""
    log: list[Any] = []
    task = join_task(tmp_path, log, "NAMED_AT")
    (side,) = task.sides
    table = _TableConsumer(side.input, [_TableRecord(0, 500, b"s1", b'{"NAME": "later", "AT": 5000}'),
                                        _TableRecord(1, 600, b"s2", b'{"NAME": "untimed", "AT": null}')])
    task.consumer, task._table_ends = table, _Ends({side.input: 2})
    first = [(0, b"s1", 1000, ["s1", "a", 5]), (1, b"s2", 1000, ["s2", "a", 6])]
    assert await task.commit(JoinSlice(0, 1, count=2, records=first))
    assert await task.commit(JoinSlice(2, 2, count=1, records=[(2, b"s1", 6000, ["s1", "a", 7])]))
    sent = [json.loads(e.value) for e in log if isinstance(e, Sent) and e.topic == task.sink.topic]
    # s1's row is at 5 s: the record at 1 s comes before it. s2's (NULL time) at its record's 600 ms.
    # (The second is applied only once s1's is: a table partition's records apply in offset order.)
    assert [(row["READING"], row["NAME"]) for row in sent] == [(5, None), (6, None), (7, "later")]
    task.store.close()


def test_a_tables_timestamp_column_is_read_as_its_stores_keep_it() -> None:
    meta = applied(STATEMENTS)
    table = meta.source("STS")
    time_of = event_time_reader(table, value_decoder(table))
    assert time_of is not None
    assert time_of(_TableRecord(0, 1, b"k", b'{"AT": 1500}')) == 1500
    assert time_of(_TableRecord(0, 1, b"k", b'{"AT": "2026-12-06T00:00:01.250Z"}')) == 1796515201250
    assert time_of(_TableRecord(0, 7, b"k", b'{"AT": "not a time"}')) == 7  # set aside by the table: its own time
    assert time_of(_TableRecord(0, 8, b"k", b'{"AT": null}')) == 8
    assert event_time_reader(meta.source("S"), value_decoder(meta.source("S"))) is None


def test_a_tables_text_timestamp_column_is_read_with_its_pattern_as_spark_reads_the_streams() -> None:
    """A VARCHAR TIMESTAMP column with TIMESTAMP_FORMAT orders the table's records as the stream
    side's is read (``time_patterns``); text that does not read keeps the record's own time, and
    a pattern with a letter Python does not read leaves every record its own."""
    meta = Metastore()
    for offset, statement in enumerate([
            "CREATE TABLE tf (id VARCHAR PRIMARY KEY, at VARCHAR) WITH (kafka_topic='tf', partitions=2, "
            "value_format='json', timestamp='at', timestamp_format='yyyy-MM-dd HH:mm:ss.SSSXXX')",
            "CREATE TABLE te (id VARCHAR PRIMARY KEY, at VARCHAR) WITH (kafka_topic='te', partitions=2, "
            "value_format='json', timestamp='at', timestamp_format='yyyy-MM-dd HH:mm:ss z')"]):
        meta.apply(parse_statement(statement), offset)
    table = meta.source("TF")
    time_of = event_time_reader(table, value_decoder(table))
    assert time_of is not None
    assert time_of(_TableRecord(0, 1, b"k", b'{"AT": "2026-12-06 01:00:01.250+01:00"}')) == 1796515201250
    assert time_of(_TableRecord(0, 7, b"k", b'{"AT": "2026-12-06T00:00:01Z"}')) == 7
    assert time_of(_TableRecord(0, 8, b"k", b'{"AT": null}')) == 8
    assert event_time_reader(meta.source("TE"), value_decoder(meta.source("TE"))) is None


class _Beginnings:
    """A join's table consumer that knows its tables' first offsets."""

    def __init__(self, firsts: dict[TopicPartition, int]):
        self.firsts = firsts

    async def beginning_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.firsts[tp] for tp in partitions}


@pytest.mark.parametrize(("first", "kept"), [(3, True), (4, False)])
async def test_a_join_store_behind_its_tables_retention_is_built_again(tmp_path: Path, first: int, kept: bool) -> None:
    """A join's store applied its table up to offset 3 (its next is 3); retention removed
    offset 3, which it never applied (a tombstone of its row, maybe): the store is emptied for
    the start to build it again from the table, as on a worker without it. At the first
    offset, it is kept."""
    log: list[Any] = []
    task = join_task(tmp_path, log)
    (side,) = task.sides
    task.store.write({side.prefix + b"s1": encode_state(["a"])}, {side.position_name: 3, INPUT_OFFSET: 7})
    task.consumer = _Beginnings({side.input: first})  # type: ignore[assignment]
    await task._past_retention()
    assert (task.store.get(side.prefix + b"s1") is not None, task.store.position(INPUT_OFFSET) is not None) == (kept, kept)
    task.store.close()


async def test_a_table_over_a_windowed_table_lets_its_windows_go_as_its_source_does(tmp_path: Path) -> None:
    """A table projected from a windowed table keeps its windows as long as its source's store
    does: a time window whose start, or a session that ended, its retention or more before the
    latest record time the table has read (its source's stream time), leaves the store, a
    stored one or one the batch writes; the stream time is kept with the rows and never goes back."""
    log: list[Any] = []
    meta = applied(STATEMENTS)
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)
    table = meta.sources["WP"]  # over W: TUMBLING windows of 10 ms kept 30 ms
    task = TableTask(settings, meta.queries[str(table.query_id)], table, table, 0)
    task.producer, task.store = FakeProducer(log, None), RecordingStore(tmp_path / "store", log)
    task.store.write({windowed_key(b"a", 20): encode_state([2]), windowed_key(b"b", 75): encode_state([3])}, {INPUT_OFFSET: 0})
    task.next_input_offset = 0
    batch = table_slice(4, [(windowed_key(b"a", 60), [4]), (windowed_key(b"a", 70), [5]), (windowed_key(b"a", 90), [6]),
                            (windowed_key(b"c", 20), None)])
    batch.stream_time = 100
    assert await task.commit(batch)
    assert dict(task.store.items()) == {windowed_key(b"b", 75): [3], windowed_key(b"a", 90): [6]}
    assert task.store.stream_time() == 100
    assert task.row(windowed_key(b"a", 90), [6]) == ["a", 90, 100, 6]
    later = table_slice(5, [(windowed_key(b"d", 71), [7])])
    later.stream_time = 40  # an older window's update: stream time stays
    assert await task.commit(later)
    assert dict(task.store.items()) == {windowed_key(b"b", 75): [3], windowed_key(b"a", 90): [6], windowed_key(b"d", 71): [7]}
    last = table_slice(6, [])
    last.stream_time = 106
    assert await task.commit(last)
    assert dict(task.store.items()) == {windowed_key(b"a", 90): [6]} and task.store.stream_time() == 106
    task.store.close()

    sessions = meta.sources["SP"]  # over SS: sessions kept a day (the least retention) after they end
    day = 86_400_000
    task = TableTask(settings, meta.queries[str(sessions.query_id)], sessions, sessions, 1)
    task.producer, task.store = FakeProducer(log, None), RecordingStore(tmp_path / "sessions", log)
    task.next_input_offset = 0
    batch = table_slice(1, [(session_key(b"a", 5, 10), [2]), (session_key(b"a", 20, 2 * day), [3])])
    batch.stream_time = 2 * day + 10
    assert await task.commit(batch)
    assert dict(task.store.items()) == {session_key(b"a", 20, 2 * day): [3]}
    task.store.close()
