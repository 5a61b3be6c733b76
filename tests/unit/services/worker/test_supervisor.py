"""A query whose tasks cannot run is reported FAILED with its reason and retried with backoff."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pyspark.sql import SparkSession

from millpond.services.worker.streams import StageStreams
from millpond.services.worker.supervisor import QuerySupervisor
from millpond.shared.catalog.metastore import Metastore
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
