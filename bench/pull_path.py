"""Where a pull query's time goes: one key lookup at concurrency 1, measured at each layer
of the path in the same run, so each layer's cost is the difference to the one below.

1. ``rocksdict_get``: a direct get + JSON decode on a RocksDB store of the same size (the
   floor of the state read).
2. ``grpc_echo``: the worker's gRPC health check (the same server stack, no work).
3. ``worker_lookup``: WorkerService/Lookup on the active worker (transport + store + row).
4. ``router_pull``: RouterService/Execute of ``SELECT ... WHERE key = ...`` (parse and plan
   cached, routing, the worker hop, the result).

Starts an embedded broker and a one-worker cluster, loads the readings table, prints one
JSON object and stops everything. ``python -m bench.pull_path [--requests N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from aiokafka import AIOKafkaProducer
from grpc_health.v1 import health_pb2, health_pb2_grpc
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc
from rocksdict import Rdict

from cli.client import RouterClient
from deploy.launcher import LocalCluster
from shared.net import free_port
from shared.partitioner import partition_for

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


def rocksdict_baseline(requests: int, workdir: Path) -> dict[str, float]:
    db = Rdict(str(workdir / "baseline"))
    try:
        for k in range(KEYS):
            db[f"sensor-{k:05d}".encode()] = json.dumps([[k, 1], k, k]).encode()
        return timed(requests, lambda i: json.loads(db.get(f"sensor-{i % KEYS:05d}".encode()) or b"null"))
    finally:
        db.close()


def _rows(client: RouterClient, sql: str) -> int:
    """How many rows a pull returns; 0 while the table's tasks are still starting."""
    try:
        return len(client.execute(sql)[0].rows)
    except grpc.RpcError:
        return 0


async def _produce(bootstrap: str) -> None:
    """One reading per key, partitioned as the Java client would."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    try:
        for k in range(KEYS):
            key = f"sensor-{k:05d}".encode()
            await producer.send("readings", json.dumps({"AREA": "wheel", "READING": k % 100}).encode(), key=key,
                                partition=partition_for(key, PARTITIONS))
        await producer.flush()
    finally:
        await producer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="millpond-bench-"))
    cluster = LocalCluster(data_dir=workdir, workers=1, router_port=free_port(), service_id="bench")
    try:
        cluster.start()
        client = RouterClient(cluster.router, timeout=120)
        list(client.run_script(f"""
            SET 'auto.offset.reset'='earliest';
            CREATE STREAM readings (sensor VARCHAR KEY, area VARCHAR, reading INT)
              WITH (kafka_topic='readings', partitions={PARTITIONS}, value_format='json');
            CREATE TABLE avg_readings AS SELECT sensor, AVG(reading) AS avg_reading FROM readings GROUP BY sensor;
        """))
        asyncio.run(_produce(cluster.bootstrap))
        deadline = time.monotonic() + 300
        while _rows(client, "SELECT * FROM avg_readings;") < KEYS:
            if time.monotonic() > deadline:
                raise SystemExit("the table did not fill within 300 s")
            time.sleep(0.5)

        worker = cluster.child("worker-1").endpoint
        channel = grpc.insecure_channel(worker)
        health = health_pb2_grpc.HealthStub(channel)
        lookup = worker_pb2_grpc.WorkerServiceStub(channel)

        def worker_call(i: int) -> None:
            key = f"sensor-{i % KEYS:05d}".encode()
            response = lookup.Lookup(worker_pb2.LookupRequest(table="AVG_READINGS", key=key,
                                                              partition=partition_for(key, PARTITIONS)), timeout=5)
            assert response.found

        def router_call(i: int) -> None:
            (outcome,) = client.execute(f"SELECT * FROM avg_readings WHERE sensor = 'sensor-{i % KEYS:05d}';")
            assert len(outcome.rows) == 1

        layers = {
            "rocksdict_get": rocksdict_baseline(args.requests, workdir),
            "grpc_echo": timed(args.requests, lambda i: health.Check(health_pb2.HealthCheckRequest(), timeout=5)),
            "worker_lookup": timed(args.requests, worker_call),
            "router_pull": timed(args.requests, router_call),
        }
        channel.close()
        client.close()
        p50 = {name: layer["p50_us"] for name, layer in layers.items()}
        print(json.dumps({
            "benchmark": "pull_path", "requests": args.requests, "keys": KEYS, "layers": layers,
            "breakdown_p50_us": {
                "state_read": p50["rocksdict_get"],
                "grpc_hop": p50["grpc_echo"],
                "worker_beyond_hop": round(p50["worker_lookup"] - p50["grpc_echo"], 1),
                "router_beyond_worker": round(p50["router_pull"] - p50["worker_lookup"], 1),
            },
            "ratios_p50": {
                "router_pull_vs_grpc_echo": round(p50["router_pull"] / p50["grpc_echo"], 2),
                "worker_lookup_vs_grpc_echo": round(p50["worker_lookup"] / p50["grpc_echo"], 2),
                "router_pull_vs_rocksdict_get": round(p50["router_pull"] / p50["rocksdict_get"], 1),
            },
        }), flush=True)
    finally:
        cluster.stop()
        if cluster.broker is not None:
            cluster.broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
