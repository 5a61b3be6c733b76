"""Wires the coordinator: command log, metastore, executor, membership and assignment."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.services.coordinator.assignor import AssignorConfig, QueryTasks
from millpond.services.coordinator.cluster import Cluster
from millpond.services.coordinator.executor import StatementExecutor
from millpond.services.coordinator.leadership import Leadership
from millpond.services.coordinator.membership import Member
from millpond.services.coordinator.servicer import CoordinatorServicer
from millpond.shared import metrics
from millpond.shared.catalog import names
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.catalog.topology import stages
from millpond.shared.config import CoordinatorSettings
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.admin import ensure_topic
from millpond.shared.kafka.command_log import CommandReader, CommandWriter
from millpond.shared.rpc.metastore import SERVICE_NAME as METASTORE_SERVICE
from millpond.shared.rpc.metastore import metastore_registrar
from millpond.shared.rpc.server import RpcServer, message_limits, shutdown_event
from millpond.shared.rpc.tls import ChannelFactory
from millpond.shared.task_status import StoreLag, TaskReport

log = logging.getLogger(__name__)


class Coordinator:
    """The coordinator service."""

    def __init__(self, settings: CoordinatorSettings):
        self.settings = settings
        kafka = settings.kafka
        self.metastore = Metastore()
        self.reader = CommandReader(kafka, settings.command_topic, self.metastore)
        self.writer = CommandWriter(kafka, settings.command_topic,
                                    transactional_id=names.command_transactional_id(settings.service_id))
        self.admin = AIOKafkaAdminClient(**kafka.client_args())
        self.producer = AIOKafkaProducer(**kafka.client_args(), enable_idempotence=True, acks="all")
        self.offsets = AIOKafkaConsumer(**kafka.client_args(), isolation_level="read_committed",
                                        enable_auto_commit=False)
        self.cluster = Cluster(
            settings.worker_session_timeout_ms / 1000,
            AssignorConfig(settings.num_standby_replicas, settings.acceptable_recovery_lag, settings.max_warmup_replicas))
        self.executor = StatementExecutor(settings, self.metastore, self.reader, self.writer, self.admin,
                                          self.producer, self.offsets, self.cluster.task_reports)
        self.reader.listeners.append(self.reassign)
        self.server = RpcServer(
            settings,
            [lambda s: coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(CoordinatorServicer(self), s),
             metastore_registrar(self.reader, "coordinator")],
            [coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name, METASTORE_SERVICE],
        )
        self.leadership: Leadership | None = None
        self._probes: dict[str, grpc.aio.Channel] = {}
        self.channels = ChannelFactory(settings.tls, message_limits(settings.max_message_bytes))

    @property
    def coordinator_id(self) -> str:
        """This coordinator's id among the cluster's coordinators."""
        return self.settings.coordinator_id or self.server.endpoint

    def heartbeat(self, worker_id: str, endpoint: str, reports: list[TaskReport], lags: list[StoreLag]) -> None:
        """A worker is alive; a new worker triggers a reassignment."""
        if self.cluster.beat(worker_id, endpoint, reports, lags):
            log.info("worker joined", extra={"worker": worker_id, "endpoint": endpoint})
            self.reassign()

    def leave(self, worker_id: str) -> None:
        """A worker is shutting down: hand its tasks over now (to caught-up standbys first)."""
        if self.cluster.remove(worker_id):
            log.info("worker left", extra={"worker": worker_id})
            self.reassign()

    def _queries(self) -> list[QueryTasks]:
        """Every running query's tasks; a query in error (its topic is gone) gets none until fixed."""
        out = []
        for q in self.metastore.queries.values():
            if q.query_id in self.metastore.errors:
                continue
            plan = stages(q, self.metastore.source(q.source), self.metastore.source(q.sink), self.settings.service_id)
            out.append(QueryTasks(q.query_id, max(s.partitions for s in plan), plan[-1].has_standbys))
        return out

    def reassign(self) -> None:
        """Recompute the assignment from the live workers, the running queries and the lags."""
        if self.cluster.reassign(self._queries()):
            a = self.cluster.assignment
            log.info("new assignment", extra={
                "generation": self.cluster.generation,
                "tasks": {w: [len(t.active), len(t.standby), len(t.warmup)] for w, t in a.workers.items()},
                "pending": {f"{t.query_id}/{t.partition}": w for t, w in a.pending.items()}})

    def _elected(self, epoch: int) -> None:
        self.cluster.lead(epoch)
        self.reassign()

    def _deposed(self) -> None:
        self.cluster.follow()

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

    async def _alive(self, member: Member) -> bool | None:
        """Ask a silent worker's health endpoint: True if it answers (NOT_SERVING included: a
        worker that is starting answers so, one that is stopping leaves by itself), False if
        nothing listens any more (a killed process refuses at once), None if it did not answer
        in time (hung, or starved of CPU: only a long silence makes that one dead)."""
        channel = self._probes.get(member.endpoint)
        if channel is None:
            channel = self._probes[member.endpoint] = self.channels.open(member.endpoint)
        try:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=self.settings.worker_probe_timeout_ms / 1000)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                return False
            return True if err.code() == grpc.StatusCode.NOT_FOUND else None  # NOT_FOUND: it answered
        return True

    async def _detect_loop(self, stop: asyncio.Event) -> None:
        """Failure detection: a worker silent for the session timeout is probed and removed if
        its process is gone, or once its silence passes the hard limit; a busy worker whose
        beats were late keeps its tasks."""
        membership = self.cluster.membership
        hard_limit = self.settings.worker_max_silence_ms / 1000
        while not stop.is_set():
            suspects = membership.suspects()
            if suspects:
                verdicts = await asyncio.gather(*(self._alive(m) for m in suspects))
                dead = []
                for member, alive in zip(suspects, verdicts, strict=True):
                    silence = membership.clock() - member.last_heartbeat
                    metrics.VERDICTS.labels({True: "answered", False: "refused", None: "silent"}[alive]).inc()
                    if alive:
                        membership.vouch(member.worker_id)
                    elif (alive is False or silence > hard_limit) and self.cluster.remove(member.worker_id):
                        dead.append(member.worker_id)
                        channel = self._probes.pop(member.endpoint, None)
                        if channel is not None:
                            await channel.close()
                if dead:
                    log.warning("workers dead", extra={"workers": dead})
                    self.reassign()
            now = membership.clock()
            metrics.MEMBERS.set(len(membership.members))
            metrics.HEARTBEAT_AGE.clear()
            for member in membership.members.values():
                metrics.HEARTBEAT_AGE.labels(member.worker_id).set(now - member.last_heartbeat)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)

    async def _rebalance_loop(self, stop: asyncio.Event) -> None:
        """Re-run the assignor with fresh lags, so warm-ups that caught up take their actives."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.rebalance_check_interval_ms / 1000)
            self.reassign()

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT."""
        stop = shutdown_event()
        await self.admin.start()
        await ensure_topic(self.admin, self.settings.command_topic, 1)
        await ensure_topic(self.admin, self.settings.processing_log_topic, 1)
        await self.producer.start()
        await self.offsets.start()
        await self.reader.start()
        await ensure_topic(self.admin, self.settings.leader_topic, 1)
        await self.reader.catch_up()
        await self.server.start()
        metrics.serve(self.settings.host, self.settings.metrics_port)
        self.leadership = Leadership(
            self.settings.kafka, self.settings.leader_topic,
            names.leader_group(self.settings.service_id), self.coordinator_id,
            self.settings.leader_session_timeout_ms, self._elected, self._deposed)
        tasks = [asyncio.create_task(c) for c in (
            self.reader.run(stop), self._detect_loop(stop), self._rebalance_loop(stop), self.leadership.run(stop))]
        await self._declare_processing_log()
        await self.server.set_serving()
        log.info("coordinator ready", extra={"endpoint": self.server.endpoint,
                                             "command_offset": self.metastore.command_offset})
        await stop.wait()
        log.info("coordinator stopping")
        await self.server.stop()
        # The election loop sees ``stop`` and leaves the group, so another coordinator leads at once.
        leadership, others = tasks[-1], tasks[:-1]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(leadership, 10)
        for task in others:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in self._probes.values():
            await channel.close()
        for closer in (self.reader.stop, self.offsets.stop, self.producer.stop, self.admin.close):
            with contextlib.suppress(Exception):
                await closer()
