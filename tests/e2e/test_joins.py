"""Joins on the real cluster (Kafka, Spark, RocksDB, gRPC), checked record by
record against a reference computed here from the produced records with Kafka Streams' rule:
per partition, a table record is applied before every stream record with a later (or the
same) timestamp, in offset order, and a stream record joins the table's row as it is then.

- the seed's readings enriched with each sensor's site (LEFT JOIN: NULL for a sensor the
  table lacks, a deleted row, updates between readings, out-of-order timestamps), an INNER
  JOIN on a non-key column with a WHERE over both sides, through the repartition topic, and
  a three-way join (INNER with the sites, LEFT with a second table);
- a multi-way join on different expressions (the stream re-keyed by its sensor, joined with
  the sensors, re-keyed by their site, joined with the sites), as a stream and under a
  GROUP BY, with both tables changed between two phases of events;
- the same enrichment while a worker is SIGKILLed mid-stream: 0 lost, 0 duplicated;
- table-table joins (INNER, FULL OUTER) with updates and deletes on both sides, pulled
  and read from their sink topics, against each key's latest rows; and a FULL OUTER one
  across the SIGKILL, whose standby copies (replayed from the result's topic) hold the same
  rows as the actives;
- stream-stream joins (INNER, FULL OUTER) with records out of order within and beyond
  the window and grace, against a brute-force reference over the records in the order the
  join read them; and a LEFT one across the SIGKILL;
- a GROUP BY over one of the tables across the SIGKILL (rows moved between groups, deleted);
- a GROUP BY over a foreign-key join of two tables, with both tables changed in two phases.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.deploy.local.launcher import LocalCluster
from millpond.services.worker.table_joining import split_rekeyed
from millpond.shared.catalog.names import joined_topic, processing_log_topic
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.net import free_port
from tests.e2e.helpers import pull_until, read_all, read_records, reads_own_writes, run, sink_until
from tests.e2e.test_aggregation import produce_timed, scan_until, sorted_lists, wait_progressing
from tests.e2e.workload import PARTITIONS
from tests.stream_join_reference import expected_stream_join

MINUTE = 60_000
TableRecord = tuple[str, str | None, int]
"""(key, value column or None for a deleted row, record timestamp)."""
StreamRecord = tuple[str, str, int, int]
"""(sensor, area, reading, record timestamp)."""


@pytest.fixture(scope="module")
def join_cluster(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two workers whose micro-batches are small, so a run spans many transactions."""
    local = LocalCluster(data_dir=Path(tmp_path_factory.mktemp("joins")), workers=2,
                         kafka=kafka.bootstrap_servers, router_port=free_port(),
                         service_id=f"join{os.getpid()}", spark_master="local[1]",
                         worker_env={"MILLPOND_MAX_OFFSETS_PER_TRIGGER": "2000"})
    local.start()
    yield local
    local.stop()


async def produce_table(bootstrap: str, topic: str, column: str, records: list[TableRecord],
                        partitions: int = PARTITIONS) -> None:
    """Table rows (a None value: the key's tombstone), in order, partitioned by key as the Java client."""
    await produce_rows(bootstrap, topic, [(key, None if value is None else {column: value}, ts)
                                          for key, value, ts in records], partitions)


async def produce_rows(bootstrap: str, topic: str, records: list[tuple[str, dict[str, Any] | None, int | None]],
                       partitions: int = PARTITIONS) -> None:
    """Table rows of several columns (a None value: the key's tombstone), in order, partitioned
    by key as the Java client."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:  # one producer keeps each partition's records in the order sent
        futures = [await producer.send(topic, None if value is None else json.dumps(value).encode(),
                                       key=key.encode(), partition=partition_for(key.encode(), partitions),
                                       timestamp_ms=ts)
                   for key, value, ts in records]
        await producer.flush()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def join_reference(table: list[TableRecord], stream: list[tuple[str, Any, int]], inner: bool) -> list[tuple[Any, ...]]:
    """Each stream record (join key, payload, timestamp) with the table's value as of it, per
    Kafka Streams' rule (see the module); the table's records all precede the stream's."""
    out: list[tuple[Any, ...]] = []
    for partition in range(PARTITIONS):
        pending = [r for r in table if partition_for(r[0].encode(), PARTITIONS) == partition]
        rows: dict[str, str | None] = {}
        applied = 0
        for key, payload, ts in stream:
            if partition_for(key.encode(), PARTITIONS) != partition:
                continue
            while applied < len(pending) and pending[applied][2] <= ts:
                rows[pending[applied][0]] = pending[applied][1]
                applied += 1
            value = rows.get(key)
            if value is None and inner:
                continue
            out.append((key, payload, value, ts))
    return sorted(out)


def table_history(rng: random.Random, first: int, keys: list[str], updates: int, deleted: float,
                  base: int, span_ms: int) -> list[TableRecord]:
    """A row for each of the first ``first`` keys at ``base``, then ``updates`` changes of random
    keys (a ``deleted`` share of them deletes) at random times within ``span_ms`` after it."""
    records: list[TableRecord] = [(key, f"site-{i}", base) for i, key in enumerate(keys[:first])]
    for i in range(updates):
        records.append((rng.choice(keys), None if rng.random() < deleted else f"site-{i}-b",
                        base + rng.randrange(1, span_ms)))
    return records


async def test_stream_table_join_sees_the_table_as_of_each_record(join_cluster: LocalCluster) -> None:
    sid = join_cluster.service_id
    stream, sensors, areas, calib = f"jr_{sid}", f"js_{sid}", f"ja_{sid}", f"jc_{sid}"
    enriched, by_area, three = f"jr_enriched_{sid}", f"jr_by_area_{sid}", f"jr_three_{sid}"
    rng = random.Random(41)
    base = (int(time.time() * 1000) - 10 * MINUTE) // MINUTE * MINUTE
    # Sensors s0-s5 start with a site; s6 and s7 have none until an update gives them one.
    # Updates and deletes come at random times inside the readings' time span.
    site_records = table_history(rng, 6, [f"s{i}" for i in range(8)], 40, 0.15, base, MINUTE)
    area_records: list[TableRecord] = [(a, f"region-{a}", base - 1000) for a in ("north", "south", "east")]
    calib_records: list[TableRecord] = [(f"s{rng.randrange(8)}", f"f{i}", base + rng.randrange(0, MINUTE))
                                        for i in range(15)]
    readings: list[StreamRecord] = [(f"s{rng.randrange(8)}", rng.choice(["north", "south", "east", "west"]), i,
                                     base + rng.randrange(0, MINUTE)) for i in range(400)]
    run(join_cluster, f"""
        CREATE STREAM {stream} (sensor VARCHAR KEY, area VARCHAR, reading INT)
          WITH (kafka_topic='{stream}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {sensors} (id VARCHAR PRIMARY KEY, site VARCHAR)
          WITH (kafka_topic='{sensors}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {areas} (area VARCHAR PRIMARY KEY, region VARCHAR)
          WITH (kafka_topic='{areas}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {calib} (id VARCHAR PRIMARY KEY, factor VARCHAR)
          WITH (kafka_topic='{calib}', partitions={PARTITIONS}, value_format='json');""")
    await produce_table(join_cluster.bootstrap, sensors, "SITE", site_records)
    await produce_table(join_cluster.bootstrap, areas, "REGION", area_records)
    await produce_table(join_cluster.bootstrap, calib, "FACTOR", calib_records)
    await produce_timed(join_cluster.bootstrap, stream, readings[:200])
    producer = AIOKafkaProducer(bootstrap_servers=join_cluster.bootstrap)
    await producer.start()
    try:  # a malformed record between the two halves: logged, and the query goes on
        await producer.send_and_wait(stream, b"{not json", key=b"s1", partition=partition_for(b"s1", PARTITIONS),
                                     timestamp_ms=base)
    finally:
        await producer.stop()
    await produce_timed(join_cluster.bootstrap, stream, readings[200:])
    run(join_cluster, f"""
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM {enriched} AS SELECT r.sensor, r.reading, s.site FROM {stream} r LEFT JOIN {sensors} s
          ON r.sensor = s.id;
        CREATE STREAM {by_area} AS SELECT a.area, r.sensor, r.reading * 2 AS doubled, region FROM {stream} r
          JOIN {areas} a ON r.area = a.area WHERE r.reading > 10 AND a.region <> 'region-south';
        CREATE STREAM {three} AS SELECT r.sensor, r.reading, s.site, c.factor FROM {stream} r
          JOIN {sensors} s ON r.sensor = s.id LEFT JOIN {calib} c ON c.id = r.sensor;""")

    want = join_reference(site_records, [(s, r, ts) for s, _, r, ts in readings], inner=False)
    assert any(site is None for _, _, site, _ in want) and len({site for *_, site, _ in want}) > 10
    got = []
    for partition, _, key, value, timestamp in await sink_until(join_cluster.bootstrap, enriched.upper(), len(want)):
        assert key is not None and value is not None and partition == partition_for(key, PARTITIONS)
        row = json.loads(value)
        got.append((key.decode(), row["READING"], row["SITE"], timestamp))
    assert sorted(got) == want

    want_areas = sorted((area, sensor, reading * 2, f"region-{area}", ts) for sensor, area, reading, ts in readings
                        if area in ("north", "east") and reading > 10)
    got_areas = []
    for partition, _, key, value, _ in await sink_until(join_cluster.bootstrap, by_area.upper(), len(want_areas)):
        assert key is not None and value is not None and partition == partition_for(key, PARTITIONS)
        row = json.loads(value)
        got_areas.append((key.decode(), row["SENSOR"], row["DOUBLED"], row["REGION"]))
    assert sorted(got_areas) == [w[:4] for w in want_areas]

    # Each table by the same rule, on its own: the reading is the record's unique payload.
    sites = {reading: site for _, reading, site, _ in want}
    factors = {reading: factor for _, reading, factor, _ in
               join_reference(calib_records, [(s, r, ts) for s, _, r, ts in readings], inner=False)}
    want_three = sorted((s, r, sites[r], factors[r]) for s, _, r, _ in readings if sites[r] is not None)
    assert any(f is None for *_, f in want_three) and any(f is not None for *_, f in want_three)
    got_three = []
    for _, _, key, value, _ in await sink_until(join_cluster.bootstrap, three.upper(), len(want_three)):
        assert key is not None and value is not None
        row = json.loads(value)
        got_three.append((key.decode(), row["READING"], row["SITE"], row["FACTOR"]))
    assert sorted(got_three) == want_three

    logged = [json.loads(v or b"{}") for *_, v in
              await read_all(join_cluster.bootstrap, processing_log_topic(join_cluster.service_id))]
    mine = [e for e in logged if e["QUERY_ID"].startswith(f"CSAS_{enriched.upper()}")]
    assert [e["RECORD"] for e in mine] == ["{not json"], mine


def table_join_reference(left: list[TableRecord], right: list[TableRecord], kind: str) -> dict[str, list[Any]]:
    """Each key's joined row (key, left value, right value) once both tables' records are
    applied: a table-table join's result depends only on each key's latest rows."""
    rows = [{key: value for key, value, _ in side} for side in (left, right)]
    out = {}
    for key in set(rows[0]) | set(rows[1]):
        a, b = rows[0].get(key), rows[1].get(key)
        if {"INNER": a is not None and b is not None, "LEFT": a is not None,
                "FULL": a is not None or b is not None}[kind]:
            out[key] = [key, a, b]
    return out


def foreign_key_reference(items: list[TableRecord], places: list[TableRecord]) -> dict[str, list[Any]]:
    """Each item (key, its PLACE) with the NAME of the place it names, or NULL: a LEFT
    foreign-key join's result depends only on both tables' latest rows."""
    named = {key: value for key, value, _ in places}
    return {key: [key, place, named.get(place)]
            for key, place in {key: value for key, value, _ in items}.items() if place is not None}


async def latest_in_sink(bootstrap: str, topic: str, columns: tuple[str, ...] = ("SITE", "CITY")) -> dict[str, list[Any]]:
    """The sink topic as a table: each key's last record, without the keys whose last is a tombstone."""
    latest: dict[str, Any] = {}
    for partition, _, key, value, _ in await read_records(bootstrap, topic):
        assert key is not None and partition == partition_for(key, PARTITIONS)
        latest[key.decode()] = None if value is None else json.loads(value)
    return {k: [k, *(v[c] for c in columns)] for k, v in latest.items() if v is not None}


async def test_table_table_joins_follow_both_tables(join_cluster: LocalCluster) -> None:
    """INNER and FULL OUTER joins of two tables on their keys, and a LEFT foreign-key join
    of items with the places they name (a table of another partition count), with updates
    and deletes on both sides before and after the queries start: each result, pulled and
    as its sink topic's latest records, equals the join of the tables' latest rows."""
    sid = join_cluster.service_id
    sites, cities = f"jt_sites_{sid}", f"jt_cities_{sid}"
    items, places, by_place = f"jt_items_{sid}", f"jt_places_{sid}", f"jt_by_place_{sid}"
    results = {kind: f"jt_{kind.lower()}_{sid}" for kind in ("INNER", "FULL")}  # LEFT: in the unit tests
    rng = random.Random(47)
    base = int(time.time() * 1000) - 10 * MINUTE
    keys = [f"k{i:02d}" for i in range(30)]
    site_records = table_history(rng, 20, keys, 120, 0.2, base, MINUTE)
    city_records = [(key, f"city-{i}", base) for i, key in enumerate(keys[10:])]
    city_records += [(rng.choice(keys), None if rng.random() < 0.2 else f"city-{i}-b", base + rng.randrange(1, MINUTE))
                     for i in range(120)]
    # Items name one of few places (or none): each place's change joins many items again.
    place_keys = [f"p{i}" for i in range(6)]
    item_records = [(rng.choice(keys), rng.choice([None, *place_keys, *place_keys]), base) for _ in range(160)]
    place_records = [(rng.choice(place_keys[:5]), None if rng.random() < 0.2 else f"place-{i}", base)
                     for i in range(60)]
    run(join_cluster, f"""
        CREATE TABLE {sites} (id VARCHAR PRIMARY KEY, site VARCHAR)
          WITH (kafka_topic='{sites}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {cities} (id VARCHAR PRIMARY KEY, city VARCHAR)
          WITH (kafka_topic='{cities}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {items} (id VARCHAR PRIMARY KEY, place VARCHAR)
          WITH (kafka_topic='{items}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {places} (id VARCHAR PRIMARY KEY, name VARCHAR)
          WITH (kafka_topic='{places}', partitions=3, value_format='json');""")
    await produce_table(join_cluster.bootstrap, sites, "SITE", site_records[:80])
    await produce_table(join_cluster.bootstrap, cities, "CITY", city_records[:80])
    await produce_table(join_cluster.bootstrap, items, "PLACE", item_records[:80])
    await produce_table(join_cluster.bootstrap, places, "NAME", place_records[:30], partitions=3)
    run(join_cluster, "\n".join(
        f"CREATE TABLE {name} AS SELECT s.id, s.site, c.city FROM {sites} s {kind} JOIN {cities} c ON s.id = c.id;"
        for kind, name in results.items()) + f"""
        CREATE TABLE {by_place} AS SELECT i.id, i.place, p.name FROM {items} i LEFT JOIN {places} p
          ON i.place = p.id;""")
    producer = AIOKafkaProducer(bootstrap_servers=join_cluster.bootstrap)
    await producer.start()
    try:  # a malformed row: logged, and the join goes on without it
        await producer.send_and_wait(cities, b"{not json", key=b"k01", partition=partition_for(b"k01", PARTITIONS))
    finally:
        await producer.stop()
    await produce_table(join_cluster.bootstrap, sites, "SITE", site_records[80:])
    await produce_table(join_cluster.bootstrap, cities, "CITY", city_records[80:])
    await produce_table(join_cluster.bootstrap, places, "NAME", place_records[30:], partitions=3)
    await produce_table(join_cluster.bootstrap, items, "PLACE", item_records[80:])

    for kind, name in results.items():
        want = table_join_reference(site_records, city_records, kind)
        assert any(None in row for row in want.values()) or kind == "INNER"
        assert pull_until(join_cluster, f"SELECT * FROM {name};", want) == want, kind
        assert await latest_in_sink(join_cluster.bootstrap, name.upper()) == want, kind
    want = foreign_key_reference(item_records, place_records)
    assert sum(row[2] is None for row in want.values()) and sum(row[2] is not None for row in want.values()) > 5
    assert pull_until(join_cluster, f"SELECT * FROM {by_place};", want) == want
    assert await latest_in_sink(join_cluster.bootstrap, by_place.upper(), ("PLACE", "NAME")) == want
    logged = [json.loads(v or b"{}") for *_, v in
              await read_all(join_cluster.bootstrap, processing_log_topic(join_cluster.service_id))]
    mine = [e["RECORD"] for e in logged if e["QUERY_ID"].startswith(f"CTAS_{results['FULL'].upper()}")]
    assert mine == ["{not json"], mine

    # Read-your-writes through a join's stages (each side's copy, the join, the result): an
    # INSERT into either table, then at once a pull of the joined row with its token, sees it.
    # The foreign-key join's right table is copied into every partition of its joined topic.
    steps = []
    for i in range(2):
        steps += [
            (f"INSERT INTO {sites} (id, site) VALUES ('k-new', 'site-{i}');",
             f"SELECT site, city FROM {results['FULL']} WHERE id = 'k-new';", [[f"site-{i}", None if i == 0 else f"city-{i - 1}"]]),
            (f"INSERT INTO {cities} (id, city) VALUES ('k-new', 'city-{i}');",
             f"SELECT site, city FROM {results['INNER']} WHERE id = 'k-new';", [[f"site-{i}", f"city-{i}"]]),
            (f"INSERT INTO {places} (id, name) VALUES ('p-new', 'named-{i}');",
             f"SELECT * FROM {by_place} WHERE id = 'i-new';", [["i-new", "p-new", f"named-{i}"]] if i else []),
            (f"INSERT INTO {items} (id, place) VALUES ('i-new', 'p-new');",
             f"SELECT * FROM {by_place} WHERE id = 'i-new';", [["i-new", "p-new", f"named-{i}"]]),
        ]
    await asyncio.to_thread(reads_own_writes, join_cluster, steps)


async def produce_sides(bootstrap: str, records: list[tuple[str, str, str, Any, int]]) -> None:
    """(topic, column, key, value, event time) records, in order, partitioned by key as the Java
    client (a dict value is the record's whole value, the column left out)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:  # one producer keeps each partition's records in the order sent
        futures = [await producer.send(topic, json.dumps(value if isinstance(value, dict) else {column: value}).encode(),
                                       key=key.encode(),
                                       partition=partition_for(key.encode(), PARTITIONS), timestamp_ms=ts)
                   for topic, column, key, value, ts in records]
        await producer.flush()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def stream_join_until_exact(cluster: LocalCluster, query_id: str, sink: str, records: int, kind: str,
                                  window: tuple[int, int, int], timeout_s: float = 180,
                                  check_sink: bool = True, rekeyed: bool = False) -> list[tuple[Any, ...]]:
    """The stream-stream join's results (key, READING, LEVEL, timestamp), read until its joined
    topic holds all ``records`` and the sink equals the reference over that topic's order
    (or the time is up); asserts both (only the first without ``check_sink``). ``rekeyed``:
    both streams are joined on other columns than their keys."""
    gathered = joined_topic(cluster.service_id, query_id)
    deadline = time.monotonic() + timeout_s
    while True:
        read = await read_records(cluster.bootstrap, gathered)
        want: list[tuple[Any, ...]] = []
        for partition in range(PARTITIONS):
            order = [(key[0], (split_rekeyed(key[1:])[0] if rekeyed else key[1:]).decode(), json.loads(value or b"{}"),
                      ts) for p, _, key, value, ts in read if p == partition and key]
            want += expected_stream_join([(side, k, v.get("READING", v.get("LEVEL")), ts) for side, k, v, ts in order],
                                         *window, kind)
        got = sorted(((key.decode(), json.loads(value)["READING"], json.loads(value)["LEVEL"], ts)
                      for _, _, key, value, ts in await read_records(cluster.bootstrap, sink)
                      if key is not None and value is not None), key=repr)
        if (len(read) == records and (not check_sink or got == sorted(want, key=repr))) or time.monotonic() > deadline:
            break
        await asyncio.sleep(1)
    assert len(read) == records, kind
    if not check_sink:
        return got
    assert len(got) == len(want), f"{kind}: {len(got) - len(want)} more joined records than the reference"
    assert got == sorted(want, key=repr), kind
    return got


async def test_stream_stream_joins_match_the_reference_in_the_order_they_were_read(join_cluster: LocalCluster) -> None:
    """INNER and FULL OUTER joins of two streams WITHIN (2 s, 4 s) GRACE PERIOD 3 s, with
    records out of order within and beyond the window and the grace period. Each query reads
    both streams through its joined topic; the reference is computed from that topic's
    records in its order (per partition), so it knows which were late. A key only one
    stream has, joined before the rest arrives, must come out alone from the outer joins."""
    sid = join_cluster.service_id
    left, right = f"jsl_{sid}", f"jsr_{sid}"
    results = {kind: f"js_{kind.lower()}_{sid}" for kind in ("INNER", "FULL")}  # LEFT: across the SIGKILL below
    rng = random.Random(53)
    base = int(time.time() * 1000) - 10 * MINUTE
    keys = [f"k{i}" for i in range(8)]
    alone = [(left, "READING", "solo-left", -1, base), (right, "LEVEL", "solo-right", -2, base)]
    produced = []
    for i in range(600):  # about 50 ms of event time apart, one in ten set back by up to 8 s
        topic, column = (left, "READING") if rng.random() < 0.5 else (right, "LEVEL")
        ts = base + 50 * i - (rng.randrange(8_000) if rng.random() < 0.1 else 0)
        produced.append((topic, column, rng.choice(keys), i, ts))
    # Then stream time far ahead on every partition, so every window closes.
    produced += [(left, "READING", key, 10_000 + n, base + 10 * MINUTE) for n, key in enumerate(keys)]
    outcome = run(join_cluster, f"""
        CREATE STREAM {left} (sensor VARCHAR KEY, reading INT)
          WITH (kafka_topic='{left}', partitions={PARTITIONS}, value_format='json');
        CREATE STREAM {right} (sensor VARCHAR KEY, level INT)
          WITH (kafka_topic='{right}', partitions={PARTITIONS}, value_format='json');
        SET 'auto.offset.reset'='earliest';
        """ + "\n".join(
        f"CREATE STREAM {name} AS SELECT l.sensor, l.reading, r.level FROM {left} l {kind} JOIN {right} r "
        f"WITHIN (2 SECONDS, 4 SECONDS) GRACE PERIOD 3 SECONDS ON l.sensor = r.sensor;"
        for kind, name in results.items()) + "\nSHOW QUERIES;")
    query_ids = {kind: next(str(row[0]) for row in outcome if str(row[0]).startswith(f"CSAS_{name.upper()}"))
                 for kind, name in results.items()}
    # The lone keys first, at the earliest time: every query has joined them before the rest.
    await produce_sides(join_cluster.bootstrap, alone)
    for kind, query_id in query_ids.items():
        await stream_join_until_exact(join_cluster, query_id, results[kind].upper(), len(alone), kind,
                                      (2_000, 4_000, 3_000), 120, check_sink=False)
    await produce_sides(join_cluster.bootstrap, produced[:300])
    await produce_sides(join_cluster.bootstrap, produced[300:])
    for kind, name in results.items():
        got = await stream_join_until_exact(join_cluster, query_ids[kind], name.upper(), len(alone) + len(produced),
                                            kind, (2_000, 4_000, 3_000))
        solo = sorted((key, reading, level) for key, reading, level, _ in got if key.startswith("solo"))
        assert solo == {"INNER": [], "FULL": [("solo-left", -1, None), ("solo-right", None, -2)]}[kind], kind


async def test_streams_joined_on_other_columns_are_rekeyed_by_them(join_cluster: LocalCluster) -> None:
    """A LEFT join of a keyed stream with a keyless one on a column of each: both are
    re-keyed by it into the joined topic's partitions; the results match the reference over
    that topic's order, keyed by the column, with each left record's own KEY column. (A
    minute's grace: the two streams' stages copy their backlogs in their own batches.)"""
    sid = join_cluster.service_id
    left, right, name = f"jgl_{sid}", f"jgr_{sid}", f"jg_{sid}"
    rng = random.Random(59)
    base = int(time.time() * 1000) - 10 * MINUTE
    groups = [f"g{i}" for i in range(40)]  # a record of a group about every 4 s: some join nothing
    produced = []
    for i in range(400):  # about 50 ms of event time apart, one in ten set back by up to 6 s
        ts = base + 50 * i - (rng.randrange(6_000) if rng.random() < 0.1 else 0)
        if rng.random() < 0.5:
            produced.append((left, f"id{i}", {"GRP": rng.choice(groups), "READING": i}, ts))
        else:
            produced.append((right, None, {"GRP": rng.choice(groups), "LEVEL": i}, ts))
    # Then, once all are in the joined topic, stream time far ahead on every partition, so every window closes.
    closers = [(right, None, {"GRP": group, "LEVEL": -1}, base + 10 * MINUTE) for group in groups]
    outcome = run(join_cluster, f"""
        CREATE STREAM {left} (id VARCHAR KEY, grp VARCHAR, reading INT)
          WITH (kafka_topic='{left}', partitions={PARTITIONS}, value_format='json');
        CREATE STREAM {right} (grp VARCHAR, level INT)
          WITH (kafka_topic='{right}', partitions={PARTITIONS}, value_format='json');
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM {name} AS SELECT l.grp, l.id, l.reading, r.level FROM {left} l LEFT JOIN {right} r
          WITHIN 1 SECOND GRACE PERIOD 1 MINUTE ON l.grp = r.grp;
        SHOW QUERIES;""")
    query_id = next(str(row[0]) for row in outcome if str(row[0]).startswith(f"CSAS_{name.upper()}"))
    producer = AIOKafkaProducer(bootstrap_servers=join_cluster.bootstrap, linger_ms=5)
    await producer.start()
    try:  # a keyless record goes to any partition: the join re-keys it
        for records in (produced, closers):
            futures = [await producer.send(topic, json.dumps(value).encode(), key=None if key is None else
                                           key.encode(), partition=rng.randrange(PARTITIONS) if key is None else
                                           partition_for(key.encode(), PARTITIONS), timestamp_ms=ts)
                       for topic, key, value, ts in records]
            await producer.flush()
            await asyncio.gather(*futures)
            if records is produced:
                await stream_join_until_exact(join_cluster, query_id, name.upper(), len(produced), "LEFT",
                                              (1_000, 1_000, MINUTE), check_sink=False, rekeyed=True)
    finally:
        await producer.stop()
    got = await stream_join_until_exact(join_cluster, query_id, name.upper(), len(produced) + len(closers), "LEFT",
                                        (1_000, 1_000, MINUTE), rekeyed=True)
    assert sum(level is None for _, _, level, _ in got) > 10 and sum(level is not None for _, _, level, _ in got) > 30
    for _, _, key, value, _ in await read_records(join_cluster.bootstrap, name.upper()):
        assert key is not None and value is not None
        row = json.loads(value)
        assert key.decode() in groups and row["ID"] == f"id{row['READING']}", row
    # Co-partitioned by the join column: each stream's record in its group's partition of the joined topic.
    for partition, _, key, _, _ in await read_records(join_cluster.bootstrap, joined_topic(sid, query_id)):
        assert key is not None and partition == partition_for(split_rekeyed(key[1:])[0], PARTITIONS)


@pytest.mark.slow  # 51-84 s, the longest of the suite, which took 13:38-14:10 of its 15 minutes on 2026-12-01; make test-all runs it
async def test_a_sigkilled_worker_loses_no_joined_record_and_repeats_none(join_cluster: LocalCluster) -> None:
    sid = join_cluster.service_id
    stream, sensors, enriched = f"jk_{sid}", f"jks_{sid}", f"jk_enriched_{sid}"
    cities, with_cities = f"jkc_{sid}", f"jk_cities_{sid}"
    alerts, with_alerts = f"jka_{sid}", f"jk_alerts_{sid}"
    names, with_names = f"jkn_{sid}", f"jk_names_{sid}"
    city_digits = f"jk_digits_{sid}"
    rng = random.Random(43)
    base = (int(time.time() * 1000) - 20 * MINUTE) // MINUTE * MINUTE
    site_records = table_history(rng, 150, [f"sensor-{i:03d}" for i in range(200)], 600, 0.1, base, 10 * MINUTE)
    # A table-table join beside it, over the sensors and a table of many more changes.
    city_records = table_history(rng, 100, [f"sensor-{i:03d}" for i in range(200)], 1_500, 0.1, base, 10 * MINUTE)

    def readings(first: int, count: int) -> list[StreamRecord]:
        return [(f"sensor-{rng.randrange(200):03d}", "a", first + i, base + (first + i) * 15 - rng.randrange(5_000))
                for i in range(count)]

    records = readings(0, 7_000)
    # A foreign-key join of the sensors with a table (of 3 partitions) keyed by their SITE values.
    sites = sorted({site for _, site, _ in site_records if site is not None})
    name_records = [(rng.choice(sites), None if rng.random() < 0.1 else f"name-{n}", base + n) for n in range(1_200)]
    # And a stream-stream join of the readings with alerts over the same span of event time.
    alert_records = [(alerts, "LEVEL", f"sensor-{rng.randrange(200):03d}", n,
                      base + n * 50 - rng.randrange(5_000)) for n in range(1_600)]
    run(join_cluster, f"""
        CREATE STREAM {stream} (sensor VARCHAR KEY, area VARCHAR, reading INT)
          WITH (kafka_topic='{stream}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {sensors} (id VARCHAR PRIMARY KEY, site VARCHAR)
          WITH (kafka_topic='{sensors}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {cities} (id VARCHAR PRIMARY KEY, city VARCHAR)
          WITH (kafka_topic='{cities}', partitions={PARTITIONS}, value_format='json');
        CREATE STREAM {alerts} (sensor VARCHAR KEY, level INT)
          WITH (kafka_topic='{alerts}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {names} (id VARCHAR PRIMARY KEY, name VARCHAR)
          WITH (kafka_topic='{names}', partitions=3, value_format='json');""")
    await produce_table(join_cluster.bootstrap, sensors, "SITE", site_records)
    await produce_table(join_cluster.bootstrap, cities, "CITY", city_records[:1_000])
    await produce_timed(join_cluster.bootstrap, stream, records)
    await produce_sides(join_cluster.bootstrap, alert_records[:1_200])
    await produce_table(join_cluster.bootstrap, names, "NAME", name_records[:800], partitions=3)
    outcome = run(join_cluster, f"""
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM {enriched} AS SELECT r.sensor, r.reading, s.site FROM {stream} r LEFT JOIN {sensors} s
          ON r.sensor = s.id;
        CREATE TABLE {with_cities} AS SELECT s.id, s.site, c.city FROM {sensors} s FULL OUTER JOIN {cities} c
          ON s.id = c.id;
        CREATE STREAM {with_alerts} AS SELECT r.sensor, r.reading, a.level FROM {stream} r LEFT JOIN {alerts} a
          WITHIN 1 SECOND GRACE PERIOD 3 SECONDS ON r.sensor = a.sensor;
        CREATE TABLE {with_names} AS SELECT s.id, s.site, n.name FROM {sensors} s LEFT JOIN {names} n
          ON s.site = n.id;
        CREATE TABLE {city_digits} AS SELECT SUBSTRING(city, 6, 1) AS digit, COUNT(*) AS n, SUM(LEN(city)) AS chars
          FROM {cities} GROUP BY SUBSTRING(city, 6, 1) HAVING COUNT(*) > 0;
        SHOW QUERIES;""")
    query_id = next(str(row[0]) for row in outcome if str(row[0]).startswith(f"CSAS_{enriched.upper()}"))

    await wait_progressing(join_cluster, query_id, "worker-1")
    await asyncio.sleep(rng.uniform(0.2, 2))
    join_cluster.kill("worker-1")
    more = readings(7_000, 3_000)
    await produce_timed(join_cluster.bootstrap, stream, more)
    await produce_table(join_cluster.bootstrap, cities, "CITY", city_records[1_000:])
    await produce_sides(join_cluster.bootstrap, alert_records[1_200:])
    await produce_table(join_cluster.bootstrap, names, "NAME", name_records[800:], partitions=3)
    await asyncio.to_thread(join_cluster.restart, "worker-1")
    records += more

    want = join_reference(site_records, [(s, r, ts) for s, _, r, ts in records], inner=False)
    got = []
    for _, _, key, value, _ in await sink_until(join_cluster.bootstrap, enriched.upper(), len(want), 300):
        assert key is not None and value is not None
        row = json.loads(value)
        got.append((key.decode(), row["READING"], row["SITE"]))
    assert len(got) == len(want), f"{len(got) - len(want)} more joined records than input records"
    assert sorted(got) == [w[:3] for w in want]

    want_cities = table_join_reference(site_records, city_records, "FULL")
    assert pull_until(join_cluster, f"SELECT * FROM {with_cities};", want_cities) == want_cities
    assert await latest_in_sink(join_cluster.bootstrap, with_cities.upper()) == want_cities
    # The joined table has a standby copy of each partition on the other worker, replayed from
    # its topic: both workers hold every partition's rows (one as the active, one as a standby).
    for partition in range(PARTITIONS):
        mine = sorted(tuple(row) for key, row in want_cities.items() if partition_for(key.encode(), PARTITIONS) == partition)
        for worker in ("worker-1", "worker-2"):
            rows = await scan_until(join_cluster.child(worker).endpoint, with_cities.upper(), partition, mine)
            assert rows == mine, (worker, partition)

    # A GROUP BY over the cities table across the SIGKILL: each changed row out of its old
    # group and into its new one, exactly once.
    final = {key: city for key, city, _ in city_records}
    want_digits: dict[str, list[Any]] = {}
    for city in filter(None, final.values()):
        row = want_digits.setdefault(city[5], [city[5], 0, 0])
        row[1] += 1
        row[2] += len(city)
    assert pull_until(join_cluster, f"SELECT * FROM {city_digits};", want_digits) == want_digits

    want_names = foreign_key_reference(site_records, name_records)
    assert pull_until(join_cluster, f"SELECT * FROM {with_names};", want_names) == want_names
    assert await latest_in_sink(join_cluster.bootstrap, with_names.upper(), ("SITE", "NAME")) == want_names

    alerts_query = next(str(row[0]) for row in outcome if str(row[0]).startswith(f"CSAS_{with_alerts.upper()}"))
    await stream_join_until_exact(join_cluster, alerts_query, with_alerts.upper(), len(records) + len(alert_records),
                                  "LEFT", (1_000, 1_000, 3_000))


async def produce_events(bootstrap: str, topic: str, records: list[tuple[str, str, int, int]]) -> None:
    """(event id, SENSOR, READING, TS) records, keyed by the event id and partitioned by it as the Java client."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for eid, sensor, reading, ts in records:
            await producer.send(topic, json.dumps({"SENSOR": sensor, "READING": reading, "TS": ts}).encode(),
                                key=eid.encode(), partition=partition_for(eid.encode(), PARTITIONS))
        await producer.flush()
    finally:
        await producer.stop()


async def test_group_by_over_a_stream_table_join(join_cluster: LocalCluster) -> None:
    """GROUP BY over a join, one query: the stream re-keyed by its join column, joined with the
    table, each joined row keyed by the GROUP BY into the joined topic and aggregated there,
    with expressions over its aggregates and a HAVING; windowed and by two columns too, a LEFT
    join's NULL grouping value logged."""
    cluster = join_cluster
    events, sensors = f"ev_{cluster.service_id}", f"sensors_ga_{cluster.service_id}"
    run(cluster, f"""
        CREATE STREAM {events} (eid VARCHAR KEY, sensor VARCHAR, reading INT, ts BIGINT)
          WITH (kafka_topic='{events}', partitions={PARTITIONS}, value_format='json', timestamp='ts');
        CREATE TABLE {sensors} (id VARCHAR PRIMARY KEY, site VARCHAR, weight INT)
          WITH (kafka_topic='{sensors}', partitions={PARTITIONS}, value_format='json');
    """)
    sites = {f"s{i}": (f"site-{i % 7}", i % 3 + 1) for i in range(50)}  # s50..s59 are in no site
    producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, linger_ms=5)
    await producer.start()
    try:
        for sensor, (site, weight) in sites.items():
            await producer.send(sensors, json.dumps({"SITE": site, "WEIGHT": weight}).encode(), key=sensor.encode(),
                                partition=partition_for(sensor.encode(), PARTITIONS))
        await producer.flush()
    finally:
        await producer.stop()
    await asyncio.to_thread(pull_until, cluster, f"SELECT id FROM {sensors};", {s: [s] for s in sites})
    run(cluster, f"""
        SET 'auto.offset.reset'='earliest';
        CREATE TABLE per_site_{events} AS SELECT s.site, COUNT(*) AS n, SUM(e.reading * s.weight) AS total,
          MAX(e.ROWTIME) AS latest, SUM(e.reading * s.weight) / COUNT(*) AS mean,
          MAX(e.reading) - MIN(e.reading) AS spread FROM {events} e JOIN {sensors} s ON e.sensor = s.id
          WHERE e.reading >= 0 GROUP BY s.site HAVING MIN(s.weight) > 0;
        CREATE TABLE per_minute_{events} AS SELECT s.site, e.sensor, COUNT(*) AS n FROM {events} e
          LEFT JOIN {sensors} s ON e.sensor = s.id WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY s.site, e.sensor;
    """)
    rng = random.Random(21)
    # Event times after the table's rows were written: each record joins the table as it is now.
    base = int(time.time() * 1000)
    records = [(f"e{i}", f"s{rng.randrange(60)}", rng.randrange(-20, 100), base + rng.randrange(10 * MINUTE))
               for i in range(3_000)]
    await produce_events(cluster.bootstrap, events, records)

    per_site: dict[str, list[int]] = {}
    windows: dict[tuple[str, str, int], int] = {}
    for _, sensor, reading, ts in records:
        if sensor in sites:
            site, weight = sites[sensor]
            if reading >= 0:  # the stream record's time is its ROWTIME (its TIMESTAMP column's)
                n, total, latest, low, high = per_site.get(site, [0, 0, 0, reading, reading])
                per_site[site] = [n + 1, total + reading * weight, max(latest, ts), min(low, reading), max(high, reading)]
            start = ts - ts % MINUTE
            windows[(site, sensor, start)] = windows.get((site, sensor, start), 0) + 1
    # Expressions over aggregates (one held apart, MIN) and a HAVING over another (every weight is over 0).
    want = {site: [site, n, total, latest, total // n, high - low] for site, (n, total, latest, low, high) in per_site.items()}
    assert await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM per_site_{events};", want) == want
    want_windows = {k: [k[0], k[1], k[2], k[2] + MINUTE, n] for k, n in windows.items()}
    got = await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM per_minute_{events};", want_windows,
                                  key=lambda row: tuple(row[:3]))
    assert got == want_windows
    site, sensor, start = next(iter(windows))
    assert run(cluster, f"SELECT n FROM per_minute_{events} WHERE site = '{site}' AND sensor = '{sensor}' "
                        f"AND WINDOWSTART = {start};") == [[windows[(site, sensor, start)]]]
    logged = [json.loads(v) for *_, v in await read_all(cluster.bootstrap, processing_log_topic(cluster.service_id))
              if v is not None]
    unknown = sum(1 for _, sensor, _, _ in records if sensor not in sites)
    assert [e["REASON"] for e in logged if e["QUERY_ID"].startswith(f"CTAS_PER_MINUTE_{events.upper()}_")] == [
        "the new key (S.SITE, E.SENSOR) is NULL"] * unknown


async def test_group_by_over_a_stream_stream_join(join_cluster: LocalCluster) -> None:
    """GROUP BY over a join of two streams WITHIN, one query: both streams gathered in the
    joined topic, each joined pair keyed by the GROUP BY (another column than the join's) into
    a topic of its own and aggregated there; exactly the pairs within the window are counted."""
    cluster = join_cluster
    readings, visits = f"gsr_{cluster.service_id}", f"gsv_{cluster.service_id}"
    run(cluster, f"""
        CREATE STREAM {readings} (sensor VARCHAR KEY, reading INT)
          WITH (kafka_topic='{readings}', partitions={PARTITIONS}, value_format='json');
        CREATE STREAM {visits} (sensor VARCHAR KEY, site VARCHAR)
          WITH (kafka_topic='{visits}', partitions={PARTITIONS}, value_format='json');
        SET 'auto.offset.reset'='earliest';
        CREATE TABLE per_site_{readings} AS SELECT v.site, COUNT(*) AS n, SUM(r.reading) AS total
          FROM {readings} r JOIN {visits} v WITHIN 1 MINUTE ON r.sensor = v.sensor GROUP BY v.site;
    """)
    rng = random.Random(31)
    base = int(time.time() * 1000) - 60 * MINUTE
    # Bursts 5 minutes apart, each within 20 s: two records join exactly when they share a
    # sensor and a burst. Sent in event-time order, so none is late.
    produced: list[tuple[str, str, str, Any, int]] = []
    for burst in range(6):
        for i in range(40):
            sensor, ts = f"s{rng.randrange(10)}", base + burst * 5 * MINUTE + i * 500
            produced.append((readings, "READING", sensor, rng.randrange(100), ts) if rng.random() < 0.6
                            else (visits, "SITE", sensor, f"site-{rng.randrange(4)}", ts))
    await produce_sides(cluster.bootstrap, produced)
    want: dict[str, list[Any]] = {}
    for topic, _, sensor, reading, ts in produced:
        if topic != readings:
            continue
        for other, _, other_sensor, site, other_ts in produced:
            if other == visits and other_sensor == sensor and abs(other_ts - ts) <= MINUTE:
                row = want.setdefault(site, [site, 0, 0])
                row[1] += 1
                row[2] += reading
    assert want
    assert await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM per_site_{readings};", want) == want
    # Read-your-writes through the sides, the join and the aggregation: a pair inserted now
    # counts in the pull that carries the second INSERT's token.
    now = int(time.time() * 1000)
    pull = f"SELECT * FROM per_site_{readings} WHERE site = 'site-rw';"
    await asyncio.to_thread(reads_own_writes, cluster, [
        (f"INSERT INTO {visits} (sensor, site, ROWTIME) VALUES ('rw', 'site-rw', {now});", pull, []),
        (f"INSERT INTO {readings} (sensor, reading, ROWTIME) VALUES ('rw', 5, {now + 1});", pull,
         [["site-rw", 1, 5]])])


async def test_a_multi_way_join_on_several_expressions(join_cluster: LocalCluster) -> None:
    """Events keyed by their id joined with their sensor's row (the stream re-keyed by its
    sensor), then with the site that row names (the joined rows re-keyed by S.SITE), as a
    stream and under a GROUP BY: exact against the tables as of each event, with both tables
    changed between two phases of events (the later events see the new rows); an event whose
    sensor has no row has no site to be re-keyed by and goes to the processing log."""
    cluster, sid = join_cluster, join_cluster.service_id
    events, sensors, sites = f"mw_{sid}", f"mw_sensors_{sid}", f"mw_sites_{sid}"
    chained, per_city = f"mw_chained_{sid}", f"mw_per_city_{sid}"
    run(cluster, f"""
        CREATE STREAM {events} (eid VARCHAR KEY, sensor VARCHAR, reading INT, ts BIGINT)
          WITH (kafka_topic='{events}', partitions={PARTITIONS}, value_format='json', timestamp='ts');
        CREATE TABLE {sensors} (id VARCHAR PRIMARY KEY, site VARCHAR)
          WITH (kafka_topic='{sensors}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {sites} (id VARCHAR PRIMARY KEY, city VARCHAR)
          WITH (kafka_topic='{sites}', partitions={PARTITIONS}, value_format='json');""")
    base = int(time.time() * 1000)
    switch = base + 5 * MINUTE  # the tables' changes, and the first event of the second phase
    before = {f"s{i}": f"site-{i % 4}" for i in range(8)} | {"s8": "site-9"}  # s9 has no row; site-9 no city
    after = {**before, "s1": "site-2"}
    del after["s3"]
    cities_before = {f"site-{i}": f"city-{i}" for i in range(4)}
    cities_after = {**cities_before, "site-0": "city-z"}
    del cities_after["site-3"]
    await produce_table(cluster.bootstrap, sensors, "SITE", [(k, v, base - 1000) for k, v in before.items()]
                        + [("s1", "site-2", switch), ("s3", None, switch)])
    await produce_table(cluster.bootstrap, sites, "CITY", [(k, v, base - 1000) for k, v in cities_before.items()]
                        + [("site-0", "city-z", switch), ("site-3", None, switch)])
    run(cluster, f"""
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM {chained} AS SELECT s.site, e.eid, e.reading, t.city FROM {events} e
          LEFT JOIN {sensors} s ON e.sensor = s.id LEFT JOIN {sites} t ON s.site = t.id WHERE e.reading >= 0;
        CREATE TABLE {per_city} AS SELECT t.city, COUNT(*) AS n, SUM(e.reading) AS total FROM {events} e
          JOIN {sensors} s ON e.sensor = s.id JOIN {sites} t ON s.site = t.id GROUP BY t.city;""")
    rng = random.Random(53)

    want: list[tuple[str, str, int, str | None]] = []
    counts: dict[str, list[int]] = {}
    logged = 0
    for phase, (start, rows, cities) in enumerate(((base, before, cities_before), (switch, after, cities_after))):
        # The second phase's events only once the first's went through every stage of both queries:
        # a stage reads the joined rows of several partitions, so their times are not in order there.
        batch = [(f"e{phase}-{i}", f"s{rng.randrange(10)}", rng.randrange(-10, 100), start + rng.randrange(4 * MINUTE))
                 for i in range(300)]
        await produce_events(cluster.bootstrap, events, batch)
        for eid, sensor, reading, _ in batch:
            site = rows.get(sensor)
            logged += site is None
            if site is not None and reading >= 0:
                want.append((site, eid, reading, cities.get(site)))
            if site is not None and site in cities:
                n, total = counts.get(cities[site], [0, 0])
                counts[cities[site]] = [n + 1, total + reading]
        got = []
        for partition, _, key, value, _ in await sink_until(cluster.bootstrap, chained.upper(), len(want)):
            assert key is not None and value is not None and partition == partition_for(key, PARTITIONS)
            row = json.loads(value)
            got.append((key.decode(), row["EID"], row["READING"], row["CITY"]))
        assert sorted(got) == sorted(want), f"phase {phase}"
        want_counts = {city: [city, n, total] for city, (n, total) in counts.items()}
        assert await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {per_city};", want_counts) == want_counts
    assert {city for *_, city in want} == {None, "city-0", "city-1", "city-2", "city-3", "city-z"}
    reasons = [json.loads(v)["REASON"] for *_, v in await read_all(cluster.bootstrap, processing_log_topic(sid))
               if v is not None and json.loads(v)["QUERY_ID"].startswith(f"CSAS_{chained.upper()}_")]
    assert reasons == ["the new key (S.SITE) is NULL"] * logged and logged > 0


async def test_a_stream_stream_join_then_a_table_on_another_expression(join_cluster: LocalCluster) -> None:
    """Clicks joined WITHIN an hour with the same user's views, then each pair LEFT JOINed with
    the clicked page's row (a stage of its own: the pairs re-keyed by C.PAGE): every pair once,
    with its page's owner, or NULL for a page the table lacks. And the same pairs INNER JOINed
    with the pages under a GROUP BY of the owner, one query: each owner's pairs counted once."""
    cluster, sid = join_cluster, join_cluster.service_id
    clicks, views, pages, seen = f"ssc_{sid}", f"ssv_{sid}", f"ssp_{sid}", f"ss_seen_{sid}"
    per_owner = f"ss_per_owner_{sid}"
    run(cluster, f"""
        CREATE STREAM {clicks} (uid VARCHAR KEY, page VARCHAR)
          WITH (kafka_topic='{clicks}', partitions={PARTITIONS}, value_format='json');
        CREATE STREAM {views} (uid VARCHAR KEY, ms INT)
          WITH (kafka_topic='{views}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {pages} (id VARCHAR PRIMARY KEY, owner VARCHAR)
          WITH (kafka_topic='{pages}', partitions={PARTITIONS}, value_format='json');""")
    rng = random.Random(59)
    base = int(time.time() * 1000) - 10 * MINUTE
    owners = {f"p{i}": f"owner-{i}" for i in range(4)}  # p4 has no row
    await produce_table(cluster.bootstrap, pages, "OWNER", [(p, o, base - 1000) for p, o in owners.items()])
    users = [f"u{i}" for i in range(8)]
    click_records = [(clicks, "PAGE", u, f"p{rng.randrange(5)}", base + rng.randrange(MINUTE)) for u in users
                     for _ in range(3)]
    view_records = [(views, "MS", u, 100 * n + i, base + rng.randrange(MINUTE)) for n, u in enumerate(users)
                    for i in range(2)]
    await produce_sides(cluster.bootstrap, sorted(click_records + view_records, key=lambda r: r[4]))
    run(cluster, f"""
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM {seen} AS SELECT c.page, c.uid, v.ms, p.owner, c.ROWTIME AS clicked FROM {clicks} c
          JOIN {views} v WITHIN 1 HOUR ON c.uid = v.uid LEFT JOIN {pages} p ON c.page = p.id;
        CREATE TABLE {per_owner} AS SELECT p.owner, COUNT(*) AS pairs, SUM(v.ms) AS ms FROM {clicks} c
          JOIN {views} v WITHIN 1 HOUR ON c.uid = v.uid JOIN {pages} p ON c.page = p.id GROUP BY p.owner;""")
    # C.ROWTIME is the click's time; the pair's own (its record's) is the later of the two.
    want = sorted((page, uid, ms, owners.get(page), clicked, max(clicked, viewed))
                  for _, _, uid, page, clicked in click_records
                  for _, _, viewer, ms, viewed in view_records if viewer == uid)
    got = []
    for partition, _, key, value, timestamp in await sink_until(cluster.bootstrap, seen.upper(), len(want)):
        assert key is not None and value is not None and partition == partition_for(key, PARTITIONS)
        row = json.loads(value)
        got.append((key.decode(), row["UID"], row["MS"], row["OWNER"], row["CLICKED"], timestamp))
    assert sorted(got) == want
    assert any(owner is None for _, _, _, owner, _, _ in want) and len(want) == 8 * 3 * 2
    assert any(clicked < at for *_, clicked, at in want)  # pairs whose view came later: their time is the view's
    counted: dict[str, list[Any]] = {}
    for _, _, ms, owner, _, _ in want:
        if owner is not None:
            row = counted.setdefault(owner, [owner, 0, 0])
            row[1] += 1
            row[2] += ms
    assert await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {per_owner};", counted) == counted


@pytest.mark.slow  # its six stages' start-ups (20-25 s) would take make test past its 15 minutes; make test-all runs it
async def test_three_streams_joined_as_ksqldbs_orders_payments_and_shipments(join_cluster: LocalCluster) -> None:
    """ksqlDB's n-way example: orders JOINed WITHIN an hour with their payments, then LEFT
    JOINed WITHIN 2 minutes with their shipments (keyed by another column: re-keyed by the
    order id), the second join a stream-stream stage of its own over the pairs by their time.
    Every (order, payment, shipment) once, stamped with the latest of the three times; a pair
    without a shipment once with NULL, after stream time passes its window and grace; the
    order's own ROWTIME carried through both stages. A GROUP BY over the INNER form of the same
    join (per warehouse: the triples, their amounts and the latest order's own time) counts each
    triple once."""
    cluster, sid = join_cluster, join_cluster.service_id
    orders, payments, shipments, shipped, per_wh = (f"n3_{name}_{sid}" for name in (
        "orders", "payments", "shipments", "out", "per_wh"))
    run(cluster, f"""
        CREATE STREAM {orders} (id VARCHAR KEY, item VARCHAR)
          WITH (kafka_topic='{orders}', partitions={PARTITIONS}, value_format='json');
        CREATE STREAM {payments} (id VARCHAR KEY, amount INT)
          WITH (kafka_topic='{payments}', partitions={PARTITIONS}, value_format='json');
        CREATE STREAM {shipments} (sid VARCHAR KEY, oid VARCHAR, wh VARCHAR)
          WITH (kafka_topic='{shipments}', partitions={PARTITIONS}, value_format='json');
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM {shipped} AS SELECT o.id, o.item, p.amount, s.wh, o.ROWTIME AS ordered FROM {orders} o
          JOIN {payments} p WITHIN 1 HOUR ON o.id = p.id
          LEFT JOIN {shipments} s WITHIN 2 MINUTES GRACE PERIOD 2 MINUTES ON o.id = s.oid;
        CREATE TABLE {per_wh} AS SELECT s.wh, COUNT(*) AS n, SUM(p.amount) AS total, MAX(o.ROWTIME) AS last_order
          FROM {orders} o
          JOIN {payments} p WITHIN 1 HOUR ON o.id = p.id
          JOIN {shipments} s WITHIN 2 MINUTES GRACE PERIOD 2 MINUTES ON o.id = s.oid GROUP BY s.wh;""")
    rng = random.Random(61)
    base = int(time.time() * 1000) - 20 * MINUTE
    ids = [f"o{i}" for i in range(12)]
    order_records = [(orders, "ITEM", i, f"item-{i}", base + rng.randrange(MINUTE)) for i in ids]
    payment_records = [(payments, "AMOUNT", i, 10 * n + k, base + rng.randrange(MINUTE))
                       for n, i in enumerate(ids[:11]) for k in range(rng.randrange(1, 3))]  # o11: never paid
    ship_records = [(shipments, "", f"s{n}-{k}", {"OID": i, "WH": f"wh-{n}-{k}"}, base + rng.randrange(MINUTE))
                    for n, i in enumerate(ids[:9]) for k in range(rng.randrange(1, 3))]  # o9, o10: paid, not shipped
    await produce_sides(cluster.bootstrap, sorted(order_records + payment_records + ship_records, key=lambda r: r[4]))
    pairs = [(i, item, amount, ordered, max(ordered, paid)) for _, _, i, item, ordered in order_records
             for _, _, j, amount, paid in payment_records if i == j]
    matched = sorted((i, item, amount, ship["WH"], ordered, max(at, shipped_at)) for i, item, amount, ordered, at in pairs
                     for _, _, _, ship, shipped_at in ship_records if ship["OID"] == i)
    alone = sorted((i, item, amount, None, ordered, at) for i, item, amount, ordered, at in pairs
                   if not any(ship["OID"] == i for _, _, _, ship, _ in ship_records))
    assert matched and alone and len({r[0] for r in alone}) == 2

    async def results(count: int) -> list[tuple[Any, ...]]:
        got = []
        for partition, _, key, value, timestamp in await sink_until(cluster.bootstrap, shipped.upper(), count):
            assert key is not None and value is not None and partition == partition_for(key, PARTITIONS)
            row = json.loads(value)
            got.append((key.decode(), row["ITEM"], row["AMOUNT"], row["WH"], row["ORDERED"], timestamp))
        return sorted(got)

    assert await results(len(matched)) == matched
    warehouses: dict[str, list[Any]] = {}
    for _, _, amount, wh, ordered, _ in matched:
        counted = warehouses.setdefault(wh, [wh, 0, 0, ordered])
        counted[1] += 1
        counted[2] += amount
        counted[3] = max(counted[3], ordered)  # o.ROWTIME: the order's own time, not the triple's
    assert await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {per_wh};", warehouses) == warehouses
    # Stream time far ahead on every partition of the second stage: the lone pairs' windows close.
    await produce_sides(cluster.bootstrap, [(shipments, "", f"late-{i}", {"OID": i, "WH": "none"}, base + 10 * MINUTE)
                                            for i in ids])
    assert await results(len(matched) + len(alone)) == sorted(matched + alone)
    assert await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {per_wh};", warehouses) == warehouses


Row = tuple[str, dict[str, Any] | None, int | None]
"""A table record of several columns: key, value (None: a tombstone), timestamp (None: now)."""


def _page_changes(rng: random.Random, count: int) -> list[Row]:
    """Changes of 60 pages: an owner of ten (o9 never has a row) and a weight, or a delete."""
    return [(f"p{rng.randrange(60)}", None if rng.random() < 0.1 else
             {"OWNER": f"o{rng.randrange(10)}", "WEIGHT": rng.randrange(-10, 100)}, None) for _ in range(count)]


def _owner_changes(rng: random.Random, count: int) -> list[Row]:
    """Changes of owners o0-o8: a team of four, or a delete."""
    return [(f"o{rng.randrange(9)}", None if rng.random() < 0.15 else {"TEAM": f"t{rng.randrange(4)}"}, None)
            for _ in range(count)]


@pytest.mark.slow  # 23-34 s: make test took 15:16 of its 15 minutes on 2026-12-07 with it; make test-all runs it
async def test_group_by_over_tables_joined_with_tables(join_cluster: LocalCluster) -> None:
    """GROUP BY over a foreign-key LEFT JOIN of two tables, one query: each page counted in its
    owner's team, exactly against both tables' rows after two phases of changes: pages moved
    to other owners or deleted, owners moved to other teams (every page of theirs with them)
    or deleted (their pages' team NULL: logged, not counted), pages the WHERE drops. Then
    read-your-writes through the sides, the join, the regrouping and the aggregation."""
    sid = join_cluster.service_id
    pages, owners, teams = f"gt_pages_{sid}", f"gt_owners_{sid}", f"gt_teams_{sid}"
    run(join_cluster, f"""
        CREATE TABLE {pages} (page VARCHAR PRIMARY KEY, owner VARCHAR, weight INT)
          WITH (kafka_topic='{pages}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {owners} (name VARCHAR PRIMARY KEY, team VARCHAR)
          WITH (kafka_topic='{owners}', partitions=3, value_format='json');""")
    rng = random.Random(67)

    page_changes, owner_changes = partial(_page_changes, rng), partial(_owner_changes, rng)

    def reference(page_records: list[Any], owner_records: list[Any]) -> dict[str, list[Any]]:
        page_rows = {key: value for key, value, _ in page_records}
        owner_rows = {key: value for key, value, _ in owner_records}
        want: dict[str, list[Any]] = {}
        for row in page_rows.values():
            owner = None if row is None else owner_rows.get(row["OWNER"])
            if row is not None and row["WEIGHT"] > 0 and owner is not None:
                counted = want.setdefault(owner["TEAM"], [owner["TEAM"], 0, 0])
                counted[1] += 1
                counted[2] += row["WEIGHT"]
        return want

    page_records, owner_records = page_changes(200), owner_changes(20)
    await produce_rows(join_cluster.bootstrap, owners, owner_records, partitions=3)
    await produce_rows(join_cluster.bootstrap, pages, page_records)
    run(join_cluster, f"""
        CREATE TABLE {teams} AS SELECT o.team, COUNT(*) AS pages, SUM(p.weight) AS weight FROM {pages} p
          LEFT JOIN {owners} o ON p.owner = o.name WHERE p.weight > 0 GROUP BY o.team HAVING COUNT(*) > 0;""")
    want = reference(page_records, owner_records)
    assert await asyncio.to_thread(pull_until, join_cluster, f"SELECT * FROM {teams};", want) == want
    more_pages, more_owners = page_changes(150), owner_changes(20)
    await produce_rows(join_cluster.bootstrap, owners, more_owners[:10], partitions=3)
    await produce_rows(join_cluster.bootstrap, pages, more_pages)
    await produce_rows(join_cluster.bootstrap, owners, more_owners[10:], partitions=3)
    want = reference(page_records + more_pages, owner_records + more_owners)
    assert await asyncio.to_thread(pull_until, join_cluster, f"SELECT * FROM {teams};", want) == want

    pull = f"SELECT * FROM {teams} WHERE team = 't-rw';"
    await asyncio.to_thread(reads_own_writes, join_cluster, [
        (f"INSERT INTO {owners} (name, team) VALUES ('o-rw', 't-rw');", pull, []),
        (f"INSERT INTO {pages} (page, owner, weight) VALUES ('p-rw', 'o-rw', 4);", pull, [["t-rw", 1, 4]]),
        (f"INSERT INTO {pages} (page, owner, weight) VALUES ('p-rw2', 'o-rw', 6);", pull, [["t-rw", 2, 10]]),
        (f"INSERT INTO {owners} (name, team) VALUES ('o-rw', 't-rw2');", pull, [])])
    want = {"t-rw2": ["t-rw2", 2, 10]}
    assert await asyncio.to_thread(pull_until, join_cluster, f"SELECT * FROM {teams} WHERE team = 't-rw2';",
                                   want) == want


@pytest.mark.slow  # its seven stages' start-ups would take make test past its 15 minutes; make test-all runs it
async def test_tables_joined_on_several_keys_follow_every_table(join_cluster: LocalCluster) -> None:
    """Pages joined to their owner's team (a foreign key), then to that team's boss (another
    foreign key, a column of the owners): a join stage per key, LEFT joins, against the three
    tables' rows after two phases of changes on every table, pulled and as the sink's latest
    records; and a GROUP BY of the boss over the same chain, its pages counted, summed and
    listed as the chain's rows give them. (The join tasks chained stage by stage through
    random changes of five tables are unit-tested in test_table_joining.)"""
    sid = join_cluster.service_id
    pages, owners, bosses, page_bosses = f"nw_pages_{sid}", f"nw_owners_{sid}", f"nw_bosses_{sid}", f"nw_pb_{sid}"
    per_boss = f"nw_per_boss_{sid}"
    run(join_cluster, f"""
        CREATE TABLE {pages} (page VARCHAR PRIMARY KEY, owner VARCHAR, weight INT)
          WITH (kafka_topic='{pages}', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {owners} (name VARCHAR PRIMARY KEY, team VARCHAR)
          WITH (kafka_topic='{owners}', partitions=3, value_format='json');
        CREATE TABLE {bosses} (id VARCHAR PRIMARY KEY, boss VARCHAR)
          WITH (kafka_topic='{bosses}', partitions=2, value_format='json');""")
    rng = random.Random(71)

    page_changes, owner_changes = partial(_page_changes, rng), partial(_owner_changes, rng)

    def boss_changes(count: int) -> list[tuple[str, dict[str, Any] | None, int | None]]:
        return [(f"t{rng.randrange(3)}", None if rng.random() < 0.15 else {"BOSS": f"b{rng.randrange(3)}"}, None)
                for _ in range(count)]  # t3 never has a boss

    def chained(page_records: list[Any], owner_records: list[Any], boss_records: list[Any]) -> dict[str, list[Any]]:
        """Each page with its owner's team and that team's boss (LEFT joins: NULLs where a row is missing)."""
        owner_rows = {key: value for key, value, _ in owner_records}
        boss_rows = {key: value for key, value, _ in boss_records}
        want: dict[str, list[Any]] = {}
        for page, row in {key: value for key, value, _ in page_records}.items():
            if row is not None:
                team = (owner_rows.get(row["OWNER"]) or {}).get("TEAM")
                want[page] = [page, row["WEIGHT"], team, (boss_rows.get(team) or {}).get("BOSS")]
        return want

    page_records, owner_records, boss_records = page_changes(120), owner_changes(20), boss_changes(6)
    await produce_rows(join_cluster.bootstrap, owners, owner_records, partitions=3)
    await produce_rows(join_cluster.bootstrap, bosses, boss_records, partitions=2)
    await produce_rows(join_cluster.bootstrap, pages, page_records)
    run(join_cluster, f"""
        CREATE TABLE {page_bosses} AS SELECT p.page, p.weight, o.team, b.boss FROM {pages} p
          LEFT JOIN {owners} o ON p.owner = o.name LEFT JOIN {bosses} b ON o.team = b.id;
        CREATE TABLE {per_boss} AS SELECT b.boss, COUNT(*) AS pages, SUM(p.weight) AS weight,
          COLLECT_LIST(p.page) AS listed FROM {pages} p LEFT JOIN {owners} o ON p.owner = o.name
          LEFT JOIN {bosses} b ON o.team = b.id GROUP BY b.boss HAVING COUNT(*) > 0;""")

    def bosses_of(joined: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """The chain's rows per boss (a row without one is in no group; a group all of whose rows
        left it, COUNT 0, is one HAVING drops), the pages sorted."""
        groups: dict[str, list[Any]] = {}
        for page, weight, _, boss in joined.values():
            if boss is not None:
                group = groups.setdefault(boss, [boss, 0, 0, []])
                group[1] += 1
                group[2] += weight
                group[3] = sorted([*group[3], page])
        return groups

    rows = chained(page_records, owner_records, boss_records)
    assert await asyncio.to_thread(pull_until, join_cluster, f"SELECT * FROM {page_bosses};", rows) == rows
    grouped = bosses_of(rows)
    assert await asyncio.to_thread(pull_until, join_cluster, f"SELECT * FROM {per_boss};", grouped,
                                   shown=sorted_lists) == grouped
    more_pages, more_owners, more_bosses = page_changes(100), owner_changes(20), boss_changes(6)
    await produce_rows(join_cluster.bootstrap, owners, more_owners[:10], partitions=3)
    await produce_rows(join_cluster.bootstrap, bosses, more_bosses[:3], partitions=2)
    await produce_rows(join_cluster.bootstrap, pages, more_pages)
    await produce_rows(join_cluster.bootstrap, owners, more_owners[10:], partitions=3)
    await produce_rows(join_cluster.bootstrap, bosses, more_bosses[3:], partitions=2)
    rows = chained(page_records + more_pages, owner_records + more_owners, boss_records + more_bosses)
    assert await asyncio.to_thread(pull_until, join_cluster, f"SELECT * FROM {page_bosses};", rows) == rows
    assert await latest_in_sink(join_cluster.bootstrap, page_bosses.upper(), ("WEIGHT", "TEAM", "BOSS")) == rows
    assert any(team is not None and boss is None for _, _, team, boss in rows.values())
    grouped = bosses_of(rows)
    assert await asyncio.to_thread(pull_until, join_cluster, f"SELECT * FROM {per_boss};", grouped,
                                   shown=sorted_lists) == grouped
