"""The tasks and standby copies this worker runs, reconciled with the newest assignment.

It all runs on the worker's processing loop (``processing.py``); the serving loop hands it
assignments and metastore changes (``take``, ``changed``, ``pause_standby``: safe from any
thread) and reads its reports and lags (snapshots, safe from any thread)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from millpond.services.worker.input_watch import InputWatch
from millpond.services.worker.query_runner import STAND_BY_HOLD_S
from millpond.services.worker.spark import LazySession
from millpond.services.worker.standby import StandbyReplica
from millpond.services.worker.state.store import close_handed
from millpond.services.worker.streams import StageStreams
from millpond.services.worker.supervisor import QuerySupervisor
from millpond.services.worker.task import (
    KEPT_STORE_MAX_AGE_MS,
    AggregationTask,
    TableTask,
    Task,
    group_rows,
    table_rows,
)
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.names import regroup_changelog_topic
from millpond.shared.catalog.queries import PersistentQuery, QueryPlan
from millpond.shared.catalog.topology import REGROUP_STAGE, Stage, stages
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import NotFoundError
from millpond.shared.events import wait_at_most
from millpond.shared.kafka.admin import GROUP_OFFSETS, GroupOffsets
from millpond.shared.task_status import STARTING, STOPPING, StoreLag, TaskReport

log = logging.getLogger(__name__)

RESTORES_FIRST_MAX_S = 30.0
"""The longest ``restored_at_start`` holds a worker's Spark session back from starting."""
FIRST_ASSIGNMENT_WAIT_S = 0.5
"""How long ``restored_at_start`` waits for a first assignment: a joining worker's first
heartbeat changes the assignment, so the answer carries one (0.01-0.03 s after the worker was
ready, in the e2e tests' logs); a worker that hears none is cut off from its coordinator."""
RESTORES_FIRST_POLL_S = 0.05
"""How often ``restored_at_start`` looks again."""
RECONCILE_EVERY_S = 1.0
"""The longest the reconcile loop waits without a change (a change wakes it at once)."""
INCOMING_FOR_S = STAND_BY_HOLD_S
"""How long a take-over a leaving worker announced (``prepare_take_over``) is prepared for: as
long as a query standing by holds its first batch."""


class TaskAssignment:
    """Runs a query supervisor per assigned query and a standby replica per assigned copy,
    starting and stopping them whenever the assignment or the metastore changes."""

    def __init__(self, settings: WorkerSettings, metastore: Metastore, spark: LazySession,
                 moved: Callable[[], None] | None = None):
        self.settings = settings
        self.metastore = metastore
        self.spark = spark
        self.moved = moved
        """Told each time a copy here moves on: a task's commit, a standby's applied transaction
        (``serving.Progress.moved``)."""
        self.generation = 0
        self.wanted: dict[str, set[int]] = {}
        self.wanted_standbys: set[tuple[str, int]] = set()
        """(query id, partition) this worker keeps a standby or warm-up copy of."""
        self.supervisors: dict[tuple[str, int], QuerySupervisor] = {}
        """(query id, partition) -> the supervisor running that partition's tasks."""
        self._stopping: dict[tuple[str, int], tuple[asyncio.Task[None], QuerySupervisor]] = {}
        """(query id, partition) -> the stop of a supervisor no longer wanted, under way, and the
        supervisor: the query's new tasks and the partition's standby copy wait for it; nothing
        else does. Its tasks are reported STOPPING meanwhile (a terminated query's internal
        topics are deleted once no worker reports it)."""
        self.standbys: dict[tuple[str, int], StandbyReplica] = {}
        self.companions: dict[tuple[str, int], list[StandbyReplica]] = {}
        """Copies of a standby's query's other stores kept beside it (a table aggregation's
        regroup store): started and stopped with it, their lag not reported."""
        self._standby_plans: dict[tuple[str, int], QueryPlan] = {}
        """The plan each standby copy was started for."""
        self.inputs = InputWatch(settings.kafka, settings.parked_fetch_wait_ms)
        """The end offsets of the parked streams' inputs (``StageStream``)."""
        self.streams = StageStreams(settings, lambda: self.spark.get(), self.inputs, moved)
        """One Spark query per stage of each query this worker runs, over all its partitions."""
        self.group_offsets = GroupOffsets(settings.kafka)
        """Where the tasks started here read their groups' committed positions (``run`` sets it
        in ``GROUP_OFFSETS`` for them): one admin client kept open, instead of one a read."""
        self._planned = False
        """Whether ``_ready_plans`` has run since the Spark session was ready."""
        self._planned_on: object | None = None
        """The Spark session ``_ready_plans`` last ran on (a new one, after its driver died,
        makes the plans again: the old one's are of a JVM that is gone)."""
        self._incoming: dict[tuple[str, int], tuple[float, str]] = {}
        """(query id, partition) of copies here a leaving worker is about to hand over
        (``prepare_take_over``), with when that stops being prepared for (the monotonic clock)
        and that worker: once an assignment no longer has it, only those that moved here stay."""
        self._announced = 0
        """How many take-overs were announced here (``prepare_take_over``, on the serving loop)."""
        self._noted = 0
        """How many of them the processing loop has noted in ``_incoming``."""
        self._handed = 0
        """``_noted`` when ``_ready_plans`` last handed the incoming copies to the stage streams."""
        self.workers: frozenset[str] | None = None
        """The workers of the newest assignment (None: not known)."""
        self.stopping = False
        """Set when the worker begins to stop: it prepares no take-over (``take_over_state``)."""
        self._dirty = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop ``run`` runs on, once it does."""

    def _soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the loop the tasks run on (called from any thread)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            callback()
        else:
            loop.call_soon_threadsafe(callback)

    def changed(self) -> None:
        """Something the tasks depend on changed (the metastore): reconcile again."""
        self._soon(self._dirty.set)

    def take(self, generation: int, wanted: dict[str, set[int]], standbys: set[tuple[str, int]],
             workers: frozenset[str] | None = None) -> None:
        """A new assignment: these actives (query id -> partitions) and standby copies, and
        every worker it has."""
        self.generation = generation
        self.wanted = wanted
        self.wanted_standbys = standbys
        self.workers = workers
        log.info("assignment received", extra={"generation": self.generation,
                                               "tasks": {q: sorted(p) for q, p in self.wanted.items()},
                                               "standbys": sorted(standbys)})
        self._soon(self._dirty.set)

    async def restored_at_start(self) -> None:
        """Return once every active task of the first assignment has started (its store
        restored from the changelog), ``RESTORES_FIRST_MAX_S`` at most; at once when it has
        none, and after ``FIRST_ASSIGNMENT_WAIT_S`` when no assignment has come by then. The
        worker's Spark session starts then (``LazySession.hold``): a restore is one thread of
        Python, and a JVM starting beside it took the cores from it. A worker restoring 1M keys
        read its changelog at 0.47-0.56x a raw aiokafka read, and at 0.79-0.84x held so; the
        same restore alone in a process ran at 1.01-1.07x, and at 0.66x beside a Spark session
        starting in that process. Its tasks could not run before their restore ends anyway."""
        began = time.monotonic()
        while True:
            waited = time.monotonic() - began
            if self.generation > 0:  # an assignment has come (only a leader assigns, its generations above 0)
                if self._actives_started() or waited >= RESTORES_FIRST_MAX_S:
                    return
            elif waited >= FIRST_ASSIGNMENT_WAIT_S:
                return
            await asyncio.sleep(RESTORES_FIRST_POLL_S)

    def _actives_started(self) -> bool:
        """Whether every wanted active task of a known query has a supervisor whose tasks started."""
        wanted = [(q, p) for q, partitions in self.wanted.items() if q in self.metastore.queries for p in partitions]
        supervisors = [self.supervisors.get(key) for key in wanted]
        return all(s is not None and not s.starting() for s in supervisors)

    def pause_standby(self, query_id: str, partition: int, paused: bool) -> int:
        """Pause or resume a standby copy's replay; its changelog position."""
        replica = self.standbys.get((query_id, partition))
        if replica is None:
            raise NotFoundError(f"worker {self.settings.worker_id} keeps no standby of partition {partition} "
                                f"of query {query_id}")
        for copy in (replica, *self.companions.get((query_id, partition), [])):
            self._soon(functools.partial(copy.pause, paused))
        return replica.position

    def prepare_take_over(self, keys: Sequence[tuple[str, int]], worker_id: str) -> int:
        """Worker ``worker_id`` is leaving and about to hand over these (query id, partition),
        whose copies this worker keeps: have the Spark queries they would get here standing by
        (``StageStream.ready``'s ``incoming``) for ``INCOMING_FOR_S`` at most. Called on the
        serving loop; the announcement's number, for ``take_over_state``."""
        self._announced += 1
        announced = self._announced
        until = time.monotonic() + INCOMING_FOR_S

        def note() -> None:
            self._incoming.update(dict.fromkeys(keys, (until, worker_id)))
            self._noted = max(self._noted, announced)
            self._dirty.set()
        self._soon(note)
        return announced

    def take_over_state(self, keys: Sequence[tuple[str, int]], announced: int) -> list[tuple[str, int]] | None:
        """Those of ``keys`` (announcement number ``announced``: ``prepare_take_over``) each of
        whose stage streams here has a query standing by for it; None until the announcement
        reached the streams, and while one is still being made. Safe from any thread."""
        if self.stopping or self.streams.stopped:
            return []
        if self._handed < announced:
            return None
        standing = []
        for query_id, partition in keys:
            states = [ok for partitions, ok in self.streams.standing_by(query_id) if partition in partitions]
            if None in states:
                return None
            if states and all(states):
                standing.append((query_id, partition))
        return standing

    def active_tasks(self) -> list[Task[Any]]:
        """Every task of the result stages this worker runs (a snapshot, safe from any thread)."""
        return [t for s in list(self.supervisors.values()) for t in list(s.tasks.values())]

    def task_reports(self) -> list[TaskReport]:
        """The state of every task this worker runs; STOPPING for each still stopping, and
        STARTING for each assigned whose query's statement has not been replayed here yet (the
        coordinator deletes a terminated query's topics once no worker reports it)."""
        stopping = [replace(r, state=STOPPING) for _, s in list(self._stopping.values()) for r in s.reports()]
        held = set(self.supervisors) | set(self._stopping)
        unknown = [TaskReport(query_id, p, STARTING, worker_id=self.settings.worker_id)
                   for query_id, partitions in list(self.wanted.items()) if query_id not in self.metastore.queries
                   for p in sorted(partitions) if (query_id, p) not in held]
        return [r for s in list(self.supervisors.values()) for r in s.reports()] + stopping + unknown

    def store_lags(self) -> list[StoreLag]:
        """How far each local table copy, active or standby, is behind its changelog."""
        active = [t.lag() for t in self.active_tasks() if isinstance(t, AggregationTask | TableTask)]
        return [lag for lag in [*active, *(r.lag() for r in list(self.standbys.values()))] if lag is not None]

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile whenever something changed (and at least every ``RECONCILE_EVERY_S``) until ``stop``."""
        self._loop = asyncio.get_running_loop()
        GROUP_OFFSETS.set(self.group_offsets)  # for the supervisors and streams' jobs started from here
        while not stop.is_set():
            await wait_at_most(self._dirty, RECONCILE_EVERY_S)
            if stop.is_set():
                break
            self._dirty.clear()
            try:
                await self._reconcile()
            except Exception:
                log.exception("reconciling tasks failed; retrying")
                await asyncio.sleep(1)
                self._dirty.set()

    async def _reconcile(self) -> None:
        # A store is open in one place at a time: a standby being promoted stops before its
        # active task starts (and hands its open store over), and a demoted active closes
        # before its standby opens the store.
        # One assignment throughout: a newer one that arrives meanwhile sets _dirty again.
        wanted, wanted_standbys = self.wanted, self.wanted_standbys
        standbys = self._standbys_to_run(wanted, wanted_standbys)
        # A copy of a query whose plan changed (CREATE OR REPLACE) restarts with the new one.
        changed = {key for key in standbys & set(self.standbys)
                   if self._standby_plans.get(key) != self.metastore.queries[key[0]].plan}
        gone = sorted((set(self.standbys) - standbys) | changed)
        for key in gone:
            self._standby_plans.pop(key, None)
        # A copy of a partition this worker now runs the active of leaves its store open for
        # the active task.
        await _stop_all([copy.stop(hand_over=key[1] in wanted.get(key[0], set()))
                         for key in gone for copy in (self.standbys.pop(key), *self.companions.pop(key, []))])
        await self._reconcile_actives(wanted)
        self._ready_plans()
        if any(supervisor.settling() for supervisor in self.supervisors.values()):
            # Partitions that moved in come first: until their first batch is committed, new
            # copies (a store to open, a changelog to replay from the start) would take the
            # processing loop's time from it. The reconcile a second later starts them.
            return
        for key in sorted(standbys - set(self.standbys)):
            if key in self._stopping:
                continue  # its active task still has the store open; started once it closed
            final = self._final_stage(key[0])
            replica = StandbyReplica(self.settings, *key, table_rows(final.sink) if final.replayed
                                     else group_rows(final.query, final.sink), final.source if final.replayed else None,
                                     moved=self.moved)
            companions = self._companions(*key)
            self.standbys[key], self._standby_plans[key] = replica, self.metastore.queries[key[0]].plan
            self.companions[key] = companions
            for copy in (replica, *companions):
                copy.start()

    def _ready_plans(self) -> None:
        """Have the Spark plan made, per stage of each query this worker keeps copies of but
        runs no task of, for the query those copies' partitions would get if they moved here
        (``StageStreams.ready``): a move here (a warm-up copy's, above all: the worker added
        to a cluster runs none of the query yet) then starts it without making it. A partition
        whose tasks are starting counts as a copy still, until they join. Only once the Spark
        session is up and warm (this starts none). The copies a leaving worker is about to hand
        over (``prepare_take_over``) get theirs made too where the stage runs here."""
        noted, now, workers = self._noted, time.monotonic(), self.workers
        self._incoming = {key: (until, by) for key, (until, by) in self._incoming.items()
                          if until > now and not self.stopping and (workers is None or by in workers
                                                                    or key[1] in self.wanted.get(key[0], ()))}
        if not self.spark.ready:
            self._handed = noted  # none can be made: the leaving worker is not kept waiting
            return
        if self._planned_on is not None and self._planned_on is not self.spark.session:
            self.streams.forget_ready()
        self._planned, self._planned_on = True, self.spark.session
        keys = {*self.standbys, *(key for key, supervisor in self.supervisors.items() if supervisor.starting())}
        copies: dict[tuple[str, str], tuple[Stage, frozenset[int]]] = {}
        incoming: dict[tuple[str, str], frozenset[int]] = {}
        for query_id in {query_id for query_id, _ in keys}:
            query = self.metastore.queries.get(query_id)
            if query is None:
                continue
            partitions = {p for q, p in keys if q == query_id}
            coming = {p for q, p in self._incoming if q == query_id and p in partitions}
            for stage in stages(query, self.metastore.source(query.source), self.metastore.source(query.sink),
                                self.settings.service_id):
                copies[query_id, stage.name] = stage, frozenset(p for p in partitions if p < stage.partitions)
                incoming[query_id, stage.name] = frozenset(p for p in coming if p < stage.partitions)
        self.streams.ready(copies, incoming)
        self._handed = noted

    def takes_over(self) -> bool:
        """Whether this worker's copies may be offered to take over (``membership.offered_lags``):
        once its Spark session is up and warm, and the plans of the queries its copies would get
        are made (``_ready_plans``; so a move here makes none: bench.failover's added worker was
        moved to 0.2-0.6 s after its warm-up ended, while that plan was being made). Safe from
        any thread."""
        return self.spark.ready and self._planned and self.streams.ready_made()

    def _companions(self, query_id: str, partition: int) -> list[StandbyReplica]:
        """Copies of the query's regroup store (a table aggregation's) for a standby of ``partition``."""
        query = self.metastore.queries[query_id]
        if query.plan.regrouped is None or partition >= query.plan.regrouped:
            return []
        return [StandbyReplica(self.settings, query_id, partition, lambda _key, _state: None,
                               changelog=regroup_changelog_topic(self.settings.service_id, query_id),
                               store=f"{query_id}-{REGROUP_STAGE}", max_age_ms=KEPT_STORE_MAX_AGE_MS)]

    def _final_stage(self, query_id: str) -> Stage:
        """The stage whose store a query's standby copies replicate (its result's)."""
        query = self.metastore.queries[query_id]
        return stages(query, self.metastore.source(query.source), self.metastore.source(query.sink),
                      self.settings.service_id)[-1]

    def _standbys_to_run(self, wanted: dict[str, set[int]], wanted_standbys: set[tuple[str, int]]
                         ) -> set[tuple[str, int]]:
        """The wanted standbys of queries that keep a changelog, for partitions their table has."""
        out = set()
        for query_id, partition in wanted_standbys:
            query = self.metastore.queries.get(query_id)
            if query is None or partition in wanted.get(query_id, set()):
                continue
            final = self._final_stage(query_id)
            if final.has_standbys and partition < final.partitions:
                out.add((query_id, partition))
        return out

    async def _reconcile_actives(self, wanted: dict[str, set[int]]) -> None:
        # One supervisor per (query, partition): a partition gained or lost starts or stops only
        # its own tasks, and the others go on (a gained one gets a Spark query of its own, and
        # the stage's running one leaves a lost one out: ``streams.py``). Stops run in the
        # background, each bounded: a query whose tasks are stopping here starts again once they
        # have (a restarted partition's new run opens what its old one closed), and no other
        # query's start, nor the next assignment, waits for them (a Spark query whose input
        # topic was deleted under it took its 30 s bound to stop, and held up every start).
        starting: list[tuple[PersistentQuery, int]] = []
        for key in sorted(set(self.supervisors) | {(q, p) for q, partitions in wanted.items() for p in partitions}):
            query_id, partition = key
            want = partition in wanted.get(query_id, set())
            query = self.metastore.queries.get(query_id)
            if want and query is None:
                continue  # the query's statement has not been replayed yet
            current = self.supervisors.get(key)
            if current is not None and want and query is not None and current.query.plan == query.plan:
                continue  # unchanged (CREATE OR REPLACE changes the plan and restarts the query)
            if current is not None:
                self._stop_in_background(key, self.supervisors.pop(key))
            if want and query is not None:
                starting.append((query, partition))
        starting = [(query, partition) for query, partition in starting
                    # started by the reconcile that follows its tasks' stop
                    if not any(stopping_query == query.query_id for stopping_query, _ in self._stopping)]
        together: dict[str, list[int]] = {}
        for query, partition in starting:
            together.setdefault(query.query_id, []).append(partition)
        self.streams.started_together(together)
        for query, partition in starting:
            supervisor = QuerySupervisor(self.settings, self.metastore, query, {partition}, self.streams)
            self.supervisors[query.query_id, partition] = supervisor
            supervisor.start()

    def _stop_in_background(self, key: tuple[str, int], supervisor: QuerySupervisor) -> None:
        """Stop ``supervisor`` (bounded, errors logged), and reconcile again once it stopped."""
        stopping = asyncio.create_task(_stop_all([supervisor.stop()]), name=f"stop-{key[0]}-{key[1]}")
        self._stopping[key] = stopping, supervisor

        began = time.monotonic()

        def stopped(_: asyncio.Task[None]) -> None:
            current = self._stopping.get(key)
            if current is not None and current[0] is stopping:
                del self._stopping[key]
            log.info("task stopped", extra={"query": key[0], "partition": key[1],
                                            "stop_s": round(time.monotonic() - began, 3)})
            self._dirty.set()
        stopping.add_done_callback(stopped)

    async def stop_processing(self) -> None:
        """Stop every Spark query now, and start none after; the tasks' stores stay open and
        answer pulls until ``stop``."""
        await self.streams.stop()

    async def stop(self) -> None:
        """Stop every task and standby copy, all at once, each bounded (errors logged: the worker is going)."""
        replicas = [*self.standbys.values(), *(copy for copies in self.companions.values() for copy in copies)]
        await _stop_all([*(supervisor.stop() for supervisor in self.supervisors.values()),
                         *(replica.stop() for replica in replicas), *(stop for stop, _ in self._stopping.values())])
        await self.streams.stop()
        await self.inputs.stop()
        await self.group_offsets.close()
        close_handed()


async def _stop_all(stops: Sequence[Awaitable[Any]]) -> None:
    """Await the stops of supervisors or replicas concurrently; each bounds its own stop and
    logs an overrun."""
    results = await asyncio.gather(*stops, return_exceptions=True)
    for error in results:
        if isinstance(error, BaseException):
            log.error("stopping failed", exc_info=error)
