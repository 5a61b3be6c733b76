"""The worker's batch reducer (``QueryRunner._reduce``) on a small in-memory micro-batch, in a
local[1] Spark session, against a pure-Python reference of the same rules:

- a record whose value is not JSON of the declared columns, or a keyed record without a key,
  goes to the processing log (a bad record) and nowhere else; a tombstone (NULL value) of a
  stream is skipped;
- an AGGREGATE query reduces each (partition, key) to a partial that the task's aggregates
  finalize to COUNT(*), SUM and AVG over the batch;
- a PROJECT query keeps the records its WHERE passes, in input order, keyed as the input;
- each partition's slice carries its last offset and how many records it read;
- all of it comes from one Spark job per batch;
- a GROUP BY batch is reduced the same whether Arrow groups it (the aggregates with Arrow
  forms, over argument types Arrow orders as Spark does) or Spark's shuffle does (the others):
  every GROUP BY test runs both ways.

Everything the test reads from the reducer goes through ``observe`` and ``reduce``, so a change
of the slice types touches only those two functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import functools
import itertools
import json
import math
import random
import re
import struct
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from py4j import protocol as proto
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    DoubleType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
    TimeType,
)

from millpond.services.worker import json_reading, query_runner, reducers
from millpond.services.worker.converters import row_to_proto
from millpond.services.worker.kinds import new_task
from millpond.services.worker.query_runner import QueryRunner
from millpond.services.worker.reducers import Reduction
from millpond.services.worker.regrouping import retracted
from millpond.services.worker.spark import STACK_TRACE_DEPTH, driver_alive
from millpond.services.worker.state.store import encode_state
from millpond.services.worker.state.table_topic import LeftOut, TableRecords
from millpond.services.worker.table_joining import rekeyed, split_rekeyed
from millpond.services.worker.task import (
    AggregationTask,
    MaterializeSlice,
    ProjectionTask,
    TableTask,
    Task,
    group_rows,
    table_rows,
)
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.sources import Column
from millpond.shared.catalog.topology import stages
from millpond.shared.config import WorkerSettings as Settings
from millpond.shared.kafka.serde import from_proto, key_decoder, serialize_key, serialize_value, windowed_key
from millpond.shared.sql import aggregates
from millpond.shared.sql.ast import SqlType
from millpond.shared.sql.parser import parse_statement
from tests.metastores import applied

pytestmark = pytest.mark.spark

SOURCE = ("CREATE STREAM r (sensor VARCHAR KEY, area VARCHAR, reading INT) "
          "WITH (kafka_topic='r', partitions=3, value_format='json')")
AGGREGATE = "CREATE TABLE t AS SELECT sensor, COUNT(*) AS n, SUM(reading) AS total, AVG(reading) AS mean FROM r GROUP BY sensor"
PROJECT = "CREATE STREAM hot AS SELECT sensor, area, reading * 2 AS doubled FROM r WHERE reading > 10"

T = TypeVar("T")

KAFKA_ROW = query_runner.KAFKA_RECORD

Record = tuple[bytes | None, bytes | None, int, int]
"""(key, value, partition, offset) of one input record, as the Kafka source gives it."""

HAND_MADE: list[Record] = [
    (b"s1", b'{"AREA": "a", "READING": 5}', 0, 0),
    (b"s1", b'{"AREA": "a", "READING": 15}', 0, 1),
    # offset 2 is a transaction marker: no record, and the slice still ends at 3
    (b"s2", b"not json", 0, 3),
    (None, b'{"AREA": "b", "READING": 40}', 1, 7),
    (b"s3", b'{"AREA": "b", "READING": 20}', 1, 8),
    (b"s3", None, 1, 9),  # a tombstone: neither bad nor counted
    (b"s4", b'{"AREA": "c"}', 1, 10),  # no READING: counted, but adds nothing to SUM and AVG
    (b"s3", b'{"AREA": "b", "READING": -3}', 1, 11),
    (b"s5", b'{"AREA": "d", "READING": 11}', 2, 100),
]


def _random_records(n: int, seed: int) -> list[Record]:
    rng = random.Random(seed)
    next_offset = {0: 20, 1: 20, 2: 200}
    records: list[Record] = []
    for _ in range(n):
        partition = rng.randrange(3)
        offset = next_offset[partition]
        next_offset[partition] += rng.choice((1, 1, 1, 2))  # now and then a marker between records
        key = None if rng.random() < 0.05 else f"k{rng.randrange(6)}".encode()
        roll = rng.random()
        if roll < 0.05:
            value = None
        elif roll < 0.12:
            value = rng.choice([b"{", b"[1, 2", b"}{", b"garbage"])
        else:
            fields: dict[str, Any] = {"AREA": rng.choice("abc")}
            if rng.random() < 0.9:
                fields["READING"] = rng.randrange(-50, 50)
            value = json.dumps(fields).encode()
        records.append((key, value, partition, offset))
    return records


RECORDS = HAND_MADE + _random_records(80, seed=17)


# --- The pure-Python reference -------------------------------------------------------------

@dataclass
class Slice:
    """What a reducer says about one partition of a batch, in plain values."""

    last_offset: int
    count: int
    bad: list[tuple[int, str]]
    """(offset, why) with why "no key" or "not json", sorted."""
    totals: dict[bytes, tuple[Any, ...]]
    """AGGREGATE: key -> (COUNT(*), SUM(READING), AVG(READING)) over the batch."""
    records: list[tuple[bytes | None, dict[str, Any] | None]]
    """PROJECT: the result records (key, decoded JSON value) in input order."""


def _decode(value: bytes) -> dict[str, Any] | None:
    """The declared columns of a JSON value, or None when it is not a JSON object (a bad record).
    Field names match exactly, as Spark's from_json does."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    return {"AREA": parsed.get("AREA"), "READING": parsed.get("READING")}


def reference(records: list[Record], kind: str) -> dict[int, Slice]:
    """The slices the reducer must produce for ``records``, computed record by record."""
    by_partition: dict[int, list[Record]] = defaultdict(list)
    for record in records:
        by_partition[record[2]].append(record)
    out: dict[int, Slice] = {}
    for partition, rows in by_partition.items():
        rows.sort(key=lambda r: r[3])
        piece = Slice(rows[-1][3], len(rows), [], {}, [])
        readings: dict[bytes, list[Any]] = defaultdict(list)
        for key, value, _, offset in rows:
            if value is None:
                continue  # a stream's tombstone
            decoded = _decode(value)
            if decoded is None:
                piece.bad.append((offset, "not json"))
            if key is None:
                piece.bad.append((offset, "no key"))
            if decoded is None or key is None:
                continue
            if kind == "AGGREGATE":
                readings[key].append(decoded["READING"])
            elif decoded["READING"] is not None and decoded["READING"] > 10:
                piece.records.append((key, {"AREA": decoded["AREA"], "DOUBLED": decoded["READING"] * 2}))
        for key, values in readings.items():
            present = [v for v in values if v is not None]
            piece.totals[key] = (len(values), sum(present) if present else None,
                                 sum(present) / len(present) if present else None)
        piece.bad.sort()
        out[partition] = piece
    return out


# --- The reducer under test ----------------------------------------------------------------

def observe(raw: Any, aggs: list[aggregates.Aggregate]) -> Slice:
    """One slice the reducer returned, as plain values (the one place that reads its fields)."""
    bad = sorted((b.offset, "no key" if "no key" in b.reason else "not json") for b in raw.bad)
    totals = {key: tuple(agg.finalize(state) for agg, state in zip(aggs, partial, strict=True))
              for key, partial in getattr(raw, "partials", [])}
    records = [(key, None if value is None else json.loads(value)) for key, value in getattr(raw, "records", [])]
    return Slice(raw.last_offset, raw.count, bad, totals, records)


@pytest.fixture(params=["arrow", "spark"])
def reduction(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How a GROUP BY batch is grouped: by Arrow (where it can) or, forced, by Spark's shuffle."""
    if request.param == "spark":
        monkeypatch.setattr(reducers, "arrow_forms", lambda *_: None)
    return str(request.param)


@pytest.fixture(scope="module")
def batch(spark: SparkSession) -> DataFrame:
    """``RECORDS`` as a micro-batch of the Kafka source."""
    return spark.createDataFrame([(k, v, "r", p, o, None, 0) for k, v, p, o in RECORDS], KAFKA_ROW)


def runner_of(spark: SparkSession, statement: str, tmp_path: Path, source_statement: str = SOURCE) -> QueryRunner:
    """A runner of ``statement``'s query, its tasks made but not started (no Kafka: batches are given)."""
    meta = Metastore()
    meta.apply(parse_statement(source_statement), 0)
    meta.apply(parse_statement(statement), 1)
    (query,) = meta.queries.values()
    source, sink = meta.sources[query.source], meta.sources[query.sink]
    settings = Settings(worker_id="reducer-test", spark_master="local[1]", state_dir=tmp_path)
    task_class: type[Task] = AggregationTask if query.plan.aggregates else ProjectionTask
    tasks = {p: task_class(settings, query, source, sink, p) for p in range(source.partitions)}
    return QueryRunner(spark, settings, query, source, sink, tasks, asyncio.new_event_loop())  # only a commit would use the loop


def reduce(spark: SparkSession, statement: str, frame: DataFrame, tmp_path: Path) -> dict[int, Slice]:
    """Run the reducer of ``statement``'s query over ``frame``."""
    runner = runner_of(spark, statement, tmp_path)
    first = next(iter(runner.tasks.values()))
    aggs = first.aggregates if isinstance(first, AggregationTask) else []
    try:
        slices = runner._reduce(frame)
    finally:
        runner.stop()
        runner.loop.close()
    return {partition: observe(piece, aggs) for partition, piece in slices.items()}


def test_the_session_draws_no_progress_bar_into_the_worker_log(spark: SparkSession) -> None:
    """A stage's progress bar on stderr would run into the worker's next JSON log line."""
    assert spark.sparkContext.getConf().get("spark.ui.showConsoleProgress") == "false"


def test_the_reference_covers_every_case() -> None:
    """The batch holds what the reducer must tell apart, so the comparisons below mean something."""
    expected = reference(HAND_MADE, "AGGREGATE")
    assert expected[0] == Slice(3, 3, [(3, "not json")], {b"s1": (2, 20, 10.0)}, [])
    assert expected[1].bad == [(7, "no key")]
    assert expected[1].totals == {b"s3": (2, 17, 8.5), b"s4": (1, None, None)}
    assert reference(HAND_MADE, "PROJECT")[1].records == [(b"s3", {"AREA": "b", "DOUBLED": 40})]


def test_an_aggregate_batch_reduces_to_what_python_computes(spark: SparkSession, reduction: str, batch: DataFrame,
                                                            tmp_path: Path) -> None:
    got = reduce(spark, AGGREGATE, batch, tmp_path)
    want = reference(RECORDS, "AGGREGATE")
    assert sorted(got) == sorted(want) == [0, 1, 2]
    for partition in want:
        assert got[partition].last_offset == want[partition].last_offset
        assert got[partition].count == want[partition].count
        assert got[partition].bad == want[partition].bad
        assert got[partition].totals.keys() == want[partition].totals.keys()
        for key, (count, total, mean) in want[partition].totals.items():
            assert got[partition].totals[key][:2] == (count, total), (partition, key)
            assert got[partition].totals[key][2] == pytest.approx(mean), (partition, key)
        assert got[partition].records == []


def test_each_keys_partial_comes_with_the_latest_time_of_its_records(spark: SparkSession, reduction: str,
                                                                      tmp_path: Path) -> None:
    """The time that stamps a GROUP BY row (Kafka Streams': the latest timestamp of its records):
    per key, the latest of the batch's records it counts, not of bad or skipped ones."""
    epoch = datetime.datetime.fromtimestamp(0, datetime.UTC)
    stamped = [(k, v, "r", p, o, epoch + datetime.timedelta(milliseconds=1_000 * (o % 7) + 5), 0)
               for k, v, p, o in HAND_MADE]
    runner = runner_of(spark, AGGREGATE, tmp_path)
    try:
        slices = runner._reduce(spark.createDataFrame(stamped, KAFKA_ROW))
    finally:
        runner.stop()
        runner.loop.close()
    # s3: offsets 8 and 11 counted (9 is a tombstone, at 2 s: not counted).
    assert {p: piece.times for p, piece in slices.items()} == {
        0: {b"s1": 1_005}, 1: {b"s3": 4_005, b"s4": 3_005}, 2: {b"s5": 2_005}}


def test_a_projection_batch_keeps_what_the_where_passes_in_input_order(spark: SparkSession, batch: DataFrame,
                                                                        tmp_path: Path) -> None:
    got = reduce(spark, PROJECT, batch, tmp_path)
    want = reference(RECORDS, "PROJECT")
    assert sorted(got) == sorted(want)
    for partition in want:
        assert (got[partition].last_offset, got[partition].count) == (want[partition].last_offset, want[partition].count)
        assert got[partition].bad == want[partition].bad
        assert got[partition].records == want[partition].records
        assert got[partition].totals == {}


def _as_batch(spark: SparkSession, records: list[Record]) -> DataFrame:
    return spark.createDataFrame([(k, v, "r", p, o, None, 0) for k, v, p, o in records], KAFKA_ROW)


def jobs_of(spark: SparkSession, group: str, run: Callable[[], T]) -> tuple[T, list[list[int]]]:
    """What ``run`` returns, and per Spark job it ran (in job group ``group``) its stages' task counts."""
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup(group, group)
    try:
        result = run()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    return result, [[tracker.getStageInfo(stage).numTasks for stage in tracker.getJobInfo(job).stageIds]  # type: ignore[union-attr]
                    for job in tracker.getJobIdsForGroup(group)]


def test_a_batch_is_one_spark_job(spark: SparkSession, reduction: str, batch: DataFrame, tmp_path: Path) -> None:
    """Each Spark job costs a scheduling round trip whatever its size: a batch makes one."""
    for statement in (AGGREGATE, PROJECT):
        _, jobs = jobs_of(spark, f"one-job-{reduction}-{len(statement)}",
                          functools.partial(reduce, spark, statement, batch, tmp_path))
        assert len(jobs) == 1, statement


def test_a_batch_of_the_reductions_frame_goes_to_its_job_as_it_came(spark: SparkSession, batch: DataFrame,
                                                                     tmp_path: Path) -> None:
    """Each record's columns are the streaming query's own (``QueryRunner.reduction``), which
    Spark analyses once, when the query starts: a batch of them goes to its one job with no
    DataFrame made from it (each costs an analysis, 5-10 ms a step in every batch)."""
    frames = type(batch)
    made: list[int] = []
    init = frames.__init__

    def counted(self: DataFrame, *args: Any, **kwargs: Any) -> None:
        made.append(1)
        init(self, *args, **kwargs)
    for statement in (AGGREGATE, PROJECT):
        runner = runner_of(spark, statement, tmp_path)
        try:
            reduction = runner.reduction(batch)
            frames.__init__ = counted  # type: ignore[method-assign]
            try:
                slices = runner._reduced(reduction.frame, reduction)
            finally:
                frames.__init__ = init  # type: ignore[method-assign]
        finally:
            runner.loop.close()
        assert slices == runner._reduce(batch), statement  # the same slices as a batch reduced whole
        assert not made, statement


def test_a_partition_whose_task_left_the_query_is_set_aside(spark: SparkSession, batch: DataFrame,
                                                            tmp_path: Path) -> None:
    """A task that leaves a running query (its partition moved out) gets no slice of the
    batches after; the others get theirs as before."""
    for statement in (AGGREGATE, PROJECT):
        runner = runner_of(spark, statement, tmp_path)
        try:
            whole = runner._reduce(batch)
            runner.assigned = frozenset(runner.tasks)  # as ``start`` leaves it
            del runner.tasks[1]
            kept = runner._reduce(batch)
        finally:
            runner.loop.close()
        assert 1 in whole and kept == {p: piece for p, piece in whole.items() if p != 1}, statement


OVERFLOWING = "ab" * 5000
"""A value over which java.util.regex overflows a Spark task thread's stack matching ``(a|b)*``
(it recurses once or more per character of a repeated group: 2,000 characters do)."""


BACKTRACKING = "a" * 40 + "!"
"""A value over which java.util.regex backtracks without end matching ``^((a+)+)+b*$`` (Java's
memo of a greedy group's loop does not cover nested ones: 26 characters took 4 s)."""


@pytest.mark.parametrize("pattern, failing, reason", [
    ("^(a|b)*$", OVERFLOWING, "java.lang.StackOverflowError"),
    ("^((a+)+)+b*$", BACKTRACKING, "io.millpond.spark.Regexps$PatternTimeout: the pattern '^((a+)+)+b*$' took over 0.5 s "
                                   "on a text of 41 characters"),
], ids=["stack overflow", "backtracking"])
def test_a_record_whose_processing_fails_in_spark_every_time_is_set_aside_and_the_batch_goes_on(
        spark: SparkSession, tmp_path: Path, pattern: str, failing: str, reason: str) -> None:
    """A batch whose Spark job fails of one record, the same at every retry (a StackOverflowError,
    a REGEXP call over its time), is processed in parts, each committed in its partition's offset
    order, down to the records that fail alone: those go to the processing log with the error,
    every other record is processed as it would have been, and the session goes on (its task, not
    its JVM, failed). (A projection's, through Kafka: tests/e2e/test_stateless.py.)"""
    def area(text: str) -> bytes:
        return json.dumps({"AREA": text, "READING": 1}).encode()
    records: list[Record] = [(b"s1", area("aab"), 0, 0), (b"s1", area(failing), 0, 1), (b"s2", area("bx"), 0, 2),
                             (b"s1", area("ab"), 0, 3), (b"s3", area("ab"), 1, 6)]
    runner = runner_of(spark, "CREATE TABLE counted AS SELECT sensor, COUNT(*) AS n FROM r "
                              f"WHERE REGEXP_REPLACE(area, '{pattern}', '') = '' GROUP BY sensor", tmp_path)
    committed = processed(runner, spark, records)
    assert len(committed) > 1, "the batch was committed in parts"
    aggs = runner.tasks[0].aggregates  # type: ignore[attr-defined]
    for p, counts in {0: {b"s1": 2}, 1: {b"s3": 1}}.items():
        pieces = [s[p] for s in committed if p in s]
        offsets = [o for *_, q, o in records if q == p]
        assert pieces[0].first_offset == offsets[0] and pieces[-1].last_offset == offsets[-1]
        assert all(a.last_offset < b.first_offset for a, b in itertools.pairwise(pieces)), "in offset order"
        assert sum(s.count for s in pieces) == len(offsets)
        bad = [b for s in pieces for b in s.bad]
        assert [(b.offset, b.value) for b in bad] == [(o, area(failing).decode()) for _, v, q, o in records
                                                      if q == p and v == area(failing)]
        assert all(reason in b.reason for b in bad), bad
        totals: dict[bytes, int] = defaultdict(int)
        for piece in pieces:
            for key, (n,) in observe(piece, aggs).totals.items():
                totals[key] += n
        assert totals == counts, p
    assert driver_alive(spark) and spark.range(3).count() == 3

    # The record that failed the batch is of a partition whose task has left the query (the
    # batch computed it all the same): no record of the others is set aside, each is run alone first.
    records = [(b"s1", area("aab"), 0, 0), (b"s1", area("ab"), 0, 1), (b"s4", area(failing), 1, 0)]
    runner = runner_of(spark, "CREATE TABLE counted AS SELECT sensor, COUNT(*) AS n FROM r "
                              f"WHERE REGEXP_REPLACE(area, '{pattern}', '') = '' GROUP BY sensor", tmp_path)
    committed = processed(runner, spark, records, spans=[(0, 0, 2)])
    assert [(s[0].first_offset, s[0].last_offset, s[0].bad) for s in committed] == [(0, 0, []), (1, 1, [])]



def test_an_overflowed_tasks_error_records_no_more_frames_than_the_workers_jvm_keeps(spark: SparkSession) -> None:
    """A StackOverflowError records the JVM's frames at most (``STACK_TRACE_DEPTH``, where Java's
    default is 1,024): Spark logs each failed task's twice, and the worker reads its text to tell
    the failure (the tests' JVM options are the workers' with the JIT's first tier alone)."""
    with pytest.raises(proto.Py4JJavaError) as caught:
        spark.createDataFrame([(OVERFLOWING,)], "s string").selectExpr("regexp_replace(s, '(a|b)*', '')").collect()
    assert query_runner.fails_on_a_record(caught.value)
    traces = [len(run.splitlines()) for run in re.findall(r"(?:^\s+at .*\n)+", str(caught.value), re.MULTILINE)]
    assert 0 < max(traces) <= STACK_TRACE_DEPTH, traces

def processed(runner: QueryRunner, spark: SparkSession, records: list[Record],
              spans: list[query_runner.Span] | None = None) -> list[dict[int, Any]]:
    """The slices ``runner`` commits of ``records`` as a batch of its streaming query, in the
    order it commits them (its loop runs meanwhile, committing nothing). A part of the batch is
    read again from ``records`` (from Kafka in a worker); the batch's ``spans`` are its tasks'
    partitions' offsets, by default all of ``records``."""
    committed: list[dict[int, Any]] = []

    async def commit(slices: dict[int, Any]) -> None:
        committed.append(slices)

    def read_spans(part: list[query_runner.Span]) -> DataFrame:
        return _as_batch(spark, [r for r in records if any(p == r[2] and first <= r[3] < end for p, first, end in part)])
    runner._commit = commit  # type: ignore[method-assign]
    runner._read_spans = read_spans  # type: ignore[method-assign]
    offsets = defaultdict(list)
    for *_, partition, offset in records:
        offsets[partition].append(offset)
    runner._batch_spans = lambda batch_id: (  # type: ignore[method-assign]
        [(p, min(o), max(o) + 1) for p, o in sorted(offsets.items())] if spans is None else spans)
    runner._reduction = runner.reduction(_as_batch(spark, records))  # as ``start`` leaves it
    loop = threading.Thread(target=runner.loop.run_forever, daemon=True)
    loop.start()
    try:
        runner._process(runner._reduction.frame, 0)
    finally:
        runner.loop.call_soon_threadsafe(runner.loop.stop)
        loop.join(10)
        runner.loop.close()
    return committed

def test_a_batch_of_more_partitions_than_cores_runs_in_as_many_tasks_as_cores(
        spark: SparkSession, reduction: str, batch: DataFrame, tmp_path: Path) -> None:
    """A Kafka partition is a Spark task, and each task has a fixed cost: a batch of three
    partitions runs in one task on the one core, and reduces to what it does in three."""
    spread = batch.repartition(3, "partition")  # a shuffle, its reading stage of three tasks
    for statement in (AGGREGATE, PROJECT):
        got, jobs = jobs_of(spark, f"coalesced-{reduction}-{len(statement)}",
                            functools.partial(reduce, spark, statement, spread, tmp_path))
        assert got == reduce(spark, statement, batch, tmp_path)
        stages = [tasks for job in jobs for tasks in job]
        assert stages and max(stages) == 1, statement
    # No fewer tasks than the session's threads.
    runner = runner_of(spark, AGGREGATE, tmp_path)
    runner.cores = 3
    try:
        _, jobs = jobs_of(spark, f"not-coalesced-{reduction}", lambda: runner._reduce(spread))
    finally:
        runner.loop.close()
    assert max(tasks for job in jobs for tasks in job) == 3


def test_a_batch_of_as_many_partitions_as_cores_or_fewer_is_planned_as_one_of_more(
        spark: SparkSession, batch: DataFrame, tmp_path: Path) -> None:
    """A partition that moves in gets a Spark query of its own, often over that partition alone:
    its batches are planned as those of the stage's query over more partitions than cores
    (coalesced), so the code Spark generated and compiled for that query serves them too."""
    runner = runner_of(spark, AGGREGATE, tmp_path)
    runner.cores = 2
    plans: list[str] = []

    def planned(parsed: DataFrame, *_: Any) -> Reduction[Any]:
        plans.append(re.sub(r"#\d+L?", "", parsed._jdf.queryExecution().executedPlan().toString()))
        return Reduction(parsed, lambda batch, tasks: {})
    runner.kind = dataclasses.replace(runner.kind, reduction=planned)
    try:
        runner._reduce(batch)  # three partitions, three tasks
        runner.tasks = {0: runner.tasks[0]}  # a query of one moved partition
        runner._reduce(_as_batch(spark, [record for record in RECORDS if record[2] == 0]))
    finally:
        runner.loop.close()
    assert "Coalesce 2" in plans[0]
    assert plans[1] == plans[0]


_VALUES = st.one_of(
    st.none(),
    st.sampled_from([b"{", b"[1, 2", b"garbage", b"null", b'{"AREA": "a"}']),
    st.builds(lambda area, reading: json.dumps({"AREA": area, "READING": reading}).encode(),
              st.sampled_from("abc"), st.integers(-50, 50)),
)
_RECORDS = st.lists(
    st.tuples(st.integers(0, 2), st.one_of(st.none(), st.sampled_from([b"k0", b"k1", b"k2"])), _VALUES,
              st.integers(1, 3)),
    min_size=1, max_size=30,
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=_RECORDS)
def test_random_batches_reduce_to_the_reference(spark: SparkSession, reduction: str, tmp_path: Path,
                                                drawn: list[tuple[int, bytes | None, bytes | None, int]]) -> None:
    """Random batches (bad values, NULL keys, tombstones, gaps for transaction markers, several
    partitions) give the reference's slices under both kinds."""
    offsets = {0: 0, 1: 0, 2: 0}
    records: list[Record] = []
    for partition, key, value, gap in drawn:
        offsets[partition] += gap
        records.append((key, value, partition, offsets[partition]))
    frame = _as_batch(spark, records)
    for kind, statement in (("AGGREGATE", AGGREGATE), ("PROJECT", PROJECT)):
        got, want = reduce(spark, statement, frame, tmp_path), reference(records, kind)
        assert sorted(got) == sorted(want)
        for partition, expected in want.items():
            piece = got[partition]
            assert (piece.last_offset, piece.count, piece.bad, piece.records) == (
                expected.last_offset, expected.count, expected.bad, expected.records), (kind, partition)
            assert piece.totals.keys() == expected.totals.keys()
            for key, (count, total, mean) in expected.totals.items():
                assert piece.totals[key][:2] == (count, total)
                assert piece.totals[key][2] == pytest.approx(mean)


MIXED = ("CREATE TABLE m AS SELECT sensor, MIN(reading) AS lo, MAX(area) AS hi, COUNT(area) AS areas, "
         "SUM(reading) AS total FROM r WHERE reading IS NULL OR reading != 0 GROUP BY sensor")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=_RECORDS)
def test_arrow_and_spark_reduce_min_max_and_counts_alike(spark: SparkSession, tmp_path: Path,
                                                         drawn: list[tuple[int, bytes | None, bytes | None, int]]) -> None:
    """MIN and MAX of integers and strings, COUNT of a column and a WHERE, grouped by Arrow and
    by Spark's shuffle over the same random batch: the same slices, value for value."""
    records = [(key, value, partition, i) for i, (partition, key, value, _) in enumerate(drawn)]
    frame = _as_batch(spark, records)
    by_arrow = reduce(spark, MIXED, frame, tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reducers, "arrow_forms", lambda *_: None)
        by_spark = reduce(spark, MIXED, frame, tmp_path)
    assert by_arrow == by_spark


def test_arrow_groups_only_what_it_orders_and_sums_as_spark_does() -> None:
    meta = Metastore()
    meta.apply(parse_statement("CREATE STREAM x (k VARCHAR KEY, i INT, d DOUBLE, s VARCHAR, t TIMESTAMP) "
                               "WITH (kafka_topic='x', partitions=1, value_format='json')"), 0)

    def forms(select: str) -> list[tuple[str, ...]] | None:
        before = set(meta.queries)
        meta.apply(parse_statement(f"CREATE TABLE q{len(before)} AS SELECT k, {select} FROM x GROUP BY k"),
                   len(before) + 1)
        (query_id,) = set(meta.queries) - before
        query = meta.queries[query_id]
        types = {"i": IntegerType(), "d": DoubleType(), "s": StringType(), "t": TimestampType(), "1": IntegerType()}
        schema = StructType([StructField(f"a{n}", types[c.argument.strip("`").lower()])
                             for n, c in enumerate(query.plan.aggregates)])
        return reducers.arrow_forms(schema, query)

    assert forms("COUNT(*) AS n, SUM(i) AS a, AVG(d) AS b, MIN(i) AS c, MAX(s) AS e") == [
        ("count",), ("sum",), ("sum", "count"), ("min",), ("max",)]
    assert forms("MIN(d) AS a") is None, "Spark orders NaN above every number; Arrow skips it"
    assert forms("MAX(t) AS a") is None
    assert forms("COUNT(i) AS n, LATEST_BY_OFFSET(i) AS a") is None


# --- Names are data, never SQL ---------------------------------------------------------------

_INJECTION = "x STRING', map()) AS _v, raise_error('injected') AS _w, from_json('{}', 'y STRING"
"""A column name that, pasted into a quoted schema string, would close it and run the rest."""


def _quoted(name: str) -> str:
    return f'"{name}"' if '"' not in name else f"`{name}`"


def _weird_name_results(spark: SparkSession, name: str, tmp_path: Path) -> None:
    """A stream whose value column is called ``name`` decodes, filters, projects and groups by
    it as by any other name: the same slices as a reference computed in Python."""
    column = _quoted(name)
    literal = "'" + name.replace("'", "''") + "'"
    source = (f"CREATE STREAM r (sensor VARCHAR KEY, {column} VARCHAR, reading INT) "
              "WITH (kafka_topic='r', partitions=3, value_format='json')")
    project = (f"CREATE STREAM hot AS SELECT sensor, {column}, reading * 2 AS {_quoted(name + '2')} FROM r "
               f"WHERE reading > 10 AND {column} != {literal}")
    aggregate = f"CREATE TABLE t AS SELECT sensor, COUNT({column}) AS n FROM r WHERE {column} != {literal} GROUP BY sensor"
    values = [("s1", name, 20), ("s1", "other", 30), ("s2", "other", 5), ("s3", name, 40)]
    records: list[Record] = [(k.encode(), json.dumps({name: v, "READING": n}).encode(), 0, i)
                             for i, (k, v, n) in enumerate(values)]
    frame = _as_batch(spark, records)
    meta = Metastore()
    meta.apply(parse_statement(source), 0)
    for statement, check in ((project, "project"), (aggregate, "aggregate")):
        got = _reduce_with(spark, meta, statement, frame, tmp_path)
        if check == "project":
            assert got.records == [(b"s1", {name: "other", name + "2": 60})]
        else:
            assert got.totals == {b"s1": (1,), b"s2": (1,)}


def _reduce_with(spark: SparkSession, meta: Metastore, statement: str, frame: DataFrame, tmp_path: Path) -> Slice:
    """The slice of partition 0 that ``statement``'s reducer gives for ``frame``."""
    before = set(meta.queries)
    meta.apply(parse_statement(statement), len(before) + 1)
    (query_id,) = set(meta.queries) - before
    query = meta.queries[query_id]
    source, sink = meta.sources[query.source], meta.sources[query.sink]
    settings = Settings(worker_id="reducer-test", spark_master="local[1]", state_dir=tmp_path)
    task_class: type[Task] = AggregationTask if query.plan.aggregates else ProjectionTask
    tasks = {p: task_class(settings, query, source, sink, p) for p in range(source.partitions)}
    aggs = tasks[0].aggregates if isinstance(tasks[0], AggregationTask) else []
    loop = asyncio.new_event_loop()
    runner = QueryRunner(spark, settings, query, source, sink, tasks, loop)
    try:
        return observe(runner._reduce(frame)[0], aggs)
    finally:
        runner.stop()
        loop.close()


def test_a_column_name_cannot_inject_spark_sql(spark: SparkSession, reduction: str, tmp_path: Path) -> None:
    _weird_name_results(spark, _INJECTION, tmp_path)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(alphabet="ab'`\"\\\n ,.:<>()", min_size=1, max_size=12).filter(
    lambda n: not ('"' in n and "`" in n) and n.upper() not in ("READING", "SENSOR") and n.strip()))
def test_names_with_quotes_backticks_backslashes_and_newlines(spark: SparkSession, tmp_path: Path, name: str) -> None:
    _weird_name_results(spark, name, tmp_path)


def _left_side_slices(spark: SparkSession, tmp_path: Path, statements: tuple[str, ...],
                      records: list[tuple[bytes | None, bytes | None, int, int]],
                      stamp: datetime.datetime | None = None) -> dict[int, Any]:
    """The slices the left side stage of the join into LQ (``statements``: streams L and Q,
    then the join) makes of ``records`` (key, value, partition, offset) stamped ``stamp``."""
    return stage_slices(spark, tmp_path, statements, "LQ", 0, records, stamp)


def stage_slices(spark: SparkSession, tmp_path: Path, statements: tuple[str, ...], sink: str, stage: int,
                 records: list[tuple[bytes | None, bytes | None, int, int]],
                 stamp: datetime.datetime | None = None) -> dict[int, Any]:
    """The slices stage ``stage`` of the query into ``sink`` (``statements`` declare its sources,
    then create it) makes of ``records`` (key, value, partition, offset) stamped ``stamp``."""
    return stage_batches(spark, tmp_path, statements, sink, stage, [records], stamp)[0]


def split_batches(records: list[T], cuts: list[int]) -> list[list[T]]:
    """``records`` (in offset order per partition) cut into consecutive batches at ``cuts``."""
    bounds = sorted({0, len(records), *(c % (len(records) + 1) for c in cuts)})
    return [records[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def stage_batches(spark: SparkSession, tmp_path: Path, statements: tuple[str, ...], sink: str, stage: int,
                  batches: list[list[tuple[bytes | None, bytes | None, int, int]]],
                  stamp: datetime.datetime | None = None) -> list[dict[int, Any]]:
    """``stage_slices`` of each batch in turn, by one runner."""
    meta = applied(statements)
    query = next(q for q in meta.queries.values() if q.sink == sink)
    step = stages(query, meta.source(query.source), meta.source(sink), "svc")[stage]
    settings = Settings(worker_id="reducer-test", spark_master="local[1]", state_dir=tmp_path)
    tasks = {p: new_task(settings, step, p) for p in range(step.partitions)}
    loop = asyncio.new_event_loop()
    runner = QueryRunner(spark, settings, step.query, step.source, step.sink, dict(tasks), loop)
    try:
        return [runner._reduce(spark.createDataFrame([(k, v, step.source.topic, p, o, stamp, 0)
                                                      for k, v, p, o in records], KAFKA_ROW))
                for records in batches]
    finally:
        runner.stop()
        loop.close()


TABLE_AGGREGATION = (
    "CREATE TABLE pages (page VARCHAR PRIMARY KEY, owner VARCHAR, weight INT) "
    "WITH (kafka_topic='pages', partitions=2, value_format='json')",
    "CREATE TABLE owners AS SELECT owner, COUNT(*) AS n, SUM(weight) AS total, AVG(weight) AS mean FROM pages "
    "WHERE weight >= 0 GROUP BY owner")


def test_a_tables_changed_rows_regroup_by_their_new_group_or_leave_it(spark: SparkSession, tmp_path: Path) -> None:
    """A table aggregation's regroup stage: each table record with its offset and table key,
    keyed by its group with the regrouped value (``_SIGN`` 1 first, then every column); a
    tombstone of the table key for a deleted row, one the WHERE drops and one whose group is
    NULL (logged); a malformed record logged and left out."""
    slices = stage_slices(spark, tmp_path, TABLE_AGGREGATION, "OWNERS", 0, [
        (b"p1", b'{"OWNER": "a", "WEIGHT": 5}', 0, 0),
        (b"p2", b'{"OWNER": null, "WEIGHT": 5}', 0, 1),
        (b"p3", b'{"OWNER": "b", "WEIGHT": -1}', 0, 2),
        (b"p1", None, 0, 3),
        (b"p4", b"oops", 0, 4),
        (b"p5", b'{"OWNER": "b", "WEIGHT": 2}', 1, 7)], datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC))
    first, second = slices[0], slices[1]
    assert first.inputs == [(0, b"p1"), (1, b"p2"), (2, b"p3"), (3, b"p1")]
    assert [(key, None if value is None else json.loads(value)) for key, value in first.records] == [
        (b"a", {"_SIGN": 1, "PAGE": "p1", "OWNER": "a", "WEIGHT": 5, "_INPUT_ROWTIME": 1767312000000,
                "_CHANGED_ROWTIME": 1767312000000}),
        (b"p2", None), (b"p3", None), (b"p1", None)]
    assert all(value is None or value.startswith(b'{"_SIGN":1,') for _, value in first.records)
    assert sorted((b.offset, "NULL" in b.reason) for b in first.bad) == [(1, True), (4, False)]
    assert second.inputs == [(7, b"p5")] and second.records[0][0] == b"b"


def test_a_tables_rows_carry_the_partition_and_offset_of_the_record_that_wrote_them(spark: SparkSession,
                                                                                      tmp_path: Path) -> None:
    """ROWPARTITION and ROWOFFSET over a table: a projection's rows have those of the record that
    wrote each row; a GROUP BY's regroup stage carries them in each regrouped row (its
    retraction, the stored row, takes back what that row added)."""
    records = [(b"p1", b'{"OWNER": "a", "WEIGHT": 5}', 1, 40), (b"p2", b'{"OWNER": "b", "WEIGHT": 6}', 1, 41)]
    projected = stage_slices(spark, tmp_path, (TABLE_AGGREGATION[0], "CREATE TABLE placed AS SELECT page, weight, "
                                               "ROWPARTITION AS p, ROWOFFSET AS o FROM pages"), "PLACED", 0, records)
    assert [(k, json.loads(v or b"null")) for k, v in projected[1].records] == [
        (b"p1", {"WEIGHT": 5, "P": 1, "O": 40}), (b"p2", {"WEIGHT": 6, "P": 1, "O": 41})]
    regrouped = stage_slices(spark, tmp_path, (TABLE_AGGREGATION[0], "CREATE TABLE offsets AS SELECT owner, "
                                               "SUM(ROWOFFSET) AS o FROM pages GROUP BY owner"), "OFFSETS", 0, records)
    assert [(k, json.loads(v or b"null")["_INPUT_ROWOFFSET"]) for k, v in regrouped[1].records] == [(b"a", 40), (b"b", 41)]


def test_regrouped_rows_add_to_or_subtract_from_their_group(spark: SparkSession, tmp_path: Path) -> None:
    """A table aggregation's aggregate stage: a regrouped row adds to its group's COUNT, SUM
    and AVG, a retracted one (``_SIGN`` -1) takes its values back out."""
    def row(sign: int, weight: int | None) -> bytes:
        return json.dumps({"_SIGN": sign, "PAGE": "p", "OWNER": "x", "WEIGHT": weight, "_INPUT_ROWTIME": 0},
                          separators=(",", ":")).encode()

    least = -2**31  # the least INT: taking it back must not wrap
    slices = stage_slices(spark, tmp_path, TABLE_AGGREGATION, "OWNERS", 1, [
        (b"a", row(1, 5), 0, 0), (b"a", row(1, 7), 0, 1), (b"a", row(-1, 5), 0, 2), (b"a", row(1, None), 0, 3),
        (b"b", row(1, 4), 1, 0), (b"b", row(-1, 4), 1, 1), (b"c", row(-1, 3), 1, 2),
        (b"d", row(1, least), 1, 3), (b"d", row(1, least), 1, 4), (b"d", row(-1, least), 1, 5),
        (b"e", row(-1, None), 1, 6)])
    aggs = [aggregates.require(name) for name in ("COUNT", "SUM", "AVG")]
    totals = {key: [agg.finalize(state) for agg, state in zip(aggs, partial, strict=True)]
              for piece in slices.values() for key, partial in piece.partials}
    assert totals == {b"a": [2, 7, 7.0], b"b": [0, 0, None], b"c": [-1, -3, 3.0], b"d": [1, least, float(least)],
                      b"e": [-1, None, None]}  # COUNT(*) counts a row whose WEIGHT is NULL


def test_a_retraction_takes_back_its_rows_own_rowtime_and_stamps_the_group_with_its_change(spark: SparkSession,
                                                                                            tmp_path: Path) -> None:
    """A row added to a group at 1 s leaves it at 5 s: its retraction (``regrouping.retracted``)
    keeps the row's own ROWTIME, so SUM(ROWTIME) takes back exactly what it added, and says when
    it left, which stamps the group's new result (Kafka Streams' table aggregation)."""
    statements = (TABLE_AGGREGATION[0], "CREATE TABLE stamps AS SELECT owner, COUNT(*) AS n, SUM(ROWTIME) AS s "
                                        "FROM pages GROUP BY owner")
    added = json.dumps({"_SIGN": 1, "PAGE": "p", "OWNER": "x", "WEIGHT": 1, "_INPUT_ROWTIME": 1_000,
                        "_CHANGED_ROWTIME": 1_000}, separators=(",", ":")).encode()
    slices = stage_slices(spark, tmp_path, statements, "STAMPS", 1, [
        (b"x", added, 0, 0), (b"x", retracted(added, 5_000), 0, 1)])
    ((key, partial),) = slices[0].partials
    assert key == b"x" and [aggregates.require(n).finalize(p) for n, p in zip(("COUNT", "SUM"), partial, strict=True)] == [0, 0]
    assert slices[0].times == {b"x": 5_000}


def test_a_tables_collected_lists_take_back_retracted_rows_in_input_order(spark: SparkSession,
                                                                         tmp_path: Path) -> None:
    """COLLECT_LIST over a table: the partial lists each regrouped row's sign and value by
    input offset (whatever order Spark meets them in), so a retraction takes back the value
    added before it, NULLs included."""
    def row(sign: int, page: str, weight: int | None) -> bytes:
        return json.dumps({"_SIGN": sign, "PAGE": page, "OWNER": "x", "WEIGHT": weight, "_INPUT_ROWTIME": 0},
                          separators=(",", ":")).encode()

    slices = stage_slices(spark, tmp_path, (
        TABLE_AGGREGATION[0],
        "CREATE TABLE owner_pages AS SELECT owner, COLLECT_LIST(page) AS pages, COLLECT_LIST(weight) AS weights, "
        "HISTOGRAM(page) AS counted, STDDEV_SAMP(weight) AS spread, CORRELATION(weight, weight * 2) AS paired "
        "FROM pages GROUP BY owner"), "OWNER_PAGES", 1, [
        (b"a", row(1, "p2", None), 0, 3), (b"a", row(1, "p1", 5), 0, 0), (b"a", row(-1, "p1", 5), 0, 2),
        (b"a", row(1, "p1", 6), 0, 1), (b"b", row(-1, "p9", 1), 1, 0)])
    lists = [aggregates.require("COLLECT_LIST").merger(signed=True)] * 2 + [
        aggregates.require(name).merger(signed=True) for name in ("HISTOGRAM", "STDDEV_SAMP", "CORRELATION")]
    folded = {key: [fold(None, state) for fold, state in zip(lists, partial, strict=True)]
              for piece in slices.values() for key, partial in piece.partials}
    # p1 added (5), p1 added again (6), the first p1 (5) taken back as its last occurrence, p2 added;
    # the weights' moments: 5 and 6 added, 5 taken back, 6 left (b's 1 was never added here); so
    # the pairs' co-moments ((5, 10) and (6, 12), then (5, 10) out; p2's pair holds no weight).
    assert folded == {b"a": [[["p1", "p2"]], [[6, None]], [{"p1": 1, "p2": 1}], [1, 6.0, 0.0],
                             [1, 6.0, 12.0, 0.0, 0.0, 0.0]],
                      b"b": [[[]], [[]], [{}], [0, None, None], [0, None, None, None, None, None]]}


def test_bytes_aggregate_as_base64_text_and_come_back_as_bytes(spark: SparkSession, tmp_path: Path) -> None:
    """LATEST_BY_OFFSET, EARLIEST_BY_OFFSET and COLLECT_LIST of BYTES: the state keeps each
    value as base64 text (JSON holds no bytes), and the table's row has the bytes back."""
    statements = (
        "CREATE STREAM blobs (id VARCHAR KEY, data BYTES) WITH (kafka_topic='blobs', partitions=1, value_format='json')",
        "CREATE TABLE blob_rows AS SELECT id, LATEST_BY_OFFSET(data) AS last, EARLIEST_BY_OFFSET(data) AS first, "
        "COLLECT_LIST(data) AS every FROM blobs GROUP BY id")
    slices = stage_slices(spark, tmp_path, statements, "BLOB_ROWS", 0, [
        (b"a", b'{"DATA": "AAE="}', 0, 0), (b"a", b'{"DATA": null}', 0, 1), (b"a", b'{"DATA": "/w=="}', 0, 2)])
    ((key, partial),) = slices[0].partials
    json.loads(encode_state(partial))  # a state the store and the changelog can keep
    meta = applied(statements)
    query = next(q for q in meta.queries.values() if q.sink == "BLOB_ROWS")
    assert group_rows(query, meta.source("BLOB_ROWS"))(key, partial) == [
        "a", b"\xff", b"\x00\x01", [b"\x00\x01", None, b"\xff"]]


def test_bytes_written_to_a_delimited_value_are_their_text_or_logged(spark: SparkSession, tmp_path: Path) -> None:
    """A DELIMITED field holds BYTES as their UTF-8 text (as it is read): a projection writes
    them so (it wrote Python's repr, b'...'); bytes that are not UTF-8 go to the processing
    log, and the batch goes on."""
    statements = (
        "CREATE STREAM blobs (id VARCHAR KEY, data BYTES) WITH (kafka_topic='blobs', partitions=1, value_format='json')",
        "CREATE STREAM blob_text WITH (value_format='delimited') AS SELECT * FROM blobs")
    (piece,) = stage_slices(spark, tmp_path, statements, "BLOB_TEXT", 0, [
        (b"a", b'{"DATA": "YSxi"}', 0, 0), (b"b", b'{"DATA": "/w=="}', 0, 1), (b"c", b'{"DATA": null}', 0, 2)]).values()
    assert piece.records == [(b"a", b'"a,b"'), (b"c", b'""')]  # (a lone empty field is quoted: NULL)
    assert [(b.offset, b.reason) for b in piece.bad] == [
        (1, "the row cannot be written as DELIMITED: column DATA holds bytes that are not UTF-8 text, which is all a "
            "DELIMITED field holds: write the result as JSON (BYTES as base64)")]


def test_delimited_values_are_read_with_rfc_4180_quoting_as_python_writes_them(spark: SparkSession,
                                                                               tmp_path: Path) -> None:
    """Quotes doubled inside a quoted field, line breaks quoted, a backslash as it is: the
    persistent query reads what Millpond's writer (and ksqlDB's) writes, as the push and the
    stores read it (Spark's default escape is a backslash: it kept '"a""b"' whole)."""
    statements = (
        "CREATE STREAM lines (id VARCHAR KEY, s VARCHAR, n INT) WITH (kafka_topic='lines', partitions=1, "
        "value_format='delimited')",
        "CREATE STREAM lines_json WITH (value_format='json') AS SELECT * FROM lines")
    texts = ['say "hi"', "line1\nline2", "a\\b", "a,b"]
    written = [serialize_value(["S", "N"], [text, i], "DELIMITED") for i, text in enumerate(texts)]
    (piece,) = stage_slices(spark, tmp_path, statements, "LINES_JSON", 0,
                            [(b"k", value, 0, offset) for offset, value in enumerate(written)]).values()
    assert [json.loads(value) for _, value in piece.records] == [{"S": t, "N": i} for i, t in enumerate(texts)]
    assert not piece.bad


def test_by_offset_aggregates_skip_nulls_and_keep_n_values_of_any_type(spark: SparkSession, tmp_path: Path) -> None:
    """LATEST_BY_OFFSET and EARLIEST_BY_OFFSET as ksqlDB's, through Spark to the row, records
    met out of offset order: a NULL skipped unless told not to (all NULL: NULL), and N values
    in offset order, of a MAP too (ordered by offset alone; Spark orders no map)."""
    statements = (
        "CREATE STREAM maps (id VARCHAR KEY, attrs MAP<VARCHAR, INT>, n INT) "
        "WITH (kafka_topic='maps', partitions=1, value_format='json')",
        "CREATE TABLE map_rows AS SELECT id, LATEST_BY_OFFSET(n) AS last, LATEST_BY_OFFSET(n, false) AS last_any, "
        "EARLIEST_BY_OFFSET(n) AS first, LATEST_BY_OFFSET(attrs, 2) AS maps, LATEST_BY_OFFSET(attrs, 2, false) AS "
        "maps_any, EARLIEST_BY_OFFSET(n, 2) AS first2, EARLIEST_BY_OFFSET(n, 2, false) AS first2_any "
        "FROM maps GROUP BY id")
    values = [({"a": 1}, 5), (None, None), ({"b": 2}, 7), ({"c": 3}, None), (None, None)]
    records = [(b"k", json.dumps({"ATTRS": a, "N": n}).encode(), 0, o) for o, (a, n) in enumerate(values)]
    records.append((b"z", b'{"N": null}', 0, 5))
    slices = stage_slices(spark, tmp_path, statements, "MAP_ROWS", 0, records[::-1])
    meta = applied(statements)
    query = next(q for q in meta.queries.values() if q.sink == "MAP_ROWS")
    rows = {key: group_rows(query, meta.source("MAP_ROWS"))(key, partial) for key, partial in slices[0].partials}
    assert rows == {b"k": ["k", 7, None, 5, [{"b": 2}, {"c": 3}], [{"c": 3}, None], [5, 7], [5, None]],
                    b"z": ["z", None, None, None, [], [None], [], [None]]}


@pytest.mark.parametrize("cuts", [[], [2], [1, 2, 3, 4]])
def test_collect_set_and_attr_of_zeros_do_not_depend_on_where_batches_are_cut(spark: SparkSession, tmp_path: Path,
                                                                               cuts: list[int]) -> None:
    """COLLECT_SET and ATTR find -0.0 and 0.0 one value, in a batch (Spark's ``array_distinct``,
    which writes it 0.0) and across batches (their merges) alike."""
    statements = ("CREATE STREAM zs (id VARCHAR KEY, x DOUBLE) WITH (kafka_topic='zs', partitions=1, value_format='json')",
                  "CREATE TABLE z AS SELECT id, COLLECT_SET(x) AS xs, ATTR(x) AS one FROM zs GROUP BY id")
    values = [-0.0, 1.5, 0.0, -0.0, 1.5]
    records = [(b"k", json.dumps({"X": x}).encode(), 0, o) for o, x in enumerate(values)]
    state: list[Any] | None = None
    aggs = [aggregates.AGGREGATES["COLLECT_SET"], aggregates.AGGREGATES["ATTR"]]
    for piece in stage_batches(spark, tmp_path, statements, "Z", 0, split_batches(records, cuts)):
        ((_, partial),) = piece[0].partials
        state = partial if state is None else [a.merge(o, n) for a, o, n in zip(aggs, state, partial, strict=True)]
    assert state is not None
    xs, one = (a.finalize(s) for a, s in zip(aggs, state, strict=True))
    assert xs == [0.0, 1.5] and math.copysign(1, xs[0]) == 1 and one is None


PLACED_SOURCE = ("CREATE STREAM zs (id VARCHAR KEY, area VARCHAR) WITH (kafka_topic='zs', partitions=2, "
                 "value_format='json')")


def test_rowpartition_and_rowoffset_are_each_records_and_behind_a_repartition_the_input_records(
        spark: SparkSession, tmp_path: Path) -> None:
    """A projection reads its input record's partition and offset; a GROUP BY's repartition
    stage writes them beside the record (the WHERE reads them there too), and the aggregation
    stage reads those, not the repartition topic's own."""
    records = [(b"a", b'{"AREA": "x"}', 1, 40), (b"b", b'{"AREA": "x"}', 1, 41), (b"c", b'{"AREA": "y"}', 0, 7)]
    projected = stage_slices(spark, tmp_path, (PLACED_SOURCE, "CREATE STREAM placed AS SELECT id, ROWPARTITION AS p, "
                                               "ROWOFFSET AS o FROM zs WHERE ROWOFFSET > 7"), "PLACED", 0, records)
    assert [(k, json.loads(v)) for k, v in projected[1].records] == [(b"a", {"P": 1, "O": 40}), (b"b", {"P": 1, "O": 41})]
    assert not projected[0].records

    statements = (PLACED_SOURCE, "CREATE TABLE lasts AS SELECT area, MAX(ROWOFFSET) AS last, MAX(ROWPARTITION) AS p "
                                 "FROM zs WHERE ROWOFFSET < 41 GROUP BY area")
    rekeyed = stage_slices(spark, tmp_path, statements, "LASTS", 0, records)
    written = sorted((json.loads(v) for piece in rekeyed.values() for _, v in piece.records), key=lambda w: w["AREA"])
    assert [(w["AREA"], w["_INPUT_ROWPARTITION"], w["_INPUT_ROWOFFSET"]) for w in written] == [("x", 1, 40), ("y", 0, 7)]
    # The aggregation stage reads the repartition topic: what it carried, at offsets of its own.
    (aggregated,) = stage_slices(spark, tmp_path, statements, "LASTS", 1, [
        (w["AREA"].encode(), json.dumps(w).encode(), 0, offset) for offset, w in enumerate(written)]).values()
    assert sorted(aggregated.partials) == [(b"x", [[40], [1]]), (b"y", [[7], [0]])]


def test_a_tables_json_key_regroups_as_one_row_however_it_is_spelled(spark: SparkSession, tmp_path: Path) -> None:
    """A table keyed by several columns: the regroup stage keys its store by the key as the
    table's own store writes it, so a row written with spaces and without is one row, and one
    whose key's fields are in another case (found as a value's columns are, as ksqlDB finds
    them); the copies' Python reading of the key finds them alike."""
    slices = stage_slices(spark, tmp_path, (
        "CREATE TABLE sales (region VARCHAR PRIMARY KEY, shop INT PRIMARY KEY, amount INT) "
        "WITH (kafka_topic='sales', partitions=1, value_format='json', key_format='json')",
        "CREATE TABLE per_region AS SELECT region, COUNT(*) AS n FROM sales GROUP BY region"), "PER_REGION", 0, [
        (b'{"REGION": "eu", "SHOP": 1}', b'{"AMOUNT": 5}', 0, 0),
        (b'{"REGION":"eu","SHOP":1}', b'{"AMOUNT": 6}', 0, 1),
        (b'{"SHOP":1,"REGION":"eu"}', None, 0, 2),
        (b'{"REGION": 3}', b'{"AMOUNT": 7}', 0, 3),
        (b'{"region": "eu", "Shop": 1}', b'{"AMOUNT": 8}', 0, 4)])
    piece = slices[0]
    assert [key for _, key in piece.inputs] == [b'{"REGION":"eu","SHOP":1}'] * 4
    assert [b.offset for b in piece.bad] == [3]
    keys = [Column("REGION", SqlType("VARCHAR"), key=True), Column("shop", SqlType("INT"), key=True)]
    assert key_decoder(keys)(b'{"region": "eu", "SHOP": 1, "Shop": 2}') == ["eu", None]  # a quoted name as written only


def test_a_stream_join_side_copies_records_as_they_are_with_their_event_time(spark: SparkSession,
                                                                             tmp_path: Path) -> None:
    slices = _left_side_slices(spark, tmp_path, (
        "CREATE STREAM l (k VARCHAR KEY, ts BIGINT, x INT) "
        "WITH (kafka_topic='l', partitions=2, value_format='json', timestamp='ts')",
        "CREATE STREAM q (k VARCHAR KEY, y INT) WITH (kafka_topic='q', partitions=2, value_format='json')",
        "CREATE STREAM lq AS SELECT l.k, l.x, q.y FROM l JOIN q WITHIN 1 SECOND ON l.k = q.k"), [
        (b"a", b'{"TS": 1000, "X": 1}', 0, 4),
        (b"a", b'{"X": 2}', 0, 5),  # no event time: logged
        (b"b", None, 0, 6),  # a tombstone: copied (the join passes over it)
        (None, b'{"TS": 5, "X": 3}', 1, 2),  # no key: logged
        (b"c", b'{"TS": 7, "X": 4, "EXTRA": true}', 1, 3),  # copied byte for byte
    ])
    assert {p: s.records for p, s in slices.items()} == {
        0: [(4, b"a", b'{"TS": 1000, "X": 1}', 1000), (6, b"b", None, None)],
        1: [(3, b"c", b'{"TS": 7, "X": 4, "EXTRA": true}', 7)]}
    assert {p: [(b.offset, b.reason.split(":")[0]) for b in s.bad] for p, s in slices.items()} == {
        0: [(5, "record has no event time")], 1: [(2, "record has no key, or one that is not UTF-8 text")]}


def test_a_stream_joined_on_another_column_is_rekeyed_by_it_as_its_side_copies_it(spark: SparkSession,
                                                                                  tmp_path: Path) -> None:
    slices = _left_side_slices(spark, tmp_path, (
        "CREATE STREAM l (k VARCHAR KEY, g INT, x INT) WITH (kafka_topic='l', partitions=2, value_format='json')",
        "CREATE STREAM q (g INT, y INT) WITH (kafka_topic='q', partitions=2, value_format='json')",
        "CREATE STREAM lq AS SELECT q.g, l.x, q.y FROM l JOIN q WITHIN 1 SECOND ON l.g = q.g"), [
        (b"a", b'{"G": 7, "X": 1}', 0, 4),
        (b"a", b'{"X": 2}', 0, 5),  # no join column: logged
        (b"b", None, 0, 6),  # a tombstone: joins nothing, passed over
        (None, b'{"G": -1, "X": 3}', 1, 2),  # no key of its own: the join column keys it
        (b"c", b'{"G": "seven"}', 1, 3),  # not its declared types: logged
    ], datetime.datetime.fromtimestamp(1_700_000_000, datetime.UTC))
    assert {p: [r[:3] for r in s.records] for p, s in slices.items()} == {
        0: [(4, rekeyed(struct.pack(">i", 7), b"a"), b'{"G": 7, "X": 1}')],
        1: [(2, rekeyed(struct.pack(">i", -1), None), b'{"G": -1, "X": 3}')]}
    assert split_rekeyed(slices[0].records[0][1]) == (struct.pack(">i", 7), b"a")
    assert slices[0].records[0][3] == 1_700_000_000_000  # the record's time: q has no TIMESTAMP
    assert {p: [(b.offset, b.reason.split(" of ")[0]) for b in s.bad] for p, s in slices.items()} == {
        0: [(5, "record has no key, or one that is not UTF-8 text")], 1: [(3, "value is not JSON")]}


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ints=st.lists(st.integers(-2**31, 2**31 - 1), min_size=1, max_size=30),
       bigs=st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=30),
       doubles=st.lists(st.floats(allow_nan=False), min_size=1, max_size=30))
def test_numeric_keys_decode_in_spark_to_the_values_java_serialized(
        spark: SparkSession, ints: list[int], bigs: list[int], doubles: list[float]) -> None:
    for type_, values in (("INT", ints), ("BIGINT", bigs), ("DOUBLE", doubles)):
        frame = spark.createDataFrame([(serialize_key(v, SqlType(type_)),) for v in values] + [(b"\x01\x02",)],
                                      "_key binary")
        decoded = [r[0] for r in frame.selectExpr(reducers.KEY_DECODERS[type_]).collect()]
        assert decoded == [*values, None], type_  # a key of the wrong length is NULL


def declared_table_slice(spark: SparkSession, tmp_path: Path, columns: str,
                         records: list[tuple[bytes, bytes]], value_format: str = "json") -> tuple[Any, Any]:
    """Table T (``columns``, JSON or ``value_format``, one partition) and the slice its reducer
    makes of ``records`` (key, value) at offsets 0, 1, ...; every stored state checked to be JSON."""
    meta = Metastore()
    meta.apply(parse_statement(f"CREATE TABLE t ({columns}) WITH (kafka_topic='t', partitions=1, "
                               f"value_format='{value_format}')"), 0)
    (query,) = meta.queries.values()
    table = meta.source("T")
    settings = Settings(worker_id="reducer-test", spark_master="local[1]", state_dir=tmp_path)
    tasks = {0: TableTask(settings, query, table, table, 0)}
    frame = spark.createDataFrame([(key, value, "t", 0, i, None, 0) for i, (key, value) in enumerate(records)], KAFKA_ROW)
    loop = asyncio.new_event_loop()
    runner = QueryRunner(spark, settings, query, table, table, dict(tasks), loop)
    try:
        (piece,) = runner._reduce(frame).values()
    finally:
        runner.stop()
        loop.close()
    for _, state in piece.latest:  # (its text read back and written again: NaN is not equal to itself)
        assert state is None or encode_state(json.loads(encode_state(state))) == encode_state(state)
    return table, piece


def test_a_number_key_of_another_width_goes_to_the_processing_log_on_every_reader(spark: SparkSession,
                                                                                  tmp_path: Path) -> None:
    """A KAFKA-format INT key is 4 bytes (Java's IntegerSerializer): a record whose key is not
    does not deserialize, and goes to the processing log (as ksqlDB logs it), from the active
    task's Spark reducer and from a copy's Python reader alike; it was stored under its raw
    bytes, which no pull could decode (a scan of the table failed on it)."""
    records: list[tuple[bytes, bytes | None]] = [
        (serialize_key(7, SqlType("INT")), b'{"V": 1}'), (b"\x00\x07", b'{"V": 2}'),
        (serialize_key(8, SqlType("BIGINT")), b'{"V": 3}'), (b"\x00\x07", None)]  # a tombstone of such a key too
    table, piece = declared_table_slice(spark, tmp_path, "id INT PRIMARY KEY, v INT", records)  # type: ignore[arg-type]
    assert [(key, state) for key, state in piece.latest] == [(serialize_key(7, SqlType("INT")), [1])]
    reason = "record has no key, or one that is not a KAFKA-format INT (4 bytes)"
    assert [(b.offset, b.reason) for b in piece.bad] == [(1, reason), (2, reason), (3, reason)]
    copy = TableRecords(table)
    assert [copy.read(key, value) for key, value in records] == [
        (serialize_key(7, SqlType("INT")), [1]), LeftOut(reason, "\x00\x07"), LeftOut(reason, records[2][0].decode()),
        LeftOut(reason, "\x00\x07")]


def test_a_varchar_key_that_is_not_utf8_goes_to_the_processing_log_on_every_reader(spark: SparkSession,
                                                                                   tmp_path: Path) -> None:
    """A store keeps a key's bytes and a pull reads them back as the column: bytes that are not
    UTF-8 text cannot be a VARCHAR key (two of them would read as one string, and no pull could
    name either), so the record goes to the processing log, from Spark and a copy's reader alike."""
    records = [(b"a\xffb", b'{"V": 1}'), (b"ok", b'{"V": 2}')]
    table, piece = declared_table_slice(spark, tmp_path, "id VARCHAR PRIMARY KEY, v INT", records)
    reason = "record has no key, or one that is not UTF-8 text"
    assert piece.latest == [(b"ok", [2])] and [(b.offset, b.reason) for b in piece.bad] == [(0, reason)]
    assert [TableRecords(table).read(key, value) for key, value in records] == [LeftOut(reason, "a\ufffdb"),
                                                                                 (b"ok", [2])]


def declared_table_row(spark: SparkSession, tmp_path: Path, columns: str, value: bytes) -> tuple[Any, bytes, Any]:
    """Table T (``columns``, JSON, one partition) and the stored key and state its reducer
    makes of one record of ``value`` keyed ``k``."""
    table, piece = declared_table_slice(spark, tmp_path, columns, [(b"k", value)])
    ((key, state),) = piece.latest
    return table, key, state


def test_timestamps_read_as_epoch_milliseconds_or_iso_text_and_others_are_logged(spark: SparkSession,
                                                                                tmp_path: Path) -> None:
    """A TIMESTAMP given as a number (or text of digits alone) is epoch milliseconds, ksqlDB's
    JSON form (Spark's reader took seconds, and a time of today in milliseconds, past year 9999,
    failed every batch of the table from then on); ISO text reads as before, up to the end of
    year 9999. Text that does not read, a time past year 9999 and a number too large for
    milliseconds make the record a bad one (processing log), and the batch goes on."""
    table, piece = declared_table_slice(spark, tmp_path, "id VARCHAR PRIMARY KEY, t TIMESTAMP, n INT", [
        (b"a", b'{"T": 1700000000123, "N": 1}'), (b"b", b'{"T": "2026-01-02T03:04:05.678", "N": 2}'),
        (b"c", b'{"T": "not a time", "N": 3}'), (b"d", b'{"T": 999999999999999, "N": 4}'),
        (b"e", b'{"T": null, "N": 5}'), (b"f", b'{"T": "2026-01-02 03:04:05", "N": 6}'), (b"g", b'{"T": -1000}'),
        (b"h", b'{"T": 99999999999999999, "N": 8}'), (b"i", b'{"T": "9999-12-31T23:59:59.999"}'),
        (b"j", b'{"T": "1700000000123"}')])
    rows = {key: table_rows(table)(key, state) for key, state in piece.latest}
    assert rows == {b"a": ["a", "2023-11-14T22:13:20.123000", 1], b"b": ["b", "2026-01-02T03:04:05.678000", 2],
                    b"e": ["e", None, 5], b"f": ["f", "2026-01-02T03:04:05", 6], b"g": ["g", "1969-12-31T23:59:59", None],
                    b"i": ["i", "9999-12-31T23:59:59.999000", None], b"j": ["j", "2023-11-14T22:13:20.123000", None]}
    assert [(b.offset, b.reason, b.value) for b in piece.bad] == [
        (2, "value is not JSON of the declared columns and types", '{"T": "not a time", "N": 3}'),
        (3, "value is not JSON of the declared columns and types", '{"T": 999999999999999, "N": 4}'),
        (7, "value is not JSON of the declared columns and types", '{"T": 99999999999999999, "N": 8}')]


def test_dates_and_nested_timestamps_past_year_9999_are_logged_not_a_failed_batch(spark: SparkSession,
                                                                                  tmp_path: Path) -> None:
    """Spark reads a DATE of year 99999, and a TIMESTAMP in an array, a map or a struct given
    in milliseconds (which it takes as seconds), but Python cannot hold them: each failed every
    batch of its table from then on. Now such a record goes to the processing log."""
    table, piece = declared_table_slice(
        spark, tmp_path, "id VARCHAR PRIMARY KEY, d DATE, a ARRAY<TIMESTAMP>, m MAP<VARCHAR, DATE>, s STRUCT<t TIMESTAMP>", [
            (b"a", b'{"D": "2026-01-02", "A": [1700000000, null], "M": {"x": "2026-01-03"}, "S": {"T": 1700000000}}'),
            (b"b", b'{"D": "99999-01-01"}'), (b"c", b'{"A": [1700000000000]}'), (b"d", b'{"M": {"x": "+99999-01-01"}}'),
            (b"e", b'{"S": {"T": 1700000000000}}'), (b"f", b'{"D": null, "A": null, "M": null, "S": null}'),
            (b"g", b'{"D": "9999-12-31", "M": {"y": "0001-01-01"}}')])
    rows = {key: table_rows(table)(key, state) for key, state in piece.latest}
    assert rows == {b"a": ["a", "2026-01-02", ["2023-11-14T22:13:20", None], {"x": "2026-01-03"},
                           {"T": "2023-11-14T22:13:20"}], b"f": ["f", None, None, None, None],
                    b"g": ["g", "9999-12-31", None, {"y": "0001-01-01"}, None]}
    assert [b.offset for b in piece.bad] == [1, 2, 3, 4]


def test_a_tables_bytes_time_and_map_values_are_stored_and_pulled_as_their_types(spark: SparkSession,
                                                                                  tmp_path: Path) -> None:
    """A table's BYTES (base64 in JSON), TIME and MAP<VARCHAR, DECIMAL> values reach its store
    as JSON can hold them (they failed every commit of the table's task) and come back as
    their types in its rows: bytes, ISO time text, a map of numbers."""
    table, key, state = declared_table_row(
        spark, tmp_path, "id VARCHAR PRIMARY KEY, b BYTES, at TIME, m MAP<VARCHAR, DECIMAL(4, 2)>",
        b'{"B": "AP9hYg==", "AT": "10:15:30", "M": {"a": 1.25}}')
    assert table_rows(table)(key, state) == ["k", b"\x00\xffab", "10:15:30", {"a": 1.25}]


def test_bytes_inside_arrays_maps_and_structs_are_stored_and_pulled_as_bytes(spark: SparkSession,
                                                                             tmp_path: Path) -> None:
    """BYTES in an ARRAY, a MAP's values and a STRUCT's fields (nested too) reach the store as
    base64 text (as JSON, they failed every commit of the table's task) and come back as
    bytes in its rows, NULLs kept."""
    table, key, state = declared_table_row(
        spark, tmp_path, "id VARCHAR PRIMARY KEY, a ARRAY<BYTES>, m MAP<VARCHAR, BYTES>, s STRUCT<x BYTES, n INT>, "
        "deep ARRAY<STRUCT<y BYTES>>",
        b'{"A": ["AP8=", null], "M": {"k": "YWI=", "z": null}, "S": {"X": "AQ==", "N": 7}, '
        b'"DEEP": [{"Y": "Ag=="}, {"Y": null}]}')
    row = table_rows(table)(key, state)
    assert row == ["k", [b"\x00\xff", None], {"k": b"ab", "z": None}, {"X": b"\x01", "N": 7},
                   [{"Y": b"\x02"}, {"Y": None}]]
    # Served as a pull gives it: nested values as JSON, their bytes as base64 text.
    assert [from_proto(v) for v in row_to_proto(row).values] == [
        "k", ["AP8=", None], {"k": "YWI=", "z": None}, {"X": "AQ==", "N": 7}, [{"Y": "Ag=="}, {"Y": None}]]


def copy_rows(table: Any, records: list[tuple[bytes, bytes]]) -> dict[bytes, Any]:
    """What a standby copy stores of each (key, value) record of a joined table's topic, as it
    decodes it in Python (``TableRecords``), read back from the store's JSON; a record it
    leaves out is absent."""
    rows = TableRecords(table)
    return {key: json.loads(encode_state(values)) for key, value in records if (values := rows.row(value)) is not None}


def test_python_stores_every_type_millpond_writes_as_sparks_reading_does(spark: SparkSession, tmp_path: Path) -> None:
    """A joined table's active task and its copies decode its topic in Python (``TableRecords``):
    for the JSON Millpond writes (ISO dates, times and timestamps, base64 bytes, structs of
    their declared fields, at any depth, NULLs among them), that stores what Spark's reading
    of it stores for any other table, so a joined table of any types has standbys."""
    columns = ("id VARCHAR PRIMARY KEY, d DATE, t TIME, b BYTES, x DECIMAL(4, 2), "
               "deep ARRAY<STRUCT<d DATE, ts TIMESTAMP, b BYTES, n INT, ok BOOLEAN>>, m MAP<VARCHAR, TIME>, "
               "s STRUCT<inner STRUCT<ds ARRAY<DATE>, v DOUBLE>, name VARCHAR>")
    values = [
        {"D": "2026-11-27", "T": "10:11:12", "B": "AP8=", "X": 1.25,
         "DEEP": [{"D": "0001-01-01", "TS": "2026-01-02T03:04:05.678000", "B": "", "N": 7, "OK": True}, None,
                  {"D": None, "TS": "9999-12-31T23:59:59", "B": None, "N": None, "OK": False}],
         "M": {"a": "00:00:00.000001", "b": None}, "S": {"INNER": {"DS": ["2024-02-29", None], "V": 5.0}, "NAME": "n"}},
        {"D": "1970-01-01", "T": "23:59:59.500000", "B": None, "X": -0.5, "DEEP": [], "M": {},
         "S": {"INNER": None, "NAME": None}},
        {"D": None, "T": None, "B": "aGVsbG8=", "X": None, "DEEP": None, "M": None, "S": None},
        {"S": {"NAME": "missing fields"}},
    ]
    records = [(f"k{i}".encode(), json.dumps(v).encode()) for i, v in enumerate(values)]
    table, piece = declared_table_slice(spark, tmp_path, columns, records)
    active = {key: json.loads(encode_state(state)) for key, state in piece.latest}
    assert len(active) == len(values) and not piece.bad
    assert copy_rows(table, records) == active
    assert active[b"k3"][-1] == {"INNER": None, "NAME": "missing fields"}


def test_a_joined_tables_active_task_decodes_its_topic_as_its_copies_do(spark: SparkSession, tmp_path: Path) -> None:
    """The materialization of a table-table join's result (``ReplayedTableTask``): each record
    keyed and decoded in Python as a standby copy does (a date as Spark's reader takes it, an
    INT given as 5.0 refused as Spark refuses it), a tombstone deleting its key, the last
    record of a key winning, and the records left out logged with a copy's reasons."""
    statements = (
        "CREATE TABLE a (id VARCHAR PRIMARY KEY, d DATE) WITH (kafka_topic='a', partitions=1, value_format='json')",
        "CREATE TABLE b (id VARCHAR PRIMARY KEY, s STRUCT<n INT, at TIMESTAMP>) "
        "WITH (kafka_topic='b', partitions=1, value_format='json')",
        "CREATE TABLE ab AS SELECT a.id, a.d, b.s FROM a LEFT JOIN b ON a.id = b.id")
    records = [(b"k1", b'{"D": "2026-11-27", "S": {"N": 1, "AT": "2026-11-27T01:02:03"}}', 0, 0),
               (b"k2", b'{"D": "2026-1-2T10:00", "S": null}', 0, 1),
               (b"k3", b'{"D": "2026-11-28", "S": null}', 0, 2), (b"k3", None, 0, 3),  # written, then deleted
               (b"k4", b'{"D": null, "S": {"N": 2}}', 0, 4), (b"k4", b'{not json', 0, 5),  # the first stays
               (None, b'{"D": "2026-11-29"}', 0, 6), (b"k5", b'{"D": "2026-11-30", "S": {"N": 5.0}}', 0, 7)]
    slices = stage_slices(spark, tmp_path, statements, "AB", -1, records)
    piece = slices[0]
    assert isinstance(piece, MaterializeSlice)
    assert (piece.count, piece.last_offset) == (8, 7)
    meta = applied(statements)
    copy = copy_rows(meta.source("AB"), [(k, v) for k, v, _, _ in records if k is not None and v is not None])
    assert dict(piece.latest) == {b"k1": copy[b"k1"], b"k2": copy[b"k2"], b"k3": None, b"k4": copy[b"k4"]}
    assert copy[b"k1"] == ["2026-11-27", {"N": 1, "AT": "2026-11-27T01:02:03"}]
    assert copy[b"k2"] == ["2026-01-02", None] and b"k5" not in copy
    assert [(b.offset, b.reason.split(":")[0]) for b in piece.bad] == [
        (5, "value is not JSON of the declared columns and types"), (6, "record has no key, or one that is not UTF-8 text"),
        (7, "value is not JSON of the declared columns and types")]


def test_python_reads_what_sparks_json_reader_reads_and_refuses_what_it_refuses(spark: SparkSession,
                                                                               tmp_path: Path) -> None:
    """The forms a join's result may hold because its tables' producers wrote them, read as
    Spark's JSON reader reads them for any other table, or refused as it refuses them: dates
    of one-digit months and days or with a time after them, a number's, a boolean's or an
    object's JSON as VARCHAR at any depth, BIGINT to its bounds, an INT or BIGINT written
    with a fraction, a DECIMAL of 38 digits."""
    columns = ("id VARCHAR PRIMARY KEY, d DATE, s VARCHAR, m MAP<VARCHAR, VARCHAR>, b BIGINT, i INT, "
               "x DECIMAL(38, 10), f DOUBLE")
    values: list[dict[str, Any]] = [
        {"D": "2026-1-2"}, {"D": "2026-01-02T00:00:00"}, {"D": "2026-01-02 10:00"}, {"D": "2026"}, {"D": "2026-02-30"},
        {"D": 20000}, {"D": "26-01-02"}, {"S": 5}, {"S": True}, {"S": {"a": [1, "b"]}}, {"M": {"a": 1, "b": False}},
        {"M": {"a": None}}, {"B": 2**63 - 1}, {"B": -2**63}, {"B": 2**63}, {"B": 5.0}, {"I": 2**31}, {"I": -2**31},
        {"I": 7.5}, {"X": 10**27 + 0.5}, {"X": -123456789.123456789}, {"X": 10**28}, {"X": "12.345"},
        {"M": {"é": {"n": "é"}}}, {"F": "Infinity"}, {"F": "-Infinity"}, {"F": "+INF"}, {"F": "nan"}]
    records = [(f"k{i}".encode(), json.dumps(v).encode()) for i, v in enumerate(values)]
    table, piece = declared_table_slice(spark, tmp_path, columns, records)
    active = {key: json.loads(encode_state(state)) for key, state in piece.latest}
    assert copy_rows(table, records) == active
    assert 0 < len(piece.bad) < len(values) - 10


def test_json_fields_are_found_whatever_their_case_as_ksqldb_finds_them(spark: SparkSession, tmp_path: Path) -> None:
    """ksqlDB's JSON reader finds a column's field by its name as written, else by a key that
    upper-cased is the name (``reading`` for READING), so producers that write lower-case or
    camel-case keys fill the columns. Spark's reader matches the case: such records' columns
    were NULL in every persistent query, where a push query (Python) read them. A quoted
    lower-case column takes its key as written only; the keys of a MAP stay as written."""
    columns = 'id VARCHAR PRIMARY KEY, c0 INT, s VARCHAR, "lo" INT, t TIMESTAMP, m MAP<VARCHAR, INT>, sensorid BIGINT'
    values: list[dict[str, Any]] = [
        {"c0": 5}, {"C0": 5}, {"c0": 5, "C0": 6}, {"C0": 6, "c0": 5}, {"s": "x"}, {"c0": "abc"}, {"S": [1.5e-7, {"a": 1e20}]},
        {"lo": 1}, {"LO": 1}, {"Lo": 2, "lo": 3}, {"t": 1700000000000}, {"s": 'a"b', "c0": 7}, {"sensorId": 9, "m": {"c0": 1, "S": 2}},
        {"Sensorid": 1, "sensorID": 2}, {"c0": 3.0}, {"s": 1.5, "c0": "7"}, {"c0": 1, "C0 ": 2}, {"s": 12345678.5},
        {"c0": 4, "lo": 8, "LO": 9}]
    records = [(f"k{i}".encode(), json.dumps(v).encode()) for i, v in enumerate(values)]
    records += [(b"raw", b'{"c0": 1, "s": "\\u0041"}'), (b"bad", b"not json"), (b"cut", b'{"c0": 1,'),
                (b"escaped", b'{"\\u0063\\u0030": 2, "\\u0053": "y", "\\"q": 1}')]
    table, piece = declared_table_slice(spark, tmp_path, columns, records)
    active = {key: json.loads(encode_state(state)) for key, state in piece.latest}
    assert copy_rows(table, records) == active
    assert active[b"k0"][0] == 5 and active[b"k2"][0] == 6 and active[b"k3"][0] == 6 and active[b"k4"][1] == "x"
    assert active[b"k8"][2] is None and active[b"k9"][2] == 3 and active[b"k7"][2] == 1
    assert active[b"k12"][4:] == [{"c0": 1, "S": 2}, 9] and active[b"k13"][5] == 2 and active[b"raw"][:2] == [1, "A"]
    assert active[b"k6"][1] == '[1.5E-7,{"a":1.0E20}]' and active[b"k17"][1] == "1.23456785E7" and active[b"k16"][0] == 1
    assert active[b"k18"][0] == 4 and active[b"k18"][2] == 8  # a quoted column's field kept beside one found by its case
    assert active[b"escaped"][:2] == [2, "y"]  # keys written with escapes: "c0", and "S" as written
    assert {b"k5", b"k14", b"k15", b"bad", b"cut"}.isdisjoint(active)  # refused as a field of the column's case would be


def test_nested_struct_fields_are_found_whatever_their_case_and_wherever_a_name_is_written(spark: SparkSession,
                                                                                          tmp_path: Path) -> None:
    """ksqlDB's reader finds a nested STRUCT's fields as it finds columns, in an ARRAY's items
    and a MAP's values too, so ``{"loc": {"lat": 1.5}}`` fills LOC's LAT; both readers matched
    their case alone. And a record is read again wherever a field came out NULL and a key names
    it in another case: it was read again only when some column's name was written nowhere in
    it, so ``{"b": 2, "M": {"B": ...}}`` left B NULL in the persistent queries alone."""
    columns = ('id VARCHAR PRIMARY KEY, a INT, b INT, loc STRUCT<lat DOUBLE, "lon" DOUBLE, at STRUCT<z INT>>, '
               'ls ARRAY<STRUCT<w DOUBLE>>, m MAP<VARCHAR, STRUCT<q INT>>, v VARCHAR')
    values: list[dict[str, Any]] = [
        {"A": 1, "b": 2, "M": {"B": {"Q": 3}}, "LOC": None, "LS": None, "V": None},
        {"loc": {"lat": 1.5, "lon": 2.5, "Lon": 3, "AT": {"z": 4}}},
        {"ls": [{"w": 1}, None, {"W": 2, "w": 3}], "m": {"k2": {"q": 1}, "K1": {"Q": 2, "q": 3}}},
        {"a": 1, "v": {"b": 1, "A": [1e-7]}},
        {"loc": {"lat": "x"}},
        {"LOC": {"LAT": 1, "lat": 2}},
        {"a": 1, "ls": [{"W": 1}, {"w": []}]},
        {"a": 1, "b": 2, "loc": {"lat": 1, "lon": 2, "at": {"z": 3}}, "ls": [{"w": 1}], "m": {"K": {"q": 5}}, "v": "x"},
    ]
    records = [(f"k{i}".encode(), json.dumps(v).encode()) for i, v in enumerate(values)]
    table, piece = declared_table_slice(spark, tmp_path, columns, records)
    active = {key: json.loads(encode_state(state)) for key, state in piece.latest}
    assert copy_rows(table, records) == active
    assert active[b"k0"] == [1, 2, None, None, {"B": {"Q": 3}}, None]
    assert active[b"k1"][2] == {"LAT": 1.5, "lon": 2.5, "AT": {"Z": 4}}
    assert active[b"k2"][3:5] == [[{"W": 1.0}, None, {"W": 2.0}], {"k2": {"Q": 1}, "K1": {"Q": 2}}]
    assert active[b"k3"] == [1, None, None, None, None, '{"b":1,"A":[1.0E-7]}'] and active[b"k5"][2]["LAT"] == 1.0
    assert {b"k4", b"k6"}.isdisjoint(active)  # refused, as a field in its own case would be
    # Every key in lower case: read again by the names in lower case (not where a quoted name is one).
    assert active[b"k7"] == [1, 2, {"LAT": 1.0, "lon": 2.0, "AT": {"Z": 3}}, [{"W": 1.0}], {"K": {"Q": 5}}, "x"]
    assert json_reading._spelled(StructType([StructField("lo", IntegerType()), StructField("LO", IntegerType())]), str.lower) is None


def test_records_are_parsed_by_the_names_as_the_create_statement_writes_them_and_read_as_ksqldb_reads_them(
        spark: SparkSession, tmp_path: Path) -> None:
    """Producers usually write a key as the CREATE statement writes its column (``sensorId``),
    where ksqlDB stores the name in upper case: a record is parsed by the names in every
    spelling at once and takes the first its keys keep to, so a record spelled as the statement
    costs one parse and a search for a key in another case, where it took three parses more.
    Each record still reads as ksqlDB's reader reads it: a key as declared wins over one in
    another case, and one whose value does not read as its type when another key was taken is
    no bad record. A schema with a TIME (which Spark casts nowhere) parses each spelling apart."""
    values: list[dict[str, Any]] = [
        {"sensorId": 1, "siteName": "a", "loc": {"latDeg": 1.5}},
        {"SENSORID": 2, "SITENAME": "b", "LOC": {"LATDEG": 2.5}},
        {"sensorid": 3, "sitename": "c", "loc": {"latdeg": 3.5}},
        {"SENSORID": 4, "sensorId": "abc", "SITENAME": "d", "LOC": {"LATDEG": 1}},
        {"sensorId": 5, "SensorId": 6, "siteName": "e", "loc": None},
        {"sensorId": 7, "siteName": "f", "loc": {"LatDeg": 2}},
        {"sensorId": "x", "siteName": "g"},
        {"sensorId": 8, "sensorid": "y"},
    ]
    records = [(f"k{i}".encode(), json.dumps(v).encode()) for i, v in enumerate(values)]
    for columns in ("id VARCHAR PRIMARY KEY, sensorId INT, siteName VARCHAR, loc STRUCT<latDeg DOUBLE>",
                    "id VARCHAR PRIMARY KEY, sensorId INT, siteName VARCHAR, loc STRUCT<latDeg DOUBLE>, tm TIME"):
        table, piece = declared_table_slice(spark, tmp_path, columns, records)
        active = {key: json.loads(encode_state(state))[:3] for key, state in piece.latest}
        assert copy_rows(table, records).keys() == active.keys()
        assert {key: row[:3] for key, row in copy_rows(table, records).items()} == active
        assert active == {b"k0": [1, "a", {"LATDEG": 1.5}], b"k1": [2, "b", {"LATDEG": 2.5}], b"k2": [3, "c", {"LATDEG": 3.5}],
                          b"k3": [4, "d", {"LATDEG": 1.0}], b"k4": [6, "e", None], b"k5": [7, "f", {"LATDEG": 2.0}]}
    declared = [StructField("SENSORID", IntegerType()), StructField("_corrupt", StringType())]
    merged = json_reading.JsonReading(StructType(declared), written={"SENSORID": "sensorId"}).merged
    assert merged is not None and [f.name for f in merged[0].fields] == ["SENSORID", "sensorId", "sensorid", "_corrupt"]
    with_time = StructType([*declared, StructField("TM", TimeType())])
    assert json_reading.JsonReading(with_time, written={"SENSORID": "sensorId"}).merged is None


JSON_VALUES: dict[str, list[Any]] = {
    "INT": [0, 1, -1, 2**31 - 1, -2**31, 2**31, 5.0, 5.5, -0.0, 1e10, "7", " 7", True, None, [], {}, 12345678901234567890],
    "BIGINT": [2**63 - 1, -2**63, 2**63, 3.0, "12", 1.5, False, None, -0.0, 1e19, 10**30],
    "DOUBLE": [1.5, 0, -0.0, 1e308, "NaN", "Infinity", "-INF", "1.5", "abc", True, None, 10**400, 5, "1e5", " 2.5"],
    "DECIMAL(6, 2)": [1.255, 9999.99, 9999.995, 10000, "12.345", "1e2", " 3.5 ", "abc", 0.001, -0.005, True, None, 1e-7, 10**20,
                      "NaN", 5, "+1.5", ".5", "5.", "1_0"],
    "VARCHAR": ["a", "", 5, 5.0, 1e20, True, None, {"a": 1}, [1, "x"], "é\u2028", 0.1, -0.0, 10**25, 1.0e-7, 123456789.123],
    "BOOLEAN": [True, False, "true", "false", "TRUE", 1, 0, "yes", None, "t"],
    "DATE": ["2026-01-02", "2026-1-2", "2026", "2026-02-30", 20000, "26-01-02", "2026-01-02T10:00", " 2026-01-02", None, "0001-01-01",
             "9999-12-31", "+2026-01-02", "-2026-01-02"],
    "ARRAY<INT>": [[1, 2], [], [None], [1.5], ["1"], 5, None, [2**31], [[1]]],
    "MAP<VARCHAR, DOUBLE>": [{"a": 1}, {}, {"a": None}, {"a": "x"}, {"a": "NaN"}, [], None, {"": 1e308}, {"C0": 1}],
    "STRUCT<A INT, B VARCHAR>": [{"A": 1, "B": "x"}, {"a": 1}, {"A": "1"}, {}, None, {"B": 5}, {"A": 1.5}, [], {"A": 1, "C": 2}],
    "ARRAY<STRUCT<X INT>>": [[{"X": 1}], [{"x": 2}], [None], [{"x": "a"}], [{}], {"X": 1}, None, [{"X": 1, "x": 2}], [5]],
    "MAP<VARCHAR, STRUCT<Y DOUBLE, \"z\" INT>>": [{"k": {"y": 1}}, {"k": {"Y": "NaN"}}, {"k": None}, {"k": 5}, {}, None,
                                                 {"k": {"Z": 1, "z": 2}}, {"C0": {"y": "x"}}],
}
"""Values of each type, and of others, that a producer's JSON may hold for a column of it."""


@pytest.mark.parametrize(("seed", "written", "nested"), [(1, "Col{}", True), (2, "col{}", True), (3, "COL{}", True),
                                                      (4, "Col{}", False)])
def test_random_json_values_are_read_by_python_as_by_spark(spark: SparkSession, tmp_path: Path, seed: int,
                                                          written: str, nested: bool) -> None:
    """Each value of ``JSON_VALUES`` alone (its key as declared, as the CREATE statement writes
    it, in lower case), then random objects of them (some columns missing, the keys all spelled
    one of those ways or each its own, some twice in two spellings): a standby copy's or a push
    query's Python reading keeps and sets aside what the active task's Spark reading does, each
    column as Spark read it, whichever spelling the statement gave the names; without STRUCT
    columns too (every name a column's: a record's keys are listed to search them)."""
    draw = random.Random(seed)
    names = {written.format(i): type_ for i, type_ in enumerate(JSON_VALUES) if nested or "STRUCT" not in type_}
    ways: list[Callable[[str], str]] = [str.upper, str.lower, lambda name: name, lambda name: name[0] + name[1:].upper()]
    values: list[dict[str, Any]] = [{spelled(name): value} for name, type_ in names.items() for value in JSON_VALUES[type_]
                                    for spelled in ways[:3]]
    for _ in range(300):  # most in one spelling (parsed in every spelling at once), some each key its own
        way = draw.choice([*ways[:3], None])
        present = 1.0 if draw.random() < 0.25 else 0.7  # every column (no field NULL) in a quarter
        value: dict[str, Any] = {}
        for name, type_ in names.items():
            if draw.random() < present:
                value[(way or draw.choice(ways))(name)] = draw.choice(JSON_VALUES[type_])
            if draw.random() < 0.04:  # the same field again in another spelling
                value[draw.choice(ways)(name)] = draw.choice(JSON_VALUES[type_])
        values.append(value)
    records = [(f"k{i}".encode(), json.dumps(v).encode()) for i, v in enumerate(values)]
    columns = "id VARCHAR PRIMARY KEY, " + ", ".join(f"{name} {type_}" for name, type_ in names.items())
    table, piece = declared_table_slice(spark, tmp_path, columns, records)
    active = {key: json.loads(encode_state(state)) for key, state in piece.latest}
    copy = copy_rows(table, records)
    shown = {k: json.dumps(v) for k, v in active.items()}  # NaN equal to NaN
    assert {k: (v, shown.get(k)) for k, v in copy.items() if shown.get(k) != json.dumps(v)} == {}
    assert copy.keys() == active.keys() and 50 < len(active) < len(values) - 100


DELIMITED_FIELDS = {
    "INT": ["1", "-1", "2147483648", "1.5", " 7", "7 ", "", "x", "+3", "0x10", "1e2", '"5"', "007", "1_0"],
    "BIGINT": ["9223372036854775807", "9223372036854775808", "-5", "", "1.0", " 2"],
    "DOUBLE": ["1.5", "NaN", "Infinity", "-Infinity", "Inf", "-Inf", "1e5", "", "abc", " 2.5 ", "1.5d", "0x1p3", ".5", "5.", "+1",
               "inf", "1_0", "+NaN"],
    "DECIMAL(6, 2)": ["1.255", "9999.995", "12.3", "", "1e2", "abc", " 3.5", "+1.5", '"1,000.5"', "1_0"],
    "VARCHAR": ["a", "", '"a,b"', '"he said ""hi"""', " x ", '""', "é", '"a\nb"'],
    "BOOLEAN": ["true", "false", "TRUE", "1", "", "yes", " true"],
}
"""Fields of each type, and other text, that a producer's DELIMITED line may hold for a column of it."""


def test_random_delimited_values_are_read_by_python_as_by_spark(spark: SparkSession, tmp_path: Path) -> None:
    """As for JSON: each field of ``DELIMITED_FIELDS`` beside good ones, then random lines of
    them (a field short or one too many). Python read ``" 7"`` as an INT, ``1.5d`` not as a
    DOUBLE, ``inf`` as one, where Spark's CSV reader (Java's parsing) does the opposite."""
    draw = random.Random(3)
    names = {f"C{i}": type_ for i, type_ in enumerate(DELIMITED_FIELDS)}
    good = {type_: fields[0] for type_, fields in DELIMITED_FIELDS.items()}
    lines = [",".join(field if other == name else good[other_type] for other, other_type in names.items())
             for name, type_ in names.items() for field in DELIMITED_FIELDS[type_]]
    for _ in range(200):
        fields = [draw.choice(DELIMITED_FIELDS[type_]) for type_ in names.values()]
        lines.append(",".join(fields[:-1] if draw.random() < 0.1 else [*fields, "extra"] if draw.random() < 0.1 else fields))
    records = [(f"k{i}".encode(), line.encode()) for i, line in enumerate(lines)]
    columns = "id VARCHAR PRIMARY KEY, " + ", ".join(f"{name} {type_}" for name, type_ in names.items())
    table, piece = declared_table_slice(spark, tmp_path, columns, records, "delimited")
    active = {key: json.loads(encode_state(state)) for key, state in piece.latest}
    copy = copy_rows(table, records)
    shown = {k: json.dumps(v) for k, v in active.items()}  # NaN equal to NaN
    assert {k: (v, shown.get(k)) for k, v in copy.items() if shown.get(k) != json.dumps(v)} == {}
    assert copy.keys() == active.keys() and 20 < len(active) < len(lines) - 50


def test_a_standby_decodes_a_joined_decimal_as_the_active_tasks_spark_does(spark: SparkSession, tmp_path: Path) -> None:
    """A joined table's standby replays the JSON the join wrote in Python (``TableTopicReader``):
    each DECIMAL and DOUBLE must be stored as the active task stores what Spark read of it,
    rounding half up to the scale, and a value past the precision refused (left out) by both."""
    rng = random.Random(11)
    numbers: list[float | int] = [1.255, -1.255, 5, 5.0, 0.005, -0.005, 12.345, 99.994, 99.995, 123.4, 1e-07, 0, -0.0,
                                  1.005, 2.675, 0.125, 99.99, -99.99, -99.995, 10**5, 3]
    numbers += [round(rng.uniform(-120, 120), rng.randrange(0, 6)) for _ in range(300)]
    records = [(f"k{i}".encode(), json.dumps({"D": n, "X": n}).encode()) for i, n in enumerate(numbers)]
    table, piece = declared_table_slice(spark, tmp_path, "id VARCHAR PRIMARY KEY, d DECIMAL(4, 2), x DOUBLE", records)
    active = dict(piece.latest)
    standby = copy_rows(table, records)
    assert standby == active
    assert len(active) < len(numbers) and active[b"k0"] == [1.26, 1.255] and active[b"k3"] == [5.0, 5.0]


def test_a_standby_decodes_a_joined_timestamp_as_the_active_tasks_spark_does(spark: SparkSession,
                                                                             tmp_path: Path) -> None:
    """A joined TIMESTAMP as a copy (Python) and the active task (Spark) read it: epoch
    milliseconds (number or digits) and ISO 8601 text to the minute, or to the second or
    microsecond with or without an offset, give the same stored time; forms only one reads
    (a week date, a 7-digit fraction, an offset without its colon or after the minutes or past
    18 hours, text with a space before it or a line break after it), impossible
    times and times outside the second day of year 1 to the end of 9999 (PySpark cannot give
    one of the first day) are refused (left out) by both."""
    rng = random.Random(7)
    times: list[object] = [
        0, -1, 1700000000123, 999999999999999, 253402300799999, 253402300800000, -62135596800000, -62135596800001,
        "1700000000123", "-1000", "2026-01-02", "2026-01-02T03:04", "2026-01-02 03:04:05", "2026-01-02T03:04:05.5",
        "2026-01-02T03:04:05.123456", "2026-01-02T03:04:05Z", "2026-01-02T03:04:05+01:00", "2026-01-02T03:04:05.5-07:30",
        "2026-02-30", "2026-01-02T24:00", "2026-01-02T23:59:60", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
        "9999-12-31T23:59:59.999999", "2026-1-2", "20260102", "2026-W01-1", " 2026-01-02", "2026-01-02T03:04:05.1234567",
        "2026-01-02T03:04:05+0100", "2026-01-02T03", "not a time", "", "2026-01-02T03:04:05+14:00",
        "2026-01-02T03:04:05+24:00", 1.7e12, 5.0, True, None, -62135510400000, "0001-01-02T00:00:00",
        "0001-01-01T23:59:59.999999", "0001-01-01", "2026-01-02T03:04Z", "2026-01-02T03:04+01:00",
        "2026-01-02 03:04-00:30", "2026-01-02T03:04:05+18:00", "2026-01-02T03:04:05-18:00", "2026-01-02T03:04:05+19:00",
        "2026-01-02T03:04:05+23:59", "2026-01-02T03:04:05+05:60", "2026-01-02T03:04:05+00:99", "2026-01-02T03:04:05-00:00",
        "2026-01-02\n", "1700000000123\r\n", "1700000000123\n", "-0", "0001700000000123"]
    times += [rng.randrange(-62135596800000, 253402300799999) for _ in range(100)]
    times += [f"{rng.randrange(1, 10000):04d}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
              f"{rng.choice('T ')}{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}"
              f"{rng.choice(['', '.' + str(rng.randrange(10**6)).zfill(rng.randrange(1, 7))[:6]])}"
              f"{rng.choice(['', 'Z', f'+{rng.randrange(15):02d}:{rng.choice([0, 30, 45]):02d}', '-08:00'])}"
              for _ in range(200)]
    records = [(f"k{i}".encode(), json.dumps({"T": t, "N": i}).encode()) for i, t in enumerate(times)]
    table, piece = declared_table_slice(spark, tmp_path, "id VARCHAR PRIMARY KEY, t TIMESTAMP, n INT", records)
    active = dict(piece.latest)
    standby = copy_rows(table, records)
    assert {k: v for k, v in standby.items() if active.get(k) != v} == {}
    assert standby == active
    assert active[b"k2"] == ["2023-11-14T22:13:20.123000", 2] and active[b"k16"] == ["2026-01-02T02:04:05", 16]
    assert len(active) < len(times) - 20


@contextlib.contextmanager
def jvm_calls(spark: SparkSession) -> Iterator[list[str]]:
    """The calls into Spark's JVM made inside the block: each one's method name, or its kind of
    command. Not py4j's notices of Python objects freed (sent when the collector gets to them):
    housekeeping of whatever ran before, not the block's own asks."""
    client = spark.sparkContext._gateway._gateway_client  # type: ignore[union-attr]
    send = client.send_command
    calls: list[str] = []

    def counted(command: str, *args: Any, **kwargs: Any) -> Any:
        if not command.startswith(proto.MEMORY_COMMAND_NAME + proto.MEMORY_DEL_SUBCOMMAND_NAME):
            calls.append(command.split("\n")[2] if command.startswith("c\n") else command[:2])
        return send(command, *args, **kwargs)
    client.send_command = counted
    try:
        yield calls
    finally:
        client.send_command = send


def test_a_batch_asks_the_jvm_little_beyond_its_job(spark: SparkSession, batch: DataFrame, tmp_path: Path) -> None:
    """Each call into Spark's JVM is a round trip, and every batch plans its reduction anew:
    its columns are made once, not per batch, and PySpark's notes of each Column function's
    Python call site (for its error messages, five calls each) are off in the worker's
    session. A later batch (foreachBatch gives each in a Python session object of its own)
    makes 69 calls here: 85 through PySpark's own ``toArrow``, 106 when the columns were kept
    per session object, so made anew every batch, 135 when they were made per batch, about
    twice that with the notes too."""
    runner = runner_of(spark, AGGREGATE, tmp_path)

    def given(frame: DataFrame) -> DataFrame:
        """``frame`` as foreachBatch gives a batch: in a Python session object of its own."""
        return DataFrame(frame._jdf, SparkSession(spark.sparkContext, frame._jdf.sparkSession()))
    try:
        runner._reduce(given(batch))  # the first batch makes the columns
        later = given(batch)
        with jvm_calls(spark) as calls:
            runner._reduce(later)
    finally:
        runner.stop()
        runner.loop.close()
    assert len(calls) < 100


def test_a_later_batch_asks_the_jvm_for_its_job_and_little_else(spark: SparkSession, batch: DataFrame,
                                                                  tmp_path: Path) -> None:
    """A streaming query's batch comes as its reduction's frame (made once, with the query):
    reducing it costs its one job's calls into the JVM and few others. Here 8 for the GROUP
    BY (its job, the three items of the Java array that says where its Arrow batches are, two
    calls each, its end) and 7 for the projection; 22 for the GROUP BY through PySpark's
    ``toArrow``, which also asks two settings and the schema and sets the job's call site."""
    for statement in (AGGREGATE, PROJECT):
        runner = runner_of(spark, statement, tmp_path)
        try:
            reduction = runner.reduction(batch)
            runner._reduced(reduction.frame, reduction)  # the first batch
            with jvm_calls(spark) as calls:
                runner._reduced(reduction.frame, reduction)
        finally:
            runner.stop()
            runner.loop.close()
        assert len(calls) <= 10, (statement, calls)


def test_the_spark_queries_of_one_source_share_its_read_columns(spark: SparkSession, tmp_path: Path) -> None:
    """A partition that moves in gets a Spark query of its own, planned while it moves: the
    columns its records are read into are the ones made for the first query over a source of
    the same shape, with no call into the JVM; a source of another shape gets columns of its own."""
    runners = [runner_of(spark, AGGREGATE, tmp_path), runner_of(spark, PROJECT, tmp_path),
               runner_of(spark, PROJECT, tmp_path, SOURCE.replace("reading INT", "reading DOUBLE"))]
    try:
        columns = runners[0]._read_columns()
        with jvm_calls(spark) as calls:
            assert runners[1]._read_columns() is columns
        assert calls == []
        other = runners[2]._read_columns()
        assert other is not columns
        decoded = [str(c) for c in other if "from_json" in str(c)]
        assert decoded and all("DoubleType" in c or "double" in c.lower() for c in decoded), decoded
    finally:
        for runner in runners:
            runner.loop.close()


def test_a_session_keeps_the_read_columns_of_a_bounded_number_of_source_shapes(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sources created and dropped over a worker's life leave no columns behind past the bound."""
    monkeypatch.setattr(query_runner, "READ_SHAPES_KEPT", 2)
    query_runner._READ_COLUMNS.pop(spark, None)
    shapes = [SOURCE.replace("reading INT", f"reading {kind}") for kind in ("INT", "DOUBLE", "BIGINT")]
    runners = [runner_of(spark, PROJECT, tmp_path, shape) for shape in (*shapes, shapes[0])]
    try:
        first = runners[0]._read_columns()
        assert runners[1]._read_columns() is not first
        assert len(query_runner._READ_COLUMNS[spark]) == 2
        runners[2]._read_columns()  # a third shape: the two kept go
        assert len(query_runner._READ_COLUMNS[spark]) == 1
        assert runners[3]._read_columns() is not first  # made again
    finally:
        query_runner._READ_COLUMNS.pop(spark, None)
        for runner in runners:
            runner.loop.close()


def test_a_batchs_arrow_table_is_what_pysparks_to_arrow_gives(spark: SparkSession) -> None:
    """``reducers.arrow_table`` is ``toArrow`` with fewer calls into the JVM: the same columns,
    types and rows for every type a reduction's frame carries, an empty batch included, and a
    failing job raises as ``toArrow`` raises it."""
    frame = spark.sql(
        "SELECT CAST(id AS INT) AS i, id AS l, id / 3 AS d, CAST(id AS DECIMAL(10, 2)) AS m, CAST(id AS STRING) AS s, "
        "CAST(CAST(id AS STRING) AS BINARY) AS b, TIMESTAMP_MILLIS(id * 1000) AS t, DATE_FROM_UNIX_DATE(id) AS dt, "
        "id % 2 = 0 AS z, ARRAY(id, NULL) AS a, MAP(CAST(id AS STRING), id) AS mp, "
        "NAMED_STRUCT('x', id, 'y', CAST(NULL AS STRING)) AS st, IF(id % 3 = 0, NULL, id) AS n "
        "FROM RANGE(0, 200, 1, 3)")
    for each in (frame, frame.where("l < 0")):
        ours, theirs = reducers.arrow_table(each), each.toArrow()
        assert ours.schema == theirs.schema
        assert ours.equals(theirs)
    assert reducers.arrow_table(frame).num_rows == 200
    failing = spark.sql("SELECT ASSERT_TRUE(id < 5, 'record past the fifth') AS x FROM RANGE(10)")
    with pytest.raises(Exception, match="record past the fifth") as ours_error:
        reducers.arrow_table(failing)
    with pytest.raises(Exception, match="record past the fifth") as their_error:
        failing.toArrow()
    assert type(ours_error.value) is type(their_error.value)


def test_a_row_stored_before_columns_were_added_has_them_null() -> None:
    """CREATE OR REPLACE may add columns at the end of a projection's table: a row stored
    before has them NULL when pulled (it stopped the pull with StopIteration), also with BYTES."""
    meta = Metastore()
    meta.apply(parse_statement("CREATE TABLE wide (id VARCHAR PRIMARY KEY, n INT, b BYTES, m INT) "
                               "WITH (kafka_topic='wide', partitions=1, value_format='json')"), 0)
    row = table_rows(meta.source("WIDE"))
    assert row(b"a", [1]) == ["a", 1, None, None]
    assert row(b"a", [1, "AAE=", 2]) == ["a", 1, b"\x00\x01", 2]
    assert row(b"a", [1, "AAE=", 2, "more"]) == ["a", 1, b"\x00\x01", 2]
    meta.apply(parse_statement("CREATE TABLE narrow (id VARCHAR PRIMARY KEY, n INT, m INT) "
                               "WITH (kafka_topic='narrow', partitions=1, value_format='json')"), 1)
    assert table_rows(meta.source("NARROW"))(b"a", [1]) == ["a", 1, None]


WINDOWED_SOURCES = (
    "CREATE STREAM r (sensor VARCHAR KEY, area VARCHAR, reading INT) WITH (kafka_topic='r', partitions=2, "
    "value_format='json')",
    "CREATE TABLE per_minute AS SELECT sensor, COUNT(*) AS n, AVG(reading) AS mean FROM r "
    "WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY sensor",
    "CREATE TABLE visits AS SELECT sensor, area, COUNT(*) AS n FROM r WINDOW SESSION (5 MINUTES) GROUP BY sensor, area")


def test_a_windowed_tables_rows_are_projected_window_by_window_and_materialized_with_their_windows(
        spark: SparkSession, tmp_path: Path) -> None:
    """A persistent query over a windowed table: each record's window bounds are WINDOWSTART and
    WINDOWEND (a time window's end its start plus its size), its key is written on as it came
    (the key, then the window), a row the WHERE drops or deleted becomes a tombstone of that
    window, and a key too short to hold a window goes to the processing log. The table's store
    keeps rows by the windowed key, read back with their windows, from Spark and from a copy's
    Python reader alike."""
    statements = (*WINDOWED_SOURCES[:2], "CREATE TABLE busy AS SELECT sensor, WINDOWSTART AS ws, WINDOWEND AS we, "
                  "n * 10 AS n10 FROM per_minute WHERE n > 1 AND WINDOWSTART >= 60000")
    s1_first, s1_second, s2_second = windowed_key(b"s1", 60_000), windowed_key(b"s1", 120_000), windowed_key(b"s2", 120_000)
    records: list[tuple[bytes | None, bytes | None, int, int]] = [
        (s1_first, b'{"N": 2, "MEAN": 1.5}', 0, 0),
        (windowed_key(b"s1", 0), b'{"N": 5, "MEAN": 1.5}', 0, 1),  # WINDOWSTART < 60000: dropped
        (s1_second, b'{"N": 1, "MEAN": 1.5}', 0, 2),  # n > 1 fails
        (s2_second, b'{"N": 3, "MEAN": 2.0}', 0, 3),
        (b"s1", b'{"N": 3, "MEAN": 2.0}', 0, 4),  # no window
        (s2_second, None, 0, 5)]
    (projected,) = stage_slices(spark, tmp_path, statements, "BUSY", 0, records).values()
    assert [(k, v if v is None else json.loads(v)) for k, v in projected.records] == [
        (s1_first, {"WS": 60_000, "WE": 120_000, "N10": 20}), (windowed_key(b"s1", 0), None), (s1_second, None),
        (s2_second, {"WS": 120_000, "WE": 180_000, "N10": 30}), (s2_second, None)]
    assert [b.offset for b in projected.bad] == [4]

    busy = [(k, v) for k, v in projected.records]
    (materialized,) = stage_slices(spark, tmp_path, statements, "BUSY", 1, [
        (k, v, 0, i) for i, (k, v) in enumerate([*busy, (b"s", b'{"WS": 1, "WE": 2, "N10": 3}'), (b"s", None)])],
        datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)).values()
    assert materialized.latest == [(s1_first, [60_000, 120_000, 20]), (windowed_key(b"s1", 0), None),
                                   (s1_second, None), (s2_second, None)]
    assert [b.offset for b in materialized.bad] == [5, 6]  # a tombstone of a key without a window too
    assert materialized.stream_time == 1767312000000  # its records' latest time: its windows go by it
    meta = applied(statements)
    sink = meta.source("BUSY")
    assert sink.window is not None and sink.window.kind == "TUMBLING"
    assert table_rows(sink)(s1_first, [60_000, 120_000, 20]) == ["s1", 60_000, 120_000, 60_000, 120_000, 20]
    copy = TableRecords(sink)
    assert [copy.read(k, v) for k, v in busy[:1]] == [(s1_first, [60_000, 120_000, 20])]
    assert isinstance(copy.read(b"s", b'{"WS": 1}'), LeftOut)


def test_a_session_tables_rows_are_projected_with_their_sessions_bounds(spark: SparkSession, tmp_path: Path) -> None:
    """Over a session table (its key of two columns, JSON, then the session's end and start):
    WINDOWEND is the session's end, read from the key, and the rows keep their sessions' keys."""
    statements = (WINDOWED_SOURCES[0], WINDOWED_SOURCES[2],
                  "CREATE TABLE long_visits AS SELECT sensor, area, WINDOWEND - WINDOWSTART AS span, n FROM visits "
                  "WHERE WINDOWEND - WINDOWSTART >= 1000")
    key = b'{"SENSOR":"s1","AREA":"a"}'
    long_visit = key + struct.pack(">qq", 9_000, 5_000)
    short_visit = key + struct.pack(">qq", 5_500, 5_000)
    (projected,) = stage_slices(spark, tmp_path, statements, "LONG_VISITS", 0, [
        (long_visit, b'{"N": 4}', 0, 0), (short_visit, b'{"N": 2}', 0, 1)]).values()
    assert [(k, v if v is None else json.loads(v)) for k, v in projected.records] == [
        (long_visit, {"SPAN": 4_000, "N": 4}), (short_visit, None)]
    (materialized,) = stage_slices(spark, tmp_path, statements, "LONG_VISITS", 1, [
        (k, v, 0, i) for i, (k, v) in enumerate(projected.records)]).values()
    assert materialized.latest == [(long_visit, [4_000, 4]), (short_visit, None)]


def test_a_column_named_like_the_readers_own_key_column_is_a_column(spark: SparkSession, tmp_path: Path) -> None:
    """A value column ``_key`` (any case) is the record's field, not the reader's key: the reader's
    own columns in a classified frame are not Spark's to confuse with it."""
    _, piece = declared_table_slice(spark, tmp_path, "id VARCHAR PRIMARY KEY, `_KEY` VARCHAR",
                                    [(b"a", b'{"_KEY": "x"}'), (b"b", None)])
    assert piece.latest == [(b"a", ["x"]), (b"b", None)] and piece.bad == []
