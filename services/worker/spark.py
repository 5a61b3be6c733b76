"""The worker's Spark session, with the Kafka connector from the jar cache ``millpond jars`` filled."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pyspark
from pyspark.core.context import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql.context import SQLContext
from pyspark.sql.types import ArrayType, StringType
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from millpond.deploy.jars import installed_jars
from millpond.services.worker.jit import warm_up_jit
from millpond.shared import metrics
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import SetupError
from millpond.shared.sql import regexes

log = logging.getLogger(__name__)

_VERSION = re.compile(r"-\d[\w.]*\.jar$")
QUERY_END_LOGGERS = ("org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",  # Spark 4
                     "org.apache.spark.sql.execution.streaming.MicroBatchExecution")  # Spark 3
FAIR_POOLS_LOGGER = "org.apache.spark.scheduler.FairSchedulableBuilder"


EXTENSION_JAR = "millpond-spark.jar"
"""Millpond's own Spark extension (deploy/spark/src), built into the spark jar bundle."""
LOCAL_FILE_SYSTEM = "io.millpond.spark.NioLocalFileSystem"
"""Hadoop's local file system without a forked chmod per file created (the extension's)."""

STACK_TRACE_DEPTH = 128
"""The frames a Java exception records, Java's 1,024 at most by default: a task that overflowed
its stack (``QueryRunner._in_parts``) was logged in 2,050 lines, twice its frames (Spark's
Executor and TaskSetManager each log it), and its error's text, read to tell the failure, was
154 KB: now 260 lines and 24 KB. Other traces measured 22-59 frames (a Python UDF's error in
a task, the driver's side of a failed job), and are kept whole."""

# The driver runs the queries itself (local mode) on a core or two: the serial
# collector keeps the heap smaller and takes no threads from them. bench.aggregation:
# peak RSS per worker 869-887 MiB against 1,221-1,264 with G1, throughput the same
# within the runs' noise. Tried besides, not kept: the first metaspace threshold at
# 256 MB (-XX:MetaspaceSize) took away the five full collections a worker's metaspace
# costs in its first minutes (to 160-170 MB; 30-570 ms each) but not full collections:
# the old generation then filled and took one of 340-400 ms later (bench.freshness p99
# 556 ms against 423 the run before). C1 alone (-XX:TieredStopAtLevel=1, as the tests
# run) made batches of 500 events/s a third shorter but the per-record code of big
# ones half as fast (bench.aggregation 0.77x Kafka Streams). C2's thresholds 10x, or
# C2 kept off Spark's planner packages (a CompilerDirectivesFile), changed nothing
# beyond the runs' spread: C2 compiled other methods instead, 92 against 97-105 s of
# its time per JVM in bench.failover's first three minutes. The JIT's threads at the
# lowest priority (-XX:ThreadPriorityPolicy=1 -XX:CompilerThreadPriority=19: they compile
# only when the cores are otherwise idle) left the code slow for longer: bench.failover's
# scaling case served 97-124 pulls/s against 152-181 and its SIGTERM stop took 1.99-2.94
# s against 1.30-1.56 (two alternated pairs).
JAVA_OPTIONS = f"-XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError -XX:MaxJavaStackTraceDepth={STACK_TRACE_DEPTH}"
"""The driver JVM's options (an operator's ``spark.driver.extraJavaOptions`` replaces them). A JVM
out of memory exits, so that the worker starts a new one: its tasks no longer end it of a fatal
error themselves (``spark.executor.killOnFatalError.depth``)."""


def connector_jars(cache: Path | None = None) -> list[str]:
    """The Kafka connector's jars that pyspark does not already ship (a SetupError naming
    ``millpond jars`` when they were never fetched)."""
    bundled = {_VERSION.sub("", p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [str(j) for j in installed_jars("spark", cache)
            if _VERSION.sub("", j.name) not in bundled and j.name != EXTENSION_JAR]


def extension_jar(cache: Path | None = None) -> str:
    """The jar of Millpond's Spark extension (a SetupError naming ``millpond jars`` when the
    bundle was never built)."""
    jars = [str(j) for j in installed_jars("spark", cache) if j.name == EXTENSION_JAR]
    if not jars:
        raise SetupError(f"the spark jar bundle has no {EXTENSION_JAR} (its sources, deploy/spark/src, were not "
                         "installed with it); install Millpond from its repository and run `millpond jars`")
    return jars[0]


def parallelism(settings: WorkerSettings) -> tuple[str, dict[str, str]]:
    """The master URL and the settings that give the worker's queries ``spark_cores`` threads
    (ksqlDB's num.stream.threads): ``local[N]`` locally, ``spark.cores.max`` on a cluster; the
    shuffle of each micro-batch's partial aggregation is split as many ways."""
    master, cores = settings.spark_master, settings.spark_cores
    if cores <= 0:
        return master, {"spark.sql.shuffle.partitions": "2"}
    conf = {"spark.sql.shuffle.partitions": str(cores)}
    if settings.spark_local:
        return f"local[{cores}]", conf
    return master, {**conf, "spark.cores.max": str(cores)}


def create_session(settings: WorkerSettings) -> SparkSession:
    """Start (or reuse) this process's Spark session. Blocking: takes seconds. The process's
    time zone becomes the session's, UTC: PySpark gives a timestamp as a datetime of the
    process's zone, which must be the one Spark read and wrote it in."""
    os.environ["TZ"] = "UTC"
    time.tzset()
    master, conf = parallelism(settings)
    builder = SparkSession.builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    builder = (
        builder.appName(f"millpond-{settings.worker_id}")
        .config("spark.jars", ",".join(session_jars(settings)))
        .config("spark.driver.memory", settings.spark_driver_memory)
        .config("spark.driver.extraJavaOptions", JAVA_OPTIONS)
        .config("spark.ui.enabled", "false")
        # Spark draws a stage that runs over half a second as a progress bar on stderr, the
        # worker's log: the bar's text ran into the JSON line logged next, which readers of
        # the log (the tests' included) then skipped.
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.sql.session.timeZone", "UTC")
        # A worker's Spark queries (a stage's, and one for partitions that moved in) each have a
        # scheduler pool (``QueryRunner.pool``): FAIR scheduling shares the cores between them a
        # task at a time, where FIFO ran a query's batch only after every task of the jobs
        # submitted before it, such as a new query's slow first batch.
        .config("spark.scheduler.mode", "FAIR")
        # Adaptive execution re-plans each micro-batch's shuffle after its map stage: for
        # batches this small that costs more than it saves (about 0.1 s a batch, measured).
        .config("spark.sql.adaptive.enabled", "false")
        # A query with no new input asks Kafka again after this long (Spark's default, 10 ms,
        # costs a worker's idle queries a good share of a core).
        .config("spark.sql.streaming.pollingDelay", f"{settings.idle_poll_ms}ms")
        # PySpark notes the Python call site of every Column function it is given, for its
        # error messages: five calls into the JVM each, about a hundred per micro-batch. (PySpark
        # reads this once per process, at its first Column function: this session's.)
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
        # ksqlDB semantics: a bad cast or a division by zero gives NULL, not a failed batch.
        .config("spark.sql.ansi.enabled", "false")
        # A MAP that TRANSFORM makes with a key twice keeps its last value (as Python's dict, and
        # JSON's reading already), where Spark's default fails the batch, and so every retry.
        .config("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
        # A task that fails of a StackOverflowError (java.util.regex recursing over a record's
        # long value) fails its job, not the JVM: by default Spark's executor exits on any fatal
        # error, in local mode the driver, and with it every query of the worker, again at each
        # retry of the batch. The stack unwound, the JVM goes on safely; the batch's record is
        # then set aside (``QueryRunner._in_parts``). An OutOfMemoryError still ends the JVM
        # (JAVA_OPTIONS), and the worker starts a new one (``LazySession``).
        .config("spark.executor.killOnFatalError.depth", "0")
        # Spark substitutes ${name} in the SQL text it parses, string literals included, by its
        # configuration: a query's '${y}' (a REGEXP_REPLACE's group, any text) became ''.
        .config("spark.sql.variable.substitute", "false")
        # Every trigger writes two small files to the query's checkpoint (offsets, commits).
        # Through Hadoop's FileContext (Spark's default) each took 46 ms on the local file
        # system, tmpfs included; through the FileSystem API 10-12 ms, a quarter of an idle
        # machine's 1k-record trigger (292 -> 226 ms). The checkpoint is the worker's own and
        # local, and the tasks, not it, hold the committed positions.
        .config("spark.sql.streaming.checkpointFileManagerClass",
                "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager")
    )
    operator = dict(settings.spark_conf)
    if settings.spark_local:
        # Every file Hadoop's local file system creates ran /bin/chmod (pyspark has no Hadoop
        # native library): the checkpoint's two files per trigger, each with its checksum,
        # 10-12 ms each on an idle machine, 1-2 ms without (measured through this session). Only
        # on a local master: a cluster's executors have no such jar on their class path.
        builder = builder.config("spark.hadoop.fs.file.impl", LOCAL_FILE_SYSTEM)
        # The jar comes first on the driver's class path, so its CreateJacksonParser$ replaces
        # Spark's: from_json then decodes a record's UTF-8 without an InputStreamReader's 8 KB
        # buffer per record (a third of the batch thread's time in bench.aggregation; see the class).
        operator["spark.driver.extraClassPath"] = os.pathsep.join(
            filter(None, (extension_jar(settings.jar_cache), operator.get("spark.driver.extraClassPath"))))
    for key, value in operator.items():  # the operator's settings win
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    # A query's end is reported by its supervisor, in one line with the reason; Spark's own
    # ERROR record of it holds the Python traceback of a foreachBatch error (a fenced zombie's).
    log4j = session.sparkContext._jvm.org.apache.logging.log4j  # type: ignore[union-attr]
    for name in QUERY_END_LOGGERS:
        log4j.core.config.Configurator.setLevel(name, log4j.Level.FATAL)
    # It warns of every pool it makes on first use, as the queries' pools are made (``QueryRunner.pool``).
    log4j.core.config.Configurator.setLevel(FAIR_POOLS_LOGGER, log4j.Level.ERROR)
    # The REGEXP functions the queries call. Their result types as DataTypes: given as DDL text,
    # each was parsed by Spark's SQL parser, 0.45 s of a new session's start (0.73 s against 0.28).
    results = {"string": StringType(), "array<string>": ArrayType(StringType())}
    for name, (java_class, result) in regexes.SPARK_FUNCTIONS.items():
        session.udf.registerJavaFunction(name, java_class, results[result])
    return session


def session_jars(settings: WorkerSettings) -> list[str]:
    """The jars a session adds: the Kafka connector's and, on a cluster, the extension's, whose
    REGEXP functions (``regexes.SPARK_FUNCTIONS``) the executors run (a local master has it on
    the driver's class path already, first)."""
    jars = connector_jars(settings.jar_cache)
    return jars if settings.spark_local else [*jars, extension_jar(settings.jar_cache)]


DRIVER_WATCH_INTERVAL_S = 2.0
"""How often a worker looks whether its Spark driver is still alive (``LazySession.watch``)."""
DRIVER_EXIT_WAIT_S = 10.0
"""How long a dead session's JVM is given to exit once its input closes (then it is killed)."""


def driver_alive(session: SparkSession) -> bool:
    """Whether ``session``'s driver can still run queries: its JVM (a local master's, which
    this process started) has not exited, and its SparkContext has not stopped (Spark stops it
    after an error it cannot go on from, e.g. a StackOverflowError or OutOfMemoryError in its
    scheduler's loop). Blocking: one call into the JVM."""
    context = session.sparkContext
    process = getattr(context._gateway, "proc", None)
    if process is not None and process.poll() is not None:
        return False
    try:
        return not context._jsc.sc().isStopped()
    except Exception:  # py4j's: the JVM does not answer (or the context was stopped here: no _jsc)
        return False


def discard(session: SparkSession) -> None:
    """Let go of ``session``, whose driver died, so that ``create_session`` starts a new JVM:
    PySpark keeps one gateway to its JVM per process and reuses it, dead or not, and a stopped
    SparkContext cannot be started again. Blocking; the JVM is left no longer than
    ``DRIVER_EXIT_WAIT_S``."""
    gateway = session.sparkContext._gateway
    try:
        session.stop()
    except Exception:  # its JVM is gone: what PySpark's stop leaves undone is done below
        log.info("the dead Spark session's stop failed", exc_info=True)
    with SparkContext._lock:
        SparkContext._active_spark_context = None
        SparkContext._gateway = None
        SparkContext._jvm = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    SQLContext._instantiatedContext = None
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    if process is not None and process.poll() is None:
        if process.stdin is not None:
            process.stdin.close()  # PySpark's JVM exits when its input ends
        try:
            process.wait(DRIVER_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(DRIVER_EXIT_WAIT_S)
    try:
        gateway.shutdown_callback_server()  # foreachBatch's calls into this process
        gateway.close()
    except Exception:
        log.info("the dead Spark session's gateway did not close cleanly", exc_info=True)


def _start_failed(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    log.warning("Spark did not start; trying again", exc_info=error,
                extra={"attempt": state.attempt_number, "retry_in_s": round(state.next_action.sleep, 1)
                       if state.next_action is not None else None})


class LazySession:
    """This process's Spark session, started on first use (or early, by ``warm_up``), and
    started again, a new driver JVM, when it is found dead (``driver_alive``): by ``get``, and
    by ``watch`` when no query asks. A Kafka Streams app replaces a stream thread that died
    (KIP-663); the worker's queries are its tasks', which start again from their committed
    positions."""

    def __init__(self, settings: WorkerSettings, hold: Callable[[], Awaitable[None]] | None = None):
        self.settings = settings
        self.hold = hold
        """Awaited before the session starts (``TaskAssignment.restored_at_start``)."""
        self.session: SparkSession | None = None
        """Set as soon as it has started, so ``stop`` reaches it while its JIT warms up."""
        self.replaced = 0
        """Drivers found dead and started again."""
        self._warmed = False
        self._lock = asyncio.Lock()

    async def get(self) -> SparkSession:
        """The session, started (and its JIT warmed up: ``warm_up_jit``) now if it was not yet,
        once ``hold`` has returned; started again if its driver died (not warmed up again: the
        tasks waiting for it are the worker's queries)."""
        async with self._lock:
            if self.session is not None and not await asyncio.to_thread(driver_alive, self.session):
                dead, self.session = self.session, None
                self.replaced += 1
                metrics.SPARK_DRIVER_RESTARTS.inc()
                log.error("the Spark driver stopped; starting a new one: this worker's queries start again from "
                          "their tasks' committed positions", extra={"restarts": self.replaced})
                await asyncio.to_thread(discard, dead)
            if self.session is None:
                if self.hold is not None:
                    await self.hold()
                started = time.monotonic()
                self.session = await asyncio.to_thread(create_session, self.settings)
                if self.replaced:
                    log.info("a new Spark driver started", extra={"seconds": round(time.monotonic() - started, 2)})
            if not self._warmed:
                try:
                    # A stop meanwhile stops the session, which fails the warm-up's job at once.
                    await asyncio.to_thread(self._warm_up, self.session)
                finally:
                    self._warmed = True  # tried once: a cancelled or failed warm-up only costs speed
            return self.session

    def _warm_up(self, session: SparkSession) -> None:
        try:
            warm_up_jit(session, self.settings)
        except Exception:  # only the first batches' speed depends on it
            log.warning("Spark's warm-up failed; the session is used cold", exc_info=True)

    @property
    def ready(self) -> bool:
        """Whether the session runs and its JIT warm-up has ended (or failed): not while a
        dead driver is being replaced, nor after a start that failed."""
        return self._warmed and self.session is not None

    async def warm_up(self) -> None:
        """Start the session now, not when a task first needs it, and again (backing off)
        until it starts: until then the worker is offered no active task (see
        ``millpond.services.worker.membership.offered_lags``), so none may need it."""
        retrying = AsyncRetrying(retry=retry_if_exception_type(Exception), wait=wait_exponential_jitter(initial=1, max=30),
                                 before_sleep=_start_failed)
        async for attempt in retrying:
            with attempt:
                await self.get()

    async def watch(self, interval_s: float = DRIVER_WATCH_INTERVAL_S) -> None:
        """Every ``interval_s``, start the session again if its driver died (or its last start
        failed), when no query asked for it meanwhile (none runs, or all wait for input): the
        worker is offered its copies' partitions again once it runs. Until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            if self._lock.locked():
                continue  # a start under way
            try:
                if self.session is None or not await asyncio.to_thread(driver_alive, self.session):
                    await self.get()
            except Exception:
                log.warning("Spark did not start; trying again", exc_info=True, extra={"retry_in_s": interval_s})

    async def stop(self) -> None:
        """Stop the session if it started (a dead one's JVM is let go of, as ``discard`` does)."""
        if self.session is not None:
            session = self.session
            await asyncio.to_thread(lambda: session.stop() if driver_alive(session) else discard(session))
