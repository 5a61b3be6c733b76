"""A small client of the router's gRPC API."""

from __future__ import annotations

import grpc
from millpond.router.v1 import router_pb2, router_pb2_grpc

from shared.results import Outcome


class RouterClient:
    """Runs statements through the router."""

    def __init__(self, server: str, timeout: float = 60.0):
        self.channel = grpc.insecure_channel(server)
        self.stub = router_pb2_grpc.RouterServiceStub(self.channel)
        self.timeout = timeout

    def execute(self, sql: str, properties: dict[str, str] | None = None) -> list[Outcome]:
        """Execute statements; raises ``grpc.RpcError`` with the server's status on failure."""
        response = self.stub.Execute(router_pb2.ExecuteRequest(sql=sql, properties=properties or {}),
                                     timeout=self.timeout)
        return [Outcome.from_proto(r) for r in response.results]

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()
