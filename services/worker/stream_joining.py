"""A stream-stream join's task, as ksqlDB's ``s1 [INNER|LEFT|RIGHT|FULL OUTER] JOIN s2
WITHIN ... [GRACE PERIOD ...] ON s1.key = s2.key`` and Kafka Streams' ``KStream#join(KStream,
JoinWindows)``.

Both streams reach the task through the query's joined topic (``table_joining``: each
stream's stage copies partition ``p`` into partition ``p``, keyed by the side's place and
the key, stamped with the record's event time). The task reads it in offset order, with one
stream time per partition: the largest event time so far, over both sides. It keeps each
side's records until that side's largest event time is more than the retention past them
(the window's whole span, before plus after, and the grace period), as Kafka Streams' join
store of each side keeps them. Each record:

- joins every kept record of the other side with the same key whose time is within the
  window (a left record at ``t`` takes right records from ``t - before`` to ``t + after``; a
  right record at ``t``, left records from ``t - after`` to ``t + before``), each result
  stamped with the later of the two times;
- is kept itself, unless it is already more than the retention behind its side's largest
  time: then it is **late** (counted, not logged), and joins only what is kept.

Where this differs from Kafka Streams (checked record for record against its
``TopologyTestDriver``): a record exactly the retention behind is still kept (Kafka Streams
lets it go a millisecond earlier, so at WITHIN 0 with no grace it joins nothing); and Kafka
Streams may emit a waiting outer record later than its window's close (its check of whether
any could close uses the arriving record's side's window, and the oldest waiting time it
keeps can be stale), so there a record that comes meanwhile can join it instead.

A record of an outer side (LEFT: the left; RIGHT: the right; FULL: both) that joins nothing
when it comes is emitted with NULLs for the other side once its window closes, that is once
stream time passes its time plus the window's reach past it plus the grace period, and not
at all if a record joined it by then; at once if its window had closed when it came (as
Kafka Streams emits it). Without GRACE PERIOD (``JoinWindow.eager``) it is emitted at once,
as ksqlDB's legacy joins do, and a later record can join it all the same.

A stream joined after another JOIN joins, as its left side, the rows the stages before it
wrote, by their time. A stream-stream stage before it writes a row up to its retention behind
its own stream time (``JoinSpec.behind``), so here both sides' records are kept that much
longer, and the right side's unmatched records wait that much longer for the rows that can
still join them.

State: the buffers, the records awaiting their window's close and the stream time, in
memory. A batch's results and input offset go in one Kafka transaction; a task that starts
(after a crash, or on a new worker) replays the joined topic up to its committed offset
without output, which rebuilds exactly that state. The joined topic keeps the retention (and
``behind``) plus a day, and at least a week.
"""

from __future__ import annotations

import bisect
import heapq
import logging
from dataclasses import dataclass, field
from typing import Any

from millpond.services.worker.table_joining import GatheredJoinTask, KeyedSlice, split_rekeyed
from millpond.services.worker.task import BadRecord
from millpond.shared import metrics
from millpond.shared.catalog.queries import PersistentQuery
from millpond.shared.catalog.sources import DataSource
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.sql.joins import ROWTIME, joined

log = logging.getLogger(__name__)
REPLAY_EXPIRE_EVERY = 10_000
"""How often (in joined-topic offsets) a replay lets go of records no later one can join."""
OUTER_SIDES = {"INNER": (), "LEFT": (0,), "RIGHT": (1,), "FULL": (0, 1)}
"""The sides whose unmatched records a join type emits with NULLs for the other side."""


class StreamJoinBroken(MillpondError):
    """A commit failed after the task's in-memory state took the batch: the task must restart."""


@dataclass
class Buffered:
    """One record in its side's buffer."""

    time: int
    offset: int
    row: list[Any]
    key: Any
    """Its own KEY column's value (a stream joined on another column keeps it beside the join key)."""
    joined: bool = False
    """Whether a record of the other side has joined it (an outer side's is then not emitted with NULLs)."""


@dataclass
class Buffer:
    """One side's records of one key, in time order (arrival order among equal times), with
    their times apart, so a window is found by bisection."""

    times: list[int] = field(default_factory=list)
    records: list[Buffered] = field(default_factory=list)

    def add(self, record: Buffered) -> None:
        at = bisect.bisect_right(self.times, record.time)
        self.times.insert(at, record.time)
        self.records.insert(at, record)

    def within(self, low: int, high: int) -> list[Buffered]:
        """The records whose time is in ``[low, high]``."""
        return self.records[bisect.bisect_left(self.times, low):bisect.bisect_right(self.times, high)]

    def expire(self, limit: int) -> None:
        """Let go of the records before ``limit``."""
        cut = bisect.bisect_left(self.times, limit)
        del self.times[:cut], self.records[:cut]


@dataclass
class JoinState:
    """One partition's buffers, records awaiting their window's close, and stream time."""

    stream_time: int | None = None
    side_times: list[int | None] = field(default_factory=lambda: [None, None])
    """Per side, the largest event time of its records so far: what its records' retention is
    measured against (Kafka Streams' window store of each side keeps its own)."""
    buffers: dict[tuple[int, bytes], Buffer] = field(default_factory=dict)
    """Per (side, key), the side's records."""
    closing: list[tuple[int, int, int, bytes, Buffered]] = field(default_factory=list)
    """A heap of (close time, arrival, side, key, record) for the outer sides' unmatched records."""
    arrivals: int = 0


class StreamJoinTask(GatheredJoinTask):
    """Joins partition ``p`` of two streams through the joined topic (see the module)."""

    def __init__(self, settings: WorkerSettings, query: PersistentQuery, source: DataSource,
                 sink: DataSource, partition: int, stage: str = ""):
        super().__init__(settings, query, source, sink, partition, stage)
        spec = query.plan.join
        assert spec is not None
        right = spec.stage_tables()[0]  # a stream joined after another JOIN: the rows so far are the left
        assert right.within is not None
        window = right.within
        self.before, self.after, self.grace = window.before_ms, window.after_ms, window.grace_ms
        self.outer = OUTER_SIDES[right.type]
        self.rowtime = joined(spec.stream_prefix, ROWTIME)
        """The joined row's ROWTIME (the left record's time), which WHERE and SELECT may read
        (rows joined before this stage carry the stream record's own)."""
        self.join_state = JoinState()
        self.broken = False
        self.rekeyed = (query.plan.key_expression is not None, right.rekey is not None)
        """Which sides are joined on another column than their key (their records' keys: ``rekeyed``)."""
        self.behind = spec.behind()
        """How far behind its stream time a stream-stream stage before this one may write a row
        (0 for a query's first stage): every record is kept that much longer, and the right
        side's unmatched records wait that much longer for the rows so far (the left side)."""
        self.retention = window.retention_ms + self.behind
        """How far behind its side's largest time a record is still kept."""
        self.eager = window.eager

    def reach(self, side: int) -> int:
        """How far past a record of ``side`` its window reaches: the other side's later
        records it joins, and for the right side how far behind them the left side's rows
        may come."""
        return self.after if side == 0 else self.before + self.behind

    async def start(self) -> None:
        """Fence any older owner and rebuild the state up to the committed offset."""
        await self._open_producer()
        committed = await self._committed_input_offset()  # fenced: it is final
        if committed is not None:
            def replayed(key: bytes, value: bytes | None, timestamp: int, offset: int) -> None:
                self._process(key, value, timestamp, offset, None, [])
                if offset % REPLAY_EXPIRE_EVERY == 0:  # expiry at any point changes no result
                    self._expire()

            await self._replay(None, committed, replayed)
            self._expire()
        self.next_input_offset = self.start_input_offset = committed
        log.info("task started", extra={"query": self.query.query_id, "partition": self.partition,
                                        "input_offset": self.next_input_offset,
                                        "stream_time": self.join_state.stream_time})

    def _process(self, key: bytes, value: bytes | None, timestamp: int, offset: int,
                 results: list[tuple[bytes, bytes, int]] | None, bad: list[BadRecord]) -> bool:
        """One joined-topic record; its results (key, value, timestamp) and those of the
        windows it closes go to ``results`` (None while replaying). False when it is late
        (too far behind its side's largest time to be kept)."""
        side = key[0] if key else 2
        if side > 1 or value is None:  # a tombstone joins nothing, as in Kafka Streams
            return True
        k, own = split_rekeyed(key[1:]) if self.rekeyed[side] else (key[1:], key[1:])
        decoded = self._decode(side, own, value, offset, bad if results is not None else None)
        if decoded is None:
            return True
        own_key, row = decoded
        state = self.join_state
        state.stream_time = timestamp if state.stream_time is None else max(state.stream_time, timestamp)
        own_time = state.side_times[side]
        own_time = state.side_times[side] = timestamp if own_time is None else max(own_time, timestamp)
        other_time = state.side_times[1 - side]
        this = Buffered(timestamp, offset, row, own_key)
        low, high = (timestamp - self.before, timestamp + self.after) if side == 0 else (
            timestamp - self.after, timestamp + self.before)
        others = state.buffers.get((1 - side, k))
        if others is not None and other_time is not None:
            for other in others.within(max(low, other_time - self.retention), high):
                other.joined = this.joined = True
                if results is not None:
                    pair = (this, other) if side == 0 else (other, this)
                    self._emit(results, k, pair[0], pair[1], max(timestamp, other.time), offset, bad)
        on_time = timestamp >= own_time - self.retention
        if on_time:
            state.buffers.setdefault((side, k), Buffer()).add(this)
        if side in self.outer and not this.joined:
            closes = timestamp + self.reach(side)
            if self.eager or closes < state.stream_time:
                if results is not None:
                    self._emit_alone(results, k, side, this, offset, bad)
            else:
                state.arrivals += 1
                heapq.heappush(state.closing, (closes + self.grace, state.arrivals, side, k, this))
        self._close_windows(results, offset, bad)
        return on_time

    def _close_windows(self, results: list[tuple[bytes, bytes, int]] | None, offset: int, bad: list[BadRecord]) -> None:
        """Emit the outer sides' unmatched records whose window closed by stream time."""
        state = self.join_state
        assert state.stream_time is not None
        while state.closing and state.closing[0][0] < state.stream_time:
            _, _, side, k, record = heapq.heappop(state.closing)
            if not record.joined and results is not None:
                self._emit_alone(results, k, side, record, offset, bad)

    def _emit_alone(self, results: list[tuple[bytes, bytes, int]], key: bytes, side: int, record: Buffered,
                    offset: int, bad: list[BadRecord]) -> None:
        """An outer side's record with NULLs for the other side, at its own time."""
        self._emit(results, key, record if side == 0 else None, record if side == 1 else None, record.time, offset, bad)

    def _emit(self, results: list[tuple[bytes, bytes, int]], key: bytes, left: Buffered | None,
              right: Buffered | None, timestamp: int, offset: int, bad: list[BadRecord]) -> None:
        rows = [None if left is None else left.row, None if right is None else right.row]
        extra = {self.rowtime: None if left is None else left.time}
        keys = [None if left is None else left.key, None if right is None else right.key]
        if self.output.regroup is not None:  # a chain's tables join next: every column, keyed by their expression
            written = self.output.keyed(self._joined_row(keys, rows, extra), key, timestamp, offset, bad)
            if written is not None:
                results.append((*written, timestamp))
            return
        value = self._value(keys, rows, offset, bad, extra)
        if value is not None:
            results.append((key, value, timestamp))

    def _expire(self) -> None:
        """Let go of every buffered record past the retention (no later record joins it)."""
        state = self.join_state
        for (side, k), buffer in list(state.buffers.items()):
            side_time = state.side_times[side]
            assert side_time is not None  # it has a record
            buffer.expire(side_time - self.retention)
            if not buffer.times:
                del state.buffers[(side, k)]

    async def commit(self, batch: KeyedSlice) -> bool:
        """Join one micro-batch slice exactly once; False when it was joined before."""
        assert self.producer is not None
        if self.broken:
            raise StreamJoinBroken(f"task {self.query.query_id}/{self.partition}: an earlier commit failed after "
                                   "its batch entered the join's state; the task restarts from its committed offset")
        if self.applied(batch):
            return False
        self.broken = True  # until the commit is done: the state below takes the batch first
        results: list[tuple[bytes, bytes, int]] = []
        bad = list(batch.bad)
        late = 0
        for offset, key, value, timestamp in batch.records:
            if not self._process(key, value, timestamp, offset, results, bad):
                late += 1
        async with self._transaction():
            # Rows a chain's next stage reads carry their time in a column: stamped now, the topic's
            # retention cannot delete an old one before that stage reads it.
            stamped = self.output.regroup is None
            for result_key, result, time_ms in results:
                await self._send(self.sink.topic, result, result_key, partition_for(result_key, self.sink.partitions),
                                 timestamp_ms=time_ms if stamped else None)
            await self._send_bad(sorted(bad, key=lambda b: b.offset))
            await self._commit_input(batch.last_offset + 1)
        self.broken = False
        self._expire()
        self.next_input_offset = batch.last_offset + 1
        if late:
            metrics.RECORDS_LATE.labels(self.query.query_id, str(self.partition)).inc(late)
        return True
