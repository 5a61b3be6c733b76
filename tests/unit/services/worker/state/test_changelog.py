"""Reading a changelog by transaction: ``ChangelogProgress`` alone, then ``ChangelogReader``
over the in-memory changelog of ``fake_changelog.py`` and a real RocksDB store. An input
offset is reported (and stored) only once every record of its transaction is applied, however
the fetches cut the transactions, and a reader restarted anywhere resumes with it."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from millpond.services.worker.state import changelog as changelog_module
from millpond.services.worker.state.changelog import ChangelogProgress, ChangelogReader
from millpond.services.worker.state.store import (
    CHANGELOG_OFFSET,
    INPUT_OFFSET,
    PENDING_INPUT_OFFSET,
    PartitionStore,
    encode_state,
)
from millpond.shared.kafka.connection import KafkaConnection
from tests.unit.services.worker.fake_changelog import Changelog, FakeConsumer, Record

TP = TopicPartition("changelog", 0)


def records(header: int, *offsets: int) -> list[Record]:
    return [Record(o, b"k%d" % o, b"[1]", (("millpond.input.offset", str(header).encode()),)) for o in offsets]


def test_a_transaction_completes_at_a_different_header_or_at_the_end() -> None:
    progress = ChangelogProgress()
    progress.fetched(records(10, 0, 1))
    assert (progress.offset, progress.input_offset, progress.pending) == (2, None, 10)
    progress.fetched(records(10, 2))
    assert (progress.input_offset, progress.pending) == (None, 10)
    progress.fetched(records(10, 3) + records(20, 5))  # a gap (compaction) says nothing; 20 does
    assert (progress.offset, progress.input_offset, progress.pending) == (6, 10, 20)
    assert progress.drained() and (progress.input_offset, progress.pending) == (20, None)
    assert not progress.drained()
    progress.fetched(records(30, 6) + records(40, 7, 8) + records(50, 9, 10))  # three in one fetch
    assert (progress.offset, progress.input_offset, progress.pending) == (11, 40, 50)
    progress.fetched([*records(50, 11), Record(12, b"k", b"[1]", ())])
    assert (progress.offset, progress.input_offset, progress.pending) == (13, 40, 50)


def test_records_without_the_header_change_nothing() -> None:
    progress = ChangelogProgress(input_offset=5, pending=10)
    progress.fetched([Record(7, b"k", b"[1]", ())])
    assert (progress.offset, progress.input_offset, progress.pending) == (8, 5, 10)


def reader(store: PartitionStore) -> ChangelogReader:
    return ChangelogReader(KafkaConnection("unused:9092"), TP, store, fetch_max_wait_ms=25)


async def test_a_fetch_cut_short_in_flight_completes_nothing(changelog: Changelog, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    changelog.commit_batch({b"a": [1], b"b": [1], b"c": [1]}, reaches=10)
    monkeypatch.setattr(FakeConsumer, "chunks", [2, 0, 0, 1, 0])
    store = PartitionStore(tmp_path / "s")
    copy = reader(store)
    await copy.start()
    reported = []
    for _ in range(5):
        await copy.fetch(100)
        reported.append((copy.input_offset, copy.position))
    await copy.stop()
    # Empty fetches before the end (the data still in flight) say nothing; the one that takes the
    # last record takes the commit marker after it too, and completes the transaction at once.
    assert reported == [(-1, 2), (-1, 2), (-1, 2), (10, 4), (10, 4)]
    assert (store.position(INPUT_OFFSET), store.position(CHANGELOG_OFFSET)) == (10, 3)
    store.close()


async def test_a_reader_restarted_after_the_last_record_but_before_the_end_completes_it(
        changelog: Changelog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    changelog.commit_batch({b"a": [1], b"b": [1]}, reaches=10)
    monkeypatch.setattr(FakeConsumer, "chunks", [2])
    monkeypatch.setattr(FakeConsumer, "markers_apart", True)  # the answer with the last record ends before the marker
    store = PartitionStore(tmp_path / "s")
    first = reader(store)
    await first.start()
    await first.fetch(100)
    await first.stop()
    assert (first.input_offset, store.position(INPUT_OFFSET), store.position(PENDING_INPUT_OFFSET)) == (-1, None, 10)

    second = reader(store)
    await second.start()
    assert second.input_offset == -1 and second.progress.pending == 10
    assert await second.fetch(100) == 0  # only the marker is left: the end
    await second.stop()
    assert second.input_offset == 10 and store.position(INPUT_OFFSET) == 10
    store.close()


def test_a_pending_header_a_commit_moved_past_is_stale(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path / "s")
    store.write({}, {CHANGELOG_OFFSET: 9, INPUT_OFFSET: 30, PENDING_INPUT_OFFSET: 20})
    assert ChangelogProgress.of(store) == ChangelogProgress(9, 30, None)
    store.close()


transactions = st.lists(st.integers(1, 30), min_size=1, max_size=8)
fetch_sizes = st.lists(st.integers(0, 40), max_size=40)


@settings(max_examples=60, deadline=None)
@given(sizes=transactions, fetches=fetch_sizes, restart_at=st.integers(0, 40))
def test_the_reported_input_offset_is_always_of_a_wholly_applied_transaction(
        sizes: list[int], fetches: list[int], restart_at: int) -> None:
    """Random transactions, fetches of random sizes (0: cut short in flight), one restart
    anywhere: after each fetch the reported and stored input offset is the header of a
    transaction all of whose records are applied, and the latest one the copy can know to be
    complete (a later header applied, or the end reached); after the end, the last one's."""
    changelog = Changelog()
    last_offset: dict[int, int] = {}  # header -> offset of its transaction's last record
    for n, size in enumerate(sizes):
        header = 10 * (n + 1)
        # Distinct keys within a transaction (one record each), shared across transactions.
        changelog.commit_batch({b"k%d" % ((n * 7 + i) % 50): [header, i] for i in range(size)}, header)
        last_offset[header] = changelog.records[-1].offset
    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory() as tmp:
        patch.setattr(FakeConsumer, "changelog", changelog)
        patch.setattr(FakeConsumer, "seeks", [])
        patch.setattr(FakeConsumer, "chunks", list(fetches))
        patch.setattr(FakeConsumer, "observe", None)
        patch.setattr(changelog_module, "AIOKafkaConsumer", FakeConsumer)
        asyncio.run(_replay(Path(tmp), changelog, len(fetches), restart_at, last_offset))


async def _replay(tmp: Path, changelog: Changelog, fetches: int, restart_at: int, last_offset: dict[int, int]) -> None:
    store = PartitionStore(tmp / "s")
    copy = reader(store)
    await copy.start()
    applied = -1  # the last changelog offset applied

    def check() -> None:
        for reported in (copy.input_offset, store.position(INPUT_OFFSET)):
            assert reported is None or reported == -1 or last_offset[reported] <= applied, (reported, applied)
        assert copy.input_offset == (store.position(INPUT_OFFSET) or -1)
        seen = [int(r.headers[0][1]) for r in changelog.records if r.offset <= applied]
        known = [h for h, after in itertools.pairwise(seen) if h != after]  # a later header applied
        if seen and copy.position >= changelog.end:  # or the end reached
            known.append(seen[-1])
        assert copy.input_offset == (known[-1] if known else -1), (copy.input_offset, known, applied)

    n = 0
    while n < fetches or copy.position < changelog.end:  # the random fetches, then 2 records each to the end
        assert n <= fetches + len(changelog.records) + 2
        if n == restart_at:
            await copy.stop()
            before = copy.input_offset
            copy = reader(store)
            await copy.start()
            assert copy.input_offset == before
        if await copy.fetch(100):
            applied = copy.position - 1
        check()
        n += 1
    await copy.stop()
    assert copy.position == changelog.end
    assert copy.input_offset == store.position(INPUT_OFFSET) == max(last_offset)
    store.close()


async def test_a_store_behind_the_changelogs_first_offset_is_restored_again_from_it(changelog: Changelog,
                                                                                     tmp_path: Path) -> None:
    """A windowed changelog's retention removes old records: a copy kept (its worker away)
    while the tombstones of windows it holds went with them would go on serving those windows.
    Its position below the first offset, it is emptied and restored from there."""
    store = PartitionStore(tmp_path / "s")
    store.write({b"gone": encode_state([1])}, {CHANGELOG_OFFSET: 3, INPUT_OFFSET: 7})
    changelog.end = 10  # offsets 0-9 deleted since (the tombstone of "gone" among them)
    changelog.commit_batch({b"kept": [2]}, reaches=20)
    copy = reader(store)
    await copy.start()
    await copy.fetch(100)
    assert dict(store.items()) == {b"kept": [2]}
    assert (copy.position, copy.input_offset) == (12, 20)
    await copy.stop()
    store.close()
