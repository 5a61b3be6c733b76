"""A changelog partition in memory and the part of ``AIOKafkaConsumer`` that reads it, for the
standby replay, the restore and ``ChangelogReader`` itself. The ``changelog`` fixture
(``conftest.py``) patches ``FakeConsumer`` in where the reader makes its consumer.

Like a ``read_committed`` consumer: every record returned is committed, the last stable
offset is one past the last commit marker, and once no record is left the position moves
past the markers. Fetches take ``chunks`` records each (then ``chunk``); a chunk of 0 is a
fetch whose wait ended while the data was still in flight (empty, position unchanged).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aiokafka import TopicPartition

from millpond.services.worker.state.store import INPUT_OFFSET_HEADER, encode_state


@dataclass(frozen=True)
class Record:
    """A changelog record as the consumer returns it (the fields the replay reads)."""

    offset: int
    key: bytes
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


@dataclass
class Changelog:
    """One changelog partition: records, and offsets where transaction markers sit."""

    records: list[Record] = field(default_factory=list)
    end: int = 0
    """The last stable offset (one past the last commit marker)."""

    def commit_batch(self, states: dict[bytes, list[Any]], reaches: int) -> None:
        """What one task commit writes: a record per key with the batch's input position, then
        the transaction's commit marker."""
        header = ((INPUT_OFFSET_HEADER, str(reaches).encode()),)
        for key, state in states.items():
            self.records.append(Record(self.end, key, encode_state(state), header))
            self.end += 1
        self.end += 1  # the commit marker


class FakeConsumer:
    """The part of AIOKafkaConsumer the reader uses, over ``changelog``."""

    changelog: ClassVar[Changelog] = Changelog()
    seeks: ClassVar[list[int]] = []
    chunk: ClassVar[int] = 2
    chunks: ClassVar[list[int]] = []
    """Sizes of the next fetches, consumed in order (of every consumer), before ``chunk``."""
    observe: ClassVar[Callable[[], None] | None] = None
    """Called as each fetch begins: what the caller reports after the fetch before."""
    waits: ClassVar[bool] = False
    """Whether fetches wait at the broker, as aiokafka's do: a fetch is sent in the background
    from the seek on (and again as each answer is taken), and the broker holds it until
    something lies past the position or ``fetch_max_wait_ms`` passed. Else a fetch with nothing
    to return returns after 5 ms."""

    markers_apart: ClassVar[bool] = False
    """Whether a fetch's answer ends before the commit marker after its last record (a byte
    limit cut it there), so the position passes the marker only with the next fetch; else the
    marker comes in the same answer and the position passes it with the records."""

    def __init__(self, fetch_max_wait_ms: int = 500, **_: Any):
        self.next = 0
        self.before_marker = False
        """Whether the last answer ended before a marker (``markers_apart``)."""
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.held: asyncio.Future[None] | None = None
        """(``waits``) The fetch out at the broker. One connection's requests are answered in
        order: any other request of this consumer waits for it."""

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        if self.held is not None:
            self.held.cancel()

    def assign(self, partitions: list[TopicPartition]) -> None:
        pass

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append(offset)
        self.next = offset
        if self.waits:
            self.held = asyncio.ensure_future(self._fetched())

    async def _fetched(self) -> None:
        """The broker's answer to a fetch: once records or commit markers lie past the position
        (a commit's marker comes with its records), or the fetch's wait ran out."""
        waited = 0.0
        while self.next >= self.changelog.end and waited < self.fetch_max_wait_ms / 1000:
            await asyncio.sleep(0.001)
            waited += 0.001

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        if self.held is not None and not self.held.done():
            await asyncio.wait({self.held})
        return {tp: self.changelog.end for tp in partitions}

    async def beginning_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        if self.held is not None and not self.held.done():
            await asyncio.wait({self.held})
        return {tp: self.changelog.records[0].offset if self.changelog.records else self.changelog.end
                for tp in partitions}

    def last_stable_offset(self, tp: TopicPartition) -> int:
        return self.changelog.end

    async def getmany(self, tp: TopicPartition, timeout_ms: int = 0,
                      max_records: int | None = None) -> dict[TopicPartition, list[Record]]:
        if FakeConsumer.observe is not None:
            FakeConsumer.observe()
        size = self.chunks.pop(0) if self.chunks else self.chunk
        if self.waits:
            self.held = self.held or asyncio.ensure_future(self._fetched())
            await asyncio.wait({self.held}, timeout=timeout_ms / 1000)  # cancelled, the fetch stays out
            if not self.held.done():
                return {}
            self.held = asyncio.ensure_future(self._fetched())  # the next goes out as this answer is taken
        records = [r for r in self.changelog.records if r.offset >= self.next][:size]
        if records:
            self.next = records[-1].offset + 1
            self.before_marker = self.markers_apart
        else:
            self.before_marker = False
            if not self.waits:
                await asyncio.sleep(0.005)
        self._past_markers()  # the next fetch starts past the markers that came in this answer
        return {tp: records} if records else {}

    async def position(self, tp: TopicPartition) -> int:
        self._past_markers()
        return self.next

    def _past_markers(self) -> None:
        """Past the markers once no record is left (as the consumer skips control records), unless
        the last answer ended before them."""
        if not self.before_marker and not any(r.offset >= self.next for r in self.changelog.records):
            self.next = max(self.next, self.changelog.end)
