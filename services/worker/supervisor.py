"""Runs one persistent query's tasks on this worker and restarts them, with backoff, when
they fail: a failure is reported (state FAILED, reason, count) until the restart succeeds.

One run is: start every task (fence the old owner, restore, read the committed position),
start the Spark query over exactly these partitions, then watch it. Whatever ends a run
(an error, a cancel on reassignment) stops the Spark query and closes the tasks, so the
next run starts from committed positions only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from pyspark.sql import SparkSession
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from services.worker.query_runner import QueryRunner
from services.worker.task import AggregationTask, ProjectionTask, TableTask, Task
from shared.catalog import PersistentQuery
from shared.config import WorkerSettings
from shared.errors import MillpondError
from shared.metastore import Metastore
from shared.task_status import FAILED, RUNNING, STARTING, TaskReport

log = logging.getLogger(__name__)
WATCH_INTERVAL_S = 0.25
TASK_KINDS: dict[str, type[Task]] = {"AGGREGATE": AggregationTask, "PROJECT": ProjectionTask, "MATERIALIZE": TableTask}


class QueryFailed(MillpondError):
    """The query's Spark stream stopped by itself."""


class QuerySupervisor:
    """The tasks of one query on this worker, kept running."""

    def __init__(self, settings: WorkerSettings, metastore: Metastore, query: PersistentQuery,
                 partitions: set[int], spark: Callable[[], Awaitable[SparkSession]]):
        self.settings = settings
        self.metastore = metastore
        self.query = query
        self.partitions = frozenset(partitions)
        self._spark = spark
        self.tasks: dict[int, Task] = {}
        self.failures = 0
        self.reason = ""
        self.failed = False
        self._runner: QueryRunner | None = None
        self._job: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Run in the background until ``stop``."""
        self._job = asyncio.create_task(self._run(), name=f"supervise-{self.query.query_id}")

    async def stop(self) -> None:
        """Stop the Spark query and close the tasks."""
        if self._job is not None:
            self._job.cancel()
            await asyncio.gather(self._job, return_exceptions=True)
            self._job = None

    def reports(self) -> list[TaskReport]:
        """Each partition's state: its task's, or FAILED while waiting to restart; the last
        failure's reason and the count stay visible after a restart."""
        out = []
        for partition in sorted(self.partitions):
            task = self.tasks.get(partition)
            base = task.report() if task is not None else TaskReport(self.query.query_id, partition, STARTING)
            out.append(replace(base, state=FAILED if self.failed else base.state, worker_id=self.settings.worker_id,
                               reason=self.reason, failures=self.failures))
        return out

    async def _run(self) -> None:
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential_jitter(multiplier=self.settings.task_retry_initial_ms / 1000,
                                         max=self.settings.task_retry_max_ms / 1000),
            before_sleep=self._on_failure,
        )
        async for attempt in retrying:
            with attempt:
                await self._run_once()

    def _on_failure(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        self.failures += 1
        self.failed = True
        self.reason = str(error) if isinstance(error, QueryFailed) else f"{type(error).__name__}: {error}"
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.error("query failed; restarting", extra={
            "query": self.query.query_id, "partitions": sorted(self.partitions), "failures": self.failures,
            "reason": self.reason, "retry_in_s": round(wait, 2)})

    async def _run_once(self) -> None:
        self.failed = False  # restarting: the tasks report their own state again
        query = self.query
        if query.plan.kind == "AGGREGATE" and query.plan.repartition:
            raise QueryFailed("GROUP BY a column other than the source's key (re-keying through a repartition "
                              "topic) is not executed yet; GROUP BY the key column")
        source = self.metastore.source(query.source)
        sink = self.metastore.source(query.sink)
        kind = TASK_KINDS[query.plan.kind]
        self.tasks = {p: kind(self.settings, query, source, sink, p) for p in sorted(self.partitions)}
        try:
            await asyncio.gather(*(task.start() for task in self.tasks.values()))
            spark = await self._spark()
            self._runner = QueryRunner(spark, self.settings, query, source, sink, self.tasks,
                                       asyncio.get_running_loop())
            await asyncio.to_thread(self._runner.start)
            for task in self.tasks.values():
                task.state = RUNNING
            # The stream's state lives in the JVM; polling it costs no thread per query.
            while (reason := self._runner.failure()) is None:  # noqa: ASYNC110
                await asyncio.sleep(WATCH_INTERVAL_S)
            raise QueryFailed(reason)
        finally:
            await self._teardown()

    async def _teardown(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await asyncio.to_thread(runner.stop)
        for task in self.tasks.values():
            try:
                await task.stop()
            except Exception:
                log.exception("closing a task failed", extra={"query": self.query.query_id, "partition": task.partition})
