"""Tearing a query down leaves nothing open, whatever await a cancel lands on: a query supervisor
runs real tasks (real RocksDB stores in a temporary directory) over fakes of the transactional
producer, the changelog consumer, the committed offsets and the Spark query (no Kafka, no
Spark). Every await of the fakes is a numbered step; the test runs the supervisor's life
(start, one batch's commit, a failure and its teardown) once per step k, holds the run at step
k and cancels the supervisor there. Then every producer and consumer is stopped, every store
reopens at once, no transaction is left open, and each task's store was written exactly when
its transaction committed.

A commit that hangs is aborted by the task's bounded stop, a task whose producer never stops
holds up neither its store nor the other tasks, and a supervisor that never stops holds up
neither the other supervisors nor the reconcile. New standby copies wait for the first batch
of partitions that moved in, and a stream asks its Spark query how it is off the loop.

The supervisors of one worker's partitions share one Spark query per stage: a partition that
leaves restarts the query, not the other partitions' tasks; a task whose commit fails leaves
alone; a Spark query that stops fails every partition it ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from aiokafka import TopicPartition

from millpond.services.worker import assignment as assignment_module
from millpond.services.worker import streams as streams_module
from millpond.services.worker import supervisor as supervisor_module
from millpond.services.worker import task as task_module
from millpond.services.worker.assignment import TaskAssignment
from millpond.services.worker.query_runner import QueryRunner
from millpond.services.worker.standby import StandbyReplica
from millpond.services.worker.state import changelog as changelog_module
from millpond.services.worker.state.store import INPUT_OFFSET, PartitionStore, encode_state
from millpond.services.worker.streams import StageStreams
from millpond.services.worker.supervisor import QuerySupervisor
from millpond.services.worker.task import AggregateSlice, AggregationTask, store_path
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.topology import Stage, stages
from millpond.shared.config import WorkerSettings
from millpond.shared.task_status import RUNNING, STARTING, STOPPING
from tests.metastores import applied
from tests.unit.services.worker.fake_changelog import Changelog, FakeConsumer
from tests.unit.services.worker.fake_spark import COLD_SPARK

STATEMENTS = [
    "CREATE STREAM r (sensor VARCHAR KEY, area VARCHAR, reading INT) WITH (kafka_topic='r', partitions=2, value_format='json')",
    "CREATE TABLE t AS SELECT sensor, COUNT(*) AS n, SUM(reading) AS total, AVG(reading) AS mean FROM r GROUP BY sensor",
    "CREATE STREAM hot AS SELECT sensor, area, reading * 2 AS doubled FROM r WHERE reading > 10",
    "CREATE TABLE s (id VARCHAR PRIMARY KEY, name VARCHAR, size INT) WITH (kafka_topic='s', partitions=2, value_format='json')",
]
QUERY = "CTAS_T_0"
TOGETHER_S = 0.2
"""How long a stream waits for its members to join when the tests start several at once."""
RESTORED_TO = 3
"""The input offset the changelog's one transaction reaches (the stores' position after restore)."""
COMMITTED_TO = 6
"""The input offset the test's batch reaches (the stores' position once it is applied)."""
CARRIED_THROUGH = {"producer.stop", "consumer.stop", "commit"}
"""Steps the code must carry to their end although cancelled (closing, and a transaction that
is already committing): held there, they go on once the test has cancelled. Any other step held
waits until the cancel reaches it."""


class Steps:
    """The await points the fakes pass, numbered; the run is held at step ``hold_at``."""

    def __init__(self, hold_at: int | None = None, hang: Mapping[str, Callable[[Any], bool]] | None = None):
        self.hold_at = hold_at
        self.hang = dict(hang or {})
        """Steps (by name, for the fakes the predicate accepts) that never end unless cancelled."""
        self.names: list[str] = []
        self.reached = asyncio.Event()
        self.released = asyncio.Event()

    async def point(self, name: str, owner: Any = None) -> None:
        self.names.append(name)
        if name in self.hang and self.hang[name](owner):
            await asyncio.get_running_loop().create_future()
        if len(self.names) == self.hold_at:
            self.reached.set()
            if name in CARRIED_THROUGH:
                await self.released.wait()
            else:
                await asyncio.get_running_loop().create_future()  # until the cancel reaches it
        await asyncio.sleep(0)


@dataclass(frozen=True)
class Metadata:
    offset: int


@dataclass
class World:
    """Everything the fakes made in one run, to check after it."""

    steps: Steps
    producers: list[StepProducer] = field(default_factory=list)
    consumers: list[StepConsumer] = field(default_factory=list)
    runners: list[FakeRunner] = field(default_factory=list)


class StepProducer:
    """A transactional producer whose every await is a step."""

    world: ClassVar[World]

    def __init__(self, **kwargs: Any):
        self.transactional_id: str = kwargs["transactional_id"]
        self.log: list[str] = []
        self.started = self.stopped = self.in_transaction = False
        self.offset = 0
        self.world.producers.append(self)

    async def start(self) -> None:
        await self.world.steps.point("producer.start", self)
        self.started = True

    async def stop(self) -> None:
        await self.world.steps.point("producer.stop", self)
        self.stopped = True

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        assert not self.stopped, "a transaction on a stopped producer"
        await self.world.steps.point("begin", self)
        self.in_transaction = True
        try:
            yield
        except BaseException:
            await self.world.steps.point("abort", self)
            self.log.append("abort")
            self.in_transaction = False
            raise
        await self.world.steps.point("commit", self)
        self.log.append("commit")
        self.in_transaction = False

    async def send(self, topic: str, value: bytes | None, key: bytes | None = None, partition: int | None = None,
                   headers: Any = None, timestamp_ms: int | None = None) -> asyncio.Future[Metadata]:
        await self.world.steps.point("send", self)
        future: asyncio.Future[Metadata] = asyncio.get_running_loop().create_future()
        future.set_result(Metadata(self.offset))
        self.offset += 1
        return future

    async def flush(self) -> None:
        await self.world.steps.point("flush", self)

    async def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int], group: str) -> None:
        await self.world.steps.point("offsets", self)


class StepConsumer(FakeConsumer):
    """The changelog consumer of ``fake_changelog``, each await a step."""

    world: ClassVar[World]

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.stopped = False
        self.world.consumers.append(self)

    async def start(self) -> None:
        await self.world.steps.point("consumer.start", self)

    async def stop(self) -> None:
        await self.world.steps.point("consumer.stop", self)
        self.stopped = True

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        await self.world.steps.point("end_offsets", self)
        return await super().end_offsets(partitions)

    async def getmany(self, tp: TopicPartition, timeout_ms: int = 0, max_records: int | None = None) -> Any:
        await self.world.steps.point("fetch", self)
        return await super().getmany(tp, timeout_ms, max_records)


class FakeRunner(QueryRunner):
    """The Spark query, without Spark: the test calls its ``_commit`` as a batch would."""

    world: ClassVar[World]

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.reason: str | None = None
        self.started = self.stopped = False
        self.starts = 0
        self.read: dict[int, int] | None = None
        """What ``read_through`` says (None: no progress yet, so the query never parks)."""
        self.prepared_at: dict[int, int | None] | None = None
        self.stood_by: dict[int, int] | None = None
        self.made_ahead = False
        """Whether ``start`` took the plan ``prepare`` made (for the same positions)."""
        self.world.runners.append(self)

    @property
    def running(self) -> bool:
        return self.started and not self.stopped

    def prepare(self, positions: dict[int, int | None]) -> None:
        self.prepared_at = dict(positions)

    def prepared(self) -> dict[int, int | None] | None:
        return self.prepared_at

    def fits(self, positions: dict[int, int | None]) -> bool:
        """As a plan that starts from its own positions only (a session that cannot resume a
        query from a checkpoint written for it)."""
        return self.prepared_at == positions

    def start(self, positions: dict[int, int | None]) -> None:
        self.made_ahead, self.prepared_at = self.fits(positions), None
        self.started, self.stopped = True, False
        self.positions_at_start = positions
        self.starts += 1
        self.last_batch_at = time.monotonic()

    def stand_by(self, positions: dict[int, int]) -> None:
        """As a query standing by whose first batch was reduced and is held (``start`` takes over)."""
        self.stood_by = dict(positions)
        self.started, self.stopped = True, False
        self.warmed.set()

    def stop(self) -> None:
        self.stopped = True
        super().stop()  # no stream: removes the checkpoint folder

    def read_through(self) -> dict[int, int] | None:
        return self.read

    def failure(self) -> str | None:
        return self.reason


@pytest.fixture
def world(changelog: Changelog, monkeypatch: pytest.MonkeyPatch) -> World:
    """Fakes patched in where the worker makes its clients; short limits and watch interval."""
    made = World(Steps())
    for fake in (StepProducer, StepConsumer, FakeRunner):
        monkeypatch.setattr(fake, "world", made, raising=False)
    monkeypatch.setattr(task_module, "AIOKafkaProducer", StepProducer)
    monkeypatch.setattr(changelog_module, "AIOKafkaConsumer", StepConsumer)
    monkeypatch.setattr(streams_module, "QueryRunner", FakeRunner)

    async def committed_positions(_kafka: Any, _group: str, inputs: list[TopicPartition]) -> dict[TopicPartition, tuple[int, str]]:
        await made.steps.point("committed_positions")
        return {tp: (RESTORED_TO, "") for tp in inputs}  # the position the changelog's transaction committed
    monkeypatch.setattr(task_module, "committed_positions", committed_positions)
    monkeypatch.setattr(streams_module, "WATCH_INTERVAL_S", 0.005)
    monkeypatch.setattr(streams_module, "SETTLE_S", 0.001)
    for name, limit in [("COMMIT_GRACE_S", 2.0), ("ABORT_TIMEOUT_S", 2.0), ("PRODUCER_STOP_TIMEOUT_S", 2.0)]:
        monkeypatch.setattr(task_module, name, limit, raising=False)
    changelog.commit_batch({b"s0": [[1], [1], [1, 1]]}, reaches=RESTORED_TO)
    return made


def metastore() -> Metastore:
    return applied(STATEMENTS)


def supervisor_of(tmp_path: Path, world: World, query_id: str = QUERY) -> QuerySupervisor:
    return supervisors_of(tmp_path, world, [{0, 1}], query_id)[0]


def supervisors_of(tmp_path: Path, world: World, partitions: list[set[int]],
                   query_id: str = QUERY, watch: FakeWatch | None = None) -> list[QuerySupervisor]:
    """Supervisors of these partitions of the query, sharing one worker's stage streams (which
    park after 20 ms without input when they have an input ``watch``)."""
    meta = metastore()
    # A failed run waits long before its retry: one run per test.
    settings = WorkerSettings(worker_id="w", state_dir=tmp_path, task_retry_initial_ms=600_000, task_retry_max_ms=600_000,
                              park_after_idle_ms=20 if watch is not None else 15_000)

    async def spark() -> Any:
        await world.steps.point("spark")
        return object()
    streams = StageStreams(settings, spark, watch)  # type: ignore[arg-type]
    return [QuerySupervisor(settings, meta, meta.queries[query_id], p, streams) for p in partitions]


def batch() -> dict[int, AggregateSlice]:
    """One micro-batch's slices for partitions 0 and 1."""
    return {p: AggregateSlice(RESTORED_TO, COMMITTED_TO - 1, count=1, partials=[(b"k%d" % p, [[1], [2], [2, 1]])])
            for p in (0, 1)}


async def until(condition: Callable[[], bool], steps: Steps, timeout_s: float = 5.0) -> bool:
    """Wait for ``condition`` or for the held step; whether the step was reached."""
    async with asyncio.timeout(timeout_s):
        while not steps.reached.is_set() and not condition():  # noqa: ASYNC110 (polls state the fakes change)
            await asyncio.sleep(0.001)
    return steps.reached.is_set()


async def live(supervisor: QuerySupervisor, world: World) -> asyncio.Task[Any] | None:
    """Start, commit one batch, fail and tear down, until the held step; then stop the supervisor
    there (and let a carried-through step go on). The batch's commit, if it began."""
    steps = world.steps
    supervisor.start()
    commit: asyncio.Task[Any] | None = None
    reached = await until(lambda: bool(world.runners) and world.runners[-1].started
                          and all(t.state == RUNNING for t in supervisor.tasks.values()), steps)
    if not reached:
        commit = asyncio.create_task(world.runners[0]._commit(dict(batch())))
        reached = await until(commit.done, steps)
    if not reached:
        world.runners[0].reason = "the Spark query stopped"  # a failed batch: the run ends, its teardown runs
        reached = await until(lambda: supervisor.failures > 0, steps)
    stopping = asyncio.create_task(supervisor.stop())
    await asyncio.sleep(0)  # the cancel is on its way
    steps.released.set()
    async with asyncio.timeout(5):
        await stopping
    if commit is not None:
        await asyncio.wait({commit}, timeout=1)
    return commit


def assert_nothing_open(supervisor: QuerySupervisor, world: World, settings: WorkerSettings, where: str) -> None:
    assert world.producers and all(p.stopped for p in world.producers), f"{where}: a producer left open"
    assert all(c.stopped for c in world.consumers), f"{where}: a changelog consumer left open"
    assert not any(p.in_transaction for p in world.producers), f"{where}: a transaction left open"
    assert all(r.stopped for r in world.runners), f"{where}: a Spark query left running"
    for partition, task in supervisor.tasks.items():
        assert task.store is None, f"{where}: the store of {partition} left open"
        store = PartitionStore(store_path(settings, QUERY, partition))  # RocksDB's lock is free at once
        try:
            written = store.position(INPUT_OFFSET) == COMMITTED_TO
            committed = task.producer is not None and "commit" in task.producer.log
            assert written == committed, f"{where}: partition {partition} committed={committed} but store written={written}"
        finally:
            store.close()


async def test_a_supervisor_cancelled_at_any_await_leaves_nothing_open(
        world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    clean = supervisor_of(tmp_path / "clean", world)  # one whole run, nothing held: the steps to hold at
    await live(clean, world)
    names = list(world.steps.names)
    assert {"producer.start", "consumer.stop", "committed_positions", "spark", "begin", "send", "flush", "offsets",
            "commit", "producer.stop"} <= set(names)
    assert all("commit" in p.log for p in world.producers)

    for k, name in enumerate(names, start=1):
        world.steps, world.producers, world.consumers, world.runners = Steps(hold_at=k), [], [], []
        supervisor = supervisor_of(tmp_path / str(k), world)
        commit = await live(supervisor, world)
        where = f"cancelled at step {k} ({world.steps.names[k - 1]}; {name} in the whole run)"
        assert world.steps.reached.is_set(), where
        assert commit is None or commit.done(), f"{where}: the commit left running"
        assert_nothing_open(supervisor, world, supervisor.settings, where)
    assert not [r.getMessage() for r in caplog.records if "overran" in r.getMessage()]


async def test_a_cancel_during_the_teardown_still_closes_every_task(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: a cancel while the first task closes used to skip every task.stop()."""
    monkeypatch.setattr(task_module, "PRODUCER_STOP_TIMEOUT_S", 0.2, raising=False)
    world.steps = Steps(hang={"producer.stop": lambda p: not world.steps.released.is_set()})
    supervisor = supervisor_of(tmp_path, world)
    supervisor.start()
    await until(lambda: bool(world.runners) and world.runners[-1].started
                and all(t.state == RUNNING for t in supervisor.tasks.values()) and bool(supervisor.tasks), world.steps)
    world.runners[0].reason = "the Spark query stopped"
    await until(lambda: "producer.stop" in world.steps.names, world.steps)
    async with asyncio.timeout(5):
        await supervisor.stop()  # lands in the teardown, on a producer's stop
    assert all(t.store is None for t in supervisor.tasks.values())
    assert sum(p.stopped for p in world.producers) == 0  # both stops hang (and were bounded) ...
    for partition in (0, 1):  # ... yet every store closed
        PartitionStore(store_path(supervisor.settings, QUERY, partition)).close()


def hanging_commit_task(world: World, tmp_path: Path, step: str) -> AggregationTask:
    meta = metastore()
    query = meta.queries[QUERY]
    task = AggregationTask(WorkerSettings(worker_id="w", state_dir=tmp_path), query, meta.sources[query.source],
                           meta.sources[query.sink], 0)
    world.steps = Steps(hang={step: lambda _: True})
    task.store = PartitionStore(task.store_path)
    task.producer = StepProducer(transactional_id="t")  # type: ignore[assignment]
    return task


@pytest.mark.parametrize("step", ["send", "flush", "offsets", "commit"])
async def test_a_commit_that_hangs_is_aborted_by_the_bounded_stop(
        step: str, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hung in its transaction: aborted at once. Hung committing: let finish for the grace,
    then cancelled. Either way the store is untouched, and closed with the producer stopped."""
    for name in ("COMMIT_GRACE_S", "ABORT_TIMEOUT_S"):
        monkeypatch.setattr(task_module, name, 0.2)
    task = hanging_commit_task(world, tmp_path, step)
    applying = asyncio.create_task(task.apply(batch()[0]))
    await until(lambda: step in world.steps.names, world.steps)
    async with asyncio.timeout(2):
        await task.stop()
    assert applying.cancelled()
    producer = task.producer
    assert isinstance(producer, StepProducer) and producer.stopped
    assert producer.log == ([] if step == "commit" else ["abort"])
    assert task.store is None
    store = PartitionStore(store_path(task.settings, QUERY, 0))
    assert store.position(INPUT_OFFSET) is None and store.get(b"k0") is None
    store.close()
    with pytest.raises(task_module.TaskStopped):
        await task.apply(batch()[0])


async def test_an_abort_that_hangs_too_is_left_and_the_rest_still_closes(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(task_module, "ABORT_TIMEOUT_S", 0.1)
    task = hanging_commit_task(world, tmp_path, "offsets")
    world.steps.hang["abort"] = lambda _: True
    applying = asyncio.create_task(task.apply(batch()[0]))
    await until(lambda: "offsets" in world.steps.names, world.steps)
    async with asyncio.timeout(2):
        await task.stop()
    assert isinstance(task.producer, StepProducer) and task.producer.stopped
    assert task.store is None
    PartitionStore(store_path(task.settings, QUERY, 0)).close()
    assert applying.done()  # cancelled once more after the producer stopped


async def test_one_task_whose_producer_never_stops_holds_up_no_other(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(task_module, "PRODUCER_STOP_TIMEOUT_S", 0.2, raising=False)
    release = asyncio.Event()

    async def stubborn_stop(self: StepProducer) -> None:  # partition 0's: deaf to cancels
        if "-0" in self.transactional_id:
            while not release.is_set():
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    pass
        self.stopped = True
    monkeypatch.setattr(StepProducer, "stop", stubborn_stop)
    supervisor = supervisor_of(tmp_path, world)
    supervisor.start()
    await until(lambda: bool(supervisor.tasks) and all(t.state == RUNNING for t in supervisor.tasks.values()), world.steps)
    try:
        async with asyncio.timeout(2):
            assert await supervisor.stop()
        stopped = {p.transactional_id.rsplit("-", 1)[-1]: p.stopped for p in world.producers}
        assert stopped == {"0": False, "1": True}, stopped
        for partition in (0, 1):
            PartitionStore(store_path(supervisor.settings, QUERY, partition)).close()
    finally:
        release.set()


async def test_assigned_tasks_of_a_query_not_replayed_yet_are_reported_starting(tmp_path: Path) -> None:
    """So the coordinator keeps a query's topics while a worker told to run it has not yet read
    its statement (a TERMINATE right after the CREATE)."""
    class NoSpark:
        ready = False

        async def get(self) -> Any:
            raise AssertionError("not used")
    tasks = TaskAssignment(WorkerSettings(worker_id="w", state_dir=tmp_path), metastore(), NoSpark())  # type: ignore[arg-type]
    tasks.take(1, {"CTAS_NOT_YET_9": {1, 0}, QUERY: {0}}, set())
    assert sorted((r.query_id, r.partition, r.state, r.worker_id) for r in tasks.task_reports()) == [
        ("CTAS_NOT_YET_9", 0, STARTING, "w"), ("CTAS_NOT_YET_9", 1, STARTING, "w")]  # QUERY is known: its supervisor reports it
    tasks.take(2, {QUERY: {0}}, set())
    assert tasks.task_reports() == []


async def test_a_supervisor_that_never_stops_holds_up_neither_the_others_nor_the_reconcile(
        changelog: Changelog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stops run in the background: a stuck one (a Spark query whose input topic was deleted
    under it took its whole 30 s bound) holds up no other query's start and no later
    assignment; only its own query's new tasks, and its partition's standby copy (the store is
    still open), wait for it."""
    release = asyncio.Event()
    stopped: list[str] = []

    async def run(self: QuerySupervisor) -> None:  # CTAS_T_0's stop hangs until released; the others end when cancelled
        try:
            await asyncio.Event().wait()
        finally:
            while self.query.query_id == QUERY and not release.is_set():
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    pass
            stopped.append(self.query.query_id)
    monkeypatch.setattr(QuerySupervisor, "_run", run)
    monkeypatch.setattr(supervisor_module, "STOP_TIMEOUT_S", 60.0, raising=False)
    monkeypatch.setattr(supervisor_module, "SETTLE_LIMIT_S", 0.0)  # new copies need not wait for moved partitions

    class NoSpark:
        ready = False

        async def get(self) -> Any:
            raise AssertionError("not used")
    tasks = TaskAssignment(WorkerSettings(worker_id="w", state_dir=tmp_path), metastore(), NoSpark())  # type: ignore[arg-type]
    tasks.take(1, {QUERY: {0, 1}, "CSAS_HOT_1": {0, 1}}, set())
    await tasks._reconcile()
    await asyncio.sleep(0)
    # The streams learn which partitions' tasks each reconcile starts together (``StageStream._settle``).
    assert tasks.streams._together == {QUERY: {0, 1}, "CSAS_HOT_1": {0, 1}}
    try:
        tasks.take(2, {"CST_S_2": {0, 1}}, set())
        async with asyncio.timeout(2):  # not the 60 s the stuck stop may take
            await tasks._reconcile()
            assert set(tasks.supervisors) == {("CST_S_2", 0), ("CST_S_2", 1)}
            assert tasks.streams._together == {"CST_S_2": {0, 1}}, "those of queries with no stream here forgotten"
            while len(stopped) < 2:  # noqa: ASYNC110 (the background stops append)
                await asyncio.sleep(0.01)
        assert stopped == ["CSAS_HOT_1", "CSAS_HOT_1"]  # one supervisor per partition
        # Reported STOPPING until stopped: the coordinator keeps a terminated query's topics till then.
        assert sorted((r.query_id, r.partition, r.state) for r in tasks.task_reports() if r.query_id != "CST_S_2") == [
            (QUERY, 0, STOPPING), (QUERY, 1, STOPPING)]
        # Its query wanted here again (and a copy of its other partition): both wait for its stop.
        tasks.take(3, {"CST_S_2": {0, 1}, QUERY: {0}}, {(QUERY, 1)})
        async with asyncio.timeout(2):
            await tasks._reconcile()
        assert QUERY not in tasks.streams._together, "a task that waits for its stop has not started"
        assert set(tasks.supervisors) == {("CST_S_2", 0), ("CST_S_2", 1)} and not tasks.standbys
        release.set()
        async with asyncio.timeout(5):
            while len(stopped) < 4:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            await tasks._dirty.wait()  # the stops' end asks for another reconcile
            await tasks._reconcile()
        assert set(tasks.supervisors) == {("CST_S_2", 0), ("CST_S_2", 1), (QUERY, 0)}
        assert [(r.partition, r.state) for r in tasks.task_reports() if r.query_id == QUERY] == [(0, STARTING)]
        assert set(tasks.standbys) == {(QUERY, 1)}
    finally:
        release.set()
        await asyncio.sleep(0.01)
        await tasks.stop()


async def test_a_supervisor_is_starting_until_its_tasks_have_restored_their_stores(world: World, tmp_path: Path) -> None:
    supervisor = supervisor_of(tmp_path, world)
    supervisor.start()
    try:
        assert supervisor.starting()
        await until(lambda: not supervisor.starting(), world.steps)
        assert supervisor.tasks and all(isinstance(task, AggregationTask) and task.restored and task.restored_records > 0
                                        for task in supervisor.tasks.values()), [vars(t) for t in supervisor.tasks.values()]
    finally:
        await supervisor.stop()


async def test_the_spark_session_waits_for_the_first_assignments_restores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A restore is one thread of Python: the worker's Spark session, whose JVM would take the
    cores from it, starts once the first assignment's active tasks have started (restored)."""
    restored = asyncio.Event()

    async def run(self: QuerySupervisor) -> None:  # partition 0's start ends when the test says so; 1's never
        if self.query.query_id == QUERY:
            await (restored.wait() if 0 in self.partitions else asyncio.Event().wait())
        self.tasks_started = True
        await asyncio.Event().wait()
    monkeypatch.setattr(QuerySupervisor, "_run", run)
    monkeypatch.setattr(assignment_module, "FIRST_ASSIGNMENT_WAIT_S", 5.0)
    tasks = TaskAssignment(WorkerSettings(worker_id="w", state_dir=tmp_path), metastore(), COLD_SPARK)  # type: ignore[arg-type]
    waiting = asyncio.create_task(tasks.restored_at_start())
    try:
        await asyncio.sleep(0.2)
        assert not waiting.done(), "no assignment yet"
        tasks.take(1, {QUERY: {0, 1}, "CSAS_HOT_1": {0}, "NO_SUCH_QUERY": {0}}, set())
        await asyncio.sleep(0.2)
        assert not waiting.done(), "its tasks not made yet"
        await tasks._reconcile()
        await asyncio.sleep(0.2)
        assert not waiting.done(), "restoring"
        tasks.supervisors[QUERY, 1].failed = True  # waiting to retry: it holds nothing back
        await asyncio.sleep(0.2)
        assert not waiting.done(), "partition 0 restoring"
        restored.set()
        await asyncio.wait_for(waiting, 2)
    finally:
        waiting.cancel()
        await tasks.stop()


async def test_a_worker_with_nothing_to_restore_starts_spark_at_once_and_every_wait_is_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Waits far apart, so that which one ended a hold shows whatever the machine's load.
    monkeypatch.setattr(assignment_module, "FIRST_ASSIGNMENT_WAIT_S", 1.0)
    monkeypatch.setattr(assignment_module, "RESTORES_FIRST_MAX_S", 3.0)

    def assignment() -> TaskAssignment:
        return TaskAssignment(WorkerSettings(worker_id="w", state_dir=tmp_path), metastore(), COLD_SPARK)  # type: ignore[arg-type]

    async def held(tasks: TaskAssignment) -> float:
        started = time.monotonic()
        await asyncio.wait_for(tasks.restored_at_start(), 5)
        return time.monotonic() - started

    standby = assignment()
    standby.take(1, {}, {(QUERY, 0)})  # a standby copy only
    assert await held(standby) < 0.9
    assert 0.95 < await held(assignment()) < 2.9  # no assignment comes (cut off from its coordinator)
    never = assignment()
    never.take(1, {QUERY: {0}}, set())  # its task is never made (no reconcile)
    assert await held(never) >= 2.9


async def test_new_standby_copies_wait_for_the_first_batch_of_the_partitions_that_moved_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new copy (a store to open, a changelog to replay from its start) would take the
    processing loop's time from a partition that just moved in: it starts once that partition
    committed a batch, or after ``SETTLE_LIMIT_S`` when its input is idle."""
    async def run(self: QuerySupervisor) -> None:  # started, at the committed position
        self._stage_tasks = [{p: SimpleNamespace(next_input_offset=3, start_input_offset=3) for p in self.partitions}]
        await asyncio.Event().wait()
    monkeypatch.setattr(QuerySupervisor, "_run", run)
    started: list[tuple[str, int]] = []
    monkeypatch.setattr(StandbyReplica, "start", lambda self: started.append((self.query_id, self.partition)))

    async def stop(self: StandbyReplica, timeout_s: float | None = None) -> bool:
        return True
    monkeypatch.setattr(StandbyReplica, "stop", stop)

    async def assigned() -> TaskAssignment:
        tasks = TaskAssignment(WorkerSettings(worker_id="w", state_dir=tmp_path), metastore(), COLD_SPARK)  # type: ignore[arg-type]
        tasks.take(1, {QUERY: {0}}, {(QUERY, 1)})
        await tasks._reconcile()
        await asyncio.sleep(0)
        await tasks._reconcile()
        return tasks

    tasks = await assigned()
    try:
        assert started == [], "a copy started before the partition that moved in processed a batch"
        tasks.supervisors[QUERY, 0]._stage_tasks[0][0].next_input_offset = 6
        await tasks._reconcile()
        assert started == [(QUERY, 1)]
    finally:
        await tasks.stop()

    started.clear()
    monkeypatch.setattr(supervisor_module, "SETTLE_LIMIT_S", 1.0)
    tasks = await assigned()
    try:
        assert started == []
        await asyncio.sleep(1.0)
        await tasks._reconcile()
        assert started == [(QUERY, 1)], "an idle partition holds new copies up for SETTLE_LIMIT_S at most"
    finally:
        await tasks.stop()


class FakeWatch:
    """The parked inputs' end offsets, as the test sets them."""

    def __init__(self) -> None:
        self.ends: dict[TopicPartition, int] = {}
        self.watched: list[TopicPartition] = []
        self.moves = 0
        self.fetched = asyncio.Event()

    def fetch(self, ends: dict[TopicPartition, int]) -> None:
        """A fetch of the watched ends found these: the parked wake up."""
        self.ends.update(ends)
        self.moves += 1
        self.fetched.set()
        self.fetched = asyncio.Event()

    async def moved(self, since: int, timeout_s: float) -> None:
        if self.moves != since:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.fetched.wait(), timeout_s)

    def watch(self, partitions: list[TopicPartition]) -> None:
        self.watched += partitions

    def unwatch(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.watched.remove(tp)


async def test_a_stage_without_input_parks_its_spark_query_and_resumes_when_the_input_moves(
        tmp_path: Path, world: World) -> None:
    """The tasks stay open and RUNNING throughout (they serve pulls); only the Spark query
    stops, and starts again once an input partition's end passes what it had read."""
    meta = metastore()
    watch = FakeWatch()
    (supervisor,) = supervisors_of(tmp_path, world, [{0, 1}], watch=watch)
    supervisor.start()
    try:
        assert not await until(lambda: bool(world.runners) and world.runners[-1].started
                               and all(t.state == RUNNING for t in supervisor.tasks.values()), world.steps)
        (runner,) = world.runners
        await asyncio.sleep(0.1)
        assert runner.running, "no progress yet: nothing says what it read, so it must not park"
        runner.read = {0: 10, 1: 10}
        # The query stops, then the supervisor watches its input: under load these are apart.
        assert not await until(lambda: runner.stopped and bool(watch.watched), world.steps)
        topic = meta.source("R").topic
        assert sorted(watch.watched) == [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        watch.fetch({TopicPartition(topic, 0): 10, TopicPartition(topic, 1): 10})
        await asyncio.sleep(0.1)
        assert not runner.running and runner.starts == 1, "nothing new: it stays parked"
        watch.fetch({TopicPartition(topic, 1): 12})
        assert not await until(lambda: runner.running, world.steps)
        assert runner.starts == 2 and watch.watched == []
        assert all(t.state == RUNNING and t.store is not None for t in supervisor.tasks.values())
        assert len(world.runners) == 1 and supervisor.failures == 0
    finally:
        await supervisor.stop()


async def test_the_queries_of_a_stage_park_and_start_again_as_one(tmp_path: Path, world: World) -> None:
    watch = FakeWatch()
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}], watch=watch)
    topic = metastore().source("R").topic
    try:
        first = await running([zero], world, {0})
        first.batches = 1
        second = await running([one], world, {1})
        first.read, second.read = {0: 10, 1: 4}, {0: 2, 1: 10}  # a query reports each partition it fetched
        assert not await until(lambda: first.stopped and second.stopped and len(watch.watched) == 2, world.steps)
        assert sorted(watch.watched) == [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        watch.fetch({TopicPartition(topic, 1): 12})
        assert not await until(lambda: first.running, world.steps)
        assert set(first.tasks) == {0, 1} and first.starts == 2 and not second.running and watch.watched == []
        assert zero.failures == 0 and one.failures == 0
    finally:
        await asyncio.gather(zero.stop(), one.stop())
    assert all(r.stopped for r in world.runners)


async def test_a_parked_query_starts_again_alone_while_another_of_its_stage_runs(
        tmp_path: Path, world: World) -> None:
    watch = FakeWatch()
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}], watch=watch)
    topic = metastore().source("R").topic
    try:
        first = await running([zero], world, {0})
        first.batches = 1  # it has input all along (no progress to park on)
        second = await running([one], world, {1})
        second.read = {1: 10}
        assert not await until(lambda: second.stopped and bool(watch.watched), world.steps)
        watch.fetch({TopicPartition(topic, 1): 12})
        assert not await until(lambda: second.running, world.steps)
        assert second.starts == 2 and set(second.tasks) == {1} and watch.watched == []
        assert first.running and first.starts == 1 and set(first.tasks) == {0}
    finally:
        await asyncio.gather(zero.stop(), one.stop())
    assert all(r.stopped for r in world.runners)


async def running(supervisors: list[QuerySupervisor], world: World, partitions: set[int]) -> FakeRunner:
    """Start the supervisors; the one Spark query, once it runs over exactly ``partitions``.
    Several start together: their tasks open their stores in threads, so one may join its
    stream some milliseconds after another, and the stream waits ``TOGETHER_S`` for them (the
    tests' own wait is 1 ms), as a worker's waits for its partitions' tasks."""
    settle = streams_module.SETTLE_S
    streams_module.SETTLE_S = TOGETHER_S if len(supervisors) > 1 else settle
    try:
        for supervisor in supervisors:
            supervisor.start()
        assert not await until(lambda: bool(world.runners) and world.runners[-1].running
                               and set(world.runners[-1].tasks) == partitions, world.steps)
    finally:
        streams_module.SETTLE_S = settle
    return world.runners[-1]


async def test_a_workers_partitions_share_one_spark_query_and_one_leaving_stops_nothing_else(
        world: World, tmp_path: Path) -> None:
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    try:
        runner = await running([zero, one], world, {0, 1})
        assert len(world.runners) == 1 and runner.positions_at_start == {0: RESTORED_TO, 1: RESTORED_TO}
        await runner._commit(dict(batch()))
        assert [p.log for p in world.producers] == [["commit"], ["commit"]]
        kept = zero.tasks[0]
        await one.stop()
        assert set(runner.tasks) == {0}, "the partition that left gets no more batches"
        await asyncio.sleep(0.05)
        assert len(world.runners) == 1 and runner.running and runner.starts == 1, "the Spark query goes on"
        assert zero.tasks[0] is kept and kept.store is not None and kept.state == RUNNING
        assert sum(p.transactional_id.endswith("-0") for p in world.producers) == 1, "partition 0 never restarted"
        assert zero.failures == 0
    finally:
        await zero.stop()
    assert all(r.stopped for r in world.runners)


async def test_a_leaving_worker_stops_its_spark_queries_first_and_its_stores_still_answer(
        world: World, tmp_path: Path) -> None:
    """The worker has left: its Spark queries stop at once, while its tasks stay open to serve
    pulls until they stop; a supervisor that restarts meanwhile starts no Spark query."""
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    late = QuerySupervisor(zero.settings, zero.metastore, zero.query, {1}, zero.streams)
    try:
        runner = await running([zero, one], world, {0, 1})
        await runner._commit(dict(batch()))
        await zero.streams.stop()
        assert runner.stopped, "the Spark query stops with the leave"
        for supervisor in (zero, one):
            (task,) = supervisor.tasks.values()
            assert task.store is not None and task.state == RUNNING and supervisor.failures == 0
            assert task.store.position(INPUT_OFFSET) == COMMITTED_TO, "what was committed still answers"
        await one.stop()
        late.start()  # partition 1 again, as a restart would
        assert not await until(lambda: late.failures > 0, world.steps)
        assert len(world.runners) == 1 and "stopping" in (late.reason or "")
    finally:
        await asyncio.gather(zero.stop(), one.stop(), late.stop())
    for supervisor in (zero, one, late):
        assert all(task.store is None for task in supervisor.tasks.values())
    assert all(p.stopped for p in world.producers) and not any(p.in_transaction for p in world.producers)


def joined_logs(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The log records of partitions that joined in a Spark query of their own."""
    return [r for r in caplog.records if r.getMessage() == "partitions joined in a Spark query of their own"]


async def test_a_partition_that_moves_in_gets_a_spark_query_of_its_own_and_the_running_one_goes_on(
        world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Partition 0's query has processed batches; partition 1 moves in (a failover, a scale-in):
    it runs in a second query from its own position and partition 0 sees no stop. A query that
    has processed nothing yet is started again with the newcomer instead."""
    caplog.set_level(logging.INFO, logger=streams_module.__name__)
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    try:
        first = await running([zero], world, {0})
        first.batches = 1
        await first._commit({0: batch()[0]})
        second = await running([one], world, {1})
        assert second is not first and second.positions_at_start == {1: RESTORED_TO}
        assert second.made_ahead, "its plan was made while its task started"
        assert not await until(lambda: bool(joined_logs(caplog)), world.steps)
        (joined,) = joined_logs(caplog)
        assert joined.plan_made_ahead is True and not hasattr(joined, "plan_not_made_ahead")
        assert first.running and first.starts == 1 and set(first.tasks) == {0}
        assert first.pool and second.pool and first.pool != second.pool, "each runs in a scheduler pool of its own"
        await second._commit({1: batch()[1]})
        assert zero.tasks[0].next_input_offset == one.tasks[1].next_input_offset == COMMITTED_TO
        assert zero.failures == 0 and one.failures == 0
    finally:
        await one.stop()
    # The stream's job stops a query left without partitions soon after the leave, not in it.
    assert not await until(lambda: second.stopped, world.steps), "the held step was reached"
    assert second.stopped and not first.stopped, "the second query stops with its last partition"
    await zero.stop()
    assert all(r.stopped for r in world.runners)


async def test_a_partition_whose_task_starts_at_once_still_gets_the_plan_made_ahead(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A moved-in partition whose restore ends within the plan's settle (a small store, a
    failover with no standby) has joined before the plan is made: the plan is made all the same,
    from the position expected, and the query starts with it (it was made at the join instead,
    from the start: 0.2-0.7 s of the failover in bench.failover's kills with no standby)."""
    caplog.set_level(logging.INFO, logger=streams_module.__name__)
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    try:
        first = await running([zero], world, {0})
        first.batches = 1
        monkeypatch.setattr(streams_module, "SETTLE_S", 0.05)  # longer than the fake task's whole start
        second = await running([one], world, {1})
        assert second is not first and second.positions_at_start == {1: RESTORED_TO}
        assert second.made_ahead, "its plan was made while its task started"
        assert not await until(lambda: bool(joined_logs(caplog)), world.steps)
        (joined,) = joined_logs(caplog)
        assert joined.plan_made_ahead is True
        assert first.running and first.starts == 1
    finally:
        await asyncio.gather(zero.stop(), one.stop())
    assert all(r.stopped for r in world.runners if r.started)


async def test_a_partition_that_resumes_elsewhere_than_expected_gets_its_plan_made_again(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The plan made while its task started is for the position read before the fence; the
    older owner committed more meanwhile (here: the first read says 7, the fenced one none), so
    the query starts from where the task resumes, with a plan made for it, never the other; the
    log says why the plan made ahead was not used."""
    caplog.set_level(logging.INFO, logger=streams_module.__name__)

    async def expected(_: Any) -> int:
        return 7
    monkeypatch.setattr(task_module.Task, "expected_input_offset", expected)
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    try:
        first = await running([zero], world, {0})
        first.batches = 1
        second = await running([one], world, {1})
        made = [r for r in world.runners if r.prepared_at == {1: 7}]
        assert made and not any(r.started for r in made), "the plan for offset 7 was made and left unused"
        assert second.positions_at_start == {1: RESTORED_TO} and not second.made_ahead
        assert first.running and first.starts == 1
        assert not await until(lambda: bool(joined_logs(caplog)), world.steps)
        (joined,) = joined_logs(caplog)
        assert joined.plan_made_ahead is False
        assert joined.plan_not_made_ahead == f"it was made from offsets {{1: 7}}, not {{1: {RESTORED_TO}}}"
    finally:
        await asyncio.gather(zero.stop(), one.stop())
    assert all(r.stopped for r in world.runners if r.started)


def resumable_plans(monkeypatch: pytest.MonkeyPatch, session_too: bool = True) -> None:
    """As a session whose queries resume from a checkpoint written for them (``session_too``),
    where a plan fits any positions of the partitions it was made for."""
    if session_too:
        monkeypatch.setattr(streams_module, "offset_log_conf", lambda _: {})
    monkeypatch.setattr(FakeRunner, "fits", lambda self, positions: self.prepared_at is not None
                        and self.prepared_at.keys() == positions.keys())


def committed_at(monkeypatch: pytest.MonkeyPatch, offset: int | None) -> None:
    """The group has committed ``offset`` on every input partition (None: nothing)."""
    async def committed_positions(_kafka: Any, _group: str, inputs: list[TopicPartition]) -> dict[TopicPartition, tuple[int, str]]:
        return {} if offset is None else {tp: (offset, "") for tp in inputs}
    monkeypatch.setattr(task_module, "committed_positions", committed_positions)


async def test_a_plan_that_fits_other_positions_is_taken_where_the_task_resumes_elsewhere(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """As above, but the plan made ahead fits any positions of the same partitions (the query
    resumes from a checkpoint written with them): the query starts with it, from where the
    task resumes."""
    caplog.set_level(logging.INFO, logger=streams_module.__name__)

    async def expected(_: Any) -> int:
        return 7
    monkeypatch.setattr(task_module.Task, "expected_input_offset", expected)
    resumable_plans(monkeypatch, session_too=False)
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    try:
        first = await running([zero], world, {0})
        first.batches = 1
        second = await running([one], world, {1})
        assert second.made_ahead and second.positions_at_start == {1: RESTORED_TO}, "the plan made from offset 7"
        assert not [r for r in world.runners if r.prepared_at == {1: 7} and not r.started], "no plan left unused"
        assert not await until(lambda: bool(joined_logs(caplog)), world.steps)
        (joined,) = joined_logs(caplog)
        assert joined.plan_made_ahead is True
    finally:
        await asyncio.gather(zero.stop(), one.stop())
    assert all(r.stopped for r in world.runners if r.started)


def only_stage(supervisor: QuerySupervisor) -> Stage:
    query = supervisor.query
    meta = supervisor.metastore
    (stage,) = stages(query, meta.source(query.source), meta.source(query.sink), supervisor.settings.service_id)
    return stage


async def test_a_partition_moving_to_a_worker_that_runs_none_of_its_stage_takes_the_plan_made_from_its_copy(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The worker keeps a copy of partition 1 only (a warm-up copy on a worker just added):
    the plan of the query partition 1 would get is made then, from no position, and the move
    starts the stage's first query here with it, from where the task resumes."""
    caplog.set_level(logging.INFO, logger=streams_module.__name__)
    resumable_plans(monkeypatch)
    committed_at(monkeypatch, None)  # the group has none (expired): the task resumes where its store is
    (one,) = supervisors_of(tmp_path, world, [{1}])
    stage = only_stage(one)
    try:
        one.streams.ready({(QUERY, stage.name): (stage, frozenset({1}))})
        assert not await until(lambda: bool(world.runners) and world.runners[0].prepared_at is not None, world.steps)
        ready = world.runners[0]
        assert ready.prepared_at == {1: 0} and not ready.started, "made from no task's position, not started"
        runner = await running([one], world, {1})
        assert runner is ready and runner.made_ahead and runner.positions_at_start == {1: RESTORED_TO}
        assert len(world.runners) == 1, "no other plan made"
        assert runner.tasks == one.tasks, "it runs the task that joined, not the stand-ins it was made with"
        assert not await until(lambda: any("plan made ahead" in r.getMessage() for r in caplog.records), world.steps)
        one.streams.ready({})
        assert runner.running, "a stage that runs keeps its query whatever the copies"
    finally:
        await one.stop()
    assert all(r.stopped for r in world.runners if r.started)


async def test_the_query_of_a_workers_copies_stands_by_from_the_groups_positions_and_stops_once_dropped(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the group's committed offsets are known, the query the copies would get is started
    from them ahead of the move (its first batch held); the move's tasks take it over, and one
    that no move took is stopped when the copies go."""
    resumable_plans(monkeypatch)
    committed_at(monkeypatch, 40)
    (one,) = supervisors_of(tmp_path, world, [{1}])
    stage = only_stage(one)
    streams = one.streams
    try:
        streams.ready({(QUERY, stage.name): (stage, frozenset({1}))})
        assert not await until(lambda: bool(world.runners) and world.runners[0].stood_by is not None, world.steps)
        standing = world.runners[0]
        assert standing.stood_by == {1: 40} and standing.running and not standing.starts
        assert not await until(streams.ready_made, world.steps), "its copies are offered once it stands by"
        runner = await running([one], world, {1})
        assert not await until(lambda: runner.starts > 0, world.steps)
        assert runner is standing and runner.starts == 1 and runner.positions_at_start == {1: 40}
        assert runner.tasks == one.tasks and len(world.runners) == 1
    finally:
        await one.stop()
    # Copies of another partition: their query stands by, and stops once they are gone.
    streams.ready({(QUERY, stage.name): (stage, frozenset({0}))})
    assert not await until(lambda: world.runners[-1].stood_by == {0: 40}, world.steps)
    dropped = world.runners[-1]
    streams.ready({})
    assert not await until(lambda: dropped.stopped, world.steps), "no query stands by for copies that are gone"


async def test_a_query_standing_by_over_an_idle_input_stops_and_its_plan_is_kept(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-by that reports a trigger with no input holds nothing: it stops (an idle query
    would poll its input for nothing), the copies are offered at once, and the move starts a
    query with the plan."""
    resumable_plans(monkeypatch)
    monkeypatch.setattr(FakeRunner, "progressed", lambda self: self.running)

    def stand_by(self: FakeRunner, positions: dict[int, int]) -> None:
        self.stood_by, self.started, self.stopped = dict(positions), True, False  # no batch: not warmed
    monkeypatch.setattr(FakeRunner, "stand_by", stand_by)
    committed_at(monkeypatch, 40)
    (one,) = supervisors_of(tmp_path, world, [{1}])
    stage = only_stage(one)
    try:
        one.streams.ready({(QUERY, stage.name): (stage, frozenset({1}))})
        assert not await until(lambda: bool(world.runners) and world.runners[0].stopped, world.steps)
        standing = world.runners[0]
        assert standing.stood_by == {1: 40} and standing.prepared_at == {1: 0}
        assert not await until(one.streams.ready_made, world.steps, timeout_s=2.0), \
            "offered at once, not after the stand-by's wait (8 s)"
        runner = await running([one], world, {1})
        assert runner is standing and runner.made_ahead and runner.positions_at_start == {1: 40}
    finally:
        await one.stop()


async def test_a_partition_a_leaving_worker_hands_over_has_a_query_standing_by_beside_the_running_one(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The stage runs here (partition 0) and the worker keeps a copy of partition 1: nothing is
    made for the copy until a leaving worker announces it hands partition 1 over; then a query
    for it stands by from the group's positions beside the running one, without holding the
    copies' offer, and the move's task takes it over (no plan made at the move, the running
    query untouched), even when the announcement is gone by the time the task joins. Once no
    partition is incoming and none came, one standing by is dropped."""
    caplog.set_level(logging.INFO, logger=streams_module.__name__)
    resumable_plans(monkeypatch)
    committed_at(monkeypatch, 40)
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    stage = only_stage(zero)
    streams = zero.streams
    key = (QUERY, stage.name)
    try:
        first = await running([zero], world, {0})
        first.batches = 1
        streams.ready({key: (stage, frozenset({1}))})
        await asyncio.sleep(0.05)
        assert world.runners == [first], "a stage that runs makes nothing for its copies"
        assert streams.standing_by(QUERY) == [(frozenset(), False)]
        streams.ready({key: (stage, frozenset({1}))}, {key: frozenset({1})})
        assert not await until(lambda: len(world.runners) == 2 and world.runners[1].stood_by is not None, world.steps)
        standing = world.runners[1]
        assert standing.stood_by == {1: 40} and standing.running and not standing.starts
        assert not await until(lambda: streams.standing_by(QUERY) == [(frozenset({1}), True)], world.steps)
        assert streams.ready_made(), "a take-over's query holds no copy's offer"
        streams.ready({key: (stage, frozenset({1}))}, {key: frozenset({1})})
        await asyncio.sleep(0.05)
        assert len(world.runners) == 2 and not standing.stopped, "asked again: the same one"
        # The task joins; before the stream acts on it, a reconcile hands it no incoming (its
        # copy gone, its task started): the query standing by is kept for it all the same.
        monkeypatch.setattr(streams_module, "SETTLE_S", 0.3)
        one.start()
        stream = streams._streams[key]
        assert not await until(lambda: 1 in stream.members, world.steps)
        streams.ready({key: (stage, frozenset())})
        assert not await until(lambda: standing.starts > 0, world.steps)
        assert standing.positions_at_start == {1: 40} and standing.tasks == one.tasks
        await asyncio.sleep(0.05)
        assert len(world.runners) == 2, "no other plan made: neither while its task started nor at the move"
        assert first.running and first.starts == 1 and set(first.tasks) == {0}, "the running query goes on"
        assert not await until(lambda: bool(joined_logs(caplog)), world.steps)
        (joined,) = joined_logs(caplog)
        assert joined.plan_made_ahead is True and joined.runner == standing.name
        streams.ready({key: (stage, frozenset())}, {key: frozenset({1})})
        await asyncio.sleep(0.05)
        assert len(world.runners) == 2, "a partition that runs here gets none however long it is incoming"
    finally:
        await asyncio.gather(zero.stop(), one.stop())
    # Announced, then not moved here: the query standing by stops once the partition is not incoming.
    monkeypatch.setattr(streams_module, "SETTLE_S", 0.001)
    zero, = supervisors_of(tmp_path, world, [{0}])
    streams = zero.streams
    try:
        first = await running([zero], world, {0})
        first.batches = 1
        streams.ready({key: (stage, frozenset({1}))}, {key: frozenset({1})})
        assert not await until(lambda: world.runners[-1].stood_by == {1: 40}, world.steps)
        dropped = world.runners[-1]
        streams.ready({key: (stage, frozenset({1}))})
        assert not await until(lambda: dropped.stopped, world.steps)
        assert streams.standing_by(QUERY) == [(frozenset(), False)] and first.running
    finally:
        await zero.stop()
    assert all(r.stopped for r in world.runners if r.started)


async def test_where_the_stage_does_not_run_an_announcement_keeps_the_plan_made_for_all_the_copies(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker running none of the stage (one just added) has the plan made for all its
    copies, and its copies' offer waits for it: an announcement of some of them changes neither."""
    resumable_plans(monkeypatch)
    committed_at(monkeypatch, 40)
    (one,) = supervisors_of(tmp_path, world, [{1}])
    stage = only_stage(one)
    streams = one.streams
    key = (QUERY, stage.name)
    try:
        streams.ready({key: (stage, frozenset({0, 1}))})
        assert not await until(lambda: bool(world.runners) and world.runners[0].stood_by is not None, world.steps)
        streams.ready({key: (stage, frozenset({0, 1}))}, {key: frozenset({1})})
        await asyncio.sleep(0.05)
        assert len(world.runners) == 1 and world.runners[0].stood_by == {0: 40, 1: 40} and world.runners[0].running
        assert streams.standing_by(QUERY) == [(frozenset(), False)]
    finally:
        await one.stop()
        await streams.stop()
    assert all(r.stopped for r in world.runners if r.started)


async def test_a_plan_made_from_other_copies_than_the_partitions_that_move_is_not_taken(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    resumable_plans(monkeypatch)
    (one,) = supervisors_of(tmp_path, world, [{1}])
    stage = only_stage(one)
    streams = one.streams
    try:
        streams.ready({(QUERY, stage.name): (stage, frozenset({0, 1}))})
        assert not await until(lambda: bool(world.runners) and world.runners[0].prepared_at is not None, world.steps)
        runner = await running([one], world, {1})
        assert runner is not world.runners[0] and not runner.made_ahead
    finally:
        await one.stop()
    # Copies of a query the worker no longer runs or keeps: its stream goes, with its plan.
    streams.ready({(QUERY, stage.name): (stage, frozenset({0}))})
    assert streams._streams
    streams.ready({})
    assert not streams._streams


async def test_a_workers_copies_and_starting_partitions_are_those_the_plans_are_made_for(tmp_path: Path) -> None:
    """Made once the Spark session is warm; a partition whose tasks start still counts (its copy
    was just handed over), one that runs does not matter (the stage's stream runs it)."""
    tasks = TaskAssignment(WorkerSettings(worker_id="w", state_dir=tmp_path), metastore(), COLD_SPARK)  # type: ignore[arg-type]
    asked: list[dict[tuple[str, str], tuple[Stage, frozenset[int]]]] = []
    tasks.streams.ready = lambda copies, incoming=None: asked.append(copies)  # type: ignore[method-assign]
    tasks.standbys[QUERY, 1] = None  # type: ignore[assignment]
    tasks._ready_plans()
    assert asked == [], "a cold session makes no plan"
    tasks.spark = SimpleNamespace(ready=True, session="spark")  # type: ignore[assignment]
    starting = QuerySupervisor(tasks.settings, tasks.metastore, tasks.metastore.queries[QUERY], {0}, tasks.streams)
    tasks.supervisors[QUERY, 0] = starting
    tasks._ready_plans()
    (copies,) = asked
    ((key, (stage, partitions)),) = copies.items()
    assert key == (QUERY, stage.name) and stage.query.query_id == QUERY and partitions == {0, 1}
    starting.tasks_started = True
    tasks._ready_plans()
    assert asked[-1][key][1] == {1}


async def test_a_take_over_is_prepared_for_the_copies_asked_and_answered_once_their_queries_stand_by(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``prepare_take_over`` (a leaving worker's PrepareTakeOver): the copies asked for reach the
    stage streams as incoming at the next reconcile, and only those kept here; the answer waits
    until then (an earlier announcement's state does not answer it) and while a query is being
    made; it lists those standing by, and none once the worker stops. An announcement lapses
    after ``INCOMING_FOR_S``, and once an assignment without the leaving worker came, but for
    the copies that moved here."""
    tasks = TaskAssignment(WorkerSettings(worker_id="w", state_dir=tmp_path), metastore(), COLD_SPARK)  # type: ignore[arg-type]
    incoming: list[dict[tuple[str, str], frozenset[int]] | None] = []
    tasks.streams.ready = lambda copies, coming=None: incoming.append(coming)  # type: ignore[method-assign]
    states: dict[str, list[tuple[frozenset[int], bool | None]]] = {}
    tasks.streams.standing_by = lambda query_id: states.get(query_id, [])  # type: ignore[method-assign]
    tasks.standbys[QUERY, 1] = None  # type: ignore[assignment]
    asked = [(QUERY, 1), (QUERY, 0)]  # no copy of partition 0 here
    first = tasks.prepare_take_over(asked, "w9")
    assert tasks.take_over_state(asked, first) is None, "not handed to the streams yet"
    tasks._ready_plans()
    assert incoming == [], "a cold session: none is made"
    assert tasks.take_over_state(asked, first) == [], "nor waited for"
    tasks.spark = SimpleNamespace(ready=True, session="spark")  # type: ignore[assignment]
    second = tasks.prepare_take_over(asked, "w9")
    assert tasks.take_over_state(asked, second) is None, "the first one's answer is not this one's"
    tasks._ready_plans()
    ((stage_key, partitions),) = incoming[-1].items()  # type: ignore[union-attr]
    assert stage_key[0] == QUERY and partitions == {1}
    states[QUERY] = [(frozenset({1}), None)]
    assert tasks.take_over_state(asked, second) is None, "being made"
    states[QUERY] = [(frozenset({1}), False)]
    assert tasks.take_over_state(asked, second) == [], "made, but not standing by"
    states[QUERY] = [(frozenset({1}), True)]
    assert tasks.take_over_state(asked, second) == [(QUERY, 1)]
    # The leaving worker gone from the assignment: a copy that did not move here is not incoming.
    tasks.take(2, {}, {(QUERY, 1)}, workers=frozenset({"w"}))
    tasks._ready_plans()
    assert incoming[-1] == {stage_key: frozenset()}
    tasks.prepare_take_over(asked, "w9")
    tasks.take(3, {QUERY: {1}}, set(), workers=frozenset({"w"}))
    starting = QuerySupervisor(tasks.settings, tasks.metastore, tasks.metastore.queries[QUERY], {1}, tasks.streams)
    tasks.supervisors[QUERY, 1] = starting
    del tasks.standbys[QUERY, 1]
    tasks._ready_plans()
    assert incoming[-1] == {stage_key: frozenset({1})}, "one that moved here stays incoming while its task starts"
    monkeypatch.setattr(assignment_module, "INCOMING_FOR_S", 0.0)
    tasks.prepare_take_over(asked, "w9")
    tasks._ready_plans()
    assert incoming[-1] == {stage_key: frozenset()}, "lapsed"
    tasks.stopping = True
    assert tasks.take_over_state(asked, tasks.prepare_take_over(asked, "w9")) == []


async def test_a_workers_copies_are_offered_to_take_over_once_their_plan_is_made(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not while the Spark session warms up, nor before the plan from the copies is made (a move
    would wait for it), nor after a plan that takes too long: then as without it."""
    monkeypatch.setattr(streams_module, "offset_log_conf", lambda _: {})
    tasks = TaskAssignment(WorkerSettings(worker_id="w", state_dir=tmp_path), metastore(), COLD_SPARK)  # type: ignore[arg-type]
    making = asyncio.Event()

    async def spark() -> Any:
        await making.wait()
        return object()
    tasks.streams.spark = spark
    tasks.standbys[QUERY, 1] = None  # type: ignore[assignment]
    tasks._ready_plans()
    assert not tasks.takes_over(), "the session is not warm"
    tasks.spark = SimpleNamespace(ready=True, session="spark")  # type: ignore[assignment]
    assert not tasks.takes_over(), "no plan asked for yet"
    tasks._ready_plans()
    await asyncio.sleep(0.01)
    assert not tasks.takes_over(), "the plan is being made"
    making.set()
    assert not await until(lambda: bool(world.runners) and world.runners[0].prepared_at is not None, world.steps)
    await asyncio.sleep(0.01)
    assert tasks.takes_over()
    # Copies of another partition: a plan being made for them holds the offer, at most so long.
    making.clear()
    tasks.standbys[QUERY, 0] = None  # type: ignore[assignment]
    tasks._ready_plans()
    await asyncio.sleep(0.01)
    assert not tasks.takes_over()
    monkeypatch.setattr(streams_module, "READY_PLAN_WAIT_S", 0.0)
    assert tasks.takes_over()
    await tasks.streams.stop()


async def test_a_query_that_has_processed_nothing_starts_again_with_a_newcomer(
        world: World, tmp_path: Path) -> None:
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    try:
        first = await running([zero], world, {0})
        both = await running([one], world, {0, 1})
        assert both is not first and first.stopped and len([r for r in world.runners if r.running]) == 1
        assert zero.failures == 0 and one.failures == 0
    finally:
        await asyncio.gather(zero.stop(), one.stop())
    assert all(r.stopped for r in world.runners)


async def test_a_task_whose_commit_fails_leaves_the_query_alone(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its later batches are not given to it (it would skip the failed one), and its
    supervisor restarts it; the other partition's commit stands and it keeps running."""
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    transaction = StepProducer.transaction

    @asynccontextmanager
    async def fenced_one(self: StepProducer) -> AsyncIterator[None]:
        if self.transactional_id.endswith("-1"):
            raise RuntimeError("ProducerFenced")
        async with transaction(self):
            yield
    monkeypatch.setattr(StepProducer, "transaction", fenced_one)
    try:
        runner = await running([zero, one], world, {0, 1})
        await runner._commit(dict(batch()))
        assert set(runner.tasks) == {0}
        assert not await until(lambda: one.failures == 1, world.steps)
        assert "ProducerFenced" in one.reason and zero.failures == 0
        assert zero.tasks[0].next_input_offset == COMMITTED_TO
        await running([], world, {0})
    finally:
        await asyncio.gather(zero.stop(), one.stop())


async def test_a_spark_query_that_stops_fails_every_partition_it_ran(world: World, tmp_path: Path) -> None:
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    try:
        runner = await running([zero, one], world, {0, 1})
        runner.reason = "the Spark query stopped"
        assert not await until(lambda: zero.failures == one.failures == 1, world.steps)
        assert zero.reason == one.reason == "the Spark query stopped"
        assert not await until(lambda: runner.stopped, world.steps)
    finally:
        await asyncio.gather(zero.stop(), one.stop())
    assert all(r.stopped for r in world.runners) and all(p.stopped for p in world.producers)


async def test_a_stream_whose_spark_query_cannot_be_asked_fails_its_members(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error looking at the Spark query (its JVM gone) must reach the supervisors, which
    would otherwise wait for their stream forever."""
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    try:
        await running([zero, one], world, {0, 1})

        def gone(self: FakeRunner) -> str | None:
            raise ConnectionError("the JVM is gone")
        monkeypatch.setattr(FakeRunner, "failure", gone)
        assert not await until(lambda: zero.failures == one.failures == 1, world.steps)
        assert "the JVM is gone" in zero.reason and "the JVM is gone" in one.reason
    finally:
        await asyncio.gather(zero.stop(), one.stop())
    assert all(r.stopped for r in world.runners)


async def test_a_stream_asks_its_spark_query_off_the_loop(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asking the JVM blocks until Python's GIL comes back to the asking thread: on the loop,
    the tasks' commits would wait behind it."""
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    asked_from: list[int] = []

    def failure(self: FakeRunner) -> str | None:
        asked_from.append(threading.get_ident())
        return None
    monkeypatch.setattr(FakeRunner, "failure", failure)
    try:
        await running([zero, one], world, {0, 1})
        assert not await until(lambda: len(asked_from) >= 3, world.steps)
        assert threading.get_ident() not in asked_from
    finally:
        await asyncio.gather(zero.stop(), one.stop())


async def test_a_restart_fails_a_partition_whose_last_commit_did_not_end_cleanly(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its position in memory may not be what Kafka holds, so the restarted query must not
    start it from there: its supervisor starts it again from Kafka's committed offsets."""
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    try:
        await running([zero], world, {0})
        monkeypatch.setattr(zero.tasks[0], "settled", lambda: False)
        one.start()  # the query has processed nothing yet: it restarts with partition 1 ...
        assert not await until(lambda: zero.failures == 1, world.steps)  # ... and fails partition 0 instead
        assert "did not end cleanly" in zero.reason
        assert not await until(lambda: any(r.running and set(r.tasks) == {1} for r in world.runners), world.steps)
    finally:
        await asyncio.gather(zero.stop(), one.stop())
    assert all(r.stopped for r in world.runners)


async def test_a_task_refuses_a_batch_across_its_position_or_during_a_commit(world: World, tmp_path: Path) -> None:
    task = hanging_commit_task(world, tmp_path, "send")
    task.next_input_offset = RESTORED_TO + 1
    with pytest.raises(task_module.MillpondError, match="across its position"):
        await task.apply(batch()[0])  # offsets RESTORED_TO..COMMITTED_TO-1
    task.next_input_offset = RESTORED_TO
    applying = asyncio.create_task(task.apply(batch()[0]))
    await until(lambda: "send" in world.steps.names, world.steps)
    with pytest.raises(task_module.MillpondError, match="while a commit is in flight"):
        await task.apply(batch()[0])
    async with asyncio.timeout(5):
        await task.stop()
    assert applying.done()


async def test_a_partition_that_moves_in_alone_is_acted_on_without_the_settle(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's reconcile says which partitions' tasks it starts together: one that moves
    in alone (a kill's failover moves one to each survivor) gets its plan made and its query
    started without the settle's wait for others (a minute here, past the test's wait)."""
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    try:
        first = await running([zero], world, {0})
        first.batches = 1
        monkeypatch.setattr(streams_module, "SETTLE_S", 60.0)
        one.streams.started_together({QUERY: [1]})
        second = await running([one], world, {1})
        assert second is not first and second.made_ahead, "its plan was made while its task started"
        assert first.running and first.starts == 1
    finally:
        await asyncio.gather(zero.stop(), one.stop())
    assert all(r.stopped for r in world.runners if r.started)


async def test_partitions_started_together_wait_for_each_other_and_no_longer(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Partitions whose tasks start together get one Spark query once all have joined, at once
    then, not a settle later; one that joined first waits for the others (the settle, a minute
    here, has not passed)."""
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    monkeypatch.setattr(streams_module, "SETTLE_S", 60.0)
    zero.streams.started_together({QUERY: [0, 1]})
    try:
        zero.start()
        assert not await until(lambda: zero.tasks_started, world.steps)
        await asyncio.sleep(0.1)
        assert not world.runners, "no query for partition 0 alone while partition 1 starts"
        runner = await running([one], world, {0, 1})
        assert len(world.runners) == 1 and runner.starts == 1
    finally:
        await asyncio.gather(zero.stop(), one.stop())
    assert all(r.stopped for r in world.runners if r.started)


async def test_a_newcomer_the_last_reconcile_did_not_start_waits_the_settle(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the worker last started together is no reason to act at once on a partition it did
    not start with them (a supervisor that restarts on its own): that one waits the settle."""
    zero, one = supervisors_of(tmp_path, world, [{0}, {1}])
    monkeypatch.setattr(streams_module, "SETTLE_S", 60.0)
    zero.streams.started_together({QUERY: [0]})
    try:
        await running([zero], world, {0})
        one.start()
        assert not await until(lambda: one.tasks_started, world.steps)
        await asyncio.sleep(0.1)
        assert len(world.runners) == 1 and set(world.runners[0].tasks) == {0}, "partition 1 waits the settle"
    finally:
        await asyncio.gather(zero.stop(), one.stop())
    assert all(r.stopped for r in world.runners if r.started)


@pytest.mark.parametrize("committed, resumes", [(None, 5000), ((3000, ""), 5000), ((5000, ""), 5000)])
async def test_an_aggregation_resumes_where_its_restored_store_is_when_its_committed_offset_is_behind_or_gone(
        committed: tuple[int, str] | None, resumes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka expires a group's committed offsets offsets.retention.minutes after the last commit
    (a partition without input for seven days): the store restored from the changelog still has
    its input applied up to 5000, and resuming from the start would merge it all again."""
    meta = metastore()
    query = meta.queries[QUERY]
    task = AggregationTask(WorkerSettings(worker_id="w", state_dir=tmp_path), query, meta.sources[query.source],
                           meta.sources[query.sink], 0)

    class Reader:
        async def start(self) -> None:
            pass

        async def stop(self) -> None:
            pass

    async def nothing(*_: Any) -> None:
        pass

    async def restore(reader: Any) -> None:
        assert task.store is not None
        task.store.write({b"k0": encode_state([[7]])}, {INPUT_OFFSET: 5000})  # as the changelog's transactions left it

    async def group_offset() -> tuple[int, str] | None:
        return committed

    monkeypatch.setattr(task, "_open_producer", nothing)
    monkeypatch.setattr(task, "_changelog_reader", lambda: Reader())
    monkeypatch.setattr(task, "_restore", restore)
    monkeypatch.setattr(task, "_committed", group_offset)
    await task.start()
    try:
        assert task.next_input_offset == task.start_input_offset == resumes
    finally:
        assert task.store is not None
        task.store.close()
