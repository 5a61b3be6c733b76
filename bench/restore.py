"""Restore: records per second a worker with no local state restores a table of 1 million
keys from its compacted changelog, against a plain aiokafka consumer reading that same
changelog (read_committed) in the same run.

The table is built first (one event per key, COUNT GROUP BY key); then the worker is
killed, its state directory deleted and the worker started again: its tasks restore from
the changelog before they run. The restore's own span comes from the worker's log
("restore finished" per partition, with the records applied and the seconds taken).

``python -m bench.restore [--keys 1000000]``
"""

from __future__ import annotations

import asyncio
import shutil
import time
from typing import Any

from bench.common import (
    arguments,
    cluster,
    create_readings,
    emit,
    execute,
    log_entries,
    produce_readings,
    ratio,
    raw_consumer_rate,
    wait_caught_up,
)
from millpond.shared.catalog import names
from millpond.shared.kafka.admin import end_offsets

PARTITIONS = 4


def main() -> None:
    args = arguments(__doc__, keys=1_000_000)
    if args.smoke:
        args.keys = 5_000
    env = {"MILLPOND_MAX_OFFSETS_PER_TRIGGER": "200000"}
    with cluster(workers=1, worker_env=env) as local:
        create_readings(local, "readings", PARTITIONS)
        asyncio.run(produce_readings(local.bootstrap, "readings", args.keys, args.keys, PARTITIONS))
        ends = asyncio.run(end_offsets(local.bootstrap, "readings", PARTITIONS))
        (created,) = execute(local, "CREATE TABLE counts AS SELECT sensor, COUNT(*) AS n FROM readings GROUP BY sensor;")
        query_id = str(created.message).rsplit(" ", 1)[-1]
        wait_caught_up(local, query_id, ends)
        changelog = names.changelog_topic(local.service_id, query_id)
        baseline = asyncio.run(raw_consumer_rate(local.bootstrap, changelog, PARTITIONS, "read_committed"))

        worker = local.child("worker-1")
        local.kill("worker-1")
        shutil.rmtree(local.data_dir / "state", ignore_errors=True)
        lines_before = len(worker.log.read_text(errors="replace").splitlines())
        restarted = time.monotonic()
        local.restart("worker-1")
        wait_caught_up(local, query_id, ends)
        back = time.monotonic() - restarted
        entries = [e for e in log_entries(worker.log, "restore finished")
                   if e.get("query") == query_id][-PARTITIONS:]
        assert len(worker.log.read_text(errors="replace").splitlines()) > lines_before
    restored = sum(int(e["restored"]) for e in entries)
    # Partitions restore concurrently: the span is from the first start to the last finish.
    starts = [float(e["ts"]) - float(e["seconds"]) for e in entries]
    span = max(float(e["ts"]) for e in entries) - min(starts) if entries else 0.0
    rate = restored / span if span > 0 else None
    result: dict[str, Any] = {
        "benchmark": "restore", "smoke": args.smoke, "keys": args.keys, "partitions": PARTITIONS,
        "restored_records": restored, "restore_seconds": round(span, 3),
        "restore_records_per_s": None if rate is None else round(rate, 1),
        "per_partition": [{"partition": e["partition"], "records": e["restored"], "seconds": e["seconds"]}
                          for e in entries],
        "restart_to_caught_up_s": round(back, 2),
        "baseline_aiokafka_changelog_read": baseline,
        "ratio_to_aiokafka_consumer": ratio(rate, baseline["records_per_s"]),
    }
    emit(result)


if __name__ == "__main__":
    main()
