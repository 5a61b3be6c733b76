"""Standby replay of a changelog slice, with a fake consumer over an in-memory changelog and a
real RocksDB store: the copy ends with each key's last state, the changelog position past the
last commit marker, and the input position from the records' headers; a restarted replica
resumes where its store is; a paused one applies nothing but keeps its lag honest.

Only ``FakeConsumer`` knows how the replica reads Kafka (patched in as ``AIOKafkaConsumer``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from millpond.services.worker import standby
from millpond.services.worker.standby import StandbyReplica
from millpond.services.worker.state.store import CHANGELOG_OFFSET, INPUT_OFFSET, INPUT_OFFSET_HEADER, PartitionStore, encode_state
from millpond.services.worker.task import store_path
from millpond.shared.config import WorkerSettings

QUERY = "CTAS_T_0"


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
    """The part of AIOKafkaConsumer the replica uses, over ``changelog``; at most ``chunk``
    records per fetch so the replay takes several."""

    changelog = Changelog()
    seeks: list[int] = []
    chunk = 2

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
        records = [r for r in self.changelog.records if r.offset >= self.next][:self.chunk]
        if not records:
            await asyncio.sleep(0.005)  # a real fetch waits up to timeout_ms for data
            return {}
        self.next = records[-1].offset + 1
        return {tp: records}

    async def position(self, tp: TopicPartition) -> int:
        """Past the markers once no record is left (as the consumer skips control records)."""
        if any(r.offset >= self.next for r in self.changelog.records):
            return self.next
        return max(self.next, self.changelog.end)


@pytest.fixture
def changelog(monkeypatch: pytest.MonkeyPatch) -> Iterator[Changelog]:
    """The changelog every replica in the test reads."""
    log = Changelog()
    monkeypatch.setattr(FakeConsumer, "changelog", log)
    monkeypatch.setattr(FakeConsumer, "seeks", [])
    monkeypatch.setattr(standby, "AIOKafkaConsumer", FakeConsumer)
    yield log


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting until {what}")


def replica(tmp_path: Path) -> StandbyReplica:
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)
    return StandbyReplica(settings, QUERY, 0, lambda key, state: [key, *state])


def stored(tmp_path: Path) -> tuple[dict[bytes, list[Any]], int | None, int | None]:
    """The copy on disk once the replica let it go: states, changelog and input positions."""
    store = PartitionStore(store_path(WorkerSettings(worker_id="w", state_dir=tmp_path), QUERY, 0))
    try:
        return dict(store.items()), store.position(CHANGELOG_OFFSET), store.position(INPUT_OFFSET)
    finally:
        store.close()


async def test_a_standby_replays_the_changelog_to_its_end(changelog: Changelog, tmp_path: Path) -> None:
    changelog.commit_batch({b"s1": [[1]], b"s2": [[1]], b"s3": [[4]]}, reaches=10)
    changelog.commit_batch({b"s1": [[2]], b"s4": [[1]]}, reaches=20)  # offsets 4, 5; marker 6; end 7
    copy = replica(tmp_path)
    assert copy.lag() is None  # it has not looked at the changelog: never "caught up"
    copy.start()
    try:
        await until(lambda: copy.caught_up, "the copy caught up")
        lag = copy.lag()
        assert lag is not None
        assert (lag.active, lag.current_offset, lag.end_offset, lag.lag, lag.input_offset) == (False, 7, 7, 0, 20)
        assert lag.last_applied_ms > 0
    finally:
        await copy.stop()
    assert stored(tmp_path) == ({b"s1": [[2]], b"s2": [[1]], b"s3": [[4]], b"s4": [[1]]}, 6, 20)
    assert FakeConsumer.seeks == [0]


async def test_a_restarted_standby_resumes_where_its_store_is(changelog: Changelog, tmp_path: Path) -> None:
    changelog.commit_batch({b"s1": [[1]], b"s2": [[1]]}, reaches=10)
    first = replica(tmp_path)
    first.start()
    await until(lambda: first.caught_up, "the first copy caught up")
    await first.stop()
    changelog.commit_batch({b"s1": [[5]]}, reaches=30)  # offset 3, marker 4

    second = replica(tmp_path)
    second.start()
    try:
        await until(lambda: second.caught_up, "the second copy caught up")
        lag = second.lag()
        assert lag is not None and (lag.current_offset, lag.end_offset, lag.input_offset) == (5, 5, 30)
    finally:
        await second.stop()
    assert FakeConsumer.seeks == [0, 2]  # the second read only what the first had not applied
    assert stored(tmp_path) == ({b"s1": [[5]], b"s2": [[1]]}, 4, 30)


async def test_a_paused_standby_applies_nothing_but_reports_its_lag(changelog: Changelog, tmp_path: Path) -> None:
    changelog.commit_batch({b"s1": [[1]], b"s2": [[1]], b"s3": [[1]]}, reaches=10)
    copy = replica(tmp_path)
    copy.resumed.clear()
    copy.start()
    try:
        await until(lambda: copy.lag() is not None, "the copy knows the end")
        changelog.commit_batch({b"s4": [[1]]}, reaches=11)  # the end moves while paused
        await until(lambda: (lag := copy.lag()) is not None and lag.end_offset == 6, "the paused copy saw the new end")
        lag = copy.lag()
        assert lag is not None and (lag.current_offset, lag.lag, lag.input_offset) == (0, 6, -1)
        assert not copy.caught_up and copy.store is not None and dict(copy.store.items()) == {}

        copy.resumed.set()
        await until(lambda: (lag := copy.lag()) is not None and lag.lag == 0, "the resumed copy caught up")
        assert copy.caught_up
        assert dict(copy.store.items()) == {b"s1": [[1]], b"s2": [[1]], b"s3": [[1]], b"s4": [[1]]}
    finally:
        await copy.stop()
