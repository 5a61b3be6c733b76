"""What a worker reports about each of its tasks, and how SHOW QUERIES / EXPLAIN summarize it.

The protobuf forms are in ``millpond.shared.rpc.converters``."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

STARTING, RESTORING, RUNNING, FAILED = "STARTING", "RESTORING", "RUNNING", "FAILED"
STOPPING = "STOPPING"
"""Still stopping: no longer assigned to its worker, or restarting there (a CREATE OR REPLACE)
before its new run starts. A terminated query's topics stay until no worker reports it."""


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


INT64_MAX = 2**63 - 1
"""The largest value of a protobuf int64."""


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
        """Changelog records the copy has not applied yet, at most the largest int64: the
        offsets come from reports, and their difference must still fit the wire's int64."""
        return min(max(self.end_offset - self.current_offset, 0), INT64_MAX)


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch, as lag reports carry them."""
    return int(time.time() * 1000)


def summarize(reports: Iterable[TaskReport]) -> str:
    """Task states counted, as ksqlDB's ``RUNNING:2`` (empty when nothing reported)."""
    counts = Counter(r.state for r in reports)
    return ", ".join(f"{state}:{counts[state]}" for state in (RUNNING, RESTORING, STARTING, FAILED, STOPPING)
                     if counts[state])
