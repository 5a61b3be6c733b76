"""A GROUP BY over a table's first stage: each changed row of the table taken out of the
group it was counted in and put into its new one, as ksqlDB's table aggregations (Kafka
Streams' ``KTable#groupBy`` sends the old and the new value of each change).

Spark computes each table record's group key and its regrouped value (every column, the
record's time and ``_SIGN`` 1: ``reducers.project_reduction`` of the REGROUP plan) or, for a
deleted row, one the WHERE drops or one without a group key, a tombstone of the table key.
The task keeps, per table key, the group key and value it last added. For each key the batch
changes it writes that value again with ``_SIGN`` -1 (retracted) to the old group's
partition of the query's repartition topic, then the new value to the new group's; the
aggregation stage adds or subtracts each (``aggregates.Aggregate.undo``).

Exactly once: the regrouped records, the store's changes (to a changelog of its own,
``names.regroup_changelog_topic``), the processing-log records and the input offset go in
one Kafka transaction; the store is written after the commit and restored from the
changelog at start, so a crash anywhere resumes with exactly the rows the committed output
counted. A store kept longer than the changelog keeps a tombstone restores from the start.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from typing import Any

from aiokafka import TopicPartition

from millpond.services.worker.state.changelog import ChangelogReader
from millpond.services.worker.state.store import (
    CHANGELOG_OFFSET,
    INPUT_OFFSET,
    INPUT_OFFSET_HEADER,
    WRITTEN_MS,
    encode_state,
    open_kept,
)
from millpond.services.worker.task import KEPT_STORE_MAX_AGE_MS, RESTORE_FETCH_MS, RegroupSlice, Task, store_path
from millpond.shared.catalog.names import regroup_changelog_topic
from millpond.shared.catalog.queries import PersistentQuery
from millpond.shared.catalog.sources import DataSource
from millpond.shared.catalog.topology import CHANGED_COLUMN
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.sql.aggregates import SIGN_COLUMN
from millpond.shared.task_status import RESTORING, now_ms
from millpond.shared.teardown import gather_or_cancel

log = logging.getLogger(__name__)
ADDED = f'{{"{SIGN_COLUMN}":1'.encode()
"""How a regrouped value begins (``_SIGN`` is its first column, written compact)."""
RETRACTED = f'{{"{SIGN_COLUMN}":-1'.encode()


def retracted(value: bytes, time_ms: int | None = None) -> bytes:
    """An added regrouped value as its retraction: the same columns, ``_SIGN`` -1, and with
    ``time_ms`` the time of the change that takes the row out of its group (what its group's
    new result is stamped with, as Kafka Streams' table aggregation stamps a subtraction)."""
    if not value.startswith(ADDED):
        raise MillpondError(f"a regrouped value does not begin with {ADDED.decode()}: {value[:40]!r}")
    out = RETRACTED + value[len(ADDED):]
    if time_ms is None:
        return out
    fields = json.loads(out)
    fields[CHANGED_COLUMN] = time_ms  # its own ROWTIME stays: aggregates over it take back what they added
    return json.dumps(fields, separators=(",", ":")).encode()


class RegroupTask(Task[RegroupSlice]):
    """Regroups one partition of a table for its aggregation (see the module)."""

    def __init__(self, settings: WorkerSettings, query: PersistentQuery, source: DataSource,
                 sink: DataSource, partition: int, stage: str = ""):
        super().__init__(settings, query, source, sink, partition, stage)
        self.changelog = TopicPartition(regroup_changelog_topic(settings.service_id, query.query_id), partition)

    async def start(self) -> None:
        """Open the store, fence any older owner and restore the store from its changelog: from
        the store's position, or, for a store last written longer ago than the changelog keeps
        its tombstones (a worker the task left long ago), from the start."""
        path = store_path(self.settings, f"{self.query.query_id}-{self.stage}", self.partition)
        self.store, dropped = open_kept(path, KEPT_STORE_MAX_AGE_MS, now_ms())
        if dropped:
            log.warning("regroup store older than its changelog keeps tombstones; restoring it from the start",
                        extra={"query": self.query.query_id, "partition": self.partition})
        reader = ChangelogReader(self.settings.kafka, self.changelog, self.store, fetch_max_wait_ms=25)
        try:
            # Fenced, the old owner's open transaction is aborted: the changelog's end is final.
            await gather_or_cancel(self._open_producer(), reader.start())
            end = await reader.end_offset()
            self.state, self.records_to_restore = RESTORING, max(end - reader.position, 0)
            started = time.monotonic()
            while reader.position < end:
                self.restored_records += await reader.fetch(timeout_ms=RESTORE_FETCH_MS)
            self.next_input_offset = self.start_input_offset = await self._starting_offset()
        finally:
            await reader.stop()
        self.store.write({}, {WRITTEN_MS: now_ms()})
        log.info("task started", extra={"query": self.query.query_id, "partition": self.partition,
                                        "stage": self.stage, "restored": self.restored_records,
                                        "seconds": round(time.monotonic() - started, 3),
                                        "input_offset": self.next_input_offset})

    async def commit(self, batch: RegroupSlice) -> bool:
        """Regroup one micro-batch slice exactly once; False when it was regrouped before."""
        assert self.store is not None and self.producer is not None
        if self.applied(batch):
            return False
        latest: dict[bytes, tuple[bytes | None, bytes | None]] = {}
        times: dict[bytes, int | None] = {}
        for (_, table_key), (group, value), time_ms in zip(batch.inputs, batch.records,
                                                           batch.timestamps or [None] * len(batch.records), strict=True):
            latest[table_key] = (group, value)  # each key's last record in the batch decides
            times[table_key] = time_ms
        states: dict[bytes, list[Any] | None] = {}
        regrouped: list[tuple[bytes, bytes]] = []
        for table_key, (group, value) in latest.items():
            before = self.store.get(table_key)
            after = None if value is None or group is None else [base64.b64encode(group).decode(), value.decode()]
            if before == after:
                continue
            if before is not None:
                regrouped.append((base64.b64decode(before[0]), retracted(before[1].encode(), times[table_key])))
            if after is not None:
                assert group is not None and value is not None
                regrouped.append((group, value))
            states[table_key] = after
        headers = [(INPUT_OFFSET_HEADER, str(batch.last_offset + 1).encode())]
        changelog = []
        async with self._transaction():
            for group, value in regrouped:
                await self._send(self.sink.topic, value, group, partition_for(group, self.sink.partitions))
            for table_key, state in states.items():
                changelog.append(await self._send(self.changelog.topic, None if state is None else encode_state(state),
                                                  table_key, self.partition, headers))
            await self._send_bad(batch.bad)
            await self._commit_input(batch.last_offset + 1)
        positions = {INPUT_OFFSET: batch.last_offset + 1, WRITTEN_MS: now_ms()}
        if changelog:
            positions[CHANGELOG_OFFSET] = (await changelog[-1]).offset + 1
        self.store.write({k: encode_state(s) for k, s in states.items() if s is not None}, positions,
                         [k for k, s in states.items() if s is None])
        self.next_input_offset = batch.last_offset + 1
        return True
