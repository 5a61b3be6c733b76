"""Pull queries: key lookups of a 1,000-key table on a 2-worker cluster through the
router's ``RouterService/Execute`` at concurrency 1, 16 and 64, driven by ghz (a compiled
load generator, bench/ghz), QPS and latency percentiles against the router's own
``grpc.health.v1.Health/Check`` (the cheapest call that server answers) under the same
generator at the same concurrency, and a direct rocksdict get of the same keys, all in the
same run. Then one lookup's latency layer by layer (bench/pull_path) and, unless
``--profile-seconds 0``, one more period at concurrency 16 with py-spy sampling the router
and the worker (bench/profile): where their CPU goes. ``colocated``: the same, asked of
worker-1 itself (its workers serve RouterService too) for the keys whose active copy it
holds, against worker-1's own health check: one hop instead of two.

``python -m bench.pull_queries [--seconds 10 --keys 1000 --profile-seconds 15]``
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import psutil
from grpc_health.v1 import health_pb2
from hdrh.histogram import HdrHistogram
from prometheus_client.parser import text_string_to_metric_families
from rocksdict import Rdict

from bench.common import arguments, cluster, emit, key_name, ratio, readings_table
from bench.ghz import load
from bench.profile import sampled
from bench.pull_path import keys_held_by, measure_layers
from millpond.router.v1 import router_pb2, router_pb2_grpc

PARTITIONS = 4
CONCURRENCY = (1, 16, 64)
PROFILE_CONCURRENCY = 16


async def closed_loop(call: Callable[[int], Awaitable[None]], concurrency: int, seconds: float) -> dict[str, Any]:
    """``concurrency`` callers calling back to back for ``seconds``: QPS and percentiles (ms)."""
    histogram = HdrHistogram(1, 60_000_000, 3)
    errors = 0
    stop_at = time.monotonic() + seconds

    async def caller(offset: int) -> None:
        nonlocal errors
        i = offset
        while time.monotonic() < stop_at:
            begun = time.perf_counter_ns()
            try:
                await call(i)
                histogram.record_value(max((time.perf_counter_ns() - begun) // 1000, 1))
            except grpc.aio.AioRpcError:
                errors += 1
            i += concurrency

    started = time.monotonic()
    await asyncio.gather(*(caller(n) for n in range(concurrency)))
    elapsed = time.monotonic() - started
    count = histogram.get_total_count()
    return {"concurrency": concurrency, "qps": round(count / elapsed, 1), "errors": errors,
            "p50_ms": histogram.get_value_at_percentile(50) / 1000, "p99_ms": histogram.get_value_at_percentile(99) / 1000,
            "p99_9_ms": histogram.get_value_at_percentile(99.9) / 1000, "max_ms": histogram.get_max_value() / 1000}


def rocksdict_gets(keys: int, seconds: float) -> dict[str, Any]:
    """Direct gets (and the JSON decode the worker does) on a store of the same keys."""
    with tempfile.TemporaryDirectory() as workdir:
        db = Rdict(str(Path(workdir) / "db"))
        try:
            names = [key_name(k).encode() for k in range(keys)]
            for k, name in enumerate(names):
                db[name] = json.dumps([[k * 50, 100]]).encode()
            histogram, stop_at, i = HdrHistogram(1, 60_000_000, 3), time.monotonic() + seconds, 0
            started = time.monotonic()
            while time.monotonic() < stop_at:
                begun = time.perf_counter_ns()
                json.loads(db[names[i % keys]] or b"null")
                histogram.record_value(max((time.perf_counter_ns() - begun) // 1000, 1))
                i += 1
            elapsed = time.monotonic() - started
        finally:
            db.close()
    return {"qps": round(i / elapsed, 1), "p50_ms": histogram.get_value_at_percentile(50) / 1000,
            "p99_ms": histogram.get_value_at_percentile(99) / 1000}


async def warm(router: str, statements: list[str]) -> None:
    """Every key once, checking each answers its row (ghz counts statuses, not rows)."""
    async with grpc.aio.insecure_channel(router) as channel:
        stub = router_pb2_grpc.RouterServiceStub(channel)

        async def lookup(i: int) -> None:
            response = await stub.Execute(router_pb2.ExecuteRequest(sql=statements[i]), timeout=10)
            assert len(response.results[0].rows) == 1, statements[i]

        for start in range(0, len(statements), 16):
            await asyncio.gather(*(lookup(i) for i in range(start, min(start + 16, len(statements)))))


def measure(router: str, keys: int, seconds: float, pids: dict[str, int], metrics_url: str) -> list[dict[str, Any]]:
    """Key lookups and the router's health check under ghz at each concurrency, in turns."""
    return measure_statements(router, [f"SELECT * FROM avg_readings WHERE sensor = '{key_name(k)}';"
                                       for k in range(keys)], seconds, pids, metrics_url)


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def batches(metrics_url: str) -> tuple[float, float]:
    """The router's lookup messages to workers so far, and the lookups they carried."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    found = {name: sample.value for family in text_string_to_metric_families(text) for sample in family.samples
             for name in ("millpond_router_lookup_batch_size_count", "millpond_router_lookup_batch_size_sum")
             if sample.name == name}
    return found.get("millpond_router_lookup_batch_size_count", 0.0), found.get("millpond_router_lookup_batch_size_sum", 0.0)


def loaded(pids: dict[str, int], run: Callable[[], dict[str, Any]], metrics_url: str | None = None) -> dict[str, Any]:
    """``run``'s ghz summary with each process's CPU per answered call in microseconds
    (``cpu_us_per_call``, ghz's own among them, and their ``total``): a cost that a busier or
    quieter machine changes less than QPS; with the router's ``metrics_url``, the lookups its
    messages to the workers carried on average."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    messages_before = batches(metrics_url) if metrics_url else (0.0, 0.0)
    summary = run()
    calls = max(summary["count"] - summary["errors"] - summary["cut_at_end"], 1)
    used = {**{name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}, "ghz": summary.pop("ghz_cpu_s")}
    summary["cpu_us_per_call"] = {name: round(seconds / calls * 1e6, 1)
                                  for name, seconds in {**used, "total": sum(used.values())}.items()}
    if metrics_url:
        messages, lookups = (after - earlier for after, earlier in zip(batches(metrics_url), messages_before, strict=True))
        summary["lookups_per_message"] = round(lookups / messages, 2) if messages else None
    return summary


def measure_statements(router: str, statements: list[str], seconds: float, pids: dict[str, int],
                       metrics_url: str | None = None) -> list[dict[str, Any]]:
    """``statements`` round robin through ``router``'s Execute and its health check under ghz;
    the CPU each call costs the processes in ``pids``."""
    asyncio.run(warm(router, statements))
    requests = [{"sql": sql} for sql in statements]
    levels = []
    for concurrency in CONCURRENCY:
        pulls = loaded(pids, partial(load, router, "millpond.router.v1.RouterService/Execute", router_pb2.DESCRIPTOR,
                                     requests, concurrency, seconds), metrics_url)
        baseline = loaded(pids, partial(load, router, "grpc.health.v1.Health/Check", health_pb2.DESCRIPTOR, {},
                                        concurrency, seconds))
        levels.append({**pulls, "baseline_health_check": baseline,
                       "ratio_qps_to_health_check": ratio(pulls["qps"], baseline["qps"]),
                       "ratio_p99_to_health_check": ratio(pulls["p99_ms"], baseline["p99_ms"]),
                       # With every core busy, QPS follows the CPU a call costs the processes measured, ghz included.
                       "ratio_cpu_per_call_to_health_check": ratio(pulls["cpu_us_per_call"]["total"],
                                                                   baseline["cpu_us_per_call"]["total"])})
    return levels


async def profiled(router: str, keys: int, profile_pids: dict[str, int], seconds: float) -> dict[str, Any]:
    """Lookups at concurrency 16 while py-spy samples the router and the worker."""
    async with grpc.aio.insecure_channel(router) as channel:
        stub = router_pb2_grpc.RouterServiceStub(channel)
        statements = [f"SELECT * FROM avg_readings WHERE sensor = '{key_name(k)}';" for k in range(keys)]

        async def lookup(i: int) -> None:
            await stub.Execute(router_pb2.ExecuteRequest(sql=statements[i % keys]), timeout=10)

        with sampled(profile_pids, seconds) as profile:
            pulls = await closed_loop(lookup, PROFILE_CONCURRENCY, seconds)
    return {"pulls": pulls, **profile}


def main() -> None:
    args = arguments(__doc__, seconds=10.0, keys=1000, profile_seconds=15.0)
    if args.smoke:
        args.seconds, args.keys, args.profile_seconds = 1.0, 50, 2.0
    with cluster(workers=2, worker_env={"MILLPOND_SERVE_ROUTER": "true"}) as local:
        readings_table(local, args.keys, PARTITIONS)
        pids = {c.name: c.process.pid for c in local.children if c.name in ("router", "worker-1")}
        workers = {c.name: c.process.pid for c in local.children if c.name.startswith("worker")}
        result: dict[str, Any] = {"levels": measure(local.router, args.keys, args.seconds, {**workers, **pids},
                                                   local.child("router").metrics)}
        # The same lookups asked of the worker that holds their keys (serve_router): one hop.
        worker = local.child("worker-1").endpoint
        owned = keys_held_by(worker, [key_name(k) for k in range(args.keys)], PARTITIONS)
        result["colocated"] = {"worker": "worker-1", "keys": len(owned), "levels": measure_statements(
            worker, [f"SELECT * FROM avg_readings WHERE sensor = '{name}';" for name in owned], args.seconds, workers)}
        if args.profile_seconds:
            result["profile"] = asyncio.run(profiled(local.router, args.keys, pids, args.profile_seconds))
        with tempfile.TemporaryDirectory() as workdir:
            result["path"] = measure_layers(local, args.keys, 200 if args.smoke else 3000, Path(workdir))
    direct = rocksdict_gets(args.keys, args.seconds)
    for level in result["levels"]:
        level["ratio_qps_to_rocksdict_get"] = ratio(level["qps"], direct["qps"])
    emit({"benchmark": "pull_queries", "smoke": args.smoke, "keys": args.keys, "seconds_per_level": args.seconds,
          "baseline_rocksdict_get": direct, **result})


if __name__ == "__main__":
    main()
