"""How many threads a worker gives Spark (ksqlDB's num.stream.threads), its start, and its
local file system."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from millpond.services.worker import query_runner
from millpond.services.worker import spark as spark_module
from millpond.services.worker.assignment import TaskAssignment
from millpond.services.worker.jit import STREAM, TABLE, reduction_runner
from millpond.services.worker.reducers import Reduction
from millpond.services.worker.spark import LOCAL_FILE_SYSTEM, parallelism
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import MillpondError


def test_spark_cores_sets_local_threads_or_the_cluster_core_cap() -> None:
    assert parallelism(WorkerSettings(spark_master="local[1]")) == ("local[1]", {"spark.sql.shuffle.partitions": "2"})
    assert parallelism(WorkerSettings(spark_master="local[1]", spark_cores=3)) == (
        "local[3]", {"spark.sql.shuffle.partitions": "3"})
    assert parallelism(WorkerSettings(spark_master="spark://h:7077", spark_cores=4)) == (
        "spark://h:7077", {"spark.sql.shuffle.partitions": "4", "spark.cores.max": "4"})



def test_a_cluster_session_sends_the_extension_jar_to_its_executors() -> None:
    """The REGEXP functions the queries call are the extension's (``regexes.SPARK_FUNCTIONS``): a
    cluster's executors get its jar with the connector's; a local master has it on the driver's
    class path already."""
    extension = spark_module.extension_jar()
    local, cluster = (spark_module.session_jars(WorkerSettings(spark_master=m)) for m in ("local[1]", "spark://h:7077"))
    assert extension not in local and cluster == [*local, extension]

async def test_warm_up_tries_again_until_the_session_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    # Until it starts the worker is offered no active, so no task would ever start it.
    attempts: list[int] = []

    def create(settings: WorkerSettings) -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("[JAVA_GATEWAY_EXITED] Java gateway process exited before sending its port number.")
        return "session"

    monkeypatch.setattr(spark_module, "create_session", create)
    lazy = spark_module.LazySession(WorkerSettings())
    assert not lazy.ready
    await asyncio.wait_for(lazy.warm_up(), timeout=10)
    assert lazy.ready and len(attempts) == 2


async def test_the_session_starts_once_its_hold_returns(monkeypatch: pytest.MonkeyPatch, dead_drivers: set[object]) -> None:
    held, created = asyncio.Event(), []

    async def hold() -> None:
        await held.wait()

    monkeypatch.setattr(spark_module, "create_session", lambda settings: created.append(1) or "session")
    lazy = spark_module.LazySession(WorkerSettings(spark_warm_up_batches=0, spark_warm_up_triggers=0), hold)
    getting = asyncio.create_task(lazy.get())
    await asyncio.sleep(0.1)
    assert not created and not getting.done()
    held.set()
    assert await asyncio.wait_for(getting, 5) == "session"
    assert await lazy.get() == "session" and created == [1]  # started once: the hold is not asked again


async def test_a_dead_driver_is_replaced_once_by_a_new_session_not_warmed_up_again(
        monkeypatch: pytest.MonkeyPatch, dead_drivers: set[object]) -> None:
    # The worker's queries wait for it: they start again from their tasks' committed positions.
    created: list[str] = []
    discarded: list[object] = []
    warmed: list[object] = []
    monkeypatch.setattr(spark_module, "create_session", lambda settings: created.append(f"s{len(created)}") or created[-1])
    monkeypatch.setattr(spark_module, "discard", discarded.append)
    monkeypatch.setattr(spark_module, "warm_up_jit", lambda session, settings: warmed.append(session))
    lazy = spark_module.LazySession(WorkerSettings())
    assert await lazy.get() == "s0" and await lazy.get() == "s0" and not discarded
    dead_drivers.add("s0")
    assert await asyncio.gather(lazy.get(), lazy.get()) == ["s1", "s1"]  # one new driver for both
    assert created == ["s0", "s1"] and discarded == ["s0"] and warmed == ["s0"]
    assert lazy.replaced == 1 and lazy.ready


async def test_the_watch_replaces_a_dead_driver_that_no_query_asks_for_until_one_starts(
        monkeypatch: pytest.MonkeyPatch, dead_drivers: set[object]) -> None:
    # Until it runs again the worker offers only its actives' lags (``ready`` is false).
    starts: list[str] = []
    fourth, go_on = threading.Event(), threading.Event()

    def create(settings: WorkerSettings) -> str:
        starts.append(f"s{len(starts)}")
        if len(starts) in (2, 3):
            raise RuntimeError("[JAVA_GATEWAY_EXITED] Java gateway process exited before sending its port number.")
        if len(starts) == 4:
            fourth.set()
            assert go_on.wait(10)
        return starts[-1]

    monkeypatch.setattr(spark_module, "create_session", create)
    monkeypatch.setattr(spark_module, "discard", lambda session: None)
    monkeypatch.setattr(spark_module, "warm_up_jit", lambda session, settings: None)
    lazy = spark_module.LazySession(WorkerSettings())
    await lazy.warm_up()
    watching = asyncio.create_task(lazy.watch(interval_s=0.01))
    try:
        dead_drivers.add("s0")
        assert await asyncio.to_thread(fourth.wait, 10)  # two failed starts, then one under way
        assert not lazy.ready and lazy.session is None
        go_on.set()
        assert await asyncio.wait_for(lazy.get(), 10) == "s3"
        assert lazy.ready and lazy.replaced == 1 and starts == ["s0", "s1", "s2", "s3"]
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)


def test_the_plans_made_ahead_are_made_again_on_a_new_driver(tmp_path: Path) -> None:
    # A take-over that used a plan of the dead driver's session would fail once before it ran.
    spark = SimpleNamespace(ready=True, session="s0")
    tasks = TaskAssignment(WorkerSettings(worker_id="w", state_dir=tmp_path), Metastore(), spark)  # type: ignore[arg-type]
    made, forgotten = [], []
    tasks.streams.ready = lambda copies, incoming: made.append(spark.session)  # type: ignore[method-assign]
    tasks.streams.forget_ready = lambda: forgotten.append(spark.session)  # type: ignore[method-assign]
    tasks._ready_plans()
    tasks._ready_plans()
    assert made == ["s0", "s0"] and forgotten == []
    spark.session = "s1"
    tasks._ready_plans()
    tasks._ready_plans()
    assert made == ["s0", "s0", "s1", "s1"] and forgotten == ["s1"]  # once, before they are made again


@pytest.mark.parametrize("mode", [0o640, 0o755, 0o600, 0o444, 0o1644])
def test_the_sessions_local_file_system_sets_permissions_itself(spark: SparkSession, tmp_path: Path, mode: int) -> None:
    # Hadoop's own forks /bin/chmod per file; the extension's sets the same bits by a system call.
    jvm = spark.sparkContext._jvm
    fs_package = jvm.org.apache.hadoop.fs  # type: ignore[union-attr]
    path = fs_package.Path((tmp_path / "file").as_uri())
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    assert fs.getClass().getName() == LOCAL_FILE_SYSTEM
    out = fs.create(path, True)
    out.write(bytearray(b"checkpoint"))
    out.close()
    assert (tmp_path / "file").stat().st_mode & 0o777 == 0o644  # Hadoop's default, less the umask
    fs.setPermission(path, fs_package.permission.FsPermission(f"{mode:o}"))
    assert (tmp_path / "file").stat().st_mode & 0o7777 == mode  # the sticky bit too (by chmod: no java.nio form)
    assert (tmp_path / ".file.crc").stat().st_mode & 0o7777 == mode  # the checksum's too
    assert (tmp_path / "file").read_bytes() == b"checkpoint"


PARSER_FACTORY = "org.apache.spark.sql.catalyst.json.CreateJacksonParser$"
"""The class from_json creates its Jackson parsers with: the extension's, on a local master."""


def test_from_json_creates_its_parsers_through_the_extension_with_every_method_of_sparks(spark: SparkSession) -> None:
    jvm: Any = spark.sparkContext._jvm
    ours = jvm.java.lang.Class.forName(PARSER_FACTORY)
    assert ours.getProtectionDomain().getCodeSource().getLocation().getPath().endswith(f"/{spark_module.EXTENSION_JAR}")
    # Spark's own class, from pyspark's jars alone: the extension's must have each of its methods.
    jars = sorted((Path(spark_module.pyspark.__file__).parent / "jars").glob("*.jar"))
    urls = spark.sparkContext._gateway.new_array(jvm.java.net.URL, len(jars))  # type: ignore[union-attr]
    for i, jar in enumerate(jars):
        urls[i] = jvm.java.net.URL(jar.as_uri())
    sparks = jvm.java.net.URLClassLoader(urls, jvm.java.lang.ClassLoader.getPlatformClassLoader())
    theirs = jvm.java.lang.Class.forName(PARSER_FACTORY, False, sparks)
    assert theirs.getProtectionDomain().getCodeSource().getLocation().getPath().split("/")[-1].startswith(
        "spark-catalyst_")

    def methods(cls: Any) -> set[str]:  # as the JVM links them: without the exceptions Scala does not declare
        return {str(m.toGenericString()).split(" throws ")[0] for m in cls.getDeclaredMethods()
                if not jvm.java.lang.reflect.Modifier.isPrivate(m.getModifiers())}

    assert methods(theirs) and methods(ours) == methods(theirs)
    sparks.close()


# Each value's bytes and what from_json gives with Spark's own parser factory (pyspark 4.2.0):
# malformed UTF-8 is decoded to U+FFFD, as an InputStreamReader does, not made a bad record.
DECODED = [
    (b'{"AREA": "caf\xc3\xa9", "READING": 1.5}', ("caf\u00e9", 1.5, None)),
    (b'{"AREA": "bad \xff\xfe utf", "READING": 2}', ("bad \ufffd\ufffd utf", 2.0, None)),
    (b'{"AREA": "cut \xe2\x82", "READING": 3}', ("cut \ufffd", 3.0, None)),
    (b'{"AREA": "surrogate \xed\xa0\x80", "READING": 4}', ("surrogate \ufffd", 4.0, None)),
    (b'{"AREA": "\xf0\x9f\x8c\x8a", "READING": -0.5}', ("\U0001f30a", -0.5, None)),
    (b'{"AREA": 3}', ("3", None, None)),
    (b"not json", (None, None, "not json")),
    (b'{"AREA": "x"', (None, None, '{"AREA": "x"')),
    (b'\xef\xbb\xbf{"AREA": "bom"}', (None, None, '\ufeff{"AREA": "bom"}')),
    (b"", None),
]


def test_from_json_reads_every_value_as_sparks_own_parser_factory_does(spark: SparkSession) -> None:
    schema = T.StructType([T.StructField("AREA", T.StringType()), T.StructField("READING", T.DoubleType()),
                           T.StructField("_corrupt", T.StringType())])
    frame = spark.createDataFrame([(i, value) for i, (value, _) in enumerate(DECODED)], "i int, value binary")
    rows = frame.select("i", F.from_json(F.col("value").cast("string"), schema, {
        "columnNameOfCorruptRecord": "_corrupt", "mode": "PERMISSIVE"}).alias("v")).orderBy("i").collect()
    assert [None if row.v is None else tuple(row.v) for row in rows] == [want for _, want in DECODED]


def test_each_runners_batches_run_in_a_pool_of_its_own_under_fair_scheduling(spark: SparkSession, tmp_path: Path) -> None:
    # So two queries of a worker (a stage's and one of partitions that moved in) share the cores
    # task by task, where FIFO had one's batch wait for every task of the other's jobs before it.
    assert spark.sparkContext._jsc.sc().getSchedulingMode().toString() == "FAIR"  # type: ignore[union-attr]
    loop = asyncio.new_event_loop()
    seen: dict[str, list[str | None]] = {}
    got = threading.Event()

    def reducer(pool: str) -> Any:
        def reduce(batch: Any, tasks: Any) -> dict[int, Any]:
            if batch.count():  # a job, in the pool of the thread that runs the batch
                seen.setdefault(pool, []).append(spark.sparkContext.getLocalProperty("spark.scheduler.pool"))
                got.set()
            return {}  # nothing to commit
        return reduce

    runners = []
    try:
        for pool in ("q-stage-0", "q-stage-1"):
            runner = reduction_runner(spark, WorkerSettings(state_dir=tmp_path), (STREAM, TABLE), loop)
            runner.name, runner.pool = f"pool-test-{pool}", pool
            rows = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
            runner._prepared = ({0: None}, Reduction(rows, reducer(pool)))
            runners.append(runner)
            # Started from another thread than the test's, as the stream starts them (a thread's
            # local properties stay with it).
            started = threading.Thread(target=runner.start, args=({0: None},))
            started.start()
            started.join(timeout=60)
            got.clear()
            while pool not in seen and got.wait(timeout=60):
                got.clear()
        got.clear()
        assert got.wait(timeout=60)  # the first one's batches went on beside the second's
    finally:
        for runner in runners:
            runner.stop()
        loop.close()
    assert set(seen) == {"q-stage-0", "q-stage-1"}
    assert all(pools == [pool] * len(pools) for pool, pools in seen.items()), seen
    pools = spark.sparkContext._jsc.sc().getPoolForName  # type: ignore[union-attr]
    assert pools("q-stage-0").isDefined() and pools("q-stage-1").isDefined()
    assert spark.sparkContext.getLocalProperty("spark.scheduler.pool") is None  # the test's thread: the default


def test_a_runners_batches_come_with_the_workers_session_and_a_failing_one_fails_the_query(
        spark: SparkSession, tmp_path: Path) -> None:
    # Each batch's DataFrame is given the worker's own session object (no SparkSession made per
    # batch, see query_runner._BatchFunction), and reads through it; an error in the batch's
    # code still reaches the JVM, which stops the query with it.
    loop = asyncio.new_event_loop()
    sessions: list[Any] = []
    counted = threading.Event()

    def reduce(batch: Any, tasks: Any) -> dict[int, Any]:
        if batch.count():  # a Spark job through the batch's own Dataset
            sessions.append(batch.sparkSession)
            if len(sessions) == 2:
                counted.set()
                raise RuntimeError("the batch's code failed")
        return {}

    runner = reduction_runner(spark, WorkerSettings(state_dir=tmp_path), (STREAM, TABLE), loop)
    runner.name = "session-test"
    runner._prepared = ({0: None}, Reduction(spark.readStream.format("rate").option("rowsPerSecond", 50).load(), reduce))
    try:
        runner.start({0: None})
        assert counted.wait(timeout=60)
        deadline = time.monotonic() + 60
        while (failure := runner.failure()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        runner.stop()
        loop.close()
    assert all(session is spark for session in sessions), sessions
    assert failure == "RuntimeError: the batch's code failed"


def test_a_query_spark_began_afresh_commits_nothing_and_later_plans_hold_their_positions(
        spark: SparkSession, tmp_path: Path) -> None:
    """A query started from a checkpoint written with its tasks' positions whose first batch is
    batch 0: Spark read from the positions its plan was made with, not the tasks'. The batch
    fails before anything is reduced or committed, and the session's plans fit their own
    positions only from then on."""
    loop = asyncio.new_event_loop()
    try:
        runner = reduction_runner(spark, WorkerSettings(state_dir=tmp_path), (STREAM, TABLE), loop)
        runner.name = "afresh-test"
        assert query_runner.offset_log_conf(spark) is not None
        runner._prepared = ({0: 10}, Reduction(spark.range(1), lambda *_: {}))
        assert runner.fits({0: 30})
        reduced: list[Any] = []
        runner._reduced = lambda *args: reduced.append(args) or {}  # type: ignore[method-assign]
        runner.resumed_at, runner._reduction = {0: 30}, runner._prepared[1]  # as ``start`` leaves them
        runner._on_batch(spark.range(3), 1)  # a resumed query's first batch: reduced
        assert len(reduced) == 1
        with pytest.raises(MillpondError, match=r"afresh instead of from the positions \{0: 30\}"):
            runner._on_batch(spark.range(3), 0)
        assert len(reduced) == 1, "nothing reduced, nothing committed"
        assert runner.failure is not None and isinstance(runner.error, MillpondError)
        assert query_runner.offset_log_conf(spark) is None
        assert not runner.fits({0: 30}) and runner.fits({0: 10})
    finally:
        query_runner._OFFSET_LOG_CONF.pop(spark, None)  # the next test's session resumes again
        loop.close()
