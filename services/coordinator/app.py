"""Wires the coordinator: command log, metastore, executor, membership and assignment.

The parts: ``executor`` (statements), ``rebalancer`` (joins, leaves, elections ->
reassignment), ``failure_detector`` (silent workers), ``leadership`` (the election) and the
servicer over them; this module builds them, starts them and stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka.admin import AIOKafkaAdminClient

from millpond.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from millpond.services.coordinator.assignor import AssignorConfig
from millpond.services.coordinator.cluster import Cluster
from millpond.services.coordinator.executor import StatementExecutor
from millpond.services.coordinator.failure_detector import FailureDetector
from millpond.services.coordinator.leadership import ElectionStatus, Leadership
from millpond.services.coordinator.rebalancer import Rebalancer
from millpond.services.coordinator.servicer import CoordinatorServicer
from millpond.services.coordinator.topic_cleanup import REPORTS_GRACE_S
from millpond.shared import heap, metrics
from millpond.shared.catalog import names
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import CoordinatorSettings
from millpond.shared.errors import MillpondError
from millpond.shared.kafka.admin import ensure_command_topic, ensure_topic, internal_replicas
from millpond.shared.kafka.command_log import CommandReader, CommandWriter
from millpond.shared.kafka.connection import start_client
from millpond.shared.kafka.inserts import RowInserter
from millpond.shared.rpc.metastore import SERVICE_NAME as METASTORE_SERVICE
from millpond.shared.rpc.metastore import metastore_registrar
from millpond.shared.rpc.server import RpcServer, message_limits, shutdown_event
from millpond.shared.rpc.tls import ChannelFactory

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
        self.inserts = RowInserter(kafka)
        self.offsets = kafka.end_offsets_consumer()
        self.cluster = Cluster(
            settings.worker_session_timeout_ms / 1000,
            AssignorConfig(settings.num_standby_replicas, settings.acceptable_recovery_lag, settings.max_warmup_replicas),
            settle_s=settings.moved_active_settle_ms / 1000, adopt_s=REPORTS_GRACE_S)
        self.executor = StatementExecutor(settings, self.metastore, self.reader, self.writer, self.admin,
                                          self.inserts, self.offsets, self.cluster.task_reports, self.cluster.runs)
        self.rebalancer = Rebalancer(self.cluster, self.metastore, settings.service_id)
        self.reader.listeners.append(self.rebalancer.reassign)
        servicer = CoordinatorServicer(self.executor, self.rebalancer, self.cluster, lambda: self.coordinator_id,
                                       lambda: self.leadership.status if self.leadership else ElectionStatus(),
                                       self.rebalancer.changes)
        self.server = RpcServer(
            settings,
            [lambda s: coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server(servicer, s),
             metastore_registrar(self.reader, "coordinator")],
            [coordinator_pb2.DESCRIPTOR.services_by_name["CoordinatorService"].full_name, METASTORE_SERVICE],
        )
        self.leadership: Leadership | None = None
        self.channels = ChannelFactory(settings.tls, message_limits(settings.max_message_bytes))
        self.failure_detector = FailureDetector(
            self.cluster, self.channels, settings.worker_probe_timeout_ms / 1000,
            settings.worker_max_silence_ms / 1000, self.rebalancer.reassign)

    @property
    def coordinator_id(self) -> str:
        """This coordinator's id among the cluster's coordinators."""
        return self.settings.coordinator_id or self.server.endpoint

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

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT."""
        stop = shutdown_event()
        await start_client(self.admin)
        replicas = self.executor.replicas = await internal_replicas(self.admin, self.settings.internal_topic_replicas)
        await ensure_command_topic(self.admin, self.settings.command_topic, replicas)
        await ensure_topic(self.admin, self.settings.processing_log_topic, 1, replicas=replicas)
        await self.inserts.start()
        await start_client(self.offsets)
        await self.reader.start()
        await ensure_topic(self.admin, self.settings.leader_topic, 1, replicas=replicas)
        await self.reader.catch_up()
        await self.server.start()
        metrics.serve(self.settings.host, self.settings.metrics_port)
        self.leadership = Leadership(
            self.settings.kafka, self.settings.leader_topic,
            names.leader_group(self.settings.service_id), self.coordinator_id,
            self.settings.leader_session_timeout_ms, self.rebalancer.elected, self.rebalancer.deposed)
        tasks = [asyncio.create_task(c) for c in (
            self.reader.run(stop), self.failure_detector.run(stop),
            self.rebalancer.run(stop, self.settings.rebalance_check_interval_ms / 1000), self.leadership.run(stop))]
        await self._declare_processing_log()
        try:
            await self.executor.delete_left_topics()
        except Exception:  # they wait for the next start
            log.exception("could not look for terminated queries' topics left behind")
        await self.server.set_serving()
        heap.freeze_startup_objects()
        log.info("coordinator ready", extra={"endpoint": self.server.endpoint,
                                             "command_offset": self.metastore.command_offset})
        await stop.wait()
        log.info("coordinator stopping")
        self.rebalancer.changes.close()  # the routers' assignment streams end now, not after the grace
        await self.server.stop()
        # The election loop sees ``stop`` and leaves the group, so another coordinator leads at once.
        leadership, others = tasks[-1], tasks[:-1]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(leadership, 10)
        for task in others:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.failure_detector.close()
        self.executor.parser.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.executor.close(), 10)
        for closer in (self.reader.stop, self.offsets.stop, self.inserts.stop, self.admin.close):
            with contextlib.suppress(Exception):
                await closer()
