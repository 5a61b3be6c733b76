"""Builds a service's ``grpc.aio`` server with health checking and reflection."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Iterable
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from millpond.shared.config import CommonSettings, endpoints
from millpond.shared.errors import SetupError
from millpond.shared.rpc.auth import Authenticator, AuthInterceptor
from millpond.shared.rpc.decoding import RequestDecoder
from millpond.shared.rpc.health import HealthServicer
from millpond.shared.rpc.tls import server_credentials
from millpond.shared.security import TokenBook

log = logging.getLogger(__name__)


def message_limits(max_bytes: int) -> list[tuple[str, int]]:
    """gRPC options that refuse (RESOURCE_EXHAUSTED) a message larger than ``max_bytes``."""
    return [("grpc.max_receive_message_length", max_bytes), ("grpc.max_send_message_length", max_bytes)]

Registrar = Callable[[grpc.aio.Server], None]


class RpcServer:
    """A gRPC server that serves the given services plus health and reflection."""

    def __init__(self, settings: CommonSettings, registrars: Iterable[Registrar], service_names: Iterable[str]):
        limits = message_limits(settings.max_message_bytes)
        tls = settings.tls
        # Without TLS no caller proves who it is, so there is nothing to check (a local cluster).
        interceptors: list[grpc.aio.ServerInterceptor] = [] if tls is None else [AuthInterceptor(Authenticator(
            TokenBook(Path(settings.auth_tokens_file)) if settings.auth_tokens_file else None,
            frozenset(endpoints(settings.service_identities))))]
        # Inside authentication: a caller is known before its request is decoded.
        interceptors.append(RequestDecoder())
        if tls is None and settings.auth_tokens_file:
            raise SetupError("MILLPOND_AUTH_TOKENS_FILE needs TLS (MILLPOND_TLS_CERT_FILE, _KEY_FILE, _CA_FILE): "
                             "without it the services cannot tell their own calls from a client's")
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *limits], interceptors=interceptors)
        for register in registrars:
            register(self.server)
        self.health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.service_names = list(service_names)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        address = f"{settings.host}:{settings.port}"
        if tls is None:
            self.port = self.server.add_insecure_port(address)
        else:
            self.port = self.server.add_secure_port(address, server_credentials(tls))
        self.host = settings.host

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
