"""Standby and warm-up replicas: copies of a table's partition kept on another worker by
replaying its changelog continuously (ksqlDB's and Kafka Streams' standby tasks): a GROUP
BY's changelog topic, or the topic a table-table join's result is materialized from, which
is its changelog (``state/table_topic.py``); beside a table aggregation's, a copy of its
regroup store from that store's changelog, so a promoted standby regroups at once too.

The copy lives where the active task's store would live on this worker, with the changelog
position in the same write batch as the data, so when the coordinator promotes this worker
the active task restores only the changelog tail after that position. Transactions that
never committed are never seen (read_committed), and the input offset a copy reports is that
of a transaction it applied completely (``state/changelog.py``; the restore reads the same way).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiokafka import TopicPartition
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

from millpond.services.worker.state.changelog import CONSUMER_STOP_TIMEOUT_S, ChangelogReader
from millpond.services.worker.state.store import MARKED_END, WRITTEN_MS, PartitionStore, hand_over, opened
from millpond.services.worker.state.table_topic import TableTopicReader
from millpond.services.worker.task import store_path, table_store_max_age
from millpond.shared.catalog.names import changelog_topic
from millpond.shared.catalog.sources import DataSource
from millpond.shared.config import WorkerSettings
from millpond.shared.events import wait_at_most
from millpond.shared.kafka.connection import start_client
from millpond.shared.task_status import StoreLag, now_ms
from millpond.shared.teardown import bounded, cancel_and_wait, gather_or_cancel, run_to_end

log = logging.getLogger(__name__)
POLL_MS = 100
"""How often a paused copy asks its changelog's end (for an honest lag)."""
FETCH_WAIT_MS = 10_000
"""How long a copy's fetch waits at the broker while nothing new is committed. The broker
answers as soon as a transaction commits, its marker with its records (a read_committed
consumer waiting 2 s had its position past each of 8 commits' markers 0-24 ms after the
commit, as at 100 ms), so a copy is as fresh as at 100; but at 100 each copy of an idle
worker fetched ten times a second (a turn of its loop and an aiokafka fetch each time):
bench.idle with one standby per partition: the busier worker at 5.6-6.0% of a core at 100,
3.9-4.4% at 500, 3.2-4.4% at 2,000 (3.3-3.7% with the consumers' idle wakes, ``idle_wake_ms``).
At 10,000, with the parked inputs' watch on a held fetch too (``InputWatch``), an idle
worker's processing loop took 0.18-0.22% of a core against 0.55-0.58% (two alternated pairs,
per thread). The copy asks its end on a consumer of its own (``_replay``): on the fetching
one, the question would wait behind the held fetch."""
MARK_EVERY_MS = 60_000
"""How often a caught-up copy of a store that ages (``max_age_ms``) marks itself up to date."""
STOP_TIMEOUT_S = 15.0
"""How long ``stop`` waits for the replay to close; past it, it closes in the background."""


class StandbyReplica:
    """Keeps one partition of one query's table up to date from its changelog, until stopped."""

    def __init__(self, settings: WorkerSettings, query_id: str, partition: int,
                 row: Callable[[bytes, list[Any]], list[Any] | None], table: DataSource | None = None,
                 changelog: str | None = None, store: str | None = None, max_age_ms: int | None = None,
                 moved: Callable[[], None] | None = None):
        self.settings = settings
        self.query_id = query_id
        self.partition = partition
        self.changelog = TopicPartition(changelog or changelog_topic(settings.service_id, query_id), partition)
        """The query's changelog, or that of another store of the query (``changelog``: a table
        aggregation's regroup store's, whose copy lives under ``store``'s name)."""
        self.store_name = store or query_id
        self.max_age_ms = max_age_ms
        """For a store whose changelog's tombstones expire (a regroup store's): a kept copy last
        brought up to date longer ago starts over (``open_kept``), and the copy says when it
        was last caught up (``WRITTEN_MS``), as its task's store does."""
        self.table = table
        """A materialized table whose own topic the copy replays; None: the query's changelog."""
        self.position = 0
        """The next changelog offset the copy will apply."""
        self.end: int | None = None
        """The changelog's last stable offset when last fetched; None before the first fetch."""
        self.last_applied_ms = 0
        self.input_offset = -1
        """The next input offset the copy reflects: the changelog header of the last transaction
        it applied every record of (-1: unknown)."""
        self.moved = moved
        """Told each time the copy's input offset moves on (a transaction applied)."""
        self.resumed = asyncio.Event()
        """Cleared while an operator paused the replay."""
        self.resumed.set()
        self.row = row
        """Turns a stored state into the table's row, for standby reads."""
        self.store: PartitionStore | None = None
        """The copy, open while replaying."""
        self.caught_up = False
        """Whether the copy has once reached the changelog's end as it was when replay started;
        before that it may lack whole keys and must not answer reads."""
        self._job: asyncio.Task[None] | None = None
        self._fetch: asyncio.Future[int] | None = None
        """The replay's fetch while it waits (``pause`` cancels it)."""
        self._hand_over = False
        """Whether the replay, once stopped, leaves its store open for the active task (``stop``)."""

    def lag(self) -> StoreLag | None:
        """How far the copy is behind, for the lag reports; None until it knows the end (a copy
        that has not looked yet must not count as caught up)."""
        if self.end is None:
            return None
        return StoreLag(self.query_id, self.partition, False, self.position, max(self.end, self.position),
                        self.last_applied_ms, self.input_offset)

    def pause(self, paused: bool) -> None:
        """Pause or resume the replay. A pause stops a fetch that waits at the broker (up to
        ``FETCH_WAIT_MS``) at once: nothing committed after it is applied."""
        if not paused:
            self.resumed.set()
            return
        self.resumed.clear()
        if self._fetch is not None:
            self._fetch.cancel()

    def start(self) -> None:
        """Replay in the background until ``stop``."""
        self._job = asyncio.create_task(self._run(), name=f"standby-{self.query_id}-{self.partition}")

    async def stop(self, timeout_s: float | None = None, hand_over: bool = False) -> bool:
        """Stop replaying and release the store (so an active task can open it); False (logged)
        when that overran ``timeout_s`` (``STOP_TIMEOUT_S``): it then completes in the background.
        ``hand_over``: the store is left open for the active task that this worker starts for
        the partition (``state.store.hand_over``), which resumes from the copy's position without
        closing and reopening it, on a promotion's critical path."""
        self._hand_over = hand_over
        job, self._job = self._job, None
        if job is None:
            return True
        return await cancel_and_wait(job, STOP_TIMEOUT_S if timeout_s is None else timeout_s, "standby replica",
                                     {"query": self.query_id, "partition": self.partition})

    async def _run(self) -> None:
        retrying = AsyncRetrying(retry=retry_if_exception_type(Exception), wait=wait_exponential_jitter(multiplier=0.2, max=10),
                                 before_sleep=lambda state: log.warning("standby replay failed; retrying", extra={
                                     "query": self.query_id, "partition": self.partition,
                                     "changelog": self.changelog.topic,
                                     "error": repr(state.outcome.exception() if state.outcome else None)}))
        async for attempt in retrying:
            with attempt:
                await self._replay()

    async def _replay(self) -> None:
        path = store_path(self.settings, self.store_name, self.partition)
        if self.table is not None:  # a table's topic: its tombstones may expire (``table_store_max_age``)
            self.max_age_ms = await table_store_max_age(self.settings.kafka, self.table)
        # A table copy's age is the reader's to judge: kept as it is where the topic has nothing past it.
        store = self.store = await opened(path, self.max_age_ms if self.table is None else None, now_ms())
        marked = 0
        try:
            reader: ChangelogReader | TableTopicReader = (
                ChangelogReader(self.settings.kafka, self.changelog, store, fetch_max_wait_ms=FETCH_WAIT_MS)
                if self.table is None
                else TableTopicReader(self.settings.kafka, self.table, self.partition, store, fetch_max_wait_ms=FETCH_WAIT_MS,
                                      max_age_ms=self.max_age_ms))
            # The end is asked on a consumer that never fetches: on the reader's, the question
            # would wait behind its fetch, which the broker holds up to FETCH_WAIT_MS while nothing
            # is committed (a copy of an empty changelog, or of a table's topic at its end, had no
            # lag to report for that long).
            ends = self.settings.kafka.end_offsets_consumer()
        except BaseException:  # e.g. an unreadable TLS file: the retry must find the store's lock free
            self.store = None
            store.close()
            raise
        replayed = self.changelog if self.table is None else TopicPartition(self.table.topic, self.partition)

        async def end_offset() -> int:
            end: int = (await ends.end_offsets([replayed]))[replayed]
            return end

        try:
            await gather_or_cancel(reader.start(), start_client(ends))
            self.position, self.input_offset = reader.position, reader.input_offset
            self.end = start_end = await end_offset()
            self.caught_up = self.position >= start_end  # a copy at the end need not wait for a fetch
            log.info("standby started", extra={"query": self.query_id, "partition": self.partition,
                                               "changelog": self.changelog.topic,
                                               "position": self.position, "end": self.end})
            while True:
                if not self.resumed.is_set():  # paused: apply nothing, but keep the lag honest
                    self.end = await end_offset()
                    await wait_at_most(self.resumed, POLL_MS / 1000)
                    continue
                # A fetch applies what it got in one write batch after its last await: cancelled, it applied nothing.
                self._fetch = asyncio.ensure_future(reader.fetch(FETCH_WAIT_MS))
                try:
                    applied = await self._fetch
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise  # stopped, not paused
                    continue  # a pause cancelled the fetch (and a resume may have come since)
                finally:
                    self._fetch = None
                if applied:
                    self.last_applied_ms = now_ms()
                # Past commit markers after an empty fetch; the input offset of complete transactions only.
                moved = reader.input_offset != self.input_offset
                self.position, self.input_offset = reader.position, reader.input_offset
                if moved and self.moved is not None:
                    self.moved()
                stable = reader.last_stable_offset()
                if stable is not None:
                    self.end = stable
                self.caught_up = self.caught_up or self.position >= start_end
                if (self.max_age_ms is not None and stable is not None and self.position >= stable
                        and now_ms() - marked >= MARK_EVERY_MS):  # up to date now: not a store left behind
                    marked = now_ms()
                    store.write({}, {WRITTEN_MS: marked, MARKED_END: stable})
        finally:
            self.store, self.caught_up, self.end = None, False, None
            # Every write is one atomic batch between awaits: a cancelled replay leaves the
            # store at a consistent position, safe to hand over.
            if self._hand_over:
                hand_over(store)
            else:
                store.close()
            await run_to_end(asyncio.gather(reader.stop(), bounded(
                ends.stop(), CONSUMER_STOP_TIMEOUT_S, "stop the standby's end offsets consumer",
                {"query": self.query_id, "partition": self.partition})))
