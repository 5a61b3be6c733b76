"""Runs one stage of a persistent query on Spark Structured Streaming over a set of this
worker's partitions (``millpond.services.worker.streams`` decides which).

Spark does the data-parallel part of each micro-batch: decode the values, set aside the
records that do not decode, and reduce the rest as the plan kind's reducer says
(``millpond.services.worker.kinds``), to one slice per partition. Only the slices reach
Python, where each partition's task commits its slice exactly once, in a transaction of its
own: one task's failed commit fails that task alone, not the batch.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import operator
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from py4j.java_gateway import JavaObject
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.java_gateway import ensure_callback_server_started
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter
from pyspark.sql.utils import ForeachBatchFunction

from millpond.services.worker.json_reading import JsonReading, holds
from millpond.services.worker.kinds import WORKER_KINDS
from millpond.services.worker.reducers import CORRUPT, WINDOW_KEY, Reduction
from millpond.services.worker.state.store import path_segment
from millpond.services.worker.task import BadRecord, BatchSlice, Task
from millpond.shared import metrics
from millpond.shared.catalog.queries import PersistentQuery
from millpond.shared.catalog.sources import DataSource
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.serde import ISO_TIMESTAMP_TEXT, MILLIS_TEXT, window_key_bytes
from millpond.shared.kafka.time_patterns import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from millpond.shared.sql import arrays, ast, regexes

log = logging.getLogger(__name__)
COMMIT_TIMEOUT_S = 120
PERMISSIVE = {"columnNameOfCorruptRecord": CORRUPT, "mode": "PERMISSIVE"}
"""How a record value is read: one that does not fit gets the corrupt-record column set instead of failing."""
_READ_COLUMNS: weakref.WeakKeyDictionary[SparkSession, dict[tuple[Any, ...], list[list[Column]]]] = weakref.WeakKeyDictionary()
"""Per session, the read columns (``QueryRunner._read_columns``) by the shape of the source they read."""
_OFFSET_LOG_CONF: weakref.WeakKeyDictionary[SparkSession, dict[str, str] | None] = weakref.WeakKeyDictionary()
"""Per session, the SQL settings a streaming query's offset log records (``offset_log_conf``);
None once the session cannot have a query resume from a checkpoint written here."""
STAND_BY_HOLD_S = 30.0
"""How long a query standing by (``QueryRunner.stand_by``) holds its first batch for the tasks
that take over; past it the query ends (a later start makes a new one, with the same plan)."""
STAND_BY_WARM_RECORDS = 20_000
"""Most records a query standing by reduces, and sets aside, to compile its code: a larger
first batch (a backlog) is only held."""
READ_SHAPES_KEPT = 256
"""Source shapes whose read columns a session keeps (all of them are made again past it)."""
SOURCE_OPTIONS = {
    "kafka.isolation.level": "read_committed",
    "failOnDataLoss": "false",
    # Spark's consumer polls a partition several times per read (500 records a poll, with a
    # seek and a look at the log's ends between), and the Java consumer sends no fetch to a
    # broker while one is pending there. A fetch ahead that reached the log's end is pending
    # for fetch.max.wait.ms (500 ms by default), and the next poll waited it out: reading
    # 1.4k records took 0.6 s on an idle machine, 0.15 s with 10 ms.
    "kafka.fetch.max.wait.ms": "10",
    # Fewer of those polls per batch: reading 100k records took 261 ms at 500 a poll, 149 ms
    # at up to 20k (a poll returns what one fetch brought, at most 8 MB per partition).
    "kafka.max.poll.records": "20000",
    "kafka.max.partition.fetch.bytes": str(8 << 20),
}
"""The Kafka source's options besides the connection, partitions and offsets."""
KAFKA_RECORD = T.StructType([
    T.StructField("key", T.BinaryType()), T.StructField("value", T.BinaryType()), T.StructField("topic", T.StringType()),
    T.StructField("partition", T.IntegerType()), T.StructField("offset", T.LongType()),
    T.StructField("timestamp", T.TimestampType()), T.StructField("timestampType", T.IntegerType()),
])
"""The columns of the Kafka source's records."""


class _BatchFunction(ForeachBatchFunction):
    """PySpark's ``foreachBatch`` callback, each batch's DataFrame given the worker's own
    session. PySpark's makes a SparkSession object per batch from the streaming query's: six
    calls into the JVM, 0.8 ms on an idle session, each a wait for the worker's interpreter
    lock and the JVM's threads on a busy one. Under bench.failover's scaling load the call into
    Python around a batch's own work (Spark's addBatch less the batch's timed job and commit)
    took 46 ms at the median, 146 at p90; 33 and 120 with this class (one run each). The batch's
    Dataset keeps the query's session in the JVM; Python reads only the SQL conf through the
    one it is given, which the query's copies."""

    def call(self, jdf: JavaObject, batch_id: int) -> None:
        try:
            self.func(DataFrame(jdf, self.session), batch_id)
        except Exception as error:  # as PySpark's: the JVM fails the query with it
            self.error = error
            raise


def for_each_batch(writer: DataStreamWriter, session: SparkSession,
                   func: Callable[[DataFrame, int], None]) -> DataStreamWriter:
    """``writer.foreachBatch(func)``, each batch given ``session`` (``_BatchFunction``)."""
    gateway = session.sparkContext._gateway
    assert gateway is not None
    helper = gateway.jvm.org.apache.spark.sql.execution.streaming.sources.PythonForeachBatchHelper
    helper.callForeachBatch(writer._jwrite, _BatchFunction(session, func))
    ensure_callback_server_started(gateway)  # type: ignore[no-untyped-call]
    return writer


def offset_log_conf(spark: SparkSession) -> dict[str, str] | None:
    """The SQL settings Spark records with each batch in a streaming query's offset log (and
    sets again when a query resumes from it), as this session has them: the part of a
    checkpoint that ``QueryRunner.start`` writes besides the positions. None when this Spark
    cannot say (an internal class of Spark 4.2: another version may have moved it), or when a
    query of the session did not resume from what was written (``QueryRunner._on_batch``):
    then every query starts from the positions in its plan, which a plan made for other
    positions cannot do."""
    if spark not in _OFFSET_LOG_CONF:
        try:
            jvm = spark.sparkContext._jvm
            assert jvm is not None
            metadata = jvm.org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqMetadata.apply(
                0, 0, spark._jsparkSession.conf())
            conf = {key: value if value is not None else spark.conf.get(key, None)
                    for key, value in json.loads(metadata.json())["conf"].items()}
            # A setting the session leaves unset (with no default) is left out, as Spark's own log does.
            _OFFSET_LOG_CONF[spark] = {key: value for key, value in conf.items() if value is not None}
        except Exception:  # only the plans' reuse is lost
            log.warning("Spark's offset log settings could not be read: each query's plan is made for its "
                        "start's positions", exc_info=True)
            _OFFSET_LOG_CONF[spark] = None
    return _OFFSET_LOG_CONF[spark]


def write_resume_point(checkpoint: Path, topic: str, positions: dict[int, int], conf: dict[str, str]) -> None:
    """A streaming query's checkpoint that says its batch 0 read ``topic`` up to ``positions``
    and was committed: a query started on it begins at batch 1, from those offsets, whatever
    offsets its Kafka source was defined with (Spark reads a source's starting offsets only when
    its checkpoint has none). The format is Spark's: its metadata file, and its offset and
    commit logs, version 1."""
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": int(time.time() * 1000), "conf": conf}
    offsets = {topic: {str(p): o for p, o in sorted(positions.items())}}
    (checkpoint / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))  # the query's id, which Spark requires
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits").mkdir(exist_ok=True)
    (checkpoint / "offsets" / "0").write_text(f"v1\n{json.dumps(metadata)}\n{json.dumps(offsets)}")
    (checkpoint / "commits" / "0").write_text(f"v1\n{json.dumps({'nextBatchWatermarkMs': 0})}")


def source_offsets(offsets: str | dict[str, Any] | None, topic: str) -> dict[int, int]:
    """Per partition of ``topic``, a Kafka source's offsets as Spark gives them (JSON text, as in
    its offset log, or parsed, as in its progress; None: none yet)."""
    read = json.loads(offsets) if isinstance(offsets, str) else offsets
    return {int(p): int(o) for p, o in (read or {}).get(topic, {}).items()}


def batch_ends(checkpoint: Path, batch_id: int, topic: str) -> dict[int, int]:
    """Per partition of ``topic``, where batch ``batch_id`` of the query checkpointed at
    ``checkpoint`` ends: its entry in the offset log (written before the batch runs)."""
    lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
    return source_offsets(lines[2] if len(lines) > 2 else None, topic)


def past(positions: dict[int, int]) -> Column:
    """Whether a record of the source (``_partition``, ``_offset``) is at or past its
    partition's position; false for the other partitions. The positions are one map literal,
    which the generated code refers to rather than holds, so other positions run the same
    compiled code."""
    where = F.create_map(*(F.lit(value).cast(kind) for p, o in sorted(positions.items())
                           for value, kind in ((p, "int"), (o, "bigint"))))
    return F.coalesce(F.col("_offset") >= F.try_element_at(where, F.col("_partition")), F.lit(False))


def checkpoint_root(settings: WorkerSettings) -> Path:
    """Where this worker's streaming queries keep their Spark checkpoints: in its own part of
    the state directory, not the system's temporary one, so the checkpoints of a worker killed
    before it could remove them are found (and removed) by its next start."""
    return settings.state_dir / path_segment(settings.worker_id) / "checkpoints"


class QueryRunner:
    """One Spark streaming query feeding a set of tasks of one persistent query."""

    def __init__(self, spark: SparkSession, settings: WorkerSettings, query: PersistentQuery,
                 source: DataSource, sink: DataSource, tasks: dict[int, Task[Any]], loop: asyncio.AbstractEventLoop,
                 stage: str = "", name: str = "", on_task_failed: Callable[[int, str], None] | None = None,
                 on_committed: Callable[[], None] | None = None, pool: str | None = None):
        self.spark = spark
        self.name = name or "-".join(filter(None, (query.query_id, stage, settings.worker_id)))
        """The Spark query's name: unique among this process's running queries."""
        self.pool = pool
        """The Spark scheduler pool its micro-batches' jobs run in (None: the default pool). With
        the session's FAIR scheduling, queries in pools of their own share the cores task by
        task: a query's batch does not queue behind every task of another's."""
        self.settings = settings
        self.query = query
        self.source = source
        self.sink = sink
        self.tasks = tasks
        """The tasks batches are committed to, by partition (changed only on the loop)."""
        self.on_task_failed = on_task_failed
        """Told (on the loop) of a task whose commit failed; the task gets no more batches."""
        self.on_committed = on_committed
        """Told (on the loop) once a batch's tasks committed: their copies moved on."""
        self.kind = WORKER_KINDS[query.plan.kind]
        self.loop = loop
        self.stream: StreamingQuery | None = None
        self.error: BaseException | None = None
        self.checkpoint = ""
        self._stopping = False
        """Set by ``stop`` while it stops the stream: a batch it interrupts is no failure."""
        self.last_batch_at = time.monotonic()
        """When the last batch with input committed (or the query started)."""
        self.parked_at: dict[int, int] | None = None
        """While parked (stopped for want of input): per partition, the offset it had read up to."""
        self.value_schema = value_struct(source)
        self.timestamps = {c.name for c in source.value_columns if c.type.base == "TIMESTAMP"}
        """The TIMESTAMP value columns, read as text and then converted (``_decode``)."""
        self.checked_times = any(has_times(f.dataType) for f in self.value_schema.fields)
        """Whether a value column holds a TIMESTAMP or a DATE somewhere, which ``_decode`` checks."""
        self.read_schema = T.StructType([
            T.StructField(f.name, T.StringType()) if f.name in self.timestamps else f for f in self.value_schema.fields])
        self.json = None if source.value_format == "DELIMITED" else \
            JsonReading(self.read_schema, PERMISSIVE, dict(source.spellings))
        """How a JSON value is read (None for DELIMITED values)."""
        keys = source.key_columns
        self.key_schema = T.StructType([T.StructField(c.name, spark_data_type(c.type)) for c in keys]) \
            if len(keys) > 1 else None
        """A JSON key of several columns: the struct it parses to."""
        self.batches = 0
        """Batches with input committed since the query was made."""
        self.started_at: float | None = None
        """When the running streaming query was started, until its first batch with input committed."""
        self.assigned: frozenset[int] = frozenset()
        """The partitions the Spark query reads since its last start (its tasks' may be fewer)."""
        self._columns: list[list[Column]] | None = None
        """``_read_columns``, once made."""
        self._reduction: Reduction[Any] | None = None
        """How the running streaming query's batches are reduced (made by ``start``)."""
        self._prepared: tuple[dict[int, int | None], Reduction[Any]] | None = None
        """The positions ``prepare`` made a plan for, and that plan's reduction: each later
        ``start`` that it ``fits`` takes it (a parked query's resume too)."""
        self.resumed_at: dict[int, int] | None = None
        """The positions the running query's checkpoint was written with (``start``), or None
        when it starts from the positions in its plan."""
        self._hold: threading.Event | None = None
        """While the query stands by (``stand_by``): what its first batch waits on, set by the
        take-over (or a stop); cleared once that batch is past it."""
        self._taken_over = False
        """Whether tasks took the query standing by over (``start``)."""
        self._from: dict[int, int] | None = None
        """After a take-over, each task's position until the query has read past them all: a
        batch's records before it are set aside (``_past_positions``)."""
        self.plan_ms: int | None = None
        """How long the last plan ``prepare`` made took (for the logs of a handoff)."""
        self.warmed = threading.Event()
        """Set once a query standing by has its first batch reduced and set aside (or too large
        to), and holds it."""

    @functools.cached_property
    def cores(self) -> int | None:
        """The tasks a local session runs at once (its threads): a batch is read in at most as
        many. None on a cluster master, whose executors come and go."""
        if not self.settings.spark_local:
            return None
        return int(self.spark.sparkContext.defaultParallelism)

    @property
    def running(self) -> bool:
        """Whether the streaming query is started (and not stopped)."""
        return self.stream is not None

    def positions(self) -> dict[int, int | None]:
        """Where each task's input resumes (None: the earliest offset); ``start`` takes it.
        Read on the loop, where the tasks change."""
        return {p: task.next_input_offset for p, task in self.tasks.items()}

    def prepare(self, positions: dict[int, int | None]) -> None:
        """Make the streaming query's plan over ``positions``' partitions, each from its offset,
        for a ``start`` from the same positions to take. Blocking: the plan is a few DataFrame
        steps, each a call into the JVM that Spark analyses (70-140 ms on an idle session; 0.15-1.3 s
        on a worker whose other query's batches run meanwhile, measured when a worker stopped
        right after one was added, 4 workers on 2 cores)."""
        began = time.monotonic()
        topic = self.source.topic
        partitions = sorted(positions)
        starting = {str(p): (-2 if positions[p] is None else positions[p]) for p in partitions}
        reader = (
            self.spark.readStream.format("kafka")
            .options(**self.settings.kafka.spark_options())
            .option("assign", json.dumps({topic: partitions}))
            .option("startingOffsets", json.dumps({topic: starting}))
            .options(**SOURCE_OPTIONS)
        )
        if self.settings.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(self.settings.max_offsets_per_trigger))
        self._prepared = (dict(positions), self.reduction(reader.load()))
        self.plan_ms = round((time.monotonic() - began) * 1000)

    def prepared(self) -> dict[int, int | None] | None:
        """The positions ``prepare`` made a plan for (None: none made)."""
        return None if self._prepared is None else self._prepared[0]

    def fits(self, positions: dict[int, int | None]) -> bool:
        """Whether the plan ``prepare`` made can start the query from ``positions``: one made
        from them, or, when the query resumes from a checkpoint written with them (every
        position known, ``offset_log_conf``), one made for the same partitions from any."""
        made = self.prepared()
        if made is None:
            return False
        return made == positions or (made.keys() == positions.keys() and self._resumable(made)
                                     and self._resumable(positions))

    def _resumable(self, positions: dict[int, int | None]) -> bool:
        return None not in positions.values() and offset_log_conf(self.spark) is not None

    def start(self, positions: dict[int, int | None]) -> None:
        """Start the streaming query over ``positions``' partitions, each from its offset
        (again after a ``stop``, with a new checkpoint: the tasks hold the positions), with the
        plan ``prepare`` made if it ``fits``, or one made now. When every position is known, the
        query resumes from a checkpoint written with them (``write_resume_point``), so the plan
        fits every later start over the same partitions: one made ahead from positions that
        moved since (an older owner committed more before it was fenced), a parked query's
        resume. A query standing by (``stand_by``) takes the tasks over instead, when none of them
        resumes before where it began. Blocking."""
        if self._hold is not None:
            if self._take_over(positions):
                return
            self.stop()  # a task resumes before it: a query of their own, from their positions
        if self.stream is not None:
            self.stop()  # one that ended by itself (a stand-by no task took over)
        self._launch(positions)

    def _launch(self, positions: dict[int, int | None]) -> None:
        if not self.fits(positions):
            self.prepare(positions)
        assert self._prepared is not None
        self._reduction = self._prepared[1]
        root = checkpoint_root(self.settings)
        root.mkdir(parents=True, exist_ok=True)
        self.checkpoint = tempfile.mkdtemp(prefix=f"{path_segment(self.name)}-", dir=root)
        known = {p: o for p, o in positions.items() if o is not None}
        conf = offset_log_conf(self.spark) if len(known) == len(positions) else None
        self.resumed_at = known if conf is not None else None
        if conf is not None:
            write_resume_point(Path(self.checkpoint), self.source.topic, known, conf)
        self.error = None
        self._stopping = False
        self._from = None
        self.last_batch_at = self.started_at = time.monotonic()
        self.assigned = frozenset(positions)
        # The streaming query's thread takes the local properties of the thread that starts it.
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.pool)  # type: ignore[arg-type]
        self.stream = (
            for_each_batch(self._reduction.frame.writeStream, self.spark, self._on_batch)
            .trigger(processingTime=f"{self.settings.trigger_interval_ms} milliseconds")
            .option("checkpointLocation", self.checkpoint)
            .queryName(self.name)
            .start()
        )
        log.info("query started", extra={"query": self.name, "partitions": sorted(positions),
                                         "starting": {str(p): o for p, o in sorted(positions.items())}})

    def stand_by(self, positions: dict[int, int]) -> None:
        """Start the streaming query from a checkpoint written with ``positions`` for tasks that
        are not here yet (its tasks are stand-ins, of a worker's copies about to take over): its
        first batch is reduced and its result set aside, so the plan's code is generated and
        compiled and the source's consumers are made before a move, not in its first batch; then
        that batch is held until ``start`` hands it the tasks that take over, or a stop, or
        ``STAND_BY_HOLD_S``. The positions must be where those tasks cannot resume before (the
        group's committed offsets: the older owner commits past them, never back). Blocking."""
        if offset_log_conf(self.spark) is None:
            raise MillpondError("this Spark session cannot start a query from a checkpoint written for it")
        self.warmed.clear()
        self._taken_over = False
        self._hold = threading.Event()
        try:
            self._launch(dict(positions))
        except BaseException:
            self._hold = None
            raise
        log.info("query standing by", extra={"query": self.name, "starting": {str(p): o for p, o in sorted(positions.items())}})

    def _take_over(self, positions: dict[int, int | None]) -> bool:
        """Hand the query standing by its tasks, which resume at ``positions``: whether it took
        them (it runs, and none resumes before where it began)."""
        hold, stream, began = self._hold, self.stream, self.resumed_at
        if hold is None or stream is None or not stream.isActive or began is None or positions.keys() != began.keys():
            return False
        if any(o is None or o < began[p] for p, o in positions.items()):
            return False
        self.last_batch_at = self.started_at = time.monotonic()
        # Records before a position are set aside only where it is past where the query began:
        # the filter's plan is another generated code, compiled in the batch that first runs it
        # (0.4-0.6 s of Spark on a busy worker; a kill's new owner resumes where it began).
        later = any(o is not None and o > began[p] for p, o in positions.items())
        self._from = {p: o for p, o in positions.items() if o is not None} if later else None
        self._taken_over = True
        hold.set()
        log.info("query took over", extra={"query": self.name, "starting": {str(p): o for p, o in sorted(positions.items())},
                                           "stood_by_from": {str(p): o for p, o in sorted(began.items())}})
        return True

    def _held(self, batch: DataFrame, batch_id: int, hold: threading.Event) -> None:
        """A query standing by's first batch: reduced with the stand-ins, as it is and as the
        take-over's first batches are (``_past_positions``), the result set aside; then held
        until the take-over (raises if there was none)."""
        if not hold.is_set():
            assert self._reduction is not None
            ends = batch_ends(Path(self.checkpoint), batch_id, self.source.topic)
            began = self.resumed_at or {}
            if sum(ends.get(p, o) - o for p, o in began.items()) <= STAND_BY_WARM_RECORDS:
                try:
                    self._reduced(batch, self._reduction)
                    self._reduced(batch.where(past(began)), self._reduction)
                except Exception as error:  # the take-over's batch sets the record aside
                    if not fails_on_a_record(error):
                        raise
            self.warmed.set()
            hold.wait(STAND_BY_HOLD_S)
        if self._stopping or not self._taken_over:
            self.error = MillpondError(f"no tasks took query {self.name} over within {STAND_BY_HOLD_S:g} s of its "
                                       "standing by")
            raise self.error

    def _past_positions(self, batch: DataFrame, batch_id: int, positions: dict[int, int]) -> DataFrame | None:
        """A batch after a take-over, while it may hold records from before the tasks'
        ``positions`` (the query stood by from earlier ones): its records from each task's
        position on (None: it has none). Once the query has read past every position, later
        batches are taken as they are."""
        ends = batch_ends(Path(self.checkpoint), batch_id, self.source.topic)
        if all(ends.get(p, 0) >= o for p, o in positions.items()):
            self._from = None
        if all(ends.get(p, 0) <= o for p, o in positions.items()):
            return None
        return batch.where(past(positions))

    def failure(self) -> str | None:
        """Why the streaming query stopped by itself, or None while it runs. Blocking."""
        stream = self.stream  # ``stop`` may clear it meanwhile, from another thread
        if stream is None or stream.isActive:
            return None
        if self.error is not None:  # raised by our own batch code: say it plainly
            return f"{type(self.error).__name__}: {self.error}"
        error = stream.exception()
        return str(error).splitlines()[0] if error is not None else "the Spark query stopped"

    def stop(self) -> None:
        """Stop the streaming query (waits for a running batch). Blocking."""
        if (hold := self._hold) is not None:
            self._hold = None
            self._stopping = True
            hold.set()  # a first batch held for a take-over ends
        if self.stream is not None:
            self._stopping = True
            self.stream.stop()
            self.stream = None
        if self.checkpoint:
            shutil.rmtree(self.checkpoint, ignore_errors=True)

    def progressed(self) -> bool:
        """Whether the streaming query has reported a trigger's progress (a batch held for a
        take-over reports none until it ends). Blocking."""
        stream = self.stream
        return stream is not None and stream.lastProgress is not None

    def read_through(self) -> dict[int, int] | None:
        """Per partition, the offset the query has read its input up to (the Kafka source's end
        offset in Spark's last progress: past transaction markers, as the last stable offset
        is); None before the first progress. Blocking."""
        progress = self.stream.lastProgress if self.stream is not None else None
        if not progress or not progress["sources"]:
            return None
        return source_offsets(progress["sources"][0]["endOffset"], self.source.topic)

    def _on_batch(self, batch: DataFrame, batch_id: int) -> None:
        if batch_id == 0 and self.resumed_at is not None:
            # Spark did not take the checkpoint written for it: it read from the positions its
            # plan was made with, which need not be the tasks'. Nothing is committed; the query
            # fails and starts again, and the session's queries start from their plans' positions.
            _OFFSET_LOG_CONF[self.spark] = None
            self.error = MillpondError(f"Spark began query {self.name} afresh instead of from the positions "
                                       f"{self.resumed_at} written to its checkpoint")
            log.error("a query did not resume from its checkpoint", extra={"query": self.name})
            raise self.error
        hold = self._hold
        try:
            if hold is not None:
                try:
                    self._held(batch, batch_id, hold)
                finally:
                    self._hold = None
            if (positions := self._from) is not None:
                kept = self._past_positions(batch, batch_id, positions)
                if kept is None:
                    return
                batch = kept
            self._process(batch, batch_id)
        except BaseException as error:
            if self._stopping:  # ``stop`` interrupts a batch's Spark job: nothing was committed
                log.info("batch cut short by the query's stop", extra={"query": self.name, "batch": batch_id})
                raise
            if hold is not None and not self._taken_over:
                log.info("query stood by with no take-over", extra={"query": self.name, "seconds": STAND_BY_HOLD_S})
                raise
            # The JVM fails the query with it, and the supervisor restarts the query.
            log.warning("batch failed", exc_info=True, extra={"query": self.name, "batch": batch_id})
            self.error = error
            raise

    def _process(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        assert self._reduction is not None
        try:
            slices = self._reduced(batch, self._reduction)
        except Exception as error:
            if not fails_on_a_record(error):
                raise
            log.warning("a record's processing failed in Spark; the batch is processed in parts to set it aside",
                        extra={"query": self.name, "batch": batch_id, "reason": record_failure(error)})
            self._in_parts(self._batch_spans(batch_id), None)
            return
        self._commit_now(slices, started)

    def _batch_spans(self, batch_id: int) -> list[Span]:
        """The offsets batch ``batch_id`` read of each of its tasks' partitions: from the task's
        position (what it committed last) to the batch's end in the offset log."""
        ends = batch_ends(Path(self.checkpoint), batch_id, self.source.topic)
        tasks = dict(self.tasks)
        return [(p, first, ends[p]) for p, task in sorted(tasks.items())
                if p in ends and (first := task.next_input_offset or 0) < ends[p]]

    def _in_parts(self, part: list[Span], failed: BaseException | None) -> None:
        """Process ``part`` of a batch, whose reduction failed on one of its records
        (``fails_on_a_record``), in parts, each read again from Kafka and committed as a batch
        of its own (the batch Spark gives holds its records computed: a part of it would
        compute them all again), halving a part that fails down to one offset, a record that
        fails alone, which is set aside to the processing log (Kafka Streams' handler of a
        record it cannot process). Each partition's parts are committed in offset order.
        ``failed``: how ``part`` itself failed when it was run, None when it was not (a second
        half whose first went through is split without a run; a record is run alone before it
        is set aside, so that none is when the one that failed was elsewhere: of a partition
        whose task has left the query, which the batch still computed)."""
        if not part:
            return
        if len(part) == 1 and part[0][2] - part[0][1] == 1:
            if failed is None and (failed := self._try(part)) is None:
                return  # it went through: committed
            self._commit_now(self._set_aside(part[0][0], part[0][1], failed), time.monotonic())
            return
        first, second = halves(part)
        if (first_failed := self._try(first)) is None:
            self._in_parts(second, None)  # the record is in the second half, if in this part at all
            return
        self._in_parts(first, first_failed)
        if (second_failed := self._try(second)) is not None:
            self._in_parts(second, second_failed)

    def _try(self, part: list[Span]) -> BaseException | None:
        """Read ``part`` of a batch from Kafka, reduce and commit it; what failed on one of its
        records if it did (and nothing is committed)."""
        started = time.monotonic()
        try:
            reduction = self.reduction(self._read_spans(part))
            slices = self._reduced(reduction.frame, reduction)
        except Exception as error:
            if not fails_on_a_record(error):
                raise
            return error
        self._commit_now(slices, started)
        return None

    def _read_spans(self, part: list[Span]) -> DataFrame:
        """The source's records in ``part``'s offsets, read from Kafka as a batch."""
        topic = self.source.topic
        return (self.spark.read.format("kafka")
                .options(**self.settings.kafka.spark_options())
                .option("assign", json.dumps({topic: [p for p, _, _ in part]}))
                .option("startingOffsets", json.dumps({topic: {str(p): first for p, first, _ in part}}))
                .option("endingOffsets", json.dumps({topic: {str(p): end for p, _, end in part}}))
                .options(**SOURCE_OPTIONS)
                .load())

    def _set_aside(self, partition: int, offset: int, error: BaseException) -> dict[int, BatchSlice]:
        """The slices of a batch of the record at ``offset`` of ``partition`` alone, whose
        processing fails: reduced as a record with neither key nor value, which every kind's
        reduction passes over computing nothing (a tombstone without a key), and set aside to
        the processing log with what failed and its value's text (read again from Kafka)."""
        frame = self.spark.createDataFrame([(None, None, self.source.topic, partition, offset, None, 0)], KAFKA_RECORD)
        reduction = self.reduction(frame)
        slices = self._reduced(reduction.frame, reduction)
        reason = f"processing the record failed in Spark: {record_failure(error)}"
        if (piece := slices.get(partition)) is not None:  # None: its task left the query meanwhile
            read = self._read_spans([(partition, offset, offset + 1)]).select(F.col("value").cast("string")).collect()
            piece.bad.append(BadRecord(offset, reason, read[0][0] if read else None))
        log.warning("a record set aside", extra={"query": self.name, "partition": partition, "offset": offset,
                                                 "reason": reason})
        return slices

    def _commit_now(self, slices: dict[int, BatchSlice], started: float) -> None:
        """Commit a batch's ``slices`` (``_commit``, on the loop), reduced since ``started``."""
        if not slices:
            return
        reduced = time.monotonic()
        future = asyncio.run_coroutine_threadsafe(self._commit(slices), self.loop)
        try:
            future.result(timeout=COMMIT_TIMEOUT_S)
        except TimeoutError:
            future.cancel()  # an overrunning commit is aborted, not left running under a failed batch
            raise
        finished = self.last_batch_at = time.monotonic()
        self.batches += 1
        metrics.BATCH_SECONDS.labels(self.query.query_id).observe(finished - started)
        timings = {"query": self.name, "records": sum(s.count for s in slices.values()),
                   "spark_ms": round((reduced - started) * 1000), "commit_ms": round((finished - reduced) * 1000)}
        if self.started_at is not None:
            # A handoff's: how long its new query took to reach its first batch, and that batch.
            log.info("first batch committed", extra={**timings, "since_start_ms": round((finished - self.started_at) * 1000),
                                                     "batch_after_start_ms": round((started - self.started_at) * 1000)})
            self.started_at = None
        else:
            log.debug("batch committed", extra=timings)

    def reduction(self, frame: DataFrame) -> Reduction[Any]:
        """How the query reduces ``frame``, the Kafka source's records (streaming, or a
        DataFrame of them): read into the parsed columns, then the kind's reduction of those
        (see ``millpond.services.worker.reducers``). Its ``frame`` is what the streaming query
        is defined over, so Spark analyses each record's columns once, at the query's start,
        instead of four DataFrame steps analysed in every batch (bench.micro_batch: a batch of
        1k / 10k / 50k records reduced in 65 / 60 / 129 ms against 189 / 145 / 241; the trigger's
        own planning, which now optimizes and plans those columns, 15-20 ms more)."""
        if self.cores is not None:
            # One Spark task per Kafka partition would run them one after another on the
            # session's threads, each paying a task's fixed cost; the reducers order by offset
            # themselves. bench.micro_batch, 4 partitions on 1 core: a 2k-record batch reduced
            # in 131-139 ms against 153-159, a 200k one in 554-568 against 589-606. (With
            # several threads, partitions of uneven size no longer even out between them.)
            # Over as many partitions as threads or fewer it changes no task, but the plan is
            # the same as over more: the Spark query a moved partition gets then finds the
            # stage's generated code compiled (and JIT-compiled) by the worker's first query,
            # instead of generating its own (3 classes, 80-110 ms, then run cold in its first
            # batch).
            frame = frame.coalesce(self.cores)
        return self.kind.reduction(self.read(frame), self.query, self.source, self.sink, dict(self.tasks))

    def read(self, frame: DataFrame) -> DataFrame:
        """Records of the source (Kafka's columns) as the columns every batch is read into:
        the partition, offset and key, the value's text and bytes, its columns parsed (``_v``),
        its time, and a JSON key's columns (``_keys``)."""
        return functools.reduce(lambda read, stage: read.select(*stage), self._read_columns(), frame)

    def _reduce(self, frame: DataFrame) -> dict[int, BatchSlice]:
        """A DataFrame of the source's records as one slice per input partition (its
        ``reduction`` made for it alone: the warm-up's batches, tests)."""
        reduction = self.reduction(frame)
        return self._reduced(reduction.frame, reduction)

    def _reduced(self, batch: DataFrame, reduction: Reduction[Any]) -> dict[int, BatchSlice]:
        """A batch of ``reduction.frame`` as one slice per input partition, of the kind the
        query's tasks commit (one Spark job). The records of a partition whose task left since
        the query started are set aside."""
        tasks = dict(self.tasks)  # one atomic copy: the loop changes the tasks meanwhile
        kept = list(tasks)
        if not kept:
            return {}
        if not self.assigned <= set(kept):
            batch = batch.where(F.col("_partition").isin(kept))
        return reduction.reduce(batch, tasks)

    def _read_columns(self) -> list[list[Column]]:
        """The columns every batch is read into: made once per session for a source of this
        shape and shared by every Spark query that reads one, as each Column function is a call
        into the JVM (a Column is an expression, not bound to a DataFrame). A partition that
        moves in gets a Spark query of its own, whose plan is made on the critical path of the
        move: these columns were 39 of its 112 calls into the JVM (the plan took 0.37-0.65 s on
        two kills' survivors, both cores busy; 43 ms on an idle session)."""
        if self._columns is None:
            made = _READ_COLUMNS.setdefault(self.spark, {})
            shape = (self.source.value_format, self.source.value_delimiter, self.value_schema.json(),
                     tuple(sorted(self.timestamps)), None if self.key_schema is None else self.key_schema.json(),
                     self.source.spellings, self.source.window and window_key_bytes(self.source.window))
            if shape not in made and len(made) >= READ_SHAPES_KEPT:  # shapes of sources dropped long ago go
                made.clear()
            columns = made.get(shape)
            if columns is None:
                columns = made[shape] = self._make_read_columns()
            self._columns = columns
        return self._columns

    def _make_read_columns(self) -> list[list[Column]]:
        """``_read_columns``: the stages of columns a batch is selected into, one after the
        other. Each later stage refers to the one before by name, so an expression it uses twice
        (a parse) is evaluated once, in the stage before (Spark collapses no projection that
        would repeat an expensive expression)."""
        text = F.col("value").cast("string")
        key = F.col("key")
        columns = {
            "_partition": F.col("partition"), "_offset": F.col("offset"), "_key": key, "_raw": text,
            "_v": self._parsed(text),
            "_value": F.col("value"),  # the bytes as they are (a join side copies them)
            "_rowtime": F.unix_millis(F.col("timestamp")),
        }
        if self.source.window is not None:
            # A windowed table's record key is the key, then its window's bounds: ``_key`` is the
            # key alone (NULL when too short to hold a window), ``_window_key`` the whole.
            width = window_key_bytes(self.source.window)
            key = columns["_key"] = F.expr(f"IF(length(key) >= {width}, substring(key, 1, length(key) - {width}), NULL)")
            columns[WINDOW_KEY] = F.col("key")
        found: dict[str, Column] = {}  # the parses read as ksqlDB finds fields (``JsonReading``)
        if self.key_schema is not None:  # a JSON key of several columns, parsed once for them all
            keys = JsonReading(self.key_schema, written=dict(self.source.spellings))
            columns["_keys"] = keys.parsed(key.cast("string"))
            if (found_keys := keys.found(F.col("_keys"), F.col("_key").cast("string"))) is not None:
                found["_keys"] = found_keys
        if self.json is not None and (found_value := self.json.found(F.col("_v"), F.col("_raw"))) is not None:
            found["_v"] = found_value
        stages = [columns, found] if found else [columns]
        if self.checked_times:
            stages.append({"_v": self._times_checked(F.col("_v"), F.col("_raw"))})
        names = list(columns)
        return [[(stage[name] if name in stage else F.col(name)).alias(name) for name in names] for stage in stages]

    def _parsed(self, text: Column) -> Column:
        """The record value parsed into the declared columns, PERMISSIVE: a record that does
        not fit gets the corrupt-record column set instead of failing. The schema goes to
        Spark as a type object, never pasted into SQL text (column names are user input).
        A TIMESTAMP column is read as text first (``_times_checked``): a number is epoch
        milliseconds, as ksqlDB's JSON has it (Spark's reader would take seconds). JSON fields
        are read in every spelling of their names at once (``JsonReading``: the next stage picks one)."""
        if self.json is None:
            # RFC 4180 quoting, as ksqlDB and Millpond's writer quote (Spark's default escape is \).
            return F.from_csv(text, self.read_schema.toDDL(), {**PERMISSIVE, "sep": self.source.value_delimiter,
                                                                "escape": '"'})
        return self.json.parsed(text)

    def _times_checked(self, parsed: Column, text: Column) -> Column:
        """``parsed`` with its TIMESTAMP columns read from their text (``timestamp_of``). A time
        that does not read, or that Python cannot hold, is NULL and makes the record corrupt;
        its other columns stay as read, as Spark's reader leaves a record's readable ones."""
        fields, unreadable = [], []
        for field in self.value_schema.fields[:-1]:
            value = parsed.getField(field.name)
            if field.name in self.timestamps:
                read = timestamp_of(value)
                unreadable.append(value.isNotNull() & read.isNull())
                value = read
            elif has_times(field.dataType):
                outside = outside_python(value, field.dataType)
                unreadable.append(outside)
                value = F.when(~outside, value)
            fields.append(value.alias(field.name))
        bad = functools.reduce(operator.or_, unreadable)
        return F.when(parsed.isNotNull(), F.struct(
            *fields, F.coalesce(parsed.getField(CORRUPT), F.when(bad, text)).alias(CORRUPT)))

    async def _commit(self, slices: dict[int, BatchSlice]) -> None:
        """Each task commits its slice in its own transaction. A partition whose task left (or
        failed) since the query started is passed over: its next run reads it again from its
        committed position. A task whose commit fails is dropped from this query and reported."""
        tasks = {p: task for p in slices if (task := self.tasks.get(p)) is not None}
        outcomes = await asyncio.gather(*(task.apply(slices[p]) for p, task in tasks.items()), return_exceptions=True)
        for (partition, task), outcome in zip(tasks.items(), outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if self.tasks.get(partition) is task:
                    del self.tasks[partition]
                    log.warning("a task's commit failed; it leaves the query", exc_info=outcome,
                                extra={"query": self.name, "partition": partition})
                    if self.on_task_failed is not None:
                        self.on_task_failed(partition, f"{type(outcome).__name__}: {outcome}")
            elif outcome:
                piece = slices[partition]
                labels = (self.query.query_id, str(partition))
                metrics.RECORDS_PROCESSED.labels(*labels).inc(piece.count - len(piece.bad))
                metrics.RECORDS_FAILED.labels(*labels).inc(len(piece.bad))
        if self.on_committed is not None:
            self.on_committed()



_SPARK_TYPES: dict[str, T.DataType] = {
    "VARCHAR": T.StringType(), "INT": T.IntegerType(), "BIGINT": T.LongType(), "DOUBLE": T.DoubleType(),
    "BOOLEAN": T.BooleanType(), "BYTES": T.BinaryType(), "TIMESTAMP": T.TimestampType(), "DATE": T.DateType(),
    "TIME": T.TimeType(),
}


EARLIEST_TIME, LATEST_TIME = EARLIEST_TIMESTAMP.isoformat(" "), LATEST_TIMESTAMP.isoformat(" ")
"""The span a TIMESTAMP value may have: what PySpark can give as a Python datetime (Spark's
own goes further; a time outside would fail the batch as it reaches the task). PySpark gives
timestamps in the process's time zone, which ``create_session`` sets to the session's, UTC."""
EARLIEST_DATE, LATEST_DATE = "0001-01-01", "9999-12-31"
"""The span a DATE value may have: what Python's date holds."""


STACK_OVERFLOW = "java.lang.StackOverflowError"
Span = tuple[int, int, int]
"""A partition's offsets from the first to the end (not included)."""


RECORD_FAILURES = (STACK_OVERFLOW, regexes.SPARK_TIMEOUT, arrays.CUBE_TOO_MANY)


def fails_on_a_record(error: BaseException) -> bool:
    """Whether ``error``, a batch's Spark job's, is one a record makes, so that the batch fails
    again however often it is run: a StackOverflowError in a task (java.util.regex recurses
    once or more per character for a group repeated, e.g. ``(a|b)*``: 2,000 characters overflow
    a thread's stack; the worker's session has the task, not the JVM, fail of it:
    ``spark.executor.killOnFatalError.depth``), a REGEXP call over its time
    (``regexes.SPARK_TIMEOUT``: ``(a|aa)+c`` backtracks without end), or a CUBE_EXPLODE of too
    many items (``arrays.CUBE_TOO_MANY``). Blocking: the text comes from the JVM."""
    return isinstance(error, (Py4JJavaError, PySparkException)) and any(f in str(error) for f in RECORD_FAILURES)


def record_failure(error: BaseException) -> str:
    """What failed, in a line: the Java error's class and message."""
    text = str(error)
    at = min((at for f in RECORD_FAILURES if (at := text.find(f)) >= 0), default=-1)
    return text[at:].splitlines()[0].strip() if at >= 0 else text.splitlines()[0]


def halves(part: list[Span]) -> tuple[list[Span], list[Span]]:
    """``part`` cut in two (each partition's offsets before the other's): between its
    partitions when it has several, else in the middle of its one partition's offsets."""
    if len(part) > 1:
        return part[:len(part) // 2], part[len(part) // 2:]
    ((partition, first, end),) = part
    middle = (first + end) // 2
    return [(partition, first, middle)], [(partition, middle, end)]


def timestamp_of(text: Column) -> Column:
    """A TIMESTAMP column's text as a timestamp: digits (a JSON number, or text of digits alone)
    are epoch milliseconds (ksqlDB's JSON form), ISO 8601 text (``serde.ISO_TIMESTAMP_TEXT``,
    as ksqlDB and Millpond write them) what a CAST to TIMESTAMP reads of it; NULL for other
    text, or outside ``EARLIEST_TIME``..``LATEST_TIME``. Python reads the same forms the same
    way (``serde.timestamp_text``: push queries, standby copies)."""
    # Up to 15 digits: more would overflow timestamp_millis (an error, whatever the ANSI mode).
    # \z, not $: Java's $ also matches before a final line break (which the casts then trim).
    read = F.when(text.rlike(f"^{MILLIS_TEXT}\\z"), F.timestamp_millis(text.cast("bigint"))).when(
        text.rlike(f"^{ISO_TIMESTAMP_TEXT}\\z"), text.try_cast("timestamp"))
    return F.when(read.between(_bound(EARLIEST_TIME, "timestamp"), _bound(LATEST_TIME, "timestamp")), read)


def _bound(day: str, type_name: str) -> Column:
    return F.lit(day).cast(type_name)


def has_times(data_type: T.DataType) -> bool:
    """Whether values of ``data_type`` hold a timestamp or a date, at any depth."""
    return holds(data_type, (T.TimestampType, T.DateType))


def outside_python(value: Column, data_type: T.DataType) -> Column:
    """True when a timestamp or a date in ``value`` (of ``data_type``, which ``has_times``),
    at any depth, lies outside what Python's datetime holds: Spark reads such a value (a
    date of year 99999, a nested TIMESTAMP given in milliseconds, which it takes as seconds),
    but the batch would fail as it reaches the task. Never NULL."""
    if isinstance(data_type, T.TimestampType):
        inside = value.between(_bound(EARLIEST_TIME, "timestamp"), _bound(LATEST_TIME, "timestamp"))
    elif isinstance(data_type, T.DateType):
        inside = value.between(_bound(EARLIEST_DATE, "date"), _bound(LATEST_DATE, "date"))
    elif isinstance(data_type, T.ArrayType):
        return _any_outside(value, data_type.elementType)
    elif isinstance(data_type, T.MapType):
        return functools.reduce(operator.or_, [_any_outside(entries, t) for entries, t in (
            (F.map_keys(value), data_type.keyType), (F.map_values(value), data_type.valueType)) if has_times(t)])
    else:
        assert isinstance(data_type, T.StructType)
        return functools.reduce(operator.or_, [outside_python(value.getField(f.name), f.dataType)
                                               for f in data_type.fields if has_times(f.dataType)])
    return F.coalesce(~inside, F.lit(False))


def _any_outside(items: Column, item_type: T.DataType) -> Column:
    """``outside_python`` of any item of an array (False for none, or a NULL array)."""
    def outside(item: Column) -> Column:  # one parameter: Spark's lambda takes as many as it has
        return outside_python(item, item_type)

    return F.coalesce(F.exists(items, outside), F.lit(False))


def spark_data_type(type_: ast.SqlType) -> T.DataType:
    """A SQL type as a Spark type object."""
    if type_.base == "DECIMAL":
        return T.DecimalType(type_.params[0], type_.params[1])
    if type_.base == "ARRAY":
        return T.ArrayType(spark_data_type(type_.params[0]))
    if type_.base == "MAP":
        return T.MapType(spark_data_type(type_.params[0]), spark_data_type(type_.params[1]))
    if type_.base == "STRUCT":
        return T.StructType([T.StructField(n, spark_data_type(t)) for n, t in type_.params])
    return _SPARK_TYPES[type_.base]


def value_struct(source: DataSource) -> T.StructType:
    """The schema a record value decodes to: the source's value columns, then the corrupt-record column."""
    return T.StructType([T.StructField(c.name, spark_data_type(c.type)) for c in source.value_columns]
                        + [T.StructField(CORRUPT, T.StringType())])
