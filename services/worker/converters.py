"""Protobuf <-> domain conversions at the worker's boundaries: the assignment it receives
and the rows it serves (task reports and lags: ``millpond.shared.rpc.converters``)."""

from __future__ import annotations

from collections import defaultdict

from millpond.common.v1 import rows_pb2
from millpond.coordinator.v1 import coordinator_pb2
from millpond.shared.kafka.serde import add_values


def assigned_to(worker_id: str, assignment: coordinator_pb2.Assignment
                ) -> tuple[dict[str, set[int]], set[tuple[str, int]]]:
    """What ``assignment`` gives ``worker_id``: its active partitions per query id, and the
    (query id, partition) it keeps a standby or warm-up copy of."""
    wanted: dict[str, set[int]] = defaultdict(set)
    standbys: set[tuple[str, int]] = set()
    for worker in assignment.workers:
        if worker.worker_id == worker_id:
            for task in worker.active_tasks:
                wanted[task.query_id].add(task.partition)
            standbys = {(t.query_id, t.partition) for t in (*worker.standby_tasks, *worker.warmup_tasks)}
    return dict(wanted), standbys


def row_to_proto(values: list[object]) -> rows_pb2.Row:
    """A table row as served to a router."""
    row = rows_pb2.Row()
    add_values(row.values, values)
    return row
