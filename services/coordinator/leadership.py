"""Which coordinator leads, decided by Kafka's own group membership.

Every coordinator of a cluster joins one consumer group subscribed to a one-partition
topic. The group coordinator (the broker) gives that partition to exactly one live member:
that member leads. When it dies, the broker expires it after the group session timeout and
gives the partition to another; when it stops cleanly it leaves the group at once.

A new leader then appends a record naming itself to the same topic and takes the record's
offset + 1 as its *epoch*: every later leader's epoch is larger, so assignments carry a
generation that fences an older leader's at the workers (as a transactional id's epoch
fences an older producer).

The claim (that append) is retried with backoff, each attempt bounded in time, for as long
as this coordinator holds the partition: it ends when it wins, when the partition is
revoked or when the coordinator stops, never by giving up. A coordinator that gave up would
keep the partition, so no other could lead. The claim runs as a task of its own because the
rebalance callback that starts it must return for the group to rebalance again. Status
shows a coordinator still claiming as ELECTING, with its failures.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from aiokafka.structs import RecordMetadata
from tenacity import AsyncRetrying, RetryCallState, stop_never, wait_exponential_jitter
from tenacity.wait import wait_base

from millpond.shared.kafka.connection import KafkaConnection, start_client
from millpond.shared.task_status import now_ms

log = logging.getLogger(__name__)

CLAIM_TIMEOUT_S = 10.0
"""Longest one claim may take before it is tried again."""


class ElectionState(Enum):
    """A coordinator's part in the election."""

    FOLLOWING = "following"
    """Another coordinator holds the leader partition, or none yet."""
    ELECTING = "electing"
    """Holds the partition and is retrying its claim: the cluster has no leader meanwhile."""
    LEADING = "leading"


@dataclass(frozen=True)
class ElectionStatus:
    """Where this coordinator's election stands, for the cluster status."""

    state: ElectionState = ElectionState.FOLLOWING
    failed_claims: int = 0
    """Claims that failed since the partition was assigned (ELECTING only)."""
    last_error: str = ""
    """The last failed claim's error (ELECTING only)."""


class ClaimProducer(Protocol):
    """Appends the claim (an ``AIOKafkaProducer``)."""

    async def send_and_wait(self, topic: str, value: bytes, *, partition: int) -> RecordMetadata:
        """Append one record and wait until it is written."""


class Leadership:
    """Runs this coordinator's membership in the leader-election group."""

    def __init__(self, kafka: KafkaConnection, topic: str, group: str, member: str, session_timeout_ms: int,
                 on_elected: Callable[[int], None], on_deposed: Callable[[], None],
                 claim_wait: wait_base | None = None, claim_timeout: float = CLAIM_TIMEOUT_S):
        self.kafka = kafka
        self.partition = TopicPartition(topic, 0)
        self.group = group
        self.member = member
        self.session_timeout_ms = session_timeout_ms
        self.on_elected = on_elected
        self.on_deposed = on_deposed
        self.claim_wait = claim_wait or wait_exponential_jitter(initial=0.1, max=2)
        """Backoff between failed claims."""
        self.claim_timeout = claim_timeout
        self.epoch = 0
        """This coordinator's epoch while it leads, else 0."""
        self.status = ElectionStatus()
        self._claim: asyncio.Task[None] | None = None

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
        try:
            await start_client(producer)
            consumer.subscribe(topics=[self.partition.topic], listener=listener)
            try:
                await start_client(consumer)
                while not stop.is_set():
                    # Polling keeps the membership alive (aiokafka leaves the group of a consumer
                    # that stops polling); the records themselves are only epochs.
                    await consumer.getmany(timeout_ms=200)
            finally:
                await self.revoked()
                await consumer.stop()  # leaves the group: another coordinator leads at once
        finally:
            await producer.stop()

    def assigned(self, producer: ClaimProducer) -> None:
        """The group gave this coordinator the leader partition: claim it until that works
        or the partition goes."""
        if self._claim is not None and not self._claim.done():
            return
        self.status = ElectionStatus(ElectionState.ELECTING)
        self._claim = asyncio.create_task(self._claim_until_won(producer), name="leader-claim")
        self._claim.add_done_callback(_log_failure)

    async def revoked(self) -> None:
        """The partition was taken back (or the coordinator stops): stop claiming, stop leading."""
        claim, self._claim = self._claim, None
        if claim is not None and not claim.done():
            claim.cancel()
            await asyncio.wait([claim])  # unlike awaiting it, keeps a cancel of our own caller
        self._depose()
        self.status = ElectionStatus()

    async def _claim_until_won(self, producer: ClaimProducer) -> None:
        epoch = 0
        async for attempt in AsyncRetrying(stop=stop_never, wait=self.claim_wait, before_sleep=self._claim_failed):
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a cancel (a revoke)
            # that arrives as the append fails, and the claim would go on.
            with attempt:
                async with asyncio.timeout(self.claim_timeout):
                    epoch = await self._append_claim(producer)
        self.epoch = epoch
        self.status = ElectionStatus(ElectionState.LEADING)
        log.info("leading the cluster", extra={"member": self.member, "epoch": epoch})
        self.on_elected(epoch)

    def _claim_failed(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        described = f"{type(error).__name__}: {error}" if error is not None else "unknown"
        if isinstance(error, TimeoutError):
            described = f"no answer within {self.claim_timeout:g} s"
        self.status = ElectionStatus(ElectionState.ELECTING, state.attempt_number, described)
        log.warning("could not claim the leadership; the cluster has no leader until a claim succeeds",
                    extra={"member": self.member, "failed_claims": state.attempt_number, "error": described})

    async def _append_claim(self, producer: ClaimProducer) -> int:
        """Append the record naming this coordinator; its epoch is the record's offset + 1."""
        record = json.dumps({"leader": self.member, "at_ms": now_ms()}).encode()
        metadata = await producer.send_and_wait(self.partition.topic, record, partition=0)
        return int(metadata.offset) + 1

    def _depose(self) -> None:
        if self.epoch:
            log.info("no longer leading", extra={"member": self.member, "epoch": self.epoch})
            self.epoch = 0
            self.on_deposed()


def _log_failure(claim: asyncio.Task[None]) -> None:
    if not claim.cancelled() and claim.exception() is not None:
        log.error("the leader claim failed", exc_info=claim.exception())


class _Listener(ConsumerRebalanceListener):
    def __init__(self, leadership: Leadership, producer: AIOKafkaProducer):
        self.leadership = leadership
        self.producer = producer

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.leadership.revoked()

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        if self.leadership.partition in assigned:
            self.leadership.assigned(self.producer)
