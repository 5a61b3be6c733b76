"""Runs one persistent query's tasks for a set of partitions on this worker (the worker
gives each partition a supervisor of its own, so a partition that moves starts or stops
alone) and restarts them, with backoff, when they fail: a failure is reported (state
FAILED, reason, count) until the restart succeeds.

One run is: start every task of every stage of the query (fence the old owner, restore,
read the committed position; meanwhile a stream that will give them a Spark query of their
own makes its plan: ``StageStreams.expect``), join each stage's tasks to that stage's stream
(the one Spark query per stage that the worker runs over all its partitions: ``streams.py``), then wait
until the stream cannot run them. Whatever ends a run (a failed commit or Spark query, a
cancel on reassignment) takes the tasks out of their streams and closes them, so the next run
starts from committed positions only. That teardown always completes: a cancel that comes
meanwhile is held until every task is closed, and each step has a time limit, so one stuck
Spark query or task delays the others by its limit at most (``millpond.shared.teardown``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from millpond.services.worker.kinds import new_task
from millpond.services.worker.streams import LEAVE_TIMEOUT_S, StageStream, StageStreams
from millpond.services.worker.task import Task
from millpond.shared import metrics
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.queries import PersistentQuery
from millpond.shared.catalog.topology import Stage, stages
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import MillpondError
from millpond.shared.task_status import FAILED, RESTORING, RUNNING, STARTING, TaskReport
from millpond.shared.teardown import bounded, cancel_and_wait, gather_or_cancel, run_to_end

log = logging.getLogger(__name__)
TASK_STOP_TIMEOUT_S = 40.0
"""How long the teardown waits for a task to close (its own steps are bounded below this)."""
STOP_TIMEOUT_S = 30.0
"""How long ``stop`` waits for the teardown; past it the teardown goes on in the background."""
FENCED_RETRY_S = 2.0
"""How long a supervisor whose task was fenced waits before it restarts the tasks, at least: time
for the assignment that moved the partition to reach this worker (pushed as it is made; seen up
to 0.3 s late on a busy 2-core machine). A partition still assigned here (its transaction timed
out at the broker) restarts after this."""
SETTLE_LIMIT_S = 3.0
"""How long after its start a supervisor counts as ``settling`` at most (its input may be idle)."""


class QueryFailed(MillpondError):
    """The query's Spark stream stopped by itself."""


class QuerySupervisor:
    """The tasks of one query on this worker, kept running."""

    def __init__(self, settings: WorkerSettings, metastore: Metastore, query: PersistentQuery,
                 partitions: set[int], streams: StageStreams):
        self.settings = settings
        self.metastore = metastore
        self.query = query
        self.partitions = frozenset(partitions)
        self.streams = streams
        self.tasks: dict[int, Task[Any]] = {}
        """The tasks of the stage that produces the result (the ones pull queries read)."""
        self._stage_tasks: list[dict[int, Task[Any]]] = []
        self.failures = 0
        self.reason = ""
        self.failed = False
        self._joined: list[tuple[StageStream, dict[int, Task[Any]]]] = []
        """The streams this run's tasks joined, with those tasks: left in the teardown."""
        self._expected: list[tuple[StageStream, dict[int, Task[Any]]]] = []
        """The streams told to expect this run's tasks (``_expect``), with those tasks."""
        self._job: asyncio.Task[None] | None = None
        self.started_at = time.monotonic()
        """When ``start`` ran (the monotonic clock)."""
        self.tasks_started = False
        """Whether this run's tasks have all started: fenced, restored, their positions read."""

    def start(self) -> None:
        """Run in the background until ``stop``."""
        self.started_at = time.monotonic()
        self._job = asyncio.create_task(self._run(), name=f"supervise-{self.query.query_id}")

    def starting(self) -> bool:
        """Whether this run's tasks are still starting (a store restoring from its changelog, or
        no run begun yet); not while it waits to restart after a failure."""
        return not self.failed and not self.tasks_started

    def settling(self) -> bool:
        """Whether its partitions moved in less than ``SETTLE_LIMIT_S`` ago and not all of their
        tasks have committed a batch since (nor failed): new standby copies wait for them
        (``TaskAssignment``)."""
        if self.failed or time.monotonic() - self.started_at >= SETTLE_LIMIT_S:
            return False
        tasks = [task for tasks in self._stage_tasks for task in tasks.values()]
        return not tasks or any(task.next_input_offset == task.start_input_offset for task in tasks)

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

    def stage_task(self, stage: str, partition: int) -> Task[Any] | None:
        """This run's task of ``partition`` in the stage named ``stage`` (None: none)."""
        return next((tasks[partition] for tasks in self._stage_tasks
                     if partition in tasks and tasks[partition].stage == stage), None)

    async def _run(self) -> None:
        backoff = wait_exponential_jitter(multiplier=self.settings.task_retry_initial_ms / 1000,
                                          max=self.settings.task_retry_max_ms / 1000)

        def wait(state: RetryCallState) -> float:
            # Fenced: most likely the partition's new owner started, and the assignment that
            # takes it from here is on its way (it stops this supervisor). Restarted sooner, the
            # tasks would fence that owner back, which then fences these, and so on (Kafka
            # Streams waits for the next assignment on a fence, as "task migrated").
            fenced = any(task.fenced for tasks in self._stage_tasks for task in tasks.values())
            return max(backoff(state), FENCED_RETRY_S) if fenced else backoff(state)

        retrying = AsyncRetrying(retry=retry_if_exception_type(Exception), wait=wait, before_sleep=self._on_failure)
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
        self.tasks_started = False
        query = self.query
        plan_stages = stages(query, self.metastore.source(query.source), self.metastore.source(query.sink),
                             self.settings.service_id)
        self._stage_tasks = [
            {p: new_task(self.settings, stage, p) for p in sorted(self.partitions) if p < stage.partitions}
            for stage in plan_stages
        ]
        self.tasks = self._stage_tasks[-1]
        expecting = asyncio.create_task(self._expect(plan_stages))
        try:
            try:
                await gather_or_cancel(*(task.start() for tasks in self._stage_tasks for task in tasks.values()))
            finally:
                await cancel_and_wait(expecting, TASK_STOP_TIMEOUT_S, "expect the tasks",
                                      {"query": self.query.query_id, "partitions": sorted(self.partitions)})
            self.tasks_started = True
            ended = []
            for stage, tasks in zip(plan_stages, self._stage_tasks, strict=True):
                if tasks:
                    stream, stopped = self.streams.join(stage, tasks)
                    self._joined.append((stream, tasks))
                    ended.append(stopped)
            for tasks in self._stage_tasks:
                for task in tasks.values():
                    task.state = RESTORING if task.rebuilding() else RUNNING
            if not ended:  # no stage has this partition: nothing to run until reassigned
                await asyncio.get_running_loop().create_future()
            done, _ = await asyncio.wait(ended, return_when=asyncio.FIRST_COMPLETED)
            raise QueryFailed(next(iter(done)).result())
        finally:
            await self._teardown()

    async def _expect(self, plan_stages: list[Stage]) -> None:
        """While the tasks start: tell each stage's stream where they are expected to resume,
        when it would start a Spark query of their own (a worker's partitions that move in
        while its query runs), so that the query's plan is made meanwhile."""
        await asyncio.sleep(0)  # the tasks' starts open their stores first: their positions are read here
        for stage, tasks in zip(plan_stages, self._stage_tasks, strict=True):
            if not tasks or not self.streams.takes_newcomers(stage):
                continue
            try:
                offsets = await asyncio.gather(*(task.expected_input_offset() for task in tasks.values()))
            except Exception:  # only a head start lost: the join makes the plan
                log.info("the tasks' positions could not be read ahead", exc_info=True,
                         extra={"query": self.query.query_id, "stage": stage.name})
                continue
            if (stream := self.streams.expect(stage, tasks, dict(zip(tasks, offsets, strict=True)))) is not None:
                self._expected.append((stream, tasks))

    async def _teardown(self) -> None:
        """Take the tasks out of their streams, then close every task (each ends its commit in
        flight before its producer stops): all of it even if a cancel comes meanwhile (raised
        after), each step bounded, errors logged, the streams and the tasks each concurrently."""
        await run_to_end(self._close())

    async def _close(self) -> None:
        expected, self._expected = self._expected, []
        for stream, tasks in expected:
            stream.unexpect(tasks)
        joined, self._joined = self._joined, []
        query_id = self.query.query_id
        await asyncio.gather(*(bounded(self.streams.leave(stream, tasks), LEAVE_TIMEOUT_S, "leave the stage's stream",
                                       {"query": query_id, "partitions": sorted(tasks)})
                               for stream, tasks in joined))
        await asyncio.gather(*(bounded(task.stop(), TASK_STOP_TIMEOUT_S, "close a task",
                                       {"query": query_id, "partition": task.partition, "stage": task.stage})
                               for tasks in self._stage_tasks for task in tasks.values()))
