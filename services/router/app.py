"""Wires the router: metastore replay, assignment refresh, channels to the other services.

The parts: ``statements`` (Execute: session statements, pull queries and INSERTs here, DDL
forwarded to a coordinator), ``pulls`` (pull-query routing and the assignment it routes
by), ``pushes`` (push queries), ``status`` (the cluster status), ``hosts`` (the workers'
beats) and the servicers over them; this module builds them, starts them and stops them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from millpond.router.v1 import router_internal_pb2, router_internal_pb2_grpc, router_pb2, router_pb2_grpc
from millpond.services.router.coordinators import Coordinators
from millpond.services.router.hosts import HostTable
from millpond.services.router.pull_routing import LocalWorker, PullRouter
from millpond.services.router.servicer import RouterInternalServicer, RouterServicer
from millpond.services.router.statements import Statements
from millpond.services.router.status import ClusterStatus
from millpond.services.router.streaming import PushQueries
from millpond.shared import heap, metrics
from millpond.shared.catalog.metastore import Metastore
from millpond.shared.config import RouterSettings
from millpond.shared.kafka.command_log import CommandReader
from millpond.shared.kafka.inserts import RowInserter
from millpond.shared.rpc.metastore import SERVICE_NAME as METASTORE_SERVICE
from millpond.shared.rpc.metastore import metastore_registrar
from millpond.shared.rpc.server import RpcServer, message_limits, shutdown_event
from millpond.shared.rpc.tls import ChannelFactory
from millpond.shared.sql.guard import StatementParser

log = logging.getLogger(__name__)


class RouterParts:
    """Everything that answers RouterService and RouterInternalService, over a metastore
    that is replayed elsewhere: the stand-alone router's, or a worker's that also routes."""

    def __init__(self, settings: RouterSettings, metastore: Metastore, reader: CommandReader,
                 channels: ChannelFactory, local: LocalWorker | None = None):
        self.settings = settings
        self.coordinators = Coordinators(settings, channels)
        self.hosts = HostTable(settings.host_dead_after_ms / 1000)
        """The workers' own heartbeats and lag reports to this router."""
        self.pulls = PullRouter(settings, metastore, reader, channels, self.coordinators, self.hosts, local)
        self.parser = StatementParser(settings.parse_limits, settings.parse_cache_bytes)
        """Shared by Execute and StreamQuery, with their cache of parses."""
        self.inserts = RowInserter(settings.kafka)
        """Produces the rows clients INSERT, here rather than at a coordinator."""
        self.statements = Statements(settings, metastore, reader, self.coordinators, self.pulls, self.parser,
                                     self.inserts)
        self.pushes = PushQueries(settings, metastore, reader, self.parser)
        self.status = ClusterStatus(self.coordinators, self.hosts, lambda: len(self.pushes.pushes),
                                    settings.request_timeout_ms / 1000)
        servicer = RouterServicer(self.statements, self.pushes, self.status, self.hosts)
        internal = RouterInternalServicer(self.hosts)
        self.registrars: list[Callable[[grpc.aio.Server], None]] = [
            lambda s: router_pb2_grpc.add_RouterServiceServicer_to_server(servicer, s),
            lambda s: router_internal_pb2_grpc.add_RouterInternalServiceServicer_to_server(internal, s)]
        """What adds the two services to a gRPC server."""
        self.service_names = [router_pb2.DESCRIPTOR.services_by_name["RouterService"].full_name,
                              router_internal_pb2.DESCRIPTOR.services_by_name["RouterInternalService"].full_name]

    async def start(self) -> None:
        """Before the server serves: the INSERT producer's connection."""
        await self.inserts.start()

    async def stop(self) -> None:
        """Once the server stopped: the INSERT producer, the parser's threads."""
        await self.inserts.stop()
        self.parser.close()


class Router:
    """The client front door."""

    def __init__(self, settings: RouterSettings):
        self.settings = settings
        self.metastore = Metastore()
        self.reader = CommandReader(settings.kafka, settings.command_topic, self.metastore)
        self.channels = ChannelFactory(settings.tls, message_limits(settings.max_message_bytes))
        """One channel per coordinator and worker, shared by every request (mutual TLS when configured)."""
        self.parts = RouterParts(settings, self.metastore, self.reader, self.channels)
        self.server = RpcServer(settings, [*self.parts.registrars, metastore_registrar(self.reader, "router")],
                                [*self.parts.service_names, METASTORE_SERVICE])

    async def run(self) -> None:
        """Serve until SIGTERM or SIGINT."""
        stop = shutdown_event()
        await self.reader.start()
        await self.reader.catch_up()
        await self.parts.start()
        await self.server.start()
        metrics.serve(self.settings.host, self.settings.metrics_port)
        loops = [asyncio.create_task(self.reader.run(stop)), asyncio.create_task(self.parts.pulls.run(stop))]
        await self.server.set_serving()
        heap.freeze_startup_objects()
        log.info("router ready", extra={"endpoint": self.server.endpoint})
        await stop.wait()
        log.info("router stopping")
        await self.server.stop()
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await self.parts.pulls.lookups.close()  # no request waits on them once the server has stopped
        await self.channels.close()
        await self.reader.stop()
        await self.parts.stop()
