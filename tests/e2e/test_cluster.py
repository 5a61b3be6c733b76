"""The cluster under membership changes, on real Kafka, Spark, RocksDB and gRPC: three workers
with one standby per table partition and two coordinators. While events flow and a client
pulls continuously, a worker is SIGKILLed, a fourth worker joins, a worker leaves gracefully
and the leading coordinator is killed; after each step the table is exact key by key.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from millpond.cli.client import RouterClient
from millpond.cli.status import leader_status, status_outcome
from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.deploy.local.kafka_broker import EmbeddedKafka
from millpond.deploy.local.launcher import LocalCluster
from millpond.shared.net import free_port
from millpond.shared.rpc.converters import task_report_from_proto
from millpond.shared.task_status import RUNNING, TaskReport
from tests.e2e.helpers import log_entries
from tests.e2e.workload import (
    PARTITIONS,
    Expected,
    check_table,
    create_table,
    end_offsets,
    produce,
    readings,
    table_rows,
)

KEYS = 400
RECOVERY_LAG = 2_000
TIMEOUT_S = 240
Task = tuple[str, int]


@pytest.fixture(scope="module")
def ha_cluster(kafka: EmbeddedKafka, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(data_dir=Path(tmp_path_factory.mktemp("ha")), workers=3, coordinators=2,
                         kafka=kafka.bootstrap_servers, router_port=free_port(), service_id=f"ha{os.getpid()}",
                         spark_master="local[1]",
                         worker_env={"MILLPOND_MAX_OFFSETS_PER_TRIGGER": "5000"},
                         coordinator_env={"MILLPOND_LEADER_SESSION_TIMEOUT_MS": "1500",
                                          "MILLPOND_NUM_STANDBY_REPLICAS": "1",
                                          "MILLPOND_ACCEPTABLE_RECOVERY_LAG": str(RECOVERY_LAG)},
                         router_env={"MILLPOND_ENABLE_STANDBY_READS": "true"})
    local.start()
    yield local
    local.stop()


def cluster_status(cluster: LocalCluster) -> coordinator_pb2.GetClusterStatusResponse:
    """The leading coordinator's view (waits while no coordinator leads)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for child in cluster.children:
            if not child.name.startswith("coordinator") or child.process.poll() is not None:
                continue
            with grpc.insecure_channel(child.endpoint) as channel:
                try:
                    reply: coordinator_pb2.GetClusterStatusResponse = coordinator_pb2_grpc.CoordinatorServiceStub(
                        channel).GetClusterStatus(coordinator_pb2.GetClusterStatusRequest(), timeout=5)
                except grpc.RpcError:
                    continue
            if reply.leader:
                return reply
        time.sleep(0.05)
    raise AssertionError("no coordinator leads")


def roles(status: coordinator_pb2.GetClusterStatusResponse, query_id: str) -> dict[str, dict[str, set[int]]]:
    """Per live worker: the partitions of ``query_id`` it holds as active, standby and warm-up."""
    def of(tasks: list[coordinator_pb2.TaskId]) -> set[int]:
        return {t.partition for t in tasks if t.query_id == query_id}

    return {h.worker_id: {"active": of(h.active_tasks), "standby": of(h.standby_tasks), "warmup": of(h.warmup_tasks)}
            for h in status.hosts if h.alive}


def actives(status: coordinator_pb2.GetClusterStatusResponse, query_id: str) -> dict[int, str]:
    return {p: w for w, r in roles(status, query_id).items() for p in r["active"]}


def running_reports(status: coordinator_pb2.GetClusterStatusResponse, query_id: str) -> dict[int, TaskReport]:
    """The active tasks of ``query_id`` that their assigned worker reports RUNNING."""
    assigned = actives(status, query_id)
    out = {}
    for host in status.hosts:
        for t in host.tasks:
            report = task_report_from_proto(host.worker_id, t)
            if report.query_id == query_id and assigned.get(report.partition) == host.worker_id and report.state == RUNNING:
                out[report.partition] = report
    return out


def settled_actives(cluster: LocalCluster, query_id: str) -> set[tuple[str, int]]:
    """The (worker, partition) actives of ``query_id`` once no move is under way: no warm-up
    copy anywhere (the coordinator moves a partition only to a caught-up warm-up), the actives
    balanced (a move held back until its target's standby copy catches up, or while the
    partition settles after a move, leaves them unbalanced: the assignor's target never is),
    and each partition RUNNING on the worker it is assigned to. Taken before a move is planned,
    a hand-off already in flight would count as a restart of a partition that did not move."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        status = cluster_status(cluster)
        layout = roles(status, query_id)
        counts = [len(r["active"]) for r in layout.values()]
        if not any(r["warmup"] for r in layout.values()) and max(counts) - min(counts) <= 1 \
                and set(running_reports(status, query_id)) == set(range(PARTITIONS)):
            return {(w, p) for w, r in layout.items() for p in r["active"]}
        time.sleep(0.2)
    raise AssertionError(f"{query_id} never settled: {roles(cluster_status(cluster), query_id)}")


def wait_caught_up(cluster: LocalCluster, query_id: str, ends: dict[int, int]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        reports = running_reports(cluster_status(cluster), query_id)
        if all(p in reports and reports[p].input_offset >= ends[p] for p in range(PARTITIONS)):
            return
        time.sleep(0.2)
    raise AssertionError(f"{query_id} did not catch up with {ends}")


@dataclass
class PullLoad:
    """A client pulling random keys through the router until stopped."""

    cluster: LocalCluster
    table: str
    keys: list[str]
    ok: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    longest_gap_s: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> PullLoad:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(60)

    def _run(self) -> None:
        client = RouterClient(self.cluster.router, timeout=15)
        rng = random.Random(3)
        last_ok = time.monotonic()
        try:
            while not self._stop.is_set():
                key = rng.choice(self.keys)
                try:
                    (outcome,) = client.execute(f"SELECT * FROM {self.table} WHERE sensor = '{key}';")
                    if len(outcome.rows) != 1:  # every key pulled has a row
                        self.failures[f"{len(outcome.rows)} rows for {key}"] += 1
                        continue
                    now = time.monotonic()
                    self.longest_gap_s, last_ok = max(self.longest_gap_s, now - last_ok), now
                    self.ok += 1
                except grpc.RpcError as err:
                    self.failures[f"{err.code()}: {err.details()}"] += 1
        finally:
            client.close()


def first_starts(log: Path, query_id: str) -> dict[tuple[str, int], int]:
    """Position in the log of the first "standby started" / "task started" per partition of a query."""
    out: dict[tuple[str, int], int] = {}
    for n, entry in enumerate(log_entries(log)):
        if entry.get("msg") in ("standby started", "task started") and entry.get("query") == query_id:
            out.setdefault((entry["msg"], entry["partition"]), n)
    return out


def task_starts(cluster: LocalCluster, query_id: str) -> Counter[tuple[str, int]]:
    """How many times each (worker, partition) task of a query started, from the live workers' logs."""
    out: Counter[tuple[str, int]] = Counter()
    for child in cluster.children:
        if child.name.startswith("worker") and child.process.poll() is None:
            for entry in log_entries(child.log):
                if entry.get("msg") == "task started" and entry.get("query") == query_id:
                    out[child.name, entry["partition"]] += 1
    return out


class CommitWatch:
    """Samples each partition's committed input offset (its active's report) in the
    background; ``longest_stall_s[p]``: the longest time partition p's offset stood still
    while ``owner`` stayed its active and input was waiting."""

    def __init__(self, cluster: LocalCluster, query_id: str, stream: str):
        self.cluster, self.query_id, self.stream = cluster, query_id, stream
        self.longest_stall_s: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CommitWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        asyncio.run(self._watch())

    async def _watch(self) -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.cluster.bootstrap, isolation_level="read_committed")
        await consumer.start()
        try:
            inputs = [TopicPartition(self.stream, p) for p in range(PARTITIONS)]
            since: dict[int, tuple[str, int, float]] = {}
            while not self._stop.is_set():
                status = await asyncio.to_thread(cluster_status, self.cluster)
                ends = {tp.partition: end for tp, end in (await consumer.end_offsets(inputs)).items()}
                now = time.monotonic()
                for p, report in running_reports(status, self.query_id).items():
                    owner, offset = report.worker_id, report.input_offset
                    last = since.get(p)
                    if last is None or last[0] != owner or last[1] != offset or offset >= ends.get(p, 0):
                        since[p] = (owner, offset, now)
                    else:
                        self.longest_stall_s[p] = max(self.longest_stall_s.get(p, 0.0), now - last[2])
                await asyncio.sleep(0.1)
        finally:
            await consumer.stop()


def assert_unmoved_kept_running(before: Counter[tuple[str, int]], after: Counter[tuple[str, int]],
                                kept: set[tuple[str, int]]) -> None:
    """Partitions that stayed on their worker through a reassignment were not restarted."""
    assert kept, "the reassignment moved every partition: nothing to check"
    restarted = {wp: (before[wp], after[wp]) for wp in kept if after[wp] != before[wp]}
    assert not restarted, f"unmoved partitions restarted (task starts before, after): {restarted}"


def produce_more(cluster: LocalCluster, stream: str, rng: random.Random, count: int, expected: Expected) -> threading.Thread:
    """Send ``count`` more events in the background."""
    events = readings(rng, count, KEYS, expected)
    thread = threading.Thread(target=lambda: asyncio.run(produce(cluster.bootstrap, stream, events)), daemon=True)
    thread.start()
    return thread


async def stream_ends(cluster: LocalCluster, stream: str) -> dict[int, int]:
    return await end_offsets(cluster.bootstrap, stream)


def test_failover_scale_out_scale_in_and_coordinator_failover(ha_cluster: LocalCluster) -> None:
    cluster = ha_cluster
    stream, table = f"ha_{cluster.service_id}", f"ha_stats_{cluster.service_id}"
    rng = random.Random(11)
    expected = Expected()
    query_id = create_table(cluster, stream, table)
    asyncio.run(produce(cluster.bootstrap, stream, readings(rng, 6_000, KEYS, expected)))
    wait_caught_up(cluster, query_id, asyncio.run(stream_ends(cluster, stream)))
    check_table(table_rows(cluster, table), expected)
    keys = sorted(expected.count)

    # Every partition has an active and one standby elsewhere, and the standbys keep up.
    status = cluster_status(cluster)
    layout = roles(status, query_id)
    for p in range(PARTITIONS):
        (holder,) = [w for w, r in layout.items() if p in r["active"]]
        standbys = [w for w, r in layout.items() if p in r["standby"]]
        assert len(standbys) == 1 and standbys[0] != holder, layout
    assert sorted(len(r["active"]) for r in layout.values()) == [1, 1, 2], layout

    # 1. SIGKILL the worker with two actives while events flow.
    victim = max(layout, key=lambda w: len(layout[w]["active"]))
    moved = layout[victim]["active"]
    with PullLoad(cluster, table, keys) as load:
        producer = produce_more(cluster, stream, rng, 12_000, expected)
        time.sleep(2)
        killed_at = time.monotonic()
        cluster.kill(victim)
        detected = reassigned = resumed = None
        deadline = killed_at + 60
        while resumed is None and time.monotonic() < deadline:
            status = cluster_status(cluster)
            now = time.monotonic() - killed_at
            hosts = {h.worker_id: h.alive for h in status.hosts}
            if detected is None and not hosts.get(victim, False):
                detected = now
            owners = actives(status, query_id)
            if reassigned is None and all(owners.get(p) not in (None, victim) for p in moved):
                reassigned = now
            if reassigned is not None and set(moved) <= set(running_reports(status, query_id)):
                resumed = now
            time.sleep(0.02)
        producer.join(120)
        wait_caught_up(cluster, query_id, asyncio.run(stream_ends(cluster, stream)))
    print(f"\nkill: detected {detected}s, reassigned {reassigned}s, moved tasks running {resumed}s; "
          f"pulls ok {load.ok}, failed {dict(load.failures)}, longest gap {load.longest_gap_s:.2f}s")
    assert reassigned is not None and reassigned < 2.0, f"tasks active elsewhere after {reassigned}s"
    assert resumed is not None
    assert not load.failures and load.ok > 0
    check_table(table_rows(cluster, table), expected)
    # What `millpond status` shows: the dead worker, and the others holding every partition.
    shown = {row[0]: row for row in status_outcome(leader_status(cluster.coordinator_endpoints.split(","))).rows}
    assert shown[victim][2:5:2] == [False, "-"], shown[victim]
    assert all(shown[w][2] for w in shown if w != victim)

    # 2. A fourth worker joins while events flow: it gets warm-ups first, an active only once
    # caught up, and pulls never fail; the partitions that stay where they are go on
    # without a restart.
    held = settled_actives(cluster, query_id)
    starts = task_starts(cluster, query_id)
    with PullLoad(cluster, table, keys) as load, CommitWatch(cluster, query_id, stream) as commits:
        producer = produce_more(cluster, stream, rng, 6_000, expected)
        newcomer = cluster.add_worker().name
        warmed: set[int] = set()
        took: set[int] = set()
        deadline = time.monotonic() + TIMEOUT_S
        while not took and time.monotonic() < deadline:
            mine = roles(cluster_status(cluster), query_id).get(newcomer)
            if mine is not None:
                took = mine["active"]
                warmed |= mine["warmup"] | mine["standby"]
            time.sleep(0.02)
        assert took, f"{newcomer} never took an active task"
        # A warm-up can catch up between two status polls, so the order comes from the
        # newcomer's own log: each partition it took was replayed as a copy first.
        started = first_starts(cluster.child(newcomer).log, query_id)
        for p in took:
            assert ("standby started", p) in started, f"{newcomer} took partition {p} without warming it up"
            assert started[("standby started", p)] < started.get(("task started", p), float("inf")), started
        producer.join(120)
        wait_caught_up(cluster, query_id, asyncio.run(stream_ends(cluster, stream)))
    kept = held & {(w, p) for w, r in roles(cluster_status(cluster), query_id).items() for p in r["active"]}
    print(f"scale-out: {newcomer} warmed {sorted(warmed)} then took {sorted(took)}; pulls ok {load.ok}, "
          f"failed {dict(load.failures)}, longest gap {load.longest_gap_s:.2f}s; longest commit stall of the "
          f"unmoved partitions {max((commits.longest_stall_s.get(p, 0.0) for _, p in kept), default=0.0):.2f}s")
    assert not load.failures and load.ok > 0
    assert_unmoved_kept_running(starts, task_starts(cluster, query_id), kept)
    check_table(table_rows(cluster, table), expected)

    # 3. A worker leaves gracefully: its actives go to caught-up standbys, pulls never fail.
    settled = settled_actives(cluster, query_id)
    leaver = next(w for w, _ in sorted(settled) if w != newcomer)
    held = {(w, p) for w, p in settled if w != leaver}
    starts = task_starts(cluster, query_id)
    with PullLoad(cluster, table, keys) as load, CommitWatch(cluster, query_id, stream) as commits:
        producer = produce_more(cluster, stream, rng, 5_000, expected)
        left_at = time.monotonic()
        cluster.terminate(leaver)
        stopped = time.monotonic() - left_at
        producer.join(120)
        wait_caught_up(cluster, query_id, asyncio.run(stream_ends(cluster, stream)))
    kept = held & {(w, p) for w, r in roles(cluster_status(cluster), query_id).items() for p in r["active"]}
    print(f"scale-in: {leaver} stopped in {stopped:.2f}s; pulls ok {load.ok}, failed {dict(load.failures)}, "
          f"longest gap {load.longest_gap_s:.2f}s; longest commit stall of the unmoved partitions "
          f"{max((commits.longest_stall_s.get(p, 0.0) for _, p in kept), default=0.0):.2f}s")
    assert leaver not in roles(cluster_status(cluster), query_id)
    # As a Kafka Streams app closes: the leaver's Spark queries stopped (their last commits
    # made) before it left, so its partitions' new owners resumed from final positions.
    assert [e.get("queries_stopped") for e in log_entries(cluster.child(leaver).log)
            if e.get("msg") == "leaving the cluster"] == [True]
    # Before that, it asked the workers keeping standby copies of its actives to have their
    # Spark queries standing by (each table partition has a copy elsewhere).
    (handed,) = [e for e in log_entries(cluster.child(leaver).log) if e.get("msg") == "handed over"]
    leaving = {(query_id, p) for w, p in settled if w == leaver}
    assert leaving and leaving <= {tuple(key) for key in handed["asked"]}, handed
    assert not load.failures and load.ok > 0
    assert_unmoved_kept_running(starts, task_starts(cluster, query_id), kept)
    check_table(table_rows(cluster, table), expected)

    # 4. Kill the leading coordinator: the other leads, keeps every task where it was, and
    # processing goes on meanwhile. (Taken once no move is under way: a partition the leave
    # moved stays on its new worker a few seconds before the balance may move it on.)
    settled_actives(cluster, query_id)
    before = cluster_status(cluster)
    leader = next(c.name for c in cluster.children if c.name.startswith("coordinator")
                  and c.name == before.coordinator_id)
    placed = actives(before, query_id)
    killed_at = time.monotonic()
    cluster.kill(leader)
    producer = produce_more(cluster, stream, rng, 5_000, expected)
    after = cluster_status(cluster)
    takeover = time.monotonic() - killed_at
    print(f"coordinator failover: {after.coordinator_id} leads {takeover:.2f}s after {leader} was killed")
    assert after.coordinator_id != leader
    assert after.generation > before.generation
    assert actives(after, query_id) == placed
    producer.join(120)
    wait_caught_up(cluster, query_id, asyncio.run(stream_ends(cluster, stream)))
    check_table(table_rows(cluster, table), expected)
