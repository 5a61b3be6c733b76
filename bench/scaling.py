"""Scaling: aggregation throughput with 1 and with 2 workers, each pinned to its own core
(worker i on core i), on the same workload; the ratio is the speed-up.

``python -m bench.scaling [--events 1000000 --keys 1000]``
"""

from __future__ import annotations

from bench.aggregation import measure
from bench.common import arguments, emit, ratio


def main() -> None:
    args = arguments(__doc__, events=1_000_000, keys=1000, max_offsets_per_trigger=200_000)
    if args.smoke:
        args.events, args.keys = 10_000, 100
    runs = {n: measure(args.events, args.keys, n, True, args.max_offsets_per_trigger) for n in (1, 2)}
    emit({"benchmark": "scaling", "smoke": args.smoke, "events": args.events, "keys": args.keys,
          "one_worker_events_per_s": runs[1]["events_per_s"], "two_workers_events_per_s": runs[2]["events_per_s"],
          "speedup": ratio(runs[2]["events_per_s"], runs[1]["events_per_s"]),
          "runs": {str(n): r for n, r in runs.items()}})


if __name__ == "__main__":
    main()
