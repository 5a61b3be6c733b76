"""The command topic's reader: how long a node's ``catch_up`` takes after a statement's
transaction committed, and the CPU its idle polling costs, at the product's fetch wait
(``COMMAND_FETCH_WAIT_MS``) against a 25 ms wait in the same run (what the coordinator and
the router used before: a commit answering a held fetch at once is what lets the wait grow).

Each reader follows the topic as a node does (``CommandReader.run``); a writer
appends one statement per transaction every ``--gap-s``, and the reader's ``catch_up`` past
it is timed from the commit, as a coordinator's is before it answers the statement (a commit
returns before its markers are written, so the end offset asked at once may not count it
yet). The idle CPU is the process's over ``--idle-s`` with only that reader polling.

``python -m bench.command_log [--statements 20 --idle-s 20]``
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.common import arguments, emit, ratio
from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.kafka.command_log import COMMAND_FETCH_WAIT_MS, Command, CommandReader, CommandWriter
from millpond.shared.kafka.connection import KafkaConnection

BASELINE_WAIT_MS = 25


async def measure(bootstrap: str, run: int, wait_ms: int, statements: int, gap_s: float, idle_s: float) -> dict[str, Any]:
    """One reader at ``wait_ms`` on a topic of its own: catch-up after each of ``statements``
    commits, then idle CPU."""
    topic = f"commands-{run}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    kafka = KafkaConnection(bootstrap)
    # The streams' topics are never created: a node with every topic there lists them every 10 s.
    reader = CommandReader(kafka, topic, Metastore(), fetch_max_wait_ms=wait_ms, errors_recheck_s=10.0)
    writer = CommandWriter(kafka, topic, f"bench-{run}")
    await reader.start()
    stop = asyncio.Event()
    follower = asyncio.create_task(reader.run(stop))
    took_ms = []
    try:
        for i in range(statements):
            await asyncio.sleep(gap_s)
            async with writer.transaction() as appender:
                offset = await appender.append(Command(f"CREATE STREAM S{i} (A INT) WITH (kafka_topic='t{run}_{i}', "
                                              "partitions=1, value_format='JSON');"))
            started = time.monotonic()
            await asyncio.wait_for(reader.catch_up(offset + 1), 60)
            took_ms.append((time.monotonic() - started) * 1000)
        if len(reader.metastore.sources) != statements:
            raise SystemExit(f"the reader at {wait_ms} ms applied {len(reader.metastore.sources)} of {statements}")
        process = psutil.Process()
        cpu, wall = sum(process.cpu_times()[:2]), time.monotonic()
        await asyncio.sleep(idle_s)
        idle = (sum(process.cpu_times()[:2]) - cpu) / (time.monotonic() - wall)
    finally:
        stop.set()
        await follower
        await reader.stop()
    later = took_ms[1:]  # the first waits for the reader's first fetch session; shown apart
    return {"fetch_max_wait_ms": wait_ms, "first_catch_up_ms": round(took_ms[0], 1),
            "catch_up_ms_median": round(statistics.median(later), 1), "catch_up_ms_max": round(max(later), 1),
            "idle_cpu_core_fraction": round(idle, 4)}


def main() -> None:
    args = arguments(__doc__, statements=20, gap_s=0.7, idle_s=20.0)
    statements, idle_s = (3, 2.0) if args.smoke else (args.statements, args.idle_s)
    # (The reader's "in error" warnings about those topics are expected here.)
    logging.getLogger("millpond.shared.kafka.command_log").setLevel(logging.ERROR)
    work = Path(tempfile.mkdtemp(prefix="millpond-bench-"))
    broker = EmbeddedKafka(work / "kafka")
    broker.start()
    try:
        # Alternated, so a drift of the machine's load shows in both.
        waits = (BASELINE_WAIT_MS, COMMAND_FETCH_WAIT_MS) * 2
        runs = [asyncio.run(measure(broker.bootstrap_servers, run, wait, statements, args.gap_s, idle_s))
                for run, wait in enumerate(waits)]
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    product = [r for r in runs if r["fetch_max_wait_ms"] == COMMAND_FETCH_WAIT_MS]
    baseline = [r for r in runs if r["fetch_max_wait_ms"] == BASELINE_WAIT_MS]
    emit({"benchmark": "command_log", "smoke": args.smoke, "statements": statements, "runs": runs,
          "catch_up_median_vs_baseline": ratio(statistics.median(r["catch_up_ms_median"] for r in product),
                                               statistics.median(r["catch_up_ms_median"] for r in baseline)),
          "idle_cpu_vs_baseline": ratio(statistics.median(r["idle_cpu_core_fraction"] for r in product),
                                        statistics.median(r["idle_cpu_core_fraction"] for r in baseline))})


if __name__ == "__main__":
    main()
