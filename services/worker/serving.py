"""The local table copies that answer pull queries (Lookup, Scan) and the standby replay
switch: what the worker's servicer serves."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from millpond.services.worker.assignment import TaskAssignment
from millpond.services.worker.state.store import PartitionStore
from millpond.services.worker.task import RowFn, StoreTask
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.errors import LimitError, NotFoundError, StatementError, UnavailableError
from millpond.shared.kafka.serde import window_key_bytes
from millpond.shared.sql import ast, custom_types
from millpond.shared.sql.guard import CACHED_PLAN_CHARS, StatementParser
from millpond.shared.sql.planner import SelectPlan, key_prefix, plan_select
from millpond.shared.task_status import RESTORING, RUNNING


@dataclass(frozen=True)
class LocalCopy:
    """A local copy of a table partition that answers pull queries."""

    store: PartitionStore
    row: RowFn
    """Turns a stored state into the table's row."""
    input_offset: int
    """The next input offset the copy has not processed (-1: unknown)."""


RECHECK_S = 0.05
"""How often a wait for a copy to move on (``Progress``) looks again without being woken: a
copy can move on without a commit or replay telling it (a task's restore ending)."""
TAKE_OVER_POLL_S = 0.05
"""How often a PrepareTakeOver call looks whether the queries it asked for stand by."""
TOKEN_WAIT_S = 30.0
"""The longest a key lookup or scan waits for a copy to reach a consistency token (less when it asks less)."""
SELECT_CACHE_SIZE = 256
"""Pull-query plans a worker keeps for the scans that repeat them."""
SCAN_PAGE_ROWS = 500
"""Rows a scan reads (and its caller converts) between two turns of the serving loop: a few
milliseconds, so heartbeats and lookups keep going through a large scan."""
SLICE_S = 0.005
"""The longest a scan evaluates its WHERE and SELECT list before the serving loop turns, within
a page too: a costly one (an IN list of 3,000 items took a second a page) must not stop the
heartbeats (a worker silent for 500 ms is taken for dead by the routers)."""


class Progress:
    """Wakes what waits on the serving loop for a copy here to move on: a key lookup or scan
    for its consistency token, a stage's positions. The processing loop's commits and standby
    replays tell it (``moved``, from their thread); a waiter that is woken looks again at
    once, so it answers as soon as the copy reached what it waits for, not at a poll's next
    turn, and a copy that moves with nobody waiting crosses no thread."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next: asyncio.Event | None = None
        self.waiting = 0
        """How many wait now (changed on the serving loop only)."""

    def moved(self) -> None:
        """A copy here moved on (called from any thread)."""
        if self.waiting and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the serving loop closed: nobody waits
                self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        woken, self._next = self._next, None
        if woken is not None:
            woken.set()

    @contextlib.contextmanager
    def waiter(self) -> Iterator[None]:
        """Counted as waiting for the block: ``moved`` wakes ``next_move``'s events meanwhile."""
        self.waiting += 1
        try:
            yield
        finally:
            self.waiting -= 1

    def next_move(self) -> asyncio.Event:
        """An event set at the next ``moved`` after this call (inside ``waiter``). Take it
        before looking at the copy: a move between the look and the wait then ends the wait."""
        if self._next is None:
            self._loop = asyncio.get_running_loop()
            self._next = asyncio.Event()
        return self._next

    @staticmethod
    async def wait(move: asyncio.Event, timeout_s: float) -> None:
        """Until ``move`` is set or ``timeout_s`` passed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(move.wait(), max(timeout_s, 0.0))


class BehindToken(UnavailableError):
    """The copy here has not processed its input up to the consistency token's position."""


@dataclass(frozen=True)
class ScanPage:
    """Consecutive rows of one partition of a scan."""

    partition: int
    input_offset: int
    """The position of the copy when the scan found it (``LocalCopy.input_offset``): the pages,
    read one after another, reflect at least that much of the input."""
    rows: list[list[Any]]


def _selector(plan: SelectPlan | None) -> Callable[[list[Any]], list[Any] | None] | None:
    """A table row's result row under ``plan`` (None when its WHERE drops the row); no function
    at all when every row is its own result (no plan, or ``SELECT *`` without a WHERE)."""
    if plan is None or (plan.where is None and len(plan.items) == 1 and plan.items[0].is_star):
        return None
    names = [c.name for c in plan.source.row_columns]
    return lambda values: plan.result(dict(zip(names, values, strict=True)))


async def scan(table: str, copy_of: Callable[[int], LocalCopy], partitions: Iterable[int], limit: int,
               max_rows: int, plan: SelectPlan | None = None) -> AsyncIterator[ScanPage]:
    """The result rows of ``partitions`` of ``table`` under a pull query's ``plan`` (its WHERE
    and SELECT list; None: every row as it is), partition by partition in key order, a page at
    a time (every partition read has at least one page, maybe empty, for its position; none
    after the limit is reached is read, or asked for its copy), letting the event loop run
    between pages. ``copy_of`` finds a partition's copy (``LocalTables.local_table``).

    At most ``limit`` result rows (0: no limit); without a WHERE the limit bounds the rows read
    too. A scan that reads more than ``max_rows`` rows is refused (LimitError) rather than cut
    short: a pull query's answer is whole or an error.
    """
    select = _selector(plan)
    filtering = plan is not None and plan.where is not None
    # A windowed table's lookup of one key reads that key's windows alone (its keys start with it).
    prefix, width = b"", None
    if plan is not None and plan.source.window is not None and (found := key_prefix(plan)) is not None:
        # A window's bounds are 0 or more and below 2**56 ms, so its key's next byte is 0: the
        # prefix skips every longer key that starts with this one (the width check stays).
        prefix, width = found + b"\x00", len(found) + window_key_bytes(plan.source.window)
    most = limit if 0 < limit <= max_rows else max_rows + 1
    read = kept = 0
    due = time.monotonic() + SLICE_S
    for partition in partitions:
        if kept >= most:
            return
        copy = copy_of(partition)
        after: bytes | None = None
        while True:
            # A filter may drop rows, so it reads whole pages; otherwise no more than the limit needs.
            wanted = min(SCAN_PAGE_ROWS, max_rows + 1 - read, (most - kept) if not filtering else
                         SCAN_PAGE_ROWS if kept < most else 0)
            items = copy.store.page(after, wanted, prefix) if wanted > 0 else []
            read += len(items)
            if read > max_rows:
                raise LimitError(
                    f"a scan of {table} reads more than {max_rows} rows on one worker, the most a scan may "
                    "(the workers' max_scan_rows): add a LIMIT (without a WHERE it bounds the scan), look up "
                    "one key with WHERE <key column> = ..., or raise max_scan_rows")
            rows = []
            for key, state in items:
                if (width is None or len(key) == width) and (row := copy.row(key, state)) is not None \
                        and (select is None or (row := select(row)) is not None):
                    rows.append(row)
                    if len(rows) >= most - kept:
                        break
                if time.monotonic() >= due:  # a costly WHERE or SELECT: the loop serves others meanwhile
                    await asyncio.sleep(0)
                    due = time.monotonic() + SLICE_S
            kept += len(rows)
            yield ScanPage(partition, copy.input_offset, rows)
            await asyncio.sleep(0)
            due = time.monotonic() + SLICE_S
            if len(items) < wanted or kept >= most:
                break
            after = items[-1][0]


class LocalTables:
    """Finds the copy of a table partition on this worker that may answer a pull query."""

    def __init__(self, worker_id: str, metastore: Metastore, tasks: TaskAssignment, parser: StatementParser,
                 progress: Progress | None = None):
        self.worker_id = worker_id
        self.metastore = metastore
        self.tasks = tasks
        self.progress = progress or Progress()
        """Wakes the waits for a copy to move on (the tasks' commits tell it)."""
        self.parser = parser
        """Parses the statements scans carry, off the serving loop and within the parse limits."""
        self._selects: dict[tuple[str, int], SelectPlan] = {}

    def local_table(self, table: str, partition: int, allow_standby: bool, min_input_offset: int = 0) -> LocalCopy:
        """The copy of ``partition`` of ``table`` here that may answer a pull query: the active
        task's store once restored (``StoreTask.readable``), or (when allowed) a caught-up standby's. UnavailableError when
        there is none, or when it has not processed the input up to ``min_input_offset``."""
        source = self.metastore.source(table)
        if source.query_id is None:
            raise NotFoundError(f"{table} is not materialized by a query; it cannot be pulled from")
        supervisor = self.tasks.supervisors.get((source.query_id, partition))
        task = supervisor.tasks.get(partition) if supervisor is not None else None
        replica = self.tasks.standbys.get((source.query_id, partition))
        # The tasks run on the processing loop: read each store once (it may close meanwhile).
        if isinstance(task, StoreTask) and (store := task.store) is not None and task.readable:
            copy = LocalCopy(store, task.row, -1 if task.next_input_offset is None else task.next_input_offset)
        elif allow_standby and replica is not None and (store := replica.store) is not None and replica.caught_up:
            copy = LocalCopy(store, replica.row, replica.input_offset)
        else:
            raise UnavailableError(
                f"partition {partition} of {table} is not {'active or standby' if allow_standby else 'active'} "
                f"on worker {self.worker_id}")
        if min_input_offset > 0 and copy.input_offset < min_input_offset:
            raise BehindToken(
                f"partition {partition} of {table} on worker {self.worker_id} has processed its input "
                f"up to offset {copy.input_offset}; the consistency token needs {min_input_offset}")
        return copy

    async def reached_table(self, table: str, partition: int, allow_standby: bool, min_input_offset: int,
                            wait_s: float) -> LocalCopy:
        """``local_table``, waiting up to ``wait_s`` for a copy here that is behind the token
        to process its input up to ``min_input_offset`` (read-your-writes: the write is
        usually in the batch being committed). A copy that is not here is refused at once."""
        started = time.monotonic()
        deadline = started + min(wait_s, TOKEN_WAIT_S)
        with self.progress.waiter():
            while True:
                move = self.progress.next_move()
                try:
                    return self.local_table(table, partition, allow_standby, min_input_offset)
                except BehindToken as behind:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        waited = round((time.monotonic() - started) * 1000)
                        raise BehindToken(f"{behind.message} (after waiting {waited} ms for it; ask again, or with "
                                          f"a longer deadline)") from None
                await self.progress.wait(move, min(left, RECHECK_S))  # the tasks commit on the processing loop

    async def select(self, table: str, statement: str, query_id: str = "", columns: tuple[str, ...] = ()) -> SelectPlan:
        """The plan of a pull query of ``table`` that a router shipped with a scan, planned
        against this worker's metastore (cached per text and metastore version); when the
        router says which query materializes the table (``query_id``) and this worker knows
        another, or which columns its plan gives (``columns``, each ``NAME TYPE``) and this
        worker's gives others, UnavailableError: one of them has not yet read the table's (or a
        custom type's) new definition."""
        known = self.metastore.source(table).query_id
        if query_id and known != query_id:
            raise UnavailableError(f"{table} is materialized by query {known} on worker {self.worker_id}, not by "
                                   f"{query_id} as the router planned it; one of them is behind the command topic")
        cache_key = (statement, self.metastore.command_offset)
        plan = self._selects.get(cache_key)
        if plan is None:
            query = await self.parser.parse_one(statement)
            if not isinstance(query, ast.Query) or self.metastore.source(query.source).name != table:
                raise StatementError(f"a scan of {table} carries a statement that is not a pull query of it: "
                                     f"{statement!r}")
            if custom_types.missing(query, self.metastore.types):
                raise UnavailableError(f"worker {self.worker_id} has not read every type of {', '.join(query.custom_types)} "
                                       "yet: it is behind the command topic")
            plan = plan_select(custom_types.resolved(query, self.metastore.types), self.metastore.source(table))
            if len(statement) <= CACHED_PLAN_CHARS:
                if len(self._selects) >= SELECT_CACHE_SIZE:
                    self._selects.clear()
                self._selects[cache_key] = plan
        if columns and (mine := tuple(f"{name} {type_}" for name, type_ in plan.columns)) != columns:
            raise UnavailableError(f"worker {self.worker_id} plans {statement!r} with the columns {', '.join(mine)}, "
                                   f"not {', '.join(columns)} as the router planned it; one of them is behind the "
                                   "command topic")
        return plan

    async def stage_positions(self, query_id: str, stage: str, input_offsets: Mapping[int, int],
                              timeout_s: float) -> tuple[str, dict[int, int]]:
        """The topic stage ``stage`` of query ``query_id`` writes and, per partition, how far its tasks
        here had written once each had committed its input up to ``input_offsets`` (waiting up
        to ``timeout_s`` for that); UnavailableError when a task is not active here, or did not
        get there in time."""
        deadline = time.monotonic() + timeout_s
        ends: dict[int, int] = {}
        topic = ""
        with self.progress.waiter():
            for partition, offset in sorted(input_offsets.items()):
                topic = await self._stage_position(query_id, stage, partition, offset, deadline, ends)
        return topic, ends

    async def _stage_position(self, query_id: str, stage: str, partition: int, offset: int, deadline: float,
                              ends: dict[int, int]) -> str:
        """``stage_positions`` of one partition: its output ends merged into ``ends``; the topic."""
        while True:
            move = self.progress.next_move()
            supervisor = self.tasks.supervisors.get((query_id, partition))
            task = supervisor.stage_task(stage, partition) if supervisor is not None else None
            if task is None or supervisor is None or supervisor.failed or task.state not in (RUNNING, RESTORING):
                raise UnavailableError(f"partition {partition} of stage {stage!r} of query {query_id} is not "
                                       f"running on worker {self.worker_id}")
            # Read once each: the task commits on the processing loop.
            position, written = task.next_input_offset, task.output_ends
            if position is not None and position >= offset:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise UnavailableError(
                    f"partition {partition} of stage {stage!r} of query {query_id} on worker {self.worker_id} "
                    f"has committed its input up to offset {position}; the consistency token needs {offset}")
            await self.progress.wait(move, min(left, RECHECK_S))
        for out, end in written.items():
            ends[out] = max(ends.get(out, 0), end)
        return task.sink.topic

    def set_standby_replay(self, query_id: str, partition: int, paused: bool) -> int:
        """Pause or resume a standby copy's replay; its changelog position."""
        return self.tasks.pause_standby(query_id, partition, paused)

    async def prepare_take_over(self, keys: Sequence[tuple[str, int]], worker_id: str,
                                wait_s: float) -> list[tuple[str, int]]:
        """Have the Spark queries of these (query id, partition), which worker ``worker_id``
        is about to hand over as it leaves, standing by here (``TaskAssignment.prepare_take_over``):
        those each of whose stages has one, once every one was made or ``wait_s`` passed."""
        announced = self.tasks.prepare_take_over(keys, worker_id)
        deadline = time.monotonic() + wait_s
        # Polled: the state changes on the processing loop's thread, which no event of this loop follows.
        while (standing := self.tasks.take_over_state(keys, announced)) is None and \
                time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(TAKE_OVER_POLL_S)
        return standing or []
