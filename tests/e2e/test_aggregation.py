"""GROUP BY tables on the real cluster (Kafka, Spark, RocksDB, gRPC), checked key by key
against values computed here from the generated input:

- a high-cardinality aggregation with malformed records mixed in;
- the same while a worker is SIGKILLed at random moments and restarted (exactly once);
- a restore from the changelog after the workers' local state is deleted, proven from
  offsets: every task restored as many records as its changelog partition holds and
  started reading its input at the end, not the beginning.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import time
from collections import defaultdict
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiokafka import AIOKafkaProducer

from millpond.cli.client import RouterClient
from millpond.common.v1 import rows_pb2
from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.deploy.local.launcher import LocalCluster
from millpond.services.worker.state.store import path_segment
from millpond.shared.catalog.names import changelog_topic, processing_log_topic
from millpond.shared.kafka.admin import GroupOffsets
from millpond.shared.kafka.connection import KafkaConnection
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.kafka.serde import from_proto
from millpond.shared.net import free_port
from millpond.shared.rpc.converters import task_report_from_proto
from millpond.shared.task_status import RUNNING, TaskReport
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc
from tests.e2e.helpers import kill_spark_driver, log_entries, pull_until, read_all, read_records, reads_own_writes, run, sink_until
from tests.e2e.workload import (
    PARTITIONS,
    Expected,
    area_of,
    check_table,
    create_table,
    end_offsets,
    ensure_stream,
    produce,
    readings,
    table_rows,
)

CATCH_UP_S = 300


@pytest.fixture(scope="module")
def agg_cluster(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two workers whose micro-batches are small, so a run spans many transactions."""
    local = LocalCluster(data_dir=Path(tmp_path_factory.mktemp("aggregation")), workers=2,
                         kafka=kafka.bootstrap_servers, router_port=free_port(),
                         service_id=f"agg{os.getpid()}", spark_master="local[1]",
                         # Stages park after 2 s without input, so the tests' pauses park and
                         # resume them all the time.
                         worker_env={"MILLPOND_MAX_OFFSETS_PER_TRIGGER": "10000", "MILLPOND_PARK_AFTER_IDLE_MS": "2000"})
    local.start()
    yield local
    local.stop()


def task_reports(cluster: LocalCluster, query_id: str) -> list[TaskReport]:
    with grpc.insecure_channel(cluster.child("coordinator").endpoint) as channel:
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
        reply = stub.ListTaskStatuses(coordinator_pb2.ListTaskStatusesRequest(query_id=query_id), timeout=10)
    return [task_report_from_proto(t.worker_id, t) for t in reply.tasks]


async def wait_caught_up(cluster: LocalCluster, query_id: str, topic: str) -> list[TaskReport]:
    """Wait until every task runs and has processed its partition to the end."""
    ends = await end_offsets(cluster.bootstrap, topic)
    deadline = time.monotonic() + CATCH_UP_S
    reports: list[TaskReport] = []
    while time.monotonic() < deadline:
        reports = await asyncio.to_thread(task_reports, cluster, query_id)
        done = {r.partition for r in reports if r.state == RUNNING and r.input_offset >= ends[r.partition]}
        if done == set(range(PARTITIONS)):
            return reports
        await asyncio.sleep(0.2)
    raise AssertionError(f"{query_id} did not catch up with {ends}: {reports}")


async def check_sink(bootstrap: str, topic: str, expected: Expected) -> None:
    """The sink topic's last value per key is the table's; counts only ever grow per key
    (a batch applied twice, or lost and then redone, would break one or the other)."""
    counts: dict[str, list[int]] = defaultdict(list)
    for partition, _offset, key, value in sorted(await read_all(bootstrap, topic)):
        assert key is not None and value is not None
        sensor = key.decode()
        assert partition == partition_for(key, PARTITIONS)
        record = json.loads(value)
        counts[sensor].append(record["N"])
    assert {s: c[-1] for s, c in counts.items()} == dict(expected.count)
    assert all(a < b for c in counts.values() for a, b in pairwise(c))


async def until_logged(cluster: LocalCluster, message: str, query_id: str, count: int, timeout_s: float = 60) -> None:
    """Wait until the workers logged ``message`` for Spark queries of ``query_id`` over ``count``
    distinct partitions."""
    deadline = time.monotonic() + timeout_s
    partitions: set[int] = set()
    while time.monotonic() < deadline:
        partitions = {p for c in cluster.children if c.name.startswith("worker") and c.process.poll() is None
                      for e in map(json.loads, (line for line in c.log.read_text().splitlines() if line.startswith("{")))
                      if e.get("msg") == message and e.get("query", "").startswith(query_id + "-")
                      for p in e["partitions"]}
        if len(partitions) >= count:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{message!r} logged for partitions {sorted(partitions)} only, within {timeout_s} s")


async def test_high_cardinality_aggregation_with_malformed_records_is_exact(agg_cluster: LocalCluster) -> None:
    stream, table = f"hc_{agg_cluster.service_id}", f"hc_stats_{agg_cluster.service_id}"
    rng = random.Random(7)
    expected = Expected()
    events = readings(rng, 50_000, 2_000, expected)
    malformed: list[tuple[bytes | None, bytes]] = [
        (b"sensor-00001", b"{not json"), (b"sensor-00002", b'{"AREA": "a", "READING": "high"}'),
        (None, b'{"AREA": "a", "READING": 5}'), (b"sensor-00003", b"[1, 2]")] * 10
    for i, bad in enumerate(malformed):
        events.insert(1_000 + i * 1_200, bad)
    ensure_stream(agg_cluster, stream)
    await produce(agg_cluster.bootstrap, stream, events)
    query_id = create_table(agg_cluster, stream, table)

    await wait_caught_up(agg_cluster, query_id, stream)
    check_table(await asyncio.to_thread(table_rows, agg_cluster, table), expected)
    await check_sink(agg_cluster.bootstrap, table.upper(), expected)

    # Idle: every worker's Spark query parks (its table still answers); new input resumes it.
    await until_logged(agg_cluster, "query parked", query_id, count=PARTITIONS)
    check_table(await asyncio.to_thread(table_rows, agg_cluster, table), expected)
    await produce(agg_cluster.bootstrap, stream, readings(rng, 5_000, 2_000, expected))
    await wait_caught_up(agg_cluster, query_id, stream)
    check_table(await asyncio.to_thread(table_rows, agg_cluster, table), expected)
    await check_sink(agg_cluster.bootstrap, table.upper(), expected)
    await until_logged(agg_cluster, "query resumed", query_id, count=PARTITIONS)

    logged = [json.loads(v or b"{}") for *_, v in
              await read_all(agg_cluster.bootstrap, processing_log_topic(agg_cluster.service_id))]
    mine = [e for e in logged if e["QUERY_ID"] == query_id]
    reasons = sorted((e["RECORD"], e["REASON"]) for e in mine)
    assert len(mine) == len(malformed)
    assert {r for _, r in reasons} == {"value is not JSON of the declared columns and types",
                                         "record has no key, or one that is not UTF-8 text"}
    assert {rec for rec, r in reasons if r == "record has no key, or one that is not UTF-8 text"} == {'{"AREA": "a", "READING": 5}'}


async def test_sigkilled_worker_loses_nothing_and_counts_nothing_twice(agg_cluster: LocalCluster) -> None:
    stream, table = f"fault_{agg_cluster.service_id}", f"fault_stats_{agg_cluster.service_id}"
    rng = random.Random(11)
    expected = Expected()
    ensure_stream(agg_cluster, stream)
    # Enough backlog that every kill lands mid-stream (10k records a trigger), no more:
    # the time goes into the kills and restores, not into reading input.
    await produce(agg_cluster.bootstrap, stream, readings(rng, 100_000, 3_000, expected))
    query_id = create_table(agg_cluster, stream, table)
    areas = f"fault_areas_{agg_cluster.service_id}"
    run(agg_cluster, f"SET 'auto.offset.reset'='earliest'; CREATE TABLE {areas} AS SELECT area, COUNT(*) AS n, "
                     f"SUM(reading) AS total FROM {stream} GROUP BY area;")

    # Worker-1's Spark driver dies under it (a JVM crash): the worker starts a new one, and
    # its tasks go on from their committed positions there, none moved (it never stopped beating).
    await wait_progressing(agg_cluster, query_id, "worker-1")
    before = {r.partition: r for r in await asyncio.to_thread(task_reports, agg_cluster, query_id)
              if r.worker_id == "worker-1"}
    kill_spark_driver(agg_cluster, "worker-1")
    await produce(agg_cluster.bootstrap, stream, readings(rng, 20_000, 3_000, expected))
    await wait_restarted(agg_cluster, query_id, before)
    worker = agg_cluster.child("worker-1")
    assert worker.process.poll() is None
    assert [e["restarts"] for e in log_entries(worker.log)
            if e.get("msg", "").startswith("the Spark driver stopped; starting a new one")] == [1]

    # Two kills cover both ways a task comes back: a quick restart mid-stream, and staying
    # down until worker-2 restored the tasks from the changelog (then they move back).
    for kill in range(2):
        if kill:
            # Worker-1 takes tasks back once its Spark session started, maybe after worker-2
            # processed what came meanwhile: new input puts it mid-stream.
            await wait_progressing(agg_cluster, query_id, "worker-1", committed=False)
            await produce(agg_cluster.bootstrap, stream, readings(rng, 20_000, 3_000, expected))
        # Kill while worker-1 is mid-stream: its tasks run and have committed since they started.
        await wait_progressing(agg_cluster, query_id, "worker-1")
        await asyncio.sleep(rng.uniform(0.2, 3))
        agg_cluster.kill("worker-1")
        checkpoints = agg_cluster.data_dir / "state" / path_segment("worker-1") / "checkpoints"
        left = set(checkpoints.iterdir())
        assert left, "the killed worker's running queries had no checkpoint in its state directory"
        # More input arrives while the worker is down and while it comes back.
        await produce(agg_cluster.bootstrap, stream, readings(rng, 20_000, 3_000, expected))
        if kill == 1:  # once, stay down until the tasks moved: worker-2 restores them from the changelog
            await wait_progressing(agg_cluster, query_id, "worker-2", partitions=PARTITIONS)
        await asyncio.to_thread(agg_cluster.restart, "worker-1")
        assert not left & set(checkpoints.iterdir() if checkpoints.exists() else ()), "a killed run's checkpoints leak"

    await wait_caught_up(agg_cluster, query_id, stream)
    check_table(await asyncio.to_thread(table_rows, agg_cluster, table), expected)
    await check_sink(agg_cluster.bootstrap, table.upper(), expected)

    # The same input re-keyed through the repartition topic (two transactional stages) is exact too.
    by_area: dict[str, list[object]] = {}
    for sensor, n in expected.count.items():
        row = by_area.setdefault(area_of(sensor), [area_of(sensor), 0, 0])
        row[1] = int(str(row[1])) + n
        row[2] = int(str(row[2])) + expected.total[sensor]
    assert await asyncio.to_thread(pull_until, agg_cluster, f"SELECT * FROM {areas};", by_area) == by_area
    counts: dict[bytes, list[int]] = defaultdict(list)
    for _, _, key, value in sorted(await read_all(agg_cluster.bootstrap, areas.upper())):
        assert key is not None and value is not None
        counts[key].append(json.loads(value)["N"])
    assert {k.decode(): c[-1] for k, c in counts.items()} == {a: r[1] for a, r in by_area.items()}
    assert all(a < b for c in counts.values() for a, b in pairwise(c))


async def wait_progressing(cluster: LocalCluster, query_id: str, worker: str, partitions: int = 1,
                           committed: bool = True) -> None:
    """Until ``worker`` runs at least ``partitions`` tasks of the query, all RUNNING, and (if
    ``committed``) has committed a batch since they started."""
    deadline = time.monotonic() + CATCH_UP_S
    while time.monotonic() < deadline:
        mine = [r for r in await asyncio.to_thread(task_reports, cluster, query_id) if r.worker_id == worker]
        if (len(mine) >= partitions and all(r.state == RUNNING for r in mine)
                and (not committed or any(r.input_offset > r.start_input_offset for r in mine))):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{worker} did not make progress on {query_id}")


async def wait_restarted(cluster: LocalCluster, query_id: str, before: dict[int, TaskReport]) -> None:
    """Until the tasks ``before`` reports (worker-1's) have failed and run again there, and
    each has committed a batch since."""
    deadline = time.monotonic() + CATCH_UP_S
    reports: list[TaskReport] = []
    while time.monotonic() < deadline:
        reports = [r for r in await asyncio.to_thread(task_reports, cluster, query_id) if r.partition in before]
        if len(reports) == len(before) and all(
                r.worker_id == "worker-1" and r.state == RUNNING and r.failures > before[r.partition].failures
                and r.input_offset > r.start_input_offset for r in reports):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"worker-1's tasks of {query_id} did not go on after its Spark driver died: {reports}")


async def wait_no_tasks(cluster: LocalCluster, query_id: str) -> None:
    """Until the coordinator noticed the stopped workers (no task of the query reported)."""
    deadline = time.monotonic() + 60
    while await asyncio.to_thread(task_reports, cluster, query_id):
        assert time.monotonic() < deadline, "the coordinator still reports tasks of stopped workers"
        await asyncio.sleep(0.3)


async def test_deleted_local_state_comes_back_from_the_changelog_not_from_the_input(
        agg_cluster: LocalCluster) -> None:
    stream, table = f"restore_{agg_cluster.service_id}", f"restore_stats_{agg_cluster.service_id}"
    expected = Expected()
    ensure_stream(agg_cluster, stream)
    await produce(agg_cluster.bootstrap, stream, readings(random.Random(5), 30_000, 1_000, expected))
    query_id = create_table(agg_cluster, stream, table)
    await wait_caught_up(agg_cluster, query_id, stream)

    for name in ("worker-1", "worker-2"):
        agg_cluster.kill(name)
    await wait_no_tasks(agg_cluster, query_id)
    shutil.rmtree(agg_cluster.data_dir / "state")
    input_ends = await end_offsets(agg_cluster.bootstrap, stream)
    changelog = await read_all(agg_cluster.bootstrap, changelog_topic(agg_cluster.service_id, query_id))
    changelog_counts = {p: sum(1 for r in changelog if r[0] == p) for p in range(PARTITIONS)}

    await asyncio.to_thread(agg_cluster.restart, "worker-1")  # alone, so it gets every task at once
    reports = await wait_caught_up(agg_cluster, query_id, stream)
    try:
        for report in reports:
            assert report.worker_id == "worker-1"
            # Rebuilt from every committed changelog record of its partition...
            assert report.restored_records == changelog_counts[report.partition] > 0
            # ...and reading the input from where the query had got to, not from the start.
            assert report.start_input_offset == input_ends[report.partition] > 0
        check_table(await asyncio.to_thread(table_rows, agg_cluster, table), expected)
    finally:
        await asyncio.to_thread(agg_cluster.restart, "worker-2")


# --- Windowed aggregations ------------------------------------------------------------------

MINUTE = 60_000


def windows_reference(records: list[tuple[str, int, int]], size_ms: int, grace_ms: int, retention_ms: int,
                      ) -> tuple[dict[tuple[str, int], list[int]], list[tuple[str, int]], dict[int, int],
                                 dict[tuple[str, int], list[int]]]:
    """Tumbling windows of ``records`` (sensor, reading, event time), in the order they were
    written: per (sensor, window start) the readings it holds once the windows older than the
    retention left; the (sensor, event time) of every record dropped as late; each partition's
    final stream time; and every window's readings, retention aside. Stream time is per partition (murmur2 of the key), and a
    record is late once its window's end plus grace is at or before it, as Kafka Streams."""
    stream: dict[int, int] = defaultdict(lambda: -1)
    windows: dict[tuple[str, int], list[int]] = defaultdict(list)
    late: list[tuple[str, int]] = []
    for sensor, reading, ts in records:
        partition = partition_for(sensor.encode(), PARTITIONS)
        stream[partition] = max(stream[partition], ts)
        start = ts - ts % size_ms
        if start + size_ms + grace_ms <= stream[partition]:
            late.append((sensor, ts))
        else:
            windows[(sensor, start)].append(reading)
    kept = {(s, w): r for (s, w), r in windows.items()
            if w > stream[partition_for(s.encode(), PARTITIONS)] - retention_ms}
    return kept, late, dict(stream), dict(windows)


def sessions_reference(records: list[tuple[str, int, int]], gap_ms: int, grace_ms: int, retention_ms: int,
                       ) -> tuple[list[tuple[object, ...]], int]:
    """Session windows of ``records`` (sensor, reading, event time) in the order written, as
    Kafka Streams merges them record by record: (sensor, start, end, COUNT, SUM) of every
    session left once those ended ``retention`` before stream time went, and how many records
    were late (their merged session ended before stream time minus grace)."""
    stream: dict[int, int] = defaultdict(lambda: -1)
    sessions: dict[str, list[list[int]]] = defaultdict(list)
    late = 0
    for sensor, reading, ts in records:
        partition = partition_for(sensor.encode(), PARTITIONS)
        stream[partition] = max(stream[partition], ts)
        touching = [s for s in sessions[sensor] if s[1] >= ts - gap_ms and s[0] <= ts + gap_ms]
        merged = [min([ts, *(s[0] for s in touching)]), max([ts, *(s[1] for s in touching)]),
                  1 + sum(s[2] for s in touching), reading + sum(s[3] for s in touching)]
        if merged[1] < stream[partition] - grace_ms:
            late += 1
            continue
        sessions[sensor] = [s for s in sessions[sensor] if s not in touching] + [merged]
    rows = [(sensor, *s) for sensor, kept in sessions.items() for s in kept
            if s[1] > stream[partition_for(sensor.encode(), PARTITIONS)] - retention_ms]
    return sorted(rows), late


def windowed_rows(cluster: LocalCluster, sql: str) -> list[tuple[object, ...]]:
    return sorted(tuple(row) for row in run(cluster, sql))


def rows_until(cluster: LocalCluster, sql: str, want: list[tuple[object, ...]], timeout: float = 240,
               ) -> list[tuple[object, ...]]:
    """Pull ``sql`` until its rows (sorted) are ``want``; the last answer."""
    deadline = time.monotonic() + timeout
    rows: list[tuple[object, ...]] = []
    while time.monotonic() < deadline:
        try:
            rows = windowed_rows(cluster, sql)
        except grpc.RpcError:
            rows = []
        if rows == want:
            break
        time.sleep(0.3)
    return rows


async def test_readings_per_minute_in_tumbling_windows_are_exact_with_late_records_and_retention(
        agg_cluster: LocalCluster) -> None:
    """The seed's readings, averaged per sensor per 1-minute tumbling window over the TS column,
    written by INSERT with out-of-order event times: within the grace period a record still
    counts, beyond it it is dropped (to the processing log, with the reason); windows older than
    the retention leave the store and the changelog. Pulls by key, with window bounds, and scans
    give exactly the reference's windows; the sink topic's keys are ksqlDB's windowed keys."""
    stream, table = f"wr_{agg_cluster.service_id}", f"wr_per_minute_{agg_cluster.service_id}"
    final, sessions = f"wr_final_{agg_cluster.service_id}", f"wr_sessions_{agg_cluster.service_id}"
    busy, long_sessions = f"wr_busy_{agg_cluster.service_id}", f"wr_long_{agg_cluster.service_id}"
    size, grace, retention = MINUTE, 30_000, 5 * MINUTE
    rng = random.Random(21)
    records: list[tuple[str, int, int]] = []
    clock = 0
    # Two hours ago: results are stamped with their records' times, and a sink topic's time
    # retention (a week) would delete records from 1970 whenever its check came by.
    base = (int(time.time() * 1000) - 120 * MINUTE) // MINUTE * MINUTE
    for _ in range(120):
        clock += rng.randrange(0, 12_000)
        ts = clock - rng.choice([0, 0, 0, rng.randrange(1, 25_000), rng.randrange(40_000, 120_000)])
        records.append((f"sensor-{rng.randrange(4)}", rng.randrange(0, 100), base + max(ts, 0)))
    windows, late, stream_time, every_window = windows_reference(records, size, grace, retention)
    assert late and len(windows) > 10, "the input has no late record, or too few windows, to prove anything"
    accepted_out_of_order = [r for i, r in enumerate(records) if any(r[2] < o[2] for o in records[:i])
                             and (r[0], r[2]) not in late]
    assert accepted_out_of_order, "no out-of-order record within grace"

    inserts = "".join(f"INSERT INTO {stream} (sensor, reading, ts) VALUES ('{s}', {r}, {t});" for s, r, t in records)
    run(agg_cluster, f"""
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM {stream} (sensor VARCHAR KEY, reading INT, ts BIGINT)
          WITH (kafka_topic='{stream}', partitions={PARTITIONS}, value_format='json', timestamp='ts');
        CREATE TABLE {table} AS SELECT sensor, AVG(reading) AS avg_reading, COUNT(*) AS n FROM {stream}
          WINDOW TUMBLING (SIZE 1 MINUTE, RETENTION 5 MINUTES, GRACE PERIOD 30 SECONDS) GROUP BY sensor EMIT CHANGES;
        CREATE TABLE {sessions} AS SELECT sensor, COUNT(*) AS n, SUM(reading) AS total FROM {stream}
          WINDOW SESSION (20 SECONDS, RETENTION 5 MINUTES, GRACE PERIOD 30 SECONDS) GROUP BY sensor;
        CREATE TABLE {final} AS SELECT sensor, WINDOWSTART AS ws, COUNT(*) AS n, WINDOWEND AS we FROM {stream}
          WINDOW TUMBLING (SIZE 1 MINUTE, RETENTION 5 MINUTES, GRACE PERIOD 30 SECONDS) GROUP BY sensor EMIT FINAL;
        CREATE TABLE {busy} AS SELECT sensor, WINDOWSTART AS ws, n FROM {table} WHERE n >= 2;
        CREATE TABLE {long_sessions} AS SELECT sensor, WINDOWEND - WINDOWSTART AS span, total FROM {sessions}
          WHERE WINDOWEND > WINDOWSTART;
        {inserts}""")
    query_id = f"CTAS_{table.upper()}_"
    want: list[tuple[object, ...]] = sorted((s, w, w + size, sum(r) / len(r), len(r)) for (s, w), r in windows.items())
    got = rows_until(agg_cluster, f"SELECT * FROM {table};", want)
    assert got == want

    sensor = "sensor-1"
    mine = [row for row in want if row[0] == sensor]
    assert windowed_rows(agg_cluster, f"SELECT * FROM {table} WHERE sensor = '{sensor}';") == mine
    low, high = mine[1][1], mine[-1][1]
    assert isinstance(low, int) and isinstance(high, int)
    bounded = windowed_rows(agg_cluster, f"SELECT sensor, WINDOWSTART, WINDOWEND, n FROM {table} "
                                         f"WHERE sensor = '{sensor}' AND WINDOWSTART >= {low} AND WINDOWSTART < {high};")
    assert bounded == [(s, w, e, n) for s, w, e, _, n in mine if low <= int(str(w)) < high]
    assert windowed_rows(agg_cluster, f"SELECT * FROM {table} WHERE sensor = 'no-such-sensor';") == []

    logged = [json.loads(v or b"{}") for *_, v in
              await read_all(agg_cluster.bootstrap, processing_log_topic(agg_cluster.service_id))]
    dropped = [e for e in logged if e["QUERY_ID"].startswith(query_id)]
    assert sorted((e["RECORD"] and json.loads(e["RECORD"])["TS"]) for e in dropped) == sorted(t for _, t in late)
    assert all(e["REASON"].startswith("late: its TUMBLING window [") for e in dropped)

    # The sink's keys: the key, then the window start in 8 bytes big-endian (ksqlDB's windowed key).
    last: dict[tuple[str, int], dict[str, object]] = {}
    for _, _, key, value in sorted(await read_all(agg_cluster.bootstrap, table.upper())):
        assert key is not None and value is not None
        last[(key[:-8].decode(), int.from_bytes(key[-8:], "big"))] = json.loads(value)
    assert {k: v["N"] for k, v in last.items() if k in windows} == {k: len(r) for k, r in windows.items()}
    expired = set(last) - set(windows)
    assert expired, "no window outlived its retention"
    # Expired windows are tombstoned in the changelog (the store lost them: the scan above).
    query = next(e["QUERY_ID"] for e in dropped)
    changelog = await read_all(agg_cluster.bootstrap, changelog_topic(agg_cluster.service_id, query))
    latest: dict[bytes, bytes | None] = {}
    for _, _, key, value in sorted(changelog):
        assert key is not None
        latest[key] = value
    gone = {(k[:-8].decode(), int.from_bytes(k[-8:], "big")) for k, v in latest.items() if v is None}
    assert gone == expired
    assert max(stream_time.values()) > base + retention

    # EMIT FINAL: one sink record per window, once stream time closed it (end plus grace), with
    # its final count; none for a window still open.
    closed = {k: len(r) for k, r in every_window.items()
              if k[1] + size + grace <= stream_time[partition_for(k[0].encode(), PARTITIONS)]}
    assert closed and len(closed) < len(every_window)
    emitted: list[tuple[tuple[str, int], int]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        values = [((k[:-8].decode(), int.from_bytes(k[-8:], "big")), json.loads(v))
                  for _, _, k, v in sorted(await read_all(agg_cluster.bootstrap, final.upper()))
                  if k is not None and v is not None]
        # The window's bounds selected as value columns (WINDOWSTART AS ws, WINDOWEND AS we).
        assert all((v["WS"], v["WE"]) == (k[1], k[1] + size) for k, v in values)
        emitted = [(k, v["N"]) for k, v in values]
        if len(emitted) >= len(closed):
            break
        await asyncio.sleep(0.5)
    assert sorted(emitted) == sorted(closed.items())

    # Session windows of 20 s over the same records: merged as records bridge them, late ones
    # dropped, old ones gone; a key's lookup reads its sessions alone.
    want_sessions, late_sessions = sessions_reference(records, 20_000, 30_000, retention)
    assert late_sessions and len(want_sessions) > 10
    assert rows_until(agg_cluster, f"SELECT * FROM {sessions};", want_sessions) == want_sessions
    assert windowed_rows(agg_cluster, f"SELECT * FROM {sessions} WHERE sensor = '{sensor}';") == [
        row for row in want_sessions if row[0] == sensor]

    # Tables over those windowed tables: their rows filtered and projected, window by window,
    # keyed by the same windowed keys; a window that stopped passing the WHERE, or a merged-away
    # session, is gone, and the windows their sources let go at the retention leave them too.
    want_busy = sorted((s, w, w + size, w, len(r)) for (s, w), r in windows.items() if len(r) >= 2)
    ever_busy = {k for k, r in every_window.items() if len(r) >= 2}
    assert want_busy and len(want_busy) < len(ever_busy) and len(want_busy) < len(windows)
    assert rows_until(agg_cluster, f"SELECT * FROM {busy};", want_busy) == want_busy
    assert windowed_rows(agg_cluster, f"SELECT * FROM {busy} WHERE sensor = '{sensor}' AND WINDOWSTART >= {low};") == [
        row for row in want_busy if row[0] == sensor and int(str(row[1])) >= low]
    want_long = sorted((s, start, end, end - start, total) for s, start, end, _, total in want_sessions if end > start)
    assert want_long and len(want_long) < len(want_sessions)
    assert rows_until(agg_cluster, f"SELECT * FROM {long_sessions};", want_long) == want_long
    sink_keys = {k for _, _, k, v in await read_all(agg_cluster.bootstrap, busy.upper()) if v is not None}
    assert {(k[:-8].decode(), int.from_bytes(k[-8:], "big")) for k in sink_keys} == ever_busy


async def produce_timed(bootstrap: str, topic: str, records: list[tuple[str, str, int, int]]) -> None:
    """(sensor, area, reading, record timestamp) records, keyed and partitioned by sensor as the Java client."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=256 * 1024)
    await producer.start()
    try:
        futures = [await producer.send(topic, json.dumps({"AREA": area, "READING": reading}).encode(),
                                       key=sensor.encode(), partition=partition_for(sensor.encode(), PARTITIONS),
                                       timestamp_ms=ts)
                   for sensor, area, reading, ts in records]
        await producer.flush()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def timed_readings(rng: random.Random, start: int, count: int) -> list[tuple[str, str, int, int]]:
    """Readings 5 ms of event time apart, one in twenty set back by up to 30 s (late or not)."""
    out = []
    for i in range(count):
        sensor = f"sensor-{rng.randrange(200):05d}"
        ts = start + 5 * i - (rng.randrange(30_000) if rng.random() < 0.05 else 0)
        out.append((sensor, area_of(sensor), rng.randrange(-500, 1000), max(ts, 0)))
    return out


def scan_partition(endpoint: str, table: str, partition: int) -> list[tuple[object, ...]] | None:
    """One worker's rows of one partition of ``table``, from its active or its standby copy;
    None while the worker holds no copy of it (UNAVAILABLE: not placed there yet)."""
    request = worker_pb2.ScanPagesRequest(table=table, partitions=[partition], allow_standby=True)
    with grpc.insecure_channel(endpoint) as channel:
        try:
            pages = worker_pb2_grpc.WorkerServiceStub(channel).ScanPages(request, timeout=30)
            return sorted(tuple(from_proto(v) for v in row.values)
                          for page in pages for row in rows_pb2.StatementResult.FromString(page.rows).rows)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
                raise
            return None


async def scan_until(endpoint: str, table: str, partition: int, want: list[tuple[object, ...]],
                     timeout_s: float = 60) -> list[tuple[object, ...]] | None:
    """``scan_partition`` until it gives ``want`` or the time is up: the last rows it gave."""
    deadline = time.monotonic() + timeout_s
    rows = await asyncio.to_thread(scan_partition, endpoint, table, partition)
    while rows != want and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        rows = await asyncio.to_thread(scan_partition, endpoint, table, partition)
    return rows


@pytest.mark.slow  # 45 s; make test's fresh-clone CI took 14:17 of its 15 minutes on 2026-12-01; make test-all runs it
async def test_windowed_tables_are_exact_across_a_sigkill_and_standbys_serve_their_windows(
        agg_cluster: LocalCluster) -> None:
    """Tumbling windows per sensor (late records dropped, windows expiring), hopping windows per
    area (re-keyed through the repartition topic, the record timestamps in a value column) and
    session windows per sensor, by record timestamp, while worker-1 is SIGKILLed mid-stream and
    restarted: every table ends exactly as the reference, and every partition's standby copy of
    the tumbling windows holds the same windows."""
    stream = f"wk_{agg_cluster.service_id}"
    per_sensor, per_area = f"wk_sensor_{agg_cluster.service_id}", f"wk_area_{agg_cluster.service_id}"
    per_session = f"wk_session_{agg_cluster.service_id}"
    rng = random.Random(31)
    # Event times of the last few minutes: the topic's retention (7 days, by record timestamp)
    # would delete records stamped in 1970 before the queries read them.
    base = (int(time.time() * 1000) - 10 * MINUTE) // MINUTE * MINUTE
    records = timed_readings(rng, base, 30_000)
    ensure_stream(agg_cluster, stream)
    await produce_timed(agg_cluster.bootstrap, stream, records)
    client = RouterClient(agg_cluster.router, timeout=120)
    try:
        outcomes = list(client.run_script(f"""
            SET 'auto.offset.reset'='earliest';
            CREATE TABLE {per_sensor} AS SELECT sensor, COUNT(*) AS n, SUM(reading) AS total FROM {stream}
              WINDOW TUMBLING (SIZE 10 SECONDS, RETENTION 2 MINUTES, GRACE PERIOD 5 SECONDS) GROUP BY sensor;
            CREATE TABLE {per_area} AS SELECT area, COUNT(*) AS n, MAX(reading) AS top FROM {stream}
              WINDOW HOPPING (SIZE 30 SECONDS, ADVANCE BY 10 SECONDS) GROUP BY area;
            CREATE TABLE {per_session} AS SELECT sensor, COUNT(*) AS n, SUM(reading) AS total FROM {stream}
              WINDOW SESSION (1500 MILLISECONDS, RETENTION 2 MINUTES, GRACE PERIOD 5 SECONDS) GROUP BY sensor;"""))
    finally:
        client.close()
    sensor_query = outcomes[1].message.rsplit(" ", 1)[-1]

    await wait_progressing(agg_cluster, sensor_query, "worker-1")
    await asyncio.sleep(rng.uniform(0.2, 2))
    agg_cluster.kill("worker-1")
    more = timed_readings(rng, base + 150_000, 10_000)
    await produce_timed(agg_cluster.bootstrap, stream, more)
    await asyncio.to_thread(agg_cluster.restart, "worker-1")
    records += more

    readings_of = [(sensor, reading, ts) for sensor, _, reading, ts in records]
    windows, late, _, _ = windows_reference(readings_of, 10_000, 5_000, 2 * MINUTE)
    assert late and len(windows) > 1000
    want_sensor: list[tuple[object, ...]] = sorted((s, w, w + 10_000, len(r), sum(r)) for (s, w), r in windows.items())
    hops: dict[tuple[str, int], list[int]] = defaultdict(list)
    for _, area, reading, ts in records:
        for start in range(max(0, ts - 20_000) // 10_000 * 10_000, ts + 1, 10_000):
            hops[(area, start)].append(reading)
    want_area: list[tuple[object, ...]] = sorted((a, w, w + 30_000, len(r), max(r)) for (a, w), r in hops.items())

    assert await asyncio.to_thread(rows_until, agg_cluster, f"SELECT * FROM {per_sensor};", want_sensor, 300) == want_sensor
    assert await asyncio.to_thread(rows_until, agg_cluster, f"SELECT * FROM {per_area};", want_area, 120) == want_area
    want_sessions, late_sessions = sessions_reference(readings_of, 1500, 5_000, 2 * MINUTE)
    assert late_sessions and len(want_sessions) > 1000
    assert await asyncio.to_thread(rows_until, agg_cluster, f"SELECT * FROM {per_session};", want_sessions,
                                   120) == want_sessions
    # No window's count ever went back or repeated in the sink (a batch applied twice would).
    counts: dict[bytes, list[int]] = defaultdict(list)
    for _, _, key, value in sorted(await read_all(agg_cluster.bootstrap, per_sensor.upper())):
        assert key is not None and value is not None
        counts[key].append(json.loads(value)["N"])
    assert all(a < b for c in counts.values() for a, b in pairwise(c))

    # Each partition has its active on one worker and its standby on the other: both copies hold
    # the windows (the standby's replayed from the changelog, expiries included).
    workers = [agg_cluster.child(name).endpoint for name in ("worker-1", "worker-2")]
    for partition in range(PARTITIONS):
        mine = [row for row in want_sensor if partition_for(str(row[0]).encode(), PARTITIONS) == partition]
        for endpoint in workers:
            assert await scan_until(endpoint, per_sensor.upper(), partition, mine) == mine, (endpoint, partition)


async def test_rowtime_set_by_insert_windows_the_records_and_survives_a_repartition(agg_cluster: LocalCluster) -> None:
    """INSERT ... (ROWTIME, ...) VALUES sets each record's timestamp: windows by record timestamp
    place the records by it, and MAX(ROWTIME) of a GROUP BY that re-keys through the
    repartition topic is the input records' latest timestamp, not the time they were re-keyed."""
    stream = f"rt_{agg_cluster.service_id}"
    per_minute, by_area = f"rt_minute_{agg_cluster.service_id}", f"rt_area_{agg_cluster.service_id}"
    base = (int(time.time() * 1000) - 30 * MINUTE) // MINUTE * MINUTE
    rows = [("s1", "a", base + 5_000), ("s2", "a", base + 61_000), ("s1", "b", base + 59_000),
            ("s1", "b", base + 125_000), ("s2", "a", base + 1_000)]
    inserts = "".join(f"INSERT INTO {stream} (ROWTIME, sensor, area, reading) VALUES ({t}, '{s}', '{a}', 1);"
                      for s, a, t in rows)
    run(agg_cluster, f"""
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM {stream} (sensor VARCHAR KEY, area VARCHAR, reading INT)
          WITH (kafka_topic='{stream}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {per_minute} AS SELECT sensor, COUNT(*) AS n, MAX(ROWTIME) AS latest FROM {stream}
          WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY sensor;
        CREATE TABLE {by_area} AS SELECT area, COUNT(*) AS n, MAX(ROWTIME) AS latest FROM {stream} GROUP BY area;
        {inserts}""")
    want_windows: list[tuple[object, ...]] = [
        ("s1", base, base + MINUTE, 2, base + 59_000), ("s1", base + 2 * MINUTE, base + 3 * MINUTE, 1, base + 125_000),
        ("s2", base, base + MINUTE, 1, base + 1_000), ("s2", base + MINUTE, base + 2 * MINUTE, 1, base + 61_000)]
    assert await asyncio.to_thread(rows_until, agg_cluster, f"SELECT * FROM {per_minute};", want_windows) == want_windows
    want_areas: list[tuple[object, ...]] = [("a", 3, base + 61_000), ("b", 2, base + 125_000)]
    assert await asyncio.to_thread(rows_until, agg_cluster, f"SELECT * FROM {by_area};", want_areas) == want_areas
    # Each row's sink record is stamped with the latest ROWTIME of its records, as Kafka Streams
    # stamps an aggregation's results, not with the time it was written.
    for table in (per_minute, by_area):
        stamps = [(json.loads(value)["LATEST"], timestamp)
                  for *_, value, timestamp in await read_records(agg_cluster.bootstrap, table.upper()) if value]
        assert stamps and all(latest == timestamp for latest, timestamp in stamps), (table, stamps)
    # A table's topic is compacted, as ksqlDB makes it (time retention would delete rows stamped
    # with old times at once); a windowed table's and a stream's are not.
    async with GroupOffsets(KafkaConnection(agg_cluster.bootstrap)) as admin:
        policies = [(await admin.topic_configs(name.upper()))["cleanup.policy"] for name in (by_area, per_minute)]
        policies.append((await admin.topic_configs(stream))["cleanup.policy"])
    assert policies == ["compact", "delete", "delete"]
    # So a stream joined with the table sees its rows as of each record's time, history too:
    # an order from 25 minutes ago joins area a's row (stamped 29 minutes ago, not now).
    orders, enriched = f"rt_orders_{agg_cluster.service_id}", f"rt_enriched_{agg_cluster.service_id}"
    run(agg_cluster, f"""
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM {orders} (area VARCHAR KEY, qty INT)
          WITH (kafka_topic='{orders}', partitions={PARTITIONS}, value_format='json');
        CREATE STREAM {enriched} AS SELECT o.area, o.qty, t.n FROM {orders} o JOIN {by_area} t ON o.area = t.area;
        INSERT INTO {orders} (ROWTIME, area, qty) VALUES ({base + 5 * MINUTE}, 'a', 7);""")
    joined = await sink_until(agg_cluster.bootstrap, enriched.upper(), 1, 120)
    assert [(key, json.loads(value or b"{}"), timestamp) for _, _, key, value, timestamp in joined] == [
        (b"a", {"QTY": 7, "N": 3}, base + 5 * MINUTE)]


async def test_having_keeps_only_the_groups_that_pass_it_in_pulls_and_the_sink(agg_cluster: LocalCluster) -> None:
    """A GROUP BY with HAVING: pulls (scans and key lookups) see only the groups whose
    aggregates pass it; in the sink a group that stops passing gets a tombstone, one that
    starts passing its row (ksqlDB's HAVING). Beside them, LATEST_BY_OFFSET skipping NULLs and
    EARLIEST_BY_OFFSET's first two values, COLLECT_SET and TOPK, as ksqlDB's."""
    stream, table = f"hv_{agg_cluster.service_id}", f"hv_busy_{agg_cluster.service_id}"
    run(agg_cluster, f"""
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM {stream} (sensor VARCHAR KEY, area VARCHAR, reading INT)
          WITH (kafka_topic='{stream}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {table} AS SELECT sensor, COUNT(*) AS n, AVG(reading) AS avg_reading,
          LATEST_BY_OFFSET(area) AS area_now, EARLIEST_BY_OFFSET(reading, 2) AS first2, COLLECT_SET(area) AS areas,
          TOPK(reading, 2) AS top2 FROM {stream}
          GROUP BY sensor HAVING COUNT(*) >= 2 AND AVG(reading) < 50;""")
    # a passes; b never has two readings; c passes at two, then its average goes over 50;
    # d's average is 50 at two (no pass), under it at three.
    first = [("a", "x", 10), ("a", None, 20), ("b", None, 10), ("c", None, 10), ("c", None, 30), ("d", "y", 40),
             ("d", "z", 60)]
    run(agg_cluster, "".join(f"INSERT INTO {stream} (sensor, area, reading) VALUES ('{s}', {sql_text(a)}, {r});"
                             for s, a, r in first))
    middle = {"a": ["a", 2, 15.0, "x", [10, 20], ["x", None], [20, 10]],
              "c": ["c", 2, 20.0, None, [10, 30], [None], [30, 10]]}
    assert await asyncio.to_thread(pull_until, agg_cluster, f"SELECT * FROM {table};", middle) == middle
    run(agg_cluster, f"INSERT INTO {stream} (sensor, reading) VALUES ('c', 200);"
                     f"INSERT INTO {stream} (sensor, reading) VALUES ('d', 1);")
    want = {"a": ["a", 2, 15.0, "x", [10, 20], ["x", None], [20, 10]],
            "d": ["d", 3, 101 / 3, "z", [40, 60], ["y", "z", None], [60, 40]]}
    assert await asyncio.to_thread(pull_until, agg_cluster, f"SELECT * FROM {table};", want) == want
    assert run(agg_cluster, f"SELECT * FROM {table} WHERE sensor = 'c';") == []
    assert run(agg_cluster, f"SELECT * FROM {table} WHERE sensor = 'b';") == []
    assert run(agg_cluster, f"SELECT sensor, n FROM {table} WHERE sensor = 'd';") == [["d", 3]]

    last: dict[str, dict[str, object] | None] = {}
    seen_c: list[dict[str, object] | None] = []
    for _, _, key, value in sorted(await read_all(agg_cluster.bootstrap, table.upper())):
        assert key is not None
        last[key.decode()] = json.loads(value) if value is not None else None
        if key == b"c":
            seen_c.append(last["c"])
    assert last == {"a": {"N": 2, "AVG_READING": 15.0, "AREA_NOW": "x", "FIRST2": [10, 20], "AREAS": ["x", None],
                          "TOP2": [20, 10]},
                    "b": None, "c": None,
                    "d": {"N": 3, "AVG_READING": 101 / 3, "AREA_NOW": "z", "FIRST2": [40, 60],
                          "AREAS": ["y", "z", None], "TOP2": [60, 40]}}
    # it passed, then left the table
    assert {"N": 2, "AVG_READING": 20.0, "AREA_NOW": None, "FIRST2": [10, 30], "AREAS": [None],
            "TOP2": [30, 10]} in seen_c


async def test_expressions_over_aggregates_are_in_pulls_and_the_sink(agg_cluster: LocalCluster) -> None:
    """``SUM(x) / COUNT(*)``, ``ROUND(AVG(x), 2)`` and an expression over the GROUP BY column and
    an aggregate no column selects (held apart in the state), and a HAVING over another: pulls
    (a scan, a key lookup) and the sink carry them, updated with each record, as ksqlDB's."""
    stream, table = f"ex_{agg_cluster.service_id}", f"ex_means_{agg_cluster.service_id}"
    run(agg_cluster, f"""
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM {stream} (sensor VARCHAR KEY, reading INT)
          WITH (kafka_topic='{stream}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {table} AS SELECT sensor, COUNT(*) AS n, SUM(reading) / COUNT(*) AS mean,
          ROUND(AVG(reading), 2) AS avg2, CONCAT(sensor, ':', CAST(MAX(reading) AS VARCHAR)) AS tag,
          ARRAY_SORT(COLLECT_LIST(reading), 'DESC') AS down FROM {stream} GROUP BY sensor HAVING MIN(reading) > 5;""")
    run(agg_cluster, "".join(f"INSERT INTO {stream} (sensor, reading) VALUES ('{s}', {r});"
                             for s, r in (("a", 10), ("a", 20), ("b", 7), ("c", 1), ("a", 25))))
    want = {"a": ["a", 3, 18, 18.33, "a:25", [25, 20, 10]], "b": ["b", 1, 7, 7.0, "b:7", [7]]}
    assert await asyncio.to_thread(pull_until, agg_cluster, f"SELECT * FROM {table};", want) == want
    assert run(agg_cluster, f"SELECT mean, tag FROM {table} WHERE sensor = 'a';") == [[18, "a:25"]]
    # The time functions in a pull (Python's), as the Spark SQL of a persistent query gives them.
    assert run(agg_cluster, f"SELECT TIMESTAMPTOSTRING(n * 86400000 - 3600000, 'yyyy-MM-dd HH:mm EEEE', 'Asia/Tokyo'), "
                            "UNIX_TIMESTAMP(PARSE_TIMESTAMP('2024-03-10 02:30', 'yyyy-MM-dd HH:mm', 'America/Los_Angeles')) "
                            f"FROM {table} WHERE sensor = 'a';") == [["1970-01-04 08:00 Sunday", 1710066600000]]
    assert run(agg_cluster, f"SELECT REGEXP_REPLACE(tag, '(\\w):(\\d+)', '$2@$1'), EXTRACTJSONFIELD(CONCAT('{{\"t\": [1, \"', "
                            f"tag, '\"]}}'), '$.t[1]'), ARRAY_EXCEPT(down, ARRAY_REMOVE(down, 20)) FROM {table} WHERE sensor = 'a';") \
        == [["25@a", "a:25", [20]]]
    assert run(agg_cluster, f"SELECT TRANSFORM(down, x => x * 2), FILTER(down, x => x > n * 5), REDUCE(down, 0, (s, x) => s + x) "
                            f"FROM {table} WHERE sensor = 'a';") == [[[50, 40, 20], [25, 20], 55]]
    with pytest.raises(grpc.RpcError) as slow:  # a pattern that backtracks without end stops the pull, not the service
        run(agg_cluster, f"SELECT REGEXP_EXTRACT('(a|aa)+c', LPAD(tag, 60, 'a')) FROM {table} WHERE sensor = 'a';")
    assert slow.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "backtracks too much" in str(slow.value.details())
    assert run(agg_cluster, f"SELECT * FROM {table} WHERE sensor = 'c';") == []  # HAVING MIN(reading) > 5
    last = {}
    for _, _, key, value in sorted(await read_all(agg_cluster.bootstrap, table.upper())):
        assert key is not None
        last[key.decode()] = None if value is None else json.loads(value)
    assert {k: v for k, v in last.items() if v is not None} == {
        "a": {"N": 3, "MEAN": 18, "AVG2": 18.33, "TAG": "a:25", "DOWN": [25, 20, 10]},
        "b": {"N": 1, "MEAN": 7, "AVG2": 7.0, "TAG": "b:7", "DOWN": [7]}}


def sql_text(value: str | None) -> str:
    """``value`` as a SQL literal (NULL for None)."""
    return "NULL" if value is None else f"'{value}'"


def owners_of(changes: list[tuple[str, dict[str, Any] | None]]) -> dict[str, list[Any]]:
    """Pages per owner of the table the ``changes`` leave (a None value deletes the page): those
    with an owner and a weight of 0 or more, with the weights' sum and average, and the pages
    sorted (a table's COLLECT_LIST keeps no order ksqlDB promises: ``sorted_lists``); the weight of
    them all when it is one (ATTR), else None."""
    table: dict[str, dict[str, Any] | None] = {}
    for page, value in changes:
        table[page] = value
    groups: dict[str, list[Any]] = {}
    for page, value in table.items():
        if value is not None and value["OWNER"] is not None and value["WEIGHT"] >= 0:
            counted = groups.setdefault(value["OWNER"], [0, 0, [], set()])
            counted[0] += 1
            counted[1] += value["WEIGHT"]
            counted[2].append(page)
            counted[3].add(value["WEIGHT"])
    return {owner: [owner, n, total, total / n, next(iter(weights)) if len(weights) == 1 else None, sorted(listed)]
            for owner, (n, total, listed, weights) in groups.items()}


def sorted_lists(row: list[Any]) -> list[Any]:
    """``row`` with each list sorted."""
    return [sorted(v) if isinstance(v, list) else v for v in row]


async def test_group_by_over_a_table_moves_each_changed_row_between_groups(agg_cluster: LocalCluster) -> None:
    """GROUP BY over a TABLE (ksqlDB's table aggregation): a row whose group changes leaves
    its old group and joins its new one; a deleted row, one the WHERE stops passing and one
    whose group becomes NULL leave theirs; a malformed record changes nothing. Exact against
    the table's rows after each of two phases; the rows the table held before the query count
    though it starts at the latest offsets (a table is read whole). Read-your-writes through
    the regrouping and the aggregation, a row moved out of a group included. COLLECT_LIST takes
    a changed row's old value back out of its list, HISTOGRAM its count, ATTR its value (ksqlDB's
    undo)."""
    sid = agg_cluster.service_id
    pages, per_owner = f"tg_pages_{sid}", f"tg_owners_{sid}"
    run(agg_cluster, f"""
        CREATE TABLE {pages} (page VARCHAR PRIMARY KEY, owner VARCHAR, weight INT)
          WITH (kafka_topic='{pages}', partitions={PARTITIONS}, value_format='json');""")
    rng = random.Random(59)

    def changes(count: int) -> list[tuple[str, dict[str, Any] | None]]:
        out: list[tuple[str, dict[str, Any] | None]] = []
        for _ in range(count):
            roll = rng.random()
            owner = None if roll < 0.15 else f"o{rng.randrange(6)}"
            out.append((f"p{rng.randrange(80)}", None if roll < 0.1 else {"OWNER": owner,
                                                                            "WEIGHT": rng.randrange(-20, 100)}))
        return out

    def encoded(batch: list[tuple[str, dict[str, Any] | None]]) -> list[tuple[bytes | None, Any]]:
        return [(page.encode(), None if value is None else json.dumps(value).encode()) for page, value in batch]

    first, second = changes(400), changes(400)
    await produce(agg_cluster.bootstrap, pages, encoded(first))
    run(agg_cluster, f"""
        SET 'auto.offset.reset'='latest';
        CREATE TABLE {per_owner} AS SELECT owner, COUNT(*) AS pages, SUM(weight) AS weight, AVG(weight) AS mean,
          ATTR(weight) AS only, COLLECT_LIST(page) AS listed, HISTOGRAM(page) AS seen FROM {pages} WHERE weight >= 0 GROUP BY owner
          HAVING COUNT(*) > 0;""")

    def shown(row: list[Any]) -> list[Any]:
        """The row without its histogram, when that counts each listed page once (else as it is)."""
        return sorted_lists(row[:-1]) if row[-1] == {page: 1 for page in row[-2]} else row

    want = owners_of(first)
    assert await asyncio.to_thread(pull_until, agg_cluster, f"SELECT * FROM {per_owner};", want,
                                   shown=shown) == want
    # A malformed value of a counted page: logged, and the page stays counted as it was.
    counted = next(page for page, value in reversed(first) if value is not None and value["OWNER"] is not None)
    await produce(agg_cluster.bootstrap, pages, [*encoded(second[:200]), (counted.encode(), b"{oops"),
                                                 *encoded(second[200:])])
    want = owners_of(first + second)
    assert await asyncio.to_thread(pull_until, agg_cluster, f"SELECT * FROM {per_owner};", want,
                                   shown=shown) == want

    pull = f"SELECT * FROM {per_owner} WHERE owner = 'o-rw';"
    await asyncio.to_thread(reads_own_writes, agg_cluster, [
        (f"INSERT INTO {pages} (page, owner, weight) VALUES ('p-rw', 'o-rw', 5);", pull,
         [["o-rw", 1, 5, 5.0, 5, ["p-rw"], {"p-rw": 1}]]),
        (f"INSERT INTO {pages} (page, owner, weight) VALUES ('p-rw2', 'o-rw', 8);", pull,
         [["o-rw", 2, 13, 6.5, None, ["p-rw", "p-rw2"], {"p-rw": 1, "p-rw2": 1}]]),
        (f"INSERT INTO {pages} (page, owner, weight) VALUES ('p-rw', 'o-rw2', 7);", pull,
         [["o-rw", 1, 8, 8.0, 8, ["p-rw2"], {"p-rw2": 1}]]),
        (f"INSERT INTO {pages} (page, owner, weight) VALUES ('p-rw2', 'o-rw', -1);", pull, [])])
    want = {"o-rw2": ["o-rw2", 1, 7, 7.0, 7, ["p-rw"], {"p-rw": 1}]}  # (another partition: the tokens above did not wait)
    assert await asyncio.to_thread(pull_until, agg_cluster, f"SELECT * FROM {per_owner} WHERE owner = 'o-rw2';",
                                   want) == want
    # A row that leaves its group stamps the group's new result (here its tombstone: HAVING) with
    # the time of the change, as Kafka Streams' table aggregation does, not its old row's time.
    base = int(time.time() * 1000) - 20 * MINUTE
    run(agg_cluster, f"INSERT INTO {pages} (ROWTIME, page, owner, weight) VALUES ({base}, 'p-t', 'o-t', 5);")
    assert await asyncio.to_thread(pull_until, agg_cluster, f"SELECT * FROM {per_owner} WHERE owner = 'o-t';",
                                   {"o-t": ["o-t", 1, 5, 5.0, 5, ["p-t"], {"p-t": 1}]}) == {
        "o-t": ["o-t", 1, 5, 5.0, 5, ["p-t"], {"p-t": 1}]}
    run(agg_cluster, f"INSERT INTO {pages} (ROWTIME, page, owner, weight) VALUES ({base + 5_000}, 'p-t', 'o-t2', 5);")
    deadline = time.monotonic() + 60
    while True:
        stamps = [(key, value is None, timestamp) for *_, key, value, timestamp
                  in await read_records(agg_cluster.bootstrap, per_owner.upper()) if key in (b"o-t", b"o-t2")]
        if len(stamps) >= 3 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert sorted(stamps) == [(b"o-t", False, base), (b"o-t", True, base + 5_000), (b"o-t2", False, base + 5_000)]
