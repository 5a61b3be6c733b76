"""Spark queries per stage of a persistent query on this worker, over every partition whose
tasks are running here.

Each micro-batch of a Spark query costs a fixed few hundred milliseconds of scheduling
whatever its size, so a worker runs one query per (query, stage) over all its partitions,
not one per partition: the fixed cost is paid once per batch of the worker's whole input.
The tasks stay per partition (``QuerySupervisor`` starts, restarts and closes each alone):
a supervisor ``join``s its started tasks to the stage's stream and ``leave``s before it closes
them.

A change of partitions restarts nothing that keeps running. Partitions that join while the
stage's Spark query runs get a Spark query of their own, started from their tasks'
positions (its plan, a few DataFrame steps that Spark analyses, is made while their tasks
start, from the positions known before the fence: a promoted standby's applied position, else
the group's committed offset: ``expect``). A query resumes from a checkpoint written with its
tasks' positions (``QueryRunner.start``), so a plan serves a task that resumes elsewhere too;
one is made again only where a position is unknown. A worker that runs none of a stage has the
plan of the query its copies' partitions would get made before any of them moves here
(``ready``: a worker just added, whose warm-up copy is about to take over), and that query
started, standing by from the group's committed positions with its first batch reduced and
held (``QueryRunner.stand_by``): the move's tasks take it over as it runs. A worker that runs
the stage stands a query by the same way, beside its running one, for the partitions a leaving
worker is about to hand it (``ready``'s ``incoming``: ``PrepareTakeOver``). The stage's running
query goes on with no pause (at most ``MAX_QUERIES`` per stage: later newcomers restart the
newest, which holds only partitions that moved in lately, and a query that has not processed
a batch yet is restarted rather than joined by another). A partition
that leaves gets no more batches at once: its query still fetches it until its next start,
but sets its records aside before decoding them. A query left with no partitions stops. The
queries of a stage become one again the next time they start together: after a parked spell.

A task whose commit fails leaves its query at once (it gets no later batch, so none can skip
its lost one) and its supervisor learns why; a Spark query that stops by itself fails the
tasks it ran, whose supervisors restart them with backoff as before.

A query with no input for ``park_after_idle_ms`` stops (the tasks stay open and serve) and
starts again when the input watch sees one of its input partitions' end move; when every
query of the stage is parked, they start again as one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aiokafka import TopicPartition
from pyspark.sql import SparkSession

from millpond.services.worker.input_watch import InputWatch
from millpond.services.worker.kinds import new_task
from millpond.services.worker.query_runner import QueryRunner, offset_log_conf
from millpond.services.worker.task import Task
from millpond.shared.catalog.topology import Stage
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import MillpondError
from millpond.shared.teardown import bounded, run_to_end

log = logging.getLogger(__name__)
WATCH_INTERVAL_S = 0.25
"""How often a running stream looks at its Spark queries (failed? idle? how far read?)."""
PARKED_WATCH_INTERVAL_S = 5.0
"""How long a parked stream sleeps unless its worker's input moved or its members changed."""
SETTLE_S = 0.05
"""How long a change of members waits for others before it is acted on (the supervisors of
a worker's partitions start at about the same time); not once every partition whose task
started with them has come (``StageStreams.started_together``)."""
RUNNER_STOP_TIMEOUT_S = 30.0
"""How long a stop waits for a Spark query to end (it waits for its running batch)."""
LEAVE_TIMEOUT_S = 2 * RUNNER_STOP_TIMEOUT_S + 10.0
"""How long a supervisor waits for its leave: the last one out waits for the stream's job
(which may be stopping a Spark query) and then for the queries' stop."""

READY_PLAN_WAIT_S = 10.0
"""The longest a plan made from a worker's copies holds their offer to take over
(``StageStreams.ready_made``): one that takes longer is made on the move, as without it."""
STAND_BY_WARM_WAIT_S = 8.0
"""The longest a plan made from a worker's copies waits for its query standing by to have its
first batch reduced (within ``READY_PLAN_WAIT_S``); past it, or once the query reported a
trigger with no input, the query stops and only the plan is kept."""
MAX_QUERIES = 2
"""Most Spark queries a running stage keeps on a worker: the one it started with and one for
the partitions that moved in since (a later newcomer restarts that second one)."""

_names = itertools.count()


class StageStream:
    """The Spark queries of one stage of one query on this worker, over the joined tasks."""

    def __init__(self, settings: WorkerSettings, stage: Stage, spark: Callable[[], Awaitable[SparkSession]],
                 inputs: InputWatch | None, committed: Callable[[], None] | None = None,
                 together: Mapping[str, frozenset[int]] | None = None):
        self.settings = settings
        self.stage = stage
        self.inputs = inputs
        self.committed = committed
        """Told each time its Spark queries' tasks committed a batch (``QueryRunner.on_committed``)."""
        self._together = together if together is not None else {}
        """Per query id, the partitions whose tasks the worker started together last
        (``StageStreams.started_together``): what a change of members waits for (``_settle``)."""
        self._spark = spark
        self.members: dict[int, Task[Any]] = {}
        """The joined tasks by partition; each is in one runner's ``tasks`` once it started."""
        self._ended: dict[int, asyncio.Future[str]] = {}
        """Per member, the future its supervisor awaits: set with why the stream cannot run it."""
        self._changed = asyncio.Event()
        self._came = asyncio.Event()
        """Set when tasks join or are expected (what ``_settle`` waits for)."""
        self._moves_seen = 0
        """The input watch's ``moves`` when the current step began."""
        self.runners: list[QueryRunner] = []
        """The stage's Spark queries on this worker, the oldest first; each runs its own tasks."""
        self._job: asyncio.Task[None] | None = None
        self._context = {"query": stage.query.query_id, "stage": stage.name}
        self._expected: dict[int, tuple[Task[Any], int | None]] = {}
        """The tasks expected since the last plan was taken, by partition, with the position each
        is expected to resume at: still starting, or joined (one whose restore ends within
        ``SETTLE_S`` joins before the plan is made, and the plan is for it all the same)."""
        self._preparing: asyncio.Task[QueryRunner | None] | None = None
        """The plan of the Spark query the expected tasks will get, being made (``expect``)."""
        self._ready: asyncio.Task[QueryRunner | None] | None = None
        """The plan of the stage's first Spark query here, made from this worker's copies of the
        query's tables before any of their partitions moved here (``ready``)."""
        self._ready_for: frozenset[int] = frozenset()
        """The partitions ``_ready`` is made for."""
        self._ready_since = 0.0
        """When ``_ready`` began (the monotonic clock)."""
        self._take_over = False
        """Whether ``_ready`` is made for partitions a leaving worker is about to hand over
        (``ready``'s ``incoming``), beside the stage's running queries here."""
        self._dropping: set[asyncio.Task[Any]] = set()
        """Stops of queries standing by that ``_drop_ready`` dropped, or their making cancelled
        (whose end stops the query it started): ``_close`` awaits them."""

    def join(self, tasks: dict[int, Task[Any]]) -> asyncio.Future[str]:
        """Run these started tasks (soon, in a Spark query of their own if one already runs).
        The future is set with a reason once the stream cannot run them any more."""
        ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        for partition, task in tasks.items():
            self.members[partition] = task
            self._ended[partition] = ended
            for runner in self.runners:  # an earlier task of the partition gets no more batches
                if runner.tasks.get(partition) not in (None, task):
                    del runner.tasks[partition]
        self._changed.set()
        self._came.set()
        if self._job is None:
            self._job = asyncio.create_task(self._run(), name=f"stream-{self.stage.query.query_id}-{self.stage.name}")
        return ended

    def leave(self, tasks: dict[int, Task[Any]]) -> None:
        """Stop giving these tasks batches, now (a batch already committing goes on: the
        task's own stop ends it). A partition that another task has joined since is left as
        it is."""
        for partition, task in tasks.items():
            if self.members.get(partition) is task:
                self._remove(partition)
        self._changed.set()

    def takes_newcomers(self) -> bool:
        """Whether tasks that join now would get a Spark query of their own, beside a running
        one (``_reconcile``)."""
        newest = self.runners[-1] if self.runners else None
        return newest is not None and newest.parked_at is None and not self._restarts(newest)

    def _restarts(self, newest: QueryRunner) -> bool:
        """Whether newcomers restart the stage's newest running query with them instead of
        getting one of their own: it has processed nothing yet, or there is no room for another."""
        return newest.batches == 0 or len(self.runners) >= MAX_QUERIES

    def expect(self, tasks: dict[int, Task[Any]], positions: dict[int, int | None]) -> None:
        """These tasks are starting, each expected to resume at its position: when they would
        get a Spark query of their own, its plan is made now, while they start (fencing,
        restore), for the ``join`` that follows to start it at once if the plan ``fits`` where
        they resume (else the query's plan is made again then, as without this)."""
        for partition, task in tasks.items():
            if self.members.get(partition) is not task:
                self._expected[partition] = (task, positions[partition])
        self._came.set()
        if self._preparing is not None:  # its plan would lack these: a later one replaces it
            self._preparing.cancel()
        self._preparing = asyncio.create_task(self._prepare(), name=f"prepare-{self.stage.query.query_id}")

    def ready(self, partitions: frozenset[int], incoming: frozenset[int] = frozenset()) -> None:
        """This worker keeps copies of ``partitions`` (standby, or warm-up ahead of a move) and
        runs none of the stage: make the plan of the Spark query they would get if they all
        moved here, so that a move finds it made. A plan is made from no task's position (the
        query resumes from a checkpoint written with them: ``QueryRunner.fits``); only a session
        that can do that makes one. Empty: no such plan is kept. Once tasks joined, or the stage
        runs here, nothing changes: a plan kept is their query's (``_from_copies``).

        ``incoming``: those of the copies a leaving worker is about to hand over
        (``PrepareTakeOver``) while the stage runs here, where they would get a Spark query of
        their own (when the stage ``takes_newcomers``): its plan is made for them alone and the
        query stands by beside the running one, until their tasks join and take it over; once
        none is incoming and none has joined, it is dropped. (Where the stage does not run, the
        plan made for all the copies serves.)"""
        running = bool(self.members or self.runners)
        if not running:
            wanted, take_over = partitions, False
        else:
            came = (self.members.keys() | self._expected.keys()) - self._running()
            if self._take_over and self._ready_for <= came:
                return  # their tasks have come: the join's ``_prepared`` takes it
            wanted = frozenset(incoming - self._running()) if self.takes_newcomers() else frozenset()
            take_over = bool(wanted)
            if not wanted and not self._take_over:
                return
        if (wanted, take_over) == (self._ready_for, self._take_over):
            return
        self._drop_ready()
        self._ready_for, self._take_over = wanted, take_over
        if wanted:
            self._ready = asyncio.create_task(self._make_ready(wanted), name=f"ready-{self.stage.query.query_id}")
            self._ready_since = time.monotonic()

    def forget_ready(self) -> None:
        """Drop the plan ``ready`` made (its session's driver died): the next ``ready`` makes it again."""
        self._drop_ready()

    def ready_made(self) -> bool:
        """Whether the plan ``ready`` makes is made (or failed, or has taken ``READY_PLAN_WAIT_S``
        already); safe from any thread."""
        job = self._ready
        return job is None or self._take_over or job.done() or time.monotonic() - self._ready_since >= READY_PLAN_WAIT_S

    def standing_by(self) -> tuple[frozenset[int], bool | None]:
        """The partitions a take-over's query is made for (``ready``'s ``incoming``; empty:
        none), and whether it stands by with its first batch held (None: still being made).
        Safe from any thread."""
        job = self._ready
        if not self._take_over or job is None:
            return frozenset(), False
        if not job.done():
            return self._ready_for, None
        runner = None if job.cancelled() or job.exception() is not None else job.result()
        return self._ready_for, runner is not None and runner.running and runner.warmed.is_set()

    def idle(self) -> bool:
        """Whether the stream runs, expects and keeps ready nothing (it may be dropped)."""
        return not (self.members or self.runners or self._expected or self._ready_for or self._job)

    def _drop_ready(self) -> None:
        job, self._ready, self._ready_for = self._ready, None, frozenset()
        self._take_over = False
        if job is None:
            return
        job.cancel()  # a query standing by that it started meanwhile is stopped by it
        stopping: asyncio.Task[Any] = job
        if job.done():
            if job.cancelled() or job.exception() is not None or (runner := job.result()) is None or not runner.running:
                return
            stopping = asyncio.create_task(self._stop_query(runner), name=f"drop-ready-{runner.name}")
        self._dropping.add(stopping)
        stopping.add_done_callback(self._dropping.discard)

    async def _make_ready(self, partitions: frozenset[int]) -> QueryRunner | None:
        """A runner for the copies' partitions with its plan made and, from the positions their
        tasks cannot resume before, its query standing by (``QueryRunner.stand_by``) with its
        first batch's code compiled (a move's first batch on a worker just added took 1.2 s of
        Spark, both cores busy: 0.5 s to start the query and plan that batch, 0.8 s to reduce
        it cold), or only its plan when its partitions' positions are not known."""
        runner: QueryRunner | None = None
        held = False
        try:
            runner = await self._runner({p: new_task(self.settings, self.stage, p) for p in sorted(partitions)})

            def make() -> bool:
                if offset_log_conf(runner.spark) is None:
                    return False  # a plan from made-up positions would fit no start
                runner.prepare(dict.fromkeys(sorted(partitions), 0))
                return True
            if not await asyncio.to_thread(make):
                return None
            positions = {p: await task.expected_input_offset() for p, task in runner.tasks.items()}
            known = {p: o for p, o in positions.items() if o is not None}
            if len(known) == len(positions):
                await run_to_end(asyncio.to_thread(runner.stand_by, known))
                held = await self._stood_by(runner)
            return runner
        except Exception:  # only a head start lost: the first query makes its plan
            log.info("a Spark query's plan could not be made from this worker's copies", exc_info=True,
                     extra=self._context)
            return None
        finally:
            # A query standing by that holds no batch (no input: polling an idle input would cost
            # what parking saves; or not in time), or whose making failed or was cancelled, stops.
            # The plan stays: a move starts the query with it.
            if not held and runner is not None and runner.running:
                await run_to_end(self._stop_query(runner))

    @staticmethod
    async def _stood_by(runner: QueryRunner) -> bool:
        """Whether ``runner``'s query standing by has its first batch reduced and held, within
        ``STAND_BY_WARM_WAIT_S``; false at once when it reported a trigger with no input first."""
        deadline = time.monotonic() + STAND_BY_WARM_WAIT_S
        while time.monotonic() < deadline:
            if runner.warmed.is_set():
                return True
            if await asyncio.to_thread(runner.progressed):
                return runner.warmed.is_set()
            await asyncio.sleep(0.05)
        return False

    async def _from_copies(self, tasks: dict[int, Task[Any]]) -> tuple[QueryRunner | None, str]:
        """The stage's first query here with the plan ``ready`` made, when it was made for exactly
        ``tasks``' partitions (waited for if still being made); else None, and why not."""
        job, made_for = self._ready, self._ready_for
        if job is None:
            return None, "none was being made"
        if made_for != tasks.keys() or (self.runners and not self._take_over):
            return None, f"the plan made from this worker's copies is for partitions {sorted(made_for)}"
        self._ready, self._ready_for, self._take_over = None, frozenset(), False
        return await _made(job, tasks, "none could be made from this worker's copies")

    def unexpect(self, tasks: dict[int, Task[Any]]) -> None:
        """These tasks will not join (their supervisor stops)."""
        for partition, task in tasks.items():
            if self._expected.get(partition, (None,))[0] is task:
                del self._expected[partition]

    def _starting(self) -> bool:
        """Whether an expected task has not joined yet."""
        return any(self.members.get(p) is not task for p, (task, _) in self._expected.items())

    def _running(self) -> set[int]:
        """The partitions the stage's Spark queries here run."""
        return {p for runner in self.runners for p in runner.tasks}

    async def _settle(self, come: Callable[[], Iterable[int]]) -> None:
        """Wait up to ``SETTLE_S`` for the partitions whose tasks start with those that have
        ``come`` (and that no Spark query runs yet): until every one the worker started together
        with them has come (at once for a partition that moves in alone, as in a kill's
        failover). Not knowing which started together (a newcomer the last reconcile did not
        start, as a supervisor's restart), the whole ``SETTLE_S``."""
        deadline = asyncio.get_running_loop().time() + SETTLE_S
        while True:
            together = {p for p in self._together.get(self.stage.query.query_id, ()) if p < self.stage.partitions}
            came = set(come())
            newcomers = came - self._running()
            remaining = deadline - asyncio.get_running_loop().time()
            if (together and newcomers <= together <= came) or remaining <= 0:
                return
            self._came.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._came.wait()

    async def _prepare(self) -> QueryRunner | None:
        """A runner over the expected tasks with its query's plan made, after the same wait as
        a join's (the tasks of a worker's partitions start at about the same time)."""
        await self._settle(lambda: {*self._expected, *self.members})
        running = self._running()
        expected = {p: (task, position) for p, (task, position) in self._expected.items()
                    if self.members.get(p) is not task or p not in running}
        if not expected or not self.takes_newcomers() or self._takes_over(expected.keys()):
            return None
        try:
            runner = await self._runner({p: task for p, (task, _) in expected.items()})
            await asyncio.to_thread(runner.prepare, {p: position for p, (_, position) in expected.items()})
        except Exception:  # the query's start makes its plan again, and says what fails
            log.info("a Spark query's plan could not be made ahead", exc_info=True, extra=self._context)
            return None
        log.info("a Spark query's plan made ahead", extra={**self._context, "partitions": sorted(expected),
                                                          "plan_ms": runner.plan_ms})
        return runner

    async def _prepared(self, tasks: dict[int, Task[Any]]) -> tuple[QueryRunner | None, str]:
        """The runner ``expect`` made ready for exactly ``tasks`` (which joined) from their
        positions now, waited for if its plan is still being made; else None, and why not (for
        the log: a plan made at the start costs the partitions' first batch its time)."""
        job, self._preparing = self._preparing, None
        for partition in tasks:
            self._expected.pop(partition, None)
        if job is None or self._takes_over(tasks.keys()):
            if job is not None:
                job.cancel()
            return await self._from_copies(tasks)
        if self._starting():  # others are still starting: the plan being made is for them too
            job.cancel()
            return None, "other partitions were still starting"
        return await _made(job, tasks, "none was made (no newcomer was expected by then, or its making failed)",
                           same_tasks=True)

    def _takes_over(self, partitions: Iterable[int]) -> bool:
        """Whether a query made for a take-over (``ready``'s ``incoming``) is for exactly these partitions."""
        return self._take_over and self._ready_for == frozenset(partitions)

    async def _runner(self, tasks: dict[int, Task[Any]]) -> QueryRunner:
        """A runner of the stage's Spark query over ``tasks`` (not started)."""
        spark = await self._spark()
        # A pool per query running at once (bounded: not one per query ever started).
        stage = "-".join(filter(None, (self.stage.query.query_id, self.stage.name)))
        used = {runner.pool for runner in self.runners}
        pool = next(f"{stage}-{n}" for n in itertools.count() if f"{stage}-{n}" not in used)
        return QueryRunner(
            spark, self.settings, self.stage.query, self.stage.source, self.stage.sink, tasks,
            asyncio.get_running_loop(), self.stage.name,
            name="-".join(filter(None, (stage, self.settings.worker_id, str(next(_names))))),
            on_task_failed=self._remove, on_committed=self.committed, pool=pool)

    async def close(self) -> None:
        """Stop the Spark queries and the stream's job (the tasks are their supervisors'): to
        the end even if the caller is cancelled meanwhile, so no Spark query is left running."""
        await run_to_end(self._close())

    async def _close(self) -> None:
        self._drop_ready()
        if self._preparing is not None:
            self._preparing.cancel()
            self._preparing = None
        self._expected.clear()
        job, self._job = self._job, None
        if job is not None:
            job.cancel()
            await asyncio.wait({job})
        runners, self.runners = self.runners, []
        # Queries standing by stop beside the running ones, not before them (a worker that
        # leaves has a bounded while to stop its running queries).
        dropping = asyncio.wait(set(self._dropping)) if self._dropping else asyncio.sleep(0)
        await asyncio.gather(dropping, *(self._retire(runner) for runner in runners))

    async def _run(self) -> None:
        while True:
            # Read before the step looks at the parked inputs' ends: a move after it wakes the wait.
            self._moves_seen = self.inputs.moves if self.inputs is not None else 0
            try:
                await self._step()
            except Exception as error:  # e.g. Spark's JVM gone: the members' supervisors must learn it
                log.warning("stream step failed", exc_info=True, extra=self._context)
                await self._fail_all(f"{type(error).__name__}: {error}")
            await self._wait()

    async def _step(self) -> None:
        """Act on a change of members; else look at each running query (failed? idle? how
        far has it read?) and, when all are parked, at their input."""
        if self._changed.is_set():
            await self._settle(lambda: self.members)
            self._changed.clear()
            await self._reconcile()
            return
        for runner in list(self.runners):
            if not runner.running:
                continue
            # Off the loop: a call into the JVM waits for Python's GIL behind the batch
            # thread, and the loop commits batches meanwhile (py-spy, a failover: 0.4 s of 3).
            if (reason := await asyncio.to_thread(runner.failure)) is not None:
                await self._fail(runner, reason)
            else:
                await self._rebuilt(runner)
                await self._park(runner)
        parked = [runner for runner in self.runners if runner.parked_at is not None]
        if parked and len(parked) == len(self.runners):
            await self._resume(parked)
        else:
            for runner in parked:  # alone: the stage's running queries go on as they are
                await self._resume([runner])

    async def _wait(self) -> None:
        """Until the members change, or the next look: soon while a query runs, when the
        input moved while all are parked, never while none runs (members leave and rejoin)."""
        changed = asyncio.ensure_future(self._changed.wait())
        if any(runner.running for runner in self.runners):
            other: asyncio.Future[Any] = asyncio.ensure_future(asyncio.sleep(WATCH_INTERVAL_S))
        elif self.runners and self.inputs is not None:
            other = asyncio.ensure_future(self.inputs.moved(self._moves_seen, PARKED_WATCH_INTERVAL_S))
        else:
            other = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait({changed, other}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in (changed, other):
                waiting.cancel()

    async def _reconcile(self) -> None:
        """Queries left with no member stop; members no query runs yet start in a query of
        their own (or join the parked ones, which start together when the input moves). No
        query that keeps a member is stopped."""
        for runner in list(self.runners):
            for partition in [p for p, task in runner.tasks.items() if self.members.get(p) is not task]:
                del runner.tasks[partition]
            if not runner.tasks:
                self.runners.remove(runner)
                await self._retire(runner)
        running = self._running()
        pending = self._settled({p: task for p, task in self.members.items() if p not in running})
        if not pending:
            return
        parked = [runner for runner in self.runners if runner.parked_at is not None]
        if parked and len(parked) == len(self.runners):
            parked[0].tasks.update(pending)
            await self._resume(parked, force=True)
            return
        newest = self.runners[-1] if self.runners else None
        if newest is not None and newest.parked_at is None and self._restarts(newest):
            # It has processed nothing yet (the partitions of a starting worker join one by one
            # as their restores end), or it runs only partitions that moved in lately: it
            # starts again with the newcomers rather than adding another query.
            self.runners.remove(newest)
            tasks, newest.tasks = newest.tasks, {}
            if (unclean := await self._stop_query(newest)) is not None:
                self._fail_tasks(tasks, unclean)
            else:
                pending.update(self._settled(tasks))
            if not pending:
                return
        waited = time.monotonic()
        query, why_not_ahead = await self._prepared(pending)
        waited_ms = round((time.monotonic() - waited) * 1000)
        if query is None:
            try:
                query = await self._runner(pending)
            except Exception as error:  # e.g. Spark's JVM gone: the newcomers' supervisors must learn it
                log.warning("no Spark session for a query", exc_info=True, extra=self._context)
                self._fail_tasks(pending, f"{type(error).__name__}: {error}")
                return
        self.runners.append(query)
        self._drop_ready()  # the stage runs here now: newcomers' plans are made as they start
        ahead = query.prepared() is not None
        try:  # not cut short by a cancel: ``close`` must find the query to stop it
            await run_to_end(asyncio.to_thread(query.start, query.positions()))
        except Exception as error:
            log.warning("a Spark query did not start", exc_info=True, extra=self._context)
            await self._fail(query, f"{type(error).__name__}: {error}")
            return
        if len(self.runners) > 1 or ahead:
            log.info("partitions joined in a Spark query of their own" if len(self.runners) > 1
                     else "the stage's Spark query started with its plan made ahead",
                     extra={**self._context, "runner": query.name, "partitions": sorted(pending), "plan_made_ahead": ahead,
                            "plan_ms": query.plan_ms, "plan_wait_ms": waited_ms,
                            **({} if ahead else {"plan_not_made_ahead": why_not_ahead})})

    async def _retire(self, runner: QueryRunner) -> None:
        """Stop ``runner``'s query (bounded) and forget its parked input. Its tasks are gone
        or failed already; a stop that overruns is logged (a commit it waits for is the
        task's own stop to end)."""
        runner.tasks = {}  # nothing more is committed by it
        if runner.parked_at is not None and self.inputs is not None:
            self.inputs.unwatch(self._inputs(runner.parked_at))
            runner.parked_at = None
        if (unclean := await self._stop_query(runner)) is not None:
            log.warning("a Spark query left behind", extra={**self._context, "runner": runner.name,
                                                              "reason": unclean})

    async def _stop_query(self, runner: QueryRunner) -> str | None:
        """Stop ``runner``'s Spark query (bounded); why that was not clean, or None. A stop
        interrupts a batch's Spark job (no commit began) but waits for its commit; what a
        failed or cancelled commit leaves is the task's to say (``Task.settled``)."""
        if runner.running and not await run_to_end(bounded(
                asyncio.to_thread(runner.stop), RUNNER_STOP_TIMEOUT_S, "stop the Spark query",
                {**self._context, "runner": runner.name})):
            return f"the Spark query did not stop within {RUNNER_STOP_TIMEOUT_S:g} s"
        return None

    async def _fail(self, runner: QueryRunner, reason: str) -> None:
        """``runner``'s Spark query cannot go on: the supervisor of every task it ran learns
        why (and restarts it); the stage's other queries go on."""
        log.warning("stream failed", extra={**self._context, "runner": runner.name, "reason": reason,
                                            "partitions": sorted(runner.tasks)})
        self._fail_tasks(runner.tasks, reason)
        if runner in self.runners:
            self.runners.remove(runner)
        await self._retire(runner)

    def _fail_tasks(self, tasks: dict[int, Task[Any]], reason: str) -> None:
        """Those of ``tasks`` that are still members leave, and their supervisors learn why."""
        for partition, task in list(tasks.items()):
            if self.members.get(partition) is task:
                self._remove(partition, reason)

    def _settled(self, tasks: dict[int, Task[Any]]) -> dict[int, Task[Any]]:
        """Those of ``tasks`` still members whose last commit ended cleanly; the others are
        failed (their positions are unknown, so no query may start them from there)."""
        self._fail_tasks({p: task for p, task in tasks.items() if not task.settled()},
                         "its last commit did not end cleanly")
        return {p: task for p, task in tasks.items() if self.members.get(p) is task}

    async def _fail_all(self, reason: str) -> None:
        """The stream cannot go on (an error outside any one query): every member's
        supervisor learns why."""
        log.warning("stream failed", extra={**self._context, "reason": reason, "partitions": sorted(self.members)})
        for partition in list(self.members):
            self._remove(partition, reason)
        self._changed.clear()
        runners, self.runners = self.runners, []
        await asyncio.gather(*(self._retire(runner) for runner in runners))

    def _remove(self, partition: int, reason: str | None = None) -> None:
        """Take a member out, and out of its query's batches; a ``reason`` goes to its
        supervisor (a member that leaves is not told)."""
        task = self.members.pop(partition, None)
        for runner in self.runners:
            if task is not None and runner.tasks.get(partition) is task:
                del runner.tasks[partition]
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
        """Stop a Spark query after ``park_after_idle_ms`` without input (the tasks stay open
        and serve)."""
        if self.inputs is None or self.settings.park_after_idle_ms <= 0:
            return
        if time.monotonic() - runner.last_batch_at < self.settings.park_after_idle_ms / 1000:
            return
        read = await asyncio.to_thread(runner.read_through)
        if read is None:
            return
        if (unclean := await self._stop_query(runner)) is not None:
            await self._fail(runner, unclean)
            return
        runner.parked_at = {p: o for p, o in read.items() if p in runner.tasks}
        for partition, offset in runner.parked_at.items():
            runner.tasks[partition].read_through(offset)  # idle: read through to the input's end
        self.inputs.watch(self._inputs(runner.parked_at))
        log.info("query parked", extra={"query": runner.name, "partitions": sorted(runner.parked_at),
                                        "read_through": runner.parked_at})

    async def _resume(self, parked: list[QueryRunner], force: bool = False) -> None:
        """Start the ``parked`` queries again, as one, once an input partition's end passed
        what they had read (or at once when ``force``d: a member joined)."""
        assert self.inputs is not None
        read = {p: o for runner in parked for p, o in (runner.parked_at or {}).items()}
        moved = [tp.partition for tp in self._inputs(read) if self.inputs.ends.get(tp, -1) > read[tp.partition]]
        if not moved and not force:
            return
        first, *others = parked
        for runner in parked:
            self.inputs.unwatch(self._inputs(runner.parked_at or {}))
            runner.parked_at = None
        for runner in others:
            first.tasks.update(runner.tasks)
            self.runners.remove(runner)
        first.tasks = self._settled(first.tasks)
        if not first.tasks:
            self.runners.remove(first)
            return
        await run_to_end(asyncio.to_thread(first.start, first.positions()))
        log.info("query resumed", extra={"query": first.name, "partitions": sorted(first.tasks), "input_moved": moved})

    def _inputs(self, read: dict[int, int]) -> list[TopicPartition]:
        return [TopicPartition(self.stage.source.topic, p) for p in sorted(read)]


async def _made(job: asyncio.Task[QueryRunner | None], tasks: dict[int, Task[Any]], none: str,
                same_tasks: bool = False) -> tuple[QueryRunner | None, str]:
    """The runner ``job`` made ahead, to run ``tasks`` from their positions; else None, and why
    not (``none`` when it made none). ``same_tasks``: it must have been made for those very
    tasks; else it takes them (it was made with stand-ins)."""
    try:
        runner = await job
    except asyncio.CancelledError:
        if (current := asyncio.current_task()) is not None and current.cancelling():
            raise
        return None, "its making was cancelled"
    if runner is None:
        return None, none
    if same_tasks and runner.tasks != tasks:
        return None, f"it was made for partitions {sorted(runner.tasks)}"
    runner.tasks = dict(tasks)
    if not runner.fits(runner.positions()):  # (a task resumed elsewhere than expected: its store is ahead)
        await run_to_end(asyncio.to_thread(runner.stop))  # standing by, or only its plan made: let go
        return None, f"it was made from offsets {runner.prepared()}, not {runner.positions()}"
    return runner, ""


class StageStreams:
    """This worker's stage streams, made on the first join and closed after the last leave."""

    def __init__(self, settings: WorkerSettings, spark: Callable[[], Awaitable[SparkSession]],
                 inputs: InputWatch | None = None, committed: Callable[[], None] | None = None):
        self.settings = settings
        self.spark = spark
        self.inputs = inputs
        """Where a parked stream learns that its input moved; None: streams never park."""
        self.committed = committed
        """Told each time a stream's tasks committed a batch."""
        self._streams: dict[tuple[str, str], StageStream] = {}
        self._together: dict[str, frozenset[int]] = {}
        """Per query id, the partitions whose tasks were last started together (``started_together``)."""
        self._stopped = False
        """Set by ``stop``: no stream is made any more."""

    def join(self, stage: Stage, tasks: dict[int, Task[Any]]) -> tuple[StageStream, asyncio.Future[str]]:
        """``StageStream.join`` on the stage's stream (made now if it has none): the stream,
        to leave, and the future set with why it cannot run the tasks any more."""
        if self._stopped:
            raise MillpondError("the worker is stopping: it starts no Spark query any more")
        key = (stage.query.query_id, stage.name)
        stream = self._streams.get(key)
        if stream is not None and stream.stage.query.plan != stage.query.plan:
            if stream.members:
                raise MillpondError(f"an older plan of query {stage.query.query_id} still runs partitions "
                                    f"{sorted(stream.members)} on this worker")
            stream._drop_ready()
            stream = None
        if stream is None:
            stream = self._streams[key] = StageStream(self.settings, stage, self.spark, self.inputs, self.committed, self._together)
        return stream, stream.join(tasks)

    def started_together(self, starting: Mapping[str, Iterable[int]]) -> None:
        """Per query id, the partitions whose tasks start now, together (one reconcile of the
        worker's assignment): the query's stage streams act on them once all have come, without
        waiting ``SETTLE_S`` for more. What other queries with no stream here started before is
        forgotten (they wait the whole ``SETTLE_S`` again, as without this)."""
        kept = {query for query, _ in self._streams} | starting.keys()
        for query in [q for q in self._together if q not in kept]:
            del self._together[query]
        self._together.update({query: frozenset(partitions) for query, partitions in starting.items()})

    def ready(self, copies: dict[tuple[str, str], tuple[Stage, frozenset[int]]],
              incoming: Mapping[tuple[str, str], frozenset[int]] | None = None) -> None:
        """Per (query id, stage name), the stage and the partitions this worker keeps copies of
        or is starting tasks of, and those of them a leaving worker is about to hand over
        (``incoming``): ``StageStream.ready`` on each stage's stream (made now if it has none);
        a stream left with nothing to run, expect or keep ready is dropped."""
        if self._stopped:
            return
        incoming = incoming or {}
        for key, stream in list(self._streams.items()):
            if key not in copies or not copies[key][1] or stream.stage.query.plan != copies[key][0].query.plan:
                stream.ready(frozenset())
                if stream.idle():
                    del self._streams[key]
        for key, (stage, partitions) in copies.items():
            if key not in self._streams and partitions:
                self._streams[key] = StageStream(self.settings, stage, self.spark, self.inputs, self.committed, self._together)
            if (kept := self._streams.get(key)) is not None and kept.stage.query.plan == stage.query.plan:
                kept.ready(partitions, incoming.get(key, frozenset()))

    def standing_by(self, query_id: str) -> list[tuple[frozenset[int], bool | None]]:
        """``StageStream.standing_by`` of each stage stream of the query here; safe from any thread."""
        return [stream.standing_by() for (query, _), stream in list(self._streams.items()) if query == query_id]

    @property
    def stopped(self) -> bool:
        """Whether ``stop`` has begun (no stream is made any more)."""
        return self._stopped

    def forget_ready(self) -> None:
        """``StageStream.forget_ready`` on every stream (a new Spark driver: the plans made on the
        old one are of a JVM that is gone)."""
        for stream in self._streams.values():
            stream.forget_ready()

    def ready_made(self) -> bool:
        """Whether every plan ``ready`` makes is made (``StageStream.ready_made``); safe from any thread."""
        return all(stream.ready_made() for stream in list(self._streams.values()))

    async def leave(self, stream: StageStream, tasks: dict[int, Task[Any]]) -> None:
        """``StageStream.leave``; the last one out closes the stream (awaited)."""
        stream.leave(tasks)
        if not stream.members:
            key = (stream.stage.query.query_id, stream.stage.name)
            if self._streams.get(key) is stream:
                del self._streams[key]
            await stream.close()

    def expect(self, stage: Stage, tasks: dict[int, Task[Any]],
               positions: dict[int, int | None]) -> StageStream | None:
        """``StageStream.expect`` on the stage's stream, when it has one that would run these
        tasks in a Spark query of their own (the stream, to ``unexpect``); else None."""
        stream = self._taking(stage)
        if stream is not None:
            stream.expect(tasks, positions)
        return stream

    def takes_newcomers(self, stage: Stage) -> bool:
        """Whether the stage's stream would run tasks that join now in a Spark query of their own."""
        return self._taking(stage) is not None

    def _taking(self, stage: Stage) -> StageStream | None:
        stream = self._streams.get((stage.query.query_id, stage.name))
        if stream is None or stream.stage.query.plan != stage.query.plan or not stream.takes_newcomers():
            return None
        return stream

    async def stop(self) -> None:
        """Close every stream, and make none after (a supervisor that restarts fails to join).
        The members' tasks stay open: their supervisors close them."""
        self._stopped = True
        streams, self._streams = list(self._streams.values()), {}
        await asyncio.gather(*(s.close() for s in streams))
