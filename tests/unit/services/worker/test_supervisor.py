"""A query whose tasks cannot run is reported FAILED with its reason and retried with backoff."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka.errors import KafkaError, ProducerFenced
from pyspark.sql import SparkSession

from millpond.services.worker import supervisor as supervisor_module
from millpond.services.worker.kinds import new_task
from millpond.services.worker.streams import StageStreams
from millpond.services.worker.supervisor import QuerySupervisor
from millpond.services.worker.table_joining import JoinSideTask, TableJoinTask
from millpond.services.worker.task import ReplayedTableTask, TableTask
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.topology import stages
from millpond.shared.config import WorkerSettings
from millpond.shared.sql.parser import parse_statement
from millpond.shared.task_status import FAILED


async def test_a_query_that_cannot_run_is_reported_failed_and_retried(tmp_path: Path) -> None:
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM r (sensor VARCHAR KEY, area VARCHAR, reading INT) "
                               "WITH (kafka_topic='r', partitions=2, value_format='json')"), 0)
    meta.apply(parse_statement("CREATE TABLE by_area AS SELECT area, COUNT(*) AS n FROM r GROUP BY area"), 1)
    del meta.sources["R"]  # as if its statement had not been replayed here: the run fails at once
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path, task_retry_initial_ms=10, task_retry_max_ms=20)

    async def no_spark() -> SparkSession:
        raise AssertionError("the query must fail before it needs Spark")

    supervisor = QuerySupervisor(settings, meta, meta.queries["CTAS_BY_AREA_0"], {0, 1}, StageStreams(settings, no_spark))
    supervisor.start()
    try:
        for _ in range(1000):
            if supervisor.failures >= 3:
                break
            await asyncio.sleep(0.01)
        reports = supervisor.reports()
    finally:
        await supervisor.stop()
    assert [(r.partition, r.state, r.worker_id) for r in reports] == [(0, FAILED, "w"), (1, FAILED, "w")]
    assert all("R does not exist" in r.reason and r.failures >= 3 for r in reports)


def test_a_joined_tables_result_task_catches_up_as_its_copies_replay(tmp_path: Path) -> None:
    """The stage that materializes a table-table join's result, whose standby copies replay
    its topic, gets a ``ReplayedTableTask`` (a promoted copy applies its tail at start); a
    table over a topic, and the join's other stages, get their kind's task."""
    meta = Metastore()
    for index, sql in enumerate([
            "CREATE TABLE a (id VARCHAR PRIMARY KEY, x INT) WITH (kafka_topic='a', partitions=2, value_format='json')",
            "CREATE TABLE b (id VARCHAR PRIMARY KEY, y INT) WITH (kafka_topic='b', partitions=2, value_format='json')",
            "CREATE TABLE ab AS SELECT a.id AS id, x, y FROM a JOIN b ON a.id = b.id"]):
        meta.apply(parse_statement(sql), index)
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path)

    def tasks(query_id: str) -> list[tuple[str, type]]:
        query = meta.queries[query_id]
        return [(stage.name, type(new_task(settings, stage, 0)))
                for stage in stages(query, meta.source(query.source), meta.source(query.sink), "svc")]

    joined = next(q for q in meta.queries if q.startswith("CTAS_AB"))
    assert tasks(joined) == [("side-0", JoinSideTask), ("side-1", JoinSideTask), ("join", TableJoinTask),
                             ("", ReplayedTableTask)]
    assert tasks(next(q for q in meta.queries if q.startswith("CST_A"))) == [("", TableTask)]


class _FailingTask:
    """A task whose start fails: as a fenced producer's (``fenced``) or otherwise."""

    def __init__(self, partition: int, fenced: bool):
        self.partition, self.stage, self.fenced_at_start = partition, "", fenced
        self.fenced = False

    async def start(self) -> None:
        self.fenced = self.fenced_at_start
        raise ProducerFenced() if self.fenced_at_start else KafkaError("the broker went away")

    async def stop(self) -> None:
        pass


@pytest.mark.parametrize("fenced", [True, False])
async def test_a_fenced_task_waits_for_its_reassignment_before_it_restarts(
        fenced: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Restarted at once, a task fenced by its partition's new owner would fence that owner
    back; it waits ``FENCED_RETRY_S`` (the assignment that moved it stops it meanwhile). Other
    failures restart on the usual backoff."""
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM r (sensor VARCHAR KEY, area VARCHAR, reading INT) "
                               "WITH (kafka_topic='r', partitions=1, value_format='json')"), 0)
    meta.apply(parse_statement("CREATE TABLE by_area AS SELECT area, COUNT(*) AS n FROM r GROUP BY area"), 1)
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path, task_retry_initial_ms=10, task_retry_max_ms=20)
    monkeypatch.setattr(supervisor_module, "new_task", lambda _settings, _stage, partition: _FailingTask(partition, fenced))
    monkeypatch.setattr(supervisor_module, "FENCED_RETRY_S", 60.0)

    async def no_spark() -> SparkSession:
        raise AssertionError("the tasks fail before they need Spark")

    supervisor = QuerySupervisor(settings, meta, meta.queries["CTAS_BY_AREA_0"], {0}, StageStreams(settings, no_spark))
    supervisor.start()
    try:
        await asyncio.sleep(0.5)
        failures = supervisor.failures
    finally:
        stopped = await supervisor.stop(timeout_s=5)  # the reassignment's stop ends the wait at once
    assert stopped
    assert failures == 1 if fenced else failures >= 3
