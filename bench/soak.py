"""Soak: a COUNT/SUM aggregation over 8 partitions fed at a steady rate and pulled all along by
sessions that keep their consistency tokens, through a schedule of faults; then every key's
table row against what was produced.

The cluster: 3 workers with one standby, 2 coordinators, the embedded broker. The faults, one
after another, in a seeded random order: SIGKILLs of random workers (each restarted after a
random pause), SIGSTOP/SIGCONT freezes longer than the failure detector's window (the frozen
worker comes back a zombie: its tasks moved meanwhile and its commits must be fenced), the
broker restarted (same ports and data), the coordinator leader killed and restarted, and a
CPU hog on both cores. The faults start once the table has answered a pull.

Reported (and expected 0 but for the unknown sends): keys whose final COUNT or SUM differs
from the produced events (lost or duplicated), pulls answered from state older than their
session's token (a COUNT lower than one the session saw before for that key), zombie commits
accepted (committed changelog transactions that reflect an input position no later than one
committed before them: a fenced owner's commit, or a batch applied twice), sends that failed
for good (their events' fate unknown: excluded from the comparison, counted), tracebacks in
the services' logs; and per fault the failed pulls and the longest gap between answered pulls.

``python -m bench.soak [--kills 20 --freezes 5 --coordinator-kills 2 --broker-restarts 1 --hog-s 30]``
(``--smoke``: one kill, one freeze, one coordinator kill and a 3 s hog; the test version, in
tests/e2e/test_bench_smoke.py)
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiokafka import AIOKafkaProducer

from bench.common import arguments, cluster, cpu_hog, emit, execute, read_topic
from bench.fuzz import logged_exceptions
from millpond.cli.loadtest import Config, Stats, input_ends, recovery
from millpond.deploy.local.launcher import LocalCluster
from millpond.router.v1 import router_pb2, router_pb2_grpc
from millpond.services.worker.state.store import changelog_input_offset
from millpond.shared.catalog.names import changelog_topic
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.rpc.converters import outcome_from_proto

STREAM, TABLE, PARTITIONS = "soak", "soak_totals", 8
WORKERS = ("worker-1", "worker-2", "worker-3")
FREEZE_S = 4.5
"""Longer than a worker's max silence (3 s): the cluster declares it dead while it is frozen."""


@dataclass
class Seen:
    """What the feeders and pullers saw."""

    expected: dict[str, list[int]] = field(default_factory=dict)
    """Per key: [events acknowledged, sum of their readings]."""
    unknown_sends: int = 0
    pulls_ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    stale: int = 0
    """Pulls whose COUNT was lower than one their session had already seen for the key."""
    successes: list[float] = field(default_factory=list)
    failures: list[float] = field(default_factory=list)


async def feed(bootstrap: str, keys: int, rate: float, seen: Seen, stop: asyncio.Event, rng: random.Random) -> None:
    """Readings at ``rate`` per second, idempotently (a send retried across a broker restart is
    written once); an event counts as produced once acknowledged by every in-sync replica."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all",
                                request_timeout_ms=30_000, linger_ms=5)
    await producer.start()
    names = [f"sensor-{k:04d}" for k in range(keys)]
    try:
        n, started = 0, time.monotonic()
        while not stop.is_set():
            batch = []
            for _ in range(max(int(rate / 20), 1)):
                key, reading = names[n % keys] if n < keys else rng.choice(names), rng.randrange(100)
                future = await producer.send(STREAM, f'{{"READING": {reading}}}'.encode(), key=key.encode(),
                                             partition=partition_for(key.encode(), PARTITIONS))
                batch.append((key, reading, future))
                n += 1
            for key, reading, future in batch:
                try:
                    await future
                except Exception:  # its fate is unknown: left out of the comparison, and counted
                    seen.unknown_sends += 1
                    seen.expected.setdefault(key, [0, 0])  # the key still has to exist
                    continue
                totals = seen.expected.setdefault(key, [0, 0])
                totals[0] += 1
                totals[1] += reading
            ahead = n / rate - (time.monotonic() - started)
            if ahead > 0:
                await asyncio.sleep(ahead)
    finally:
        await producer.stop()


async def pull(router: str, keys: int, sessions: int, seen: Seen, stop: asyncio.Event, rng: random.Random) -> None:
    """Key lookups by ``sessions`` sessions, each sending the token of its last answer."""
    async def session(stub: router_pb2_grpc.RouterServiceStub) -> None:
        token, last = "", dict[str, int]()
        while not stop.is_set():
            key = f"sensor-{rng.randrange(keys):04d}"
            try:
                response = await stub.Execute(router_pb2.ExecuteRequest(
                    sql=f"SELECT N FROM {TABLE} WHERE SENSOR = '{key}';", consistency_token=token), timeout=10)
            except grpc.aio.AioRpcError as err:
                seen.errors[err.code().name] += 1
                seen.failures.append(time.monotonic())
                await asyncio.sleep(0.05)
                continue
            (result,) = response.results
            token = result.consistency_token or token
            seen.pulls_ok += 1
            seen.successes.append(time.monotonic())
            rows = outcome_from_proto(result).rows
            if rows:
                count = int(rows[0][0])
                if count < last.get(key, 0):
                    seen.stale += 1
                last[key] = max(count, last.get(key, 0))
            await asyncio.sleep(0.01)

    async with grpc.aio.insecure_channel(router) as channel:
        stub = router_pb2_grpc.RouterServiceStub(channel)
        await asyncio.gather(*(session(stub) for _ in range(sessions)))


def schedule(args: Any, rng: random.Random) -> list[str]:
    faults = (["kill"] * args.kills + ["freeze"] * args.freezes + ["coordinator"] * args.coordinator_kills
              + ["broker"] * args.broker_restarts)
    rng.shuffle(faults)
    if args.hog_s > 0:
        faults.insert(len(faults) // 2, "hog")
    return faults


def inject(local: LocalCluster, fault: str, rng: random.Random, hog_s: float, coordinator_kills: list[str]) -> str:
    """Do one fault (blocking until the cluster has it back); what was done."""
    if fault == "kill":
        worker = rng.choice(WORKERS)
        local.kill(worker)
        time.sleep(rng.uniform(0.5, 5.0))
        local.restart(worker)
        return f"kill:{worker}"
    if fault == "freeze":
        worker = rng.choice(WORKERS)
        group = local.child(worker).process.pid
        os.killpg(group, signal.SIGSTOP)
        time.sleep(FREEZE_S)
        os.killpg(group, signal.SIGCONT)
        return f"freeze:{worker}"
    if fault == "coordinator":
        name = "coordinator" if len(coordinator_kills) % 2 == 0 else "coordinator-2"
        coordinator_kills.append(name)
        local.kill(name)
        time.sleep(1.0)
        local.restart(name)
        return f"kill:{name}"
    if fault == "broker":
        assert local.broker is not None
        local.broker.stop()
        time.sleep(2.0)
        local.broker.start()
        return "broker-restart"
    with cpu_hog():
        time.sleep(hog_s)
    return f"cpu-hog:{hog_s:.0f}s"


def out_of_order_commits(records: list[tuple[int, int | None]]) -> int:
    """Of one changelog partition's committed records, as (offset, input-offset header) in
    offset order: how many transactions reflect an input position no later than one committed
    before them. Each commit of a task writes its batch's records in one transaction, each
    record carrying the input offset the batch reaches, and a new transaction is known by its
    header changing or by a gap in the offsets (its predecessor's commit marker). A zombie's
    commit accepted after its task moved (or any batch applied twice) is such a transaction."""
    wrong, last_offset, last_header, highest = 0, None, None, -1
    for offset, header in records:
        if header is None:
            continue
        new_transaction = header != last_header or (last_offset is not None and offset != last_offset + 1)
        if new_transaction:
            wrong += header <= highest
            highest = max(highest, header)
        last_offset, last_header = offset, header
    return wrong


async def zombie_commits(bootstrap: str, topic: str, partitions: int) -> int:
    """``out_of_order_commits`` over every partition of a changelog, read committed."""
    records: dict[int, list[tuple[int, int | None]]] = {p: [] for p in range(partitions)}
    async for tp, batch in read_topic(bootstrap, topic, partitions, "read_committed", timeout_s=120):
        records[tp.partition].extend((r.offset, changelog_input_offset(r)) for r in batch)
    return sum(out_of_order_commits(records[p]) for p in range(partitions))


async def answering(seen: Seen, timeout_s: float) -> None:
    """Until a pull is answered: the faults start on a table that serves (its queries' Spark
    sessions start in tens of seconds on two cores), or the soak would measure start-up."""
    deadline = time.monotonic() + timeout_s
    while not seen.pulls_ok:
        if time.monotonic() > deadline:
            raise SystemExit(f"no pull was answered in {timeout_s:.0f} s: {dict(seen.errors)}")
        await asyncio.sleep(0.2)


def _longest_gap(times: list[float], start: float, end: float) -> float:
    marks = [start, *[t for t in times if start <= t <= end], end]
    return round(max(b - a for a, b in itertools.pairwise(marks)), 3)


async def soak(local: LocalCluster, args: Any) -> dict[str, Any]:
    rng = random.Random(args.seed)
    execute(local, f"CREATE STREAM {STREAM} (sensor VARCHAR KEY, reading INT) "
                   f"WITH (kafka_topic='{STREAM}', partitions={PARTITIONS}, value_format='JSON');")
    (outcome,) = execute(local, f"CREATE TABLE {TABLE} AS SELECT sensor, COUNT(*) AS n, SUM(reading) AS total "
                                f"FROM {STREAM} GROUP BY sensor;")
    query_id = str(outcome.message).rsplit(" ", 1)[-1]
    seen, stop = Seen(), asyncio.Event()
    jobs = [asyncio.create_task(feed(local.bootstrap, args.keys, args.rate, seen, stop, rng)),
            asyncio.create_task(pull(local.router, args.keys, args.sessions, seen, stop, rng))]
    await answering(seen, timeout_s=240)
    await asyncio.sleep(args.settle_s)
    faults: list[dict[str, Any]] = []
    coordinator_kills, fault_rng = list[str](), random.Random(args.seed + 1)
    for fault in schedule(args, fault_rng):
        started = time.monotonic()
        done = await asyncio.to_thread(inject, local, fault, fault_rng, args.hog_s, coordinator_kills)
        await asyncio.sleep(args.between_s)
        ended = time.monotonic()
        faults.append({"fault": done, "failed_pulls": sum(started <= t <= ended for t in seen.failures),
                       "longest_pull_gap_s": _longest_gap(seen.successes, started, ended)})
    stop.set()
    await asyncio.gather(*jobs)

    config = Config(server=local.router, kafka=local.bootstrap, stream=STREAM, partitions=PARTITIONS)
    caught_up = await recovery(config, query_id, time.monotonic(), await input_ends(config), Stats(), timeout_s=300)
    rows = {row[0]: row for row in execute(local, f"SELECT * FROM {TABLE};")[0].rows}
    wrong = {key: {"produced": want, "table": list(rows[key][1:]) if key in rows else None}
             for key, want in seen.expected.items()
             if key not in rows or [int(rows[key][1]), int(rows[key][2] or 0)] != want}
    zombies = await zombie_commits(local.bootstrap, changelog_topic(local.service_id, query_id), PARTITIONS)
    logs = logged_exceptions(local)
    return {
        "keys": args.keys, "events_per_s": args.rate, "events_acknowledged": sum(c for c, _ in seen.expected.values()),
        "unknown_sends": seen.unknown_sends, "caught_up_s": None if caught_up is None else round(caught_up, 1),
        "keys_wrong": len(wrong), "wrong_samples": dict(list(wrong.items())[:5]),
        "stale_pulls": seen.stale, "zombie_commits_accepted": zombies, "pulls_ok": seen.pulls_ok, "pull_errors": dict(seen.errors),
        "faults": faults, "max_failed_pulls_per_fault": max((f["failed_pulls"] for f in faults), default=0),
        "max_pull_gap_s": max((f["longest_pull_gap_s"] for f in faults), default=0.0),
        "tracebacks_in_logs": sum(entry["tracebacks"] for entry in logs.values()),
        "log_samples": {name: entry["distinct"] for name, entry in logs.items() if entry["tracebacks"]},
    }


def main() -> None:
    args = arguments(__doc__, kills=20, freezes=5, coordinator_kills=2, broker_restarts=1, hog_s=30.0, keys=500,
                     rate=300.0, sessions=4, settle_s=20.0, between_s=4.0, seed=19)
    if args.smoke:
        args.kills, args.freezes, args.coordinator_kills, args.broker_restarts, args.hog_s = 1, 1, 1, 0, 3.0
        args.keys, args.rate, args.settle_s, args.between_s = 50, 100.0, 3.0, 2.0
    started = time.monotonic()
    with cluster(workers=len(WORKERS), standbys=1, coordinators=2) as local:
        result = asyncio.run(soak(local, args))
    emit({"benchmark": "soak", "smoke": args.smoke, **result, "elapsed_s": round(time.monotonic() - started, 1)})


if __name__ == "__main__":
    main()
