"""Tasks against the real broker, without Spark: a task that was given away is fenced and
cannot commit (the zombie case), and the new owner restores from the changelog only."""

from __future__ import annotations

import asyncio
import base64
import gc
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, MessageSizeTooLargeError

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.services.worker.regrouping import RegroupTask
from millpond.services.worker.state.store import INPUT_OFFSET, WRITTEN_MS, PartitionStore
from millpond.services.worker.task import (
    KEPT_STORE_MAX_AGE_MS,
    AggregateSlice,
    AggregationTask,
    MaterializeSlice,
    ProjectionTask,
    ProjectSlice,
    RegroupSlice,
    ReplayedTableTask,
    TableTask,
    store_path,
)
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.names import changelog_topic, consumer_group, processing_log_topic, regroup_changelog_topic
from millpond.shared.catalog.queries import PersistentQuery
from millpond.shared.catalog.sources import DataSource
from millpond.shared.catalog.topology import stages
from millpond.shared.config import WorkerSettings
from millpond.shared.kafka.admin import (
    GROUP_OFFSETS,
    GroupOffsets,
    committed_offsets,
    committed_positions,
    end_offsets,
    ensure_topic,
)
from millpond.shared.kafka.connection import KafkaConnection
from millpond.shared.sql.parser import parse_statement
from millpond.shared.task_status import RESTORING, RUNNING, STARTING, now_ms
from tests.unseen_errors import unseen_errors

pytestmark = pytest.mark.kafka
_ids = itertools.count()


async def _setup(kafka: EmbeddedKafka, sql: str) -> tuple[Metastore, str]:
    """A metastore with a one-partition stream and ``sql`` over it; every topic created."""
    service_id = f"fence{next(_ids)}"
    meta = Metastore()
    meta.apply(parse_statement(
        f"CREATE STREAM events (k VARCHAR KEY, v INT) WITH (kafka_topic='events-{service_id}', partitions=1, "
        "value_format='json')"), 0)
    meta.apply(parse_statement(sql), 1)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        query = next(iter(meta.queries.values()))
        for topic in (meta.source("EVENTS").topic, meta.source(query.sink).topic,
                      changelog_topic(service_id, query.query_id), processing_log_topic(service_id)):
            await ensure_topic(admin, topic, 1, compacted=topic.endswith("changelog"))
    finally:
        await admin.close()
    return meta, service_id


@pytest.fixture(autouse=True)
def _finalize_fenced_producers() -> Iterator[None]:
    """Finalize a fenced producer's failed internal futures right after the test: their
    "never retrieved" log, if it runs inside a later ``compile`` (pytest's assertion
    rewriting), trips a CPython 3.11 recursion-depth check."""
    yield
    gc.collect()


def _settings(kafka: EmbeddedKafka, service_id: str, worker: str, tmp_path: Path) -> WorkerSettings:
    return WorkerSettings(kafka_bootstrap_servers=kafka.bootstrap_servers, service_id=service_id,
                          worker_id=worker, state_dir=tmp_path / worker)


async def _committed(bootstrap: str, topic: str) -> list[tuple[bytes | None, dict[str, object]]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        # Up to the high watermark, not this consumer's end (the last stable offset): a
        # transaction's commit returns once it is decided, before its markers are written,
        # and until they are the last stable offset stops short of its records.
        end = (await end_offsets(bootstrap, topic, 1))[0]
        out: list[tuple[bytes | None, dict[str, object]]] = []
        while await consumer.position(tp) < end:
            for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                out += [(r.key, json.loads(r.value or b"{}")) for r in records]
        return out
    finally:
        await consumer.stop()


async def test_a_task_given_away_cannot_commit_and_its_successor_restores_from_the_changelog(
        kafka: EmbeddedKafka, tmp_path: Path) -> None:
    meta, service_id = await _setup(kafka, "CREATE TABLE totals AS SELECT k, COUNT(*) AS n FROM events GROUP BY k")
    query = next(iter(meta.queries.values()))
    source, sink = meta.source("EVENTS"), meta.source("TOTALS")
    old = AggregationTask(_settings(kafka, service_id, "old", tmp_path), query, source, sink, 0)
    await old.start()
    assert await old.commit(AggregateSlice(0, 4, partials=[(b"k1", [[5]]), (b"k2", [[2]])]))

    new = AggregationTask(_settings(kafka, service_id, "new", tmp_path), query, source, sink, 0)
    assert not new.readable
    await new.start()  # the same transactional id: the old owner is fenced from here on
    try:
        assert new.restored_records == 2 and new.start_input_offset == 5
        # Restored, its Spark query not started: pulls may read it as the active's already.
        assert new.state == RESTORING and new.readable
        assert new.store is not None and new.store.get(b"k1") == [[5]]

        assert not old.fenced
        with pytest.raises(KafkaError):
            await old.commit(AggregateSlice(5, 9, partials=[(b"k1", [[5]])]))
        assert old.fenced  # the broker's refusal is one the supervisor waits on before a restart
        assert old.store is not None and old.store.position(INPUT_OFFSET) == 5 and old.store.get(b"k1") == [[5]]

        assert await new.commit(AggregateSlice(5, 9, partials=[(b"k1", [[5]])]))
        assert not await new.commit(AggregateSlice(5, 9, partials=[(b"k1", [[5]])]))  # a replay is skipped
    finally:
        await new.stop()
        await old.stop()
    assert await _committed(kafka.bootstrap_servers, sink.topic) == [(b"k1", {"N": 5}), (b"k2", {"N": 2}),
                                                                      (b"k1", {"N": 10})]
    group = consumer_group(service_id, query.query_id)
    assert await committed_offsets(KafkaConnection(kafka.bootstrap_servers), group, [old.input]) == {old.input: 10}


async def test_a_fenced_projection_task_writes_nothing(kafka: EmbeddedKafka, tmp_path: Path) -> None:
    meta, service_id = await _setup(kafka, "CREATE STREAM doubled AS SELECT k, v * 2 AS v2 FROM events")
    query = next(iter(meta.queries.values()))
    source, sink = meta.source("EVENTS"), meta.source("DOUBLED")
    old = ProjectionTask(_settings(kafka, service_id, "old", tmp_path), query, source, sink, 0)
    await old.start()
    assert await old.commit(ProjectSlice(0, 0, records=[(b"a", b'{"V2":2}')]))
    new = ProjectionTask(_settings(kafka, service_id, "new", tmp_path), query, source, sink, 0)
    await new.start()
    with unseen_errors() as unseen:
        try:
            assert new.start_input_offset == 1
            with pytest.raises(KafkaError):
                await old.commit(ProjectSlice(1, 1, records=[(b"b", b'{"V2":4}')]))
            assert await new.commit(ProjectSlice(1, 1, records=[(b"b", b'{"V2":4}')]))
        finally:
            await new.stop()
            await old.stop()
    assert unseen == []  # the fenced producer's failed futures are taken as seen once it stops
    assert await _committed(kafka.bootstrap_servers, sink.topic) == [(b"a", {"V2": 2}), (b"b", {"V2": 4})]


async def _source_table(kafka: EmbeddedKafka) -> tuple[str, PersistentQuery, DataSource]:
    """A service id, and table T (id, n) over a one-partition topic of its own, with that
    service's processing-log topic."""
    service_id = f"table{next(_ids)}"
    meta = Metastore()
    meta.apply(parse_statement(f"CREATE TABLE t (id VARCHAR PRIMARY KEY, n INT) WITH (kafka_topic='t-{service_id}', "
                               "partitions=1, value_format='json')"), 0)
    (query,) = meta.queries.values()
    source = meta.source("T")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        await ensure_topic(admin, source.topic, 1)
        await ensure_topic(admin, processing_log_topic(service_id), 1)
    finally:
        await admin.close()
    return service_id, query, source


async def _write_table(kafka: EmbeddedKafka, service_id: str, topic: str,
                       records: list[tuple[str, int | bytes | None]], abort: bool = False) -> None:
    """``records`` (key, N, or the value's bytes, or None: a tombstone) into partition 0 of
    ``topic`` in one transaction, committed (or aborted)."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, transactional_id=f"fill-{service_id}")
    await producer.start()
    try:
        await producer.begin_transaction()
        for key, n in records:
            value = n if isinstance(n, bytes) else None if n is None else json.dumps({"N": n}).encode()
            await producer.send_and_wait(topic, value, key=key.encode(), partition=0)
        await (producer.abort_transaction() if abort else producer.commit_transaction())
    finally:
        await producer.stop()


async def test_a_source_table_task_rebuilds_as_restoring_and_reports_its_lag(kafka: EmbeddedKafka,
                                                                           tmp_path: Path) -> None:
    """A table's store rebuilt from its topic is RESTORING, with a lag, until it has read what
    the topic held when it started, transaction marker included; then RUNNING with lag 0."""
    service_id, query, source = await _source_table(kafka)
    await _write_table(kafka, service_id, source.topic, [(f"k{i}", i) for i in range(3)])  # offsets 0-2, marker 3

    task = TableTask(_settings(kafka, service_id, "w1", tmp_path), query, source, source, 0)
    await task.start()
    try:
        assert (task.state, task.rebuilding(), task.records_to_restore, task.readable) == (RESTORING, True, 4, False)
        lag = task.lag()
        assert lag is not None and (lag.lag, lag.active) == (4, True)
        assert await task.commit(MaterializeSlice(0, 2, count=3, latest=[(f"k{i}".encode(), [i]) for i in range(3)]))
        assert task.state == RESTORING and task.lag().lag == 1  # type: ignore[union-attr]  # the marker is unread
        task.read_through(4)
        assert (task.state, task.rebuilding(), task.lag().lag) == (RUNNING, False, 0)  # type: ignore[union-attr]
        assert task.readable
    finally:
        await task.stop()

    again = TableTask(_settings(kafka, service_id, "w1", tmp_path), query, source, source, 0)
    await again.start()  # the store holds every record; only the marker is left: start reads past it
    try:
        assert (again.state, again.rebuilding(), again.lag().lag, again.next_input_offset) == (  # type: ignore[union-attr]
            STARTING, False, 0, 4)
        assert again.readable
    finally:
        await again.stop()

    # An aborted transaction holds no rows either (offsets 4-5, its marker 6): start reads past it.
    await _write_table(kafka, service_id, source.topic, [(f"k{i}", 99) for i in range(2)], abort=True)
    aborted = TableTask(_settings(kafka, service_id, "w1", tmp_path), query, source, source, 0)
    await aborted.start()
    try:
        assert (aborted.rebuilding(), aborted.lag().lag, aborted.next_input_offset) == (False, 0, 7)  # type: ignore[union-attr]
        assert aborted.store is not None and aborted.store.get(b"k0") == [0]
    finally:
        await aborted.stop()


async def test_a_kept_table_store_catches_up_at_start_where_python_reads_as_spark(kafka: EmbeddedKafka,
                                                                                  tmp_path: Path) -> None:
    """A table task whose store was kept (a promoted copy's) and is behind its topic: the
    records of the tail are the query's to read (RESTORING), unless the table's copies replay
    its topic (a join's result, ``ReplayedTableTask``): then start applies them as a copy does,
    tombstones included, logs the one that does not decode, commits the input past them, and
    the task serves at once and resumes after them."""
    service_id, query, source = await _source_table(kafka)
    settings = _settings(kafka, service_id, "w1", tmp_path)
    await _write_table(kafka, service_id, source.topic, [("k0", 0), ("k1", 1), ("k2", 2)])  # offsets 0-2, marker 3
    first = TableTask(settings, query, source, source, 0)
    await first.start()
    try:
        assert await first.commit(MaterializeSlice(0, 2, count=3, latest=[(f"k{i}".encode(), [i]) for i in range(3)]))
    finally:
        await first.stop()
    await _write_table(kafka, service_id, source.topic,  # offsets 4-7, marker 8
                       [("k1", 10), ("k3", 3), ("k0", None), ("k4", b"{not json")])

    plain = TableTask(settings, query, source, source, 0)
    await plain.start()
    try:
        assert (plain.state, plain.lag().lag, plain.next_input_offset) == (RESTORING, 6, 3)  # type: ignore[union-attr]
        assert not plain.readable and plain.store is not None and plain.store.get(b"k1") == [1]
    finally:
        await plain.stop()

    replayed = ReplayedTableTask(settings, query, source, source, 0)
    await replayed.start()
    try:
        assert (replayed.state, replayed.rebuilding(), replayed.lag().lag, replayed.next_input_offset) == (
            STARTING, False, 0, 9)  # type: ignore[union-attr]
        assert replayed.readable and replayed.store is not None
        assert {k: replayed.store.get(f"k{k}".encode()) for k in range(5)} == {0: None, 1: [10], 2: [2], 3: [3], 4: None}
    finally:
        await replayed.stop()
    # As a batch would: the record left out is in the processing log, and the input committed past it.
    logged = await _committed(kafka.bootstrap_servers, processing_log_topic(service_id))
    assert [(entry["SOURCE_OFFSET"], entry["REASON"], entry["RECORD"]) for _, entry in logged] == [
        (7, "value is not JSON of the declared columns and types", "{not json")]
    tp = TopicPartition(source.topic, 0)
    group = consumer_group(service_id, query.query_id)
    assert await committed_offsets(KafkaConnection(kafka.bootstrap_servers), group, [tp]) == {tp: 9}


async def _set_topic_config(kafka: EmbeddedKafka, topic: str, configs: dict[str, str]) -> None:
    """Set ``topic``'s configs (replacing those set before) and wait until the broker reports them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        (altered,) = await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs)])
        assert not any(resource[0] for resource in altered.resources), altered
        deadline = time.monotonic() + 30
        while True:
            (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
            current = {entry[0]: entry[1] for resource in response.resources for entry in resource[4]}
            if all(current.get(name) == value for name, value in configs.items()):
                return
            assert time.monotonic() < deadline, f"the broker still reports {current} for {topic}"
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def test_a_catch_up_that_does_not_commit_leaves_the_store_where_it_was(kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """A ``ReplayedTableTask`` whose catch-up applied its tail but whose transaction then
    failed (here the broker refuses its processing-log record: the topic's max.message.bytes
    is below it) has not logged the record it left out: its store's position goes back, so the
    next start, once the topic takes the record, applies the tail again and logs it, once."""
    service_id, query, source = await _source_table(kafka)
    settings = _settings(kafka, service_id, "w1", tmp_path)
    await _write_table(kafka, service_id, source.topic, [("k0", 0)])  # offset 0, marker 1
    first = TableTask(settings, query, source, source, 0)
    await first.start()
    try:
        assert await first.commit(MaterializeSlice(0, 0, count=1, latest=[(b"k0", [0])]))
    finally:
        await first.stop()
    await _write_table(kafka, service_id, source.topic, [("k1", 1), ("k2", b"{not json")])  # offsets 2-3, marker 4

    # Room for the transaction's abort marker (a control batch of about 80 bytes: one refused,
    # the transaction would hang open) but not for its processing-log entry.
    log_topic = processing_log_topic(service_id)
    await _set_topic_config(kafka, log_topic, {"max.message.bytes": "200"})
    failing = ReplayedTableTask(settings, query, source, source, 0)
    try:
        with pytest.raises(MessageSizeTooLargeError):
            await failing.start()
    finally:
        await failing.stop()
    store = PartitionStore(store_path(settings, query.query_id, 0))
    try:
        assert store.position(INPUT_OFFSET) == 1  # not past the tail it applied but never committed
    finally:
        store.close()

    await _set_topic_config(kafka, log_topic, {"max.message.bytes": "1048588"})  # the broker's default
    replayed = ReplayedTableTask(settings, query, source, source, 0)
    await replayed.start()
    try:
        assert replayed.next_input_offset == 5 and replayed.store is not None
        assert {k: replayed.store.get(f"k{k}".encode()) for k in range(3)} == {0: [0], 1: [1], 2: None}
    finally:
        await replayed.stop()
    logged = await _committed(kafka.bootstrap_servers, log_topic)
    assert [(entry["SOURCE_OFFSET"], entry["RECORD"]) for _, entry in logged] == [(3, "{not json")]


async def test_a_stage_feeding_another_commits_how_far_its_output_reached(kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """A stage whose sink the next stage reads keeps, with each committed input offset, the
    offset after its last record per sink partition (what a consistency token is carried
    through); an empty batch leaves it, and the next owner reads it back. A result stage keeps none."""
    staged = f"STAGED{next(_ids)}"  # a sink of its own: the offsets below are its first
    meta, service_id = await _setup(kafka, f"CREATE STREAM {staged} AS SELECT k, v * 2 AS v2 FROM events")
    query = next(iter(meta.queries.values()))
    source, sink = meta.source("EVENTS"), meta.source(staged)
    first = ProjectionTask(_settings(kafka, service_id, "first", tmp_path), query, source, sink, 0, "project")
    await first.start()
    try:
        assert first.output_ends == {}
        assert await first.commit(ProjectSlice(0, 1, records=[(b"a", b'{"V2":2}'), (b"b", b'{"V2":4}')]))
        assert first.output_ends == {0: 2}  # records at 0 and 1, the commit marker at 2
        assert await first.commit(ProjectSlice(2, 2, count=1))
        assert first.output_ends == {0: 2}
        assert await first.commit(ProjectSlice(3, 3, records=[(b"c", b'{"V2":6}')]))
        assert first.output_ends == {0: 4}
    finally:
        await first.stop()
    second = ProjectionTask(_settings(kafka, service_id, "second", tmp_path), query, source, sink, 0, "project")
    await second.start()
    try:
        assert (second.start_input_offset, second.output_ends) == (4, {0: 4})
    finally:
        await second.stop()
    kafka_connection = KafkaConnection(kafka.bootstrap_servers)
    tp = TopicPartition(source.topic, 0)
    group = consumer_group(service_id, query.query_id)
    assert (await committed_positions(kafka_connection, group, [tp]))[tp] == (4, '{"ends":[4]}')
    result = ProjectionTask(_settings(kafka, service_id, "result", tmp_path), query, source, sink, 0)
    await result.start()
    try:
        assert await result.commit(ProjectSlice(4, 4, records=[(b"d", b'{"V2":8}')]))
    finally:
        await result.stop()
    # The commit is stable once its transaction's markers are written, which ends after
    # end_transaction returns: the next owner's init_transactions waits for that, a bare
    # offset fetch does not (aiokafka sends no require_stable).
    successor = ProjectionTask(_settings(kafka, service_id, "successor", tmp_path), query, source, sink, 0)
    await successor.start()
    try:
        assert successor.start_input_offset == 5
    finally:
        await successor.stop()
    assert (await committed_positions(kafka_connection, group, [tp]))[tp] == (5, "")  # a result stage's: none


async def test_tasks_read_their_positions_through_the_group_offsets_set_for_them(kafka: EmbeddedKafka,
                                                                                   tmp_path: Path) -> None:
    """As a worker's do: each task that starts reads where to resume (ahead of its fence, then
    after it) through the one admin client of the ``GroupOffsets`` in its context."""
    meta, service_id = await _setup(kafka, "CREATE TABLE totals AS SELECT k, COUNT(*) AS n FROM events GROUP BY k")
    query = next(iter(meta.queries.values()))
    source, sink = meta.source("EVENTS"), meta.source("TOTALS")
    reader = GroupOffsets(KafkaConnection(kafka.bootstrap_servers))
    token = GROUP_OFFSETS.set(reader)
    try:
        first = AggregationTask(_settings(kafka, service_id, "first", tmp_path), query, source, sink, 0)
        assert await first.expected_input_offset() is None
        client = reader._admin
        assert client is not None
        await first.start()
        try:
            assert first.start_input_offset is None
            assert await first.commit(AggregateSlice(0, 4, partials=[(b"k1", [[5]])]))
        finally:
            await first.stop()
        second = AggregationTask(_settings(kafka, service_id, "second", tmp_path), query, source, sink, 0)
        assert await second.expected_input_offset() == 5
        await second.start()
        try:
            assert second.start_input_offset == 5 and second.store is not None and second.store.get(b"k1") == [[5]]
        finally:
            await second.stop()
        assert reader._admin is client  # one client for the four reads
    finally:
        GROUP_OFFSETS.reset(token)
        await reader.close()
    assert reader._admin is None


async def test_a_regroup_task_restores_what_it_counted_from_its_changelog(kafka: EmbeddedKafka, tmp_path: Path) -> None:
    """A table aggregation's regroup task: a new owner without the old one's store restores,
    from the changelog alone, the row each table key last added to a group, so a row that
    moves is taken out of the group it was counted in; the old owner is fenced; a replayed
    slice and a row that did not change write nothing."""
    service_id = f"regroup{next(_ids)}"
    meta = Metastore()
    meta.apply(parse_statement(f"CREATE TABLE pages (page VARCHAR PRIMARY KEY, owner VARCHAR) WITH "
                               f"(kafka_topic='pages-{service_id}', partitions=1, value_format='json')"), 0)
    meta.apply(parse_statement("CREATE TABLE owners AS SELECT owner, COUNT(*) AS n FROM pages GROUP BY owner"), 1)
    query = next(q for q in meta.queries.values() if q.sink == "OWNERS")
    regroup = stages(query, meta.source("PAGES"), meta.source("OWNERS"), service_id)[0]
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        for topic in (regroup.source.topic, regroup.sink.topic, processing_log_topic(service_id),
                      regroup_changelog_topic(service_id, query.query_id)):
            await ensure_topic(admin, topic, 1, compacted=topic.endswith("changelog"))
    finally:
        await admin.close()

    def added(page: str, owner: str) -> bytes:
        return json.dumps({"_SIGN": 1, "PAGE": page, "OWNER": owner}, separators=(",", ":")).encode()

    def task(worker: str) -> RegroupTask:
        return RegroupTask(_settings(kafka, service_id, worker, tmp_path), regroup.query, regroup.source,
                           regroup.sink, 0, regroup.name)

    old = task("old")
    await old.start()
    assert await old.commit(RegroupSlice(0, 2, inputs=[(0, b"p1"), (1, b"p2"), (2, b"p3")], records=[
        (b"a", added("p1", "a")), (b"b", added("p2", "b")), (b"p3", None)]))
    new = task("new")
    await new.start()  # fences the old owner; its own store is empty
    try:
        assert new.restored_records == 2 and new.start_input_offset == 3
        with pytest.raises(KafkaError):
            await old.commit(RegroupSlice(3, 3, inputs=[(3, b"p2")], records=[(b"p2", None)]))
        moved = RegroupSlice(3, 5, inputs=[(3, b"p1"), (4, b"p2"), (5, b"p2")], records=[
            (b"b", added("p1", "b")), (b"p2", None), (b"b", added("p2", "b"))])
        assert await new.commit(moved)
        assert not await new.commit(moved)  # a replay
        assert await new.commit(RegroupSlice(6, 6, inputs=[(6, b"p2")], records=[(b"p2", None)]))
    finally:
        await new.stop()
        await old.stop()
    assert await _committed(kafka.bootstrap_servers, regroup.sink.topic) == [
        (b"a", {"_SIGN": 1, "PAGE": "p1", "OWNER": "a"}), (b"b", {"_SIGN": 1, "PAGE": "p2", "OWNER": "b"}),
        # p1 out of a and into b; p2 deleted and back as it was within one slice: unchanged.
        (b"a", {"_SIGN": -1, "PAGE": "p1", "OWNER": "a"}), (b"b", {"_SIGN": 1, "PAGE": "p1", "OWNER": "b"}),
        (b"b", {"_SIGN": -1, "PAGE": "p2", "OWNER": "b"})]
    group = consumer_group(service_id, query.query_id)
    assert await committed_offsets(KafkaConnection(kafka.bootstrap_servers), group, [new.input]) == {new.input: 7}

    # The old owner's store, kept on its worker: fresh, it restores the changelog's tail from its
    # position; last written longer ago than the changelog keeps tombstones, from the start.
    for age_ms, restored in ((0, 2), (KEPT_STORE_MAX_AGE_MS + 60_000, 4)):
        kept = PartitionStore(store_path(_settings(kafka, service_id, "old", tmp_path),
                                         f"{query.query_id}-{regroup.name}", 0))
        kept.write({}, {WRITTEN_MS: now_ms() - age_ms})
        kept.close()
        back = task("old")
        await back.start()
        try:
            assert back.restored_records == restored
            assert back.store is not None and dict(back.store.items()) == {b"p1": [base64.b64encode(b"b").decode(),
                                                                                   added("p1", "b").decode()]}
        finally:
            await back.stop()
