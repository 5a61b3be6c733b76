"""The parked inputs' watch against the real broker: it wakes for committed records past the
watched positions, and for nothing else (an aborted transaction, a partition not watched)."""

from __future__ import annotations

import itertools
import time

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.services.worker.input_watch import FETCH_WAIT_MS, InputWatch
from millpond.shared.kafka.admin import end_offsets, ensure_topic
from millpond.shared.kafka.connection import KafkaConnection

pytestmark = pytest.mark.kafka
_ids = itertools.count()
WAKE_TIMEOUT_S = 30.0


async def _topic(kafka: EmbeddedKafka, partitions: int) -> str:
    name = f"watched-{next(_ids)}-{time.monotonic_ns()}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        await ensure_topic(admin, name, partitions)
    finally:
        await admin.close()
    return name


async def _transaction(producer: AIOKafkaProducer, topic: str, partition: int, records: int, commit: bool = True) -> None:
    await producer.begin_transaction()
    for n in range(records):
        await producer.send(topic, b"%d" % n, partition=partition)
    await (producer.commit_transaction() if commit else producer.abort_transaction())


async def _woken(watch: InputWatch, tp: TopicPartition, past: int) -> int:
    """The watch's end for ``tp`` once it is past ``past`` (failing after ``WAKE_TIMEOUT_S``)."""
    deadline = time.monotonic() + WAKE_TIMEOUT_S
    while watch.ends.get(tp, -1) <= past:
        assert time.monotonic() < deadline, f"{tp} not seen past {past}: {watch.ends}"
        await watch.moved(deadline - time.monotonic())
    return watch.ends[tp]


async def test_committed_records_past_a_position_wake_it_and_aborted_ones_do_not(kafka: EmbeddedKafka) -> None:
    topic = await _topic(kafka, 2)
    zero, one = TopicPartition(topic, 0), TopicPartition(topic, 1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, transactional_id=f"{topic}-producer")
    await producer.start()
    watch = InputWatch(KafkaConnection(kafka.bootstrap_servers))
    try:
        await _transaction(producer, topic, 0, 3)
        await _transaction(producer, topic, 1, 2)
        ends = await end_offsets(kafka.bootstrap_servers, topic, 2, "read_committed")
        watch.watch({zero: ends[0], one: ends[1]})
        # Aborted records move the partition's end, but bring nothing a query would read.
        await _transaction(producer, topic, 0, 5, commit=False)
        await watch.moved(3 * FETCH_WAIT_MS / 1000)
        assert watch.ends == {}

        await _transaction(producer, topic, 1, 4)
        assert await _woken(watch, one, ends[1]) > ends[1]
        assert zero not in watch.ends

        # A second watcher of partition 1 from further on is woken only by records past its position.
        later = (await end_offsets(kafka.bootstrap_servers, topic, 2, "read_committed"))[1]
        watch.watch({one: later})
        watch.unwatch([one])  # the first watcher resumed
        assert watch.ends.get(one, -1) <= later
        await _transaction(producer, topic, 1, 1)
        assert await _woken(watch, one, later) > later

        watch.unwatch([one])
        assert one not in watch.ends
        await _transaction(producer, topic, 0, 1)
        assert await _woken(watch, zero, ends[0]) > ends[0]
    finally:
        await watch.stop()
        await producer.stop()


async def test_a_partition_watched_again_is_fetched_from_its_new_position(kafka: EmbeddedKafka) -> None:
    topic = await _topic(kafka, 1)
    tp = TopicPartition(topic, 0)
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, transactional_id=f"{topic}-producer")
    await producer.start()
    watch = InputWatch(KafkaConnection(kafka.bootstrap_servers))
    try:
        await _transaction(producer, topic, 0, 2)
        watch.watch({tp: 0})  # behind the records there: woken at once
        first = await _woken(watch, tp, 0)
        watch.unwatch([tp])
        assert watch.ends == {}
        (end,) = (await end_offsets(kafka.bootstrap_servers, topic, 1, "read_committed")).values()
        assert first <= end
        watch.watch({tp: end})
        await watch.moved(3 * FETCH_WAIT_MS / 1000)
        assert watch.ends == {}  # nothing past the new position yet
        await _transaction(producer, topic, 0, 1)
        assert await _woken(watch, tp, end) > end
    finally:
        await watch.stop()
        await producer.stop()
