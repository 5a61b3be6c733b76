"""The committed ends of the input partitions whose Spark queries are parked.

A query stage that had no input for a while stops its Spark query (``QuerySupervisor``):
Spark would otherwise ask Kafka for new offsets every ``idle_poll_ms`` per query, which
costs an idle worker a good share of a core. While parked, this watcher follows every
parked partition of the worker with one read_committed consumer (the same last stable
offsets Spark reads up to) that fetches them from their ends: the broker holds each fetch
until something is committed to one of them, or ``parked_fetch_wait_ms`` passed, so the
stage starts again within a round trip of its input's commit, and an idle worker sends one
request a wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

from aiokafka import AIOKafkaConsumer, TopicPartition

from millpond.shared.events import wait_at_most
from millpond.shared.kafka.connection import KafkaConnection, idle_wake_ms, started

log = logging.getLogger(__name__)

RETRY_S = 1.0
"""After a failed fetch (Kafka unreachable for a moment), how long before the watch starts again."""


class InputWatch:
    """Follows the committed ends of the watched partitions in the background."""

    def __init__(self, kafka: KafkaConnection, fetch_wait_ms: int):
        self.kafka = kafka
        self.fetch_wait_ms = fetch_wait_ms
        self.ends: dict[TopicPartition, int] = {}
        """The last committed end (last stable offset) seen per watched partition."""
        self._watched: Counter[TopicPartition] = Counter()
        self.moves = 0
        """How many times an end was seen to move: a waiter that read it before it looked at
        ``ends`` is not left waiting by a move in between (``moved``'s ``since``)."""
        self._moved = asyncio.Event()
        """Set (and then replaced) when an end moved: wakes ``moved``'s waiters."""
        self._changed = asyncio.Event()
        """Set when the watched partitions change: the consumer follows the new set."""
        self._job: asyncio.Task[None] | None = None

    def watch(self, partitions: list[TopicPartition]) -> None:
        """Follow these partitions' ends from now on (until ``unwatch``)."""
        if any(tp not in self._watched for tp in partitions):  # a partition watched already keeps its consumer
            self._changed.set()
        self._watched.update(partitions)
        if self._job is None:
            self._job = asyncio.create_task(self._run(), name="input-watch")

    def unwatch(self, partitions: list[TopicPartition]) -> None:
        """Stop following these (once every ``watch`` of them is undone)."""
        self._watched.subtract(partitions)
        for tp in partitions:
            if self._watched[tp] <= 0:
                del self._watched[tp]
                self.ends.pop(tp, None)
                self._changed.set()

    async def _run(self) -> None:
        while True:
            self._changed.clear()
            watched = set(self._watched)
            if not watched:  # nothing parked: no consumer, no fetches
                await self._changed.wait()
                continue
            try:
                await self._follow(watched)
            except Exception as error:  # Kafka unreachable for a moment: a new consumer asks again
                log.warning("following the parked inputs' ends failed", extra={"error": repr(error)})
                await wait_at_most(self._changed, RETRY_S)

    async def _follow(self, watched: set[TopicPartition]) -> None:
        """Follow ``watched`` with a consumer of their own until the watched set changes: their
        ends asked first (before the consumer fetches, so the question does not wait behind a
        held fetch), then fetched from there on."""
        consumer = AIOKafkaConsumer(**self.kafka.client_args(), isolation_level="read_committed", enable_auto_commit=False,
                                    fetch_max_wait_ms=self.fetch_wait_ms, consumer_timeout_ms=idle_wake_ms(self.fetch_wait_ms))
        async with started(consumer):
            ends = await consumer.end_offsets(list(watched))
            self._seen(ends)
            consumer.assign(list(watched))
            for tp in watched:
                consumer.seek(tp, ends[tp])
            while not self._changed.is_set():
                fetching = asyncio.ensure_future(consumer.getmany(timeout_ms=self.fetch_wait_ms))
                changed = asyncio.ensure_future(self._changed.wait())
                try:
                    await asyncio.wait({fetching, changed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                    if not fetching.done():
                        fetching.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await fetching
                if fetching.done() and not fetching.cancelled():
                    fetching.result()  # a failed fetch is raised (and the watch starts again)
                    # The records themselves are not wanted: their partitions' stable ends are.
                    self._seen({tp: end for tp in watched if (end := consumer.last_stable_offset(tp)) is not None})

    def _seen(self, ends: dict[TopicPartition, int]) -> None:
        """Take the ends found; wake the waiters if one moved."""
        moved = {tp: end for tp, end in ends.items() if tp in self._watched and self.ends.get(tp) != end}
        if moved:
            self.ends.update(moved)
            self.moves += 1
            self._moved.set()
            self._moved = asyncio.Event()

    async def moved(self, since: int, timeout_s: float) -> None:
        """Wait until an end moved (or ``timeout_s`` passed), at once if one did since
        ``moves`` was ``since``: a parked stage sleeps here instead of polling ``ends``, and
        reads ``moves`` before it looks at them."""
        if self.moves != since:
            return
        await wait_at_most(self._moved, timeout_s)

    async def stop(self) -> None:
        """Stop following (the consumer is closed)."""
        job, self._job = self._job, None
        if job is not None:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
