"""``millpond loadtest``: drive a running cluster (or one it starts) with events and pull
queries, optionally through a schedule of faults, and summarize what it saw.

The workload is the readings example: events ``(sensor KEY, area, reading)`` produced
straight to the stream's topic (murmur2-partitioned, as the Java client does), and key
lookups on ``<stream>_avg`` (``AVG(reading) GROUP BY sensor``) through the router at a
target rate or concurrency, over a uniform or Zipf-skewed key distribution. Latencies go
into an HDR histogram; the summary is one JSON object: achieved rates, percentiles (p50,
p99, p99.9, max), errors by status, and per fault how long until pulls answered again,
until the moved partitions had processed the input that existed at the fault, and the
longest time a partition that did not move went without a commit reaching the table's topic,
and without its worker producing a transaction (against the same before the fault: a batch's time).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from hdrh.histogram import HdrHistogram
from rich.console import Console
from rich.live import Live
from rich.table import Table

from millpond.coordinator.v1 import coordinator_pb2
from millpond.deploy.local.launcher import LocalCluster
from millpond.router.v1 import router_pb2, router_pb2_grpc
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.admin import end_offsets
from millpond.shared.kafka.connection import started
from millpond.shared.kafka.partitioner import partition_for
from millpond.shared.rpc.tls import ClientCredentials

AREAS = ("wheel", "engine", "cabin", "brakes")
WARM_UP_TIMEOUT_S = 300.0
TAKE_OVER_TIMEOUT_S = 300.0
"""How long an added worker has to start, warm up and take over a partition."""
WATCH_AFTER_S = 6.0
"""How long after the moved partitions recovered every partition's commits are watched: past
a second move of one that moved (the coordinator keeps a moved active on its new worker for
``moved_active_settle_ms``, 3 s, before the balance may move it on)."""


@dataclass(frozen=True)
class Fault:
    """Something the harness does to a cluster it started, ``at_s`` seconds in."""

    at_s: float
    action: str
    """``kill`` (SIGKILL), ``stop`` (SIGTERM, a graceful leave), ``restart`` or ``add`` (a new worker)."""
    target: str = ""
    """The worker (``worker-2``); empty for ``add``."""
    after_previous: bool = False
    """``at_s`` counts from when the fault before it had finished (its moved partitions had
    processed all input that existed at it), not from the start."""

    @classmethod
    def parse(cls, text: str) -> Fault:
        """``kill:worker-1@10``, ``stop:worker-2@20``, ``restart:worker-1@30``, ``add@15``;
        ``stop:worker-1@+10``: 10 s after the fault before it finished."""
        what, _, at = text.partition("@")
        action, _, target = what.partition(":")
        after = at.startswith("+")
        try:
            seconds = float(at[1:] if after else at)
        except ValueError:
            seconds = -1.0
        if action not in ("kill", "stop", "restart", "add") or not seconds >= 0 or (action != "add") != bool(target):
            raise MillpondError(f"fault {text!r}: write kill:WORKER@SECONDS, stop:WORKER@S, restart:WORKER@S or add@S "
                                "(@+S: S seconds after the fault before it finished)")
        return cls(seconds, action, target, after)

    def due(self, started: float, previous_finished: float) -> float:
        """When it is due: ``at_s`` after ``started`` (the load's start), or, following the
        fault before it, after ``previous_finished`` (when that one finished)."""
        return (previous_finished if self.after_previous else started) + self.at_s

    def __str__(self) -> str:
        return f"{self.action}{':' + self.target if self.target else ''}@{'+' if self.after_previous else ''}{self.at_s}"


PRODUCE_TICK_S = 0.005
"""How often a rate-limited generator sends what is due (50 events a tick at 10,000 a second)."""
PRODUCE_TICK_MAX = 5000
"""The most events a tick sends (an unlimited generator's every tick, or one catching up)."""


@dataclass
class Config:
    """One load test."""

    server: str
    kafka: str
    stream: str
    keys: int = 1000
    partitions: int = 8
    duration_s: float = 30.0
    events_per_s: float = 1000.0
    """Target produce rate; 0: as fast as possible."""
    pull_concurrency: int = 4
    pull_rate: float = 0.0
    """Target pulls per second over all concurrent clients; 0: as fast as they go."""
    distribution: str = "uniform"
    """``uniform`` or ``zipf`` (keys ranked, P(k) ~ 1/k)."""
    standby_reads: bool = True
    faults: list[Fault] = field(default_factory=list)
    credentials: ClientCredentials = field(default_factory=ClientCredentials)
    seed: int = 7

    @property
    def table(self) -> str:
        return f"{self.stream}_avg"


def key_chooser(keys: int, distribution: str, rng: random.Random) -> Callable[[], str]:
    """A function returning the next key to look up."""
    names = [f"sensor-{k:05d}" for k in range(keys)]
    if distribution == "uniform":
        return lambda: names[rng.randrange(keys)]
    if distribution != "zipf":
        raise MillpondError(f"distribution {distribution!r}: use uniform or zipf")
    cumulative, total = [], 0.0
    for rank in range(1, keys + 1):
        total += 1.0 / rank
        cumulative.append(total)
    return lambda: names[min(bisect.bisect_left(cumulative, rng.random() * total), keys - 1)]


@dataclass
class Stats:
    """What happened, for the live view and the summary."""

    started: float = field(default_factory=time.monotonic)
    produced: int = 0
    pulls_ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    histogram: HdrHistogram = field(default_factory=lambda: HdrHistogram(1, 120_000_000, 3))
    window: HdrHistogram = field(default_factory=lambda: HdrHistogram(1, 120_000_000, 3))
    successes: list[float] = field(default_factory=list)
    """Monotonic times of successful pulls (for gaps after faults)."""
    failures: list[float] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def percentiles(histogram: HdrHistogram) -> dict[str, float]:
    """p50, p99, p99.9 and max in milliseconds."""
    if histogram.get_total_count() == 0:
        return {"p50_ms": 0.0, "p99_ms": 0.0, "p99_9_ms": 0.0, "max_ms": 0.0}
    return {"p50_ms": histogram.get_value_at_percentile(50) / 1000,
            "p99_ms": histogram.get_value_at_percentile(99) / 1000,
            "p99_9_ms": histogram.get_value_at_percentile(99.9) / 1000,
            "max_ms": histogram.get_max_value() / 1000}


async def ensure_workload(config: Config) -> None:
    """The stream and its averaged table (created once; a rerun reuses them)."""
    async with _channel(config) as channel:
        stub = router_pb2_grpc.RouterServiceStub(channel)
        await stub.Execute(router_pb2.ExecuteRequest(sql=(
            f"CREATE STREAM IF NOT EXISTS {config.stream} (sensor VARCHAR KEY, area VARCHAR, reading INT) "
            f"WITH (kafka_topic='{config.stream}', partitions={config.partitions}, value_format='JSON');"
            f"CREATE TABLE IF NOT EXISTS {config.table} AS SELECT sensor, AVG(reading) AS avg_reading "
            f"FROM {config.stream} GROUP BY sensor;"), properties={"auto.offset.reset": "earliest"}), timeout=120)


def _channel(config: Config) -> grpc.aio.Channel:
    return config.credentials.aio_channel(config.server)


async def produce(config: Config, stats: Stats, stop: asyncio.Event, rng: random.Random,
                  limit: int | None = None, tick_max: int = PRODUCE_TICK_MAX) -> None:
    """Events at the target rate until ``stop`` or ``limit`` events (every key once first,
    then random keys), in ticks of ``PRODUCE_TICK_S`` of at most ``tick_max`` events: each
    tick's events go into one record batch per partition (more when one fills). A send per
    event cost the generator a quarter of a core at 10,000 events/s, taken from the cluster it
    loads when both share a machine; batched, with the values made once, 9%."""
    producer = AIOKafkaProducer(bootstrap_servers=config.kafka, linger_ms=5, max_batch_size=256 * 1024, acks=1)
    await producer.start()
    keys = [f"sensor-{k:05d}".encode() for k in range(config.keys)]
    partitions = {k: partition_for(k, config.partitions) for k in keys}
    values = [[json.dumps({"AREA": area, "READING": reading}).encode() for reading in range(100)] for area in AREAS]
    try:
        n, started = 0, time.monotonic()
        while not stop.is_set() and (limit is None or n < limit):
            due = tick_max if config.events_per_s <= 0 else \
                min(int((time.monotonic() - started) * config.events_per_s) - n, tick_max)
            if limit is not None:
                due = min(due, limit - n)
            batches: dict[int, Any] = {}
            for _ in range(due):
                key = keys[n] if n < len(keys) else keys[rng.randrange(len(keys))]
                value = values[n % len(AREAS)][rng.randrange(0, 100)]
                partition = partitions[key]
                batch = batches.get(partition)
                if batch is None or batch.append(key=key, value=value, timestamp=None) is None:
                    if batch is not None:  # full: sent, and the event goes into a new one
                        await producer.send_batch(batch, config.stream, partition=partition)
                    batch = batches[partition] = producer.create_batch()
                    batch.append(key=key, value=value, timestamp=None)
                n += 1
            for partition, batch in batches.items():
                await producer.send_batch(batch, config.stream, partition=partition)
            stats.produced = n
            await asyncio.sleep(PRODUCE_TICK_S if config.events_per_s > 0 else 0)
        await producer.flush()
    finally:
        await producer.stop()


async def pull(config: Config, stats: Stats, stop: asyncio.Event, choose: Callable[[], str]) -> None:
    """Key lookups from ``pull_concurrency`` concurrent callers until ``stop``."""
    properties = {"ksql.query.pull.enable.standby.reads": "true" if config.standby_reads else "false"}
    per_caller = config.pull_rate / config.pull_concurrency if config.pull_rate > 0 else 0.0

    async def caller(stub: router_pb2_grpc.RouterServiceStub) -> None:
        n, started = 0, time.monotonic()
        while not stop.is_set():
            sql = f"SELECT * FROM {config.table} WHERE sensor = '{choose()}';"
            begun = time.perf_counter_ns()
            try:
                response = await stub.Execute(router_pb2.ExecuteRequest(sql=sql, properties=properties), timeout=15)
                if not response.results[0].rows:
                    raise LookupError("no row")
                micros = max((time.perf_counter_ns() - begun) // 1000, 1)
                stats.histogram.record_value(micros)
                stats.window.record_value(micros)
                stats.pulls_ok += 1
                stats.successes.append(time.monotonic())
            except grpc.aio.AioRpcError as err:
                stats.errors[err.code().name] += 1
                stats.failures.append(time.monotonic())
            except LookupError:
                stats.errors["NO_ROW"] += 1
                stats.failures.append(time.monotonic())
            n += 1
            if per_caller > 0:
                ahead = n / per_caller - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)

    async with _channel(config) as channel:
        stub = router_pb2_grpc.RouterServiceStub(channel)
        await asyncio.gather(*(caller(stub) for _ in range(config.pull_concurrency)))


async def input_ends(config: Config) -> dict[int, int]:
    """The stream's end offset per partition now."""
    return await end_offsets(config.kafka, config.stream, config.partitions)


async def processed(config: Config, query_id: str) -> tuple[dict[int, int], bool]:
    """Per partition the next input offset its active task will process, and whether every
    task is RUNNING on a live worker (from the router's cluster status)."""
    async with _channel(config) as channel:
        status = await router_pb2_grpc.RouterServiceStub(channel).GetClusterStatus(
            router_pb2.GetClusterStatusRequest(), timeout=10)
    offsets: dict[int, int] = {}
    running = True
    for host in status.cluster.hosts:
        if not host.alive:
            continue
        actives = {t.partition for t in host.active_tasks if t.query_id == query_id}
        for task in host.tasks:
            if task.task.query_id == query_id and task.task.partition in actives:
                offsets[task.task.partition] = task.input_offset
                running &= task.state == coordinator_pb2.TASK_STATE_RUNNING
    return offsets, running and len(offsets) == config.partitions


async def actives(config: Config, query_id: str, timeout_s: float = 30.0) -> dict[int, str] | None:
    """Per partition, the live worker whose task of the query is the active (cluster status);
    None when the router does not answer within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            async with _channel(config) as channel:
                status = await router_pb2_grpc.RouterServiceStub(channel).GetClusterStatus(
                    router_pb2.GetClusterStatusRequest(), timeout=10)
            return {t.partition: host.worker_id for host in status.cluster.hosts if host.alive
                    for t in host.active_tasks if t.query_id == query_id}
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.1)
    return None


async def taken_over(config: Config, query_id: str, worker: str, at: float,
                     timeout_s: float = TAKE_OVER_TIMEOUT_S) -> float | None:
    """When ``worker`` took over an active task of the query: the last cluster status answer
    that showed it holding none, before the first that showed one (so a recovery timed from it
    is not made shorter by the polls' interval); None: not within ``timeout_s`` of ``at``."""
    before = at
    while time.monotonic() < at + timeout_s:
        now = await actives(config, query_id, timeout_s=max(at + timeout_s - time.monotonic(), 0.1))
        if now is not None and worker in now.values():
            return before
        before = time.monotonic()
        await asyncio.sleep(0.05)
    return None


@dataclass
class CommitWatch:
    """When each partition of the table's topic received committed records, and when its
    worker produced each transaction's first one (``commits_seen``)."""

    seen: dict[int, list[float]] = field(default_factory=dict)
    produced: dict[int, list[float]] = field(default_factory=dict)
    """Each transaction's first record's timestamp (its producer's clock, this machine's; a
    monotonic time here): the worker's own output cadence, without this process's delays. (The
    loadtest's table is a GROUP BY, whose records take the time they are sent; a windowed
    table's or a join's would carry their input's times instead.)"""
    transactions: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    """Each transaction's first record's timestamp (as ``produced``) with when it was seen
    committed (``first_commit_after``)."""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    error: str | None = None
    next_offset: dict[int, int] = field(default_factory=dict)
    wall_to_monotonic: float = field(default_factory=lambda: time.monotonic() - time.time())

    def fetched(self, partition: int, now: float, records: list[Any]) -> None:
        """Note a fetch's records of ``partition`` (``ConsumerRecord``s in offset order), seen at
        ``now``: a transaction's records are those whose offsets follow on one another (its
        commit marker takes an offset a read_committed consumer skips)."""
        if not records:
            return
        self.seen.setdefault(partition, []).append(now)
        for record in records:
            if self.next_offset.get(partition) != record.offset:
                produced = record.timestamp / 1000 + self.wall_to_monotonic
                self.produced.setdefault(partition, []).append(produced)
                self.transactions.setdefault(partition, []).append((produced, now))
            self.next_offset[partition] = record.offset + 1

    def first_commit_after(self, partitions: list[int], gone_at: float, at: float) -> float | None:
        """Seconds from ``at`` until each of ``partitions`` had a transaction committed that
        was produced after ``gone_at`` (when its old owner could produce no more): its new
        owner processing again, not only holding a position its old owner committed. None when
        one had none in the watch."""
        firsts = [min((seen for produced, seen in self.transactions.get(p, []) if produced > gone_at), default=None)
                  for p in partitions]
        if not firsts or None in firsts:
            return None
        return round(max(t for t in firsts if t is not None) - at, 3)


async def commits_seen(config: Config, stop: asyncio.Event, watch: CommitWatch) -> None:
    """Until ``stop``, when each partition of the table's topic received committed records:
    one time per fetch of a read_committed consumer from the end that brought some; and when
    each transaction's records were produced (``CommitWatch.fetched``). A Kafka error ends the
    watch (said in the report), not the run."""
    topic = config.table.upper()  # a CREATE TABLE AS's topic is its name
    consumer = AIOKafkaConsumer(bootstrap_servers=config.kafka, isolation_level="read_committed",
                                enable_auto_commit=False, fetch_max_wait_ms=20)
    try:
        async with started(consumer):
            tps = [TopicPartition(topic, p) for p in range(config.partitions)]
            consumer.assign(tps)
            await consumer.seek_to_end(*tps)
            watch.started = time.monotonic()
            while not stop.is_set():
                fetched = await consumer.getmany(timeout_ms=100)
                now = time.monotonic()
                for tp, records in fetched.items():
                    watch.fetched(tp.partition, now, records)
    except KafkaError as error:
        watch.error = repr(error)
    finally:
        watch.ended = time.monotonic()


def commit_gaps_report(unmoved: list[int] | None, moved: list[int] | None, at: float, until: float,
                       watch: CommitWatch, since: float = 0.0, before_s: float = 10.0) -> dict[str, Any]:
    """For the partitions whose active did not move: the longest time one went without a
    commit reaching the table's topic, from its last commit before the fault (or the start of
    the watch) to ``until`` (or the end of the watch), a partition that stalled included; as
    its baseline, the longest and the median time between its commits in the ``before_s``
    before the fault (from ``since`` on: not into an earlier fault's watch), and the median and
    90th percentile of the times between its commits before and after the fault (so a longest
    gap can be told from a slower cadence). For the partitions that moved, the longest time one
    went without a commit the same way: the whole pause the move cost them, a second move
    within the watch included. The same again by when the worker produced each transaction
    (``output_`` keys)."""
    report: dict[str, Any] = {"unmoved_partitions": unmoved, "moved_partitions": moved}
    end = min(until, watch.ended if watch.ended is not None else until)
    if end < until:
        report["unmoved_watch_cut_short_s"] = round(until - end, 3)
    if watch.error is not None:
        report["commit_watch_error"] = watch.error
    baseline_from = max(at - before_s, since, watch.started)

    def longest(times: list[float]) -> tuple[float, float, list[float]]:
        """A partition's longest gap across the fault, its last commit before it, its commits after."""
        last = max((t for t in times if t < at), default=watch.started)
        after = [t for t in times if at <= t <= end]
        return _longest_gap([*after, end], last) or 0.0, last, after

    for name, seen in (("commit", watch.seen), ("output", watch.produced)):
        during, earlier, intervals, intervals_after = [], [], [], []
        for p in unmoved or []:
            times = seen.get(p, [])
            gap, last, after = longest(times)
            during.append(gap)
            intervals_after += [b - a for a, b in itertools.pairwise([last, *after])]
            before = [t for t in times if baseline_from <= t < at]
            if len(before) > 1:
                earlier.append(_longest_gap(before[1:], before[0]) or 0.0)
                intervals += [b - a for a, b in itertools.pairwise(before)]
        moved_gaps = [longest(seen.get(p, []))[0] for p in moved or []]
        report |= {f"unmoved_longest_{name}_gap_s": round(max(during), 3) if during else None,
                   f"unmoved_longest_{name}_gap_before_s": round(max(earlier), 3) if earlier else None,
                   f"{name}_interval_before_p50_s": _quantile(intervals, 0.5),
                   f"{name}_interval_before_p90_s": _quantile(intervals, 0.9),
                   f"{name}_interval_after_p50_s": _quantile(intervals_after, 0.5),
                   f"{name}_interval_after_p90_s": _quantile(intervals_after, 0.9),
                   f"moved_longest_{name}_gap_s": round(max(moved_gaps), 3) if moved_gaps else None}
    return report


def processing_again(back: float | None, moved: list[int] | None, gone_at: float | None, at: float,
                     watch: CommitWatch) -> dict[str, float | None]:
    """When the moved partitions' new owners first committed output of their own
    (``moved_first_commit_s``), and so when the moved partitions were processing again
    (``processing_again_s``): the later of that and ``processing_back_s`` (the input that
    existed at the fault processed). ``processing_back_s`` alone is met as soon as the new
    owners hold the position their old owner committed, which its last batch may have taken
    past that input before it went. An add's old owner may commit once more after the move,
    which its output does not tell apart from the new owner's: there ``processing_back_s``."""
    if not moved or gone_at is None:  # nothing moved, an add, or a leave not seen: ``processing_back_s``
        return {"moved_first_commit_s": None, "processing_again_s": back}
    first = watch.first_commit_after(moved, gone_at, at)
    return {"moved_first_commit_s": first, "processing_again_s": None if back is None or first is None else max(back, first)}


def _quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``values``, interpolated (at 0.5 the median), rounded; None if none."""
    if len(values) < 2:
        return round(values[0], 3) if values else None
    return round(statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1], 3)


async def query_id_of(config: Config) -> str:
    """The id of the query that computes the table (from SHOW QUERIES)."""
    async with _channel(config) as channel:
        response = await router_pb2_grpc.RouterServiceStub(channel).Execute(
            router_pb2.ExecuteRequest(sql="SHOW QUERIES;"), timeout=30)
    (result,) = response.results
    names = [c.name for c in result.columns]
    for row in result.rows:
        values = dict(zip(names, (v.string_value for v in row.values), strict=True))
        if values["SINK"] == config.table.upper():
            return str(values["QUERY_ID"])
    raise MillpondError(f"no query writes {config.table}")


async def recovery(config: Config, query_id: str, fault_at: float, ends: dict[int, int], stats: Stats,
                   timeout_s: float = 120.0) -> float | None:
    """Seconds from the fault until every partition's active processed the input that existed
    at the fault (None if not within ``timeout_s``)."""
    deadline = fault_at + timeout_s
    while time.monotonic() < deadline:
        try:
            offsets, running = await processed(config, query_id)
            if running and all(offsets.get(p, -1) >= end for p, end in ends.items()):
                return time.monotonic() - fault_at
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.05)
    return None


async def detection(config: Config, worker: str, at: float, timeout_s: float = 60.0) -> dict[str, float | None]:
    """Seconds from the fault until the coordinator, and the router's own failure detector,
    had ``worker`` dead (None: not within ``timeout_s``)."""
    seen: dict[str, float | None] = {"coordinator_detected_s": None, "router_detected_s": None}
    while time.monotonic() < at + timeout_s and None in seen.values():
        try:
            async with _channel(config) as channel:
                status = await router_pb2_grpc.RouterServiceStub(channel).GetClusterStatus(
                    router_pb2.GetClusterStatusRequest(), timeout=5)
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.02)
            continue
        now = time.monotonic() - at
        host = next((h for h in status.cluster.hosts if h.worker_id == worker), None)
        if seen["coordinator_detected_s"] is None and (host is None or not host.alive):
            seen["coordinator_detected_s"] = round(now, 3)
        view = next((h for h in status.router_hosts if h.worker_id == worker), None)
        if seen["router_detected_s"] is None and (view is None or not view.alive):
            seen["router_detected_s"] = round(now, 3)
        await asyncio.sleep(0.02)
    return seen


def _longest_gap(times: list[float], start: float) -> float | None:
    gaps, last = [], start
    for t in times:
        gaps.append(t - last)
        last = t
    return round(max(gaps), 3) if gaps else None


def fault_report(fault: Fault, at: float, stats: Stats, back: float | None) -> dict[str, Any]:
    """Pull errors after the fault, the longest gap between successful pulls that spans it
    (and, as its baseline, the longest gap before the fault), and the recovery time."""
    after = [t for t in stats.failures if t >= at]
    before = [t for t in stats.successes if t < at]
    return {"fault": str(fault),
            "failed_pulls_after": len(after),
            "pulls_back_s": round(max(after) - at, 3) if after else 0.0,
            "longest_pull_gap_s": _longest_gap([t for t in stats.successes if t >= at], before[-1] if before else at),
            "longest_pull_gap_before_s": _longest_gap(before[1:], before[0]) if before else None,
            "processing_back_s": None if back is None else round(back, 3)}


async def run(config: Config, cluster: LocalCluster | None = None, console: Console | None = None) -> dict[str, Any]:
    """Run one load test; the JSON summary."""
    if config.faults and cluster is None:
        raise MillpondError("faults need a cluster the harness started (--local)")
    rng = random.Random(config.seed)
    await ensure_workload(config)
    query_id = await query_id_of(config)
    # Warm up: one event per key, processed, so every pull has a row before the clock starts.
    warm = Stats()
    await produce(Config(**{**config.__dict__, "events_per_s": 0.0}), warm, asyncio.Event(), rng, limit=config.keys)
    if await recovery(config, query_id, time.monotonic(), await input_ends(config), warm, WARM_UP_TIMEOUT_S) is None:
        raise MillpondError(f"the table {config.table} did not catch up with the warm-up events in "
                            f"{WARM_UP_TIMEOUT_S:.0f} s; see the workers' logs")
    stats = Stats()
    stop = asyncio.Event()
    jobs = [asyncio.create_task(produce(config, stats, stop, rng)),
            asyncio.create_task(pull(config, stats, stop, key_chooser(config.keys, config.distribution, rng)))]
    reports: list[asyncio.Task[dict[str, Any]]] = []

    commits = CommitWatch()
    jobs.append(asyncio.create_task(commits_seen(config, stop, commits)))

    loop = asyncio.get_running_loop()
    finished: list[asyncio.Future[float]] = [loop.create_future() for _ in config.faults]
    """When each fault finished (its moved partitions processed the input that existed at it)."""

    def finish(index: int) -> None:
        if not finished[index].done():
            finished[index].set_result(time.monotonic())

    async def inject(index: int, fault: Fault) -> dict[str, Any]:
        try:
            return await injected(index, fault)
        finally:  # a fault that failed does not hold up the one after it
            finish(index)

    async def injected(index: int, fault: Fault) -> dict[str, Any]:
        previous = await finished[index - 1] if fault.after_previous and index > 0 else stats.started
        await asyncio.sleep(max(fault.due(stats.started, previous) - time.monotonic(), 0))
        ends = await input_ends(config)
        owners = await actives(config, query_id)
        at = time.monotonic()
        assert cluster is not None
        # Watched from the fault on: a stopping worker leaves at once but takes seconds to exit.
        watch = detection(config, fault.target, at) if fault.action in ("kill", "stop") else None
        detected = asyncio.create_task(watch) if watch is not None else None
        moved: dict[str, Any] = {}
        # When the moved partitions' old owner could produce no more (``processing_again``): after a
        # kill, once it is dead; after a stop, once it left (below); after an add, not known here
        # (the old owner's last batch may commit after the move).
        gone_at: float | None = None
        if fault.action == "kill":
            await asyncio.to_thread(cluster.kill, fault.target)
            gone_at = time.monotonic()
        elif fault.action == "stop":
            await asyncio.to_thread(cluster.terminate, fault.target)
        elif fault.action == "restart":
            await asyncio.to_thread(cluster.restart, fault.target)
            gone_at = time.monotonic()
        else:
            added = (await asyncio.to_thread(cluster.add_worker, False)).name
            # Partitions move to the new worker once its warm-up copies caught up (KIP-441): what
            # is measured from then on is that handoff, not the new worker's start.
            took_over = await taken_over(config, query_id, added, at)
            moved = {"added_worker": added, "took_over_s": None if took_over is None else round(took_over - at, 3)}
            if took_over is not None:
                ends, at = await input_ends(config), took_over
        back = await recovery(config, query_id, at, ends, stats)
        finish(index)
        now = await actives(config, query_id)
        unmoved = moved_away = None
        if owners is not None and now is not None:
            unmoved = sorted(p for p, worker in owners.items() if now.get(p) == worker and worker != fault.target)
            moved_away = sorted(p for p, worker in owners.items() if now.get(p) != worker or worker == fault.target)
        until = at + (back if back is not None else 10.0) + WATCH_AFTER_S
        await asyncio.sleep(max(until - time.monotonic(), 0))  # the load runs on while the commits are watched
        seen = await detected if detected is not None else {}
        if fault.action == "stop" and (left := seen.get("coordinator_detected_s")) is not None:
            gone_at = at + left  # it leaves once its Spark queries stopped
        return {**fault_report(fault, at, stats, back), **moved, **seen, "_watched": (unmoved, moved_away, at, until, gone_at)}

    reports = [asyncio.create_task(inject(i, f)) for i, f in enumerate(config.faults)]
    last_produced, last_ok, last_t = 0, 0, time.monotonic()
    with Live(console=console or Console(stderr=True), refresh_per_second=2, transient=True) as live:
        while stats.elapsed() < config.duration_s or not all(r.done() for r in reports):
            await asyncio.sleep(1.0)
            now = time.monotonic()
            span = now - last_t
            view = Table("elapsed", "events/s", "pulls/s", "p50 ms", "p99 ms", "errors")
            window = percentiles(stats.window)
            view.add_row(f"{stats.elapsed():.0f}s", f"{(stats.produced - last_produced) / span:.0f}",
                         f"{(stats.pulls_ok - last_ok) / span:.0f}", f"{window['p50_ms']:.2f}",
                         f"{window['p99_ms']:.2f}", str(dict(stats.errors)) if stats.errors else "0")
            live.update(view)
            stats.window.reset()
            last_produced, last_ok, last_t = stats.produced, stats.pulls_ok, now
    stop.set()
    await asyncio.gather(*jobs)
    faults = [await r for r in reports]
    since = 0.0
    for report in sorted(faults, key=lambda r: r["_watched"][2]):  # in the order they happened
        unmoved, moved_away, at, until, gone_at = report.pop("_watched")
        report.update(commit_gaps_report(unmoved, moved_away, at, until, commits, since))
        report.update(processing_again(report["processing_back_s"], moved_away, gone_at, at, commits))
        since = until
    elapsed = stats.elapsed()
    return {
        "duration_s": round(elapsed, 2), "keys": config.keys, "distribution": config.distribution,
        "events_produced": stats.produced, "events_per_s": round(stats.produced / elapsed, 1),
        "target_events_per_s": config.events_per_s,
        "pulls_ok": stats.pulls_ok, "pulls_per_s": round(stats.pulls_ok / elapsed, 1),
        "pull_concurrency": config.pull_concurrency, "target_pulls_per_s": config.pull_rate,
        "latency": percentiles(stats.histogram),
        "errors": dict(stats.errors), "faults": faults,
    }
