"""Two-stage persistent queries on the real cluster (Kafka, Spark, RocksDB, gRPC):

- GROUP BY a non-key column re-keys through the repartition topic into a table with another
  partition count; GROUP BY the key into another partition count does the same. Every row
  is checked against values computed here, and lands on the partition murmur2 of its key
  names (so pull queries find it).
- CREATE TABLE AS SELECT over a table (no GROUP BY) is materialized: updates, deletes and
  rows the WHERE drops all reach the result table and its topic.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from millpond.cli.client import RouterClient
from millpond.deploy.local.launcher import LocalCluster
from millpond.shared.catalog.names import changelog_topic, processing_log_topic, repartition_topic
from millpond.shared.kafka.admin import topic_partitions
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.kafka.serde import deserialize_key, serialize_key
from millpond.shared.sql.ast import SqlType
from tests.e2e.helpers import collect, log_entries, own_queries, pull_until, read_all, reads_own_writes, run, wait_for
from tests.e2e.workload import produce

PARTITIONS = 4


@pytest.fixture(autouse=True)
def _own_queries(cluster: LocalCluster) -> Iterator[None]:
    """Each test's queries end with it (the session's cluster runs the other modules' tests)."""
    with own_queries(cluster):
        yield


async def test_group_by_another_column_repartitions_exactly(cluster: LocalCluster) -> None:
    stream = f"rp_{cluster.service_id}"
    by_area, by_sensor = f"by_area_{stream}", f"by_sensor_{stream}"
    run(cluster, f"CREATE STREAM {stream} (sensor VARCHAR KEY, area VARCHAR, reading INT) "
                 f"WITH (kafka_topic='{stream}', partitions={PARTITIONS}, value_format='json');")
    rng = random.Random(7)
    areas: dict[str, list[int]] = defaultdict(list)
    area_sensors: dict[str, set[str]] = defaultdict(set)
    per_sensor: dict[str, int] = defaultdict(int)
    events: list[tuple[bytes | None, bytes]] = []
    counted: list[tuple[int, str]] = []  # (event, area) of the events each area counts
    for i in range(30_000):
        sensor, area, reading = f"s{rng.randrange(400):03d}", f"area-{rng.randrange(25):02d}", rng.randrange(-100, 1000)
        if i % 1500 == 0:  # no grouping key: the record goes to the processing log
            events.append((sensor.encode(), json.dumps({"AREA": None, "READING": 5}).encode()))
            per_sensor[sensor] += 1
            continue
        if i % 6000 == 1:  # malformed: processing log, counted nowhere
            events.append((sensor.encode(), b"{broken"))
            continue
        events.append((sensor.encode(), json.dumps({"AREA": area, "READING": reading}).encode()))
        per_sensor[sensor] += 1
        if reading >= 0:
            areas[area].append(reading)
            area_sensors[area].add(sensor)
            counted.append((len(events) - 1, area))
    places = await produce(cluster.bootstrap, stream, events)
    # ROWPARTITION and ROWOFFSET behind the repartition: the input records' (carried), not the repartition topic's.
    offset_sums: dict[str, int] = defaultdict(int)
    top_partitions: dict[str, int] = defaultdict(int)
    for event, area in counted:
        partition, offset = places[event]
        offset_sums[area] += offset
        top_partitions[area] = max(top_partitions[area], partition)

    outcome = run(cluster, f"""
        SET 'auto.offset.reset'='earliest';
        CREATE TABLE {by_area} WITH (partitions=3) AS SELECT area, COUNT(*) AS n, SUM(reading) AS total,
          MIN(reading) AS lo, MAX(reading) AS hi, COUNT_DISTINCT(sensor) AS sensors, SUM(ROWOFFSET) AS offsets,
          MAX(ROWPARTITION) AS top_partition
          FROM {stream} WHERE reading >= 0 AND ROWOFFSET >= 0 GROUP BY area;
        CREATE TABLE {by_sensor} WITH (partitions=2) AS SELECT sensor, COUNT(*) AS n FROM {stream} GROUP BY sensor;
        SHOW QUERIES;
    """)
    area_query = next(str(q[0]) for q in outcome if str(q[0]).startswith(f"CTAS_{by_area.upper()}_"))

    want_areas = {a: [a, len(r), sum(r), min(r), max(r), len(area_sensors[a]), offset_sums[a], top_partitions[a]]
                  for a, r in areas.items()}
    got = await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {by_area};", want_areas)
    assert got == want_areas
    want_sensors = {s: [s, n] for s, n in per_sensor.items()}
    got_sensors = await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {by_sensor};", want_sensors)
    assert got_sensors == want_sensors
    # Key lookups are routed by murmur2 over the table's own partition count.
    for area in ("area-00", "area-13", "area-24"):
        assert run(cluster, f"SELECT n FROM {by_area} WHERE area = '{area}';") == [[len(areas[area])]]

    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    await admin.start()
    try:
        assert await topic_partitions(admin, repartition_topic(cluster.service_id, area_query)) == 3
    finally:
        await admin.close()
    # The sink: each key on the partition its murmur2 names, the last value the table's row.
    last: dict[bytes, tuple[int, dict[str, Any]]] = {}
    for partition, _, key, value in await read_all(cluster.bootstrap, by_area.upper()):
        assert key is not None and value is not None and partition == partition_for(key, 3)
        last[key] = (partition, json.loads(value))
    assert {k.decode(): v["N"] for k, (_, v) in last.items()} == {a: len(r) for a, r in areas.items()}

    logged = [json.loads(v) for *_, v in await read_all(cluster.bootstrap, processing_log_topic(cluster.service_id))
              if v is not None]
    mine = [e for e in logged if e["QUERY_ID"] == area_query]
    assert sorted(e["REASON"] for e in mine) == sorted(
        ["the new key (`AREA`) is NULL"] * 20 + ["value is not JSON of the declared columns and types"] * 5)

    # Read-your-writes through the repartition topic: each INSERT's token is carried through
    # the re-keying stage to the table's input, so the pull right after it sees the insert.
    await asyncio.to_thread(reads_own_writes, cluster, [
        (f"INSERT INTO {stream} (sensor, area, reading) VALUES ('s-new', 'area-new', {i});",
         f"SELECT n, total FROM {by_area} WHERE area = 'area-new';", [[i, i * (i + 1) // 2]]) for i in range(1, 6)])

    # TERMINATE: the query's repartition and changelog topics go once no worker runs it, not from
    # under a batch still committing to them (a worker's Spark query then took its whole 30 s
    # bound to stop, and held up the next queries' starts).
    internal = [repartition_topic(cluster.service_id, area_query), changelog_topic(cluster.service_id, area_query)]
    run(cluster, f"TERMINATE {area_query};")
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    await admin.start()
    try:
        async with asyncio.timeout(60):
            while [t for t in internal if await topic_partitions(admin, t) is not None]:  # noqa: ASYNC110 (the broker's)
                await asyncio.sleep(0.2)
    finally:
        await admin.close()
    deleted = [e["ts"] for child in cluster.children if child.name.startswith("coordinator")
               for e in log_entries(child.log) if e.get("msg") == "deleted topics of stopped queries"
               and e.get("queries") == [area_query]]
    stopped = [e["ts"] for child in cluster.children if child.name.startswith("worker")
               for e in log_entries(child.log) if e.get("msg") == "task stopped" and e.get("query") == area_query]
    assert len(deleted) == 1 and stopped and max(stopped) <= deleted[0], (deleted, stopped)


async def test_a_table_projected_from_a_table_is_materialized(cluster: LocalCluster) -> None:
    users = f"tusers_{cluster.service_id}"
    adults = f"adults_{users}"
    run(cluster, f"""
        CREATE TABLE {users} (id VARCHAR PRIMARY KEY, name VARCHAR, age INT)
          WITH (kafka_topic='{users}', partitions=2, value_format='json');
        INSERT INTO {users} (id, name, age) VALUES ('u1', 'ann', 30);
        INSERT INTO {users} (id, name, age) VALUES ('u2', 'bob', 40);
        INSERT INTO {users} (id, name, age) VALUES ('u3', 'cy', 12);
        INSERT INTO {users} (id, name, age) VALUES ('u4', 'di', 22);
        SET 'auto.offset.reset'='earliest';
        CREATE TABLE {adults} AS SELECT id, UCASE(name) AS name, age FROM {users} WHERE age >= 18;
    """)
    first = {"u1": ["u1", "ANN", 30], "u2": ["u2", "BOB", 40], "u4": ["u4", "DI", 22]}
    assert await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {adults};", first) == first

    run(cluster, f"""
        INSERT INTO {users} (id, name, age) VALUES ('u1', 'ann', 10);
        INSERT INTO {users} (id, name, age) VALUES ('u3', 'cy', 18);
        INSERT INTO {users} (id, name, age) VALUES ('u4', 'dee', 23);
    """)
    producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(users, None, key=b"u2", partition=partition_for(b"u2", 2))  # delete u2
    finally:
        await producer.stop()
    final = {"u3": ["u3", "CY", 18], "u4": ["u4", "DEE", 23]}
    assert await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {adults};", final) == final
    assert run(cluster, f"SELECT name FROM {adults} WHERE id = 'u4';") == [["DEE"]]
    assert run(cluster, f"SELECT * FROM {adults} WHERE id = 'u1';") == []

    # The result topic is the table's changelog: its last record per key is the row, or a
    # tombstone for the rows that left it.
    latest: dict[bytes, bytes | None] = {}
    for _, _, key, value in sorted(await read_all(cluster.bootstrap, adults.upper()), key=lambda r: r[1]):
        assert key is not None
        latest[key] = value
    assert latest[b"u1"] is None and latest[b"u2"] is None
    assert json.loads(latest[b"u4"] or b"{}") == {"NAME": "DEE", "AGE": 23}

    # Read-your-writes through the projection's stage: an update, then a row leaving the table.
    await asyncio.to_thread(reads_own_writes, cluster, [
        (f"INSERT INTO {users} (id, name, age) VALUES ('u5', 'ed', {age});", f"SELECT * FROM {adults} WHERE id = 'u5';",
         [["u5", "ED", age]] if age >= 18 else []) for age in (20, 21, 5, 30)])


async def test_group_by_several_columns_keys_the_table_by_all_of_them(cluster: LocalCluster) -> None:
    """GROUP BY two expressions: a table keyed by both (KEY_FORMAT JSON, as ksqlDB's), exact
    against counts computed here, its keys on the partitions murmur2 of their JSON names,
    looked up by both columns, scanned by one, pushed as it changes, and windowed too."""
    stream = f"mk_{cluster.service_id}"
    per_page, per_minute = f"per_page_{stream}", f"per_minute_{stream}"
    run(cluster, f"CREATE STREAM {stream} (userid VARCHAR KEY, page VARCHAR, region VARCHAR, ms INT, ts BIGINT) "
                 f"WITH (kafka_topic='{stream}', partitions={PARTITIONS}, value_format='json', timestamp='ts');")
    run(cluster, f"""
        SET 'auto.offset.reset'='earliest';
        CREATE TABLE {per_page} WITH (partitions=3) AS SELECT page, UCASE(region) AS region, COUNT(*) AS n,
          SUM(ms) AS total FROM {stream} GROUP BY page, UCASE(region);
        CREATE TABLE {per_minute} AS SELECT region, page, COUNT(*) AS n FROM {stream}
          WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY region, page HAVING COUNT(*) > 1;
    """)
    client = RouterClient(cluster.router)
    changes: list[list[object]] = []
    reader = collect(client.stream(f"SELECT * FROM {per_page} EMIT CHANGES;"), changes)

    rng = random.Random(11)
    counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    windows: dict[tuple[str, str, int], int] = defaultdict(int)
    events: list[tuple[bytes | None, bytes]] = []
    for i in range(6_000):
        user, page, region = f"u{rng.randrange(50)}", f"/p{rng.randrange(12)}", rng.choice(["eu", "us", "Eu", "apac"])
        ms, ts = rng.randrange(1, 500), 1_700_000_000_000 + rng.randrange(5 * 60_000)
        if i % 1000 == 7:  # a NULL grouping column: the processing log, counted nowhere
            events.append((user.encode(), json.dumps({"PAGE": page, "REGION": None, "MS": ms, "TS": ts}).encode()))
            continue
        events.append((user.encode(), json.dumps({"PAGE": page, "REGION": region, "MS": ms, "TS": ts}).encode()))
        counts[(page, region.upper())][0] += 1
        counts[(page, region.upper())][1] += ms
        windows[(region, page, ts - ts % 60_000)] += 1
    await produce(cluster.bootstrap, stream, events)

    def by_key(row: list[Any]) -> Any:
        return tuple(row[:2])

    want = {k: [*k, n, total] for k, (n, total) in counts.items()}
    assert await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {per_page};", want, key=by_key) == want
    # A lookup names both key columns; one of them alone scans the table.
    for page, region in [("/p0", "EU"), ("/p7", "APAC"), ("/p11", "US")]:
        assert run(cluster, f"SELECT n, total FROM {per_page} WHERE region = '{region}' AND page = '{page}';") \
            == [counts[(page, region)]]
    assert run(cluster, f"SELECT * FROM {per_page} WHERE page = '/p0' AND region = 'nowhere';") == []
    assert sorted(run(cluster, f"SELECT region, n FROM {per_page} WHERE page = '/p3';")) == sorted(
        [r, n] for (p, r), (n, _) in counts.items() if p == "/p3")
    want_windows = {k: [k[0], k[1], k[2], k[2] + 60_000, n] for k, n in windows.items() if n > 1}
    got = await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {per_minute};", want_windows,
                                  key=lambda row: tuple(row[:3]))
    assert got == want_windows
    region, page, start = next(iter(want_windows))
    assert run(cluster, f"SELECT n FROM {per_minute} WHERE page = '{page}' AND region = '{region}' "
                        f"AND WINDOWSTART = {start};") == [[windows[(region, page, start)]]]

    # The sink: a JSON object of both columns per key, on the partition murmur2 of those bytes names.
    last: dict[tuple[str, str], int] = {}
    for partition, _, key, value in await read_all(cluster.bootstrap, per_page.upper()):
        assert key is not None and value is not None and partition == partition_for(key, 3)
        fields = json.loads(key)
        assert list(fields) == ["PAGE", "REGION"] and key == json.dumps(fields, separators=(",", ":")).encode()
        last[(fields["PAGE"], fields["REGION"])] = json.loads(value)["N"]
    assert last == {k: n for k, (n, _) in counts.items()}
    # The push query saw each key's count climb to its final value.
    wait_for("the last change pushed", lambda: {(str(r[0]), str(r[1])): r[2] for r in changes} == last, 60)
    client.close()
    reader.join(10)

    logged = [json.loads(v) for *_, v in await read_all(cluster.bootstrap, processing_log_topic(cluster.service_id))
              if v is not None]
    reasons = [e["REASON"] for e in logged if e["QUERY_ID"].startswith(f"CTAS_{per_page.upper()}_")]
    assert len(reasons) == 6 and all(r.startswith("the new key (IF(") and r.endswith(") is NULL") for r in reasons)


async def test_expressions_of_int_bigint_and_double_keys_read_the_key_values(cluster: LocalCluster) -> None:
    """KAFKA-format keys of every numeric type (Java's big-endian serializers) decode in
    Spark to their values: a WHERE, a GROUP BY expression and an aggregate over the key
    column compute with the number, not the key's bytes."""
    name = f"nk_{cluster.service_id}"
    run(cluster, f"""
        CREATE STREAM {name}_i (id INT KEY, amount INT) WITH (kafka_topic='{name}_i', partitions={PARTITIONS}, value_format='json');
        CREATE STREAM {name}_b (id BIGINT KEY, amount INT) WITH (kafka_topic='{name}_b', partitions={PARTITIONS}, value_format='json');
        CREATE STREAM {name}_d (price DOUBLE KEY, qty INT) WITH (kafka_topic='{name}_d', partitions={PARTITIONS}, value_format='json');
        SET 'auto.offset.reset'='earliest';
        CREATE TABLE {name}_ib AS SELECT id % 10 AS bucket, COUNT(*) AS n, SUM(id) AS total FROM {name}_i
          WHERE id > -50 GROUP BY id % 10;
        CREATE TABLE {name}_bb AS SELECT amount, MAX(id) AS top, MIN(id) AS low FROM {name}_b GROUP BY amount;
        CREATE STREAM {name}_cheap AS SELECT price, price * 2 AS twice, qty FROM {name}_d WHERE price < 10.5;
        CREATE TABLE {name}_ik AS SELECT id, amount * 1.5 AS scaled, COUNT(*) AS n FROM {name}_i GROUP BY id, amount * 1.5;
        CREATE TABLE {name}_names (k INT PRIMARY KEY, label VARCHAR)
          WITH (kafka_topic='{name}_names', partitions={PARTITIONS}, value_format='json');
        CREATE STREAM {name}_next AS SELECT t.k AS k, s.id AS id, t.label AS label FROM {name}_i s
          JOIN {name}_names t ON s.id + 1 = t.k;
    """)
    rng = random.Random(5)
    ints = [rng.randrange(-2**31, 2**31) if i % 7 == 0 else rng.randrange(-100, 100) for i in range(2_000)]
    bigs = [rng.randrange(-2**63, 2**63) for _ in range(2_000)]
    prices = [rng.choice([-0.5, 0.1, 3.25, 10.5, 11.0, 1e300, -1e-300]) for _ in range(500)]
    # The table first: the join sees every label (records of the stream before a key's row would not).
    await produce(cluster.bootstrap, f"{name}_names", [(serialize_key(k, SqlType("INT")),
                                                        json.dumps({"LABEL": f"n{k}"}).encode()) for k in range(-99, 101)])
    await asyncio.to_thread(pull_until, cluster, f"SELECT k FROM {name}_names;", {k: [k] for k in range(-99, 101)})
    await produce(cluster.bootstrap, f"{name}_i", [(serialize_key(v, SqlType("INT")), json.dumps({"AMOUNT": 1}).encode())
                                                   for v in ints])
    await produce(cluster.bootstrap, f"{name}_b", [(serialize_key(v, SqlType("BIGINT")),
                                                    json.dumps({"AMOUNT": i % 5}).encode()) for i, v in enumerate(bigs)])
    await produce(cluster.bootstrap, f"{name}_d", [(serialize_key(p, SqlType("DOUBLE")), json.dumps({"QTY": i}).encode())
                                                   for i, p in enumerate(prices)])

    buckets: dict[int, list[int]] = defaultdict(list)
    for v in ints:
        if v > -50:
            buckets[int(math.fmod(v, 10))].append(v)  # Spark's % keeps the dividend's sign, as Java's
    want = {b: [b, len(vs), sum(vs)] for b, vs in buckets.items()}
    assert await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {name}_ib;", want) == want
    by_amount: dict[int, list[int]] = defaultdict(list)
    for i, v in enumerate(bigs):
        by_amount[i % 5].append(v)
    # A key of the INT key column and a DECIMAL expression (a JSON key): looked up by both.
    counts = {v: ints.count(v) for v in ints}
    want_pairs = {v: [v, 1.5, n] for v, n in counts.items()}
    assert await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {name}_ik;", want_pairs) == want_pairs
    for v in ints[:5]:
        assert run(cluster, f"SELECT n FROM {name}_ik WHERE id = {v} AND scaled = 1.5;") == [[counts[v]]]
    # A join on an expression of the INT key: each record re-keyed by its value plus one.
    joined = sorted((v + 1, v, f"n{v + 1}") for v in ints if -99 <= v + 1 <= 100)
    found: list[tuple[int, int, str]] = []
    for _ in range(240):
        found = sorted((deserialize_key(k, SqlType("INT")), json.loads(v)["ID"], json.loads(v)["LABEL"])  # type: ignore[arg-type]
                       for _, _, k, v in await read_all(cluster.bootstrap, f"{name}_next".upper()))
        if len(found) >= len(joined):
            break
        await asyncio.sleep(0.5)
    assert found == joined
    want_bigs = {a: [a, max(vs), min(vs)] for a, vs in by_amount.items()}
    assert await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {name}_bb;", want_bigs) == want_bigs
    deadline = asyncio.get_running_loop().time() + 120
    cheap = [p for p in prices if p < 10.5]
    while True:
        records = await read_all(cluster.bootstrap, f"{name}_cheap".upper())
        if len(records) >= len(cheap) or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.5)
    got = sorted((deserialize_key(key, SqlType("DOUBLE")), json.loads(value)["TWICE"])  # type: ignore[arg-type]
                 for _, _, key, value in records)
    assert got == sorted((p, p * 2) for p in cheap)


async def test_sources_declared_with_a_key_of_several_columns(cluster: LocalCluster) -> None:
    """A stream and a table declared with two KEY columns (KEY_FORMAT JSON, written by a
    producer outside Millpond, spaces and field order its own): filtered, re-ordered and
    aggregated by persistent queries, the table materialized and looked up by both columns."""
    name = f"dk_{cluster.service_id}"
    run(cluster, f"""
        CREATE STREAM {name}_s (region VARCHAR KEY, shop INT KEY, amount INT)
          WITH (kafka_topic='{name}_s', partitions={PARTITIONS}, value_format='json');
        CREATE TABLE {name}_t (region VARCHAR PRIMARY KEY, shop INT PRIMARY KEY, owner VARCHAR)
          WITH (kafka_topic='{name}_t', partitions={PARTITIONS}, value_format='json', key_format='json');
        SET 'auto.offset.reset'='earliest';
        CREATE STREAM {name}_big AS SELECT region, shop, amount * 2 AS twice FROM {name}_s WHERE amount > 50;
        CREATE STREAM {name}_flip AS SELECT shop, region, amount FROM {name}_s;
        CREATE TABLE {name}_per_region AS SELECT region, COUNT(*) AS n, SUM(amount) AS total FROM {name}_s
          GROUP BY region;
        CREATE TABLE {name}_owned AS SELECT region, shop, owner FROM {name}_t WHERE owner != 'nobody';
    """)
    rng = random.Random(3)
    sales = [(rng.choice(["eu", "us"]), rng.randrange(20), rng.randrange(100)) for _ in range(1_000)]
    # Outside producers' JSON: the fields in either order, with or without spaces.
    texts = [json.dumps({"SHOP": s, "REGION": r}) if i % 2 else json.dumps({"REGION": r, "SHOP": s}, separators=(",", ":"))
             for i, (r, s, _) in enumerate(sales)]
    await produce(cluster.bootstrap, f"{name}_s", [(t.encode(), json.dumps({"AMOUNT": a}).encode())
                                                   for t, (_, _, a) in zip(texts, sales, strict=True)])
    # The table's keys as ksqlDB writes them (compact, in column order; one record's not: a
    # lookup routes by murmur2 of the canonical bytes, so only a scan is sure to find it).
    owners = {("eu", s): f"o{s}" for s in range(10)} | {("us", 3): "nobody", ("us", 4): "o4", ("us", 9): "odd"}
    await produce(cluster.bootstrap, f"{name}_t", [
        (json.dumps({"SHOP": s, "REGION": r}).encode() if s == 9 else
         json.dumps({"REGION": r, "SHOP": s}, separators=(",", ":")).encode(), json.dumps({"OWNER": o}).encode())
        for (r, s), o in owners.items()] + [(b"not json", b'{"OWNER": "x"}')])

    totals: dict[str, list[int]] = defaultdict(list)
    for region, _, amount in sales:
        totals[region].append(amount)
    want = {r: [r, len(a), sum(a)] for r, a in totals.items()}
    assert await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {name}_per_region;", want) == want
    want_owned = {k: [*k, o] for k, o in owners.items() if o != "nobody"}
    got = await asyncio.to_thread(pull_until, cluster, f"SELECT * FROM {name}_owned;", want_owned,
                                  key=lambda row: tuple(row[:2]))
    assert got == want_owned
    # Keys are stored as Millpond writes them (the odd one's too): one lookup finds each.
    assert run(cluster, f"SELECT owner FROM {name}_t WHERE shop = 4 AND region = 'us';") == [["o4"]]
    assert run(cluster, f"SELECT owner FROM {name}_owned WHERE region = 'eu' AND shop = 7;") == [["o7"]]
    assert run(cluster, f"SELECT shop FROM {name}_t WHERE region = 'us' AND owner = 'odd';") == [[9]]
    logged = [json.loads(v) for *_, v in await read_all(cluster.bootstrap, processing_log_topic(cluster.service_id))
              if v is not None]
    assert [e["REASON"][:40] for e in logged if e["QUERY_ID"].startswith(f"CST_{name.upper()}_T_")] == [
        "key is not a JSON object of REGION, SHOP"]

    async def records(topic: str, count: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
        deadline = asyncio.get_running_loop().time() + 120
        while True:
            found = await read_all(cluster.bootstrap, topic)
            if len(found) >= count or asyncio.get_running_loop().time() > deadline:
                return found
            await asyncio.sleep(0.5)

    big = [(r, s, a * 2) for r, s, a in sales if a > 50]
    got_big = [(json.loads(k), json.loads(v)["TWICE"]) for _, _, k, v in await records(f"{name}_big".upper(), len(big))
               if k is not None and v is not None]
    assert sorted((k["REGION"], k["SHOP"], t) for k, t in got_big) == sorted(big)
    # Selected in another order, the key is written in that order, on murmur2 of its bytes.
    flipped = await records(f"{name}_flip".upper(), len(sales))
    assert sorted((json.loads(k)["REGION"], json.loads(k)["SHOP"], json.loads(v)["AMOUNT"])  # type: ignore[arg-type]
                  for _, _, k, v in flipped) == sorted(sales)
    for partition, _, key, _ in flipped:
        assert key is not None and list(json.loads(key)) == ["SHOP", "REGION"]
        assert partition == partition_for(key, PARTITIONS) and b" " not in key
