"""Table scans: a 100,000-row table (AVG per sensor, 4 partitions, 2 workers) read whole through
the router's ``RouterService/Execute`` (``SELECT *`` with no WHERE), filtered by a value column
(about half the rows pass), and cut by a LIMIT, in rows per second, against a direct rocksdict
iteration of the same stores (opened read-only, in key order, each state decoded as the worker
decodes it) in the same run. The router's resident memory is sampled throughout: its peak,
against its size before the first scan, shows what one answer holds there. Unless
``--profile-seconds 0``, whole scans once more while py-spy samples the router and a worker
(bench/profile): where their CPU goes.

``python -m bench.scans [--keys 100000 --seconds 10 --profile-seconds 10]``
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import grpc
import psutil
from rocksdict import AccessType, Options, Rdict

from bench.common import PeakMemory, arguments, cluster, emit, ratio, readings_table
from bench.profile import sampled
from millpond.router.v1 import router_pb2, router_pb2_grpc

PARTITIONS = 4


def cpu_s(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user and system) each process has used so far (a worker's Spark JVM apart)."""
    return {name: sum(psutil.Process(pid).cpu_times()[:2]) for name, pid in pids.items()}


def scans(router: str, sql: str, seconds: float, pids: dict[str, int]) -> dict[str, Any]:
    """``sql`` back to back for ``seconds`` (at least three times): rows per second, latency,
    and the CPU one scan costs each of ``pids`` (and this client, which decodes the answers)."""
    pids = {**pids, "client": os.getpid()}
    cpu_before = cpu_s(pids)
    with grpc.insecure_channel(router, options=[("grpc.max_receive_message_length", 256 * 2**20)]) as channel:
        stub = router_pb2_grpc.RouterServiceStub(channel)
        took: list[float] = []
        rows = 0
        stop_at = time.monotonic() + seconds
        while time.monotonic() < stop_at or len(took) < 3:
            begun = time.perf_counter()
            response = stub.Execute(router_pb2.ExecuteRequest(sql=sql), timeout=120)
            took.append(time.perf_counter() - begun)
            rows = len(response.results[0].rows)
    cpu_after = cpu_s(pids)
    return {"statement": sql, "rows": rows, "scans": len(took), "rows_per_s": round(rows * len(took) / sum(took)),
            "p50_ms": round(statistics.median(took) * 1000, 1), "max_ms": round(max(took) * 1000, 1),
            "cpu_ms_per_scan": {name: round((cpu_after[name] - cpu_before[name]) * 1000 / len(took), 1)
                                for name in pids}}


def direct_iteration(state_dir: Path, seconds: float) -> dict[str, Any]:
    """Every store under ``state_dir`` (opened once, read-only) iterated in key order, each
    state decoded, back to back for ``seconds``."""
    stores = [Rdict(str(p.parent), options=Options(raw_mode=True), access_type=AccessType.read_only(),
                    column_families={"meta": Options(raw_mode=True)}) for p in sorted(state_dir.rglob("CURRENT"))]
    took: list[float] = []
    rows = 0
    try:
        stop_at = time.monotonic() + seconds
        while time.monotonic() < stop_at or len(took) < 3:
            begun, rows = time.perf_counter(), 0
            for db in stores:
                for _key, raw in db.items():
                    json.loads(raw)
                    rows += 1
            took.append(time.perf_counter() - begun)
    finally:
        for db in stores:
            db.close()
    return {"stores": len(stores), "rows": rows, "rows_per_s": round(rows * len(took) / sum(took)),
            "p50_ms": round(statistics.median(took) * 1000, 1)}


def main() -> None:
    args = arguments(__doc__, keys=100_000, seconds=10.0, profile_seconds=10.0)
    if args.smoke:
        args.keys, args.seconds, args.profile_seconds = 2_000, 1.0, 2.0
    cap = str(args.keys + 1)
    with cluster(workers=2, router_env={"MILLPOND_MAX_ROWS_PER_RESPONSE": cap},
                 worker_env={"MILLPOND_MAX_SCAN_ROWS": cap}) as local:
        readings_table(local, args.keys, PARTITIONS)
        pids = {c.name: c.process.pid for c in local.children if c.name == "router" or c.name.startswith("worker-")}
        with PeakMemory(local) as memory:
            time.sleep(1)
            before = memory.peaks.get("router")
            results = {
                "whole": scans(local.router, "SELECT * FROM avg_readings;", args.seconds, pids),
                "filtered": scans(local.router, "SELECT * FROM avg_readings WHERE avg_reading >= 50;", args.seconds, pids),
                "limit_100": scans(local.router, "SELECT * FROM avg_readings LIMIT 100;", args.seconds, pids),
            }
        assert results["whole"]["rows"] == args.keys, results["whole"]
        if args.profile_seconds:
            with sampled({n: pids[n] for n in ("router", "worker-1")}, args.profile_seconds) as profile:
                scans(local.router, "SELECT * FROM avg_readings;", args.profile_seconds, pids)
            results["profile"] = profile
        direct = direct_iteration(local.data_dir / "state", args.seconds)
        assert direct["rows"] >= args.keys, direct  # every copy of every partition (one per worker here)
    for name in ("whole", "filtered", "limit_100"):
        results[name]["ratio_rows_per_s_to_rocksdict_iteration"] = ratio(results[name]["rows_per_s"], direct["rows_per_s"])
    emit({"benchmark": "scans", "smoke": args.smoke, "keys": args.keys, "seconds": args.seconds,
          "router_rss_mib": {"before": before, "peak": memory.peaks.get("router")},
          "baseline_rocksdict_iteration": direct, **results})


if __name__ == "__main__":
    main()
