"""Reading a table partition's changelog into a copy of its store, transaction by transaction:
the restore of an active task (to the end it saw when it started) and a standby's replay
(forever) are the two callers of ``ChangelogReader``.

Every changelog record carries the next input offset of the micro-batch that wrote it
(``INPUT_OFFSET_HEADER``), the same value on every record of one Kafka transaction and a
larger one on each later transaction (one transactional producer per partition). A copy may
say it reflects an input offset only once it applied every record of that transaction, and
one transaction can span several fetches. With ``read_committed`` every record returned
belongs to a committed transaction whose records all lie below the last stable offset (LSO),
so a transaction is known complete when

- a later record carries a different header value, or
- the copy's position reached an LSO: every record below it was returned and applied.

An offset gap proves nothing (compaction makes gaps), and neither does an empty fetch on
its own: aiokafka returns nothing when its wait ends while a fetch is still in flight.

``ChangelogProgress`` is that rule, without I/O. The store keeps its two input offsets (the
last complete transaction's and the one still pending) in the same write batch as the data
and the changelog offset, so a copy restarted mid-transaction resumes with both.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from millpond.services.worker.state.store import (
    CHANGELOG_OFFSET,
    INPUT_OFFSET,
    PENDING_INPUT_OFFSET,
    PartitionStore,
    changelog_input_offset,
    wiped,
)
from millpond.shared.kafka.connection import KafkaConnection, idle_wake_ms, start_client
from millpond.shared.teardown import bounded, run_to_end

log = logging.getLogger(__name__)

MAX_RECORDS = 10_000
"""Records per fetch at most."""
CONSUMER_STOP_TIMEOUT_S = 10.0
"""How long ``stop`` waits for the consumer to close."""


@dataclass
class ChangelogProgress:
    """Where one copy stands in its changelog, and which input offset it may report."""

    offset: int = 0
    """The next changelog offset to apply."""
    input_offset: int | None = None
    """The header of the last transaction whose every record is applied: the input offset
    the copy reflects (None: none known)."""
    pending: int | None = None
    """The header of the last records applied, while their transaction may have more."""

    @classmethod
    def of(cls, store: PartitionStore) -> ChangelogProgress:
        """The progress a store's positions record (a pending header that is not above the
        complete one is stale: a task's commit moved the input offset past it)."""
        complete, pending = store.position(INPUT_OFFSET), store.position(PENDING_INPUT_OFFSET)
        if pending is not None and complete is not None and pending <= complete:
            pending = None
        return cls(store.position(CHANGELOG_OFFSET) or 0, complete, pending)

    def fetched(self, records: Sequence[Any]) -> None:
        """Records applied, in offset order: a header unlike the pending one completes the
        pending transaction (a record without the header says nothing either way). Only the
        last transaction in the fetch and the one before it matter, so the records are read
        from the end, and not at all past the first when every header is the same (headers
        increase strictly: the first and the last equal, every record between has it too)."""
        if not records:
            return
        self.offset = int(records[-1].offset) + 1
        headers = (changelog_input_offset(r) for r in reversed(records))
        last = next((h for h in headers if h is not None), None)
        if last is None:
            return
        previous = None  # the header before the last transaction's records in this fetch
        if changelog_input_offset(records[0]) != last:
            previous = next((h for h in headers if h is not None and h != last), None)
        if previous is not None:
            self.input_offset = previous
        elif self.pending is not None and self.pending != last:
            self.input_offset = self.pending
        self.pending = last

    def drained(self) -> bool:
        """The copy reached a last stable offset, so the pending transaction is complete;
        whether that changed the input offset."""
        if self.pending is None:
            return False
        self.input_offset, self.pending = self.pending, None
        return True


async def wiped_if_behind(store: PartitionStore, consumer: AIOKafkaConsumer,
                          positions: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """The first offsets of the partitions ``store`` holds ``positions`` in (the next offset it
    applies of each); the store is emptied (``wiped``) when one of them is below its partition's
    first offset: retention (or DeleteRecords) removed records it never applied, the tombstones
    of what it holds among them, so it is built again from the first offsets as a new copy is
    (Kafka Streams wipes a store whose offset is out of range likewise)."""
    firsts: dict[TopicPartition, int] = await consumer.beginning_offsets(list(positions))
    if behind := {f"{tp.topic}-{tp.partition}": offset for tp, offset in positions.items() if offset < firsts[tp]}:
        log.warning("retention removed records the store never applied: it is built again from the first offsets",
                    extra={"store": str(store.path), "store_offsets": behind,
                           "first_offsets": {f"{tp.topic}-{tp.partition}": o for tp, o in firsts.items()}})
        await wiped(store)
    return firsts


class ChangelogReader:
    """Applies one changelog partition to a store through a ``read_committed`` consumer, from
    the store's changelog position on. ``start``, then ``fetch`` as often as the caller wants
    (up to an end, or forever), then ``stop``."""

    def __init__(self, kafka: KafkaConnection, changelog: TopicPartition, store: PartitionStore,
                 fetch_max_wait_ms: int):
        self.changelog = changelog
        self.store = store
        # A windowed changelog is compact,delete: its first offset moves up as old windows go,
        # and a fresh copy's position 0 is then out of range. "earliest" reads from the first
        # offset left; aiokafka's default ("latest") would skip the whole log.
        self.consumer = AIOKafkaConsumer(**kafka.client_args(), isolation_level="read_committed",
                                         enable_auto_commit=False, fetch_max_wait_ms=fetch_max_wait_ms,
                                         consumer_timeout_ms=idle_wake_ms(fetch_max_wait_ms), auto_offset_reset="earliest")
        self.progress = ChangelogProgress()
        self._stable = -1
        """The highest last stable offset seen (fetches and end offsets)."""

    @property
    def position(self) -> int:
        """The next changelog offset the store will apply (past commit markers once read)."""
        return self.progress.offset

    @property
    def input_offset(self) -> int:
        """The input offset the store reflects, counting complete transactions only; -1: unknown."""
        return -1 if self.progress.input_offset is None else self.progress.input_offset

    async def start(self) -> None:
        """Connect, and seek to where the store is; a store behind the changelog's retention (a
        windowed changelog's removes old records) is restored again from its first offset
        (``wiped_if_behind``)."""
        await start_client(self.consumer)
        self.consumer.assign([self.changelog])
        self.progress = ChangelogProgress.of(self.store)
        if self.progress.offset > 0:
            await wiped_if_behind(self.store, self.consumer, {self.changelog: self.progress.offset})
            self.progress = ChangelogProgress.of(self.store)
        self.consumer.seek(self.changelog, self.progress.offset)

    async def end_offset(self) -> int:
        """The changelog's end now (its last stable offset, as the consumer reads committed)."""
        end: int = (await self.consumer.end_offsets([self.changelog]))[self.changelog]
        self._stable = max(self._stable, end)
        return end

    def last_stable_offset(self) -> int | None:
        """The last stable offset from the latest fetch; None before one answered."""
        stable = self.consumer.last_stable_offset(self.changelog)
        return stable if stable is not None and stable >= 0 else None

    async def fetch(self, timeout_ms: int) -> int:
        """Fetch once and apply what came, data and positions in one write batch; how many
        records were applied. The position then moves past the commit markers fetched."""
        batches = await self.consumer.getmany(self.changelog, timeout_ms=timeout_ms, max_records=MAX_RECORDS)
        records = batches.get(self.changelog, [])
        progress = self.progress
        if records:
            progress.fetched(records)
            self.store.apply_changelog(records, progress.input_offset, progress.pending)
        # Past the commit markers read with the records (the consumer skips them as it takes a
        # fetch's answer), or alone: else a transaction's end would wait for the next fetch, which
        # the broker holds until something new is committed.
        progress.offset = max(progress.offset, await self.consumer.position(self.changelog))
        self._stable = max(self._stable, self.last_stable_offset() or -1)
        if self._stable >= 0 and progress.offset >= self._stable and progress.drained():
            assert progress.input_offset is not None
            self.store.write({}, {INPUT_OFFSET: progress.input_offset})
        return len(records)

    async def stop(self) -> None:
        """Disconnect (the store stays open: it belongs to the caller); to the end even if the
        caller is cancelled meanwhile, and bounded (an overrun or error is logged, not raised)."""
        await run_to_end(bounded(self.consumer.stop(), CONSUMER_STOP_TIMEOUT_S, "stop the changelog consumer",
                                 {"changelog": f"{self.changelog.topic}-{self.changelog.partition}"}))
