"""Freshness: time from an INSERT to its effect being visible in a pull query, p50 and
p99, while a steady 10,000 events per second flow into the same stream; against the raw
Kafka produce-to-consume latency of a record on the same broker in the same run.

Each probe INSERTs a reading for its own key through the router, then pulls that key. The
headline (``insert_to_visible_ms``) is read-your-writes as a client has it: one pull carrying
the INSERT's consistency token, which the router answers once a copy has processed the
INSERT. A second series (``polled_without_token_ms``, its probes taking turns with the
first's) pulls without the token every 5 ms until the table has the row: when the row is
there, whoever asks. A third (``scan_with_token_ms``) makes its one pull with the token a
scan (``WHERE sensor = '<key>' OR sensor = 'none'``), which asks every partition's copy,
the INSERT's waiting for it as a key lookup's does. The probes start once the query has
caught up with the load; ``after_first_30_s`` gives the token series' figures over the
probes that started 30 s or more after the first (a cluster's JVMs, the broker's included,
are still compiling their code in those seconds).

``python -m bench.freshness [--events-per-s 10000 --probes 300]``
"""

from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
from typing import Any

import grpc
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.common import arguments, cluster, create_average, create_readings, emit, ratio, wait_caught_up
from millpond.cli import loadtest
from millpond.cli.client import RouterClient
from millpond.shared.kafka.admin import end_offsets

PARTITIONS = 4


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(int(len(ordered) * p), len(ordered) - 1)], 2)


async def kafka_latency(bootstrap: str, probes: int) -> list[float]:
    """Milliseconds from send to receipt of a record by a tailing consumer, one at a time."""
    topic = "readings"
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=10, enable_auto_commit=False)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks=1)
    await consumer.start()
    await producer.start()
    try:
        tp = TopicPartition(topic, PARTITIONS - 1)
        consumer.assign([tp])
        await consumer.seek_to_end(tp)
        await consumer.position(tp)
        out = []
        for i in range(probes):
            marker = f"probe-{i}".encode()
            sent = time.perf_counter()
            await producer.send_and_wait(topic, b'{"AREA": "x", "READING": 1}', key=marker, partition=tp.partition)
            found = False
            while not found:
                batches = await consumer.getmany(tp, timeout_ms=1000)
                found = any(r.key == marker for r in batches.get(tp, []))
            out.append((time.perf_counter() - sent) * 1000)
        return out
    finally:
        await producer.stop()
        await consumer.stop()


KINDS = ("token", "polled", "scan")
"""The probes' pulls, taking turns: a key lookup with the INSERT's token, key lookups
without a token until the row is there, a scan with the token."""


def probe(router: str, probes: int, rng: random.Random) -> dict[str, tuple[list[float], list[float], list[float]]]:
    """By kind of pull (``KINDS``): per probe, milliseconds from the INSERT's call to its row
    in a pull's answer, and to the INSERT's own answer (the part of the first spent before any
    query could see it), and when it started (seconds after the first). The kinds take turns,
    so all see the same cluster."""
    client = RouterClient(router, timeout=30)
    out: dict[str, tuple[list[float], list[float], list[float]]] = {kind: ([], [], []) for kind in KINDS}
    first = time.perf_counter()
    try:
        for i in range(len(KINDS) * probes):
            kind = KINDS[i % len(KINDS)]
            visible, inserted, starts = out[kind]
            key = f"fresh-{i:05d}"
            reading = rng.randrange(1, 100)
            started = time.perf_counter()
            starts.append(started - first)
            client.token = ""  # the token of this probe's INSERT alone
            client.execute(f"INSERT INTO readings (sensor, area, reading) VALUES ('{key}', 'probe', {reading});")
            inserted.append((time.perf_counter() - started) * 1000)
            if kind == "polled":
                poll(client, key)
            else:
                where = f"sensor = '{key}'" + (" OR sensor = 'none'" if kind == "scan" else "")
                (outcome,) = client.execute(f"SELECT avg_reading FROM avg_readings WHERE {where};")
                if not outcome.rows:
                    raise AssertionError(f"a pull ({kind}) with the token of {key}'s INSERT did not see it")
            visible.append((time.perf_counter() - started) * 1000)
            time.sleep(0.05)
    finally:
        client.close()
    return out


def poll(client: RouterClient, key: str) -> None:
    """Pull ``key`` without a token every 5 ms until the table has its row."""
    while True:
        client.token = ""
        try:
            (outcome,) = client.execute(f"SELECT avg_reading FROM avg_readings WHERE sensor = '{key}';")
            if outcome.rows:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.005)


def main() -> None:
    args = arguments(__doc__, events_per_s=10_000.0, probes=300, keys=1000)
    partitions = PARTITIONS
    if args.smoke:
        args.events_per_s, args.probes, args.keys = 500.0, 3, 50
    with cluster(workers=1 if args.smoke else 2) as local:
        create_readings(local, "readings", partitions)
        query_id = create_average(local, "readings", "avg_readings")
        config = loadtest.Config(server=local.router, kafka=local.bootstrap, stream="readings", keys=args.keys,
                                 partitions=partitions, events_per_s=args.events_per_s)
        stats, stop = loadtest.Stats(), asyncio.Event()
        loop = asyncio.new_event_loop()
        background = threading.Thread(target=loop.run_until_complete, daemon=True,
                                      args=(loadtest.produce(config, stats, stop, random.Random(1)),))
        background.start()
        time.sleep(5 if not args.smoke else 1)  # let the load settle
        # probe only once the table's query runs and has processed what was produced so far
        wait_caught_up(local, query_id, asyncio.run(end_offsets(local.bootstrap, "readings", partitions)), timeout_s=600)
        produced_before, started = stats.produced, time.monotonic()
        probes = probe(local.router, args.probes, random.Random(2))
        (visible, inserted, starts), (polled, _, _), (scanned, _, _) = (probes[kind] for kind in KINDS)
        achieved = (stats.produced - produced_before) / (time.monotonic() - started)
        loop.call_soon_threadsafe(stop.set)
        background.join(30)
        raw = asyncio.run(kafka_latency(local.bootstrap, args.probes))
    later = [ms for ms, start in zip(visible, starts, strict=True) if start >= 30]
    result: dict[str, Any] = {
        "benchmark": "freshness", "smoke": args.smoke, "probes": args.probes,
        "target_events_per_s": args.events_per_s, "achieved_events_per_s": round(achieved, 1),
        "insert_to_visible_ms": {"p50": percentile(visible, 0.5), "p99": percentile(visible, 0.99),
                                 "mean": round(statistics.fmean(visible), 2)},
        "insert_answered_ms": {"p50": percentile(inserted, 0.5), "p99": percentile(inserted, 0.99)},
        "polled_without_token_ms": {"p50": percentile(polled, 0.5), "p99": percentile(polled, 0.99),
                                    "mean": round(statistics.fmean(polled), 2)},
        "scan_with_token_ms": {"p50": percentile(scanned, 0.5), "p99": percentile(scanned, 0.99),
                               "mean": round(statistics.fmean(scanned), 2)},
        "after_first_30_s": {"probes": len(later), "p50": percentile(later, 0.5) if later else None,
                             "p99": percentile(later, 0.99) if later else None},
        "baseline_kafka_produce_to_consume_ms": {"p50": percentile(raw, 0.5), "p99": percentile(raw, 0.99)},
        "ratio_p50_to_kafka": ratio(percentile(visible, 0.5), percentile(raw, 0.5)),
    }
    emit(result)


if __name__ == "__main__":
    main()
