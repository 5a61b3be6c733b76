"""Wires a worker: command replay, heartbeats, task reconciliation, Spark and the servicer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict

import grpc
from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc
from pyspark.sql import SparkSession

from services.worker.servicer import WorkerServicer
from services.worker.spark import create_session
from services.worker.supervisor import QuerySupervisor
from services.worker.task import StoreTask
from shared.command_log import CommandReader
from shared.config import WorkerSettings
from shared.errors import NotFoundError, UnavailableError
from shared.metastore import Metastore
from shared.rpc.metastore import SERVICE_NAME as METASTORE_SERVICE
from shared.rpc.metastore import metastore_registrar
from shared.rpc.server import RpcServer, shutdown_event
from shared.task_status import RUNNING, TaskReport

log = logging.getLogger(__name__)


class Worker:
    """A query worker: runs its assigned tasks and serves local pull queries."""

    def __init__(self, settings: WorkerSettings):
        self.settings = settings
        self.metastore = Metastore()
        self.reader = CommandReader(settings.kafka_bootstrap_servers, settings.command_topic, self.metastore)
        self.server = RpcServer(
            settings.host, settings.port,
            [lambda s: worker_pb2_grpc.add_WorkerServiceServicer_to_server(WorkerServicer(self), s),
             metastore_registrar(self.reader, settings.worker_id)],
            [worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name, METASTORE_SERVICE],
        )
        self.generation = 0
        self.wanted: dict[str, set[int]] = {}
        self.supervisors: dict[str, QuerySupervisor] = {}
        self.spark: SparkSession | None = None
        self._spark_lock = asyncio.Lock()
        self._dirty = asyncio.Event()
        self.reader.listeners.append(self._dirty.set)

    def hosted_task(self, table: str, partition: int) -> StoreTask:
        """The running task that materializes ``partition`` of ``table`` here."""
        source = self.metastore.source(table)
        if source.query_id is None:
            raise NotFoundError(f"{table} is not materialized by a query; it cannot be pulled from")
        supervisor = self.supervisors.get(source.query_id)
        task = supervisor.tasks.get(partition) if supervisor is not None else None
        if not isinstance(task, StoreTask) or task.store is None or task.state != RUNNING:
            raise UnavailableError(
                f"partition {partition} of {table} is not active on worker {self.settings.worker_id}")
        return task

    def task_reports(self) -> list[TaskReport]:
        """The state of every task this worker runs."""
        return [r for s in self.supervisors.values() for r in s.reports()]

    async def spark_session(self) -> SparkSession:
        """This process's Spark session, started on first use."""
        async with self._spark_lock:
            if self.spark is None:
                self.spark = await asyncio.to_thread(create_session, self.settings)
            return self.spark

    async def _heartbeat_loop(self, stop: asyncio.Event) -> None:
        interval = self.settings.heartbeat_interval_ms / 1000
        async with grpc.aio.insecure_channel(self.settings.coordinator) as channel:
            stub = coordinator_pb2_grpc.CoordinatorServiceStub(channel)
            while not stop.is_set():
                try:
                    response = await stub.Heartbeat(coordinator_pb2.HeartbeatRequest(
                        worker_id=self.settings.worker_id, endpoint=self.server.endpoint,
                        known_generation=self.generation,
                        tasks=[r.to_proto() for r in self.task_reports()]), timeout=2)
                    if response.HasField("assignment") and response.generation != self.generation:
                        self._take(response.assignment)
                except grpc.aio.AioRpcError as err:
                    log.warning("heartbeat failed", extra={"code": str(err.code())})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval)

    def _take(self, assignment: coordinator_pb2.Assignment) -> None:
        wanted: dict[str, set[int]] = defaultdict(set)
        for worker in assignment.workers:
            if worker.worker_id == self.settings.worker_id:
                for task in worker.active_tasks:
                    wanted[task.query_id].add(task.partition)
        self.generation = assignment.generation
        self.wanted = dict(wanted)
        log.info("assignment received", extra={"generation": self.generation,
                                               "tasks": {q: sorted(p) for q, p in self.wanted.items()}})
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
        for query_id in sorted(set(self.supervisors) | set(self.wanted)):
            want = self.wanted.get(query_id, set())
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

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT."""
        stop = shutdown_event()
        await self.reader.start()
        await self.reader.catch_up()
        await self.server.start()
        loops = [asyncio.create_task(c) for c in (
            self.reader.run(stop), self._heartbeat_loop(stop), self._reconcile_loop(stop))]
        await self.server.set_serving()
        log.info("worker ready", extra={"endpoint": self.server.endpoint, "worker": self.settings.worker_id})
        await stop.wait()
        log.info("worker stopping")
        await self.server.stop()
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        for supervisor in self.supervisors.values():
            with contextlib.suppress(Exception):
                await supervisor.stop()
        if self.spark is not None:
            await asyncio.to_thread(self.spark.stop)
        await self.reader.stop()
