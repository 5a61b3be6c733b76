"""The end offsets of the input partitions whose Spark queries are parked.

A query stage that had no input for a while stops its Spark query (``QuerySupervisor``):
Spark would otherwise ask Kafka for new offsets every ``idle_poll_ms`` per query, which
costs an idle worker a good share of a core. While parked, this watcher asks instead, for
every parked partition of the worker at once (one ListOffsets request, read_committed: the
same last stable offsets Spark reads up to, every ``parked_poll_ms``), and the stage starts
again when one moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

from aiokafka import AIOKafkaConsumer, TopicPartition

from millpond.shared.kafka.connection import KafkaConnection

log = logging.getLogger(__name__)


class InputWatch:
    """Fetches the end offsets of the watched partitions every ``interval_s``, in the background."""

    def __init__(self, kafka: KafkaConnection, interval_s: float):
        self.kafka = kafka
        self.interval_s = interval_s
        self.ends: dict[TopicPartition, int] = {}
        """The last end offset fetched per watched partition."""
        self._watched: Counter[TopicPartition] = Counter()
        self.moves = 0
        """How many fetches found an end that moved: a waiter that read it before it looked at
        ``ends`` is not left waiting by a move in between (``moved``'s ``since``)."""
        self._moved = asyncio.Event()
        """Set (and then replaced) when a fetch finds an end that moved: wakes ``moved``'s waiters."""
        self._job: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None

    def watch(self, partitions: list[TopicPartition]) -> None:
        """Fetch these partitions' end offsets from now on (until ``unwatch``)."""
        self._watched.update(partitions)
        if self._job is None:
            self._job = asyncio.create_task(self._run(), name="input-watch")

    def unwatch(self, partitions: list[TopicPartition]) -> None:
        """Stop fetching these (once every ``watch`` of them is undone)."""
        self._watched.subtract(partitions)
        for tp in partitions:
            if self._watched[tp] <= 0:
                del self._watched[tp]
                self.ends.pop(tp, None)

    async def _run(self) -> None:
        while True:
            watched = list(self._watched)
            if watched:
                try:
                    if self._consumer is None:
                        self._consumer = self.kafka.end_offsets_consumer()
                        await self._consumer.start()
                    ends = {tp: end for tp, end in (await self._consumer.end_offsets(watched)).items()
                            if tp in self._watched}
                    if any(self.ends.get(tp) != end for tp, end in ends.items()):
                        self.ends.update(ends)
                        self.moves += 1
                        self._moved.set()
                        self._moved = asyncio.Event()
                except Exception as error:  # Kafka unreachable for a moment: the next round asks again
                    log.warning("fetching the end offsets of parked inputs failed", extra={"error": repr(error)})
            await asyncio.sleep(self.interval_s)

    async def moved(self, since: int, timeout_s: float) -> None:
        """Wait until a fetch finds a watched end moved (or ``timeout_s`` passed), at once if
        one did since ``moves`` was ``since``: a parked stage sleeps here instead of polling
        ``ends``, and reads ``moves`` before it looks at them."""
        if self.moves != since:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._moved.wait(), timeout_s)

    async def stop(self) -> None:
        """Stop fetching and close the consumer."""
        job, self._job = self._job, None
        if job is not None:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
