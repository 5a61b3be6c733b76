"""The windowed reducer (``reducers.windowed_reduction`` through ``QueryRunner._reduce``) in a
local[1] Spark session, batch after batch, against a pure-Python reference of Kafka Streams'
window semantics:

- a record at event time ``t`` falls in every window ``[s, s + size)`` with ``s`` a multiple
  of the advance, ``s <= t < s + size`` and ``s >= 0``;
- stream time is per partition: the latest event time of the records processed so far, this
  one's included, in offset order, across batches;
- a record enters a window only while the window's end plus grace is after stream time;
  otherwise that (record, window) is late: dropped, and reported with its offset;
- a record without a key, with a value that is not JSON, or without an event time counts
  nowhere (and goes to the processing log), and moves no stream time.

The batches are cut at random places: the result may not depend on where they are cut.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, SparkSession

from millpond.services.worker.kinds import WORKER_KINDS
from millpond.services.worker.query_runner import QueryRunner
from millpond.services.worker.task import SessionAggregationTask, SessionSlice, WindowSlice
from millpond.shared.catalog.sources import WindowSpec
from millpond.shared.config import WorkerSettings as Settings
from millpond.shared.kafka.serde import split_windowed_key
from tests.metastores import applied
from tests.unit.services.worker.test_reducer import KAFKA_ROW, split_batches

pytestmark = pytest.mark.spark

BY_COLUMN = ("CREATE STREAM r (sensor VARCHAR KEY, reading INT, ts BIGINT) "
             "WITH (kafka_topic='r', partitions=2, value_format='json', timestamp='ts')")
BY_ROWTIME = ("CREATE STREAM r (sensor VARCHAR KEY, reading INT, ts BIGINT) "
              "WITH (kafka_topic='r', partitions=2, value_format='json')")
WINDOWS = {
    "TUMBLING": "WINDOW TUMBLING (SIZE 60 SECONDS, GRACE PERIOD 20 SECONDS)",
    "HOPPING": "WINDOW HOPPING (SIZE 60 SECONDS, ADVANCE BY 20 SECONDS, GRACE PERIOD 10 SECONDS)",
}

EPOCH = datetime.fromtimestamp(0, UTC)
Record = tuple[bytes | None, bytes | None, int, int, int]
"""(key, value, partition, offset, record timestamp in ms)."""


def _event_time(record: Record, by_column: bool) -> int | None:
    key, value, _, _, rowtime = record
    if key is None or value is None:
        return None
    try:
        decoded = json.loads(value)
    except ValueError:
        return None
    if not isinstance(decoded, dict):
        return None
    ts = decoded.get("TS") if by_column else rowtime
    return ts if isinstance(ts, int) and ts >= 0 else None


Window = tuple[int, bytes, int]
"""(partition, key, window start)."""


def reference(records: list[Record], window: WindowSpec, by_column: bool,
              latest: dict[Window, int] | None = None) -> tuple[dict[Window, tuple[int, int | None]], set[tuple[int, int, int]]]:
    """Per (partition, key, window start): (COUNT(*), SUM(reading)); and every late
    (partition, offset, window start). ``latest``, when given, gets each window's latest event
    time of the records it counts (what stamps its rows)."""
    totals: dict[tuple[int, bytes, int], list[Any]] = {}
    late: set[tuple[int, int, int]] = set()
    stream: dict[int, int] = defaultdict(lambda: -1)
    for record in sorted(records, key=lambda r: (r[2], r[3])):
        ts = _event_time(record, by_column)
        if ts is None:
            continue
        key, value, partition, offset, _ = record
        assert key is not None and value is not None
        stream[partition] = max(stream[partition], ts)
        reading = json.loads(value).get("READING")
        for start in window.starts(ts):
            if start + window.size_ms + window.grace_ms <= stream[partition]:
                late.add((partition, offset, start))
                continue
            count, total = totals.setdefault((partition, key, start), [0, None])
            totals[(partition, key, start)] = [count + 1, total if reading is None else (total or 0) + reading]
            if latest is not None:
                latest[(partition, key, start)] = max(latest.get((partition, key, start), ts), ts)
    return {k: (v[0], v[1]) for k, v in totals.items()}, late


@contextmanager
def reducer(spark: SparkSession, statements: list[str], tmp_path: Path,
            ) -> Iterator[tuple[QueryRunner, dict[int, Any]]]:
    """The worker's reducer of the one query ``statements`` create (``QueryRunner._reduce``,
    no Kafka: batches are given), and its tasks by partition, of the plan kind's class."""
    meta = applied(statements)
    (query,) = meta.queries.values()
    src, sink = meta.sources[query.source], meta.sources[query.sink]
    settings = Settings(worker_id="windows-test", spark_master="local[1]", state_dir=tmp_path)
    tasks = {p: WORKER_KINDS[query.plan.kind].task(settings, query, src, sink, p) for p in range(src.partitions)}
    loop = asyncio.new_event_loop()  # only a commit would use it
    runner = QueryRunner(spark, settings, query, src, sink, dict(tasks), loop)
    try:
        yield runner, tasks
    finally:
        runner.stop()
        loop.close()


def as_batch(spark: SparkSession, records: list[Record]) -> DataFrame:
    """``records`` as a micro-batch of the Kafka source, with their record timestamps."""
    return spark.createDataFrame(
        [(k, v, "r", p, o, EPOCH + timedelta(milliseconds=t), 0) for k, v, p, o, t in records], KAFKA_ROW)


def run_batches(spark: SparkSession, source: str, window: str, batches: list[list[Record]], tmp_path: Path,
                latest: dict[Window, int] | None = None,
                ) -> tuple[dict[Window, tuple[int, int | None]], set[tuple[int, int, int]], WindowSpec]:
    """Reduce ``batches`` one after another, each against the stream time the ones before
    left (as the tasks' commits set it), merging the partials as a task does; ``latest``, when
    given, gets each window's latest time the slices said, merged as a task merges them."""
    states: dict[tuple[int, bytes, int], list[list[Any]]] = {}
    late: set[tuple[int, int, int]] = set()
    table = f"CREATE TABLE w AS SELECT sensor, COUNT(*) AS n, SUM(reading) AS total FROM r {window} GROUP BY sensor"
    with reducer(spark, [source, table], tmp_path) as (runner, tasks):
        for records in batches:
            for partition, piece in runner._reduce(as_batch(spark, records)).items():
                assert isinstance(piece, WindowSlice)
                task = tasks[partition]
                assert piece.reduced_at == task.stream_time
                assert piece.stream_time >= task.stream_time
                for windowed, partial in piece.partials:
                    key, start = split_windowed_key(windowed)
                    old = states.get((partition, key, start))
                    states[(partition, key, start)] = partial if old is None else [
                        agg.merge(o, n) for agg, o, n in zip(task.aggregates, old, partial, strict=True)]
                    if latest is not None:
                        time = piece.times[windowed]
                        latest[(partition, key, start)] = max(latest.get((partition, key, start), time), time)
                for record in piece.late:
                    start = int(record.reason.split("[")[1].split(",")[0])
                    late.add((partition, record.offset, start))
                task.stream_time = piece.stream_time
    aggs = tasks[0].aggregates
    finals = {k: tuple(agg.finalize(s) for agg, s in zip(aggs, v, strict=True)) for k, v in states.items()}
    return {k: (v[0], v[1]) for k, v in finals.items()}, late, tasks[0].window


HAND_MADE: list[Record] = [
    # partition 0, key s1: windows [0, 60s), [60s, 120s), ... (tumbling, grace 20 s)
    (b"s1", b'{"READING": 1, "TS": 10000}', 0, 0, 0),
    (b"s1", b'{"READING": 2, "TS": 70000}', 0, 1, 0),       # stream time 70 s
    (b"s1", b'{"READING": 4, "TS": 50000}', 0, 2, 0),       # out of order, [0, 60s) open until 80 s: counted
    (b"s1", b'{"READING": 8, "TS": 85000}', 0, 3, 0),       # stream time 85 s: [0, 60s) closes
    (b"s1", b'{"READING": 16, "TS": 59999}', 0, 5, 0),      # late for [0, 60s): dropped
    (b"s2", b'{"READING": 32, "TS": 30000}', 0, 6, 0),      # another key, same partition: late too
    (None, b'{"READING": 64, "TS": 999000}', 0, 7, 0),      # no key: moves no stream time
    (b"s2", b'{"READING": 128}', 0, 8, 0),                  # no event time: to the log
    (b"s2", b'{"READING": 256, "TS": 125000}', 0, 9, 0),
    # partition 1 has a stream time of its own: 30 s is not late there
    (b"s3", b'{"READING": 1, "TS": 30000}', 1, 0, 0),
    (b"s3", b"not json", 1, 1, 0),
]


@pytest.mark.parametrize("cut", [[], [3], [4, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
def test_tumbling_windows_close_at_stream_time_plus_grace_wherever_batches_are_cut(
        spark: SparkSession, tmp_path: Path, cut: list[int]) -> None:
    times: dict[Window, int] = {}
    got, late, window = run_batches(spark, BY_COLUMN, WINDOWS["TUMBLING"], split_batches(HAND_MADE, cut), tmp_path, times)
    assert got == {(0, b"s1", 0): (2, 5), (0, b"s1", 60000): (2, 10), (0, b"s2", 120000): (1, 256),
                   (1, b"s3", 0): (1, 1)}
    assert late == {(0, 5, 0), (0, 6, 0)}
    assert (got, late) == reference(HAND_MADE, window, by_column=True)
    # The latest event time each window counted (its late records' not among them).
    assert times == {(0, b"s1", 0): 50000, (0, b"s1", 60000): 85000, (0, b"s2", 120000): 125000, (1, b"s3", 0): 30000}


def test_a_window_closes_exactly_when_stream_time_reaches_its_end_plus_grace(spark: SparkSession, tmp_path: Path) -> None:
    # Grace 20 s: [0, 60s) closes at stream time 80 s, not a millisecond before.
    records: list[Record] = [
        (b"s1", b'{"READING": 1, "TS": 80000}', 0, 0, 0), (b"s1", b'{"READING": 2, "TS": 30000}', 0, 1, 0),
        (b"s1", b'{"READING": 4, "TS": 79999}', 1, 0, 0), (b"s1", b'{"READING": 8, "TS": 30000}', 1, 1, 0),
    ]
    got, late, window = run_batches(spark, BY_COLUMN, WINDOWS["TUMBLING"], [records], tmp_path)
    assert late == {(0, 1, 0)}
    assert got == {(0, b"s1", 60000): (1, 1), (1, b"s1", 60000): (1, 4), (1, b"s1", 0): (1, 8)}
    assert (got, late) == reference(records, window, by_column=True)


def test_the_reducer_reports_bad_records_and_the_stream_time_it_reached(spark: SparkSession, tmp_path: Path) -> None:
    table = f"CREATE TABLE w AS SELECT sensor, COUNT(*) AS n FROM r {WINDOWS['TUMBLING']} GROUP BY sensor"
    with reducer(spark, [BY_COLUMN, table], tmp_path) as (runner, tasks):
        tasks[1].stream_time = 500_000
        slices = runner._reduce(as_batch(spark, HAND_MADE))
    first, second = slices[0], slices[1]
    assert isinstance(first, WindowSlice) and isinstance(second, WindowSlice)
    assert (first.reduced_at, first.stream_time, first.count, first.last_offset) == (-1, 125000, 9, 9)
    assert [(b.offset, b.reason.split(":")[0]) for b in first.bad] == [(7, "record has no key, or one that is not UTF-8 text"),
                                                                       (8, "record has no event time")]
    assert [b.offset for b in first.late] == [5, 6]
    assert "closed at stream time 85000" in first.late[0].reason
    # Partition 1 was at 500 s: its record at 30 s is late there, and stream time stays.
    assert (second.reduced_at, second.stream_time, [b.offset for b in second.late]) == (500_000, 500_000, [0])
    assert [b.offset for b in second.bad] == [1]


_VALUE = st.one_of(
    st.sampled_from([b"{", b"garbage", b'{"READING": 3}']),
    st.builds(lambda reading, ts: json.dumps({"READING": reading, "TS": ts}).encode(),
              st.one_of(st.none(), st.integers(-5, 5)), st.integers(-1000, 400_000)),
)
_DRAWN = st.lists(st.tuples(st.integers(0, 1), st.sampled_from([None, b"k0", b"k1", b"k2"]), _VALUE,
                            st.integers(1, 2), st.integers(0, 400_000)), min_size=1, max_size=40)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=_DRAWN, cuts=st.lists(st.integers(0, 40), max_size=4), kind=st.sampled_from(sorted(WINDOWS)),
       by_column=st.booleans())
def test_random_out_of_order_records_give_the_reference_windows(
        spark: SparkSession, tmp_path: Path, drawn: list[tuple[int, bytes | None, bytes, int, int]],
        cuts: list[int], kind: str, by_column: bool) -> None:
    """Random keys, values, event times (out of order, some negative), gaps for transaction
    markers, both partitions, event time from a column or the record timestamp, tumbling and
    hopping windows, batches cut anywhere: the reference's windows and late records."""
    offsets = {0: 0, 1: 0}
    records: list[Record] = []
    for partition, key, value, gap, rowtime in drawn:
        offsets[partition] += gap
        records.append((key, value, partition, offsets[partition], rowtime))
    records.sort(key=lambda r: (r[3], r[2]))
    times: dict[Window, int] = {}
    want_times: dict[Window, int] = {}
    got, late, window = run_batches(spark, BY_COLUMN if by_column else BY_ROWTIME, WINDOWS[kind],
                                    split_batches(records, cuts), tmp_path, times)
    assert (got, late) == reference(records, window, by_column, want_times)
    assert times == want_times  # each window's rows are stamped with its latest event time


def test_window_starts_are_kafka_streams_windows_for() -> None:
    hopping = WindowSpec("HOPPING", 60_000, 20_000, 0, 60_000)
    assert list(hopping.starts(70_000)) == [20_000, 40_000, 60_000]
    assert list(hopping.starts(10_000)) == [0]  # no window starts before 0
    assert list(WindowSpec("TUMBLING", 60_000, 60_000, 0, 60_000).starts(59_999)) == [0]
    rng = random.Random(5)
    for _ in range(200):
        size = rng.randrange(1, 100)
        advance = rng.randrange(1, size + 1)
        t = rng.randrange(0, 1000)
        spec = WindowSpec("HOPPING", size, advance, 0, size)
        assert list(spec.starts(t)) == [s for s in range(0, t + 1, advance) if s <= t < s + size]


def test_a_session_batch_reduces_to_each_usable_record_in_offset_order(spark: SparkSession, tmp_path: Path) -> None:
    """Sessions merge record by record in the task, so the reducer hands it every usable
    record (offset, key, event time, its own partial state), in offset order per partition,
    and sends the rest to the processing log."""
    table = ("CREATE TABLE s AS SELECT sensor, COUNT(*) AS n, SUM(reading) AS total FROM r "
             "WINDOW SESSION (30 SECONDS) GROUP BY sensor")
    with reducer(spark, [BY_COLUMN, table], tmp_path) as (runner, tasks):
        assert isinstance(tasks[0], SessionAggregationTask)
        slices = runner._reduce(as_batch(spark, HAND_MADE))
    first, second = slices[0], slices[1]
    assert isinstance(first, SessionSlice) and isinstance(second, SessionSlice)
    assert [(o, k, t) for o, k, t, _ in first.records] == [
        (0, b"s1", 10000), (1, b"s1", 70000), (2, b"s1", 50000), (3, b"s1", 85000), (5, b"s1", 59999),
        (6, b"s2", 30000), (9, b"s2", 125000)]
    assert [state for *_, state in first.records][1] == [[1], [2]]  # COUNT(*) and SUM(reading) of one record
    assert [b.offset for b in first.bad] == [7, 8]
    assert (first.count, first.last_offset, second.count, [b.offset for b in second.bad]) == (9, 9, 2, [1])
    assert [(o, k, t) for o, k, t, _ in second.records] == [(0, b"s3", 30000)]


ALL_AGGREGATES = ("COUNT(*) AS n, COUNT(reading) AS c, SUM(reading) AS s, AVG(reading) AS a, MIN(reading) AS lo, "
                  "MAX(reading) AS hi, LATEST_BY_OFFSET(reading) AS latest, EARLIEST_BY_OFFSET(reading) AS earliest, "
                  "COUNT_DISTINCT(reading) AS d, COLLECT_LIST(reading) AS l, LATEST_BY_OFFSET(reading, false) AS any, "
                  "LATEST_BY_OFFSET(reading, 2) AS last2, EARLIEST_BY_OFFSET(reading, 2, false) AS first2, "
                  "COLLECT_SET(reading) AS distinct_readings, TOPK(reading, 2) AS top2, TOPKDISTINCT(reading, 2) AS "
                  "topd2, HISTOGRAM(CAST(reading AS VARCHAR)) AS hist, ATTR(reading) AS only, ATTR(sensor) AS one, "
                  "CORRELATION(reading, ts) AS corr, STDDEV_SAMP(reading) AS sd")


@pytest.mark.parametrize("cuts", [[], [2], [1, 3, 5]])
def test_every_aggregate_works_per_window(spark: SparkSession, tmp_path: Path, cuts: list[int]) -> None:
    """Every aggregate of the GROUP BY list, per hopping window, batches cut anywhere: each
    window's values are the aggregates of exactly the readings it holds, in offset order (the
    BY_OFFSET ones skipping NULLs unless told not to, as ksqlDB's: windows start and end with a
    NULL)."""
    readings = [(1, 10_000), (2, 25_000), (None, 30_000), (2, 41_000), (7, 15_000), (3, 55_000), (None, 58_000)]
    records: list[Record] = [(b"k", json.dumps({"READING": r, "TS": t}).encode(), 0, i, 0)
                             for i, (r, t) in enumerate(readings)]
    states: dict[bytes, list[Any]] = {}
    times: dict[int, int] = {}
    table = (f"CREATE TABLE w AS SELECT sensor, {ALL_AGGREGATES} FROM r "
             "WINDOW HOPPING (SIZE 30 SECONDS, ADVANCE BY 15 SECONDS) GROUP BY sensor")
    with reducer(spark, [BY_COLUMN, table], tmp_path) as (runner, tasks):
        task = tasks[0]
        for batch in split_batches(records, cuts):
            piece = runner._reduce(as_batch(spark, batch))[0]
            assert isinstance(piece, WindowSlice)
            for key, partial in piece.partials:
                old = states.get(key)
                states[key] = partial if old is None else [
                    agg.merge(o, n) for agg, o, n in zip(task.aggregates, old, partial, strict=True)]
                start = split_windowed_key(key)[1]
                times[start] = max(times.get(start, 0), piece.times[key])
            task.stream_time = piece.stream_time
    # The correlation and the sample deviation (last) to 9 places: Spark's partials and the merges
    # round otherwise than Python's (NaN as text: no NaN equals another).
    def near(value: float) -> float | str:
        return "NaN" if math.isnan(value) else round(value, 9)

    got = {tuple(row[1:3]): [*row[3:-2], near(row[-2]), near(row[-1])]
           for row in (task.row(k, s) for k, s in states.items())}
    want = {}
    for start in range(0, 60_000, 15_000):
        held = [r for r, t in readings if start <= t < start + 30_000]
        if not held:
            continue
        values = [r for r in held if r is not None]
        pairs = [t for r, t in readings if start <= t < start + 30_000 and r is not None]  # (each reading's TS)
        want[(start, start + 30_000)] = [
            len(held), len(values), sum(values) if values else None, sum(values) / len(values) if values else None,
            min(values, default=None), max(values, default=None), values[-1] if values else None,
            values[0] if values else None, len(set(values)), held, held[-1], values[-2:], held[:2],
            list(dict.fromkeys(held)), sorted(values, reverse=True)[:2], sorted(set(values), reverse=True)[:2],
            dict(Counter(str(v) for v in values)), held[0] if len(set(held)) == 1 else None, "k",
            near(statistics.correlation(values, pairs)) if len(set(values)) > 1 and len(set(pairs)) > 1 else "NaN",
            round(statistics.stdev(values), 9) if len(values) > 1 else 0.0]
    assert got == want
    # Reduced by Spark (these aggregates have no Arrow forms), each window's latest event time too.
    assert times == {start: max(t for _, t in readings if start <= t < start + 30_000) for start, _ in want}


def test_event_time_from_text_in_the_timestamp_format(spark: SparkSession, tmp_path: Path) -> None:
    """A VARCHAR TIMESTAMP column read with TIMESTAMP_FORMAT gives the event time; text that does
    not parse gives none (the processing log), and the query goes on."""
    source = ("CREATE STREAM r (sensor VARCHAR KEY, reading INT, at VARCHAR) WITH (kafka_topic='r', partitions=1, "
              "value_format='json', timestamp='at', timestamp_format='yyyy-MM-dd''T''HH:mm:ss.SSSXXX')")
    table = "CREATE TABLE w AS SELECT sensor, COUNT(*) AS n FROM r WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY sensor"
    texts = ["2026-11-26T08:00:59.999Z", "2026-11-26T10:01:00.000+02:00", "26/11/2026 08:00"]
    with reducer(spark, [source, table], tmp_path) as (runner, _):
        piece = runner._reduce(as_batch(spark, [(b"s", json.dumps({"READING": 1, "AT": t}).encode(), 0, i, 0)
                                                for i, t in enumerate(texts)]))[0]
    assert isinstance(piece, WindowSlice)
    minute = int(datetime(2026, 11, 26, 8, 0, tzinfo=UTC).timestamp() * 1000)
    assert sorted(split_windowed_key(k)[1] for k, _ in piece.partials) == [minute, minute + 60_000]
    assert piece.stream_time == minute + 60_000
    assert [(b.offset, b.reason.split(":")[0]) for b in piece.bad] == [(2, "record has no event time")]
