"""What the benchmarks share: a cluster of their own, a fast producer, waiting for a table
to catch up, the baselines (Kafka's own consumer performance tool, a plain aiokafka
consumer), and peak memory per service.

Every benchmark is ``python -m bench.<name> [--smoke]``: it starts what it needs in a
temporary directory, prints one JSON object, and stops everything it started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from millpond.cli.client import RouterClient
from millpond.cli.status import router_status
from millpond.deploy.jars import ensure_jars
from millpond.deploy.local.launcher import LocalCluster
from millpond.shared.config import WorkerSettings
from millpond.shared.kafka.admin import end_offsets
from millpond.shared.kafka.connection import started
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.net import free_port

AREAS = ("wheel", "engine", "cabin", "brakes")


def arguments(doc: str | None, **defaults: Any) -> argparse.Namespace:
    """``--smoke`` plus one option per default (``--events 2000000``)."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="Tiny sizes: checks the benchmark runs, not its figures.")
    for name, value in defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    return parser.parse_args()


def emit(result: dict[str, Any]) -> None:
    """The benchmark's one line of output."""
    print(json.dumps(result), flush=True)


def ratio(value: float | None, baseline: float | None) -> float | None:
    """value / baseline, rounded; None when either is missing or the baseline is 0."""
    if not value or not baseline:
        return None
    return round(value / baseline, 3)


@contextmanager
def cluster(workers: int = 1, standbys: int = 0, **options: Any) -> Iterator[LocalCluster]:
    """A local cluster in a temporary directory, stopped and removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="millpond-bench-"))
    coordinator_env = {"MILLPOND_NUM_STANDBY_REPLICAS": str(standbys), **options.pop("coordinator_env", {})}
    local = LocalCluster(data_dir=workdir, workers=workers, router_port=free_port(), service_id="bench",
                         coordinator_env=coordinator_env, **options)
    def remove() -> None:
        local.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    # A benchmark stopped with SIGTERM (kill, timeout) stops its cluster too, as one interrupted would.
    previous = (signal.signal(signal.SIGTERM, exit_handler(remove))
                if threading.current_thread() is threading.main_thread() else None)
    try:
        local.start()
        yield local
    finally:
        remove()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@contextmanager
def cpu_hog() -> Iterator[None]:
    """A busy loop on every core while the block runs."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


EXIT_GRACE_S = 30.0
"""How long a benchmark told to stop may take to unwind before its cluster is removed under it."""


def exit_handler(cleanup: Callable[[], None], grace_s: float = EXIT_GRACE_S) -> Callable[[int, object], None]:
    """A signal handler that unwinds the program (SystemExit), and if it has not ended
    ``grace_s`` later runs ``cleanup`` and ends the process: an asyncio.run whose tasks wait
    on a broker that is down (mid-restart in the soak) never finishes cancelling them."""
    def handler(signum: int, frame: object) -> None:
        def force() -> None:
            print(f"not stopped {grace_s:.0f} s after signal {signum}: removing the cluster and exiting",
                  file=sys.stderr, flush=True)
            try:
                cleanup()
            finally:
                os._exit(128 + signum)

        watchdog = threading.Timer(grace_s, force)
        watchdog.daemon = True
        watchdog.start()
        raise SystemExit(128 + signum)
    return handler


_LOCAL_MASTER = re.compile(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?")


def worker_spark_cores(env: Mapping[str, str]) -> int:
    """The Spark cores a worker started with ``env`` gives its queries, read as
    ``services/worker/spark.parallelism`` reads them: ``MILLPOND_SPARK_CORES`` when positive,
    else N of its ``local[N]`` master (``local``: one, ``local[*]``: every CPU)."""
    cores = int(env.get("MILLPOND_SPARK_CORES", "0"))
    if cores > 0:
        return cores
    master = env.get("MILLPOND_SPARK_MASTER", WorkerSettings.model_fields["spark_master"].default)
    match = _LOCAL_MASTER.fullmatch(master)
    if match is None:
        raise ValueError(f"the cores of Spark master {master!r} are not known here; set MILLPOND_SPARK_CORES")
    threads = match.group(1)
    if threads is None:
        return 1
    return os.cpu_count() or 1 if threads == "*" else int(threads)


def spark_cores(local: LocalCluster) -> int:
    """Every worker's Spark cores together: the cluster's num.stream.threads, in ksqlDB's terms."""
    return sum(worker_spark_cores(child.env) for child in local.children if child.name.startswith("worker-"))


def execute(local: LocalCluster, sql: str, earliest: bool = True) -> list[Any]:
    """Run statements through the router (from the earliest offset by default)."""
    client = RouterClient(local.router, timeout=300)
    try:
        if earliest:
            client.properties = {"auto.offset.reset": "earliest"}
        return client.execute(sql)
    finally:
        client.close()


READINGS = ("CREATE STREAM {stream} (sensor VARCHAR KEY, area VARCHAR, reading INT) "
            "WITH (kafka_topic='{stream}', partitions={partitions}, value_format='JSON');")
AVERAGE = "CREATE TABLE {table} AS SELECT sensor, AVG(reading) AS avg_reading FROM {stream} GROUP BY sensor;"


def create_readings(local: LocalCluster, stream: str, partitions: int) -> None:
    execute(local, READINGS.format(stream=stream, partitions=partitions))


def create_average(local: LocalCluster, stream: str, table: str) -> str:
    """``AVG(reading) GROUP BY sensor`` over the stream; the query id."""
    (outcome,) = execute(local, AVERAGE.format(stream=stream, table=table))
    return str(outcome.message).rsplit(" ", 1)[-1]


def readings_table(local: LocalCluster, keys: int, partitions: int) -> str:
    """The readings stream with one event per key and its AVG table caught up; the query id."""
    create_readings(local, "readings", partitions)
    asyncio.run(produce_readings(local.bootstrap, "readings", keys, keys, partitions))
    ends = asyncio.run(end_offsets(local.bootstrap, "readings", partitions))
    query_id = create_average(local, "readings", "avg_readings")
    wait_caught_up(local, query_id, ends)
    return query_id


def key_name(k: int) -> str:
    return f"sensor-{k:07d}"


async def produce_readings(bootstrap: str, topic: str, events: int, keys: int, partitions: int,
                           distinct_first: bool = True) -> float:
    """``events`` readings as fast as one producer goes (every key once first when
    ``distinct_first``); the produce rate in events per second."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=512 * 1024, acks=1)
    await producer.start()
    names = [key_name(k).encode() for k in range(keys)]
    targets = [partition_for(name, partitions) for name in names]
    values = [json.dumps({"AREA": AREAS[i % 4], "READING": i % 100}).encode() for i in range(400)]
    started = time.monotonic()
    try:
        pending = []
        for i in range(events):
            k = i % keys if distinct_first or i < keys else (i * 7919) % keys
            pending.append(await producer.send(topic, values[i % 400], key=names[k], partition=targets[k]))
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return events / (time.monotonic() - started)


def active_offsets(local: LocalCluster, query_id: str) -> dict[int, int]:
    """Per partition, the next input offset its active task reported (live workers)."""
    offsets: dict[int, int] = {}
    for host in router_status(local.router).cluster.hosts:
        if host.alive:
            actives = {t.partition for t in host.active_tasks if t.query_id == query_id}
            offsets |= {t.task.partition: t.input_offset for t in host.tasks
                        if t.task.query_id == query_id and t.task.partition in actives}
    return offsets


def wait_caught_up(local: LocalCluster, query_id: str, ends: dict[int, int], timeout_s: float = 1800,
                   poll_s: float = 0.1) -> float:
    """Block until every partition's active processed its input up to ``ends``; the time it happened."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            offsets = active_offsets(local, query_id)
            if all(offsets.get(p, -1) >= end for p, end in ends.items()):
                return time.monotonic()
        except Exception:  # a status call during a restart: ask again
            pass
        time.sleep(poll_s)
    raise SystemExit(f"query {query_id} did not catch up within {timeout_s} s")


async def read_topic(bootstrap: str, topic: str, partitions: int, isolation: str = "read_uncommitted",
                     timeout_s: float | None = None, **consumer_args: Any) -> AsyncIterator[tuple[TopicPartition, list[Any]]]:
    """Every record of ``topic``, from the beginning to its end offsets when the read starts, in
    batches as a plain aiokafka consumer fetches them (SystemExit past ``timeout_s``)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False,
                                **consumer_args)
    async with started(consumer):
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            if deadline is not None and time.monotonic() > deadline:
                raise SystemExit(f"reading {topic} took over {timeout_s:g} s")
            for tp, batch in (await consumer.getmany(timeout_ms=1000, max_records=50_000)).items():
                yield tp, batch


async def raw_consumer_rate(bootstrap: str, topic: str, partitions: int, isolation: str = "read_uncommitted") -> dict[str, float]:
    """A plain aiokafka consumer reading the whole topic: records and records per second (the
    clock includes the seek to the beginning and one ListOffsets: milliseconds)."""
    started_at, records = time.monotonic(), 0
    async for _, batch in read_topic(bootstrap, topic, partitions, isolation,
                                     max_partition_fetch_bytes=4 * 1024 * 1024, fetch_max_bytes=32 * 1024 * 1024):
        records += len(batch)
    elapsed = time.monotonic() - started_at
    return {"records": records, "seconds": round(elapsed, 3), "records_per_s": round(records / elapsed, 1)}


def kafka_perf_consumer(bootstrap: str, topic: str, records: int) -> dict[str, Any]:
    """Kafka's own consumer performance tool (kafka-consumer-perf-test) over the topic."""
    java = shutil.which("java") or "java"
    classpath = os.pathsep.join(str(j) for j in ensure_jars("kafka-tools"))
    command = [java, "-Xmx512m", "-cp", classpath, "org.apache.kafka.tools.ConsumerPerformance",
               "--bootstrap-server", bootstrap, "--topic", topic, "--messages", str(records), "--timeout", "60000"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.count(",") >= 5]
    if done.returncode != 0 or len(lines) < 2:
        return {"error": " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])}
    header = [h.strip() for h in lines[0].split(",")]
    values = [v.strip() for v in lines[-1].split(",")]
    row = dict(zip(header, values, strict=False))
    return {"records": float(row["data.consumed.in.nMsg"]), "records_per_s": float(row["nMsg.sec"]),
            "fetch_records_per_s": float(row.get("fetch.nMsg.sec", row["nMsg.sec"]))}


class PeakMemory:
    """Samples the resident memory of each service (with its child processes: a worker's
    Spark JVM) every ``interval_s`` in a background thread; ``peaks`` in MiB."""

    def __init__(self, local: LocalCluster, interval_s: float = 0.5):
        self.local = local
        self.interval_s = interval_s
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _sample(self, pid: int) -> float:
        try:
            process = psutil.Process(pid)
            tree = [process, *process.children(recursive=True)]
            return float(sum(p.memory_info().rss for p in tree if p.is_running())) / 2**20
        except psutil.Error:
            return 0.0

    def _run(self) -> None:
        targets: dict[str, Callable[[], int | None]] = {
            c.name: (lambda c=c: c.process.pid) for c in self.local.children}  # type: ignore[misc]
        if self.local.broker is not None and self.local.broker.process is not None:
            broker = self.local.broker.process.pid
            targets["kafka"] = lambda: broker
        while not self._stop.is_set():
            for name, pid in targets.items():
                value = pid()
                if value is not None:
                    self.peaks[name] = round(max(self.peaks.get(name, 0.0), self._sample(value)), 1)
            self._stop.wait(self.interval_s)


def log_entries(path: Path, message: str) -> list[dict[str, Any]]:
    """The JSON log lines of a service whose ``msg`` is ``message``."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"msg": "{re.escape(message)}"'.replace("\\", "") in line:
            out.append(json.loads(line))
    return out
