"""The router follows the assignment the coordinators push: the real coordinator servicer
over a pure ``Cluster`` behind a ``grpc.aio`` server on a free port, and the router's poll set
to a minute, so only the stream can bring it a change in time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc

from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.services.coordinator.assignor import AssignorConfig, QueryTasks
from millpond.services.coordinator.cluster import Cluster
from millpond.services.coordinator.converters import assignment_to_proto
from millpond.services.coordinator.rebalancer import Changes
from millpond.services.coordinator.servicer import CoordinatorServicer
from millpond.services.router.converters import replicas_from_assignment
from millpond.services.router.coordinators import Coordinators
from millpond.services.router.hosts import HostTable
from millpond.services.router.pull_routing import PullRouter
from millpond.shared.config import RouterSettings
from millpond.shared.rpc.tls import ChannelFactory

QUERIES = [QueryTasks("Q", 4)]


async def until(what: str, check: Callable[[], bool], timeout_s: float = 5.0) -> float:
    """Seconds until ``check`` holds (an AssertionError naming ``what`` after ``timeout_s``)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"{what} not within {timeout_s} s"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_the_router_takes_each_pushed_assignment_long_before_its_next_poll() -> None:
    cluster, changes = Cluster(5.0, AssignorConfig(num_standby_replicas=1)), Changes()
    server = grpc.aio.server()
    coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(
        CoordinatorServicer(None, None, cluster, lambda: "c1", changes=changes), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    settings = RouterSettings(coordinator=f"127.0.0.1:{port}", assignment_poll_interval_ms=60_000)
    channels = ChannelFactory(None)
    router = PullRouter(settings, None, None, channels, Coordinators(settings, channels),  # type: ignore[arg-type]
                        HostTable(1.0))
    stop = asyncio.Event()
    running = asyncio.create_task(router.run(stop))

    def reassign() -> None:
        assert cluster.reassign(QUERIES)
        changes.fire()

    def current() -> bool:
        return router.generation == cluster.generation and router.replicas == replicas_from_assignment(
            assignment_to_proto(cluster))

    try:
        await asyncio.sleep(0.5)  # the run's first poll has come and gone: it found no leader
        assert router.generation == 0 and router.replicas == {}
        cluster.beat("w1", "w1:1", [], [])
        cluster.lead(3)
        changes.fire()
        reassign()
        await until("the first leader's assignment", current)
        # A worker joins, then another: each new generation reaches the router at once.
        for worker in ("w2", "w3"):
            cluster.beat(worker, f"{worker}:1", [], [])
            reassign()
            took = await until(f"the assignment with {worker}", current, timeout_s=2.0)
            assert took < 2.0
        assert {copy.endpoint for copies in router.replicas["Q"].values() for copy in copies} == {"w1:1", "w2:1"}
        # This coordinator stops leading and another, with a newer epoch, starts: the router
        # ignores the follower and takes the new leader's generation.
        cluster.follow()
        changes.fire()
        await asyncio.sleep(0.2)
        assert router.generation > 0
        cluster.lead(4)
        changes.fire()
        reassign()
        await until("the next leader's assignment", current, timeout_s=2.0)
        assert router.generation >> 32 == 4
    finally:
        stop.set()
        await asyncio.wait_for(running, 5)
        await server.stop(None)
        await channels.close()


async def test_a_stopping_coordinator_ends_its_assignment_streams_at_once() -> None:
    cluster, changes = Cluster(5.0, AssignorConfig()), Changes()
    server = grpc.aio.server()
    coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(
        CoordinatorServicer(None, None, cluster, lambda: "c1", changes=changes), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = coordinator_pb2_grpc.CoordinatorServiceStub(channel).WatchAssignment(
                coordinator_pb2.WatchAssignmentRequest(), timeout=10)
            first = await stream.read()
            assert first.leader is False and first.generation == 0
            changes.close()
            assert await asyncio.wait_for(stream.read(), 2) is grpc.aio.EOF
            assert await stream.code() == grpc.StatusCode.OK
    finally:
        await server.stop(None)
