"""Wires a worker: command replay, heartbeats, task reconciliation, Spark and the servicer.

The parts: ``tasks`` (the assignment's tasks and standbys, reconciled, on the processing
loop of ``processing.py`` so that commits never delay serving), ``tables`` (the
local copies that serve pull queries), ``membership`` (heartbeats, status reports, leave),
the Spark session and the gauges; this module builds them, starts them and stops them.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import AsyncGenerator, Callable

from millpond.services.router.app import RouterParts
from millpond.services.router.pull import LookupAnswer
from millpond.services.worker import gauges
from millpond.services.worker.assignment import TaskAssignment
from millpond.services.worker.membership import MembershipAgent
from millpond.services.worker.processing import ProcessingLoop
from millpond.services.worker.query_runner import checkpoint_root
from millpond.services.worker.servicer import WorkerServicer
from millpond.services.worker.serving import LocalTables, Progress
from millpond.services.worker.spark import LazySession
from millpond.services.worker.state.store import sweep_removed
from millpond.shared import heap, metrics
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import CoordinatorClientSettings, RouterSettings, WorkerSettings
from millpond.shared.kafka.command_log import CommandReader
from millpond.shared.rpc.metastore import SERVICE_NAME as METASTORE_SERVICE
from millpond.shared.rpc.metastore import metastore_registrar
from millpond.shared.rpc.server import RpcServer, message_limits, shutdown_event
from millpond.shared.rpc.tls import ChannelFactory
from millpond.shared.sql.guard import StatementParser
from millpond.worker.v1 import worker_pb2, worker_pb2_grpc

STOP_BEFORE_LEAVE_S = 1.0
"""How long a stopping worker waits for its Spark queries to stop before it leaves the cluster
(well inside the coordinator's worker_max_silence_ms, which would declare it dead)."""

log = logging.getLogger(__name__)


class Worker:
    """A query worker: runs its assigned tasks and serves local pull queries."""

    def __init__(self, settings: WorkerSettings):
        self.settings = settings
        self.metastore = Metastore()
        self.reader = CommandReader(settings.kafka, settings.command_topic, self.metastore)
        self.channels = ChannelFactory(settings.tls, message_limits(settings.max_message_bytes))
        """Channels to the coordinators and routers (mutual TLS when configured)."""
        self.spark = LazySession(settings)
        self.processing = ProcessingLoop()
        """Where the tasks (and Spark's callbacks into them) run, off the loop that serves."""
        progress = Progress()  # the tasks' commits and standby replays wake the pulls waiting for their copies
        self.tasks = TaskAssignment(settings, self.metastore, self.spark, progress.moved)
        self.spark.hold = self.tasks.restored_at_start  # the first assignment's restores go first
        self.tables = LocalTables(settings.worker_id, self.metastore, self.tasks, StatementParser(settings.parse_limits),
                                  progress)
        self.servicer = servicer = WorkerServicer(self.tables, settings.max_scan_rows)
        self.router = RouterParts(router_settings(settings), self.metastore, self.reader, self.channels,
                                  _InProcess(servicer, lambda: self.server.endpoint)) if settings.serve_router else None
        """RouterService here too (serve_router): this worker's copies are read without a hop."""
        self.server = RpcServer(
            settings,
            [lambda s: worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, s),
             metastore_registrar(self.reader, settings.worker_id), *(self.router.registrars if self.router else [])],
            [worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name, METASTORE_SERVICE,
             *(self.router.service_names if self.router else [])],
        )
        self.membership = MembershipAgent(settings, self.channels, self.tasks, lambda: self.server.endpoint)
        self.reader.listeners.append(self.tasks.changed)

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT."""
        stop = shutdown_event()
        # A query's checkpoint only lives while its query runs (tasks hold the positions).
        shutil.rmtree(checkpoint_root(self.settings), ignore_errors=True)
        if swept := sweep_removed(self.settings.state_dir, self.settings.worker_id):
            log.info("deleted stores left aside by an earlier run", extra={"stores": swept})
        self.processing.start()
        await self.reader.start()
        await self.reader.catch_up()
        if self.router is not None:
            await self.router.start()
        await self.server.start()
        metrics.serve(self.settings.host, self.settings.metrics_port)
        await self.server.set_serving()  # before the first beat, so a health probe finds it serving
        leaving = asyncio.Event()  # set once it handed over and stopped processing: the beats end then
        beats = [asyncio.create_task(self.membership.heartbeat_loop(leaving, c)) for c in self.settings.coordinators]
        beats += [asyncio.create_task(self.membership.report_loop(leaving, r)) for r in self.settings.router_endpoints]
        # The tasks follow the assignment until the worker leaves: while it hands over, the
        # coordinator may still move one of them.
        loops = [asyncio.create_task(c) for c in (self.reader.run(stop), self.processing.run(self.tasks.run(leaving)))]
        if self.router is not None:
            loops.append(asyncio.create_task(self.router.pulls.run(stop)))
        if self.settings.metrics_port is not None:
            loops.append(asyncio.create_task(gauges.refresh_loop(self.settings.kafka, self.tasks, stop)))
        # Start Spark now, not when a task first needs it (and again whenever its driver dies):
        # a promoted standby must not wait the seconds a Spark session takes to start. (It
        # starts once the first assignment's active tasks have restored their stores:
        # ``TaskAssignment.restored_at_start``.)
        loops.append(asyncio.create_task(self.processing.run(self._start_spark())))
        log.info("worker ready", extra={"endpoint": self.server.endpoint, "worker": self.settings.worker_id})
        await stop.wait()
        log.info("worker stopping")
        self.tasks.stopping = True  # it prepares no take-over of another leaving worker's tasks
        # Its partitions' new owners have the Spark queries they will get standing by before it
        # stops processing (bounded; it beats and processes meanwhile): once moved, they process
        # within a batch instead of after a query's start.
        await self.membership.hand_over()
        # As a Kafka Streams app closes its tasks before its consumer leaves the group: its
        # Spark queries stop first (a batch's Spark job is interrupted, a commit under way
        # ends), so the positions its partitions' new owners resume from are final when they
        # are assigned: their standby copies have replayed the last commit by then, and the
        # plan each makes ahead for its Spark query is for the right offsets (a copy one commit
        # behind made it for nothing). Bounded: past it, the worker leaves anyway, and those
        # commits are fenced. Its stores go on answering pulls until the server stops.
        stopping = asyncio.create_task(self.processing.run(self.tasks.stop_processing()))
        await asyncio.wait({stopping}, timeout=STOP_BEFORE_LEAVE_S)
        # No beat may follow the leave, or it would rejoin the worker.
        leaving.set()
        await asyncio.gather(*beats, return_exceptions=True)
        log.info("leaving the cluster", extra={"queries_stopped": stopping.done()})
        await self.membership.leave()
        await stopping
        self.servicer.end_lookup_streams()
        await self.server.stop()
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        if self.router is not None:
            await self.router.pulls.lookups.close()
        await self.processing.run(self.tasks.stop())
        await self.processing.run(self.spark.stop())
        await asyncio.to_thread(self.processing.stop)
        await self.channels.close()
        await self.reader.stop()
        self.tables.parser.close()
        if self.router is not None:
            await self.router.stop()

    async def _start_spark(self) -> None:
        await self.spark.warm_up()
        heap.freeze_startup_objects()  # the Spark session's Python side is long-lived too
        await self.spark.watch()  # a driver that dies is replaced, not left failing every query


def router_settings(settings: WorkerSettings) -> RouterSettings:
    """The settings of the router a worker runs (serve_router): the worker's connections,
    identity and security, and the router's own settings from the environment."""
    shared = {name: getattr(settings, name) for name in CoordinatorClientSettings.model_fields}
    return RouterSettings(**shared)


class _InProcess:
    """The worker's own copies, for its router: the servicer's lookups without gRPC."""

    def __init__(self, servicer: WorkerServicer, endpoint: Callable[[], str]):
        self.servicer = servicer
        self._endpoint = endpoint

    @property
    def endpoint(self) -> str:
        return self._endpoint()

    async def lookup(self, request: worker_pb2.LookupRequest) -> LookupAnswer:
        return await self.servicer.lookup(request)

    def scan(self, request: worker_pb2.ScanPagesRequest) -> AsyncGenerator[worker_pb2.ScanPagesResponse, None]:
        return self.servicer.scan(request)
