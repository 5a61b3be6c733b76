"""The partition store read from the serving thread while the processing thread closes it:
a read then says the store is gone (UNAVAILABLE, ask again), never an internal error. A store
opened off the loop whose opener is cancelled is closed by the time the cancel is seen."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from millpond.services.worker.state import store as store_module
from millpond.services.worker.state.store import (
    CHANGELOG_OFFSET,
    INPUT_OFFSET,
    STREAM_TIME,
    STREAM_TIME_HEADER,
    WRITTEN_MS,
    PartitionStore,
    StoreClosed,
    decode_path_segment,
    encode_state,
    open_kept,
    opened,
    partition_dir,
    path_segment,
    remove_store_files,
    sweep_removed,
    wiped,
)
from millpond.services.worker.task import store_path
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import UnavailableError
from tests.unit.services.worker.fake_changelog import Record


def test_reads_racing_a_close_on_another_thread_end_in_store_closed(tmp_path: Path) -> None:
    for attempt in range(10):
        store = PartitionStore(tmp_path / str(attempt))
        store.write({b"k%d" % i: encode_state([[i]]) for i in range(500)}, {INPUT_OFFSET: 500})
        errors: list[BaseException] = []
        reading = threading.Event()
        thread = threading.Thread(target=_read_until_it_fails, args=(store, reading, errors))
        thread.start()
        reading.wait(5)
        store.close()
        thread.join(5)
        assert not thread.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], StoreClosed), errors
        assert isinstance(errors[0], UnavailableError)
        with pytest.raises(StoreClosed):
            store.get(b"k7")


def _read_until_it_fails(store: PartitionStore, reading: threading.Event, errors: list[BaseException]) -> None:
    try:
        while True:
            reading.set()
            assert store.get(b"k7") == [[7]]
            sum(1 for _ in store.items())
    except BaseException as error:
        errors.append(error)


@pytest.mark.parametrize("query_id", ["x/../../tmp/evil", "..", ".", "/abs", "a\\b", "a\x00b", "a\nb", "", "ü/.."])
def test_a_store_named_by_any_id_lands_inside_the_state_dir(tmp_path: Path, query_id: str) -> None:
    state_dir = tmp_path / "state"
    path = store_path(WorkerSettings(worker_id="../worker", state_dir=state_dir), query_id, 3)
    assert path.resolve().is_relative_to(state_dir.resolve())
    assert len(path.relative_to(state_dir).parts) == 3
    PartitionStore(path).close()
    assert [p.name for p in tmp_path.iterdir()] == ["state"]
    assert path == partition_dir(state_dir, "../worker", query_id, 3)


def test_ids_already_safe_keep_their_directory_name() -> None:
    assert path_segment("CTAS_12") == "CTAS_12"
    assert path_segment("worker-1") == "worker-1"


@given(st.text())
def test_the_path_encoding_is_safe_and_reversible(name: str) -> None:
    segment = path_segment(name)
    assert segment and segment not in {".", ".."}
    assert not any(c in segment for c in "/\\\x00") and segment.isprintable() and segment.isascii()
    assert decode_path_segment(segment) == name  # so two names never share a directory


@given(st.text(), st.text())
def test_two_names_never_share_a_segment(a: str, b: str) -> None:
    assert (path_segment(a) == path_segment(b)) == (a == b)


def test_a_changelog_tombstone_deletes_its_window_and_the_stream_time_header_only_advances(tmp_path: Path) -> None:
    """A standby's (or a restore's) copy of a windowed table: a key's last record wins, so a
    tombstone removes the window the active let go, unless a later record wrote it again, and the copy keeps the latest stream
    time the records' headers carried, which a promoted copy closes windows by."""

    def rec(offset: int, key: bytes, value: bytes | None, stream_time: int) -> Record:
        return Record(offset, key, value, ((STREAM_TIME_HEADER, str(stream_time).encode()),))

    store = PartitionStore(tmp_path / "copy")
    try:
        store.apply_changelog([rec(0, b"a", encode_state([1]), 100), rec(1, b"b", encode_state([2]), 100),
                               rec(2, b"c", encode_state([3]), 250)], 5, None)
        assert (store.get(b"a"), store.position(STREAM_TIME)) == ([1], 250)
        store.apply_changelog([rec(3, b"a", None, 240), rec(4, b"b", None, 240), rec(5, b"b", encode_state([9]), 240)],
                              6, None)
        assert (store.get(b"a"), store.get(b"b"), store.get(b"c")) == (None, [9], [3])
        assert store.position(STREAM_TIME) == 250  # a smaller header (an older transaction) never moves it back
        store.apply_changelog([rec(6, b"d", encode_state([4]), 300), rec(7, b"d", None, 300)], 7, None)
        assert (store.get(b"d"), store.position(STREAM_TIME)) == (None, 300)  # written, then let go: gone
    finally:
        store.close()


def test_a_stream_time_at_the_epoch_is_a_time_not_none(tmp_path: Path) -> None:
    """Events stamped 0 (and before the epoch) are events: a copy that reached stream time 0
    keeps it, and a restarted or promoted task closes windows by it, not by -1."""
    store = PartitionStore(tmp_path / "copy")
    try:
        assert store.stream_time() == -1
        header = ((STREAM_TIME_HEADER, b"0"),)
        store.apply_changelog([Record(0, b"a", encode_state([1]), header)], 1, None)
        assert (store.position(STREAM_TIME), store.stream_time()) == (0, 0)
        store.apply_changelog([Record(1, b"b", encode_state([2]), ((STREAM_TIME_HEADER, b"-5"),))], 2, None)
        assert store.stream_time() == 0  # an older transaction's header never moves it back
    finally:
        store.close()


def test_a_kept_store_older_than_its_topic_keeps_tombstones_starts_empty(tmp_path: Path) -> None:
    """``open_kept``: a store last brought up to date within the age keeps its rows and
    positions; an older one (it may have missed a delete the topic no longer holds) opens
    empty, as does one without the time."""
    path = tmp_path / "kept"
    store = PartitionStore(path)
    store.write({b"k": encode_state([1])}, {INPUT_OFFSET: 5, WRITTEN_MS: 1_000})
    store.close()
    kept, dropped = open_kept(path, max_age_ms=500, now=1_400)
    assert not dropped and kept.get(b"k") == [1] and kept.position(INPUT_OFFSET) == 5
    kept.close()
    fresh, dropped = open_kept(path, max_age_ms=500, now=1_600)
    assert dropped and fresh.get(b"k") is None and fresh.position(INPUT_OFFSET) is None
    fresh.close()
    # Never brought up to date (a copy stopped before it caught up): how old is unknown.
    store = PartitionStore(path)
    store.write({b"k": encode_state([1])}, {CHANGELOG_OFFSET: 5000})
    store.close()
    behind, dropped = open_kept(path, max_age_ms=500, now=1_600)
    assert dropped and behind.get(b"k") is None and behind.position(CHANGELOG_OFFSET) is None
    behind.close()
    new, dropped = open_kept(tmp_path / "new", max_age_ms=500, now=1_600)  # nothing in it: kept as it is
    assert not dropped
    new.close()


async def test_a_store_whose_opener_is_cancelled_is_closed_once_the_cancel_is_seen(tmp_path: Path) -> None:
    for _ in range(20):  # the cancel lands at various points of the open
        job = asyncio.create_task(opened(tmp_path / "store"))
        await asyncio.sleep(0)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
        PartitionStore(tmp_path / "store").close()  # free: RocksDB's lock is not held
    store = await opened(tmp_path / "store")
    assert store.position(INPUT_OFFSET) is None
    store.close()


async def test_a_wipe_whose_caller_is_cancelled_ends_before_the_caller_closes_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wipe runs in a thread: a caller cancelled meanwhile waits for it, so its own close
    comes after the wipe's reopen (else the thread reopened the store after that close, and
    nothing closed it: every later open of the path failed on RocksDB's lock)."""
    store = PartitionStore(tmp_path / "s")
    store.write({b"k": b"[1]"}, {INPUT_OFFSET: 5})
    remove = shutil.rmtree

    def slow_rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.2)
        remove(path, *args, **kwargs)

    monkeypatch.setattr(store_module.shutil, "rmtree", slow_rmtree)
    job = asyncio.create_task(wiped(store))
    await asyncio.sleep(0.05)
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    store.close()  # the owner's teardown
    again = PartitionStore(tmp_path / "s")  # free: the wipe's reopen was closed with it
    assert again.position(INPUT_OFFSET) is None and again.get(b"k") is None
    again.close()
    assert [p.name for p in await asyncio.to_thread(lambda: list(tmp_path.iterdir()))] == ["s"]  # old files gone


def test_stores_a_crash_left_aside_are_swept_and_nothing_else(tmp_path: Path) -> None:
    """``remove_store_files`` moves a store aside before deleting it; one a crash left there is
    deleted at the worker's next start (``sweep_removed``), the live stores beside it kept."""
    live = partition_dir(tmp_path, "w-1", "CTAS_T_0", 0)
    PartitionStore(live).close()
    doomed = partition_dir(tmp_path, "w-1", "CTAS_T_0", 1)
    PartitionStore(doomed).close()
    remove_store_files(doomed)
    assert not doomed.exists() and not list(doomed.parent.glob("1.removed-*"))
    crashed = live.with_name("2.removed-0123abcd")  # as a crash mid-delete leaves it
    (crashed / "db").mkdir(parents=True)
    (crashed / "db" / "000001.sst").write_bytes(b"x")
    other = partition_dir(tmp_path, "w-2", "CTAS_T_0", 3).with_name("3.removed-ff")  # another worker's
    other.mkdir(parents=True)
    assert sweep_removed(tmp_path, "w-1") == 1
    assert not crashed.exists() and other.exists()
    reopened = PartitionStore(live)
    reopened.close()
