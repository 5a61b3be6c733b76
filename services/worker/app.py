"""Wires a worker: command replay, heartbeats, task reconciliation, Spark and the servicer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from aiokafka import AIOKafkaConsumer
from pyspark.sql import SparkSession

from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.router.v1 import router_pb2, router_pb2_grpc
from millpond.services.worker.servicer import WorkerServicer
from millpond.services.worker.spark import create_session
from millpond.services.worker.standby import StandbyReplica
from millpond.services.worker.state.store import PartitionStore
from millpond.services.worker.supervisor import QuerySupervisor
from millpond.services.worker.task import AggregationTask, StoreTask, aggregate_row
from millpond.shared import metrics
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.topology import stages
from millpond.shared.config import WorkerSettings
from millpond.shared.errors import NotFoundError, UnavailableError
from millpond.shared.kafka.command_log import CommandReader
from millpond.shared.rpc.converters import store_lag_to_proto, task_report_to_proto
from millpond.shared.rpc.metastore import SERVICE_NAME as METASTORE_SERVICE
from millpond.shared.rpc.metastore import metastore_registrar
from millpond.shared.rpc.server import RpcServer, message_limits, shutdown_event
from millpond.shared.rpc.tls import ChannelFactory
from millpond.shared.sql import aggregates
from millpond.shared.task_status import RUNNING, StoreLag, TaskReport
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)
RowFn = Callable[[bytes, list[Any]], list[Any]]


@dataclass(frozen=True)
class LocalCopy:
    """A local copy of a table partition that answers pull queries."""

    store: PartitionStore
    row: RowFn
    """Turns a stored state into the table's row."""
    input_offset: int
    """The next input offset the copy has not processed (-1: unknown)."""


class Worker:
    """A query worker: runs its assigned tasks and serves local pull queries."""

    def __init__(self, settings: WorkerSettings):
        self.settings = settings
        self.metastore = Metastore()
        self.reader = CommandReader(settings.kafka, settings.command_topic, self.metastore)
        self.channels = ChannelFactory(settings.tls, message_limits(settings.max_message_bytes))
        """Channels to the coordinators and routers (mutual TLS when configured)."""
        self.server = RpcServer(
            settings,
            [lambda s: worker_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerServicer(self), s),
             metastore_registrar(self.reader, settings.worker_id)],
            [worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name, METASTORE_SERVICE],
        )
        self.generation = 0
        self.wanted: dict[str, set[int]] = {}
        self.wanted_standbys: set[tuple[str, int]] = set()
        """(query id, partition) this worker keeps a standby or warm-up copy of."""
        self.supervisors: dict[str, QuerySupervisor] = {}
        self.standbys: dict[tuple[str, int], StandbyReplica] = {}
        self.spark: SparkSession | None = None
        self._spark_lock = asyncio.Lock()
        self._dirty = asyncio.Event()
        self.reader.listeners.append(self._dirty.set)

    def local_table(self, table: str, partition: int, allow_standby: bool, min_input_offset: int = 0) -> LocalCopy:
        """The copy of ``partition`` of ``table`` here that may answer a pull query: the running
        active task's store, or (when allowed) a caught-up standby's. UnavailableError when
        there is none, or when it has not processed the input up to ``min_input_offset``."""
        source = self.metastore.source(table)
        if source.query_id is None:
            raise NotFoundError(f"{table} is not materialized by a query; it cannot be pulled from")
        supervisor = self.supervisors.get(source.query_id)
        task = supervisor.tasks.get(partition) if supervisor is not None else None
        replica = self.standbys.get((source.query_id, partition))
        if isinstance(task, StoreTask) and task.store is not None and task.state == RUNNING:
            copy = LocalCopy(task.store, task.row, -1 if task.next_input_offset is None else task.next_input_offset)
        elif allow_standby and replica is not None and replica.store is not None and replica.caught_up:
            copy = LocalCopy(replica.store, replica.row, replica.input_offset)
        else:
            raise UnavailableError(
                f"partition {partition} of {table} is not {'active or standby' if allow_standby else 'active'} "
                f"on worker {self.settings.worker_id}")
        if min_input_offset > 0 and copy.input_offset < min_input_offset:
            raise UnavailableError(
                f"partition {partition} of {table} on worker {self.settings.worker_id} has processed its input "
                f"up to offset {copy.input_offset}; the consistency token needs {min_input_offset}")
        return copy

    def set_standby_replay(self, query_id: str, partition: int, paused: bool) -> int:
        """Pause or resume a standby copy's replay; its changelog position."""
        replica = self.standbys.get((query_id, partition))
        if replica is None:
            raise NotFoundError(f"worker {self.settings.worker_id} keeps no standby of partition {partition} "
                                f"of query {query_id}")
        if paused:
            replica.resumed.clear()
        else:
            replica.resumed.set()
        return replica.position

    def task_reports(self) -> list[TaskReport]:
        """The state of every task this worker runs."""
        return [r for s in self.supervisors.values() for r in s.reports()]

    def store_lags(self) -> list[StoreLag]:
        """How far each local table copy, active or standby, is behind its changelog."""
        active = [t.lag() for s in self.supervisors.values() for t in s.tasks.values() if isinstance(t, AggregationTask)]
        return [lag for lag in [*active, *(r.lag() for r in self.standbys.values())] if lag is not None]

    async def spark_session(self) -> SparkSession:
        """This process's Spark session, started on first use."""
        async with self._spark_lock:
            if self.spark is None:
                self.spark = await asyncio.to_thread(create_session, self.settings)
            return self.spark

    async def _start_spark(self) -> None:
        try:
            await self.spark_session()
        except Exception:
            log.exception("Spark did not start; a task that needs it tries again")

    async def _heartbeat_loop(self, stop: asyncio.Event, coordinator: str) -> None:
        """Beat one coordinator: every coordinator tracks the members, so a follower that
        takes over knows them and what they run; only the leader answers with assignments."""
        interval = self.settings.heartbeat_interval_ms / 1000
        while not stop.is_set():
            stub = self.channels.stub(coordinator, coordinator_pb2_grpc.CoordinatorServiceStub)
            try:
                response = await stub.Heartbeat(coordinator_pb2.HeartbeatRequest(
                    worker_id=self.settings.worker_id, endpoint=self.server.endpoint,
                    known_generation=self.generation, tasks=[task_report_to_proto(r) for r in self.task_reports()],
                    lags=[store_lag_to_proto(lag) for lag in self.store_lags()]), timeout=2)
                # A newer leader's generations are larger: an older leader cannot undo its orders.
                if response.HasField("assignment") and response.generation > self.generation:
                    self._take(response.assignment)
            except grpc.aio.AioRpcError as err:
                log.warning("heartbeat failed", extra={"coordinator": coordinator, "code": str(err.code())})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def _report_loop(self, stop: asyncio.Event, router: str) -> None:
        """Beat one router with this worker's lags, for its failure detector and lag-aware routing."""
        interval = self.settings.heartbeat_interval_ms / 1000
        while not stop.is_set():
            stub = self.channels.stub(router, router_pb2_grpc.RouterServiceStub)
            try:
                await stub.ReportHostStatus(router_pb2.ReportHostStatusRequest(
                    worker_id=self.settings.worker_id, endpoint=self.server.endpoint,
                    lags=[store_lag_to_proto(lag) for lag in self.store_lags()]), timeout=2)
            except grpc.aio.AioRpcError as err:
                log.debug("lag report failed", extra={"router": router, "code": str(err.code())})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    def _take(self, assignment: coordinator_pb2.Assignment) -> None:
        wanted: dict[str, set[int]] = defaultdict(set)
        standbys: set[tuple[str, int]] = set()
        for worker in assignment.workers:
            if worker.worker_id == self.settings.worker_id:
                for task in worker.active_tasks:
                    wanted[task.query_id].add(task.partition)
                standbys = {(t.query_id, t.partition) for t in (*worker.standby_tasks, *worker.warmup_tasks)}
        self.generation = assignment.generation
        self.wanted = dict(wanted)
        self.wanted_standbys = standbys
        log.info("assignment received", extra={"generation": self.generation,
                                               "tasks": {q: sorted(p) for q, p in self.wanted.items()},
                                               "standbys": sorted(standbys)})
        self._dirty.set()

    async def _reconcile_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), 1.0)
            if stop.is_set():
                break
            self._dirty.clear()
            try:
                await self._reconcile()
            except Exception:
                log.exception("reconciling tasks failed; retrying")
                await asyncio.sleep(1)
                self._dirty.set()

    async def _reconcile(self) -> None:
        # A store is open in one place at a time: a standby being promoted closes before its
        # active task opens the store, and a demoted active closes before its standby does.
        # One assignment throughout: a newer one that arrives meanwhile sets _dirty again.
        wanted, wanted_standbys = self.wanted, self.wanted_standbys
        standbys = self._standbys_to_run(wanted, wanted_standbys)
        for key in sorted(set(self.standbys) - standbys):
            await self.standbys.pop(key).stop()
        await self._reconcile_actives(wanted)
        for key in sorted(standbys - set(self.standbys)):
            replica = self.standbys[key] = StandbyReplica(self.settings, *key, self._row_function(key[0]))
            replica.start()

    def _row_function(self, query_id: str) -> RowFn:
        query = self.metastore.queries[query_id]
        sink = self.metastore.source(query.sink)
        aggs = [aggregates.require(a.function) for a in query.plan.aggregates]
        return lambda key, state: aggregate_row(sink, aggs, key, state)

    def _standbys_to_run(self, wanted: dict[str, set[int]], wanted_standbys: set[tuple[str, int]]
                         ) -> set[tuple[str, int]]:
        """The wanted standbys of queries that keep a changelog, for partitions their table has."""
        out = set()
        for query_id, partition in wanted_standbys:
            query = self.metastore.queries.get(query_id)
            if query is None or partition in wanted.get(query_id, set()):
                continue
            final = stages(query, self.metastore.source(query.source), self.metastore.source(query.sink),
                           self.settings.service_id)[-1]
            if final.query.plan.kind == "AGGREGATE" and partition < final.partitions:
                out.add((query_id, partition))
        return out

    async def _reconcile_actives(self, wanted: dict[str, set[int]]) -> None:
        for query_id in sorted(set(self.supervisors) | set(wanted)):
            want = wanted.get(query_id, set())
            query = self.metastore.queries.get(query_id)
            if want and query is None:
                continue  # the query's statement has not been replayed yet
            current = self.supervisors.get(query_id)
            if current is not None and current.partitions == want and query is not None and current.query.plan == query.plan:
                continue  # unchanged (CREATE OR REPLACE changes the plan and restarts the query)
            if current is not None:
                await self.supervisors.pop(query_id).stop()
            if not want or query is None:
                continue
            supervisor = QuerySupervisor(self.settings, self.metastore, query, want, self.spark_session)
            self.supervisors[query_id] = supervisor
            supervisor.start()

    async def _leave(self) -> None:
        """Tell the coordinators this worker is going, so its tasks move now (to caught-up
        standbys) rather than after its heartbeats time out."""
        for coordinator in self.settings.coordinators:
            try:
                await self.channels.stub(coordinator, coordinator_pb2_grpc.CoordinatorServiceStub).Leave(
                    coordinator_pb2.LeaveRequest(worker_id=self.settings.worker_id), timeout=2)
            except grpc.aio.AioRpcError as err:
                log.warning("could not leave the cluster; the coordinator will time the worker out",
                            extra={"coordinator": coordinator, "code": str(err.code())})

    async def _metrics_loop(self, stop: asyncio.Event) -> None:
        """Refresh the gauges every second: each task's input lag (its partition's end offset
        minus the next offset it will process), restore progress and every copy's lag."""
        if self.settings.metrics_port is None:
            return
        consumer = AIOKafkaConsumer(**self.settings.kafka.client_args(),
                                    isolation_level="read_committed", enable_auto_commit=False)
        await consumer.start()
        try:
            while not stop.is_set():
                try:
                    await self._refresh_metrics(consumer)
                except Exception as error:  # a metric must never take the worker down
                    log.debug("metrics refresh failed", extra={"error": repr(error)})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        finally:
            await consumer.stop()

    async def _refresh_metrics(self, consumer: AIOKafkaConsumer) -> None:
        tasks = [t for s in self.supervisors.values() for t in s.tasks.values()]
        ends = await consumer.end_offsets([t.input for t in tasks]) if tasks else {}
        for gauge in (metrics.CONSUMER_LAG, metrics.RESTORED, metrics.TO_RESTORE, metrics.STORE_LAG):
            gauge.clear()
        for task in tasks:
            labels = (task.query.query_id, str(task.partition))
            if task.next_input_offset is not None and task.input in ends:
                metrics.CONSUMER_LAG.labels(*labels).set(max(ends[task.input] - task.next_input_offset, 0))
            metrics.RESTORED.labels(*labels).set(task.restored_records)
            metrics.TO_RESTORE.labels(*labels).set(task.records_to_restore)
        for lag in self.store_lags():
            metrics.STORE_LAG.labels(lag.query_id, str(lag.partition), "active" if lag.active else "standby").set(lag.lag)

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT."""
        stop = shutdown_event()
        await self.reader.start()
        await self.reader.catch_up()
        await self.server.start()
        metrics.serve(self.settings.host, self.settings.metrics_port)
        await self.server.set_serving()  # before the first beat, so a health probe finds it serving
        beats = [asyncio.create_task(self._heartbeat_loop(stop, c)) for c in self.settings.coordinators]
        beats += [asyncio.create_task(self._report_loop(stop, r)) for r in self.settings.router_endpoints]
        loops = [asyncio.create_task(c) for c in (self.reader.run(stop), self._reconcile_loop(stop),
                                                  self._metrics_loop(stop))]
        # Start Spark now, not when a task first arrives: a promoted standby must not wait
        # the seconds a Spark session takes to start.
        loops.append(asyncio.create_task(self._start_spark()))
        log.info("worker ready", extra={"endpoint": self.server.endpoint, "worker": self.settings.worker_id})
        await stop.wait()
        log.info("worker stopping")
        # No beat may follow the leave, or it would rejoin the worker.
        await asyncio.gather(*beats, return_exceptions=True)
        await self._leave()
        await self.server.stop()
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        for supervisor in self.supervisors.values():
            with contextlib.suppress(Exception):
                await supervisor.stop()
        for replica in self.standbys.values():
            with contextlib.suppress(Exception):
                await replica.stop()
        if self.spark is not None:
            await asyncio.to_thread(self.spark.stop)
        await self.channels.close()
        await self.reader.stop()
