"""Builds a service's ``grpc.aio`` server with health checking and reflection."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

log = logging.getLogger(__name__)

Registrar = Callable[[grpc.aio.Server], None]


class RpcServer:
    """A gRPC server that serves the given services plus health and reflection."""

    def __init__(self, host: str, port: int, registrars: Iterable[Registrar], service_names: Iterable[str]):
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        for register in registrars:
            register(self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.service_names = list(service_names)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        self.host = host

    @property
    def endpoint(self) -> str:
        """host:port clients dial."""
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        """Start serving; health reports NOT_SERVING until ``set_serving``."""
        await self.server.start()
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def set_serving(self) -> None:
        """Report SERVING for the server and each service."""
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float = 2.0) -> None:
        """Stop accepting calls; give running ones ``grace`` seconds."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


def shutdown_event() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT, for graceful shutdown."""
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, event.set)
    return event
