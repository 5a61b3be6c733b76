"""Wires the coordinator: command log, metastore, executor, membership and assignment."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc

from services.coordinator.assignor import Task, assign
from services.coordinator.executor import StatementExecutor
from services.coordinator.membership import Membership
from services.coordinator.servicer import CoordinatorServicer
from shared.command_log import CommandReader, CommandWriter
from shared.config import CoordinatorSettings
from shared.errors import MillpondError
from shared.kafka import ensure_topic
from shared.metastore import Metastore
from shared.rpc.metastore import SERVICE_NAME as METASTORE_SERVICE
from shared.rpc.metastore import metastore_registrar
from shared.rpc.server import RpcServer, shutdown_event
from shared.task_status import TaskReport
from shared.topology import task_count

log = logging.getLogger(__name__)


class Coordinator:
    """The coordinator service."""

    def __init__(self, settings: CoordinatorSettings):
        self.settings = settings
        bootstrap = settings.kafka_bootstrap_servers
        self.metastore = Metastore()
        self.reader = CommandReader(bootstrap, settings.command_topic, self.metastore)
        self.writer = CommandWriter(bootstrap, settings.command_topic, transactional_id=settings.service_id)
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self.producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all")
        self.offsets = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                                        enable_auto_commit=False)
        self.executor = StatementExecutor(settings, self.metastore, self.reader, self.writer, self.admin,
                                          self.producer, self.offsets, self.task_reports)
        self.membership = Membership(settings.worker_session_timeout_ms / 1000)
        self.generation = 0
        self.assignment: dict[str, list[Task]] = {}
        self.reports: dict[str, list[TaskReport]] = {}
        """Each live worker's last report of its tasks."""
        self.reader.listeners.append(self.reassign)
        self.server = RpcServer(
            settings.host, settings.port,
            [lambda s: coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(CoordinatorServicer(self), s),
             metastore_registrar(self.reader, "coordinator")],
            [coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name, METASTORE_SERVICE],
        )

    def task_reports(self) -> dict[str, list[TaskReport]]:
        """The live workers' reports of the tasks they are assigned, by query id."""
        assigned = {(w, t.query_id, t.partition) for w, tasks in self.assignment.items() for t in tasks}
        out: dict[str, list[TaskReport]] = defaultdict(list)
        for worker_id, reports in self.reports.items():
            for r in reports:
                if (worker_id, r.query_id, r.partition) in assigned:
                    out[r.query_id].append(r)
        return out

    def heartbeat(self, worker_id: str, endpoint: str, reports: list[TaskReport]) -> None:
        """A worker is alive; a new worker triggers a reassignment."""
        self.reports[worker_id] = reports
        if self.membership.beat(worker_id, endpoint):
            log.info("worker joined", extra={"worker": worker_id, "endpoint": endpoint})
            self.reassign()

    def reassign(self) -> None:
        """Recompute the assignment from the live workers and the running queries."""
        # A query in error (its topic is gone) gets no tasks until it is fixed.
        partitions = {
            q.query_id: task_count(q, self.metastore.source(q.source), self.metastore.source(q.sink), self.settings.service_id)
            for q in self.metastore.queries.values() if q.query_id not in self.metastore.errors
        }
        new = assign(self.membership.members, partitions)
        if new != self.assignment:
            self.assignment = new
            self.generation += 1
            log.info("new assignment", extra={"generation": self.generation,
                                               "tasks": {w: len(t) for w, t in new.items()}})

    def assignment_proto(self) -> coordinator_pb2.Assignment:
        """The assignment as protobuf."""
        return coordinator_pb2.Assignment(
            generation=self.generation,
            workers=[
                coordinator_pb2.WorkerAssignment(
                    worker_id=worker_id,
                    endpoint=self.membership.members[worker_id].endpoint,
                    active_tasks=[coordinator_pb2.TaskId(query_id=t.query_id, partition=t.partition) for t in tasks],
                )
                for worker_id, tasks in sorted(self.assignment.items())
                if worker_id in self.membership.members
            ],
        )

    async def _declare_processing_log(self) -> None:
        """Declare the processing-log stream once per cluster, so failed records can be queried."""
        name = self.settings.processing_log_stream
        if not name or name.upper() in self.metastore.sources:
            return
        try:
            await self.executor.execute(
                f"CREATE STREAM IF NOT EXISTS {name} (QUERY_ID VARCHAR, SOURCE_TOPIC VARCHAR, SOURCE_PARTITION INT, "
                "SOURCE_OFFSET BIGINT, REASON VARCHAR, RECORD VARCHAR) "
                f"WITH (kafka_topic='{self.settings.processing_log_topic}', value_format='JSON');", {})
        except MillpondError:
            log.exception("could not declare the processing-log stream", extra={"stream": name})

    async def _expire_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            gone = self.membership.expire()
            if gone:
                for worker_id in gone:
                    self.reports.pop(worker_id, None)
                log.warning("workers left", extra={"workers": gone})
                self.reassign()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT."""
        stop = shutdown_event()
        await self.admin.start()
        await ensure_topic(self.admin, self.settings.command_topic, 1)
        await ensure_topic(self.admin, self.settings.processing_log_topic, 1)
        await self.producer.start()
        await self.offsets.start()
        await self.reader.start()
        await self.reader.catch_up()
        self.reassign()
        await self.server.start()
        tasks = [asyncio.create_task(self.reader.run(stop)), asyncio.create_task(self._expire_loop(stop))]
        await self._declare_processing_log()
        await self.server.set_serving()
        log.info("coordinator ready", extra={"endpoint": self.server.endpoint,
                                             "command_offset": self.metastore.command_offset})
        await stop.wait()
        log.info("coordinator stopping")
        await self.server.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for closer in (self.reader.stop, self.offsets.stop, self.producer.stop, self.admin.close):
            with contextlib.suppress(Exception):
                await closer()
