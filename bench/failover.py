"""Failover: SIGKILL a worker that holds active partitions while clients pull
continuously and events flow: with 0 and with 1 standby replica (standby reads on), then
with 1 standby and standby reads off (ksqlDB's default: only actives answer), quiet and with
a CPU hog busy on every core for the whole run. Then scaling under the same load, 1 standby,
reads off: a worker added at ``--kill-at``, and a worker stopped with SIGTERM (a graceful
leave) once partitions had moved to the added worker (when its warm-up copies caught up: its
start and Spark warm-up take a minute or more here) and half of ``--seconds`` minus
``--kill-at`` after that; the load runs on until both are over. Each run gives failed pulls,
the longest gap between successful answers, how long until the coordinator and the router saw
the worker dead (the add: until partitions moved to it), until the moved partitions had
processed all input that existed at the kill (at the move), until their new owners first
committed output of their own (the later of the two is ``processing_again_s``: a new owner
that holds the position its old owner's last batch reached has not yet processed anything),
and the longest time a partition
that did not move went without a commit reaching the table's topic. Baseline: the same load
before the kill (the longest gap between answers, and between an unmoved partition's commits,
in the seconds before it).

``python -m bench.failover [--seconds 40 --kill-at 15]``
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from bench.common import arguments, cluster, cpu_hog, emit
from millpond.cli import loadtest

RUNS = ((0, True, False, False), (1, True, False, False), (1, False, False, False), (1, False, True, False),
        (1, False, False, True))
"""(standby replicas, standby reads, CPU hog, scaling instead of a kill) of each run."""


def faults(scaling: bool, seconds: float, kill_at: float) -> list[loadtest.Fault]:
    """A SIGKILL of worker-1; or, scaling, a worker added and, once partitions have moved to it
    and processed the input that existed then, worker-1 stopped with SIGTERM."""
    if not scaling:
        return [loadtest.Fault(kill_at, "kill", "worker-1")]
    return [loadtest.Fault(kill_at, "add"), loadtest.Fault(round((seconds - kill_at) / 2, 1), "stop", "worker-1", True)]


def run(standbys: int, standby_reads: bool, hog: bool, scaling: bool, seconds: float, kill_at: float,
        events_per_s: float, keys: int) -> dict[str, Any]:
    with cluster(workers=3, standbys=standbys) as local:
        config = loadtest.Config(server=local.router, kafka=local.bootstrap, stream="failover", keys=keys,
                                 partitions=6, duration_s=seconds, events_per_s=events_per_s, pull_concurrency=4,
                                 standby_reads=standby_reads, faults=faults(scaling, seconds, kill_at))
        with cpu_hog() if hog else contextlib.nullcontext():
            summary = asyncio.run(loadtest.run(config, local))
    return {"standbys": standbys, "standby_reads": standby_reads, "cpu_hog": hog, "scaling": scaling, **summary}


def main() -> None:
    args = arguments(__doc__, seconds=40.0, kill_at=15.0, events_per_s=500.0, keys=300)
    if args.smoke:
        args.seconds, args.kill_at, args.events_per_s, args.keys = 14.0, 6.0, 100.0, 30
    emit({"benchmark": "failover", "smoke": args.smoke,
          "runs": [run(standbys, reads, hog, scaling, args.seconds, args.kill_at, args.events_per_s, args.keys)
                   for standbys, reads, hog, scaling in RUNS]})


if __name__ == "__main__":
    main()
