"""The worker's membership: heartbeats to every coordinator (which answer with the
assignment), status reports to every router (liveness and lags, for routing), and the
leave on shutdown."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

import grpc

from millpond.common.v1 import status_pb2
from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.router.v1 import router_internal_pb2, router_internal_pb2_grpc
from millpond.services.worker.assignment import TaskAssignment
from millpond.services.worker.converters import assigned_to
from millpond.shared.config import WorkerSettings
from millpond.shared.events import until_next_tick, wait_at_most
from millpond.shared.rpc.converters import heartbeat_tasks, store_lag_to_common, store_lag_to_proto
from millpond.shared.rpc.tls import ChannelFactory
from millpond.shared.task_status import StoreLag, TaskReport
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)

STREAM_RENEW_S = 60.0
"""A beat stream's beats end after this long, its peer ends the call, and a new one opens:
one whose peer went silent without closing its connection (a host gone from the network)
does not hang for ever (its deadline, ``STOP_GRACE_S`` later, ends it then). Ending the beats
rather than letting the deadline cut the call: a deadline that expires while a beat is being
written ended the call with INTERNAL ("Internal error from Core") about once in 60 renewals
(a loopback stream, 10 ms beats), which the worker logged as a failed heartbeat."""

HAND_OVER_MAX_S = 5.0
"""The longest a leaving worker waits for the workers that keep copies of its active tasks to
have the Spark queries those tasks would get there standing by (``hand_over``), processing as
before meanwhile."""

STOP_GRACE_S = 2.0
"""Once the worker stops, how long a beat stream's peer has to take the last beats and end
the call (what a unary beat's deadline was), before the call is cancelled."""


class Beat(Protocol):
    """A message on a beat stream."""

    last: bool


B = TypeVar("B", bound=Beat)


def offered_lags(lags: list[StoreLag], spark_ready: bool) -> list[StoreLag]:
    """The store lags the coordinator's assignor weighs. While the worker's Spark session
    starts (tens of seconds on a busy machine), and until the plans its copies' queries would
    get are made (``TaskAssignment.takes_over``), its standby and warm-up copies are left out:
    none then counts as caught up, so no active moves here before it could run; the
    assignor keeps it where it runs and warms this copy up (as a Kafka Streams instance
    warms up before it takes a task over)."""
    return lags if spark_ready else [lag for lag in lags if lag.active]


@functools.lru_cache(maxsize=1)
def coordinator_beat(worker_id: str, endpoint: str, generation: int, reports: tuple[TaskReport, ...],
                     lags: tuple[StoreLag, ...]) -> coordinator_pb2.HeartbeatRequest:
    """A beat to a coordinator, made anew only when what it says changed: an idle worker's
    beats repeat themselves, and converting its reports and lags to protobuf for every beat
    (10 a second to each peer) cost it CPU for nothing (with the message kept, an idle
    worker's Python threads used 13% less, 1.50 s a minute against 1.73, in two alternated
    pairs of bench.idle's cluster). Not to be changed: the same message is given to every
    call with the same content (a stream sends a copy in its own wrapper)."""
    return coordinator_pb2.HeartbeatRequest(
        worker_id=worker_id, endpoint=endpoint, known_generation=generation,
        **heartbeat_tasks(reports), lags=[store_lag_to_proto(lag) for lag in lags])


@functools.lru_cache(maxsize=1)
def router_report(worker_id: str, endpoint: str, lags: tuple[StoreLag, ...]) -> router_internal_pb2.ReportWorkerStatusRequest:
    """A status report to a router, made anew only when it changed (as ``coordinator_beat``)."""
    return router_internal_pb2.ReportWorkerStatusRequest(
        worker_id=worker_id, endpoint=endpoint, lags=[store_lag_to_common(lag) for lag in lags])


async def _stream(call: grpc.aio.StreamStreamCall | grpc.aio.StreamUnaryCall, stop: asyncio.Event,
                  take: Callable[[Any], None] | None = None) -> None:
    """Run one beat stream to its end, giving ``take`` each response. The stream's beats end
    at ``stop``; its peer then has ``STOP_GRACE_S`` to end it (so every beat is taken before
    the worker leaves), or it is cancelled."""

    async def cancel_late() -> None:
        await stop.wait()
        await asyncio.sleep(STOP_GRACE_S)
        call.cancel()

    watch = asyncio.create_task(cancel_late())
    try:
        if isinstance(call, grpc.aio.StreamStreamCall):
            async for response in call:
                if take is not None:
                    take(response)
        else:
            await call
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # this loop is cancelled, not only the call
        log.warning("a beat stream's peer did not end it in time; cancelled")
    finally:
        watch.cancel()


class MembershipAgent:
    """Beats the coordinators and the routers on behalf of this worker's tasks."""

    def __init__(self, settings: WorkerSettings, channels: ChannelFactory, tasks: TaskAssignment,
                 endpoint: Callable[[], str]):
        self.settings = settings
        self.channels = channels
        self.tasks = tasks
        """What is reported, and what takes a new assignment."""
        self.endpoint = endpoint
        """host:port of this worker's gRPC server (known once it listens)."""
        self._phase = random.random()
        """Where in each heartbeat interval this worker's beats go: every stream of it beats on
        one grid of the interval (its phase the worker's own, so that workers' beats do not all
        come at once), so one wake of the loop sends to every peer. Two streams each pausing an
        interval after its own beat woke the loop twice: 1.72% of a core for two streams at
        100 ms half an interval apart against 1.02% on one grid (``bench.beats``)."""
        self.assignment: coordinator_pb2.Assignment | None = None
        """The newest assignment of the whole cluster taken (where ``hand_over`` finds the copies)."""

    async def heartbeat_loop(self, stop: asyncio.Event, coordinator: str) -> None:
        """Beat one coordinator: every coordinator tracks the members, so a follower that
        takes over knows them and what they run; only the leader answers with assignments.

        The beats go on one long-lived stream (a message on it costs both sides a fraction of
        a unary call, which is most of an idle worker's CPU at 10 beats a second to each
        peer); a coordinator of an earlier version, without ``Heartbeats``, gets unary calls."""
        streams = True
        while not stop.is_set():
            stub = self.channels.stub(coordinator, coordinator_pb2_grpc.CoordinatorServiceStub)
            try:
                if streams:
                    beats = self._every_beat(stop, lambda: coordinator_pb2.HeartbeatsRequest(beat=self._heartbeat()))
                    await _stream(stub.Heartbeats(beats, timeout=STREAM_RENEW_S + STOP_GRACE_S), stop,
                                  lambda response: self._take(response.answer))
                else:
                    self._take(await stub.Heartbeat(self._heartbeat(), timeout=2))
            except grpc.aio.AioRpcError as err:
                if streams and err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    streams = False
                    continue
                if not (streams and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED):  # not a renewal
                    log.warning("heartbeat failed", extra={"coordinator": coordinator, "code": str(err.code()),
                                                           "error": err.details()})
            await wait_at_most(stop, self.settings.heartbeat_interval_ms / 1000)

    def _heartbeat(self) -> coordinator_pb2.HeartbeatRequest:
        tasks = self.tasks
        return coordinator_beat(self.settings.worker_id, self.endpoint(), tasks.generation, tuple(tasks.task_reports()),
                                tuple(offered_lags(tasks.store_lags(), tasks.takes_over())))

    def _take(self, response: coordinator_pb2.HeartbeatResponse) -> None:
        # A newer leader's generations are larger: an older leader cannot undo its orders.
        tasks = self.tasks
        if response.HasField("assignment") and response.generation > tasks.generation:
            self.assignment = response.assignment
            tasks.take(response.assignment.generation, *assigned_to(self.settings.worker_id, response.assignment),
                       workers=frozenset(w.worker_id for w in response.assignment.workers))

    async def report_loop(self, stop: asyncio.Event, router: str) -> None:
        """Beat one router with this worker's lags, for its failure detector and lag-aware
        routing: on one long-lived stream, or by unary calls to a router of an earlier version."""
        streams = True
        while not stop.is_set():
            stub = self.channels.stub(router, router_internal_pb2_grpc.RouterInternalServiceStub)
            try:
                if streams:
                    reports = self._every_beat(
                        stop, lambda: router_internal_pb2.StreamWorkerStatusRequest(status=self._status()))
                    await _stream(stub.StreamWorkerStatus(reports, timeout=STREAM_RENEW_S + STOP_GRACE_S), stop)
                else:
                    await stub.ReportWorkerStatus(self._status(), timeout=2)
            except grpc.aio.AioRpcError as err:
                if streams and err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    streams = False
                    continue
                if not (streams and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED):  # not a renewal
                    log.debug("lag report failed", extra={"router": router, "code": str(err.code())})
            await wait_at_most(stop, self.settings.heartbeat_interval_ms / 1000)

    def _status(self) -> router_internal_pb2.ReportWorkerStatusRequest:
        return router_report(self.settings.worker_id, self.endpoint(), tuple(self.tasks.store_lags()))

    async def _every_beat(self, stop: asyncio.Event, beat: Callable[[], B]) -> AsyncIterator[B]:
        """A beat now and every heartbeat interval until ``stop``, each made when it is sent;
        the stream's last, marked so (its peer tells an end from a break by it), comes at
        ``stop`` or ``STREAM_RENEW_S`` after its first (the next stream's first follows it by
        an interval)."""
        interval = self.settings.heartbeat_interval_ms / 1000
        renew_at = time.monotonic() + STREAM_RENEW_S
        while True:
            message = beat()
            message.last = stop.is_set() or time.monotonic() >= renew_at
            yield message
            if message.last:
                return
            await wait_at_most(stop, until_next_tick(interval, self._phase))

    async def hand_over(self) -> None:
        """Before this worker stops processing to leave: ask each worker that keeps a standby copy
        of one of its active tasks to have the Spark queries those tasks would get there standing
        by (``PrepareTakeOver``), so that the leave's move has them process within a batch, not
        after a Spark query's start and first batch (1-3 s on two busy cores). The assignor moves
        a leaving worker's active to its most caught-up copy: with several copies each is asked.
        ``HAND_OVER_MAX_S`` at most; its tasks go on processing meanwhile."""
        asks = self._take_over_asks()
        if not asks:
            return
        began = time.monotonic()
        try:
            async with asyncio.timeout(HAND_OVER_MAX_S + 1):  # each call has its deadline; this bounds the rest
                answers = await asyncio.gather(*(self._ask_take_over(endpoint, keys) for endpoint, keys in asks.items()))
        except Exception:  # a head start lost, never the leave
            log.warning("handing over failed; the tasks start on their new owners as after a kill", exc_info=True)
            return
        log.info("handed over", extra={"seconds": round(time.monotonic() - began, 3),
                                       "standing_by": sorted(key for standing in answers for key in standing),
                                       "asked": sorted(key for keys in asks.values() for key in keys)})

    def _take_over_asks(self) -> dict[str, list[tuple[str, int]]]:
        """Per endpoint of another worker, this worker's active tasks it keeps a standby copy of."""
        assignment, me = self.assignment, self.settings.worker_id
        if assignment is None:
            return {}
        actives = {(t.query_id, t.partition) for w in assignment.workers if w.worker_id == me for t in w.active_tasks}
        asks: dict[str, list[tuple[str, int]]] = {}
        for worker in assignment.workers:
            keys = sorted({(t.query_id, t.partition) for t in worker.standby_tasks} & actives)
            if worker.worker_id != me and keys and worker.endpoint:
                asks[worker.endpoint] = keys
        return asks

    async def _ask_take_over(self, endpoint: str, keys: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """``PrepareTakeOver`` of one worker: the tasks it has standing by (none if it failed)."""
        request = worker_pb2.PrepareTakeOverRequest(
            tasks=[status_pb2.TaskId(query_id=q, partition=p) for q, p in keys], from_worker_id=self.settings.worker_id)
        try:
            answer = await self.channels.stub(endpoint, worker_pb2_grpc.WorkerServiceStub).PrepareTakeOver(
                request, timeout=HAND_OVER_MAX_S)
        except grpc.aio.AioRpcError as err:
            log.info("a take-over could not be prepared; those tasks start there as after a kill",
                     extra={"worker": endpoint, "code": str(err.code()), "error": err.details()})
            return []
        return [(t.query_id, t.partition) for t in answer.standing_by]

    async def leave(self) -> None:
        """Tell the coordinators this worker is going, so its tasks move now (to caught-up
        standbys) rather than after its heartbeats time out."""
        for coordinator in self.settings.coordinators:
            try:
                await self.channels.stub(coordinator, coordinator_pb2_grpc.CoordinatorServiceStub).Leave(
                    coordinator_pb2.LeaveRequest(worker_id=self.settings.worker_id), timeout=2)
            except grpc.aio.AioRpcError as err:
                log.warning("could not leave the cluster; the coordinator will time the worker out",
                            extra={"coordinator": coordinator, "code": str(err.code())})
