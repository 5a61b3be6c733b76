"""The gRPC health service every Millpond server runs, ``List`` included.

health.proto has ``List`` (every service's status), but grpcio-health-checking's asyncio
servicer does not implement it: a call raised NotImplementedError, logged with its traceback
as an unhandled servicer error. This servicer answers it from the statuses it was given.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2


class HealthServicer(health.aio.HealthServicer):
    """grpcio-health-checking's asyncio servicer, plus ``List``."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: dict[str, health_pb2.HealthCheckResponse.ServingStatus.ValueType] = {}
        """Each service's status, as ``set`` and a graceful shutdown left it."""
        self._shutting_down = False

    async def set(self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus.ValueType) -> None:
        """Set ``service``'s status (ignored once shutting down, as the base class does)."""
        if not self._shutting_down:
            self.statuses[service] = status
        await super().set(service, status)

    async def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING from now on."""
        self._shutting_down = True
        self.statuses = dict.fromkeys(self.statuses, health_pb2.HealthCheckResponse.NOT_SERVING)
        await super().enter_graceful_shutdown()

    async def List(self, request: health_pb2.HealthListRequest,
                   context: grpc.aio.ServicerContext) -> health_pb2.HealthListResponse:
        """Every service's status."""
        return health_pb2.HealthListResponse(statuses={
            name: health_pb2.HealthCheckResponse(status=status) for name, status in self.statuses.items()})
