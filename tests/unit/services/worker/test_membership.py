"""The worker's membership: what it offers the coordinator's assignor while its Spark
session starts (a restarted worker takes no active before it could run it: the soak's
restarted worker held two partitions for 56 s while its Spark session started), and its
beats to coordinators and routers over real loopback gRPC, on streams or, to peers of an
earlier version, by unary calls."""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.router.v1 import router_internal_pb2, router_internal_pb2_grpc
from millpond.services.coordinator.assignor import AssignorConfig, QueryTasks
from millpond.services.coordinator.cluster import Cluster
from millpond.services.coordinator.rebalancer import Changes
from millpond.services.coordinator.servicer import CoordinatorServicer
from millpond.services.router.hosts import HostTable
from millpond.services.router.servicer import RouterInternalServicer
from millpond.services.worker import membership
from millpond.services.worker.membership import MembershipAgent, offered_lags
from millpond.services.worker.servicer import WorkerServicer
from millpond.shared.rpc.tls import ChannelFactory
from millpond.shared.task_status import RUNNING, STOPPING, StoreLag, TaskReport
from millpond.worker.v1 import worker_pb2_grpc


def beat(cluster: Cluster, worker: str, active: list[int], caught_up: list[int], spark_ready: bool = True) -> None:
    reports = [TaskReport("Q", p, RUNNING, worker_id=worker) for p in active]
    lags = [StoreLag("Q", p, True, 10, 10) for p in active] + [StoreLag("Q", p, False, 10, 10) for p in caught_up]
    cluster.beat(worker, f"{worker}:1", reports, offered_lags(lags, spark_ready))


def test_a_worker_whose_spark_starts_is_offered_no_active_until_it_started() -> None:
    cluster = Cluster(0.2, AssignorConfig(num_standby_replicas=1), clock=lambda: 100.0, wall_ms=lambda: 100_000)
    beat(cluster, "w1", active=[0, 1, 2], caught_up=[3, 4, 5])
    beat(cluster, "w2", active=[3, 4, 5], caught_up=[0, 1, 2])
    cluster.lead(1)
    queries = [QueryTasks("Q", 6)]
    cluster.reassign(queries)
    # w3 comes back with copies it restored (caught up), its Spark session still starting.
    beat(cluster, "w3", active=[], caught_up=[0, 3], spark_ready=False)
    cluster.reassign(queries)
    assert cluster.assignment.tasks_of("w3").active == ()
    assert len(cluster.assignment.pending) == 2  # held back where they run while w3 warms up
    beat(cluster, "w3", active=[], caught_up=[0, 3], spark_ready=True)
    cluster.reassign(queries)
    assert len(cluster.assignment.tasks_of("w3").active) == 2


def test_actives_are_always_offered() -> None:
    lags = [StoreLag("Q", 0, True, 10, 10), StoreLag("Q", 1, False, 10, 10)]
    assert offered_lags(lags, spark_ready=False) == lags[:1] and offered_lags(lags, spark_ready=True) == lags


def test_a_beat_is_made_anew_only_when_what_it_says_changed() -> None:
    reports, lags = (TaskReport("Q", 0, RUNNING, worker_id="w1"),), (StoreLag("Q", 0, True, 7, 9),)
    beat = membership.coordinator_beat("w1", "w1:1", 3, reports, lags)
    # Equal content read again (other objects): the same message, not converted again.
    assert membership.coordinator_beat("w1", "w1:1", 3, (TaskReport("Q", 0, RUNNING, worker_id="w1"),),
                                       (StoreLag("Q", 0, True, 7, 9),)) is beat
    assert (beat.known_generation, beat.tasks[0].worker_id, beat.lags[0].lag) == (3, "w1", 2)
    moved = membership.coordinator_beat("w1", "w1:1", 3, reports, (StoreLag("Q", 0, True, 9, 9),))
    assert moved is not beat and (moved.lags[0].current_offset, moved.lags[0].lag) == (9, 0)
    assert membership.coordinator_beat("w1", "w1:1", 4, reports, lags).known_generation == 4
    assert membership.coordinator_beat("w1", "w1:2", 4, reports, lags).endpoint == "w1:2"
    assert membership.coordinator_beat("w1", "w1:2", 4, (), lags).tasks == []
    stopping = membership.coordinator_beat("w1", "w1:1", 3, (*reports, TaskReport("Q", 1, STOPPING, worker_id="w1")), lags)
    assert [t.task.partition for t in stopping.tasks] == [0] and [t.task.partition for t in stopping.stopping_tasks] == [1]
    report = membership.router_report("w1", "w1:1", lags)
    assert membership.router_report("w1", "w1:1", (StoreLag("Q", 0, True, 7, 9),)) is report
    assert membership.router_report("w1", "w1:1", (StoreLag("Q", 0, False, 7, 9),)).lags[0].active is False
    # A stream sends each beat in a wrapper of its own: marking the last one leaves the kept message as it is.
    last = coordinator_pb2.HeartbeatsRequest(beat=membership.coordinator_beat("w1", "w1:1", 3, reports, lags), last=True)
    last.beat.known_generation = 99
    assert membership.coordinator_beat("w1", "w1:1", 3, reports, lags).known_generation == 3


class FakeTasks:
    """What the membership agent reads and feeds: a worker's tasks."""

    def __init__(self) -> None:
        self.generation = 0
        self.taken: list[tuple[int, dict[str, set[int]], set[tuple[str, int]]]] = []
        self.spark = SimpleNamespace(ready=True, session="spark")

    def takes_over(self) -> bool:
        return bool(self.spark.ready)

    def task_reports(self) -> list[TaskReport]:
        return [TaskReport("Q", 0, RUNNING, worker_id="w1")] if self.generation else []

    def store_lags(self) -> list[StoreLag]:
        return [StoreLag("Q", 0, True, 7, 9)]

    def take(self, generation: int, wanted: dict[str, set[int]], standbys: set[tuple[str, int]],
             workers: frozenset[str] | None = None) -> None:
        self.generation = generation
        self.taken.append((generation, wanted, standbys))
        self.workers = workers


class ClusterMembers:
    """The coordinator's member table, over a real ``Cluster`` that leads and assigns."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.beats = 0

    def heartbeat(self, worker_id: str, endpoint: str, reports: list[TaskReport], lags: list[StoreLag]) -> None:
        self.beats += 1
        if self.cluster.beat(worker_id, endpoint, reports, lags):
            self.cluster.reassign([QueryTasks("Q", 1)])

    def leave(self, worker_id: str) -> None:
        self.cluster.remove(worker_id)

    def disconnected(self, worker_id: str) -> None:
        self.cluster.membership.disconnected(worker_id)


class Methods(grpc.aio.ServerInterceptor):
    """Records the methods a server is called with."""

    def __init__(self) -> None:
        self.called: list[str] = []

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        self.called.append(details.method)
        return await continuation(details)


def unary_only(coordinator: CoordinatorServicer, router: RouterInternalServicer) -> list[grpc.GenericRpcHandler]:
    """The two services as servers of an earlier version have them: without the beat streams."""
    return [
        grpc.method_handlers_generic_handler("millpond.coordinator.v1.CoordinatorService", {
            "Heartbeat": grpc.unary_unary_rpc_method_handler(
                coordinator.Heartbeat, coordinator_pb2.HeartbeatRequest.FromString,
                coordinator_pb2.HeartbeatResponse.SerializeToString),
            "Leave": grpc.unary_unary_rpc_method_handler(
                coordinator.Leave, coordinator_pb2.LeaveRequest.FromString,
                coordinator_pb2.LeaveResponse.SerializeToString)}),
        grpc.method_handlers_generic_handler("millpond.router.v1.RouterInternalService", {
            "ReportWorkerStatus": grpc.unary_unary_rpc_method_handler(
                router.ReportWorkerStatus, router_internal_pb2.ReportWorkerStatusRequest.FromString,
                router_internal_pb2.ReportWorkerStatusResponse.SerializeToString)}),
    ]


def beating(endpoint: str, interval_ms: int) -> tuple[MembershipAgent, FakeTasks, ChannelFactory, asyncio.Event]:
    """A worker's membership agent (worker w1 at w1:1) whose coordinator is ``endpoint``, its
    tasks, its channels and its stop."""
    settings = SimpleNamespace(worker_id="w1", heartbeat_interval_ms=interval_ms, coordinators=[endpoint])
    tasks, channels = FakeTasks(), ChannelFactory(None)
    return MembershipAgent(settings, channels, tasks, lambda: "w1:1"), tasks, channels, asyncio.Event()  # type: ignore[arg-type]


def beat_loops(agent: MembershipAgent, stop: asyncio.Event, endpoint: str) -> list[asyncio.Task[None]]:
    """The agent's beats to a coordinator and a router both served at ``endpoint``."""
    return [asyncio.create_task(agent.heartbeat_loop(stop, endpoint)), asyncio.create_task(agent.report_loop(stop, endpoint))]


async def shut(stop: asyncio.Event, loops: list[asyncio.Task[None]], channels: ChannelFactory,
               server: grpc.aio.Server) -> None:
    """Stop the beats (cancelled if they did not end), close the channels and the server."""
    stop.set()
    for loop in loops:
        loop.cancel()
    await channels.close()
    await server.stop(None)


async def eventually(condition: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("peers", ["current", "earlier version"])
async def test_beats_reach_the_coordinator_and_the_router_and_the_assignment_comes_back(peers: str) -> None:
    cluster = Cluster(5.0, AssignorConfig(num_standby_replicas=0))
    cluster.lead(1)
    members = ClusterMembers(cluster)
    hosts = HostTable(5.0)
    coordinator = CoordinatorServicer(None, members, cluster, lambda: "c1")  # type: ignore[arg-type]
    router = RouterInternalServicer(hosts)
    methods = Methods()
    server = grpc.aio.server(interceptors=[methods])
    if peers == "current":
        coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(coordinator, server)
        router_internal_pb2_grpc.add_RouterInternalServiceServicer_to_server(router, server)
    else:
        server.add_generic_rpc_handlers(unary_only(coordinator, router))
    endpoint = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    agent, tasks, channels, stop = beating(endpoint, interval_ms=20)
    loops = beat_loops(agent, stop, endpoint)
    try:
        unary = ["/millpond.coordinator.v1.CoordinatorService/Heartbeat",
                 "/millpond.router.v1.RouterInternalService/ReportWorkerStatus"]
        await eventually(lambda: tasks.taken != [] and members.beats >= 5 and "w1:1" in hosts.hosts and (
            peers == "current" or all(methods.called.count(method) >= 5 for method in unary)))  # (each loop's own pace)
        assert tasks.taken == [(cluster.generation, {"Q": {0}}, set())]
        assert tasks.workers == {"w1"}, "with the assignment, every worker it has"
        assert cluster.task_reports()["Q"][0].worker_id == "w1"  # its later beats report the task
        assert list(hosts.hosts["w1:1"].lags.values()) == tasks.store_lags()
        stop.set()
        await asyncio.wait_for(asyncio.gather(*loops), 5)
        beats = members.beats
        await agent.leave()
        assert members.beats == beats and not cluster.views["w1"].alive  # no beat after the leave
    finally:
        await shut(stop, loops, channels, server)
    streams = {"/millpond.coordinator.v1.CoordinatorService/Heartbeats",
               "/millpond.router.v1.RouterInternalService/StreamWorkerStatus"}
    if peers == "current":  # one stream each, however many beats
        assert sorted(methods.called) == sorted([*streams, "/millpond.coordinator.v1.CoordinatorService/Leave"])
    else:
        # Each stream is tried until the peer says UNIMPLEMENTED (a first try may also end
        # otherwise, in a race of the call's end with its first request), then unary calls only.
        pairs = {"/millpond.coordinator.v1.CoordinatorService/Heartbeats":
                 "/millpond.coordinator.v1.CoordinatorService/Heartbeat",
                 "/millpond.router.v1.RouterInternalService/StreamWorkerStatus":
                 "/millpond.router.v1.RouterInternalService/ReportWorkerStatus"}
        for stream, unary in pairs.items():
            tries = [i for i, called in enumerate(methods.called) if called == stream]
            assert 1 <= len(tries) <= 2 and methods.called.count(unary) >= 5
            assert tries[-1] < methods.called.index(unary)


async def test_a_new_assignment_goes_out_at_once_and_a_broken_beat_stream_makes_a_suspect() -> None:
    """Beats a minute apart: only the first beat of each stream comes in the test's time, so
    the second assignment can only reach the worker pushed on its stream. A worker's beats
    that end (it stops) leave it a member in good standing; a stream that breaks (here the
    call cancelled; a killed worker's kernel closes its connection) makes it a suspect of
    the coordinator and dead to the router at once, not after their timeouts."""
    cluster = Cluster(60.0, AssignorConfig(num_standby_replicas=0))
    cluster.lead(1)
    members, hosts, changes = ClusterMembers(cluster), HostTable(60.0), Changes()
    coordinator = CoordinatorServicer(None, members, cluster, lambda: "c1", changes=changes)  # type: ignore[arg-type]
    server = grpc.aio.server()
    coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(coordinator, server)
    router_internal_pb2_grpc.add_RouterInternalServiceServicer_to_server(RouterInternalServicer(hosts), server)
    endpoint = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    agent, tasks, channels, stop = beating(endpoint, interval_ms=60_000)
    loops = beat_loops(agent, stop, endpoint)
    try:
        await eventually(lambda: len(tasks.taken) == 1 and "w1:1" in hosts.hosts)
        cluster.reassign([QueryTasks("Q", 2)])
        changes.fire()
        await eventually(lambda: len(tasks.taken) == 2)
        assert tasks.taken[1] == (cluster.generation, {"Q": {0, 1}}, set())
        assert members.beats == 1, "pushed, not the answer to a beat"
        assert cluster.membership.suspects() == [] and not hosts.dead("w1:1")

        for loop in loops:  # the streams break
            loop.cancel()
        await eventually(lambda: [m.worker_id for m in cluster.membership.suspects()] == ["w1"])
        await eventually(lambda: hosts.dead("w1:1"))
        cluster.membership.vouch("w1")  # it answered its health check
        assert cluster.membership.suspects() == []

        loops = beat_loops(agent, stop, endpoint)
        await eventually(lambda: members.beats == 2 and not hosts.dead("w1:1"))
        stop.set()  # the streams end
        await asyncio.wait_for(asyncio.gather(*loops), 5)
        await asyncio.sleep(0.2)
        assert cluster.membership.suspects() == [] and not hosts.dead("w1:1")
    finally:
        await shut(stop, loops, channels, server)


async def test_a_workers_beats_to_every_peer_go_out_together_on_one_grid() -> None:
    """The router's stream starts a third of an interval after the coordinator's; from the
    second beat on, the two streams' beats reach their servers at the same moments, an interval
    apart (one wake of the worker's loop sends both)."""
    arrivals: dict[str, list[float]] = {"coordinator": [], "router": []}

    async def beats(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async for _ in requests:
            arrivals["coordinator"].append(time.monotonic())
        return
        yield  # a stream-stream handler that answers nothing

    async def reports(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async for _ in requests:
            arrivals["router"].append(time.monotonic())
        return router_internal_pb2.StreamWorkerStatusResponse()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([
        grpc.method_handlers_generic_handler("millpond.coordinator.v1.CoordinatorService", {
            "Heartbeats": grpc.stream_stream_rpc_method_handler(
                beats, coordinator_pb2.HeartbeatsRequest.FromString,
                coordinator_pb2.HeartbeatsResponse.SerializeToString)}),
        grpc.method_handlers_generic_handler("millpond.router.v1.RouterInternalService", {
            "StreamWorkerStatus": grpc.stream_unary_rpc_method_handler(
                reports, router_internal_pb2.StreamWorkerStatusRequest.FromString,
                router_internal_pb2.StreamWorkerStatusResponse.SerializeToString)})])
    endpoint = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    interval = 0.15
    agent, _, channels, stop = beating(endpoint, interval_ms=int(interval * 1000))
    loops = [asyncio.create_task(agent.heartbeat_loop(stop, endpoint))]
    try:
        await eventually(lambda: len(arrivals["coordinator"]) >= 1)
        await asyncio.sleep(interval / 3)
        loops.append(asyncio.create_task(agent.report_loop(stop, endpoint)))
        await eventually(lambda: len(arrivals["router"]) >= 6)
    finally:
        await shut(stop, loops, channels, server)
    router = arrivals["router"][1:6]
    for at in router:  # the coordinator's beat nearest each of the router's
        nearest = min(arrivals["coordinator"], key=lambda c: abs(c - at))
        assert abs(nearest - at) < interval / 6, f"beats {abs(nearest - at) * 1000:.0f} ms apart"
    assert interval * 0.7 < (router[-1] - router[0]) / (len(router) - 1) < interval * 1.3, "an interval apart"


WORKER = """
import asyncio, sys
from types import SimpleNamespace
from millpond.services.worker.membership import MembershipAgent
from millpond.shared.rpc.tls import ChannelFactory
from tests.unit.services.worker.test_membership import FakeTasks

async def beat(endpoint):
    settings = SimpleNamespace(worker_id="w1", heartbeat_interval_ms=60_000, coordinators=[endpoint])
    agent = MembershipAgent(settings, ChannelFactory(None), FakeTasks(), lambda: "w1:1")
    stop = asyncio.Event()
    await asyncio.gather(agent.heartbeat_loop(stop, endpoint), agent.report_loop(stop, endpoint))

asyncio.run(beat(sys.argv[1]))
"""


async def test_a_killed_worker_is_a_suspect_and_dead_to_the_router_at_once() -> None:
    """A worker process SIGKILLed (beats a minute apart, timeouts of a minute): its kernel
    closes its connections, which gRPC may show the servers as the plain end of the beats;
    without the worker's last beat, that is a break."""
    cluster = Cluster(60.0, AssignorConfig(num_standby_replicas=0))
    cluster.lead(1)
    members, hosts = ClusterMembers(cluster), HostTable(60.0)
    server = grpc.aio.server()
    coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(
        CoordinatorServicer(None, members, cluster, lambda: "c1"), server)  # type: ignore[arg-type]
    router_internal_pb2_grpc.add_RouterInternalServiceServicer_to_server(RouterInternalServicer(hosts), server)
    endpoint = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    worker = await asyncio.create_subprocess_exec(sys.executable, "-c", WORKER, endpoint, cwd=Path(__file__).parents[4])
    try:
        await eventually(lambda: members.beats == 1 and "w1:1" in hosts.hosts, within=60)
        assert cluster.membership.suspects() == [] and not hosts.dead("w1:1")
        worker.kill()
        await asyncio.wait_for(worker.wait(), 10)
        await eventually(lambda: [m.worker_id for m in cluster.membership.suspects()] == ["w1"] and hosts.dead("w1:1"))
    finally:
        if worker.returncode is None:
            worker.kill()
            await asyncio.wait_for(worker.wait(), 10)
        await server.stop(None)


async def test_a_stopping_worker_does_not_wait_for_a_peer_that_never_ends_its_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(membership, "STOP_GRACE_S", 0.2)
    taken = asyncio.Event()

    class Stuck(router_internal_pb2_grpc.RouterInternalServiceServicer):
        async def StreamWorkerStatus(self, requests: Any, context: grpc.aio.ServicerContext) -> Any:
            await requests.__anext__()
            taken.set()
            await asyncio.sleep(60)  # never reads on

    server = grpc.aio.server()
    router_internal_pb2_grpc.add_RouterInternalServiceServicer_to_server(Stuck(), server)
    endpoint = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    settings = SimpleNamespace(worker_id="w1", heartbeat_interval_ms=20)
    channels, stop = ChannelFactory(None), asyncio.Event()
    agent = MembershipAgent(settings, channels, FakeTasks(), lambda: "w1:1")  # type: ignore[arg-type]
    loop = asyncio.create_task(agent.report_loop(stop, endpoint))
    try:
        await asyncio.wait_for(taken.wait(), 10)
        stop.set()
        started = time.monotonic()
        await asyncio.wait_for(loop, 5)
        assert time.monotonic() - started < 2
    finally:
        loop.cancel()
        await channels.close()
        await server.stop(None)


async def test_a_beat_stream_is_renewed_without_a_gap_or_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(membership, "STREAM_RENEW_S", 0.2)
    beats: list[float] = []

    class Hosts:
        def beat(self, endpoint: str, worker_id: str, lags: list[StoreLag]) -> None:
            beats.append(time.monotonic())

    ended: list[float] = []

    class Ending(RouterInternalServicer):
        """Notes, as each stream ends, how long its deadline still had to run: the worker ends
        its beats well before it (a deadline that expires while a beat is written ends the
        call with INTERNAL at times, which the heartbeat loop logs as a failed heartbeat)."""

        async def StreamWorkerStatus(self, requests: Any, context: Any) -> Any:
            response = await super().StreamWorkerStatus(requests, context)
            ended.append(context.time_remaining())
            return response

    methods = Methods()
    server = grpc.aio.server(interceptors=[methods])
    router_internal_pb2_grpc.add_RouterInternalServiceServicer_to_server(Ending(Hosts()), server)
    endpoint = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    settings = SimpleNamespace(worker_id="w1", heartbeat_interval_ms=20)
    channels, stop = ChannelFactory(None), asyncio.Event()
    agent = MembershipAgent(settings, channels, FakeTasks(), lambda: "w1:1")  # type: ignore[arg-type]
    loop = asyncio.create_task(agent.report_loop(stop, endpoint))
    try:
        await asyncio.sleep(1.2)
        stop.set()
        await asyncio.wait_for(loop, 5)
    finally:
        loop.cancel()
        await channels.close()
        await server.stop(None)
    streams = methods.called.count("/millpond.router.v1.RouterInternalService/StreamWorkerStatus")
    assert streams >= 4 and len(ended) == streams
    assert min(ended) > 1.0, "every stream's beats end well before its deadline"
    assert max(b - a for a, b in itertools.pairwise(beats)) < 1.0  # renewals, 0.2 s apart, leave no gap
    assert not [r for r in caplog.records if r.name == membership.__name__]


class TakingOver:
    """A worker's tables that stand a query by for partition 0 of each task asked (``PrepareTakeOver``)."""

    def __init__(self) -> None:
        self.asked: list[tuple[list[tuple[str, int]], str, float]] = []

    async def prepare_take_over(self, keys: list[tuple[str, int]], worker_id: str, wait_s: float) -> list[tuple[str, int]]:
        self.asked.append((sorted(keys), worker_id, wait_s))
        return [key for key in keys if key[1] == 0]


async def test_a_leaving_worker_asks_each_worker_keeping_a_copy_of_its_actives_to_stand_by(
        caplog: pytest.LogCaptureFixture) -> None:
    """Over gRPC, bounded: the worker keeping standby copies of its active tasks is asked for
    those (not for its copies of other workers' tasks), one that cannot be reached holds
    nothing up, and the leave's log says which stand by."""
    caplog.set_level(logging.INFO, logger=membership.__name__)
    tables = TakingOver()
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerServicer(tables, 100), server)  # type: ignore[arg-type]
    endpoint = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    agent, _, channels, _ = beating("127.0.0.1:1", interval_ms=20)

    def ids(*keys: tuple[str, int]) -> list[coordinator_pb2.TaskId]:
        return [coordinator_pb2.TaskId(query_id=q, partition=p) for q, p in keys]
    try:
        await agent.hand_over()  # no assignment yet: nothing to ask
        assert tables.asked == []
        agent.assignment = coordinator_pb2.Assignment(generation=3, workers=[
            coordinator_pb2.WorkerAssignment(worker_id="w1", endpoint="w1:1", active_tasks=ids(("Q", 0), ("Q", 1), ("R", 0)),
                                             standby_tasks=ids(("Q", 2))),
            coordinator_pb2.WorkerAssignment(worker_id="w2", endpoint=endpoint, active_tasks=ids(("Q", 2)),
                                             standby_tasks=ids(("Q", 1), ("Q", 0), ("R", 5))),
            coordinator_pb2.WorkerAssignment(worker_id="w3", endpoint="127.0.0.1:1", standby_tasks=ids(("R", 0)))])
        began = time.monotonic()
        await agent.hand_over()
        assert time.monotonic() - began < membership.HAND_OVER_MAX_S
        ((keys, worker_id, wait_s),) = tables.asked
        assert keys == [("Q", 0), ("Q", 1)] and worker_id == "w1" and 0 < wait_s <= membership.HAND_OVER_MAX_S
        (handed,) = [r for r in caplog.records if r.getMessage() == "handed over"]
        assert handed.standing_by == [("Q", 0)] and handed.asked == [("Q", 0), ("Q", 1), ("R", 0)]
    finally:
        await channels.close()
        await server.stop(None)
