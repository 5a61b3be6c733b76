"""The Kafka Streams baseline of ``bench.aggregation``: the same AVG/COUNT by sensor as a plain
Kafka Streams application (``kstreams/``: exactly_once_v2, a RocksDB store with its
changelog, the table written to an output topic), run against the same broker and topic;
with ``window_ms``, the same per tumbling window of that size (a window store, windowed keys).

:func:`build` compiles it with Maven once into the cache (``kstreams-<digest>``, the digest
covering its pom, its sources and the Maven settings; later calls are a directory check).
:func:`run_kafka_streams` starts it and times it until its committed offsets reach the
topic's end on every partition and its store has counted every event.

``python -m bench.baselines.kafka_streams`` builds it (``make install`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from millpond.deploy.jars import build_once, cache_root, package, project_digest
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.admin import end_offsets, ensure_topic, topic_partitions

KSTREAMS_DIR = Path(__file__).resolve().parent / "kstreams"
MAIN_CLASS = "io.millpond.bench.ReadingsAverage"


class BaselineError(MillpondError):
    """The Kafka Streams baseline failed or did not finish in time."""


def build(cache: Path | None = None) -> list[Path]:
    """The application's classpath (its jar and its runtime dependencies), built with Maven
    into ``cache`` (default ``cache_root()``) the first time."""
    target = (cache or cache_root()) / "baselines" / f"kstreams-{project_digest(KSTREAMS_DIR)}"
    return sorted(build_once(target, lambda staging: package(
        KSTREAMS_DIR, staging, "building the Kafka Streams baseline (bench/baselines/kstreams)")).glob("*.jar"))


@dataclass
class Progress:
    """What the application has printed so far, with when it was read."""

    running_at: float | None = None
    state: str = "CREATED"
    counted: int = 0
    keys: int = 0


async def follow_progress(stdout: asyncio.StreamReader, progress: Progress) -> None:
    """Read the application's progress lines into ``progress`` until its stdout ends."""
    async for raw in stdout:
        if not raw.startswith(b"{"):  # not a progress line (a JVM notice): the log has the story
            continue
        line = json.loads(raw)
        if "state" in line:
            progress.state = line["state"]
        else:
            progress.counted, progress.keys = line["counted"], line["keys"]
        # Counts come only while RUNNING, and the first may be printed just before the state.
        if progress.running_at is None and (progress.state == "RUNNING" or "counted" in line):
            progress.running_at = time.monotonic()


async def _committed_to(admin: AIOKafkaAdminClient, group: str, ends: dict[TopicPartition, int]) -> bool:
    """Whether ``group`` committed every partition up to its end offset."""
    try:
        committed = await admin.list_consumer_group_offsets(group, partitions=list(ends))
    except KafkaError as error:
        if error.retriable:  # the group's coordinator is still being elected: ask again
            return False
        raise
    return all(committed.get(tp) is not None and committed[tp].offset >= end for tp, end in ends.items())


async def _stop(process: asyncio.subprocess.Process, timeout_s: float = 20.0) -> None:
    """SIGTERM (the application closes its streams within 10 s), SIGKILL past ``timeout_s``."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        await process.wait()


def _tail(log: Path, lines: int = 8) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


async def _measure(classpath: list[Path], bootstrap: str, topic: str, events: int, threads: int, output_topic: str,
                   window_ms: int, workdir: Path, timeout_s: float, poll_s: float) -> dict[str, Any]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        partitions = await topic_partitions(admin, topic)
        if partitions is None:
            raise BaselineError(f"topic {topic!r} does not exist; produce the readings first")
        # The broker creates no topic on its own: the sink topic must exist, as Millpond's does.
        await ensure_topic(admin, output_topic, partitions)
        ends = {TopicPartition(topic, p): end for p, end in (await end_offsets(bootstrap, topic, partitions)).items()}
        group = f"millpond-bench-kstreams-{uuid.uuid4().hex[:8]}"
        java = shutil.which("java") or "java"
        log = workdir / "kafka-streams.log"
        progress = Progress()
        started = time.monotonic()
        with log.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                java, "-Xmx1g", "-cp", os.pathsep.join(map(str, classpath)), MAIN_CLASS,
                bootstrap, topic, output_topic, group, str(threads), str(workdir / "state"),
                *([str(window_ms)] if window_ms else []), stdout=asyncio.subprocess.PIPE, stderr=stderr)
        assert process.stdout is not None
        follower = asyncio.create_task(follow_progress(process.stdout, progress))
        try:
            deadline = started + timeout_s
            while not (progress.counted == events and await _committed_to(admin, group, ends)):
                if process.returncode is not None or follower.done():
                    raise BaselineError(f"the Kafka Streams baseline stopped ({progress.state}):\n{_tail(log)}")
                if time.monotonic() > deadline:
                    raise BaselineError(f"the Kafka Streams baseline counted {progress.counted} of {events} events "
                                        f"in {timeout_s} s ({progress.state}):\n{_tail(log)}")
                await asyncio.sleep(poll_s)
            done = time.monotonic()
        finally:
            await _stop(process)
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError, ValueError):
                await follower
    finally:
        await admin.close()
    assert progress.running_at is not None  # it counted, so it ran
    from_running = done - progress.running_at
    return {"records": events, "threads": threads, "partitions": partitions, "window_ms": window_ms,
            "counted": progress.counted, "keys": progress.keys,
            "seconds": round(done - started, 2), "seconds_from_running": round(from_running, 2),
            "records_per_s": round(events / from_running, 1),
            "records_per_s_from_start": round(events / (done - started), 1)}


def run_kafka_streams(bootstrap: str, topic: str, events: int, threads: int, output_topic: str,
                      window_ms: int = 0, timeout_s: float = 900.0, poll_s: float = 0.05) -> dict[str, Any]:
    """Run the baseline over ``topic`` (holding exactly ``events`` readings) with ``threads``
    stream threads (per tumbling window of ``window_ms`` when positive) until its committed
    offsets reach the topic's end and its store counted every event; the times from the
    process's start (``seconds``) and from its first RUNNING state (``seconds_from_running``,
    the application's own throughput: ``records_per_s``). The application and its state
    directory are gone when this returns."""
    classpath = build()
    workdir = Path(tempfile.mkdtemp(prefix="millpond-kstreams-"))
    try:
        return asyncio.run(_measure(classpath, bootstrap, topic, events, threads, output_topic, window_ms,
                                    workdir, timeout_s, poll_s))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    """Build the baseline (a directory check once built) and print its classpath folder."""
    print(build()[0].parent)


if __name__ == "__main__":
    main()
