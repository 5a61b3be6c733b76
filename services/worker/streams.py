"""One Spark query per stage of a persistent query on this worker, over every partition
whose tasks are running here.

Each micro-batch of a Spark query costs a fixed few hundred milliseconds of scheduling
whatever its size, so a worker runs one query per (query, stage) over all its partitions,
not one per partition: the fixed cost is paid once per batch of the worker's whole input.
The tasks stay per partition (``QuerySupervisor`` starts, restarts and closes each alone):
a supervisor ``join``s its started tasks to the stage's stream and ``leave``s before it closes
them. A join or a leave restarts the Spark query over the new set of partitions, each from
its task's committed position; the tasks that stayed keep their producers and stores and
are not restarted, so a partition gained or lost costs the others one stop and start of the
Spark query, not a restore.

A task whose commit fails leaves the query at once (it gets no later batch, so none can
skip its lost one) and its supervisor learns why; a Spark query that stops by itself fails
every member, whose supervisors restart them with backoff as before.

A stream with no input for ``park_after_idle_ms`` stops its Spark query (the tasks stay open
and serve) and starts it again when the input watch sees an input partition's end move.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import TopicPartition
from pyspark.sql import SparkSession

from millpond.services.worker.input_watch import InputWatch
from millpond.services.worker.query_runner import QueryRunner
from millpond.services.worker.task import Task
from millpond.shared.catalog.topology import Stage
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import MillpondError
from millpond.shared.teardown import bounded, run_to_end

log = logging.getLogger(__name__)
WATCH_INTERVAL_S = 0.25
"""How often a running stream looks at its Spark query (failed? idle? how far read?)."""
PARKED_WATCH_INTERVAL_S = 5.0
"""How long a parked stream sleeps unless its worker's input moved or its members changed."""
SETTLE_S = 0.05
"""How long a change of members waits for others before the Spark query restarts (the
supervisors of a worker's partitions start at about the same time)."""
RUNNER_STOP_TIMEOUT_S = 30.0
"""How long a stop waits for a Spark query to end (it waits for its running batch)."""
LEAVE_TIMEOUT_S = 2 * RUNNER_STOP_TIMEOUT_S + 10.0
"""How long a supervisor waits for its leave: the last one out waits for the stream's job
(which may be stopping the Spark query) and then for the query's stop."""

_names = itertools.count()


class StageStream:
    """The Spark query of one stage of one query on this worker, over the joined tasks."""

    def __init__(self, settings: WorkerSettings, stage: Stage, spark: Callable[[], Awaitable[SparkSession]],
                 inputs: InputWatch | None):
        self.settings = settings
        self.stage = stage
        self.inputs = inputs
        self._spark = spark
        self.members: dict[int, Task[Any]] = {}
        """The joined tasks by partition; the Spark query runs over them from its next start."""
        self._ended: dict[int, asyncio.Future[str]] = {}
        """Per member, the future its supervisor awaits: set with why the stream cannot run it."""
        self._changed = asyncio.Event()
        self.runner: QueryRunner | None = None
        self._job: asyncio.Task[None] | None = None
        self._context = {"query": stage.query.query_id, "stage": stage.name}

    def join(self, tasks: dict[int, Task[Any]]) -> asyncio.Future[str]:
        """Run these started tasks from the next start of the Spark query (soon). The future
        is set with a reason once the stream cannot run them any more."""
        ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        for partition, task in tasks.items():
            self.members[partition] = task
            self._ended[partition] = ended
        self._changed.set()
        if self._job is None:
            self._job = asyncio.create_task(self._run(), name=f"stream-{self.stage.query.query_id}-{self.stage.name}")
        return ended

    def leave(self, tasks: dict[int, Task[Any]]) -> None:
        """Stop giving these tasks batches, now (a batch already committing goes on: the
        task's own stop ends it); the Spark query restarts without them. A partition that
        another task has joined since is left as it is."""
        for partition, task in tasks.items():
            if self.members.get(partition) is task:
                self._remove(partition)
        self._changed.set()

    async def close(self) -> None:
        """Stop the Spark query and the stream's job (the tasks are their supervisors'): to the
        end even if the caller is cancelled meanwhile, so no Spark query is left running."""
        await run_to_end(self._close())

    async def _close(self) -> None:
        job, self._job = self._job, None
        if job is not None:
            job.cancel()
            await asyncio.wait({job})
        await self._stop_runner()

    async def _run(self) -> None:
        while True:
            try:
                await self._step()
            except Exception as error:  # e.g. Spark's JVM gone: the members' supervisors must learn it
                log.warning("stream step failed", exc_info=True, extra=self._context)
                await self._fail(f"{type(error).__name__}: {error}")
            await self._wait()

    async def _step(self) -> None:
        """Restart the Spark query if the members changed; else look at it (failed? idle? how
        far has it read?) or, parked, at its input."""
        if self._changed.is_set():
            await asyncio.sleep(SETTLE_S)
            self._changed.clear()
            await self._restart()
        elif self.runner is not None and self.runner.running:
            if (reason := self.runner.failure()) is not None:
                await self._fail(reason)
            else:
                await self._rebuilt(self.runner)
                await self._park(self.runner)
        elif self.runner is not None and self.runner.parked_at is not None:
            await self._resume(self.runner)

    async def _wait(self) -> None:
        """Until the members change, or the next look: soon while the query runs, when the
        input moved while it is parked, never while it is failed (members leave and rejoin)."""
        changed = asyncio.ensure_future(self._changed.wait())
        runner = self.runner
        if runner is not None and runner.running:
            other: asyncio.Future[Any] = asyncio.ensure_future(asyncio.sleep(WATCH_INTERVAL_S))
        elif runner is not None and runner.parked_at is not None and self.inputs is not None:
            other = asyncio.ensure_future(self.inputs.moved(PARKED_WATCH_INTERVAL_S))
        else:
            other = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait({changed, other}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (changed, other):
                waiting.cancel()

    async def _restart(self) -> None:
        """Stop the Spark query and start it over the members, each from its position. The
        positions are the tasks' own only when the old query ended cleanly and their last
        commit did: else the members fail, and their supervisors start them again from what
        Kafka says they committed."""
        unclean = await self._stop_runner()
        if unclean is not None:
            await self._fail(unclean)
            return
        self._fail_unsettled()
        if not self.members:
            return
        spark = await self._spark()  # an error here or in the start fails the members (``_run``)
        runner = self.runner = QueryRunner(
            spark, self.settings, self.stage.query, self.stage.source, self.stage.sink, dict(self.members),
            asyncio.get_running_loop(), self.stage.name,
            name="-".join(filter(None, (self.stage.query.query_id, self.stage.name, self.settings.worker_id,
                                        str(next(_names))))),
            on_task_failed=self._remove)
        # Not cut short by a cancel: ``close`` must find the stream to stop it.
        await run_to_end(asyncio.to_thread(runner.start, runner.positions()))

    async def _stop_runner(self) -> str | None:
        """Stop the Spark query and forget it; why the stop was not clean (it overran its
        limit: a commit may still be running), or None."""
        runner = self.runner
        if runner is None:
            return None
        runner.tasks = {}  # nothing more is committed by it
        if runner.parked_at is not None and self.inputs is not None:
            self.inputs.unwatch(self._inputs(runner.parked_at))
            runner.parked_at = None
        self.runner = None
        return await self._stop_query(runner)

    async def _stop_query(self, runner: QueryRunner) -> str | None:
        """Stop ``runner``'s Spark query (bounded); why that was not clean, or None. A stop
        interrupts a batch's Spark job (no commit began) but waits for its commit; what a
        failed or cancelled commit leaves is the task's to say (``Task.settled``)."""
        if runner.running and not await run_to_end(bounded(
                asyncio.to_thread(runner.stop), RUNNER_STOP_TIMEOUT_S, "stop the Spark query",
                {**self._context, "runner": runner.name})):
            return f"the Spark query did not stop within {RUNNER_STOP_TIMEOUT_S:g} s"
        return None

    def _fail_unsettled(self) -> None:
        """Fail the members whose last commit is in flight or failed: their positions are unknown."""
        for partition, task in list(self.members.items()):
            if not task.settled():
                self._remove(partition, "its last commit did not end cleanly")

    async def _fail(self, reason: str) -> None:
        """The Spark query cannot go on: every member's supervisor learns why (and restarts it)."""
        log.warning("stream failed", extra={**self._context, "reason": reason, "partitions": sorted(self.members)})
        for partition in list(self.members):
            self._remove(partition, reason)
        self._changed.clear()
        await self._stop_runner()

    def _remove(self, partition: int, reason: str | None = None) -> None:
        """Take a member out, and out of the running query's batches; a ``reason`` goes to its
        supervisor (a member that leaves is not told)."""
        self.members.pop(partition, None)
        if self.runner is not None:
            self.runner.tasks.pop(partition, None)
        ended = self._ended.pop(partition, None)
        if reason is not None and ended is not None and not ended.done():
            ended.set_result(reason)

    async def _rebuilt(self, runner: QueryRunner) -> None:
        """Tell rebuilding tasks how far the query has read: the end of a rebuild can be a
        transaction marker, which no batch's records reach."""
        if any(task.rebuilding() for task in runner.tasks.values()):
            read = await asyncio.to_thread(runner.read_through)
            for partition, offset in (read or {}).items():
                if (task := runner.tasks.get(partition)) is not None:
                    task.read_through(offset)

    async def _park(self, runner: QueryRunner) -> None:
        """Stop the Spark query after ``park_after_idle_ms`` without input (the tasks stay open
        and serve)."""
        if self.inputs is None or self.settings.park_after_idle_ms <= 0:
            return
        if time.monotonic() - runner.last_batch_at < self.settings.park_after_idle_ms / 1000:
            return
        read = await asyncio.to_thread(runner.read_through)
        if read is None:
            return
        if (unclean := await self._stop_query(runner)) is not None:
            await self._fail(unclean)
            return
        runner.parked_at = read
        self.inputs.watch(self._inputs(read))
        log.info("query parked", extra={"query": runner.name, "partitions": sorted(read), "read_through": read})

    async def _resume(self, runner: QueryRunner) -> None:
        """Start a parked Spark query again once an input partition's end passed what it read."""
        assert self.inputs is not None and runner.parked_at is not None
        moved = [tp.partition for tp in self._inputs(runner.parked_at)
                 if self.inputs.ends.get(tp, -1) > runner.parked_at[tp.partition]]
        if not moved:
            return
        self.inputs.unwatch(self._inputs(runner.parked_at))
        runner.parked_at = None
        self._fail_unsettled()
        if not runner.tasks:
            return
        await run_to_end(asyncio.to_thread(runner.start, runner.positions()))
        log.info("query resumed", extra={"query": runner.name, "partitions": sorted(runner.tasks), "input_moved": moved})

    def _inputs(self, read: dict[int, int]) -> list[TopicPartition]:
        return [TopicPartition(self.stage.source.topic, p) for p in sorted(read)]


class StageStreams:
    """This worker's stage streams, made on the first join and closed after the last leave."""

    def __init__(self, settings: WorkerSettings, spark: Callable[[], Awaitable[SparkSession]],
                 inputs: InputWatch | None = None):
        self.settings = settings
        self.spark = spark
        self.inputs = inputs
        """Where a parked stream learns that its input moved; None: streams never park."""
        self._streams: dict[tuple[str, str], StageStream] = {}

    def join(self, stage: Stage, tasks: dict[int, Task[Any]]) -> tuple[StageStream, asyncio.Future[str]]:
        """``StageStream.join`` on the stage's stream (made now if it has none): the stream,
        to leave, and the future set with why it cannot run the tasks any more."""
        key = (stage.query.query_id, stage.name)
        stream = self._streams.get(key)
        if stream is not None and stream.stage.query.plan != stage.query.plan:
            if stream.members:
                raise MillpondError(f"an older plan of query {stage.query.query_id} still runs partitions "
                                    f"{sorted(stream.members)} on this worker")
            stream = None
        if stream is None:
            stream = self._streams[key] = StageStream(self.settings, stage, self.spark, self.inputs)
        return stream, stream.join(tasks)

    async def leave(self, stream: StageStream, tasks: dict[int, Task[Any]]) -> None:
        """``StageStream.leave``; the last one out closes the stream (awaited)."""
        stream.leave(tasks)
        if not stream.members:
            key = (stream.stage.query.query_id, stream.stage.name)
            if self._streams.get(key) is stream:
                del self._streams[key]
            await stream.close()

    async def stop(self) -> None:
        """Close every stream."""
        streams, self._streams = list(self._streams.values()), {}
        await asyncio.gather(*(s.close() for s in streams))
