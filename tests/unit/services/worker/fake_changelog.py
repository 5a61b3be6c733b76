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
    """Whether a fetch with nothing to return waits for records up to its ``timeout_ms``, as
    the broker holds it (else it returns after 5 ms)."""

    def __init__(self, **_: Any):
        self.next = 0

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def assign(self, partitions: list[TopicPartition]) -> None:
        pass

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append(offset)
        self.next = offset

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.changelog.end for tp in partitions}

    def last_stable_offset(self, tp: TopicPartition) -> int:
        return self.changelog.end

    async def getmany(self, tp: TopicPartition, timeout_ms: int = 0,
                      max_records: int | None = None) -> dict[TopicPartition, list[Record]]:
        if FakeConsumer.observe is not None:
            FakeConsumer.observe()
        size = self.chunks.pop(0) if self.chunks else self.chunk
        waited = 0.0
        while not (records := [r for r in self.changelog.records if r.offset >= self.next][:size]):
            if not self.waits or waited >= timeout_ms / 1000:
                await asyncio.sleep(0.005)
                return {}
            await asyncio.sleep(0.001)
            waited += 0.001
        self.next = records[-1].offset + 1
        return {tp: records}

    async def position(self, tp: TopicPartition) -> int:
        """Past the markers once no record is left (as the consumer skips control records)."""
        if any(r.offset >= self.next for r in self.changelog.records):
            return self.next
        return max(self.next, self.changelog.end)
