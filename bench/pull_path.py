"""Where a pull query's time goes: one key lookup at concurrency 1, measured at each layer
of the path in the same run, so each layer's cost is the difference to the one below.

1. ``rocksdict_get``: a direct get + JSON decode on a RocksDB store of the same size (the
   floor of the state read).
2. ``grpc_echo``: the worker's gRPC health check (the same server stack, no work).
3. ``worker_lookup``: WorkerService/Lookup on the active worker (transport + store + row).
4. ``router_pull``: RouterService/Execute of ``SELECT ... WHERE key = ...`` (parse and plan
   cached, routing, the worker hop, the result).
5. ``router_pull_unseen_key``: the same for a key never asked before (a text the parse cache
   has not seen: the router's key-lookup template stands in for the parse and plan).

``planning``: in this process, a parse and plan of a text never seen against the lookup
template of its shape.

bench/pull_queries measures this on its own cluster too; alone, this starts an embedded
broker and a one-worker cluster, loads the readings table, prints one JSON object and stops
everything. ``python -m bench.pull_path [--requests N]``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rocksdict import Rdict

from bench.common import AVERAGE, READINGS, arguments, cluster, emit, key_name, readings_table
from millpond.cli.client import RouterClient
from millpond.deploy.local.launcher import LocalCluster
from millpond.services.router.lookups import LookupTemplates
from millpond.services.router.pull import plan_pull
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.sql import ast
from millpond.shared.sql.guard import ParseLimits, StatementParser
from millpond.shared.sql.parser import parse_statement
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc

KEYS = 1000
PARTITIONS = 4


def timed(requests: int, call: Callable[[int], Any]) -> dict[str, float]:
    """Latency percentiles in microseconds of ``requests`` sequential calls (after a warm-up)."""
    for i in range(min(200, requests)):
        call(i)
    samples = []
    for i in range(requests):
        start = time.perf_counter_ns()
        call(i)
        samples.append((time.perf_counter_ns() - start) / 1000)
    samples.sort()
    return {"p50_us": round(statistics.median(samples), 1), "p99_us": round(samples[int(len(samples) * 0.99)], 1),
            "mean_us": round(statistics.fmean(samples), 1), "per_s": round(1e6 / statistics.fmean(samples))}


def rocksdict_baseline(requests: int, keys: int, workdir: Path) -> dict[str, float]:
    db = Rdict(str(workdir / "baseline"))
    try:
        for k in range(keys):
            db[key_name(k).encode()] = json.dumps([[k, 1], k, k]).encode()
        return timed(requests, lambda i: json.loads(db.get(key_name(i % keys).encode()) or b"null"))
    finally:
        db.close()


def planning(requests: int) -> dict[str, Any]:
    """The router's work before it asks a worker, for a text never seen before: a parse and a
    plan, against the key-lookup template of the same shape (services/router/lookups), over
    the metastore of the readings table."""
    metastore = Metastore()
    metastore.apply(parse_statement(READINGS.format(stream="readings", partitions=PARTITIONS)), 0)
    metastore.apply(parse_statement(AVERAGE.format(stream="readings", table="avg_readings")), 1)
    parser = StatementParser(ParseLimits())
    templates = LookupTemplates(parser)
    texts = [f"SELECT * FROM avg_readings WHERE sensor = 'unseen-{i}'" for i in range(requests + 200)]

    def parse_and_plan(i: int) -> None:
        query = parse_statement(texts[i])
        assert isinstance(query, ast.Query)
        plan_pull(query, metastore, "bench")

    async def learn() -> None:
        query = parse_statement(texts[-1])
        assert isinstance(query, ast.Query)
        await templates.learn(query, plan_pull(query, metastore, "bench"), metastore.command_offset)

    asyncio.run(learn())
    parser.close()
    offset = metastore.command_offset
    parsed, template = timed(requests, parse_and_plan), timed(requests, lambda i: templates.match(texts[i], offset))
    return {"parse_and_plan": parsed, "template": template,
            "speedup_p50": round(parsed["p50_us"] / template["p50_us"], 1)}


def keys_held_by(worker: str, names: list[str], partitions: int) -> list[str]:
    """The key names whose partition's active copy ``worker`` holds (of a cluster of several)."""
    with grpc.insecure_channel(worker) as channel:
        lookup = worker_pb2_grpc.WorkerServiceStub(channel)

        def held(partition: int) -> bool:
            try:
                lookup.Lookup(worker_pb2.LookupRequest(table="AVG_READINGS", key=b"-", partition=partition), timeout=5)
                return True
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                return False

        mine = {p for p in range(partitions) if held(p)}
    return [name for name in names if partition_for(name.encode(), partitions) in mine]


def measure_layers(local: LocalCluster, keys: int, requests: int, workdir: Path) -> dict[str, Any]:
    """Each layer's latency over the cluster's loaded ``avg_readings`` table (bench.common's
    readings_table), and the differences between them: keys whose active copy is on worker-1."""
    client = RouterClient(local.router, timeout=120)
    channel = grpc.insecure_channel(local.child("worker-1").endpoint)
    try:
        health = health_pb2_grpc.HealthStub(channel)
        lookup = worker_pb2_grpc.WorkerServiceStub(channel)

        names = keys_held_by(local.child("worker-1").endpoint, [key_name(k) for k in range(keys)], PARTITIONS)

        def worker_call(i: int) -> None:
            key = names[i % len(names)].encode()
            response = lookup.Lookup(worker_pb2.LookupRequest(table="AVG_READINGS", key=key,
                                                              partition=partition_for(key, PARTITIONS)), timeout=5)
            assert response.found

        def router_call(i: int) -> None:
            (outcome,) = client.execute(f"SELECT * FROM avg_readings WHERE sensor = '{names[i % len(names)]}';")
            assert len(outcome.rows) == 1

        unseen = iter(range(10**9))

        def router_unseen_call(_: int) -> None:
            (outcome,) = client.execute(f"SELECT * FROM avg_readings WHERE sensor = 'absent-{next(unseen)}';")
            assert not outcome.rows

        layers = {
            "rocksdict_get": rocksdict_baseline(requests, keys, workdir),
            "grpc_echo": timed(requests, lambda i: health.Check(health_pb2.HealthCheckRequest(), timeout=5)),
            "worker_lookup": timed(requests, worker_call),
            "router_pull": timed(requests, router_call),
            "router_pull_unseen_key": timed(requests, router_unseen_call),
        }
    finally:
        channel.close()
        client.close()
    p50 = {name: layer["p50_us"] for name, layer in layers.items()}
    return {
        "requests": requests, "keys": keys, "layers": layers,
        "breakdown_p50_us": {
            "state_read": p50["rocksdict_get"],
            "grpc_hop": p50["grpc_echo"],
            "worker_beyond_hop": round(p50["worker_lookup"] - p50["grpc_echo"], 1),
            "router_beyond_worker": round(p50["router_pull"] - p50["worker_lookup"], 1),
        },
        "planning": planning(requests),
        "ratios_p50": {
            "router_pull_vs_grpc_echo": round(p50["router_pull"] / p50["grpc_echo"], 2),
            "worker_lookup_vs_grpc_echo": round(p50["worker_lookup"] / p50["grpc_echo"], 2),
            "router_pull_vs_rocksdict_get": round(p50["router_pull"] / p50["rocksdict_get"], 1),
        },
    }


def main() -> None:
    args = arguments(__doc__, requests=3000, keys=KEYS)
    if args.smoke:
        args.requests, args.keys = 200, 50
    with cluster(workers=1) as local:
        readings_table(local, args.keys, PARTITIONS)
        with tempfile.TemporaryDirectory() as workdir:
            emit({"benchmark": "pull_path", "smoke": args.smoke,
                  **measure_layers(local, args.keys, args.requests, Path(workdir))})


if __name__ == "__main__":
    main()
