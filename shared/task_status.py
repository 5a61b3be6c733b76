"""What a worker reports about each of its tasks, and how SHOW QUERIES / EXPLAIN summarize it."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from millpond.coordinator.v1 import coordinator_pb2

STARTING, RESTORING, RUNNING, FAILED = "STARTING", "RESTORING", "RUNNING", "FAILED"
_TO_PROTO = {
    STARTING: coordinator_pb2.TASK_STATE_STARTING,
    RESTORING: coordinator_pb2.TASK_STATE_RESTORING,
    RUNNING: coordinator_pb2.TASK_STATE_RUNNING,
    FAILED: coordinator_pb2.TASK_STATE_FAILED,
}
_FROM_PROTO = {v: k for k, v in _TO_PROTO.items()}


@dataclass(frozen=True)
class TaskReport:
    """One task (query, input partition) on one worker."""

    query_id: str
    partition: int
    state: str
    worker_id: str = ""
    reason: str = ""
    failures: int = 0
    restored_records: int = 0
    records_to_restore: int = 0
    input_offset: int = -1
    start_input_offset: int = -1

    def to_proto(self) -> coordinator_pb2.TaskStatus:
        """As sent in a heartbeat."""
        return coordinator_pb2.TaskStatus(
            task=coordinator_pb2.TaskId(query_id=self.query_id, partition=self.partition),
            state=_TO_PROTO[self.state], reason=self.reason, failures=self.failures,
            restored_records=self.restored_records, records_to_restore=self.records_to_restore,
            input_offset=self.input_offset, start_input_offset=self.start_input_offset, worker_id=self.worker_id,
        )

    @classmethod
    def from_proto(cls, worker_id: str, status: coordinator_pb2.TaskStatus) -> TaskReport:
        """From a heartbeat of ``worker_id``."""
        return cls(
            query_id=status.task.query_id, partition=status.task.partition, worker_id=worker_id,
            state=_FROM_PROTO.get(status.state, STARTING), reason=status.reason, failures=status.failures,
            restored_records=status.restored_records, records_to_restore=status.records_to_restore,
            input_offset=status.input_offset, start_input_offset=status.start_input_offset,
        )

    def describe(self) -> str:
        """One line for EXPLAIN, e.g. ``partition 1 on worker-2: RESTORING 120/400 records``."""
        text = f"partition {self.partition} on {self.worker_id}: {self.state}"
        if self.state == RESTORING:
            text += f" {self.restored_records}/{self.records_to_restore} records"
        if self.input_offset >= 0:
            text += f" | next input offset {self.input_offset}"
        if self.failures:
            text += f" | failures {self.failures}, last: {self.reason}"
        return text


@dataclass(frozen=True)
class StoreLag:
    """How far one local copy (active or standby) of a table partition is behind its changelog."""

    query_id: str
    partition: int
    active: bool
    current_offset: int
    end_offset: int
    last_applied_ms: int = 0
    input_offset: int = -1
    """The next offset of the table's input partition the copy has not processed (-1: unknown)."""

    @property
    def lag(self) -> int:
        """Changelog records the copy has not applied yet."""
        return max(self.end_offset - self.current_offset, 0)

    def to_proto(self) -> coordinator_pb2.StoreLag:
        """As sent in a heartbeat."""
        return coordinator_pb2.StoreLag(
            task=coordinator_pb2.TaskId(query_id=self.query_id, partition=self.partition), active=self.active,
            current_offset=self.current_offset, end_offset=self.end_offset, lag=self.lag,
            last_applied_ms=self.last_applied_ms, input_offset=self.input_offset)

    @classmethod
    def from_proto(cls, lag: coordinator_pb2.StoreLag) -> StoreLag:
        """From a heartbeat."""
        return cls(lag.task.query_id, lag.task.partition, lag.active, lag.current_offset, lag.end_offset,
                   lag.last_applied_ms, lag.input_offset)


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch, as lag reports carry them."""
    return int(time.time() * 1000)


def summarize(reports: Iterable[TaskReport]) -> str:
    """Task states counted, as ksqlDB's ``RUNNING:2`` (empty when nothing reported)."""
    counts = Counter(r.state for r in reports)
    return ", ".join(f"{state}:{counts[state]}" for state in (RUNNING, RESTORING, STARTING, FAILED) if counts[state])
