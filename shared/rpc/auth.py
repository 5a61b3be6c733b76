"""Authentication and authorization of every call, in one server interceptor.

Each RPC has an access rule: every method of an internal service (``INTERNAL_SERVICES``)
is for the services only, and the client-facing services name a rule per method
(``POLICY``). A caller whose TLS client certificate names one of the cluster's service
identities (its common name, checked against ``MILLPOND_SERVICE_IDENTITIES``) is a service
and may call anything, including the internal RPCs (heartbeats, lag reports,
assignments, local lookups). Anyone else is a
client: it presents a bearer token (``authorization: Bearer <token>``) that the tokens
file maps to a principal, whose permissions the rule checks. Internal RPCs refuse clients
whatever their token, so no client can pose as a worker. ``Execute`` is checked statement
by statement where the statements are parsed (the principal is in ``security.CURRENT``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from enum import Enum
from typing import Any

import grpc

from millpond.shared.errors import MillpondError
from millpond.shared.rpc.status import status_code, status_details
from millpond.shared.security import CURRENT, Permission, PermissionDeniedError, Principal, TokenBook


class Access(Enum):
    """Who may call an RPC."""

    OPEN = "open"
    """Anyone who completed the TLS handshake (health checks, reflection)."""
    SERVICE = "service"
    """Only Millpond's own services."""
    STATEMENT = "statement"
    """Any authenticated principal; each statement is checked on its own."""
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


INTERNAL_SERVICES = frozenset({
    "millpond.router.v1.RouterInternalService",
})
"""Services only Millpond's own services may call, whatever the method (the policy follows
the service: a method added to one is internal without an entry in ``POLICY``)."""

POLICY: dict[str, Access] = {
    "/millpond.router.v1.RouterService/Execute": Access.STATEMENT,
    "/millpond.router.v1.RouterService/StreamQuery": Access.READ,
    "/millpond.router.v1.RouterService/GetClusterStatus": Access.ADMIN,
    # Deprecated, replaced by RouterInternalService/ReportWorkerStatus; internal all the same.
    "/millpond.router.v1.RouterService/ReportHostStatus": Access.SERVICE,
    "/millpond.coordinator.v1.CoordinatorService/ExecuteStatement": Access.STATEMENT,
    "/millpond.coordinator.v1.CoordinatorService/GetClusterStatus": Access.ADMIN,
    "/millpond.coordinator.v1.CoordinatorService/ListTaskStatuses": Access.ADMIN,
    "/millpond.coordinator.v1.CoordinatorService/Heartbeat": Access.SERVICE,
    "/millpond.coordinator.v1.CoordinatorService/Heartbeats": Access.SERVICE,
    "/millpond.coordinator.v1.CoordinatorService/GetAssignment": Access.SERVICE,
    "/millpond.coordinator.v1.CoordinatorService/WatchAssignment": Access.SERVICE,
    "/millpond.coordinator.v1.CoordinatorService/Leave": Access.SERVICE,
    "/millpond.worker.v1.WorkerService/Lookup": Access.SERVICE,
    "/millpond.worker.v1.WorkerService/Scan": Access.SERVICE,
    "/millpond.worker.v1.WorkerService/ScanPages": Access.SERVICE,
    "/millpond.worker.v1.WorkerService/SetStandbyReplay": Access.ADMIN,
    "/millpond.common.v1.MetastoreService/GetMetastoreDigest": Access.ADMIN,
}
"""The access rule of each RPC; one not listed is SERVICE (denied to clients)."""

OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
                 "/grpc.reflection.v1.ServerReflection/")

_PERMISSION = {Access.READ: Permission.READ, Access.WRITE: Permission.WRITE, Access.ADMIN: Permission.ADMIN}


def access_of(method: str) -> Access:
    """The rule for a full method name (``/package.Service/Method``)."""
    if method.startswith(OPEN_SERVICES):
        return Access.OPEN
    if method.lstrip("/").partition("/")[0] in INTERNAL_SERVICES:
        return Access.SERVICE
    return POLICY.get(method, Access.SERVICE)


class Authenticator:
    """Decides who a caller is and whether it may make a call (pure apart from the tokens
    file it reads)."""

    def __init__(self, tokens: TokenBook | None, service_identities: frozenset[str]):
        self.tokens = tokens
        """None: a client is any peer with a valid certificate, granted every permission."""
        self.service_identities = service_identities

    def principal(self, method: str, common_name: str | None, authorization: str | None) -> Principal:
        """The caller's principal, or AuthenticationError / PermissionDeniedError."""
        access = access_of(method)
        if common_name is not None and common_name in self.service_identities:
            return Principal(common_name, frozenset(Permission), service=True)
        if access is Access.SERVICE:
            raise PermissionDeniedError(
                f"{method.rsplit('/', 1)[-1]} is internal to the cluster: only Millpond's services (client "
                f"certificates named {', '.join(sorted(self.service_identities))}) may call it")
        if self.tokens is None:
            principal = Principal(common_name or "client", frozenset(Permission))
        else:
            principal = self.tokens.authenticate(authorization)
        if access in _PERMISSION:
            principal.require(_PERMISSION[access], f"call {method.rsplit('/', 1)[-1]}")
        return principal


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Runs the ``Authenticator`` before every call and puts the principal in
    ``security.CURRENT`` for the handler."""

    def __init__(self, authenticator: Authenticator):
        self.authenticator = authenticator

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        method: str = details.method
        if handler is None or access_of(method) is Access.OPEN:
            return handler
        authenticate = self._authenticate
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                token = CURRENT.set(await authenticate(method, context))
                try:
                    return await inner(request, context)
                finally:
                    CURRENT.reset(token)

            return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                token = CURRENT.set(await authenticate(method, context))
                try:
                    async for message in inner_stream(request, context):
                        yield message
                finally:
                    CURRENT.reset(token)

            return grpc.unary_stream_rpc_method_handler(stream, handler.request_deserializer,
                                                        handler.response_serializer)
        if handler.stream_unary is not None:
            inner_client_stream = handler.stream_unary

            async def client_stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
                token = CURRENT.set(await authenticate(method, context))
                try:
                    return await inner_client_stream(requests, context)
                finally:
                    CURRENT.reset(token)

            return grpc.stream_unary_rpc_method_handler(client_stream, handler.request_deserializer,
                                                        handler.response_serializer)
        inner_bidi = handler.stream_stream

        async def bidi(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            token = CURRENT.set(await authenticate(method, context))
            try:
                async for message in inner_bidi(requests, context):
                    yield message
            finally:
                CURRENT.reset(token)

        return grpc.stream_stream_rpc_method_handler(bidi, handler.request_deserializer, handler.response_serializer)

    async def _authenticate(self, method: str, context: grpc.aio.ServicerContext) -> Principal:
        names = context.auth_context().get("x509_common_name") or []
        common_name = names[0].decode() if names else None
        authorization = next((str(v) for k, v in context.invocation_metadata() or () if k == "authorization"), None)
        try:
            return self.authenticator.principal(method, common_name, authorization)
        except MillpondError as err:
            await context.abort(status_code(err.kind), status_details(err.message))
            raise AssertionError("unreachable") from None
