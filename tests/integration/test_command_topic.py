"""The transactional command topic against the real broker: seed 002's race and replay cases."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import ProducerFenced

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.services.coordinator.assignor import AssignorConfig
from millpond.services.coordinator.cluster import Cluster
from millpond.services.coordinator.executor import StatementExecutor
from millpond.shared.catalog import names
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.topology import internal_topics
from millpond.shared.config import CoordinatorSettings
from millpond.shared.errors import AlreadyExistsError, SetupError, StatementError
from millpond.shared.kafka.admin import (
    delete_topics,
    ensure_command_topic,
    ensure_topic,
    internal_replicas,
    topic_partitions,
    until_gone,
)
from millpond.shared.kafka.command_log import Command, CommandReader, CommandWriter
from millpond.shared.kafka.connection import KafkaConnection
from millpond.shared.kafka.inserts import RowInserter
from millpond.shared.task_status import RUNNING, TaskReport
from tests.unseen_errors import unseen_errors

pytestmark = pytest.mark.kafka
_ids = itertools.count()


@asynccontextmanager
async def coordinator_core(bootstrap: str, service_id: str,
                           query_runs: Callable[[str], bool] = lambda _: False) -> AsyncIterator[StatementExecutor]:
    """What a coordinator needs to execute statements: its own metastore, reader and clients
    (``query_runs``: whether its workers report a query: a ``Cluster``'s, fed their heartbeats)."""
    settings = CoordinatorSettings(service_id=service_id, kafka_bootstrap_servers=bootstrap)
    metastore = Metastore()
    reader = CommandReader(settings.kafka, settings.command_topic, metastore)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    inserts = RowInserter(settings.kafka)
    offsets = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await admin.start()
    await ensure_topic(admin, settings.command_topic, 1)
    for client in (inserts, offsets, reader):
        await client.start()
    executor = StatementExecutor(settings, metastore, reader,
                                 CommandWriter(settings.kafka, settings.command_topic, names.command_transactional_id(service_id)),
                                 admin, inserts, offsets, query_runs=query_runs)
    try:
        yield executor
    finally:
        await executor.close()
        for closer in (reader.stop, offsets.stop, inserts.stop, admin.close):
            await closer()


async def committed_commands(bootstrap: str, topic: str) -> list[tuple[int, Command]]:
    """Every committed command of ``topic`` read from the start, read_committed."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        end = (await consumer.end_offsets([partition]))[partition]
        found: list[tuple[int, Command]] = []
        while await consumer.position(partition) < end:
            for record in (await consumer.getmany(partition, timeout_ms=1000)).get(partition, []):
                found.append((record.offset, Command.decode(record.value or b"{}")))
        return found
    finally:
        await consumer.stop()


async def test_racing_coordinators_never_both_append_conflicting_statements(kafka: EmbeddedKafka) -> None:
    """Seed 002's CLICKSTREAM: two coordinators with one service id get conflicting CREATEs
    at the same moment; exactly one is appended, the other is told the stream exists."""
    service_id = f"race{next(_ids)}"
    bootstrap = kafka.bootstrap_servers
    async with coordinator_core(bootstrap, service_id) as a, coordinator_core(bootstrap, service_id) as b:
        rounds = 6
        for i in range(rounds):
            results = await asyncio.gather(
                a.execute(f"CREATE STREAM CLICKSTREAM_{i} (USERID BIGINT, PAGEID STRING) "
                          f"WITH (kafka_topic='clickstream-{service_id}-{i}', partitions=1, value_format='JSON')", {}),
                b.execute(f"CREATE STREAM CLICKSTREAM_{i} (ACCOUNTID STRING) "
                          f"WITH (kafka_topic='clickstream-{service_id}-{i}', partitions=1, value_format='DELIMITED')", {}),
                return_exceptions=True,
            )
            ok = [r for r in results if not isinstance(r, BaseException)]
            refused = [r for r in results if isinstance(r, BaseException)]
            assert len(ok) == 1, results
            assert len(refused) == 1 and isinstance(refused[0], AlreadyExistsError), results
            winner_format = "JSON" if results[0] is ok[0] else "DELIMITED"
            for executor in (a, b):
                await executor.reader.catch_up()
                assert executor.metastore.source(f"CLICKSTREAM_{i}").value_format == winner_format
        # A deterministic interleaving too: A validates, then stalls before appending; B
        # starts meanwhile, which fences A. B's statement wins, and A's retry sees it.
        slow_create = a._create_topics

        async def stall(*args: Any) -> None:
            await asyncio.sleep(1.0)
            await slow_create(*args)

        a._create_topics = stall  # type: ignore[method-assign]
        first = asyncio.create_task(a.execute(
            f"CREATE STREAM CLICKSTREAM (USERID BIGINT, PAGEID STRING) "
            f"WITH (kafka_topic='clickstream-{service_id}', partitions=1, value_format='JSON')", {}))
        await asyncio.sleep(0.5)
        second = await b.execute(f"CREATE STREAM CLICKSTREAM (ACCOUNTID STRING) "
                                 f"WITH (kafka_topic='clickstream-{service_id}', partitions=1, value_format='DELIMITED')", {})
        assert second.message == "Stream created"
        with pytest.raises(AlreadyExistsError):
            await first
        assert a.fenced_retries >= 1
        rounds += 1

        commands = await committed_commands(bootstrap, a.settings.command_topic)
        assert len(commands) == rounds
        assert sorted(c.statement.split()[2] for _, c in commands) == sorted(
            ["CLICKSTREAM", *(f"CLICKSTREAM_{i}" for i in range(rounds - 1))])
        assert a.metastore.digest() == b.metastore.digest()
        assert a.metastore.command_offset == b.metastore.command_offset


async def test_the_topics_a_fenced_attempt_made_for_another_query_id_are_deleted(kafka: EmbeddedKafka) -> None:
    """A's CTAS makes its query's internal topics, then stalls; B's CTAS meanwhile fences it and
    takes that query number. A's retry plans its query under the next id and makes its topics:
    the first attempt's, which no query uses, are deleted (they were left for good); as they are
    when the retry is refused."""
    service_id = f"fenced{next(_ids)}"
    bootstrap = kafka.bootstrap_servers
    async with coordinator_core(bootstrap, service_id) as a, coordinator_core(bootstrap, service_id) as b:
        await a.execute(f"CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='{service_id}-s', partitions=1, "
                        "value_format='json');", {})
        made: list[list[str]] = []
        original = a._create_topics
        stalled = asyncio.Event()

        async def stall_after(stmt: Any, change: Any) -> None:
            await original(stmt, change)
            made.append(sorted(t.name for q in change.add_queries for t in internal_topics(service_id, q)))
            if len(made) == 1:  # B starts once A stalls here, however slow the machine (B's fence ends the stall)
                stalled.set()
                await asyncio.sleep(2.0)

        a._create_topics = stall_after  # type: ignore[method-assign]
        for table, other in (("t", "u"), ("w", "w")):  # the retry succeeds; then one the winner makes invalid
            made.clear()
            stalled.clear()
            first = asyncio.create_task(a.execute(
                f"CREATE TABLE {table} WITH (kafka_topic='{service_id}-{table}') AS SELECT v, COUNT(*) AS n FROM s "
                "GROUP BY v;", {}))
            await asyncio.wait_for(stalled.wait(), 60)
            if table != other:  # another query, which takes the query number A planned with
                await b.execute(f"CREATE TABLE {other} WITH (kafka_topic='{service_id}-{other}') AS SELECT v, SUM(v) "
                                "AS n FROM s GROUP BY v;", {})
            else:  # a table of the same name and no query: A's CTAS is refused
                await b.execute(f"CREATE TABLE {other} (v INT PRIMARY KEY, n BIGINT) WITH (kafka_topic='{service_id}-"
                                f"{other}', partitions=1, value_format='json');", {})
            if table == other:
                with pytest.raises(AlreadyExistsError):
                    await first
            else:
                await first
            assert made[0] and [await topic_partitions(a.admin, name) for name in made[0]] == [None] * len(made[0])
            kept = [name for query in a.metastore.queries.values() for name in
                    (t.name for t in internal_topics(service_id, query))]
            for name in kept:
                await shown(a.admin, name)
            if table != other:
                assert made[1] and set(made[1]) <= set(kept) and not set(made[0]) & set(kept)
        assert a.fenced_retries >= 2


async def test_a_fenced_writer_cannot_commit(kafka: EmbeddedKafka) -> None:
    """Starting a writer with the same transactional id aborts the older one's transaction."""
    service_id = f"fence{next(_ids)}"
    topic = names.command_topic(service_id)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    await ensure_topic(admin, topic, 1)
    await admin.close()
    first, second = (CommandWriter(KafkaConnection(kafka.bootstrap_servers), topic, names.command_transactional_id(service_id))
                     for _ in range(2))
    stale = Command("CREATE STREAM stale (a INT) WITH (kafka_topic='stale', partitions=1, value_format='JSON')")
    fresh = Command("CREATE STREAM fresh (a INT) WITH (kafka_topic='fresh', partitions=1, value_format='JSON')")
    late = Command("CREATE STREAM late (a INT) WITH (kafka_topic='late', partitions=1, value_format='JSON')")
    with unseen_errors() as unseen:
        with pytest.raises(ProducerFenced):
            async with first.transaction() as old:
                await old.append(stale)
                async with second.transaction() as new:
                    await new.append(fresh)
        with pytest.raises(ProducerFenced):  # fenced before it sends: the send fails
            async with first.transaction() as old:
                async with second.transaction() as new:
                    await new.append(fresh)
                await old.append(late)
    # The fenced producer's failed futures (its transaction's, its batch's) are taken as seen
    # once it stops: asyncio would log them when collected (and on Python 3.11 break an
    # ast.parse the collection interrupted).
    assert unseen == []
    statements = [c.statement for _, c in await committed_commands(kafka.bootstrap_servers, topic)]
    assert statements == [fresh.statement] * 2


async def test_replay_keeps_every_statement_and_marks_what_lost_its_topic(kafka: EmbeddedKafka) -> None:
    """Seed 002's PAGEVIEWS: after PAGEVIEWS' topic is deleted, a node that replays still
    creates both entities, in order, marks them with the error, and goes on past them."""
    service_id = f"replay{next(_ids)}"
    bootstrap = kafka.bootstrap_servers
    topic = f"pageviews-{service_id}"
    async with coordinator_core(bootstrap, service_id) as coordinator:
        await coordinator.execute(f"CREATE STREAM PAGEVIEWS_STREAM (USERID BIGINT, PAGEID STRING) "
                                  f"WITH (kafka_topic='{topic}', partitions=2, value_format='JSON')", {})
        created = await coordinator.execute("CREATE STREAM PAGEVIEWS_COPY AS SELECT * FROM PAGEVIEWS_STREAM", {})
        query_id = created.message.rsplit(" ", 1)[-1]
        await coordinator.execute("CREATE STREAM LATER (A INT) WITH (kafka_topic='later-" + service_id + "', "
                                  "partitions=1, value_format='JSON')", {})
        # A command no node can apply (written by a hypothetical newer version) keeps its place too.
        async with coordinator.writer.transaction() as txn:
            broken_offset = await txn.append(Command("CREATE STREAM BROKEN ("))
        await coordinator.execute("CREATE STREAM LAST (A INT) WITH (kafka_topic='last-" + service_id + "', "
                                  "partitions=1, value_format='JSON')", {})
        expected = coordinator.metastore
        await delete_topics(coordinator.admin, [topic])

        replayed = Metastore()
        reader = CommandReader(coordinator.settings.kafka, coordinator.settings.command_topic, replayed)
        await reader.start()
        try:
            async with following(reader) as changes:
                # Topic deletion is asynchronous in the broker: the reader sees it on a later check.
                await _wait_for(lambda: "PAGEVIEWS_STREAM" in replayed.errors, changes)
        finally:
            await reader.stop()

    assert list(replayed.sources) == ["PAGEVIEWS_STREAM", "PAGEVIEWS_COPY", "LATER", "LAST"]
    assert replayed.status("PAGEVIEWS_STREAM") == f"ERROR: topic {topic} does not exist (deleted outside Millpond?)"
    assert replayed.errors[query_id].startswith("PAGEVIEWS_STREAM is in error")
    assert replayed.status("LATER") == "OK" and replayed.status("PAGEVIEWS_COPY") == "OK"
    assert list(replayed.failed_commands) == [broken_offset]
    assert replayed.command_offset == expected.command_offset
    assert replayed.digest() == expected.digest()


@asynccontextmanager
async def following(reader: CommandReader) -> AsyncIterator[asyncio.Event]:
    """``reader.run`` in the background; the event is set each time it tells its listeners."""
    changes, stop = asyncio.Event(), asyncio.Event()
    reader.listeners.append(changes.set)
    running = asyncio.create_task(reader.run(stop))
    try:
        yield changes
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)


async def _wait_for(condition: Any, changes: asyncio.Event, timeout_s: float = 30.0) -> None:
    """Until ``condition()`` holds, woken by the reader's listener (never by polling here)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await changes.wait()
            changes.clear()


async def test_errors_are_rechecked_while_they_exist_and_listeners_told(kafka: EmbeddedKafka) -> None:
    """A source whose topic is missing (deleted, or listed a moment late) is in error, and
    leaves the error once the topic is back, with no new command; each change wakes the
    listeners (the workers' reconcile, the coordinator's assignor)."""
    service_id = f"recheck{next(_ids)}"
    topic = f"late-{service_id}"
    async with coordinator_core(kafka.bootstrap_servers, service_id) as coordinator:
        await coordinator.execute(f"CREATE STREAM LATE (A INT) WITH (kafka_topic='{topic}', partitions=2, "
                                  "value_format='JSON')", {})
        created = await coordinator.execute("CREATE STREAM LATE_COPY AS SELECT * FROM LATE", {})
        query_id = created.message.rsplit(" ", 1)[-1]
        replayed = Metastore()
        reader = CommandReader(coordinator.settings.kafka, coordinator.settings.command_topic, replayed,
                               errors_recheck_s=0.5, topics_recheck_s=0.5)
        await reader.start()
        try:
            await reader.catch_up()
            async with following(reader) as changes:
                await delete_topics(coordinator.admin, [topic])
                await _wait_for(lambda: query_id in replayed.errors, changes)
                await ensure_topic(coordinator.admin, topic, 2)
                await _wait_for(lambda: not replayed.errors, changes)
        finally:
            await reader.stop()


async def test_a_reader_already_at_the_end_catches_up_without_waiting_for_its_poll(kafka: EmbeddedKafka) -> None:
    """A follower's idle poll holds the reader for up to 200 ms; a statement's catch-up must
    not wait for it when every command is already applied (it did, on every INSERT). Nor for
    the poll's fetch, which the broker holds while the topic is quiet: the end offset is not
    asked on the reading consumer's connection, where it would queue behind that fetch."""
    service_id = f"caught{next(_ids)}"
    async with coordinator_core(kafka.bootstrap_servers, service_id) as coordinator:
        await coordinator.execute("CREATE STREAM CAUGHT (A INT) WITH (kafka_topic='caught', partitions=1, "
                                  "value_format='JSON')", {})
        # A fetch held 30 s on a quiet topic: an end offset asked behind it would take that long.
        reader = CommandReader(coordinator.settings.kafka, coordinator.settings.command_topic, Metastore(),
                               fetch_max_wait_ms=30_000)
        await reader.start()
        try:
            await reader.catch_up()
            async with reader._lock:  # as a poll in progress holds it
                await asyncio.wait_for(reader.catch_up(), 10)
            assert "CAUGHT" in reader.metastore.sources
            await coordinator.execute("CREATE STREAM CAUGHT_TOO (A INT) WITH (kafka_topic='caught_too', "
                                      "partitions=1, value_format='JSON')", {})
            # Something new: read under the lock, from a fetch the broker answers when the
            # commit moves the last stable offset, not after its 30 s wait.
            await asyncio.wait_for(reader.catch_up(), 10)
            assert "CAUGHT_TOO" in reader.metastore.sources
        finally:
            await reader.stop()


async def _topic_configs(admin: AIOKafkaAdminClient, topic: str, retention_ms: str = "-1") -> dict[str, str]:
    """The topic's configs once its retention.ms reads ``retention_ms`` (or after 15 s): the
    broker answers from metadata it applies a moment after the controller committed a create
    or an alter, so a loaded broker can answer with the configs from before."""
    deadline = time.monotonic() + 15
    while True:
        (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        configs = {entry[0]: entry[1] for resource in response.resources for entry in resource[4]}
        if configs.get("retention.ms") == retention_ms or time.monotonic() > deadline:
            return configs
        await asyncio.sleep(0.1)


async def test_the_command_topic_keeps_every_command_forever(kafka: EmbeddedKafka) -> None:
    """Created with infinite retention (time and size), and corrected to it when it exists
    with a finite retention; internal topics default to min(3, brokers) replicas."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        assert await internal_replicas(admin, 0) == 1  # one broker here
        assert await internal_replicas(admin, 2) == 2  # configured: taken as it is
        fresh, old = f"_millpond-cmd-fresh{next(_ids)}", f"_millpond-cmd-old{next(_ids)}"
        await ensure_command_topic(admin, fresh, 1)
        configs = await _topic_configs(admin, fresh)
        assert (configs["retention.ms"], configs["retention.bytes"], configs["cleanup.policy"]) == ("-1", "-1", "delete")
        assert configs["min.insync.replicas"] == "1"
        await ensure_topic(admin, old, 1, configs={"retention.ms": "604800000"})  # as the broker default made it
        await ensure_command_topic(admin, old, 1)
        assert (await _topic_configs(admin, old))["retention.ms"] == "-1"
    finally:
        await admin.close()


async def test_a_node_refuses_to_serve_when_the_command_topic_lost_its_start(kafka: EmbeddedKafka) -> None:
    """Commands deleted from the head of the topic (retention, or a record deletion): a new
    node would replay only the later ones and diverge, so it refuses, saying why."""
    service_id = f"headless{next(_ids)}"
    async with coordinator_core(kafka.bootstrap_servers, service_id) as coordinator:
        for name in ("FIRST", "SECOND"):
            await coordinator.execute(f"CREATE STREAM {name} (A INT) WITH (kafka_topic='{name.lower()}-{service_id}', "
                                      "partitions=1, value_format='JSON')", {})
        topic = coordinator.settings.command_topic
        second = [offset for offset, _ in await committed_commands(kafka.bootstrap_servers, topic)][1]
        await coordinator.admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(second)})

        reader = CommandReader(coordinator.settings.kafka, topic, Metastore())
        with pytest.raises(SetupError, match=f"starts at offset {second}, but this node needs it from offset 0"):
            await reader.start()
        # A node that already applied the deleted commands reads on from where it is.
        assert coordinator.metastore.command_offset >= second
        follower = CommandReader(coordinator.settings.kafka, topic, coordinator.metastore)
        await follower.start()
        await follower.stop()


async def test_a_resent_statement_runs_once_whichever_coordinator_gets_it(kafka: EmbeddedKafka) -> None:
    """The router resends a statement to the next coordinator when one answers UNAVAILABLE,
    which a coordinator can do after its command or row was written: the request id makes the
    resend answer with the first outcome (DDL through the command topic, which every
    coordinator replays; an INSERT through its record's header), not run it twice."""
    service_id = f"resend{next(_ids)}"
    topic = f"events-{service_id}"
    async with coordinator_core(kafka.bootstrap_servers, service_id) as first, \
            coordinator_core(kafka.bootstrap_servers, service_id) as second:
        create = (f"CREATE STREAM EVENTS (K VARCHAR KEY, V INT) WITH (kafka_topic='{topic}', partitions=2, "
                  "value_format='JSON')")
        made = await first.execute(create, {}, "req-1/0")
        assert (await second.execute(create, {}, "req-1/0", attempt=1)).message == made.message
        with pytest.raises(AlreadyExistsError):  # another request: a real second CREATE
            await second.execute(create, {}, "req-2/0")
        with pytest.raises(StatementError, match="request_id has 200 characters"):  # too long to keep
            await second.execute(create, {}, "r" * 200)

        await first.execute("CREATE STREAM SINK (K VARCHAR KEY, V INT) WITH (kafka_topic='sink-" + service_id + "', "
                            "partitions=2, value_format='JSON')", {})
        copy = "INSERT INTO SINK SELECT * FROM EVENTS"
        started = await first.execute(copy, {}, "req-3/0")
        assert (await second.execute(copy, {}, "req-3/0", attempt=1)).message == started.message
        assert len([q for q in second.metastore.queries.values() if q.sink == "SINK"]) == 1

        insert = "INSERT INTO EVENTS (K, V) VALUES ('a', 1)"
        row = await first.execute(insert, {}, "req-4/0")
        again = await second.execute(insert, {}, "req-4/0", attempt=1)
        assert (again.partition, again.offset) == (row.partition, row.offset)
        assert (await first.execute(insert, {}, "req-4/0")).offset == row.offset  # its own memory
        # The id used again for another row: refused, not answered with req-4's row (and never written).
        for coordinator in (first, second):  # its memory; the topic's record under that id
            with pytest.raises(StatementError, match="already used for another statement"):
                await coordinator.execute("INSERT INTO EVENTS (K, V) VALUES ('a', 2)", {}, "req-4/0", attempt=1)
        other = await second.execute(insert, {}, "req-5/0")
        assert other.offset != row.offset

    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        tp = TopicPartition(topic, row.partition)
        consumer.assign([tp])
        records = (await consumer.getmany(tp, timeout_ms=5000)).get(tp, [])
    finally:
        await consumer.stop()
    assert [r.offset for r in records] == sorted({row.offset, other.offset})  # req-4 once, req-5 once


def worker_reports(cluster: Cluster, query_id: str | None) -> None:
    """A worker's heartbeat to the coordinator's cluster view: running a task of ``query_id`` (None: nothing)."""
    reports = [] if query_id is None else [TaskReport(query_id, 0, RUNNING, worker_id="w1")]
    cluster.beat("w1", "127.0.0.1:1", reports, [])


async def shown(admin: AIOKafkaAdminClient, topic: str, within_s: float = 10) -> int:
    """``topic``'s partition count once the broker's metadata shows it (a topic the controller
    has just made shows a moment later, longer on a busy machine); TimeoutError if it never does."""
    async with asyncio.timeout(within_s):
        while (count := await topic_partitions(admin, topic)) is None:  # noqa: ASYNC110 (the broker's)
            await asyncio.sleep(0.05)
    return count


async def until_deleted(admin: AIOKafkaAdminClient, topics: list[str], within_s: float = 10) -> None:
    for topic in topics:
        assert await until_gone(admin, topic, within_s), f"{topic} is not deleted"


async def test_a_terminated_querys_topics_left_by_a_coordinator_are_deleted_by_the_next_once_no_worker_runs_it(
        kafka: EmbeddedKafka) -> None:
    """A TERMINATE deletes the query's internal topics once its workers stopped it; a coordinator
    that stops before then (here: one that appended the command and went) leaves them, and the
    next coordinator to start deletes them, once none of its workers reports the query."""
    service_id = f"left{next(_ids)}"
    async with coordinator_core(kafka.bootstrap_servers, service_id) as first:
        await first.execute(f"CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='{service_id}-s', partitions=2, "
                            "value_format='json');", {})
        await first.execute("CREATE TABLE t AS SELECT v, COUNT(*) AS n FROM s GROUP BY v;", {})
        (query,) = first.metastore.queries.values()
        topics = sorted(t.name for t in internal_topics(service_id, query))
        assert len(topics) == 2  # re-keyed: a repartition and a changelog topic
        async with first.writer.transaction() as txn:
            await txn.append(Command(f"TERMINATE {query.query_id};"))
    cluster = Cluster(10, AssignorConfig())
    worker_reports(cluster, query.query_id)  # a worker still runs it
    async with coordinator_core(kafka.bootstrap_servers, service_id, cluster.runs) as second:
        await second.reader.catch_up()
        assert query.query_id not in second.metastore.queries and query.query_id in second.metastore.terminated
        await second.delete_left_topics(reports_grace_s=0.2)
        await asyncio.sleep(1.0)
        assert [await shown(second.admin, t) for t in topics] == [2, 2]
        assert second.cleanup.waiting == set(topics)
        worker_reports(cluster, None)
        await until_deleted(second.admin, topics)


async def consumer_groups(admin: AIOKafkaAdminClient) -> set[str]:
    return {group for group, *_ in await admin.list_consumer_groups()}


async def test_a_terminated_querys_consumer_group_is_deleted_once_no_worker_runs_it(kafka: EmbeddedKafka) -> None:
    """The offsets a query's tasks committed to its consumer group go with its topics, as
    ksqlDB's cleanup deletes a terminated query's group (they stayed until Kafka's offset
    retention, seven days)."""
    service_id = f"groups{next(_ids)}"
    cluster = Cluster(10, AssignorConfig())
    async with coordinator_core(kafka.bootstrap_servers, service_id, cluster.runs) as core:
        await core.execute(f"CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='{service_id}-s', partitions=1, "
                           "value_format='json');", {})
        await core.execute(f"CREATE TABLE t WITH (kafka_topic='{service_id}-t') AS SELECT k, COUNT(*) AS n FROM s "
                           "GROUP BY k;", {})
        (query,) = core.metastore.queries.values()
        group = names.consumer_group(service_id, query.query_id)
        committer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, group_id=group, enable_auto_commit=False)
        await committer.start()
        try:  # as the query's tasks commit their input offsets
            committer.assign([TopicPartition(f"{service_id}-s", 0)])
            await committer.commit({TopicPartition(f"{service_id}-s", 0): 1})
        finally:
            await committer.stop()
        assert group in await consumer_groups(core.admin)
        worker_reports(cluster, query.query_id)  # a worker still runs it
        await core.execute(f"TERMINATE {query.query_id};", {})
        await asyncio.sleep(1.0)
        assert group in await consumer_groups(core.admin)
        worker_reports(cluster, None)
        async with asyncio.timeout(10):
            while group in await consumer_groups(core.admin):  # noqa: ASYNC110 (the broker's)
                await asyncio.sleep(0.1)


async def test_a_dropped_sources_topic_left_by_a_coordinator_is_deleted_by_the_next_unless_a_source_took_it_again(
        kafka: EmbeddedKafka) -> None:
    """A DROP ... DELETE TOPIC whose coordinator went before the delete (here: one that appended
    the commands and went) leaves the topics; the next coordinator to start deletes them, a
    topic the dropped source's query wrote once no worker reports that query. One that a
    CREATE at another coordinator took again meanwhile is kept."""
    service_id = f"leftdrop{next(_ids)}"
    table, stream = f"{service_id}-t", f"{service_id}-u"
    async with coordinator_core(kafka.bootstrap_servers, service_id) as first:
        await first.execute(f"CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='{service_id}-s', partitions=2, "
                            "value_format='json');", {})
        await first.execute(f"CREATE STREAM u (k VARCHAR KEY, v INT) WITH (kafka_topic='{stream}', partitions=1, "
                            "value_format='json');", {})
        await first.execute(f"CREATE TABLE t WITH (kafka_topic='{table}') AS SELECT k, COUNT(*) AS n FROM s GROUP BY k;", {})
        (query,) = first.metastore.queries.values()
        async with first.writer.transaction() as txn:
            await txn.append(Command("DROP TABLE t DELETE TOPIC;"))
            await txn.append(Command("DROP STREAM u DELETE TOPIC;"))
    cluster = Cluster(10, AssignorConfig())
    worker_reports(cluster, query.query_id)  # a worker still runs the query that wrote t
    async with coordinator_core(kafka.bootstrap_servers, service_id, cluster.runs) as second:
        await second.reader.catch_up()
        assert second.metastore.dropped_topics == {table: "T", stream: "U"}
        await second.delete_left_topics(reports_grace_s=0.2)
        await until_deleted(second.admin, [stream])  # no query used it
        await asyncio.sleep(1.0)
        assert await shown(second.admin, table) == 2 and table in second.cleanup.waiting
        async with second.writer.transaction() as txn:  # as another coordinator's CREATE would
            await txn.append(Command(f"CREATE STREAM t2 (k VARCHAR KEY, n BIGINT) WITH (kafka_topic='{table}', "
                                     "partitions=2, value_format='json');"))
        worker_reports(cluster, None)
        async with asyncio.timeout(10):
            await second.cleanup.settled(table)
        assert await shown(second.admin, table) == 2 and second.metastore.source("T2").topic == table


async def test_a_dropped_sources_topic_once_deleted_is_not_deleted_again_when_made_anew_outside_millpond(
        kafka: EmbeddedKafka) -> None:
    """The delete of a dropped source's topic is noted in the command topic: a coordinator that
    starts later finds nothing of it left to delete, and a topic someone made anew under the
    name since (outside Millpond: no CREATE took it) is theirs, kept at every start."""
    service_id = f"noted{next(_ids)}"
    topic = f"{service_id}-u"
    async with coordinator_core(kafka.bootstrap_servers, service_id) as first:
        await first.execute(f"CREATE STREAM u (k VARCHAR KEY, v INT) WITH (kafka_topic='{topic}', partitions=1, "
                            "value_format='json');", {})
        await first.execute("DROP STREAM u DELETE TOPIC;", {})
        await until_deleted(first.admin, [topic])
        async with asyncio.timeout(10):
            while first.metastore.dropped_topics:  # noqa: ASYNC110 (the note is appended in the background)
                await asyncio.sleep(0.05)
        (*_, (_, note)) = await committed_commands(kafka.bootstrap_servers, first.settings.command_topic)
        assert note.deleted_topics == (topic,) and note.statement == ""
        await ensure_topic(first.admin, topic, 3)  # someone else's topic, under the same name
    async with coordinator_core(kafka.bootstrap_servers, service_id) as second:
        await second.reader.catch_up()
        assert second.metastore.dropped_topics == {} and not second.metastore.failed_commands
        await second.delete_left_topics(reports_grace_s=0.2)
        await asyncio.sleep(1.0)
        assert await shown(second.admin, topic) == 3 and second.cleanup.waiting == set()


async def test_a_drop_resent_to_another_coordinator_deletes_what_the_first_left(kafka: EmbeddedKafka) -> None:
    """A DROP ... DELETE TOPIC whose coordinator appended it and went before deleting the topic,
    resent with its request id to another coordinator, is answered as it was, and that
    coordinator deletes the topic (it waited for the next coordinator to start)."""
    service_id = f"resent{next(_ids)}"
    topic = f"{service_id}-u"
    drop = "DROP STREAM u DELETE TOPIC;"
    async with coordinator_core(kafka.bootstrap_servers, service_id) as first:
        await first.execute(f"CREATE STREAM u (k VARCHAR KEY, v INT) WITH (kafka_topic='{topic}', partitions=1, "
                            "value_format='json');", {})
        async with first.writer.transaction() as txn:  # appended; the coordinator goes before the delete
            await txn.append(Command(drop.rstrip(";"), request_id="client-1/0"))  # as the parser names it
    async with coordinator_core(kafka.bootstrap_servers, service_id) as second:
        outcome = await second.execute(drop, {}, request_id="client-1/0", attempt=1)
        assert outcome.message == f"Source U (topic: {topic}) was dropped."
        assert len(await committed_commands(kafka.bootstrap_servers, second.settings.command_topic)) == 2  # not again
        await until_deleted(second.admin, [topic], within_s=20)


async def test_drop_delete_topic_after_terminate_deletes_the_topic_once_the_query_stopped_and_a_create_waits(
        kafka: EmbeddedKafka) -> None:
    """ksqlDB's TERMINATE, then DROP TABLE ... DELETE TOPIC: the table's topic is not deleted
    from under the terminated query's batches still committing to it, and a CREATE naming the
    same topic right after waits for the delete rather than take the old topic (and lose it)."""
    service_id = f"drop{next(_ids)}"
    cluster = Cluster(10, AssignorConfig())
    async with coordinator_core(kafka.bootstrap_servers, service_id, cluster.runs) as core:
        await core.execute(f"CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='{service_id}-s', partitions=2, "
                           "value_format='json');", {})
        await core.execute(f"CREATE TABLE t WITH (kafka_topic='{service_id}-t') AS SELECT k, COUNT(*) AS n FROM s GROUP BY k;",
                           {})
        (query,) = core.metastore.queries.values()
        worker_reports(cluster, query.query_id)  # a worker runs it, and is slow to stop it
        await core.execute(f"TERMINATE {query.query_id};", {})
        await core.execute("DROP TABLE t DELETE TOPIC;", {})
        await asyncio.sleep(1.0)
        assert await shown(core.admin, f"{service_id}-t") == 2
        creating = asyncio.create_task(core.execute(
            f"CREATE STREAM t2 (k VARCHAR KEY, n BIGINT) WITH (kafka_topic='{service_id}-t', partitions=3, value_format='json');",
            {}))
        await asyncio.sleep(0.5)
        assert not creating.done()  # waits for the dropped topic to go
        worker_reports(cluster, None)
        await asyncio.wait_for(creating, 10)
        assert await shown(core.admin, f"{service_id}-t") == 3  # made anew, not the old one kept
        assert await shown(core.admin, f"{service_id}-s") == 2


async def test_a_topic_kafka_refuses_to_create_fails_the_statement_and_nothing_is_recorded(kafka: EmbeddedKafka) -> None:
    """The broker's refusal (a replication factor beyond its one broker) is the statement's
    error, saying what Kafka said; no stream is created over a topic that does not exist."""
    service_id = f"refused{next(_ids)}"
    async with coordinator_core(kafka.bootstrap_servers, service_id) as core:
        with pytest.raises(StatementError, match=r"Kafka refused to create topic .*replication factor 4.*"
                                                 r"InvalidReplicationFactorError"):
            await core.execute(f"CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='{service_id}-s', partitions=1, "
                               "replicas=4, value_format='json');", {})
        assert core.metastore.sources == {} and await topic_partitions(core.admin, f"{service_id}-s") is None
        # The same stream with a replication factor the cluster has is created.
        await core.execute(f"CREATE STREAM s (k VARCHAR KEY, v INT) WITH (kafka_topic='{service_id}-s', partitions=1, "
                           "value_format='json');", {})
        assert "S" in core.metastore.sources and await shown(core.admin, f"{service_id}-s") == 1


async def test_a_resent_statement_is_answered_once_and_a_request_id_used_again_for_another_is_refused(
        kafka: EmbeddedKafka) -> None:
    """A statement resent with its request id is answered from the command topic, not applied
    twice; the same id with another statement (a client reusing ids) is refused, not answered
    with the first one's outcome while nothing is applied."""
    service_id = f"resend{next(_ids)}"
    create = (f"CREATE STREAM a (k VARCHAR KEY, v INT) WITH (kafka_topic='{service_id}-a', partitions=1, "
              "value_format='json');")
    async with coordinator_core(kafka.bootstrap_servers, service_id) as core:
        first = await core.execute(create, {}, request_id="r1/0")
        offset = core.metastore.command_offset
        again = await core.execute(create, {}, request_id="r1/0", attempt=1)
        assert (first.message, again.message) == ("Stream created", "Stream created")
        assert core.metastore.command_offset == offset  # nothing appended for the resend
        with pytest.raises(StatementError, match=r"request id r1 was already used for another statement "
                                                 r"\(CREATE STREAM a .*\); give each request its own id"):
            await core.execute("DROP STREAM a;", {}, request_id="r1/0")
        assert "A" in core.metastore.sources and core.metastore.command_offset == offset
        await core.execute("DROP STREAM a;", {}, request_id="r2/0")
        assert "A" not in core.metastore.sources
