"""What the end-to-end tests do through the router and on the broker's topics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from millpond.cli.client import PushStream, RouterClient
from millpond.deploy.local.launcher import LocalCluster
from millpond.shared.kafka.admin import topic_partitions


def run(cluster: LocalCluster, script: str) -> list[list[object]]:
    """Run statements through the router (SET applies to the rest of the script); the last one's rows."""
    client = RouterClient(cluster.router, timeout=120)
    try:
        outcomes = list(client.run_script(script))
    finally:
        client.close()
    return outcomes[-1].rows


def reads_own_writes(cluster: LocalCluster, steps: list[tuple[str, str, list[list[Any]]]]) -> None:
    """Each step's INSERT, then at once its pull with the token the INSERT gave (one session):
    every pull must already give the step's rows (read-your-writes, however many stages the
    table is behind)."""
    client = RouterClient(cluster.router, timeout=60)
    try:
        for insert, pull, rows in steps:
            client.execute(insert)
            (answer,) = client.execute(pull)
            assert answer.rows == rows, f"{pull} right after {insert} gave {answer.rows}, not {rows}"
    finally:
        client.close()


def pull_until(cluster: LocalCluster, sql: str, want: dict[Any, list[Any]], timeout: float = 240,
               key: Callable[[list[Any]], Any] = lambda row: row[0],
               shown: Callable[[list[Any]], list[Any]] = lambda row: row) -> dict[Any, list[Any]]:
    """Pull ``sql`` until its rows by ``key`` (their first column), each as ``shown``, equal
    ``want`` (tables catch up asynchronously); returns the last answer."""
    deadline = time.monotonic() + timeout
    rows: dict[Any, list[Any]] = {}
    while time.monotonic() < deadline:
        try:
            rows = {key(row): shown(row) for row in run(cluster, sql)}
        except grpc.RpcError:  # UNAVAILABLE while the table's tasks are starting
            rows = {}
        if rows == want:
            break
        time.sleep(0.2)
    return rows


@contextlib.contextmanager
def own_queries(cluster: LocalCluster) -> Iterator[None]:
    """On leaving, TERMINATE the queries created within, so a session's shared cluster does
    not keep running one test's queries under the tests after it."""
    before = {str(row[0]) for row in run(cluster, "SHOW QUERIES;")}
    try:
        yield
    finally:
        for row in run(cluster, "SHOW QUERIES;"):
            if str(row[0]) not in before:
                run(cluster, f"TERMINATE {row[0]};")


def kill_spark_driver(cluster: LocalCluster, name: str) -> int:
    """SIGKILL the Spark driver JVM that worker ``name`` started (a JVM crash, the worker left
    running); its pid."""
    (jvm,) = [child for child in psutil.Process(cluster.child(name).process.pid).children()
              if child.name() == "java"]
    jvm.kill()
    jvm.wait(10)
    return int(jvm.pid)


def log_entries(log: Path) -> Iterator[dict[str, Any]]:
    """The JSON entries of a service's log, in order (other output, such as the JVM's, left out)."""
    return (json.loads(line) for line in log.read_text().splitlines() if line.startswith("{"))


def wait_for(what: str, check: Callable[[], bool], timeout: float = 240) -> None:
    """Wait until ``check()`` holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def collect(stream: PushStream, into: list[list[object]]) -> threading.Thread:
    """Append a push query's rows to ``into`` from a thread, until it is cancelled."""
    def run() -> None:
        try:
            for row in stream:
                into.append(row)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.CANCELLED, err
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


async def read_all(bootstrap: str, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every committed record of ``topic``."""
    return [(partition, offset, key, value) for partition, offset, key, value, _ in await read_records(bootstrap, topic)]


async def read_records(bootstrap: str, topic: str) -> list[tuple[int, int, bytes | None, bytes | None, int]]:
    """(partition, offset, key, value, timestamp) of every committed record written to ``topic``
    before the call."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        count = await topic_partitions(admin, topic)
    finally:
        await admin.close()
    assert count, f"topic {topic} does not exist"
    partitions = [TopicPartition(topic, p) for p in range(count)]
    # Every record written before the read began, once its transaction is decided: a commit
    # returns once the coordinator decided it, before the markers reach the partitions, so a
    # read_committed end offset taken at once can still stop short of the transaction just
    # committed. The high watermark (what read_uncommitted sees) is where to read to.
    peek = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await peek.start()
    try:
        ends = await peek.end_offsets(partitions)
    finally:
        await peek.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        out: list[tuple[int, int, bytes | None, bytes | None, int]] = []
        deadline = time.monotonic() + 120
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]] and time.monotonic() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=500, max_records=50_000)).items():
                out += [(tp.partition, r.offset, r.key, r.value, r.timestamp) for r in records]
        return out
    finally:
        await consumer.stop()


async def sink_until(bootstrap: str, topic: str, count: int,
                     timeout_s: float = 240) -> list[tuple[int, int, Any, Any, int]]:
    """The sink's records (with their timestamps) once it holds ``count`` (and a little
    longer: extra ones would show)."""
    deadline = time.monotonic() + timeout_s
    records = await read_records(bootstrap, topic)
    while len(records) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        records = await read_records(bootstrap, topic)
    await asyncio.sleep(1)
    return await read_records(bootstrap, topic)
