"""The local table copies that answer pull queries (Lookup, Scan) and the standby replay
switch: what the worker's servicer serves."""

from __future__ import annotations

from dataclasses import dataclass

from millpond.services.worker.assignment import RowFn, TaskAssignment
from millpond.services.worker.state.store import PartitionStore
from millpond.services.worker.task import StoreTask
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.errors import NotFoundError, UnavailableError
from millpond.shared.task_status import RUNNING


@dataclass(frozen=True)
class LocalCopy:
    """A local copy of a table partition that answers pull queries."""

    store: PartitionStore
    row: RowFn
    """Turns a stored state into the table's row."""
    input_offset: int
    """The next input offset the copy has not processed (-1: unknown)."""


class LocalTables:
    """Finds the copy of a table partition on this worker that may answer a pull query."""

    def __init__(self, worker_id: str, metastore: Metastore, tasks: TaskAssignment):
        self.worker_id = worker_id
        self.metastore = metastore
        self.tasks = tasks

    def local_table(self, table: str, partition: int, allow_standby: bool, min_input_offset: int = 0) -> LocalCopy:
        """The copy of ``partition`` of ``table`` here that may answer a pull query: the running
        active task's store, or (when allowed) a caught-up standby's. UnavailableError when
        there is none, or when it has not processed the input up to ``min_input_offset``."""
        source = self.metastore.source(table)
        if source.query_id is None:
            raise NotFoundError(f"{table} is not materialized by a query; it cannot be pulled from")
        supervisor = self.tasks.supervisors.get((source.query_id, partition))
        task = supervisor.tasks.get(partition) if supervisor is not None else None
        replica = self.tasks.standbys.get((source.query_id, partition))
        # The tasks run on the processing loop: read each store once (it may close meanwhile).
        if isinstance(task, StoreTask) and (store := task.store) is not None and task.state == RUNNING:
            copy = LocalCopy(store, task.row, -1 if task.next_input_offset is None else task.next_input_offset)
        elif allow_standby and replica is not None and (store := replica.store) is not None and replica.caught_up:
            copy = LocalCopy(store, replica.row, replica.input_offset)
        else:
            raise UnavailableError(
                f"partition {partition} of {table} is not {'active or standby' if allow_standby else 'active'} "
                f"on worker {self.worker_id}")
        if min_input_offset > 0 and copy.input_offset < min_input_offset:
            raise UnavailableError(
                f"partition {partition} of {table} on worker {self.worker_id} has processed its input "
                f"up to offset {copy.input_offset}; the consistency token needs {min_input_offset}")
        return copy

    def set_standby_replay(self, query_id: str, partition: int, paused: bool) -> int:
        """Pause or resume a standby copy's replay; its changelog position."""
        return self.tasks.pause_standby(query_id, partition, paused)
