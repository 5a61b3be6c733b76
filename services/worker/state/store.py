"""One RocksDB store per (persistent query, partition), through rocksdict in raw mode.

The default column family holds the table: serialized key -> JSON aggregate state. The
``meta`` column family holds the positions the data reflects: the next input offset to
process, the next changelog offset to restore from and, for a copy read from the changelog,
the input offset of a transaction it applied only part of yet (``state/changelog.py``). Data
and positions change together in one atomic ``WriteBatch``, so after any crash the store is
at a consistent position.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice, takewhile
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteBatch

from millpond.shared.errors import UnavailableError
from millpond.shared.task_status import now_ms
from millpond.shared.teardown import opened_in_thread, run_to_end

_STATES = json.JSONDecoder()
"""Decodes a stored state (its JSON text, ASCII: ``json.loads`` less its checks of the
bytes' encoding, on every pull)."""

INPUT_OFFSET = b"input_offset"
CHANGELOG_OFFSET = b"changelog_offset"
PENDING_INPUT_OFFSET = b"pending_input_offset"
"""The header of the changelog records applied last, whose transaction may have more."""
INPUT_OFFSET_HEADER = "millpond.input.offset"
"""Changelog record header: the next input offset of the batch that wrote the record."""
WRITTEN_MS = b"written_ms"
"""When a store that a compacted topic's tombstones keep right was last brought up to date
(epoch ms): older than the topic keeps a tombstone, it may have missed a delete."""
MARKED_END = b"marked_end"
"""With ``WRITTEN_MS``, for a table's store: the end offset of its topic it was known to reflect
then (read through to it). A topic whose end has not moved since has had nothing appended: the
store missed nothing, however long ago that was."""
STREAM_TIME = b"stream_time"
"""A windowed store's stream time: the latest event time its partition has seen (ms)."""
STREAM_TIME_HEADER = "millpond.stream.time"
"""Windowed changelog record header: the stream time once the batch that wrote it was applied."""


_PLAIN = re.compile(r"[A-Za-z0-9_-]")
_ESCAPE = re.compile(r"%([0-9A-F]{2})")


def path_segment(name: str) -> str:
    """``name`` as one directory name that cannot leave its parent: every character outside
    ``[A-Za-z0-9_-]`` becomes ``%XX`` per UTF-8 byte (``%`` and ``.`` included), so no segment
    holds a path separator, a ``..``, NUL or a control character, and two names never share a
    segment (``decode_path_segment`` reverses it). Ids such as ``CTAS_3`` or ``worker-1`` stay
    as they are. The empty name is ``%``, which no other name encodes to."""
    if not name:
        return "%"
    return "".join(c if _PLAIN.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
                   for c in name)


def decode_path_segment(segment: str) -> str:
    """The name ``path_segment`` encoded into ``segment``."""
    if segment == "%":
        return ""
    raw = bytearray()
    for i, part in enumerate(_ESCAPE.split(segment)):
        raw += bytes.fromhex(part) if i % 2 else part.encode()
    return raw.decode("utf-8", "surrogatepass")


def partition_dir(state_dir: Path, worker_id: str, query_id: str, partition: int) -> Path:
    """The directory of one worker's store of one (query, partition), always inside
    ``state_dir``: the ids are encoded (``path_segment``), never pasted in raw."""
    return state_dir / path_segment(worker_id) / path_segment(query_id) / str(partition)


class StoreClosed(UnavailableError):
    """The store closed (its task stopped or moved) while it was being read: ask again."""


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    return options


class PartitionStore:
    """The state of one task."""

    def __init__(self, path: Path):
        self.path = path
        self._db: Rdict | None = None
        self._meta: Rdict | None = None
        self._meta_handle: Any = None
        self._open()

    def _open(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        db = Rdict(str(self.path), options=_options(), column_families={"meta": Options(raw_mode=True)})
        self._meta, self._meta_handle = db.get_column_family("meta"), db.get_column_family_handle("meta")
        self._db = db

    def wipe(self) -> None:
        """Empty the store, states and positions, as a new one at its path: closed, its files
        deleted, opened again (a read meanwhile gets StoreClosed). Blocking: ``wiped`` runs it
        off the loop."""
        self.close()
        remove_store_files(self.path)
        self._open()

    @property
    def db(self) -> Rdict:
        """The open database (StoreClosed once closed)."""
        if self._db is None:
            raise StoreClosed(f"store {self.path} is closed (its task stopped or moved); ask again")
        return self._db

    def get(self, key: bytes) -> list[Any] | None:
        """The aggregate state of ``key``, or None. Safe from any thread: a close on the
        processing loop meanwhile gives StoreClosed."""
        try:
            raw = self.db.get(key)
        except RuntimeError as error:  # rocksdict's own error for a database closing under the read
            raise self._closed_or(error) from error
        return None if raw is None else _STATES.decode(raw.decode())

    def items(self) -> Iterator[tuple[bytes, list[Any]]]:
        """Every key and its state, in key order (StoreClosed when the store closes meanwhile)."""
        try:
            for key, raw in self.db.items():
                assert isinstance(key, bytes)
                yield key, json.loads(raw)
        except RuntimeError as error:
            raise self._closed_or(error) from error

    def page(self, after: bytes | None, count: int, prefix: bytes = b"") -> list[tuple[bytes, list[Any]]]:
        """Up to ``count`` keys that start with ``prefix`` and their states in key order, from
        the first key after ``after`` (None: from the first key); StoreClosed when the store
        closed meanwhile. A long scan reads page by page with ``after`` the last key it read, and
        holds no iterator between pages: an open iterator keeps RocksDB's lock past ``close``,
        so the task's next copy could not open the store."""
        try:
            start = prefix or None if after is None else after + b"\x00"  # the least key above ``after``
            found: Iterable[tuple[bytes, bytes]] = self.db.items(from_key=start)  # type: ignore[assignment]
            if prefix:
                found = takewhile(lambda item: item[0].startswith(prefix), found)
            items = list(islice(found, count))
        except RuntimeError as error:
            raise self._closed_or(error) from error
        # Every state is a JSON text: the page's states decode as one JSON array, in one call.
        states = json.loads(b"[" + b",".join(raw for _, raw in items) + b"]")
        return [(key, state) for (key, _), state in zip(items, states, strict=True)]

    def _closed_or(self, error: RuntimeError) -> Exception:
        return StoreClosed(f"store {self.path} closed while being read; ask again") if self._db is None else error

    def position(self, name: bytes) -> int | None:
        """A stored position (``INPUT_OFFSET``, ``CHANGELOG_OFFSET``, ``PENDING_INPUT_OFFSET``,
        ``STREAM_TIME``), or None."""
        assert self._meta is not None
        raw = self._meta.get(name)
        return None if raw is None else int(raw)

    def stream_time(self) -> int:
        """The latest event time the states reflect (``STREAM_TIME``), -1 when none is stored;
        0 is a time (events at the epoch), not none."""
        stored = self.position(STREAM_TIME)
        return -1 if stored is None else stored

    def write(self, states: Mapping[bytes, bytes], positions: Mapping[bytes, int],
              deleted: Iterable[bytes] = ()) -> None:
        """Atomically write encoded states, deletions and positions."""
        batch = WriteBatch(raw_mode=True)
        for key, value in states.items():
            batch.put(key, value)
        for key in deleted:
            batch.delete(key)
        for name, offset in positions.items():
            batch.put(name, str(offset).encode(), self._meta_handle)
        self.db.write(batch)

    def apply_changelog(self, records: Sequence[Any], input_offset: int | None, pending_input_offset: int | None) -> int:
        """Apply changelog records (``key``, ``value``, ``offset``, in offset order) and their
        position in one write batch; the next changelog offset to read. ``input_offset`` is the
        input position of the last transaction all of whose records are now applied, and
        ``pending_input_offset`` that of the records' last transaction, which may have more to
        come (``ChangelogProgress`` tells them apart); None leaves a stored one as it is."""
        # Each key's last record wins; a tombstone deletes its key (a window the active let go).
        latest = {r.key: r.value for r in records if r.key is not None}
        states = {key: value for key, value in latest.items() if value is not None}
        deleted = [key for key, value in latest.items() if value is None]
        position = int(records[-1].offset) + 1
        positions = {CHANGELOG_OFFSET: position}
        stream_time = max((t for r in records if (t := header_int(r, STREAM_TIME_HEADER)) is not None), default=None)
        if stream_time is not None:
            positions[STREAM_TIME] = max(stream_time, self.stream_time())
        if input_offset is not None:
            positions[INPUT_OFFSET] = input_offset
        if pending_input_offset is not None:
            positions[PENDING_INPUT_OFFSET] = pending_input_offset
        self.write(states, positions, deleted)
        return position

    def close(self) -> None:
        """Release the database (column-family handles first, or RocksDB keeps its lock)."""
        db, self._db, self._meta, self._meta_handle = self._db, None, None, None
        if db is not None:
            db.close()


_handed: dict[Path, PartitionStore] = {}
"""Stores left open for the next opener of their path (``hand_over``)."""


def hand_over(store: PartitionStore) -> None:
    """Leave ``store`` open for the next ``open_store`` of its path, instead of closing it for
    that opener to reopen: a promoted standby's copy, which its active task opens next. A store
    is open in one place at a time; one nobody claims is closed by ``close_handed``."""
    _handed[store.path] = store


def open_store(path: Path) -> PartitionStore:
    """The store at ``path``: the one handed over for it (``hand_over``), else opened now."""
    store = _handed.pop(path, None)
    return PartitionStore(path) if store is None else store


async def opened(path: Path, max_age_ms: int | None = None, now: int = 0) -> PartitionStore:
    """``open_store`` in a thread, the loop going on meanwhile (``opened_in_thread``); with
    ``max_age_ms``, ``open_kept``'s store instead."""
    def open_() -> PartitionStore:
        return open_store(path) if max_age_ms is None else open_kept(path, max_age_ms, now)[0]
    return await opened_in_thread(open_, PartitionStore.close)


def close_handed() -> None:
    """Close every store handed over and not claimed since (the worker is stopping)."""
    while _handed:
        _handed.popitem()[1].close()


def open_kept(path: Path, max_age_ms: int, now: int) -> tuple[PartitionStore, bool]:
    """The store at ``path``, emptied first when it was last brought up to date (``WRITTEN_MS``)
    more than ``max_age_ms`` before ``now``, or never while it holds positions (a copy stopped
    before it caught up: how old its position is is unknown, and the tombstones after it may
    be gone); whether it was."""
    store = open_store(path)
    if not stale(store, max_age_ms, now):
        return store, False
    store.close()
    remove_store_files(path)
    return PartitionStore(path), True


def mark_up_to_date(store: PartitionStore, end: int) -> None:
    """``store`` reflects its topic up to ``end``, the topic's end now: the time (``WRITTEN_MS``)
    and that end (``MARKED_END``)."""
    store.write({}, {WRITTEN_MS: now_ms(), MARKED_END: end})


def stale(store: PartitionStore, max_age_ms: int, now: int) -> bool:
    """Whether ``store`` was last brought up to date (``WRITTEN_MS``) more than ``max_age_ms``
    before ``now``, or never while it holds positions (how old they are is unknown); a new store
    is not: it has nothing to have missed."""
    written = store.position(WRITTEN_MS)
    if written is None:
        return store.position(INPUT_OFFSET) is not None or bool(store.position(CHANGELOG_OFFSET))
    return now - written > max_age_ms


REMOVED = ".removed-"
"""What a store directory moved aside for deletion has after its name (``remove_store_files``)."""


def remove_store_files(path: Path) -> None:
    """Delete a closed store's directory: moved aside first (one rename), so that a crash
    while its files go leaves no half-deleted store at ``path`` for the next open to fail on
    (what it leaves aside, ``sweep_removed`` deletes at the worker's next start)."""
    aside = path.with_name(f"{path.name}{REMOVED}{uuid.uuid4().hex}")
    path.rename(aside)
    shutil.rmtree(aside, ignore_errors=True)


def sweep_removed(state_dir: Path, worker_id: str) -> int:
    """Delete the worker's store directories that a removal moved aside and a crash (or a
    failed delete) left there; how many. Run before any of the worker's stores opens."""
    leftovers = [p for p in (state_dir / path_segment(worker_id)).glob(f"*/*{REMOVED}*") if p.is_dir()]
    for aside in leftovers:
        shutil.rmtree(aside, ignore_errors=True)
    return len(leftovers)


async def wiped(store: PartitionStore) -> None:
    """``store.wipe()`` in a thread; a caller cancelled meanwhile waits for it to end (else the
    caller's close would race the thread's reopen, leaving the store open and its path locked)."""
    await run_to_end(asyncio.to_thread(store.wipe))


def changelog_input_offset(record: Any) -> int | None:
    """The input position a changelog record's batch reflects, from its header; None for a
    record written without one."""
    return header_int(record, INPUT_OFFSET_HEADER)


def header_int(record: Any, header: str) -> int | None:
    """The integer a record's ``header`` carries, or None without it."""
    for name, value in record.headers or ():
        if name == header:
            return int(value)
    return None


def encode_state(state: list[Any]) -> bytes:
    """A state as stored and as carried in the changelog."""
    return json.dumps(state, separators=(",", ":")).encode()
