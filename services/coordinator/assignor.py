"""Task assignment as a pure function: no I/O, plain data in and out.

A task is one input partition of one persistent query. Tasks of the same partition
number go to the same worker, so co-partitioned state stays together; partitions are
spread round-robin over the workers sorted by id, which balances them (counts differ by at
most one per query).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Task:
    """One input partition of one persistent query."""

    query_id: str
    partition: int


def assign(workers: Iterable[str], partitions_by_query: Mapping[str, int]) -> dict[str, list[Task]]:
    """Map each worker to its active tasks."""
    members = sorted(set(workers))
    result: dict[str, list[Task]] = {w: [] for w in members}
    if not members:
        return result
    for query_id in sorted(partitions_by_query):
        for partition in range(partitions_by_query[query_id]):
            result[members[partition % len(members)]].append(Task(query_id, partition))
    return result
