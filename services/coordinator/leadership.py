"""Which coordinator leads, decided by Kafka's own group membership.

Every coordinator of a cluster joins one consumer group subscribed to a one-partition
topic. The group coordinator (the broker) gives that partition to exactly one live member:
that member leads. When it dies, the broker expires it after the group session timeout and
gives the partition to another; when it stops cleanly it leaves the group at once.

A new leader then appends a record naming itself to the same topic and takes the record's
offset + 1 as its *epoch*: every later leader's epoch is larger, so assignments carry a
generation that fences an older leader's at the workers (as a transactional id's epoch
fences an older producer).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from tenacity import AsyncRetrying, stop_after_attempt, wait_exponential_jitter

from millpond.shared.kafka.connection import KafkaConnection
from millpond.shared.task_status import now_ms

log = logging.getLogger(__name__)


class Leadership:
    """Runs this coordinator's membership in the leader-election group."""

    def __init__(self, kafka: KafkaConnection, topic: str, group: str, member: str, session_timeout_ms: int,
                 on_elected: Callable[[int], None], on_deposed: Callable[[], None]):
        self.kafka = kafka
        self.partition = TopicPartition(topic, 0)
        self.group = group
        self.member = member
        self.session_timeout_ms = session_timeout_ms
        self.on_elected = on_elected
        self.on_deposed = on_deposed
        self.epoch = 0
        """This coordinator's epoch while it leads, else 0."""

    async def run(self, stop: asyncio.Event) -> None:
        """Take part in the election until ``stop``; leaving the group hands leadership on."""
        consumer = AIOKafkaConsumer(
            **self.kafka.client_args(), group_id=self.group, enable_auto_commit=False,
            session_timeout_ms=self.session_timeout_ms, heartbeat_interval_ms=max(self.session_timeout_ms // 5, 50),
            isolation_level="read_committed", auto_offset_reset="latest",
            # A coordinator joining does not take the lead from the one that has it.
            partition_assignment_strategy=(StickyPartitionAssignor,))
        producer = AIOKafkaProducer(**self.kafka.client_args(), enable_idempotence=True, acks="all")
        listener = _Listener(self, producer)
        await producer.start()
        try:
            consumer.subscribe(topics=[self.partition.topic], listener=listener)
            await consumer.start()
            try:
                while not stop.is_set():
                    # Polling keeps the membership alive (aiokafka leaves the group of a consumer
                    # that stops polling); the records themselves are only epochs.
                    await consumer.getmany(timeout_ms=200)
            finally:
                self._depose()
                await consumer.stop()  # leaves the group: another coordinator leads at once
        finally:
            await producer.stop()

    async def _elect(self, producer: AIOKafkaProducer) -> None:
        record = json.dumps({"leader": self.member, "at_ms": now_ms()}).encode()
        metadata = await producer.send_and_wait(self.partition.topic, record, partition=0)
        self.epoch = metadata.offset + 1
        log.info("leading the cluster", extra={"member": self.member, "epoch": self.epoch})
        self.on_elected(self.epoch)

    def _depose(self) -> None:
        if self.epoch:
            log.info("no longer leading", extra={"member": self.member, "epoch": self.epoch})
            self.epoch = 0
            self.on_deposed()


class _Listener(ConsumerRebalanceListener):
    def __init__(self, leadership: Leadership, producer: AIOKafkaProducer):
        self.leadership = leadership
        self.producer = producer

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.leadership._depose()

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        if self.leadership.partition not in assigned:
            return
        async for attempt in AsyncRetrying(stop=stop_after_attempt(10), wait=wait_exponential_jitter(multiplier=0.1, max=2),
                                           reraise=True):
            with attempt:
                await self.leadership._elect(self.producer)
