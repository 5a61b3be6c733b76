"""Runs one persistent query's tasks for a set of partitions on this worker (the worker
gives each partition a supervisor of its own, so a partition that moves starts or stops
alone) and restarts them, with backoff, when they fail: a failure is reported (state
FAILED, reason, count) until the restart succeeds.

One run is: start every task of every stage of the query (fence the old owner, restore,
read the committed position), start one Spark query per stage over exactly these
partitions, then watch them (``millpond.shared.catalog.topology`` says what the stages are). Whatever ends a run
(an error, a cancel on reassignment) stops the Spark query and closes the tasks, so the
next run starts from committed positions only. That teardown always completes: a cancel that
comes meanwhile is held until every task is closed, and each step has a time limit, so one
stuck Spark query or task delays the others by its limit at most (``millpond.shared.teardown``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from aiokafka import TopicPartition
from pyspark.sql import SparkSession
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from millpond.services.worker.input_watch import InputWatch
from millpond.services.worker.kinds import WORKER_KINDS
from millpond.services.worker.query_runner import QueryRunner
from millpond.services.worker.task import Task
from millpond.shared import metrics
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.queries import PersistentQuery
from millpond.shared.catalog.topology import stages
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import MillpondError
from millpond.shared.task_status import FAILED, RESTORING, RUNNING, STARTING, TaskReport
from millpond.shared.teardown import bounded, cancel_and_wait, gather_or_cancel, run_to_end

log = logging.getLogger(__name__)
WATCH_INTERVAL_S = 0.25
PARKED_WATCH_INTERVAL_S = 5.0
"""How long a supervisor whose every stage is parked sleeps unless its worker's input moved."""
RUNNER_STOP_TIMEOUT_S = 30.0
"""How long the teardown waits for a Spark query to stop (it waits for its running batch)."""
TASK_STOP_TIMEOUT_S = 40.0
"""How long the teardown waits for a task to close (its own steps are bounded below this)."""
STOP_TIMEOUT_S = 30.0
"""How long ``stop`` waits for the teardown; past it the teardown goes on in the background."""


class QueryFailed(MillpondError):
    """The query's Spark stream stopped by itself."""


class QuerySupervisor:
    """The tasks of one query on this worker, kept running."""

    def __init__(self, settings: WorkerSettings, metastore: Metastore, query: PersistentQuery,
                 partitions: set[int], spark: Callable[[], Awaitable[SparkSession]], inputs: InputWatch | None = None):
        self.settings = settings
        self.inputs = inputs
        """Where a parked stage learns that its input moved; None: stages never park."""
        self.metastore = metastore
        self.query = query
        self.partitions = frozenset(partitions)
        self._spark = spark
        self.tasks: dict[int, Task[Any]] = {}
        """The tasks of the stage that produces the result (the ones pull queries read)."""
        self._stage_tasks: list[dict[int, Task[Any]]] = []
        self.failures = 0
        self.reason = ""
        self.failed = False
        self._runners: list[QueryRunner] = []
        self._job: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Run in the background until ``stop``."""
        self._job = asyncio.create_task(self._run(), name=f"supervise-{self.query.query_id}")

    async def stop(self, timeout_s: float | None = None) -> bool:
        """Stop the Spark query and close the tasks; False (logged) when that overran
        ``timeout_s`` (``STOP_TIMEOUT_S``): the teardown then completes in the background."""
        job, self._job = self._job, None
        if job is None:
            return True
        return await cancel_and_wait(job, STOP_TIMEOUT_S if timeout_s is None else timeout_s, "query supervisor",
                                     {"query": self.query.query_id, "partitions": sorted(self.partitions)})

    def reports(self) -> list[TaskReport]:
        """Each partition's state: its task's, or FAILED while waiting to restart; the last
        failure's reason and the count stay visible after a restart."""
        out = []
        for partition in sorted(self.partitions):
            # The result stage's task, or the first stage's where only it has this partition.
            task = next((tasks[partition] for tasks in reversed(self._stage_tasks) if partition in tasks), None)
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
        metrics.TASK_FAILURES.labels(self.query.query_id).inc()
        self.reason = str(error) if isinstance(error, QueryFailed) else f"{type(error).__name__}: {error}"
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.error("query failed; restarting", extra={
            "query": self.query.query_id, "partitions": sorted(self.partitions), "failures": self.failures,
            "reason": self.reason, "retry_in_s": round(wait, 2)})

    async def _run_once(self) -> None:
        self.failed = False  # restarting: the tasks report their own state again
        query = self.query
        plan_stages = stages(query, self.metastore.source(query.source), self.metastore.source(query.sink),
                             self.settings.service_id)
        self._stage_tasks = [
            {p: WORKER_KINDS[stage.query.plan.kind].task(self.settings, stage.query, stage.source, stage.sink, p, stage.name)
             for p in sorted(self.partitions) if p < stage.partitions}
            for stage in plan_stages
        ]
        self.tasks = self._stage_tasks[-1]
        try:
            await gather_or_cancel(*(task.start() for tasks in self._stage_tasks for task in tasks.values()))
            spark = await self._spark()
            loop = asyncio.get_running_loop()
            for stage, tasks in zip(plan_stages, self._stage_tasks, strict=True):
                if tasks:
                    runner = QueryRunner(spark, self.settings, stage.query, stage.source, stage.sink, tasks, loop,
                                         stage.name)
                    self._runners.append(runner)
                    # Not cut short by a cancel: the teardown must find the stream to stop it.
                    await run_to_end(asyncio.to_thread(runner.start))
            for tasks in self._stage_tasks:
                for task in tasks.values():
                    task.state = RESTORING if task.rebuilding() else RUNNING
            # The streams' state lives in the JVM; polling it costs no thread per query.
            while (reason := self._failure()) is None:
                if self.inputs is not None and self._runners and all(r.parked_at is not None for r in self._runners):
                    await self.inputs.moved(PARKED_WATCH_INTERVAL_S)  # nothing to watch but the input
                else:
                    await asyncio.sleep(WATCH_INTERVAL_S)
                for runner in self._runners:
                    await self._rebuilt(runner)
                    await self._park_or_resume(runner)
            raise QueryFailed(reason)
        finally:
            await self._teardown()

    @staticmethod
    async def _rebuilt(runner: QueryRunner) -> None:
        """Tell a stage's rebuilding tasks how far its query has read: the end of a rebuild can
        be a transaction marker, which no batch's records reach."""
        if runner.running and any(task.rebuilding() for task in runner.tasks.values()):
            read = await asyncio.to_thread(runner.read_through)
            for partition, offset in (read or {}).items():
                runner.tasks[partition].read_through(offset)

    async def _park_or_resume(self, runner: QueryRunner) -> None:
        """Stop a stage's Spark query after ``park_after_idle_ms`` without input (its tasks stay
        open and serve), and start it again as soon as its input moves past what it read."""
        if self.inputs is None or self.settings.park_after_idle_ms <= 0:
            return
        inputs = [TopicPartition(runner.source.topic, p) for p in sorted(runner.tasks)]
        if runner.running:
            if time.monotonic() - runner.last_batch_at < self.settings.park_after_idle_ms / 1000:
                return
            read = await asyncio.to_thread(runner.read_through)
            if read is None:
                return
            await run_to_end(asyncio.to_thread(runner.stop))
            runner.parked_at = read
            self.inputs.watch(inputs)
            log.info("query parked", extra={"query": runner.name, "read_through": read})
        elif runner.parked_at is not None:
            moved = [tp.partition for tp in inputs if self.inputs.ends.get(tp, -1) > runner.parked_at.get(tp.partition, -1)]
            if not moved:
                return
            self.inputs.unwatch(inputs)
            runner.parked_at = None
            await run_to_end(asyncio.to_thread(runner.start))
            log.info("query resumed", extra={"query": runner.name, "input_moved": moved})

    def _failure(self) -> str | None:
        return next((reason for runner in self._runners if (reason := runner.failure()) is not None), None)

    async def _teardown(self) -> None:
        """Stop the Spark queries, then close every task (each ends its commit in flight before
        its producer stops): all of it even if a cancel comes meanwhile (raised after), each
        step bounded, errors logged, the runners and the tasks each concurrently."""
        await run_to_end(self._close())

    async def _close(self) -> None:
        runners, self._runners = self._runners, []
        query_id = self.query.query_id
        for runner in runners:
            if runner.parked_at is not None and self.inputs is not None:
                self.inputs.unwatch([TopicPartition(runner.source.topic, p) for p in runner.tasks])
        await asyncio.gather(*(bounded(asyncio.to_thread(runner.stop), RUNNER_STOP_TIMEOUT_S, "stop the Spark query",
                                       {"query": query_id, "runner": runner.name}) for runner in runners))
        await asyncio.gather(*(bounded(task.stop(), TASK_STOP_TIMEOUT_S, "close a task",
                                       {"query": query_id, "partition": task.partition, "stage": task.stage})
                               for tasks in self._stage_tasks for task in tasks.values()))
