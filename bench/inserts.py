"""INSERT throughput: ``INSERT INTO readings ... VALUES`` through the router's
``RouterService/Execute`` at concurrency 1, 16 and 64, driven by ghz (bench/ghz), QPS and
latency percentiles against the router's own health check under the same load generator in
the same run, with the CPU each answered INSERT cost the router and the coordinator.

Each level's rows are counted in the topic afterwards: every answered INSERT is there once
(``rows_in_topic`` against ``answered``; ghz cuts at most one call per worker at the end, which
may or may not have landed).

``python -m bench.inserts [--seconds 10 --keys 1000]``
"""

from __future__ import annotations

import asyncio
import random
from functools import partial

from grpc_health.v1 import health_pb2

from bench.common import arguments, cluster, create_readings, emit, key_name, ratio
from bench.ghz import load
from bench.pull_queries import loaded
from millpond.router.v1 import router_pb2
from millpond.shared.kafka.admin import end_offsets

CONCURRENCY = (1, 16, 64)
PARTITIONS = 4


def main() -> None:
    args = arguments(__doc__, seconds=10.0, keys=1000)
    if args.smoke:
        args.seconds, args.keys = 1.0, 20
    rng = random.Random(7)
    statements = [{"sql": f"INSERT INTO readings (sensor, area, reading) VALUES "
                          f"('{key_name(rng.randrange(args.keys))}', 'area-{k % 10}', {rng.randrange(100)});"}
                  for k in range(args.keys)]
    with cluster(workers=0) as local:
        create_readings(local, "readings", PARTITIONS)
        pids = {c.name: c.process.pid for c in local.children if c.name in ("router", "coordinator")}
        levels = []
        for concurrency in CONCURRENCY:
            before = sum(asyncio.run(end_offsets(local.bootstrap, "readings", PARTITIONS)).values())
            inserts = loaded(pids, partial(load, local.router, "millpond.router.v1.RouterService/Execute",
                                           router_pb2.DESCRIPTOR, statements, concurrency, args.seconds))
            after = sum(asyncio.run(end_offsets(local.bootstrap, "readings", PARTITIONS)).values())
            baseline = loaded(pids, partial(load, local.router, "grpc.health.v1.Health/Check", health_pb2.DESCRIPTOR,
                                            {}, concurrency, args.seconds))
            answered = inserts["count"] - inserts["errors"] - inserts["cut_at_end"]
            if not answered <= after - before <= answered + inserts["cut_at_end"]:
                raise SystemExit(f"{answered} INSERTs answered at concurrency {concurrency}, "
                                 f"but {after - before} rows landed")
            levels.append({**inserts, "answered": answered, "rows_in_topic": after - before,
                           "baseline_health_check": baseline,
                           "ratio_qps_to_health_check": ratio(inserts["qps"], baseline["qps"]),
                           "ratio_p99_to_health_check": ratio(inserts["p99_ms"], baseline["p99_ms"])})
    emit({"benchmark": "inserts", "smoke": args.smoke, "seconds_per_level": args.seconds, "levels": levels})


if __name__ == "__main__":
    main()
