"""Idle cost: CPU and memory of each worker (with its Spark JVM) while its queries have no
new input.

Three persistent queries over the readings stream (an AVG GROUP BY, a filter, and a COUNT
per area, which repartitions: two stages), every one caught up; then the CPU time each
worker's process tree uses over ``--seconds``, as a fraction of one core, and its resident
memory (the coordinator's and the router's too, and the cluster's sum). The target: at most
3% of a core per worker, RSS at most 1.5 GiB. ``--standbys N``: N standby copies of each
table partition (the coordinator's ``MILLPOND_NUM_STANDBY_REPLICAS``: 1 by default, as the
product's; runs before 2026-12-01's forty-seventh session had none), each replaying its
changelog on the other worker. ``--joins 1``: a fourth query, the
readings LEFT JOINed with a table of 100 sensors (a stream-table join, whose tasks hold a
consumer of the table's partitions). With ``--profile-seconds N``, after the measurement,
py-spy samples worker-1 for N seconds (bench/profile): where an idle worker's Python CPU goes.
``--slices N`` also reports each of N consecutive parts of ``--seconds``: whether the services
were still settling when the window began.

``python -m bench.idle [--workers 2 --seconds 30 --standbys 1 --joins 0 --slices 1 --profile-seconds 0]``
"""

from __future__ import annotations

import asyncio
import time
from itertools import pairwise
from typing import Any

import psutil

from bench.aggregation import JOINED, produce_sensors
from bench.common import arguments, cluster, create_average, create_readings, emit, execute, produce_readings, wait_caught_up
from bench.profile import sampled
from millpond.deploy.local.launcher import LocalCluster
from millpond.shared.kafka.admin import end_offsets

PARTITIONS = 4


def _tree(pid: int) -> list[psutil.Process]:
    process = psutil.Process(pid)
    return [process, *process.children(recursive=True)]


def _cpu_seconds(tree: list[psutil.Process]) -> float:
    total = 0.0
    for process in tree:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def _rss_mib(tree: list[psutil.Process]) -> float:
    total = 0
    for process in tree:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            pass
    return round(total / 2**20, 1)


def service_costs(local: LocalCluster, seconds: float, slices: int = 1) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    """Per service (each worker, the coordinator, the router): the share of one core its
    process tree used over ``seconds`` (and of it, a worker's Spark JVM's share), and its RSS;
    and the same shares in each of ``slices`` consecutive equal parts of ``seconds`` (how the
    cost moves while the services settle)."""
    trees = {c.name: _tree(c.process.pid) for c in local.children if c.process is not None}
    jvms = {name: [p for p in tree if "java" in p.name()] for name, tree in trees.items()}

    def used() -> dict[str, tuple[float, float]]:
        return {name: (_cpu_seconds(tree), _cpu_seconds(jvms[name])) for name, tree in trees.items()}

    def shares(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]],
               elapsed: float) -> dict[str, dict[str, float]]:
        return {name: {"cpu_core_fraction": round((after[name][0] - before[name][0]) / elapsed, 4),
                       "jvm_cpu_core_fraction": round((after[name][1] - before[name][1]) / elapsed, 4)} for name in trees}

    marks = [(time.monotonic(), used())]
    for _ in range(slices):
        time.sleep(seconds / slices)
        marks.append((time.monotonic(), used()))
    parts = [{"from_s": round(start - marks[0][0], 1), **shares(before, after, end - start)}
             for (start, before), (end, after) in pairwise(marks)]
    whole = shares(marks[0][1], marks[-1][1], marks[-1][0] - marks[0][0])
    return {name: {**cost, "rss_mib": _rss_mib(trees[name])} for name, cost in whole.items()}, parts


def measure(workers: int, seconds: float, settle_s: float, env: dict[str, str] | None = None,
            profile_seconds: float = 0, joins: int = 0, standbys: int = 1, slices: int = 1) -> dict[str, Any]:
    env = env or {}
    profile: dict[str, Any] = {}
    with cluster(workers=workers, standbys=standbys, worker_env=dict(env)) as local:
        create_readings(local, "readings", PARTITIONS)
        asyncio.run(produce_readings(local.bootstrap, "readings", 20_000, 100, PARTITIONS))
        ends = asyncio.run(end_offsets(local.bootstrap, "readings", PARTITIONS))
        queries = [create_average(local, "readings", "avg_readings")]
        statements = ["CREATE STREAM hot AS SELECT sensor, reading FROM readings WHERE reading > 90;",
                      "CREATE TABLE per_area AS SELECT area, COUNT(*) AS n FROM readings GROUP BY area;"]
        if joins:
            execute(local, f"CREATE TABLE sensors (id VARCHAR PRIMARY KEY, site VARCHAR) "
                           f"WITH (kafka_topic='sensors', partitions={PARTITIONS}, value_format='json');")
            asyncio.run(produce_sensors(local.bootstrap, 100, None, partitions=PARTITIONS))
            statements.append(JOINED)
        for sql in statements:
            (outcome,) = execute(local, sql)
            queries.append(str(outcome.message).rsplit(" ", 1)[-1])
        wait_caught_up(local, queries[0], ends)
        time.sleep(settle_s)  # the other queries catch up too, then park (after park_after_idle_ms)
        idle, parts = service_costs(local, seconds, slices)
        if profile_seconds:
            with sampled({"worker-1": local.child("worker-1").process.pid}, profile_seconds) as profile:
                time.sleep(profile_seconds)
    workers_idle = {name: cost for name, cost in idle.items() if name.startswith("worker")}
    worst = max(v["cpu_core_fraction"] for v in workers_idle.values())
    return {"workers": workers, "standbys": standbys, "queries": len(queries), "seconds": seconds, "idle": idle,
            "max_cpu_core_fraction": worst, "max_rss_mib": max(v["rss_mib"] for v in workers_idle.values()),
            "cluster_cpu_core_fraction": round(sum(v["cpu_core_fraction"] for v in idle.values()), 4),
            "target_cpu_core_fraction": 0.03, "target_rss_mib": 1536, **({"slices": parts} if slices > 1 else {}),
            **({"profile": profile} if profile else {})}


def main() -> None:
    args = arguments(__doc__, workers=2, seconds=30.0, settle=25.0, joins=0, standbys=1, slices=1, profile_seconds=0.0)
    if args.smoke:
        args.workers, args.seconds, args.settle = 1, 3.0, 2.0
    emit({"benchmark": "idle", "smoke": args.smoke,
          **measure(args.workers, args.seconds, args.settle, profile_seconds=args.profile_seconds, joins=args.joins,
                     standbys=args.standbys, slices=args.slices)})


if __name__ == "__main__":
    main()
