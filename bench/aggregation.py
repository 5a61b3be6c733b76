"""Aggregation throughput: the readings AVG-by-sensor query over 8 partitions, events per
second from the query's start to the table caught up with every input record, against
Kafka's own consumer performance tool, a plain aiokafka consumer reading the same topic and
the same aggregation as a Kafka Streams application (exactly_once_v2, RocksDB, as many
stream threads as the cluster's Spark cores) in the same run; peak memory of every service
while Millpond's query runs. Then, over the same topic, the same AVG per sensor per 1-minute
tumbling window (by record timestamp): its events per second, its ratio to the plain GROUP
BY of the same run and to the Kafka Streams baseline doing the same window (a window store,
ksqlDB's default grace and retention). Last, the same readings enriched by a stream-table
LEFT JOIN with a table of ``--table-rows`` sensors (every reading's sensor among them, the
table's rows older than the readings): its events per second beside the plain GROUP BY.
Then a table-table LEFT JOIN of that table with a second one of as many rows (records of
both tables per second, to the result written), a foreign-key LEFT JOIN of that table with
the 97 sites its SITE column names (records per second, to the result written), and the
readings INNER JOINed with a stream
of alerts (a tenth as many, stamped across the readings' time) WITHIN 10 ms (records of both
streams per second, to the last result written): each through its side stages, joined topic
and join stage. Last, a GROUP BY over the sensors table (a table aggregation: COUNT per SITE,
each row regrouped, then counted): rows per second to the result, then as many updates moving
every sensor to another site (each a retraction and an addition) per second, and whether the
result then equals the table's counts.

``python -m bench.aggregation [--events 2000000 --keys 1000 --workers 2 --pin --table-rows 100000]``
(``--pin`` gives worker i core i; ``bench.scaling`` compares 1 and 2 pinned workers).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.baselines.kafka_streams import run_kafka_streams
from bench.common import (
    PeakMemory,
    arguments,
    cluster,
    create_average,
    create_readings,
    emit,
    execute,
    kafka_perf_consumer,
    key_name,
    produce_readings,
    ratio,
    raw_consumer_rate,
    spark_cores,
    wait_caught_up,
)
from millpond.deploy.local.launcher import LocalCluster
from millpond.shared.catalog.names import consumer_group, joined_topic, repartition_topic
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.admin import committed_offsets, end_offsets
from millpond.shared.kafka.connection import KafkaConnection
from millpond.shared.kafka.partitioner import partition_for

PARTITIONS = 8
WINDOW_MS = 60_000
WINDOWED = ("CREATE TABLE avg_per_minute AS SELECT sensor, AVG(reading) AS avg_reading FROM readings "
            "WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY sensor;")


JOINED = ("CREATE STREAM enriched AS SELECT r.sensor, r.reading, s.site FROM readings r "
          "LEFT JOIN sensors s ON r.sensor = s.id;")
TABLE_JOINED = ("CREATE TABLE sensor_owners AS SELECT s.id, s.site, o.owner FROM sensors s "
                "LEFT JOIN owners o ON s.id = o.id;")
# A foreign-key join: each sensor with its site's row (97 sites, each named by ~1/97 of the sensors).
FK_JOINED = ("CREATE TABLE sensor_sites AS SELECT s.id, s.site, p.city FROM sensors s "
             "LEFT JOIN sites p ON s.site = p.id;")
SITES = 97
TABLE_AGGREGATED = "CREATE TABLE sensors_per_site AS SELECT site, COUNT(*) AS sensors FROM sensors GROUP BY site;"
# A sensor's readings come about every 10 ms of the readings' time and its alerts every
# 100 ms: a window of 10 ms joins about one reading in five. The grace covers the whole run,
# so the order the two sides are copied in drops nothing as late.
STREAM_JOINED = ("CREATE STREAM reading_alerts AS SELECT r.sensor, r.reading, a.reading AS alert FROM readings r "
                 "JOIN alerts a WITHIN 10 MILLISECONDS GRACE PERIOD 10 MINUTES ON r.sensor = a.sensor;")


async def produce_sensors(bootstrap: str, rows: int, timestamp_ms: int | None, topic: str = "sensors",
                          column: str = "SITE", every: int = 1, shift: int = 0, partitions: int = PARTITIONS) -> None:
    """A table's rows (each sensor's ``column``: ``<column>-<(k + shift) % 97>``), for every
    ``every``-th sensor, stamped ``timestamp_ms`` (None: now), in a topic of ``partitions``."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=512 * 1024, acks=1)
    await producer.start()
    try:
        pending = []
        for k in range(0, rows, every):
            name = key_name(k).encode()
            pending.append(await producer.send(topic, json.dumps({column: f"{column.lower()}-{(k + shift) % 97}"}).encode(),
                                               key=name, partition=partition_for(name, partitions),
                                               timestamp_ms=timestamp_ms))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def produce_sites(bootstrap: str, timestamp_ms: int) -> None:
    """The ``SITES`` rows the sensors' SITE column names (``site-<n>``), each with its CITY."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, acks=1)
    await producer.start()
    try:
        pending = []
        for n in range(SITES):
            name = f"site-{n}".encode()
            pending.append(await producer.send("sites", json.dumps({"CITY": f"city-{n % 7}"}).encode(), key=name,
                                               partition=partition_for(name, PARTITIONS), timestamp_ms=timestamp_ms))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def produce_alerts(bootstrap: str, count: int, keys: int, span: tuple[int, int]) -> None:
    """``count`` alerts (readings' columns) of random sensors, stamped evenly across ``span``
    (the readings' own time), so each finds readings within a minute of it."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=512 * 1024, acks=1)
    await producer.start()
    try:
        pending = []
        for i in range(count):
            name = key_name((i * 7919) % keys).encode()
            pending.append(await producer.send(
                "alerts", json.dumps({"AREA": "alert", "READING": i % 100}).encode(), key=name,
                partition=partition_for(name, PARTITIONS),
                timestamp_ms=span[0] + (span[1] - span[0]) * i // max(count, 1)))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def timed_join(local: LocalCluster, statement: str, inputs: tuple[str, ...], sink: str | None = None) -> float:
    """Seconds from ``statement`` (a two-topic join over ``inputs``, as they are now) to its
    last result written: through its joined topic, then (a table join's) ``sink``."""
    ends = {t: asyncio.run(end_offsets(local.bootstrap, t, PARTITIONS, "read_committed")) for t in inputs}
    started = time.monotonic()
    (outcome,) = execute(local, statement)
    query = str(outcome.message).rsplit(" ", 1)[-1]
    downstream = [joined_topic(local.service_id, query), *([sink] if sink else [])]
    return wait_joined(local, query, ends, downstream) - started


def wait_joined(local: LocalCluster, query_id: str, inputs: dict[str, dict[int, int]],
                downstream: list[str], timeout_s: float = 1800) -> float:
    """Block until a two-topic join's side stages committed every input record (``inputs``:
    topic -> ends), then until each of ``downstream``'s topics (the joined topic, then a table
    join's sink) was read by its stage to its end as of when the stage before finished; the
    time it happened. Progress is the query's consumer group's committed offsets."""
    group = consumer_group(local.service_id, query_id)
    deadline = time.monotonic() + timeout_s

    def reached(targets: dict[str, dict[int, int]]) -> None:
        tps = [TopicPartition(t, p) for t, ends in targets.items() for p in ends]
        while time.monotonic() < deadline:
            done = asyncio.run(committed_offsets(KafkaConnection(local.bootstrap), group, tps))
            if all(done.get(tp, -1) >= targets[tp.topic][tp.partition] for tp in tps):
                return
            time.sleep(0.2)
        raise SystemExit(f"query {query_id} did not read {sorted(targets)} within {timeout_s} s")

    reached(inputs)
    for topic in downstream:
        # Written by transactions: markers (several, where two sides' transactions interleave)
        # follow the last record, and a committed input position stops short of them.
        reached({topic: asyncio.run(after_last_records(local.bootstrap, topic))})
    return time.monotonic()


async def after_last_records(bootstrap: str, topic: str) -> dict[int, int]:
    """Per partition holding records, the offset after its last committed record."""
    ends = await end_offsets(bootstrap, topic, PARTITIONS, "read_committed")
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        out: dict[int, int] = {}
        for partition, end in ends.items():
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, max(end - 1_000, 0))  # far more than the markers that can trail
            while await consumer.position(tp) < end:
                for record in (await consumer.getmany(tp, timeout_ms=1_000)).get(tp, []):
                    out[partition] = record.offset + 1
        return out
    finally:
        await consumer.stop()


def measure(events: int, keys: int, workers: int, pin: bool, max_offsets_per_trigger: int,
            table_rows: int = 100_000) -> dict[str, Any]:
    """One aggregation run on a fresh cluster."""
    cpus = [{i} for i in range(workers)] if pin else []
    worker_env: dict[str, str] = {}
    if max_offsets_per_trigger:
        worker_env["MILLPOND_MAX_OFFSETS_PER_TRIGGER"] = str(max_offsets_per_trigger)
    with cluster(workers=workers, worker_cpus=cpus, worker_env=worker_env) as local:
        # A small query first, so every worker's Spark session is up before the clock starts.
        create_readings(local, "warmup", PARTITIONS)
        asyncio.run(produce_readings(local.bootstrap, "warmup", 100, 100, PARTITIONS))
        warm_ends = asyncio.run(end_offsets(local.bootstrap, "warmup", PARTITIONS))
        wait_caught_up(local, create_average(local, "warmup", "warmup_avg"), warm_ends)
        create_readings(local, "readings", PARTITIONS)
        # The table's rows are older than every reading, so each reading joins its sensor's row.
        table_time = int(time.time() * 1000) - 3_600_000
        first_ms = int(time.time() * 1000)
        produced = asyncio.run(produce_readings(local.bootstrap, "readings", events, keys, PARTITIONS))
        span = (first_ms, int(time.time() * 1000))
        ends = asyncio.run(end_offsets(local.bootstrap, "readings", PARTITIONS))
        perf = kafka_perf_consumer(local.bootstrap, "readings", events)
        raw = asyncio.run(raw_consumer_rate(local.bootstrap, "readings", PARTITIONS))
        kstreams = kafka_streams(local, events)
        kstreams_windowed = kafka_streams(local, events, WINDOW_MS)
        with PeakMemory(local) as memory:
            started = time.monotonic()
            query_id = create_average(local, "readings", "avg_readings")
            finished = wait_caught_up(local, query_id, ends)
        seconds = finished - started
        started = time.monotonic()
        (outcome,) = execute(local, WINDOWED)
        windowed_seconds = wait_caught_up(local, str(outcome.message).rsplit(" ", 1)[-1], ends) - started
        execute(local, f"CREATE TABLE sensors (id VARCHAR PRIMARY KEY, site VARCHAR) "
                       f"WITH (kafka_topic='sensors', partitions={PARTITIONS}, value_format='json');")
        asyncio.run(produce_sensors(local.bootstrap, table_rows, table_time))
        started = time.monotonic()
        (outcome,) = execute(local, JOINED)
        join_seconds = wait_caught_up(local, str(outcome.message).rsplit(" ", 1)[-1], ends) - started
        # A table-table join of the sensors with as many owners.
        execute(local, f"CREATE TABLE owners (id VARCHAR PRIMARY KEY, owner VARCHAR) "
                       f"WITH (kafka_topic='owners', partitions={PARTITIONS}, value_format='json');")
        asyncio.run(produce_sensors(local.bootstrap, table_rows, table_time, "owners", "OWNER"))
        table_join_seconds = timed_join(local, TABLE_JOINED, ("sensors", "owners"), "SENSOR_OWNERS")
        # A foreign-key join of the sensors with their sites (every site row goes to every join task).
        execute(local, f"CREATE TABLE sites (id VARCHAR PRIMARY KEY, city VARCHAR) "
                       f"WITH (kafka_topic='sites', partitions={PARTITIONS}, value_format='json');")
        asyncio.run(produce_sites(local.bootstrap, table_time))
        fk_join_seconds = timed_join(local, FK_JOINED, ("sensors", "sites"), "SENSOR_SITES")
        # The readings joined with alerts, a tenth as many, over the same span of time.
        create_readings(local, "alerts", PARTITIONS)
        alerts = events // 10
        asyncio.run(produce_alerts(local.bootstrap, alerts, keys, span))
        stream_join_seconds = timed_join(local, STREAM_JOINED, ("readings", "alerts"))
        table_aggregation = timed_table_aggregation(local, table_rows)
    rate = events / seconds
    windowed_rate = events / windowed_seconds
    join_rate = events / join_seconds
    return {
        "events": events, "keys": keys, "partitions": PARTITIONS, "workers": workers, "pinned": pin,
        "seconds_to_caught_up": round(seconds, 2), "events_per_s": round(rate, 1),
        "produce_events_per_s": round(produced, 1),
        "baseline_kafka_perf_consumer": perf, "baseline_aiokafka_consumer": raw,
        "ratio_to_kafka_perf_consumer": ratio(rate, perf.get("records_per_s")),
        "ratio_to_aiokafka_consumer": ratio(rate, raw["records_per_s"]),
        "baseline_kafka_streams": kstreams,
        "ratio_to_kafka_streams": ratio(rate, kstreams.get("records_per_s")),
        "peak_rss_mib": memory.peaks,
        "windowed_seconds_to_caught_up": round(windowed_seconds, 2), "windowed_events_per_s": round(windowed_rate, 1),
        "windowed_ratio_to_group_by": ratio(windowed_rate, rate),
        "baseline_kafka_streams_windowed": kstreams_windowed,
        "windowed_ratio_to_kafka_streams": ratio(windowed_rate, kstreams_windowed.get("records_per_s")),
        "windowed_ratio_to_kafka_streams_group_by": ratio(windowed_rate, kstreams.get("records_per_s")),
        "join_table_rows": table_rows, "join_seconds_to_caught_up": round(join_seconds, 2),
        "join_events_per_s": round(join_rate, 1), "join_ratio_to_group_by": ratio(join_rate, rate),
        "table_join_rows": 2 * table_rows, "table_join_seconds_to_result": round(table_join_seconds, 2),
        "table_join_rows_per_s": round(2 * table_rows / table_join_seconds, 1),
        "fk_join_rows": table_rows + SITES, "fk_join_seconds_to_result": round(fk_join_seconds, 2),
        "fk_join_rows_per_s": round((table_rows + SITES) / fk_join_seconds, 1),
        "stream_join_records": events + alerts, "stream_join_seconds_to_result": round(stream_join_seconds, 2),
        "stream_join_records_per_s": round((events + alerts) / stream_join_seconds, 1),
        "stream_join_ratio_to_group_by": ratio((events + alerts) / stream_join_seconds, rate),
        **table_aggregation,
    }


def timed_table_aggregation(local: LocalCluster, rows: int) -> dict[str, Any]:
    """``TABLE_AGGREGATED`` over the sensors table as it is (``rows`` rows): seconds to its result,
    then to the result after each sensor moved to the next site, and whether it is exact then."""
    ends = asyncio.run(end_offsets(local.bootstrap, "sensors", PARTITIONS, "read_committed"))
    started = time.monotonic()
    (outcome,) = execute(local, TABLE_AGGREGATED)
    query = str(outcome.message).rsplit(" ", 1)[-1]
    regrouped = [repartition_topic(local.service_id, query)]
    first = wait_joined(local, query, {"sensors": ends}, regrouped) - started
    asyncio.run(produce_sensors(local.bootstrap, rows, None, shift=1))
    ends = asyncio.run(end_offsets(local.bootstrap, "sensors", PARTITIONS, "read_committed"))
    started = time.monotonic()
    updated = wait_joined(local, query, {"sensors": ends}, regrouped) - started
    want = {f"site-{n}": sum(1 for k in range(rows) if (k + 1) % SITES == n) for n in range(SITES)}
    got = {str(row[0]): row[1] for row in execute(local, "SELECT * FROM sensors_per_site;")[0].rows}
    return {"table_aggregation_rows": rows, "table_aggregation_seconds_to_result": round(first, 2),
            "table_aggregation_rows_per_s": round(rows / first, 1),
            "table_aggregation_updates": rows, "table_aggregation_update_seconds": round(updated, 2),
            "table_aggregation_updates_per_s": round(rows / updated, 1),
            "table_aggregation_exact": got == want}


def kafka_streams(local: LocalCluster, events: int, window_ms: int = 0) -> dict[str, Any]:
    """The Kafka Streams baseline over ``readings`` with one stream thread per Spark core of
    the cluster (per tumbling window of ``window_ms`` when positive); its error instead when
    it failed (Millpond's figure still counts)."""
    output = f"readings_kstreams_avg_{window_ms}" if window_ms else "readings_kstreams_avg"
    try:
        return run_kafka_streams(local.bootstrap, "readings", events, spark_cores(local), output, window_ms)
    except MillpondError as error:
        return {"error": error.message}


def main() -> None:
    args = arguments(__doc__, events=2_000_000, keys=1000, workers=2, pin=0, max_offsets_per_trigger=200_000,
                     table_rows=100_000)
    if args.smoke:
        args.events, args.keys, args.workers, args.table_rows = 20_000, 100, 1, 1_000
    emit({"benchmark": "aggregation", "smoke": args.smoke,
          **measure(args.events, args.keys, args.workers, bool(args.pin), args.max_offsets_per_trigger,
                    args.table_rows)})


if __name__ == "__main__":
    main()
