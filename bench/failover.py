"""Failover: SIGKILL a worker that holds active partitions while clients pull
continuously (standby reads on) and events flow, with 0 and with 1 standby replica:
failed pulls, the longest gap between successful answers, how long until the coordinator
and the router saw the worker dead, and until the moved partitions had processed all the
input that existed at the kill. Baseline: the same load's gap distribution before the
kill (the longest gap between answers in the seconds before it).

``python -m bench.failover [--seconds 40 --kill-at 15]``
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.common import arguments, cluster, emit
from millpond.cli import loadtest


def run(standbys: int, seconds: float, kill_at: float, events_per_s: float, keys: int) -> dict[str, Any]:
    with cluster(workers=3, standbys=standbys) as local:
        config = loadtest.Config(server=local.router, kafka=local.bootstrap, stream="failover", keys=keys,
                                 partitions=6, duration_s=seconds, events_per_s=events_per_s, pull_concurrency=4,
                                 faults=[loadtest.Fault(kill_at, "kill", "worker-1")])
        summary = asyncio.run(loadtest.run(config, local))
    return {"standbys": standbys, **summary}


def main() -> None:
    args = arguments(__doc__, seconds=40.0, kill_at=15.0, events_per_s=500.0, keys=300)
    if args.smoke:
        args.seconds, args.kill_at, args.events_per_s, args.keys = 14.0, 6.0, 100.0, 30
    emit({"benchmark": "failover", "smoke": args.smoke,
          "runs": [run(s, args.seconds, args.kill_at, args.events_per_s, args.keys) for s in (0, 1)]})


if __name__ == "__main__":
    main()
