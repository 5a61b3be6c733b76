"""The parked queries' input watch against the real broker: it sees committed input move, and
only committed input (a parked query that started for an open transaction's records would
find nothing to read: Spark reads read_committed), as soon as it is committed (the broker
answers the watch's held fetch then, not at the end of its wait), also on a partition watched
while a fetch was held."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.services.worker.input_watch import InputWatch
from millpond.shared.kafka.admin import ensure_topic
from millpond.shared.kafka.connection import KafkaConnection

pytestmark = pytest.mark.kafka

WAIT_MS = 30_000
"""The watch's fetch wait: far longer than any bound below, so each move must be seen by the
broker answering a held fetch (or by the watch following a changed set at once)."""
SEEN_WITHIN_S = 10


async def test_the_watch_wakes_its_waiters_when_a_committed_end_moves_and_only_then(kafka: EmbeddedKafka) -> None:
    kafka_connection = KafkaConnection(kafka.bootstrap_servers)
    topic = "input-watch-events"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        await ensure_topic(admin, topic, 2)
    finally:
        await admin.close()
    quiet, busy = TopicPartition(topic, 0), TopicPartition(topic, 1)
    producer = AIOKafkaProducer(**kafka_connection.transactional_args("input-watch-test"))
    await producer.start()
    watch = InputWatch(kafka_connection, WAIT_MS)
    try:
        watch.watch([quiet, busy])
        await asyncio.wait_for(watch.moved(watch.moves, 30), 30)  # the first answer: every end is new
        assert watch.ends == {quiet: 0, busy: 0}

        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"v", key=b"k", partition=busy.partition)
        await watch.moved(watch.moves, 1.0)  # an open transaction's records hold the stable offset
        assert watch.ends == {quiet: 0, busy: 0}, "records of an open transaction woke a parked query"

        looked = watch.moves
        waiting = asyncio.ensure_future(watch.moved(looked, 30))
        await asyncio.sleep(0)
        await producer.commit_transaction()
        await asyncio.wait_for(waiting, SEEN_WITHIN_S)
        assert watch.ends[quiet] == 0 and watch.ends[busy] == 2, "the record and its commit marker"
        # A stage that looked at the ends before that move, and waits only now, is not left waiting.
        await asyncio.wait_for(watch.moved(looked, 600), 10)

        watch.unwatch([busy])
        assert watch.ends == {quiet: 0}

        # Watched again while the fetch of the quiet partition alone is held at the broker.
        await asyncio.sleep(1.0)
        looked = watch.moves
        watch.watch([busy])
        await asyncio.wait_for(watch.moved(looked, 30), SEEN_WITHIN_S)
        assert watch.ends == {quiet: 0, busy: 2}
        looked = watch.moves
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"w", key=b"k", partition=busy.partition)
        await producer.commit_transaction()
        await asyncio.wait_for(watch.moved(looked, 30), SEEN_WITHIN_S)
        assert watch.ends == {quiet: 0, busy: 4}
    finally:
        await watch.stop()
        await producer.stop()
