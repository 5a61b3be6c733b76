"""The input partitions whose Spark queries are parked, fetched for committed records past
where the queries read.

A query stage that had no input for a while stops its Spark query (``QuerySupervisor``):
Spark would otherwise ask Kafka for new offsets every ``idle_poll_ms`` per query, which
costs an idle worker a good share of a core. While parked, this watcher fetches instead,
every parked partition of the worker at once on one read_committed consumer, from where its
query read up to: the broker holds a fetch while nothing comes (``FETCH_WAIT_MS``) and answers
it as soon as a transaction commits records there, so an idle worker sends about one request a
second and a parked stage hears of new input at once. (Asking the partitions' end offsets every
``idle_poll_ms`` instead kept an idle worker's processing loop at 0.95% of a core, against 0.23%
with the fetch: bench.idle's cluster, by thread.) An aborted transaction or a marker alone moves the
partition's end but brings no record, and wakes nothing: the query would read nothing either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from millpond.shared.kafka.connection import KafkaConnection

log = logging.getLogger(__name__)

FETCH_WAIT_MS = 1_000
"""How long the broker holds the watcher's fetch while no record comes (it answers at once when one does)."""
FETCH_BYTES = 16_384
"""The most the watcher fetches of a partition at a time (the broker sends a whole first
record batch even when it is larger): a record past a position is all it looks for, and a
moved partition is fetched only until its parked query resumes and unwatches it."""
RETRY_S = 1.0
"""How long the watcher waits after a failed fetch (Kafka unreachable for a moment) before the next."""


class InputWatch:
    """Fetches the watched partitions in the background; ``moved`` wakes when one got a record."""

    def __init__(self, kafka: KafkaConnection):
        self.kafka = kafka
        self.ends: dict[TopicPartition, int] = {}
        """Per watched partition that moved: the offset after the last record fetched. A
        partition is fetched on from its least watched position, so a watcher whose query read
        up to an offset is woken once a committed record at or past it comes."""
        self._watched: Counter[TopicPartition] = Counter()
        self._from: dict[TopicPartition, int] = {}
        """Where each watched partition is fetched from: the least position it was watched
        from while watched (an unwatch leaves it: ``ends`` then says how far records came)."""
        self._changed = asyncio.Event()
        """Set when the watched partitions change: the fetching loop assigns them anew."""
        self._moved = asyncio.Event()
        """Set (and then replaced) when a fetch brought records: wakes ``moved``'s waiters."""
        self._job: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None

    def watch(self, positions: dict[TopicPartition, int]) -> None:
        """Fetch these partitions from these offsets (where their queries read up to) from now
        on, until ``unwatch``."""
        for tp, offset in positions.items():
            self._watched[tp] += 1
            self._from[tp] = min(offset, self._from.get(tp, offset))
        self._changed.set()
        if self._job is None:
            self._job = asyncio.create_task(self._run(), name="input-watch")

    def unwatch(self, partitions: list[TopicPartition]) -> None:
        """Stop fetching these (once every ``watch`` of them is undone)."""
        self._watched.subtract(partitions)
        for tp in partitions:
            if self._watched[tp] <= 0:
                del self._watched[tp]
                self._from.pop(tp, None)
                self.ends.pop(tp, None)
        self._changed.set()

    async def _run(self) -> None:
        while True:
            self._changed.clear()
            watched = dict(self._from)
            if not watched:
                await self._changed.wait()
                continue
            try:
                await self._fetch(watched)
            except Exception as error:  # Kafka unreachable for a moment: fetch again after a pause
                log.warning("fetching the parked inputs failed", extra={"error": repr(error)})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), RETRY_S)

    async def _fetch(self, watched: dict[TopicPartition, int]) -> None:
        """Fetch ``watched`` from their positions until the watched partitions change."""
        if self._consumer is None:
            self._consumer = AIOKafkaConsumer(
                **self.kafka.client_args(), isolation_level="read_committed", enable_auto_commit=False,
                fetch_max_wait_ms=FETCH_WAIT_MS, max_partition_fetch_bytes=FETCH_BYTES, fetch_max_bytes=FETCH_BYTES)
            await self._consumer.start()
        consumer = self._consumer
        consumer.assign(list(watched))
        for tp, offset in watched.items():
            consumer.seek(tp, self.ends.get(tp, offset))  # what was fetched before is not fetched again
        changed = asyncio.ensure_future(self._changed.wait())
        fetch: asyncio.Future[dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]] | None = None
        try:
            while not changed.done():
                fetch = asyncio.ensure_future(consumer.getmany(timeout_ms=10 * FETCH_WAIT_MS))
                await asyncio.wait({fetch, changed}, return_when=asyncio.FIRST_COMPLETED)
                if not fetch.done():
                    return
                ends = {tp: records[-1].offset + 1 for tp, records in fetch.result().items()
                        if records and tp in self._from}
                if ends:
                    self.ends.update(ends)
                    self._moved.set()
                    self._moved = asyncio.Event()
        finally:
            changed.cancel()
            if fetch is not None:
                fetch.cancel()  # a fetch under way, when the watched partitions changed or the watch stops

    async def moved(self, timeout_s: float) -> None:
        """Wait until a fetch brings a watched partition's records (or ``timeout_s`` passed): a
        parked stage sleeps here instead of polling ``ends``."""
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
